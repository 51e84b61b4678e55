//! Human approval of risky tool calls: the mode (ask, queue, auto, never), the rules, the
//! terminal prompt and the unattended queue in the store, and a person as a check. The gate
//! answers each call with allow, deny (with who or which rule, and why) or quit; nothing that
//! needed a yes runs without one, and a run with no terminal never waits on a prompt.

pub mod answer;
pub mod rules;
mod terminal;

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use chrono::Utc;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use rules::{Rule, RuleError, Rules};
use rules::{Verdict, main_argument};
pub use terminal::Terminal;

use crate::store::db::{ApprovalRow, Db, parse_stamp, stamp};
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

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Ask => "ask",
            Mode::Queue => "queue",
            Mode::Auto => "auto",
            Mode::Never => "never",
        }
    }
}

/// Waiting requests default to this long before they count as a denial.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);
const POLL: Duration = Duration::from_millis(200);

/// What the gate says of a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
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

/// Where queued requests go.
#[derive(Clone, Debug)]
pub struct QueueTarget {
    pub home: PathBuf,
    pub run_id: String,
    pub goal: String,
}

pub struct Gate {
    mode: Mode,
    rules: Rules,
    timeout: Duration,
    /// `always` answers: (tool, main argument) allowed for the rest of the run.
    always: Mutex<Vec<(String, String)>>,
    terminal: Option<Terminal>,
    queue: QueueTarget,
    workspace: PathBuf,
}

fn refusal(why: &str) -> String {
    format!(
        "Denied: {why}. The call did not run. Do not repeat the same call; find another way, \
         or say in your answer why it is needed."
    )
}

impl Gate {
    pub fn new(
        mode: Mode,
        rules: Rules,
        timeout: Duration,
        terminal: Option<Terminal>,
        queue: QueueTarget,
        workspace: PathBuf,
    ) -> Self {
        Gate {
            mode,
            rules,
            timeout,
            always: Mutex::new(Vec::new()),
            terminal,
            queue,
            workspace,
        }
    }

    /// The rules this gate judges by.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    fn decided(
        events: &Events,
        id: &str,
        tool: &str,
        decision: &str,
        by: String,
        reason: Option<String>,
    ) {
        events.emit(Event::Approval {
            id: id.to_string(),
            tool: tool.to_string(),
            decision: decision.to_string(),
            by,
            reason,
        });
    }

    /// Decide a call before it runs.
    pub async fn check(
        &self,
        id: &str,
        tool: &str,
        risk: Risk,
        input: &Value,
        events: &Events,
        cancel: &CancellationToken,
    ) -> Answer {
        let arg = main_argument(tool, input, &self.workspace);
        let remembered = self
            .always
            .lock()
            .is_ok_and(|a| a.iter().any(|(t, x)| t == tool && *x == arg));
        if remembered {
            Self::decided(
                events,
                id,
                tool,
                "allowed",
                "an earlier `always` answer".into(),
                None,
            );
            return Answer::Allow;
        }
        let asked_by = match self.rules.judge(tool, &arg) {
            Some((Verdict::Deny, rule)) => {
                let by = format!("rule deny `{}`", rule.text);
                Self::decided(events, id, tool, "denied", by.clone(), None);
                return Answer::Deny(refusal(&format!("the approval {by} matches `{arg}`")));
            }
            Some((Verdict::Allow, rule)) => {
                Self::decided(
                    events,
                    id,
                    tool,
                    "allowed",
                    format!("rule allow `{}`", rule.text),
                    None,
                );
                return Answer::Allow;
            }
            Some((Verdict::Ask, rule)) => Some(format!("rule ask `{}`", rule.text)),
            None if risk == Risk::Read => return Answer::Allow,
            None => None,
        };
        match (self.mode, &asked_by) {
            (Mode::Auto, None) => {
                Self::decided(
                    events,
                    id,
                    tool,
                    "allowed",
                    "approval mode auto".into(),
                    None,
                );
                Answer::Allow
            }
            (Mode::Never, _) => {
                let by = "approval mode never".to_string();
                Self::decided(events, id, tool, "denied", by, None);
                let missing = self.rules.unallowed(tool, &arg);
                let what = if missing.is_empty() {
                    format!("`{tool}({arg})`")
                } else {
                    missing.join("; ")
                };
                Answer::Deny(refusal(&format!(
                    "approval mode `never` denies what no rule allows, and no rule allows {what}"
                )))
            }
            (Mode::Ask | Mode::Auto, _) if self.terminal.is_some() => {
                self.prompt(id, tool, &arg, input, events, cancel).await
            }
            _ => self.queued(id, tool, input, events, cancel).await,
        }
    }

    async fn prompt(
        &self,
        id: &str,
        tool: &str,
        arg: &str,
        input: &Value,
        events: &Events,
        cancel: &CancellationToken,
    ) -> Answer {
        let Some(term) = &self.terminal else {
            return Answer::Deny(refusal("no terminal to ask at"));
        };
        let text = terminal::describe(tool, input, &self.workspace);
        let answer = tokio::select! {
            a = term.ask_call(text) => a,
            _ = cancel.cancelled() => return Answer::Quit,
        };
        let by = "the person at the terminal".to_string();
        match answer {
            terminal::CallAnswer::Yes => {
                Self::decided(events, id, tool, "approved", by, None);
                Answer::Allow
            }
            terminal::CallAnswer::Always => {
                if let Ok(mut a) = self.always.lock() {
                    a.push((tool.to_string(), arg.to_string()));
                }
                Self::decided(events, id, tool, "approved", format!("{by} (always)"), None);
                Answer::Allow
            }
            terminal::CallAnswer::No(reason) => {
                Self::decided(events, id, tool, "denied", by.clone(), reason.clone());
                let why = match reason {
                    Some(r) => format!("{by} said no: {r}"),
                    None => format!("{by} said no"),
                };
                Answer::Deny(refusal(&why))
            }
            terminal::CallAnswer::Quit => {
                Self::decided(events, id, tool, "denied", format!("{by} (quit)"), None);
                cancel.cancel();
                Answer::Quit
            }
        }
    }

    /// Store a request and wait for its answer, its deadline or cancellation.
    async fn wait_in_queue(
        &self,
        kind: &str,
        id: &str,
        tool: &str,
        input: String,
        events: &Events,
        cancel: &CancellationToken,
    ) -> Result<ApprovalRow, String> {
        let request = format!("a-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let deadline = crate::store::db::deadline_after(Utc::now(), self.timeout);
        let row = ApprovalRow {
            id: request.clone(),
            run_id: self.queue.run_id.clone(),
            goal: self.queue.goal.clone(),
            kind: kind.to_string(),
            tool: tool.to_string(),
            input: input.clone(),
            created_at: stamp(Utc::now()),
            deadline: stamp(deadline),
            status: "pending".into(),
            always: false,
            reason: None,
            decided_by: None,
        };
        let db = Db::open(&self.queue.home).map_err(|e| e.to_string())?;
        db.request_approval(&row).map_err(|e| e.to_string())?;
        events.emit(Event::ApprovalRequested {
            id: id.to_string(),
            request: request.clone(),
            tool: tool.to_string(),
            input,
            deadline: row.deadline.clone(),
        });
        loop {
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = cancel.cancelled() => {
                    let _ = db.decide_approval(&request, "cancelled", false, None, "the run was cancelled");
                    return Err("the run was cancelled while the request waited".into());
                }
            }
            let Some(now) = db.approval(&request).map_err(|e| e.to_string())? else {
                return Err(format!(
                    "approval request {request} vanished from the store"
                ));
            };
            if now.status != "pending" {
                return Ok(now);
            }
            if parse_stamp(&now.deadline).is_some_and(|d| d <= Utc::now()) {
                let _ = db.decide_approval(&request, "timed_out", false, None, "the deadline");
                if let Ok(Some(row)) = db.approval(&request) {
                    return Ok(row);
                }
            }
        }
    }

    async fn queued(
        &self,
        id: &str,
        tool: &str,
        input: &Value,
        events: &Events,
        cancel: &CancellationToken,
    ) -> Answer {
        let row = match self
            .wait_in_queue("tool", id, tool, input.to_string(), events, cancel)
            .await
        {
            Ok(row) => row,
            Err(e) => {
                Self::decided(
                    events,
                    id,
                    tool,
                    "denied",
                    "the queue".into(),
                    Some(e.clone()),
                );
                return Answer::Deny(refusal(&e));
            }
        };
        let by = row.decided_by.clone().unwrap_or_else(|| "a person".into());
        match row.status.as_str() {
            "approved" => {
                if row.always
                    && let Ok(mut a) = self.always.lock()
                {
                    a.push((
                        tool.to_string(),
                        main_argument(tool, input, &self.workspace),
                    ));
                }
                Self::decided(
                    events,
                    id,
                    tool,
                    "approved",
                    format!("{by} (request {})", row.id),
                    None,
                );
                Answer::Allow
            }
            "timed_out" => {
                let why = format!(
                    "nobody answered approval request {} within {}",
                    row.id,
                    humantime::format_duration(self.timeout)
                );
                Self::decided(
                    events,
                    id,
                    tool,
                    "timed_out",
                    "the deadline".into(),
                    Some(why.clone()),
                );
                Answer::Deny(refusal(&why))
            }
            _ => {
                let reason = row.reason.clone();
                Self::decided(
                    events,
                    id,
                    tool,
                    "denied",
                    format!("{by} (request {})", row.id),
                    reason.clone(),
                );
                let why = match reason {
                    Some(r) => format!("{by} denied request {}: {r}", row.id),
                    None => format!("{by} denied request {}", row.id),
                };
                Answer::Deny(refusal(&why))
            }
        }
    }

    /// A person as a check: at the terminal when there is one, else through the queue.
    pub async fn human(
        &self,
        question: &str,
        events: &Events,
        cancel: &CancellationToken,
    ) -> Judgement {
        if let Some(term) = &self.terminal {
            return tokio::select! {
                j = term.ask_check(question.to_string()) => j,
                _ = cancel.cancelled() => Judgement::Rejected("the run was cancelled".into()),
            };
        }
        match self
            .wait_in_queue(
                "check",
                "human",
                "human",
                question.to_string(),
                events,
                cancel,
            )
            .await
        {
            Ok(row) if row.status == "approved" => Judgement::Accepted,
            Ok(row) if row.status == "timed_out" => Judgement::Rejected(format!(
                "nobody answered the check within {}",
                humantime::format_duration(self.timeout)
            )),
            Ok(row) => {
                Judgement::Rejected(row.reason.unwrap_or_else(|| {
                    format!("rejected by {}", row.decided_by.unwrap_or_default())
                }))
            }
            Err(e) => Judgement::Rejected(e),
        }
    }
}
