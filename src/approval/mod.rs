//! Human approval of risky tool calls. `decide` is the policy, pure: from the rules, the mode,
//! what a person already allowed for the run, and the call, it says allow, deny (by which
//! rule or mode, and why) or ask. Asking is an `Approver`'s: the terminal prompt
//! (`TerminalApprover`) or the unattended queue in the store (`queue::QueueApprover`), given
//! to the `Gate` by whoever assembles the run. The gate answers each call with allow, deny or
//! quit; nothing that needed a yes runs without one, and a run with no terminal never waits
//! on a prompt.

pub(crate) mod answer;
mod files;
mod follow;
pub(crate) mod queue;
mod terminal;
mod words;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub(crate) use crate::rules::Rule;
use crate::rules::Verdict;
pub use crate::rules::{RuleError, Rules};
pub(crate) use terminal::Terminal;

use crate::tools::Risk;
use crate::trace::{Event, Events};

/// How calls that no rule decides are answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Prompt at the terminal for write and exec calls.
    Ask,
    /// Store the request and wait for `sup approve` / `sup deny`.
    Queue,
    /// Allow all that no rule denies or asks.
    Auto,
    /// Deny all that no rule allows.
    Never,
}

/// Waiting requests default to this long before they count as a denial.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);

/// A call as the policy sees it: the tool, its approval subject (what rule patterns match:
/// the command line, the workspace-relative path, the input), and its risk.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call<'a> {
    pub(crate) tool: &'a str,
    pub(crate) subject: &'a str,
    pub(crate) risk: Risk,
}

/// What the policy says of a call before anyone is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Run it; `by` names the rule or mode that allowed it (`None`: a read call that needs
    /// nobody's word, and makes no event).
    Allow { by: Option<String> },
    /// Do not run it; `why` goes to the model.
    Deny { by: String, why: String },
    /// A person must say.
    Ask,
}

/// The approval policy: deny beats ask beats allow among the rules; an `always` answer of
/// this run allows; what no rule decides is allowed for read calls and goes by the mode
/// for the others.
pub(crate) fn decide(rules: &Rules, mode: Mode, remembered: bool, call: &Call) -> Decision {
    if remembered {
        return Decision::Allow {
            by: Some("an earlier `always` answer".into()),
        };
    }
    let asked = match rules.judge(call.tool, call.subject) {
        Some((Verdict::Deny, rule)) => {
            let by = format!("rule deny `{}`", rule.text);
            let why = match rules.unseen(call.tool, call.subject) {
                Some(unseen) => format!(
                    "`{}` runs {unseen}, which rules cannot see into, so the approval {by} \
                     counts as matching it",
                    call.subject
                ),
                None => format!("the approval {by} matches `{}`", call.subject),
            };
            return Decision::Deny { why, by };
        }
        Some((Verdict::Allow, rule)) => {
            return Decision::Allow {
                by: Some(format!("rule allow `{}`", rule.text)),
            };
        }
        Some((Verdict::Ask, _)) => true,
        None if call.risk == Risk::Read => return Decision::Allow { by: None },
        None => false,
    };
    match mode {
        Mode::Auto if !asked => Decision::Allow {
            by: Some("approval mode auto".into()),
        },
        Mode::Never => {
            let missing = rules.unallowed(call.tool, call.subject);
            let what = if missing.is_empty() {
                format!("`{}({})`", call.tool, call.subject)
            } else {
                missing.join("; ")
            };
            Decision::Deny {
                by: "approval mode never".into(),
                why: format!(
                    "approval mode `never` denies what no rule allows, and no rule allows {what}"
                ),
            }
        }
        _ => Decision::Ask,
    }
}

/// What the gate says of a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    Allow,
    /// The result the model gets instead of running the call.
    Deny(String),
    /// The person quit: the run is cancelled.
    Quit,
}

/// What a person said as a check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judgement {
    Accepted,
    Rejected(String),
}

pub use crate::trace::Decided;

/// A call put to a person.
pub struct Request<'a> {
    /// The call id.
    id: &'a str,
    tool: &'a str,
    pub subject: &'a str,
    input: &'a Value,
}

/// What a person (or the lack of one) answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Yes; `always`: the same tool and subject for the rest of the run.
    Yes { by: String, always: bool },
    /// No; `why` goes to the model, `reason` is what the person said.
    No {
        by: String,
        reason: Option<String>,
        why: String,
        decided: Decided,
    },
    /// The person quit the run.
    Quit { by: String },
    /// The run was cancelled while it waited.
    Cancelled,
}

/// Whoever is asked: the terminal, the queue, or a test's script.
#[async_trait]
pub trait Approver: Send + Sync {
    /// Whether a call may run.
    async fn approve(
        &self,
        req: &Request<'_>,
        events: &Events,
        cancel: &CancellationToken,
    ) -> Reply;
    /// A person as a check.
    async fn judge(&self, question: &str, events: &Events, cancel: &CancellationToken)
    -> Judgement;
}

/// The prompt on the controlling terminal.
pub(crate) struct TerminalApprover {
    pub(crate) terminal: Terminal,
    pub(crate) workspace: PathBuf,
}

const AT_TERMINAL: &str = "the person at the terminal";

#[async_trait]
impl Approver for TerminalApprover {
    async fn approve(
        &self,
        req: &Request<'_>,
        _events: &Events,
        cancel: &CancellationToken,
    ) -> Reply {
        let text = terminal::describe(req.tool, req.input, &self.workspace);
        let answer = tokio::select! {
            a = self.terminal.ask_call(text) => a,
            _ = cancel.cancelled() => return Reply::Cancelled,
        };
        let by = AT_TERMINAL.to_string();
        match answer {
            terminal::CallAnswer::Yes => Reply::Yes { by, always: false },
            terminal::CallAnswer::Always => Reply::Yes {
                by: format!("{by} (always)"),
                always: true,
            },
            terminal::CallAnswer::No(reason) => Reply::No {
                why: match &reason {
                    Some(r) => format!("{by} said no: {r}"),
                    None => format!("{by} said no"),
                },
                by,
                reason,
                decided: Decided::Denied,
            },
            terminal::CallAnswer::Quit => Reply::Quit {
                by: format!("{by} (quit)"),
            },
        }
    }

    async fn judge(
        &self,
        question: &str,
        _events: &Events,
        cancel: &CancellationToken,
    ) -> Judgement {
        tokio::select! {
            j = self.terminal.ask_check(question.to_string()) => j,
            _ = cancel.cancelled() => Judgement::Rejected("the run was cancelled".into()),
        }
    }
}

fn refusal(why: &str) -> String {
    format!(
        "Denied: {why}. The call did not run. Do not repeat the same call; find another way, \
         or say in your answer why it is needed."
    )
}

/// The gate every call of a run passes: the policy, then the approver when it says ask.
pub struct Gate {
    mode: Mode,
    rules: Rules,
    /// `always` answers: (tool, subject) allowed for the rest of the run.
    always: Mutex<Vec<(String, String)>>,
    /// Asked about calls.
    calls: Arc<dyn Approver>,
    /// Asked as a check.
    checks: Arc<dyn Approver>,
    /// Where the files an approved command line runs are, when they are watched.
    workspace: Option<PathBuf>,
    /// The workspace files each approved call runs, as the person was shown them: by call id
    /// until it runs, and by `always` subject.
    approved: Mutex<Vec<(String, files::Runs)>>,
    always_files: Mutex<Vec<(String, files::Runs)>>,
}

impl Gate {
    pub fn new(
        mode: Mode,
        rules: Rules,
        calls: Arc<dyn Approver>,
        checks: Arc<dyn Approver>,
    ) -> Self {
        Gate {
            mode,
            rules,
            always: Mutex::new(Vec::new()),
            calls,
            checks,
            workspace: None,
            approved: Mutex::new(Vec::new()),
            always_files: Mutex::new(Vec::new()),
        }
    }

    /// Watch the workspace files that approved command lines run: shown with the request,
    /// hashed then, and the call refused when one changed by the time it runs.
    pub(crate) fn watching(mut self, workspace: PathBuf) -> Self {
        self.workspace = Some(workspace);
        self
    }

    /// Why call `id`, approved by a person, may not run now: a workspace file it runs changed
    /// since the request was made. Asked once, right before the call runs.
    pub(crate) fn changed_since_approved(&self, id: &str) -> Option<String> {
        let files = {
            let mut approved = self.approved.lock().ok()?;
            let at = approved.iter().position(|(i, _)| i == id)?;
            approved.remove(at).1
        };
        files::changed(&files).map(|why| {
            format!(
                "Refused: {why}. The person approved the file as it was then, not as it is \
                 now, so the call did not run; ask again for the file as it is."
            )
        })
    }

    /// Remember what call `id` runs, as approved.
    fn note_approved(&self, id: &str, files: files::Runs) {
        if !files.is_empty()
            && let Ok(mut a) = self.approved.lock()
        {
            a.push((id.to_string(), files));
        }
    }

    /// The rules this gate judges by.
    pub(crate) fn rules(&self) -> &Rules {
        &self.rules
    }

    fn decided(
        events: &Events,
        id: &str,
        tool: &str,
        decided: Decided,
        by: String,
        reason: Option<String>,
    ) {
        events.emit(Event::Approval {
            id: id.to_string(),
            tool: tool.to_string(),
            decision: decided,
            by,
            reason,
        });
    }

    /// Decide a call before it runs.
    pub(crate) async fn check(
        &self,
        id: &str,
        call: Call<'_>,
        input: &Value,
        events: &Events,
        cancel: &CancellationToken,
    ) -> Answer {
        let remembered = self
            .always
            .lock()
            .is_ok_and(|a| a.iter().any(|(t, x)| t == call.tool && x == call.subject));
        if remembered {
            let earlier = self.always_files.lock().ok().and_then(|a| {
                a.iter()
                    .find(|(s, _)| s == call.subject)
                    .map(|(_, f)| f.clone())
            });
            self.note_approved(id, earlier.unwrap_or_default());
        }
        match decide(&self.rules, self.mode, remembered, &call) {
            Decision::Allow { by: None } => Answer::Allow,
            Decision::Allow { by: Some(by) } => {
                Self::decided(events, id, call.tool, Decided::Allowed, by, None);
                Answer::Allow
            }
            Decision::Deny { by, why } => {
                Self::decided(events, id, call.tool, Decided::Denied, by, None);
                Answer::Deny(refusal(&why))
            }
            Decision::Ask => {
                // The person is shown the files the line runs, as they are now.
                let runs = match (&self.workspace, call.tool) {
                    (Some(ws), "run_command") => input
                        .get("command")
                        .and_then(Value::as_str)
                        .map(|line| files::run_files(line, ws))
                        .unwrap_or_default(),
                    _ => files::Runs::default(),
                };
                let mut shown = input.clone();
                if !runs.files.is_empty()
                    && let Some(o) = shown.as_object_mut()
                {
                    o.insert(
                        "runs".into(),
                        runs.files.iter().map(files::RunFile::json).collect(),
                    );
                }
                let req = Request {
                    id,
                    tool: call.tool,
                    subject: call.subject,
                    input: &shown,
                };
                match self.calls.approve(&req, events, cancel).await {
                    Reply::Yes { by, always } => {
                        if always && let Ok(mut a) = self.always.lock() {
                            a.push((call.tool.to_string(), call.subject.to_string()));
                            if let Ok(mut f) = self.always_files.lock() {
                                f.push((call.subject.to_string(), runs.clone()));
                            }
                        }
                        self.note_approved(id, runs);
                        Self::decided(events, id, call.tool, Decided::Approved, by, None);
                        Answer::Allow
                    }
                    Reply::No {
                        by,
                        reason,
                        why,
                        decided,
                    } => {
                        Self::decided(events, id, call.tool, decided, by, reason);
                        Answer::Deny(refusal(&why))
                    }
                    Reply::Quit { by } => {
                        Self::decided(events, id, call.tool, Decided::Denied, by, None);
                        cancel.cancel();
                        Answer::Quit
                    }
                    Reply::Cancelled => Answer::Quit,
                }
            }
        }
    }

    /// A person as a check.
    pub(crate) async fn human(
        &self,
        question: &str,
        events: &Events,
        cancel: &CancellationToken,
    ) -> Judgement {
        self.checks.judge(question, events, cancel).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], ask: &[&str], deny: &[&str]) -> Rules {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Rules::parse(&v(allow), &v(ask), &v(deny)).unwrap()
    }

    fn call<'a>(tool: &'a str, subject: &'a str, risk: Risk) -> Call<'a> {
        Call {
            tool,
            subject,
            risk,
        }
    }

    fn allowed(by: &str) -> Decision {
        Decision::Allow {
            by: Some(by.into()),
        }
    }

    /// One row per case: the rules, the mode, remembered, the call, and what must come out.
    #[test]
    fn the_decision_table() {
        use Mode::*;
        let r = rules(
            &["run_command(cargo test*)", "write_file(src/**)"],
            &["run_command(git push*)"],
            &["run_command(rm -rf*)", "write_file(*.env)"],
        );
        let none = rules(&[], &[], &[]);
        let exec = Risk::Exec;
        let cases: Vec<(&Rules, Mode, bool, Call, Decision)> = vec![
            // Rules first, whatever the mode.
            (&r, Auto, false, call("run_command", "rm -rf /", exec), Decision::Deny {
                by: "rule deny `run_command(rm -rf*)`".into(),
                why: "the approval rule deny `run_command(rm -rf*)` matches `rm -rf /`".into(),
            }),
            (&r, Never, false, call("run_command", "cargo test -q", exec), allowed("rule allow `run_command(cargo test*)`")),
            (&r, Ask, false, call("write_file", "src/a.rs", Risk::Write), allowed("rule allow `write_file(src/**)`")),
            // Deny beats allow in a compound command.
            (&r, Auto, false, call("run_command", "cargo test && rm -rf ~", exec), Decision::Deny {
                by: "rule deny `run_command(rm -rf*)`".into(),
                why: "the approval rule deny `run_command(rm -rf*)` matches `cargo test && rm -rf ~`".into(),
            }),
            // A line that runs what the rules cannot see counts as matching the deny rule.
            (&r, Auto, false, call("run_command", "$X -rf /", exec), Decision::Deny {
                by: "rule deny `run_command(rm -rf*)`".into(),
                why: "`$X -rf /` runs a computed command name (`$X`), which rules cannot see \
                      into, so the approval rule deny `run_command(rm -rf*)` counts as matching it".into(),
            }),
            // An ask rule asks even in mode auto; mode never denies it.
            (&r, Auto, false, call("run_command", "git push origin", exec), Decision::Ask),
            (&r, Queue, false, call("run_command", "git push origin", exec), Decision::Ask),
            // Nothing decides: read calls run, the others go by the mode.
            (&none, Never, false, call("read_file", "a.txt", Risk::Read), Decision::Allow { by: None }),
            (&none, Auto, false, call("run_command", "ls", exec), allowed("approval mode auto")),
            (&none, Ask, false, call("run_command", "ls", exec), Decision::Ask),
            (&none, Queue, false, call("write_file", "a.txt", Risk::Write), Decision::Ask),
            (&none, Never, false, call("run_command", "ls", exec), Decision::Deny {
                by: "approval mode never".into(),
                why: "approval mode `never` denies what no rule allows, and no rule allows `run_command(ls)`".into(),
            }),
            // Mode never names the part of a command line no rule allows.
            (&r, Never, false, call("run_command", "cargo test && make", exec), Decision::Deny {
                by: "approval mode never".into(),
                why: "approval mode `never` denies what no rule allows, and no rule allows `make` (a part of the command line `cargo test && make`)".into(),
            }),
            // An `always` answer allows, before any rule.
            (&none, Never, true, call("run_command", "ls", exec), allowed("an earlier `always` answer")),
        ];
        for (i, (rules, mode, remembered, call, want)) in cases.into_iter().enumerate() {
            let got = decide(rules, mode, remembered, &call);
            assert_eq!(got, want, "case {i}: {call:?} in mode {mode:?}");
        }
        // Mode never denies an ask rule's call too.
        assert!(matches!(
            decide(&r, Never, false, &call("run_command", "git push", exec)),
            Decision::Deny { .. }
        ));
    }

    /// An approver that answers from a list and counts what it was asked.
    struct Scripted {
        replies: Mutex<Vec<Reply>>,
        asked: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl Approver for Scripted {
        async fn approve(&self, req: &Request<'_>, _: &Events, _: &CancellationToken) -> Reply {
            self.asked.lock().unwrap().push(req.subject.to_string());
            self.replies.lock().unwrap().remove(0)
        }
        async fn judge(&self, _: &str, _: &Events, _: &CancellationToken) -> Judgement {
            Judgement::Accepted
        }
    }

    #[tokio::test]
    async fn the_gate_asks_only_when_the_policy_says_ask_and_remembers_always() {
        let asker = Arc::new(Scripted {
            replies: Mutex::new(vec![
                Reply::Yes {
                    by: "p".into(),
                    always: true,
                },
                Reply::No {
                    by: "p".into(),
                    reason: Some("not that".into()),
                    why: "p said no: not that".into(),
                    decided: Decided::Denied,
                },
            ]),
            asked: Mutex::new(Vec::new()),
        });
        let gate = Gate::new(
            Mode::Ask,
            rules(&["run_command(ls)"], &[], &[]),
            asker.clone(),
            asker.clone(),
        );
        let events = Events::new();
        let cancel = CancellationToken::new();
        let input = serde_json::json!({});
        let check = |subject: &'static str| {
            let gate = &gate;
            let events = &events;
            let cancel = &cancel;
            let input = &input;
            async move {
                gate.check(
                    "c",
                    call("run_command", subject, Risk::Exec),
                    input,
                    events,
                    cancel,
                )
                .await
            }
        };
        assert_eq!(check("ls").await, Answer::Allow);
        assert_eq!(check("make").await, Answer::Allow);
        // Remembered: not asked again.
        assert_eq!(check("make").await, Answer::Allow);
        let Answer::Deny(why) = check("make install").await else {
            panic!("denied")
        };
        assert!(why.contains("not that"), "{why}");
        assert_eq!(*asker.asked.lock().unwrap(), ["make", "make install"]);
    }
}
