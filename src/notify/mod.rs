//! Notifications built from recorded outcomes: `[[notify]]` tables (goal file or user
//! config) checked into channels, the notice document (from the run's record and its check
//! results, never the model's words), and its delivery (`send`): a webhook POST or a
//! command with the JSON on stdin, retried, each attempt bounded in time and recorded.

mod send;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::Usage;
use crate::store::db::{RunRow, stamp};
use crate::trace::{CheckReport, Event, EventSink, one_line};

/// How long one attempt to deliver a notice may take, unless `timeout` says.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Attempts at most per notice.
pub(crate) const ATTEMPTS: u32 = 3;

/// Bytes of a failing check's output tail in a notice.
const TAIL: usize = 2000;

#[derive(Debug, thiserror::Error)]
pub(crate) enum NotifyError {
    #[error("key `notify.on`: `{0}` is not an event; use {EVENTS}")]
    UnknownEvent(String),
    #[error(
        "a [[notify]] table takes exactly one channel: `webhook = \"URL\"` or `command = [\"argv\", …]`"
    )]
    Channel,
    #[error("key `notify.webhook`: `{url}` is not an http(s) URL ({why})")]
    Url { url: String, why: String },
    #[error("key `notify.format`: `{0}` is not a format; use json, slack or text")]
    Format(String),
    #[error("key `notify.command`: the argv list is empty")]
    EmptyCommand,
    #[error("key `notify.{0}` belongs to a webhook, not a command")]
    WebhookOnly(&'static str),
    #[error("key `notify.timeout`: {0}")]
    Timeout(String),
}

const EVENTS: &str = "failed, unfinished, error, approval_needed, achieved, missed, recovered";

/// What a notice is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    Failed,
    Unfinished,
    Error,
    ApprovalNeeded,
    Achieved,
    Missed,
    /// The first achieved run after runs that were not.
    Recovered,
}

impl Kind {
    pub(crate) fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "failed" => Kind::Failed,
            "unfinished" => Kind::Unfinished,
            "error" => Kind::Error,
            "approval_needed" => Kind::ApprovalNeeded,
            "achieved" => Kind::Achieved,
            "missed" => Kind::Missed,
            "recovered" => Kind::Recovered,
            _ => return None,
        })
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Failed => "failed",
            Kind::Unfinished => "unfinished",
            Kind::Error => "error",
            Kind::ApprovalNeeded => "approval_needed",
            Kind::Achieved => "achieved",
            Kind::Missed => "missed",
            Kind::Recovered => "recovered",
        }
    }

    /// Every event but `achieved`: what a table without `on` is sent.
    fn defaults() -> Vec<Kind> {
        vec![
            Kind::Failed,
            Kind::Unfinished,
            Kind::Error,
            Kind::ApprovalNeeded,
            Kind::Missed,
            Kind::Recovered,
        ]
    }
}

/// A `[[notify]]` table as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNotify {
    on: Option<Vec<String>>,
    pub(crate) webhook: Option<String>,
    format: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    secret_env: Option<String>,
    pub(crate) command: Option<Vec<String>>,
    timeout: Option<String>,
}

/// How a notice is written: a webhook's body, a command's stdin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// The notice document (README: "Notifications").
    Json,
    /// `{"text": "…"}` for a Slack incoming webhook.
    Slack,
    /// The notice as plain text (ntfy and the like).
    Text,
}

impl Format {
    /// `format = "…"`: json (the default), slack or text.
    fn parse(word: Option<&str>) -> Result<Format, NotifyError> {
        match word {
            None | Some("json") => Ok(Format::Json),
            Some("slack") => Ok(Format::Slack),
            Some("text") => Ok(Format::Text),
            Some(other) => Err(NotifyError::Format(other.to_string())),
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) enum Channel {
    Webhook {
        url: reqwest::Url,
        format: Format,
        /// Values may name environment variables: `$NAME` or `${NAME}`.
        headers: BTreeMap<String, String>,
        /// The environment variable holding the HMAC-SHA256 key of `X-Sup-Signature`.
        secret_env: Option<String>,
    },
    /// argv; the notice on stdin, as `format` says (JSON by default).
    Command(Vec<String>, Format),
}

/// A checked `[[notify]]` table.
#[derive(Clone, Debug)]
pub struct Notify {
    on: Vec<Kind>,
    channel: Channel,
    /// Bounds each attempt to deliver a notice, and how long a run's end waits for them.
    timeout: Duration,
}

impl Notify {
    /// Check a table. The caller adds the file and line.
    pub(crate) fn parse(raw: RawNotify) -> Result<Notify, NotifyError> {
        let on = match raw.on {
            None => Kind::defaults(),
            Some(names) => names
                .iter()
                .map(|n| Kind::parse(n).ok_or_else(|| NotifyError::UnknownEvent(n.clone())))
                .collect::<Result<_, _>>()?,
        };
        let timeout = match raw.timeout {
            Some(t) => crate::duration::parse_duration(&t).map_err(NotifyError::Timeout)?,
            None => DEFAULT_TIMEOUT,
        };
        if timeout.is_zero() {
            return Err(NotifyError::Timeout("a timeout of 0 sends nothing".into()));
        }
        let channel = match (raw.webhook, raw.command) {
            (Some(url), None) => {
                let parsed = reqwest::Url::parse(&url).map_err(|e| NotifyError::Url {
                    url: url.clone(),
                    why: e.to_string(),
                })?;
                if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
                    return Err(NotifyError::Url {
                        url,
                        why: "write http://HOST/… or https://HOST/…".into(),
                    });
                }
                let format = Format::parse(raw.format.as_deref())?;
                Channel::Webhook {
                    url: parsed,
                    format,
                    headers: raw.headers,
                    secret_env: raw.secret_env,
                }
            }
            (None, Some(argv)) => {
                if argv.is_empty() {
                    return Err(NotifyError::EmptyCommand);
                }
                if !raw.headers.is_empty() {
                    return Err(NotifyError::WebhookOnly("headers"));
                }
                if raw.secret_env.is_some() {
                    return Err(NotifyError::WebhookOnly("secret_env"));
                }
                Channel::Command(argv, Format::parse(raw.format.as_deref())?)
            }
            _ => return Err(NotifyError::Channel),
        };
        Ok(Notify {
            on,
            channel,
            timeout,
        })
    }

    /// The first of `kinds` this table is sent; `None` when none.
    fn pick(&self, kinds: &[Kind]) -> Option<Kind> {
        kinds.iter().copied().find(|k| self.on.contains(k))
    }
}

/// A failing check in a notice.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct FailedCheck {
    name: String,
    /// `script`, `command`, `human` or `judge`.
    kind: crate::trace::CheckKind,
    /// A judge's model.
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<String>,
    /// `exit 1`, `timed out after 5s`, `rejected: …`.
    outcome: String,
    output_tail: String,
}

/// A waiting approval request in a notice.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ApprovalNotice {
    request_id: String,
    tool: String,
    /// The exact command, or what a file change does.
    summary: String,
    approve: String,
    deny: String,
    deadline: String,
}

/// The document a channel is sent (README: "Notifications").
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Notice {
    event: Kind,
    pub(crate) goal: String,
    run_id: Option<String>,
    trigger: Option<String>,
    scheduled_for: Option<String>,
    status: Option<String>,
    stop_reason: Option<String>,
    tries: Option<u32>,
    steps: Option<u32>,
    tokens: Option<Usage>,
    cost_usd: Option<f64>,
    error: Option<String>,
    failed_checks: Vec<FailedCheck>,
    /// The kinds of the checks that passed, when the goal was achieved.
    verified_by: Vec<crate::trace::CheckKind>,
    /// The models of the judges that said yes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    judged_by: Vec<String>,
    approval: Option<ApprovalNotice>,
    host: String,
    at: String,
}

fn host() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

fn tail(s: &str) -> String {
    let mut start = s.len().saturating_sub(TAIL);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

impl Notice {
    fn new(event: Kind, goal: &str) -> Notice {
        Notice {
            event,
            goal: goal.to_string(),
            run_id: None,
            trigger: None,
            scheduled_for: None,
            status: None,
            stop_reason: None,
            tries: None,
            steps: None,
            tokens: None,
            cost_usd: None,
            error: None,
            failed_checks: Vec::new(),
            verified_by: Vec::new(),
            judged_by: Vec::new(),
            approval: None,
            host: host(),
            at: stamp(chrono::Utc::now()),
        }
    }

    /// The notice of a finished run, from its record and its last try's check results.
    /// `previous` is the goal's run before it, for `recovered`. `None` for an interrupted
    /// run, which no event covers.
    pub(crate) fn of_run(
        run: &RunRow,
        checks: &[Vec<CheckReport>],
        previous: Option<&RunRow>,
    ) -> Option<(Vec<Kind>, Notice)> {
        let kinds = match run.status.as_str() {
            "achieved"
                if previous.is_some_and(|p| p.status != crate::store::RunStatus::Achieved) =>
            {
                vec![Kind::Recovered, Kind::Achieved]
            }
            "achieved" => vec![Kind::Achieved],
            "failed" => vec![Kind::Failed],
            "unfinished" => vec![Kind::Unfinished],
            "error" => vec![Kind::Error],
            _ => return None,
        };
        let mut n = Notice::new(kinds[0], &run.goal);
        n.run_id = Some(run.id.clone());
        n.trigger = Some(run.trigger.to_string());
        n.scheduled_for = run.scheduled_for.clone();
        n.status = Some(run.status.to_string());
        n.stop_reason = run.stop_reason.map(|s| s.as_str().to_string());
        n.tries = Some(run.tries);
        n.steps = Some(run.steps);
        n.tokens = Some(run.usage);
        n.cost_usd = run.cost;
        n.error = run.error.clone();
        n.failed_checks = checks
            .last()
            .into_iter()
            .flatten()
            .filter(|c| !c.passed)
            .map(|c| FailedCheck {
                name: c.name.clone(),
                kind: c.kind,
                model: c.model.clone(),
                outcome: c.outcome.clone(),
                output_tail: tail(&c.output_tail),
            })
            .collect();
        if run.status == crate::store::RunStatus::Achieved
            && let Some(last) = checks.last()
        {
            n.verified_by = crate::trace::verified_by(last);
            n.judged_by = last
                .iter()
                .filter(|c| c.passed && c.kind == crate::trace::CheckKind::Judge)
                .filter_map(|c| c.model.clone())
                .collect();
        }
        Some((kinds, n))
    }

    /// The `error` notice of a run that could not start (no API key, an MCP server that
    /// fails, a price unknown under a cap).
    pub(crate) fn not_started(
        goal: &str,
        run_id: &str,
        trigger: &str,
        scheduled_for: Option<chrono::DateTime<chrono::Utc>>,
        error: &str,
    ) -> Notice {
        let mut n = Notice::new(Kind::Error, goal);
        n.run_id = Some(run_id.to_string());
        n.trigger = Some(trigger.to_string());
        n.scheduled_for = scheduled_for.map(stamp);
        n.status = Some("error".into());
        n.stop_reason = Some("error".into());
        n.tries = Some(0);
        n.steps = Some(0);
        n.error = Some(crate::redact::text(error).into_owned());
        n
    }

    /// The notice of an occurrence that did not run (`missed` or `skipped`).
    pub(crate) fn missed(goal: &str, at: chrono::DateTime<chrono::Utc>, status: &str) -> Notice {
        let mut n = Notice::new(Kind::Missed, goal);
        n.trigger = Some("schedule".into());
        n.scheduled_for = Some(stamp(at));
        n.status = Some(status.to_string());
        n
    }

    /// One line, then details: the body of `text` and `slack` notices.
    pub(crate) fn text(&self) -> String {
        let goal = &self.goal;
        let mut s = match (&self.approval, self.event) {
            (Some(a), _) => format!(
                "sup · goal {goal} waits for approval {}: {} {}",
                a.request_id, a.tool, a.summary
            ),
            (None, Kind::Missed) => format!(
                "sup · goal {goal}: the occurrence of {} did not run ({})",
                self.scheduled_for.as_deref().unwrap_or("?"),
                self.status.as_deref().unwrap_or("missed")
            ),
            (None, kind) => {
                let mut line = format!("sup · goal {goal} {}", kind.as_str());
                if let Some(r) = &self.stop_reason {
                    line.push_str(&format!(" ({r})"));
                }
                if let Some(t) = self.tries {
                    line.push_str(&format!(
                        " after {t} {}",
                        if t == 1 { "try" } else { "tries" }
                    ));
                }
                line
            }
        };
        if let Some(id) = &self.run_id {
            s.push_str(&format!(" · run {id}"));
        }
        if let Some(c) = self.cost_usd {
            s.push_str(&format!(" · {}", crate::trace::usd(c)));
        }
        if let Some(e) = &self.error {
            s.push_str(&format!("\nerror: {}", one_line(e, 300)));
        }
        if !self.judged_by.is_empty() {
            s.push_str(&format!("\njudged by {}", self.judged_by.join(", ")));
        }
        for c in &self.failed_checks {
            let by = c
                .model
                .as_ref()
                .map(|m| format!(" · judge {m}"))
                .unwrap_or_default();
            s.push_str(&format!("\n✗ {} · {}{by}", c.name, c.outcome));
            for l in c
                .output_tail
                .lines()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
            {
                s.push_str(&format!("\n    {l}"));
            }
        }
        if let Some(a) = &self.approval {
            s.push_str(&format!("\n  {}\n  {}", a.approve, a.deny));
        }
        s
    }
}

/// What a waiting call would do, in a line: the exact command, or a file change's size.
fn approval_summary(tool: &str, input: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(input).unwrap_or_default();
    let s = |k: &str| v.get(k).and_then(|x| x.as_str());
    match (tool, s("command"), s("path")) {
        (_, Some(cmd), _) => cmd.to_string(),
        ("write_file", _, Some(path)) => {
            format!("write {path} ({} bytes)", s("content").map_or(0, str::len))
        }
        ("edit_file", _, Some(path)) => format!(
            "edit {path}: -{} +{} lines",
            s("old_string").map_or(0, |t| t.lines().count()),
            s("new_string").map_or(0, |t| t.lines().count())
        ),
        _ => one_line(input, 300),
    }
}

/// Where notices go and are recorded.
#[derive(Clone, Debug)]
pub(crate) struct Notifier {
    home: PathBuf,
    notify: Arc<Vec<Notify>>,
    /// Notices sent while the run goes on (approvals), which `settle` waits for.
    pending: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Notifier {
    pub(crate) fn new(home: &Path, notify: Vec<Notify>) -> Notifier {
        Notifier {
            home: home.to_path_buf(),
            notify: Arc::new(notify),
            pending: Arc::default(),
        }
    }

    /// The longest any table's attempt may take (and a moment to record how it ended): how
    /// long the end of a run waits for its notices at most.
    fn patience(&self) -> Duration {
        self.notify
            .iter()
            .map(|n| n.timeout)
            .max()
            .unwrap_or_default()
            + Duration::from_millis(100)
    }

    /// Wait, at most the notify timeout, for the notices sent in the background while the
    /// run went on (approvals), so that none is lost when the process ends after the run.
    pub(crate) async fn settle(&self) {
        let pending = match self.pending.lock() {
            Ok(mut p) => std::mem::take(&mut *p),
            Err(_) => return,
        };
        let _ = tokio::time::timeout(self.patience(), futures::future::join_all(pending)).await;
    }

    /// Deliver `notice` to every table that takes one of `kinds` (the first it takes), all
    /// at once. Returns when each is delivered or given up, or after the notify timeout
    /// (the longest table's), whichever is first: a receiver that never answers delays the
    /// caller by one timeout. Retries still due then go on where the process lives on (the
    /// daemon); where it ends (`sup run`, `sup goal`), each is recorded as not made.
    pub(crate) async fn send(&self, kinds: &[Kind], notice: &Notice) {
        let sends: Vec<_> = (0..self.notify.len())
            .filter_map(|i| {
                let kind = self.notify[i].pick(kinds)?;
                let mut notice = notice.clone();
                notice.event = kind;
                let (home, notify) = (self.home.clone(), self.notify.clone());
                Some(tokio::spawn(async move {
                    send::deliver(&home, &notify[i], &notice).await
                }))
            })
            .collect();
        if sends.is_empty() {
            return;
        }
        let _ = tokio::time::timeout(self.patience(), futures::future::join_all(sends)).await;
    }

    /// The sink that sends `approval_needed` notices while the run waits.
    pub(crate) fn approvals(&self, goal: &str, run_id: &str, trigger: &str) -> Arc<dyn EventSink> {
        Arc::new(ApprovalSink {
            notifier: self.clone(),
            goal: goal.to_string(),
            run_id: run_id.to_string(),
            trigger: trigger.to_string(),
        })
    }
}

struct ApprovalSink {
    notifier: Notifier,
    goal: String,
    run_id: String,
    trigger: String,
}

impl EventSink for ApprovalSink {
    fn emit(&self, event: &Event) {
        let Event::ApprovalRequested {
            request,
            tool,
            input,
            deadline,
            ..
        } = event
        else {
            return;
        };
        let mut n = Notice::new(Kind::ApprovalNeeded, &self.goal);
        n.run_id = Some(self.run_id.clone());
        n.trigger = Some(self.trigger.clone());
        n.status = Some("running".into());
        n.approval = Some(ApprovalNotice {
            request_id: request.clone(),
            tool: tool.clone(),
            summary: approval_summary(tool, input),
            approve: format!("sup approve {request}"),
            deny: format!("sup deny {request} --reason '…'"),
            deadline: deadline.clone(),
        });
        let notifier = self.notifier.clone();
        // The run waits for a person anyway; the notice must not hold the gate. The run's
        // end waits for it (`Notifier::settle`).
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let task = rt.spawn(async move { notifier.send(&[Kind::ApprovalNeeded], &n).await });
            if let Ok(mut pending) = self.notifier.pending.lock() {
                pending.push(task);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> RawNotify {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn a_table_takes_exactly_one_channel_and_known_events() {
        assert!(matches!(
            Notify::parse(raw("on = [\"failed\"]")),
            Err(NotifyError::Channel)
        ));
        assert!(matches!(
            Notify::parse(raw("webhook = \"http://x/\"\ncommand = [\"cat\"]")),
            Err(NotifyError::Channel)
        ));
        assert!(matches!(
            Notify::parse(raw("webhook = \"http://x/\"\non = [\"faild\"]")),
            Err(NotifyError::UnknownEvent(_))
        ));
        assert!(matches!(
            Notify::parse(raw("webhook = \"not a url\"")),
            Err(NotifyError::Url { .. })
        ));
        let n = Notify::parse(raw("command = [\"cat\"]")).unwrap();
        assert!(!n.on.contains(&Kind::Achieved));
        assert!(n.on.contains(&Kind::Recovered));
    }

    #[test]
    fn a_command_is_summarized_exactly() {
        assert_eq!(
            approval_summary("run_command", r#"{"command":"rm -rf build"}"#),
            "rm -rf build"
        );
        assert_eq!(
            approval_summary("write_file", r#"{"path":"a.txt","content":"hello"}"#),
            "write a.txt (5 bytes)"
        );
    }
}
