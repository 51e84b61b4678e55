//! Harness overhead of the work loop: the scripted model and a no-op tool, at 10, 100 and
//! 1,000 steps, with and without the transcript writer; time per step and peak memory. And a
//! judge check's own part: the snapshot at the start, then the workspace's changes and the
//! bounded evidence (bytes, ms) for a workspace of 2,000 files.
//! Run: `cargo bench --bench work_loop`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// The harness's part of a step, at most (issue 30's overhead per step).
const MAX_STEP_US: f64 = 500.0;
/// A judge check's own part, each of its two halves, at most: small beside the judge's
/// model call.
const MAX_JUDGE_MS: f64 = 100.0;
/// What the evidence's headings and notes add to the cap's parts, at most.
const HEADINGS: usize = 1024;

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use serde_json::{Value, json};
use sup::model::ToolSpec;
use sup::model::script::ScriptModel;
use sup::store::Transcript;
use sup::tools::{About, Registry, Risk, Tool, ToolContext, ToolError};
use sup::trace::Events;
use sup::work::{Agent, Limits, Work};
use tokio_util::sync::CancellationToken;

struct Noop(About);

#[async_trait]
impl Tool for Noop {
    fn about(&self) -> &About {
        &self.0
    }
    async fn call(&self, _: &Value, _: &ToolContext) -> Result<String, ToolError> {
        Ok("ok".into())
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

async fn measure(steps: u32, transcript: bool, dir: &std::path::Path) -> f64 {
    let turns: Vec<Value> = (0..steps)
        .map(|i| {
            json!({"usage": {"input_tokens": 1, "output_tokens": 1},
                   "tool_calls": [{"name": "noop", "input": {"i": i}}]})
        })
        .collect();
    let script = dir.join(format!("script-{steps}-{transcript}.json"));
    std::fs::write(&script, serde_json::to_string(&turns).unwrap()).unwrap();
    let model = ScriptModel::load(&script).unwrap();
    let mut tools = Registry::new();
    tools
        .add(Arc::new(Noop(About {
            spec: ToolSpec {
                name: "noop".into(),
                description: "does nothing".into(),
                input_schema: json!({"type": "object", "properties": {"i": {"type": "integer"}}}),
            },
            risk: Risk::Read,
        })))
        .unwrap();
    let mut events = Events::new();
    if transcript {
        let path = dir.join(format!("t-{steps}.jsonl"));
        events = events.with(Arc::new(Transcript::create(&path).unwrap()));
    }
    let cancel = CancellationToken::new();
    let limits = Limits {
        max_steps: steps,
        // Every input differs, so the repeat guard never fires.
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
        guarded: Default::default(),
        env: Arc::new(Vec::new()),
        started: Instant::now(),
    };
    let mut messages = sup::model::Conversation::new();
    let started = Instant::now();
    let outcome = work.run(&mut messages, Default::default()).await;
    let elapsed = started.elapsed();
    assert_eq!(outcome.steps, steps);
    elapsed.as_secs_f64() * 1e6 / f64::from(steps)
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "work loop overhead per step (scripted model, no-op tool; target: at most \
         {MAX_STEP_US} µs)"
    );
    println!(
        "{:>7} {:>16} {:>22}",
        "steps", "µs/step bare", "µs/step + transcript"
    );
    for steps in [10u32, 100, 1000] {
        // Warm up once, then take the best of three.
        let best = |transcript: bool| {
            (0..4)
                .map(|_| rt.block_on(measure(steps, transcript, dir.path())))
                .skip(1)
                .fold(f64::MAX, f64::min)
        };
        let bare = best(false);
        let with = best(true);
        println!("{steps:>7} {bare:>16.1} {with:>22.1}");
    }
    judge_evidence(dir.path());
    println!(
        "peak memory (VmHWM): {} KiB   (target: at most 20 MB)",
        peak_rss_kib()
    );
}

/// A judge's evidence for 2,000 files of 2 KiB, 50 of them changed and 10 created.
fn judge_evidence(dir: &std::path::Path) {
    use sup::verify::judge::{EVIDENCE_CAP, Snapshot, evidence};
    let ws = dir.join("judge-ws");
    let line = "a line of text in a file of the workspace\n".repeat(48);
    for i in 0..2000 {
        let sub = ws.join(format!("d{}", i % 20));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join(format!("f{i}.txt")), &line).unwrap();
    }
    let started = Instant::now();
    let before = Snapshot::take(&ws);
    let snapshot_ms = started.elapsed().as_secs_f64() * 1000.0;
    for i in 0..50 {
        let path = ws.join(format!("d{}", i % 20)).join(format!("f{i}.txt"));
        std::fs::write(path, format!("{line}one more line {i}\n")).unwrap();
    }
    for i in 0..10 {
        std::fs::write(ws.join(format!("new{i}.txt")), &line).unwrap();
    }
    let started = Instant::now();
    let changes = before.changes(&ws);
    let (text, note) = evidence("done", &changes, &[], EVIDENCE_CAP);
    let evidence_ms = started.elapsed().as_secs_f64() * 1000.0;
    println!("judge evidence (2,000 files, 50 changed, 10 created):");
    println!(
        "  snapshot at the start      {snapshot_ms:>8.1} ms   (target: at most {MAX_JUDGE_MS} ms)"
    );
    println!(
        "  changes + evidence         {evidence_ms:>8.1} ms   (target: at most {MAX_JUDGE_MS} ms)"
    );
    println!(
        "  evidence                   {:>8} bytes of {} bytes of changes{}   (target: at most \
         {} bytes: the cap, {EVIDENCE_CAP}, and the headings)",
        text.len(),
        changes.len(),
        if note.is_some() { " (cut)" } else { "" },
        EVIDENCE_CAP + HEADINGS
    );
}
