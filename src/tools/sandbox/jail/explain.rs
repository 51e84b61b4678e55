//! What a failed command's stderr says of the jail: which path the sandbox stopped and by
//! which rule, or that the command was killed for memory, told to the model so it can act.

use super::*;

impl Jail {
    /// When a command failed (`killed`: by SIGKILL, or a shell's 137) and its stderr shows a
    /// refusal, say which path the sandbox stopped and by which rule, so the model can act
    /// on it; or that it was killed for memory.
    pub(crate) fn explain(&self, stderr: &str, killed: bool) -> Option<String> {
        if self.policy == Policy::Off {
            return None;
        }
        if let Some(note) = self
            .limits
            .as_ref()
            .and_then(|l| l.memory_note(stderr, killed))
        {
            return Some(note);
        }
        let refused = [
            "Permission denied",
            "Read-only file system",
            "Operation not permitted",
            "Device or resource busy",
        ];
        let mut notes = Vec::new();
        for line in stderr
            .lines()
            .filter(|l| refused.iter().any(|r| l.contains(r)))
        {
            let note = if self.network == Network::Off
                && (line.contains("connect") || line.contains("/dev/tcp/") || line.contains("bind"))
            {
                "the sandbox blocks TCP connections and listening (network = false)".to_string()
            } else {
                let Some(path) = path_in(line) else { continue };
                let path = self.workspace.join(path);
                format!(
                    "the sandbox stopped writing {}: {}",
                    path.display(),
                    self.rule_for(&path)
                )
            };
            if !notes.contains(&note) {
                notes.push(note);
            }
        }
        if notes.is_empty() {
            return None;
        }
        let workspace_read_only = matches!(self.policy, Policy::ReadOnly)
            || self.goals.as_deref() == Some(self.workspace.as_path());
        let instead = if workspace_read_only {
            "Write in $TMPDIR instead (the workspace is read-only in this run)".to_string()
        } else {
            format!(
                "Write inside the workspace ({}) or $TMPDIR instead",
                self.writable
                    .first()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            )
        };
        Some(format!(
            "[sandbox {}] {}. {instead}; the sandbox cannot be turned off from inside a run.",
            self.policy.name(),
            notes.join("; "),
        ))
    }

    pub(super) fn rule_for(&self, path: &Path) -> String {
        if let Some(p) = self.pinned.iter().find(|p| *p == path) {
            return format!(
                "{} holds files of sup that are read-only to you (goal, check or \
                 configuration files), so it cannot be moved or removed",
                p.display()
            );
        }
        if let Some(g) = self.goals.as_ref().filter(|g| path.starts_with(g)) {
            return format!(
                "{} is the daemon's goals folder, never writable by its runs",
                g.display()
            );
        }
        if let Some(p) = self.read_only.iter().find(|p| path.starts_with(p)) {
            if p.file_name() == Some(OsStr::new(".git")) {
                return "`.git` is read-only (a goal can allow it with writable = [\".git\"])"
                    .into();
            }
            return format!(
                "{} is a goal, check or configuration file of sup, never writable by the agent",
                p.display()
            );
        }
        match self.policy {
            Policy::ReadOnly => "policy read-only: nothing but $TMPDIR is writable".into(),
            _ => {
                let shown: Vec<String> = self
                    .writable
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect();
                format!(
                    "policy workspace-write: only {} are writable",
                    shown.join(", ")
                )
            }
        }
    }
}

/// The path a refusal message names: quoted (`'x'`, `‘x’`, `"x"`), or the field before the
/// reason (`bash: line 1: x: Permission denied`).
fn path_in(line: &str) -> Option<PathBuf> {
    for (open, close) in [('\'', '\''), ('‘', '’'), ('"', '"')] {
        if let Some(start) = line.find(open) {
            let rest = &line[start + open.len_utf8()..];
            if let Some(end) = rest.find(close) {
                let p = &rest[..end];
                if !p.is_empty() {
                    return Some(PathBuf::from(p));
                }
            }
        }
    }
    let fields: Vec<&str> = line.split(": ").collect();
    fields
        .len()
        .checked_sub(2)
        .map(|i| fields[i].trim())
        .filter(|p| !p.is_empty() && !p.contains(' '))
        .map(PathBuf::from)
}
