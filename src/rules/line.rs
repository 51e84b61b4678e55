//! What the rules see of a command line: the record the shell analyzer (`super::shell`)
//! fills as it reads, and the wrappers' readings (`super::wrappers`) add to, with the words
//! both take apart.

/// What the rules see of a command line.
#[derive(Debug, Default)]
pub(super) struct Line {
    /// Each plain command with its literal words, shell-quoted where needed: what allow
    /// rules judge.
    pub(super) plain: Vec<String>,
    /// Why no rule can allow the line, if so.
    pub(super) never: Option<String>,
    /// Every command the line would run, by normalized name and as written, with its
    /// arguments: what deny and ask rules judge.
    pub(super) seen: Vec<String>,
    /// What runs that deny rules cannot see, if anything.
    pub(super) hidden: Option<String>,
    /// Commands read so far, against the analyzer's bound (`MAX_RUNS` in `super::shell`).
    pub(super) runs: usize,
    /// Whether the command being read gets its standard input from a pipe or a redirection.
    pub(super) fed: bool,
}

/// One word of a command: its literal value when it has one, and a best reading for deny
/// rules (quotes resolved, expansions left as written).
#[derive(Clone, Debug)]
pub(super) struct Arg {
    pub(super) literal: Option<String>,
    pub(super) loose: String,
}

impl Arg {
    pub(super) fn plain(s: &str) -> Arg {
        Arg {
            literal: Some(s.to_string()),
            loose: s.to_string(),
        }
    }
}

/// A command's name without the folder it is run from.
pub(crate) fn basename(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

impl Line {
    /// No rule may allow the line, for the first reason given.
    pub(super) fn never(&mut self, why: impl Into<String>) {
        if self.never.is_none() {
            self.never = Some(why.into());
        }
    }

    /// The line runs what deny rules cannot see (so no rule allows it either).
    pub(super) fn hide(&mut self, why: impl Into<String>) {
        let why = why.into();
        self.never(why.clone());
        if self.hidden.is_none() {
            self.hidden = Some(why);
        }
    }
}
