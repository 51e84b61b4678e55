//! The work loop: ask the model, execute the tool calls it proposes (through the schema gate,
//! read-only calls together, the others one at a time in the model's order), feed every
//! result back, and decide when to stop. Every call id gets exactly one result, whatever
//! happens; a forced stop is never success. A conversation that outgrows the model's context
//! window is compacted (`compact`) before the request that would not fit, or when the
//! provider says it did not.

pub(crate) mod compact;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::approval::{Answer, Call, Gate};
use crate::model::prices::{InputEstimate, Price, tool_bytes};
use crate::model::{
    Conversation, FinishReason, Message, Model, ModelError, ModelRequest, PartialSlot, ToolCall,
    ToolResult, ToolSpec, Usage,
};
use crate::tools::process::safe_name;
use crate::tools::{Prepared, Registry, Risk, ToolContext, ToolError};
pub(crate) use crate::trace::StopReason;
use crate::trace::{Event, Events};
use compact::Room;

/// The limits of one work loop.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Model turns, not tool calls.
    pub max_steps: u32,
    /// Input plus output tokens over the whole run (all tries).
    pub token_budget: Option<u64>,
    pub tool_timeout: Duration,
    /// Bytes of a tool result the model sees; the rest is kept on disk.
    pub output_cap: usize,
    /// The same call with the same result this many times in a row stops the run.
    pub repeat_limit: u32,
    /// The model's price, when known: each step's cost goes into the trace.
    pub price: Option<Price>,
    /// US dollars this run may spend at most (all tries); checked before every model call.
    pub max_cost: Option<f64>,
    /// Tokens the model's context window holds, when known (table, config, flag).
    pub context_window: Option<u64>,
    /// The share of the window past which the conversation is compacted, in (0, 1).
    pub compact_at: f64,
    /// The window the server named in an overflow error (llama.cpp's `n_ctx`), learned
    /// during the run and kept across tries; 0 while unknown.
    pub learned_window: Arc<AtomicU64>,
    /// Tokens shared with other work loops (a parallel run's attempts): the budget and the
    /// cost cap then hold over all of them together.
    pub pool: Option<Arc<Pool>>,
}

/// What several work loops spent together.
#[derive(Debug, Default)]
pub struct Pool(std::sync::Mutex<Usage>);

impl Pool {
    fn add(&self, used: Usage) {
        if let Ok(mut u) = self.0.lock() {
            *u += used;
        }
    }

    pub(crate) fn total(&self) -> Usage {
        self.0.lock().map(|u| *u).unwrap_or_default()
    }
}

/// The share of the window past which a conversation is compacted, unless set.
pub const DEFAULT_COMPACT_AT: f64 = 0.85;
/// Failed compactions in a row after which the run stops (`context`).
const MAX_COMPACTION_FAILURES: u32 = 3;
/// The longest summary asked for, in tokens.
const MAX_SUMMARY_TOKENS: u64 = 20_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_steps: 30,
            token_budget: None,
            tool_timeout: Duration::from_secs(120),
            output_cap: 16 * 1024,
            repeat_limit: 3,
            price: None,
            max_cost: None,
            context_window: None,
            compact_at: DEFAULT_COMPACT_AT,
            learned_window: Arc::default(),
            pool: None,
        }
    }
}

/// Compactions of one work loop: failures in a row, and whether the last request was the
/// first after a compaction (its overflow counts as the compaction failing).
#[derive(Default)]
struct Compactions {
    failures: u32,
    fresh: bool,
    /// Why the last one failed.
    why: String,
    /// What the server said of the last request past the window.
    server: String,
}

/// The agent a run drives: its model, its tools and their sandbox, the gate its calls pass,
/// where its events go and what cancels it. The verify loop hands it to each try's work loop.
#[derive(Clone)]
pub struct Agent<'a> {
    pub model: &'a dyn Model,
    pub tools: &'a Registry,
    pub events: &'a Events,
    pub cancel: &'a CancellationToken,
    /// The approval gate every call passes; `None` allows everything (library use).
    pub gate: Option<&'a Gate>,
    /// The sandbox of every process a tool or check starts.
    pub jail: Arc<crate::tools::sandbox::Jail>,
}

/// Everything a work loop runs with.
#[derive(Clone)]
pub struct Work<'a> {
    pub agent: Agent<'a>,
    pub limits: &'a Limits,
    pub workspace: PathBuf,
    /// The workspace opened once, for every tool call of the loop (`Root::open`).
    pub root: Arc<crate::tools::Root>,
    pub output_dir: PathBuf,
    /// Files the agent must not change (check scripts).
    pub protected: Arc<Vec<PathBuf>>,
    /// What the goal protects (`protect` globs, `.git`).
    pub guarded: Arc<crate::tools::Protected>,
    /// Environment given to every process a tool starts.
    pub env: Arc<Vec<(String, String)>>,
    /// When the run started: event times are offsets from it.
    pub started: Instant,
}

/// How one work loop ended.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub stop_reason: StopReason,
    pub steps: u32,
    /// Tokens spent by this loop alone.
    pub usage: Usage,
    /// The final answer (`final` stops only).
    pub answer: Option<String>,
    /// What went wrong (`error` stops).
    pub error: Option<String>,
}

/// The output tokens of a response whose provider reported none: a token per 4 bytes.
fn output_estimate(r: &crate::model::ModelResponse) -> u64 {
    let bytes = r.text.len()
        + r.reasoning.as_ref().map_or(0, String::len)
        + r.tool_calls
            .iter()
            .map(|c| c.id.len() + c.name.len() + c.arguments.len())
            .sum::<usize>();
    (bytes as u64).div_ceil(4)
}

/// Add a message to the conversation and to the transcript.
/// Known secrets are redacted first: what the model is sent never holds one.
pub(crate) fn push(messages: &mut Conversation, message: Message, events: &Events) {
    let message = crate::redact::serde(&message).unwrap_or(message);
    events.emit(Event::Message {
        message: message.clone(),
    });
    messages.push(message);
}

/// The tools as the model is told them: known secrets redacted from their descriptions and
/// schemas (an MCP server's or a command tool's text may hold one); names are kept, since
/// calls name them.
fn told(specs: &[ToolSpec]) -> std::borrow::Cow<'_, [ToolSpec]> {
    if !crate::redact::active() {
        return std::borrow::Cow::Borrowed(specs);
    }
    let mut specs = specs.to_vec();
    for s in &mut specs {
        crate::redact::string(&mut s.description);
        crate::redact::value(&mut s.input_schema);
    }
    std::borrow::Cow::Owned(specs)
}

impl Work<'_> {
    fn ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }

    fn finish(&self, stop_reason: StopReason, steps: u32, usage: Usage) -> Outcome {
        self.agent.events.emit(Event::WorkFinished {
            stop_reason,
            steps,
            error: None,
        });
        Outcome {
            stop_reason,
            steps,
            usage,
            answer: None,
            error: None,
        }
    }

    /// The context window: the one set or known, or the one the server named, the smaller
    /// when both are known.
    fn window(&self) -> Option<u64> {
        let learned = Some(self.limits.learned_window.load(Ordering::Relaxed)).filter(|n| *n > 0);
        match (self.limits.context_window, learned) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Record what arrived of an answer that did not finish, and count its usage.
    fn keep_partial(&self, step: u32, slot: &PartialSlot, why: &str, usage: &mut Usage) {
        let kept = slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(p) = kept {
            *usage += p.usage;
            self.agent.events.emit(Event::Partial {
                step,
                text: p.text,
                tool_calls: p.tool_calls,
                usage: p.usage,
                why: why.to_string(),
            });
        }
    }

    /// Run the loop on `messages`; `spent` is what earlier tries of the same run used.
    pub async fn run(&self, messages: &mut Conversation, spent: Usage) -> Outcome {
        let mut usage = Usage::default();
        let mut repeats = Repeats::default();
        let mut estimate = InputEstimate::default();
        let mut compactions = Compactions::default();
        // Every secret is known by now: keys at start-up, passed values when the jail was made.
        let specs = told(self.agent.tools.specs());
        let tool_bytes = tool_bytes(&specs);
        let events = self.agent.events;
        for step in 1..=self.limits.max_steps {
            if self.agent.cancel.is_cancelled() {
                return self.finish(StopReason::Cancelled, step - 1, usage);
            }
            let mut spent_now = spent;
            spent_now += usage;
            if let Some(pool) = &self.limits.pool {
                spent_now = pool.total();
            }
            if self
                .limits
                .token_budget
                .is_some_and(|b| spent_now.total() >= b)
            {
                return self.finish(StopReason::Budget, step - 1, usage);
            }
            let bytes = messages.bytes() + tool_bytes;
            if let (Some(price), Some(cap)) = (self.limits.price, self.limits.max_cost)
                && price.cost(&spent_now) + price.input_cost(estimate.tokens(bytes)) >= cap
            {
                return self.finish(StopReason::Cost, step - 1, usage);
            }
            let mut room = Room {
                step,
                tool_bytes,
                forced: false,
            };
            if let Err(stop) = self
                .make_room(&room, messages, &mut estimate, &mut usage, &mut compactions)
                .await
            {
                return stop;
            }
            events.emit(Event::StepStarted { step });
            let on_text = |t: &str| {
                events.emit(Event::TextDelta {
                    text: t.to_string(),
                })
            };
            let (response, bytes) = loop {
                let bytes = messages.bytes() + tool_bytes;
                let max_output = self.window().map(|w| {
                    u32::try_from(w.saturating_sub(estimate.scaled(bytes))).unwrap_or(u32::MAX)
                });
                let partial = PartialSlot::default();
                let request = ModelRequest {
                    messages,
                    tools: &specs,
                    on_text: &on_text,
                    json_schema: None,
                    max_output,
                    partial: Some(&partial),
                };
                // What the step has said so far is on disk before the wait.
                events.flush();
                let response = tokio::select! {
                    r = self.agent.model.step(request) => r,
                    _ = self.agent.cancel.cancelled() => {
                        self.keep_partial(step, &partial, "cancelled", &mut usage);
                        return self.finish(StopReason::Cancelled, step, usage);
                    }
                };
                match response {
                    Ok(r) => {
                        compactions.failures = 0;
                        compactions.fresh = false;
                        break (r, bytes);
                    }
                    Err(ModelError::ContextOverflow {
                        window, message, ..
                    }) => {
                        // The window, as the server names it; else at most this request's size.
                        let learned = window.unwrap_or_else(|| {
                            let known = self.window().unwrap_or(u64::MAX);
                            known.min(estimate.scaled(bytes)).max(1)
                        });
                        self.limits.learned_window.store(learned, Ordering::Relaxed);
                        if compactions.fresh {
                            compactions.failures += 1;
                            compactions.why =
                                "the compacted conversation was still past the window".into();
                        }
                        compactions.server = message;
                        room.forced = true;
                        if let Err(stop) = self
                            .make_room(&room, messages, &mut estimate, &mut usage, &mut compactions)
                            .await
                        {
                            return stop;
                        }
                    }
                    Err(e) => {
                        self.keep_partial(step, &partial, "the request failed", &mut usage);
                        let error = e.to_string();
                        events.emit(Event::WorkFinished {
                            stop_reason: StopReason::Error,
                            steps: step,
                            error: Some(error.clone()),
                        });
                        return Outcome {
                            stop_reason: StopReason::Error,
                            steps: step,
                            usage,
                            answer: None,
                            error: Some(error),
                        };
                    }
                }
            };
            // A provider that reports no usage is counted by estimate, so that budgets and
            // cost caps still hold.
            let used = if response.usage.total() == 0 {
                Usage {
                    input_tokens: estimate.tokens(bytes),
                    output_tokens: output_estimate(&response),
                    ..Usage::default()
                }
            } else {
                response.usage
            };
            usage += used;
            estimate.reported(&used, bytes);
            let mut total = spent;
            total += usage;
            if let Some(pool) = &self.limits.pool {
                pool.add(used);
            }
            let all = self.limits.pool.as_ref().map_or(total, |p| p.total());
            if !response.text.is_empty() {
                events.emit(Event::ModelText {
                    step,
                    text: response.text.clone(),
                });
            }
            let calls = response.tool_calls.clone();
            push(
                messages,
                Message::Assistant {
                    text: response.text.clone(),
                    tool_calls: calls.clone(),
                    reasoning: response.reasoning.clone(),
                },
                events,
            );
            events.emit(Event::StepFinished {
                step,
                usage: used,
                total_usage: total,
                cost: self.limits.price.map(|p| p.cost(&used)),
                total_cost: self.limits.price.map(|p| p.cost(&total)),
            });
            for call in &calls {
                events.emit(Event::ToolCall {
                    step,
                    id: call.id.clone(),
                    name: call.name.clone(),
                    input: serde_json::from_str(&call.arguments)
                        .unwrap_or_else(|_| Value::String(call.arguments.clone())),
                });
            }
            let over_budget = self.limits.token_budget.is_some_and(|b| all.total() >= b);
            let early_stop = if response.finish == FinishReason::Length {
                Some((StopReason::Length, "the model ran out of output tokens"))
            } else if calls.is_empty() {
                let mut outcome = self.finish(StopReason::Final, step, usage);
                outcome.answer = Some(response.text);
                return outcome;
            } else if over_budget {
                Some((StopReason::Budget, "the token budget of this run is spent"))
            } else {
                None
            };
            if let Some((reason, why)) = early_stop {
                if !calls.is_empty() {
                    let results = calls
                        .iter()
                        .map(|c| self.unrun(step, c, &format!("not run: {why}")))
                        .collect();
                    push(messages, Message::Tool { results }, events);
                }
                return self.finish(reason, step, usage);
            }
            events.flush();
            let results = self.execute(step, &calls).await;
            let repeated = results
                .iter()
                .zip(&calls)
                .any(|(r, c)| repeats.see(c, r) >= self.limits.repeat_limit);
            push(messages, Message::Tool { results }, events);
            if self.agent.cancel.is_cancelled() {
                return self.finish(StopReason::Cancelled, step, usage);
            }
            if repeated {
                return self.finish(StopReason::RepeatedCalls, step, usage);
            }
        }
        self.finish(StopReason::MaxSteps, self.limits.max_steps, usage)
    }

    /// A result for a call that did not run.
    fn unrun(&self, step: u32, call: &ToolCall, why: &str) -> ToolResult {
        let now = self.ms();
        self.result(step, call, why.to_string(), true, (now, now), None)
    }

    /// A call's result: traced (with what a file tool changed) and given to the model, known
    /// secrets redacted; it started and finished at those milliseconds of the run.
    fn result(
        &self,
        step: u32,
        call: &ToolCall,
        content: String,
        is_error: bool,
        (started_ms, finished_ms): (f64, f64),
        diff: Option<String>,
    ) -> ToolResult {
        let content = crate::redact::text(&content).into_owned();
        self.agent.events.emit(Event::ToolResult {
            step,
            id: call.id.clone(),
            name: call.name.clone(),
            content: content.clone(),
            is_error,
            started_ms,
            finished_ms,
            diff,
        });
        ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content,
            is_error,
        }
    }

    /// Execute one step's calls: each passes the gate; consecutive read-only calls run
    /// together, every other call alone, in the model's order. One result per call, in order.
    async fn execute(&self, step: u32, calls: &[ToolCall]) -> Vec<ToolResult> {
        let mut prepared: Vec<Option<Result<Prepared, String>>> = calls
            .iter()
            .map(|c| Some(self.agent.tools.prepare(&c.name, &c.arguments)))
            .collect();
        if let Some(gate) = self.agent.gate {
            // Every call of the step is put to the gate at once, so queued requests wait
            // side by side; terminal prompts still come one at a time, in call order.
            let asks = prepared.iter().zip(calls).map(|(p, c)| async move {
                match p {
                    Some(Ok(p)) => {
                        let subject = p.tool.approval_subject(&p.input, &self.workspace);
                        let call = Call {
                            tool: &c.name,
                            subject: &subject,
                            risk: p.tool.about().risk,
                        };
                        Some(
                            gate.check(&c.id, call, &p.input, self.agent.events, self.agent.cancel)
                                .await,
                        )
                    }
                    _ => None,
                }
            });
            let answers = futures::future::join_all(asks).await;
            for (slot, answer) in prepared.iter_mut().zip(answers) {
                match answer {
                    Some(Answer::Deny(why)) => *slot = Some(Err(why)),
                    Some(Answer::Quit) => {
                        *slot = Some(Err("not run: the person quit the run".to_string()))
                    }
                    _ => {}
                }
            }
        }
        let mut results: Vec<Option<ToolResult>> = calls.iter().map(|_| None).collect();
        let mut i = 0;
        while i < calls.len() {
            // What earlier calls gave is out before the next ones run.
            self.agent.events.flush();
            if self.agent.cancel.is_cancelled() {
                for j in i..calls.len() {
                    results[j] = Some(self.unrun(
                        step,
                        &calls[j],
                        "not run: the run was cancelled before this call started",
                    ));
                }
                break;
            }
            match prepared[i].take() {
                None => i += 1,
                Some(Err(why)) => {
                    results[i] = Some(self.unrun(step, &calls[i], &why));
                    i += 1;
                }
                Some(Ok(p)) if p.tool.about().risk == Risk::Read => {
                    let mut batch = vec![(i, p)];
                    let mut j = i + 1;
                    while j < calls.len() {
                        match &prepared[j] {
                            Some(Ok(q)) if q.tool.about().risk == Risk::Read => {
                                if let Some(Ok(q)) = prepared[j].take() {
                                    batch.push((j, q));
                                }
                                j += 1;
                            }
                            _ => break,
                        }
                    }
                    let runs = batch
                        .into_iter()
                        .map(|(k, p)| async move { (k, self.call(step, &calls[k], p).await) });
                    for (k, r) in futures::future::join_all(runs).await {
                        results[k] = Some(r);
                    }
                    i = j;
                }
                Some(Ok(p)) => {
                    results[i] = Some(self.call(step, &calls[i], p).await);
                    i += 1;
                }
            }
        }
        results
            .into_iter()
            .zip(calls)
            .map(|(r, c)| r.unwrap_or_else(|| self.unrun(step, c, "not run")))
            .collect()
    }

    /// A file name for a call's saved outputs: the time in the run, then the call id.
    fn output_name(&self, call: &ToolCall) -> String {
        format!(
            "{:012}-{}",
            self.started.elapsed().as_micros(),
            safe_name(&call.id)
        )
    }

    /// Run one prepared call to a result: timeout, cancellation, output cap.
    async fn call(&self, step: u32, call: &ToolCall, prepared: Prepared) -> ToolResult {
        if let Some(why) = self
            .agent
            .gate
            .and_then(|g| g.changed_since_approved(&call.id))
        {
            return self.unrun(step, call, &why);
        }
        let started_ms = self.ms();
        let timeout = prepared.timeout.unwrap_or(self.limits.tool_timeout);
        let ctx = ToolContext {
            workspace: self.workspace.clone(),
            root: self.root.clone(),
            cancel: self.agent.cancel.child_token(),
            timeout,
            output_dir: self.output_dir.clone(),
            output_cap: self.limits.output_cap,
            output_name: self.output_name(call),
            protected: self.protected.clone(),
            guarded: self.guarded.clone(),
            env: self.env.clone(),
            rules: Arc::new(
                self.agent
                    .gate
                    .map(|g| g.rules().clone())
                    .unwrap_or_default(),
            ),
            jail: self.agent.jail.clone(),
            diff: Default::default(),
        };
        // Tools that run processes time out on their own and report what they printed;
        // this is the backstop for every other tool.
        let backstop = timeout.saturating_add(Duration::from_secs(2));
        let outcome = tokio::select! {
            r = tokio::time::timeout(backstop, prepared.tool.call(&prepared.input, &ctx)) => {
                r.unwrap_or(Err(ToolError::Timeout(timeout)))
            }
            _ = self.agent.cancel.cancelled() => Err(ToolError::Cancelled),
        };
        let (content, is_error) = match outcome {
            Ok(text) => (text, false),
            Err(ToolError::Cancelled) => (
                "cancelled: the run was cancelled while this call ran; its processes were killed"
                    .to_string(),
                true,
            ),
            Err(e) => (e.to_string(), true),
        };
        let content = if is_error {
            self.no_space_note(content)
        } else {
            content
        };
        let content = crate::redact::text(&content).into_owned();
        let content = self.cap(call, content);
        let ms = (started_ms, self.ms());
        self.result(step, call, content, is_error, ms, ctx.diff.into_inner())
    }

    /// A call that failed on a full disk says so: the tool's own words rarely do. (Only a
    /// failed one: the check costs five system calls, and a call that worked needs no note.)
    fn no_space_note(&self, mut content: String) -> String {
        for dir in [&self.workspace, &self.output_dir] {
            let dir = dir.ancestors().find(|d| d.exists()).unwrap_or(dir);
            if disk_full(dir) {
                content.push_str(&format!(
                    "\n[sup: the disk holding {} is full (no space left); free some space]",
                    dir.display()
                ));
                break;
            }
        }
        content
    }

    /// Keep the head and tail of a long result; the whole of it goes to a file.
    fn cap(&self, call: &ToolCall, content: String) -> String {
        let cap = self.limits.output_cap;
        if content.len() <= cap {
            return content;
        }
        let path = self
            .output_dir
            .join(format!("{}.result.txt", self.output_name(call)));
        let saved = std::fs::create_dir_all(&self.output_dir)
            .and_then(|_| std::fs::write(&path, &content))
            .map(|_| path.display().to_string())
            .unwrap_or_else(|e| format!("nowhere (saving failed: {e})"));
        let mut head_end = cap / 2;
        while !content.is_char_boundary(head_end) {
            head_end -= 1;
        }
        let mut tail_start = content.len() - cap / 2;
        while !content.is_char_boundary(tail_start) {
            tail_start += 1;
        }
        format!(
            "{}\n[… {} of {} bytes cut from the middle; the whole result is in {saved} …]\n{}",
            &content[..head_end],
            tail_start - head_end,
            content.len(),
            &content[tail_start..]
        )
    }
}

/// Counts the same call with the same result in a row.
#[derive(Default)]
struct Repeats {
    last: Option<(String, String, String, bool)>,
    count: u32,
}

impl Repeats {
    fn see(&mut self, call: &ToolCall, result: &ToolResult) -> u32 {
        let input = serde_json::from_str::<Value>(&call.arguments)
            .map(|v| v.to_string())
            .unwrap_or_else(|_| call.arguments.clone());
        let key = (
            call.name.clone(),
            input,
            result.content.clone(),
            result.is_error,
        );
        if self.last.as_ref() == Some(&key) {
            self.count += 1;
        } else {
            self.last = Some(key);
            self.count = 1;
        }
        self.count
    }
}

/// Whether the file system holding `dir` has no space left for an ordinary user.
pub(crate) fn disk_full(dir: &std::path::Path) -> bool {
    nix::sys::statvfs::statvfs(dir).is_ok_and(|s| s.blocks_available() == 0)
}
