//! The cost of compaction: the tokens and wall time of one compaction (old results cut to
//! stubs, and a summary), and the peak memory of a 400-step run whose 8 KB results are
//! compacted again and again in a 32k-token window (it must stay under 20 MB).
//! Run: `cargo bench --bench compaction`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// The model's context window, in tokens.
const WINDOW: u64 = 32_000;
/// A whole 400-step run, compactions included, at most.
const MAX_RUN_S: f64 = 2.0;
/// One compaction's own work, at most (the summary's model call is the mock's, instant).
const MAX_COMPACTION_MS: u64 = 50;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use sup::model::{
    FinishReason, Model, ModelError, ModelRequest, ModelResponse, ToolCall, ToolSpec, Usage,
};
use sup::tools::{About, Registry, Risk, Tool, ToolContext, ToolError};
use sup::trace::{Event, EventSink, Events};
use sup::work::{Agent, Limits, Work};
use tokio_util::sync::CancellationToken;

/// Reads 8 KB of output.
struct Big(About);

#[async_trait]
impl Tool for Big {
    fn about(&self) -> &About {
        &self.0
    }
    async fn call(&self, input: &Value, _: &ToolContext) -> Result<String, ToolError> {
        Ok(format!("{input}: {}\n", "x".repeat(8 * 1024)))
    }
}

/// A model that calls `big` for `steps` steps, then answers; a request without tools (a
/// summary request) gets a 200-word summary. It reports no usage, so the loop estimates.
struct Mock {
    steps: u32,
    calls: Mutex<u32>,
}

#[async_trait]
impl Model for Mock {
    fn name(&self) -> &str {
        "mock:window"
    }
    async fn step(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let answer = |text: String, calls: Vec<ToolCall>| ModelResponse {
            finish: if calls.is_empty() {
                FinishReason::Stop
            } else {
                FinishReason::ToolCalls
            },
            text,
            tool_calls: calls,
            usage: Usage::default(),
            reasoning: None,
        };
        if request.tools.is_empty() {
            return Ok(answer("Progress: read many files. ".repeat(40), vec![]));
        }
        let mut n = self.calls.lock().unwrap();
        *n += 1;
        if *n > self.steps {
            return Ok(answer("done".into(), vec![]));
        }
        let call = ToolCall::new(&format!("c{n}"), "big", &json!({"i": *n}).to_string());
        Ok(answer(String::new(), vec![call]))
    }
}

/// Compactions seen: how, tokens before and after, summary tokens, and the time since the
/// event before it (the compaction's own wall time).
/// How, tokens before and after, tokens spent, wall time.
type Compaction = (String, u64, u64, u64, Duration);

#[derive(Default)]
struct Seen {
    last: Mutex<Option<Instant>>,
    compactions: Mutex<Vec<Compaction>>,
}

impl EventSink for Seen {
    fn emit(&self, event: &Event) {
        let now = Instant::now();
        let before = self.last.lock().unwrap().replace(now);
        if let Event::Compacted {
            how,
            before_tokens,
            after_tokens,
            usage,
            ..
        } = event
        {
            let spent = usage.map_or(0, |u| {
                serde_json::to_value(u).unwrap()["input_tokens"]
                    .as_u64()
                    .unwrap()
                    + serde_json::to_value(u).unwrap()["output_tokens"]
                        .as_u64()
                        .unwrap()
            });
            self.compactions.lock().unwrap().push((
                how.clone(),
                *before_tokens,
                *after_tokens,
                spent,
                before.map_or(Duration::ZERO, |b| now - b),
            ));
        }
    }
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

async fn run(steps: u32, dir: &std::path::Path) -> (Arc<Seen>, Duration) {
    let model = Mock {
        steps,
        calls: Mutex::new(0),
    };
    let mut tools = Registry::new();
    tools
        .add(Arc::new(Big(About {
            spec: ToolSpec {
                name: "big".into(),
                description: "reads a lot".into(),
                input_schema: json!({"type": "object", "properties": {"i": {"type": "integer"}}}),
            },
            risk: Risk::Read,
        })))
        .unwrap();
    let seen = Arc::new(Seen::default());
    let events = Events::new().with(seen.clone());
    let cancel = CancellationToken::new();
    let limits = Limits {
        max_steps: steps + 1,
        context_window: Some(WINDOW),
        ..Limits::default()
    };
    let work = Work {
        agent: Agent {
            model: &model,
            tools: &tools,
            events: &events,
            cancel: &cancel,
            gate: None,
            jail: Arc::new(sup::tools::sandbox::Jail::unconfined()),
        },
        limits: &limits,
        workspace: dir.to_path_buf(),
        root: std::sync::Arc::new(sup::tools::Root::open(dir)),
        output_dir: dir.join("outputs"),
        protected: Arc::new(Vec::new()),
        env: Arc::new(Vec::new()),
        started: Instant::now(),
        guarded: Default::default(),
    };
    let mut messages = sup::model::Conversation::new();
    let started = Instant::now();
    let outcome = work.run(&mut messages, Default::default()).await;
    assert_eq!(outcome.steps, steps + 1, "{:?}", outcome.error);
    (seen, started.elapsed())
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (seen, elapsed) = rt.block_on(run(400, dir.path()));
    let compactions = seen.compactions.lock().unwrap();
    println!(
        "400 steps of 8 KB results in a 32k-token window: {elapsed:.2?}   (target: at most \
         {MAX_RUN_S} s)"
    );
    for how in ["results", "summary"] {
        let of: Vec<_> = compactions.iter().filter(|c| c.0 == how).collect();
        if of.is_empty() {
            continue;
        }
        let n = of.len() as u64;
        let saved: u64 = of.iter().map(|c| c.1.saturating_sub(c.2)).sum::<u64>() / n;
        let left = of.iter().map(|c| c.2).max().unwrap_or(0);
        let spent: u64 = of.iter().map(|c| c.3).sum::<u64>() / n;
        let time: Duration = of.iter().map(|c| c.4).sum::<Duration>() / n as u32;
        println!(
            "{how:>8}: {n} compactions; each saves ~{saved} tokens and spends {spent} tokens \
             (target: at most one request of the window, {WINDOW}); at most {left} tokens \
             left (target: under the window, {WINDOW}); each takes {time:.2?} (target: at \
             most {MAX_COMPACTION_MS} ms of sup's own work)"
        );
    }
    let peak = peak_rss_kib();
    println!("peak memory (VmHWM): {peak} KiB   (target: at most 20 MB)");
    assert!(peak < 20 * 1024, "over 20 MB: {peak} KiB");
}
