//! The run history on disk under `SUP_HOME`: one folder per run (`runs/RUN_ID/`) holding the
//! transcript (`transcript.jsonl`: every message and event, appended a step's worth at a
//! time before every wait, so even a killed run leaves every step it finished), tool outputs
//! that were cut, and check outputs. The states it stores are the enums of `vocab`.

/// The lineage columns' DDL (`lineage`), the same in SQLite and PostgreSQL: a migration of
/// each store.
macro_rules! lineage_ddl {
    () => {
        "ALTER TABLE runs ADD COLUMN continued_from TEXT;
    ALTER TABLE runs ADD COLUMN parent TEXT;
    ALTER TABLE runs ADD COLUMN attempt INTEGER;
    ALTER TABLE runs ADD COLUMN branch TEXT;
    ALTER TABLE runs ADD COLUMN base_commit TEXT;
    ALTER TABLE runs ADD COLUMN commit_sha TEXT;
    ALTER TABLE runs ADD COLUMN diff_stat TEXT;
    ALTER TABLE runs ADD COLUMN repo TEXT;"
    };
}

pub mod db;
pub(crate) mod history;
pub(crate) mod lineage;
pub mod pg;
pub mod query;
mod vocab;

pub use vocab::{ApprovalKind, ApprovalStatus, OccurrenceStatus, RunStatus, TriggerKind};

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::trace::{Event, EventSink};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the run folder {path}: {source}; check SUP_HOME")]
    Create {
        path: String,
        source: std::io::Error,
    },
}

/// How long a webhook delivery id is remembered: one delivered again within it runs nothing
/// (GitHub redelivers for three days). Older ids are forgotten, so that the table is bounded.
pub(crate) const REPLAY_WINDOW: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// The most delivery ids a goal keeps: a flood of signed deliveries (each with a new id)
/// pushes out the oldest instead of filling the store.
pub(crate) const MAX_DELIVERIES: i64 = 10_000;

/// `SUP_HOME`, or `~/.local/state/sup`.
pub(crate) fn home() -> PathBuf {
    if let Some(h) = std::env::var_os("SUP_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let base = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    base.join(".local/state/sup")
}

/// A new run id: sortable by time, unique across processes.
pub(crate) fn new_run_id() -> String {
    let now = chrono::Utc::now().format("%Y%m%d-%H%M%S");
    let rand = uuid::Uuid::new_v4().simple().to_string();
    format!("{now}-{}", &rand[..8])
}

/// The folder of one run.
#[derive(Clone, Debug)]
pub struct RunDir {
    pub(crate) id: String,
    pub(crate) dir: PathBuf,
}

impl RunDir {
    pub fn create(home: &Path) -> Result<Self, StoreError> {
        let run = RunDir::planned(home);
        run.make()?;
        Ok(run)
    }

    /// A new run's id and folder, not made yet.
    pub(crate) fn planned(home: &Path) -> Self {
        let id = new_run_id();
        let dir = home.join("runs").join(&id);
        RunDir { id, dir }
    }

    /// Make the folder.
    pub(crate) fn make(&self) -> Result<(), StoreError> {
        // `outputs/` is made by whoever first needs it: most runs never cut an output.
        std::fs::create_dir_all(&self.dir).map_err(|source| StoreError::Create {
            path: self.dir.display().to_string(),
            source,
        })
    }

    pub(crate) fn transcript(&self) -> PathBuf {
        self.dir.join("transcript.jsonl")
    }

    pub(crate) fn outputs(&self) -> PathBuf {
        self.dir.join("outputs")
    }

    /// Remove what the run kept besides its transcript and outcome — cut tool outputs
    /// (`outputs/`), check outputs and answers (`try-N/`), the agent's `tmp/` — to make room
    /// for the outcome on a full disk. Returns the bytes freed.
    pub(crate) fn drop_kept_outputs(&self) -> u64 {
        fn size(path: &Path) -> u64 {
            match std::fs::symlink_metadata(path) {
                Ok(m) if m.is_dir() => std::fs::read_dir(path)
                    .map(|d| d.filter_map(Result::ok).map(|e| size(&e.path())).sum())
                    .unwrap_or(0),
                Ok(m) => m.len(),
                Err(_) => 0,
            }
        }
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut freed = 0;
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "outputs" || name == "tmp" || name.starts_with("try-") {
                let path = entry.path();
                let n = size(&path);
                if std::fs::remove_dir_all(&path).is_ok() {
                    freed += n;
                }
            }
        }
        freed
    }
}

/// The transcript writer: a sink that appends each event as one JSON line with its time.
/// Lines are written whole or not at all. Streamed text is not written piece by piece; when a
/// turn fails after text arrived, that partial answer is written as the step's model text.
///
/// The lines of a step's events (`Event::batched`) are held: they go out in one write with the next
/// event that is not a step's, or when the stream is flushed, which the work loop does before
/// every wait (a model request, the step's tools). So a step costs two writes, a killed run
/// keeps every step it finished, and a watcher of the file waits on nothing held.
pub struct Transcript {
    file: Mutex<Held>,
    partial: Mutex<Partial>,
}

/// The file, and the lines not written yet.
struct Held {
    file: File,
    lines: String,
}

impl Held {
    /// Write the held lines in one write. A batch that could not be written whole (a full
    /// disk) is cut back off: the file's length less what of it went out (asked only then,
    /// so a batch costs one system call). The transcript must not take the run down; the
    /// failure is logged.
    fn write_out(&mut self) {
        if self.lines.is_empty() {
            return;
        }
        let result = write_whole(&mut self.file, self.lines.as_bytes());
        self.lines.clear();
        if let Err((e, written)) = result {
            tracing::warn!("transcript write failed: {e}");
            if written > 0
                && let Ok(meta) = self.file.metadata()
            {
                let _ = self.file.set_len(meta.len().saturating_sub(written as u64));
            }
        }
    }
}

/// The text streamed in the current step, bounded.
#[derive(Default)]
struct Partial {
    step: u32,
    text: String,
}

/// Partial text kept at most (a turn longer than this fails anyway).
const MAX_PARTIAL: usize = crate::model::http::MAX_TURN_BYTES;

impl Transcript {
    pub fn create(path: &Path) -> Result<Self, StoreError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| StoreError::Create {
                path: path.display().to_string(),
                source,
            })?;
        Ok(Transcript {
            file: Mutex::new(Held {
                file,
                lines: String::new(),
            }),
            partial: Mutex::new(Partial::default()),
        })
    }

    /// Track streamed text; before a failed step's end, write what arrived of it.
    fn partial(&self, event: &Event) {
        let Ok(mut p) = self.partial.lock() else {
            return;
        };
        match event {
            Event::StepStarted { step } => {
                p.step = *step;
                p.text.clear();
            }
            Event::TextDelta { text } if p.text.len().saturating_add(text.len()) <= MAX_PARTIAL => {
                p.text.push_str(text);
            }
            // A partial answer the work loop kept says it itself.
            Event::ModelText { .. } | Event::StepFinished { .. } | Event::Partial { .. } => {
                p.text.clear()
            }
            Event::WorkFinished {
                error: Some(_),
                steps,
                ..
            } if !p.text.is_empty() => {
                let text = std::mem::take(&mut p.text);
                drop(p);
                self.write(&Event::ModelText {
                    step: *steps,
                    text: crate::redact::text(&text).into_owned(),
                });
                self.write(&Event::Notice {
                    text: format!(
                        "the text above is the partial answer of step {steps}, kept from \
                         before the failure"
                    ),
                });
            }
            _ => {}
        }
    }

    fn write(&self, event: &Event) {
        // The event's object, its time first: `{"at":"…",` and the rest of the object
        // (events are tagged, so always an object), serialised once straight to text.
        let Ok(json) = serde_json::to_string(event) else {
            return;
        };
        let Some(rest) = json.strip_prefix('{') else {
            return;
        };
        let at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        if let Ok(mut held) = self.file.lock() {
            let lines = &mut held.lines;
            lines.reserve(json.len() + at.len() + 10);
            lines.push_str("{\"at\":\"");
            lines.push_str(&at);
            lines.push('"');
            if rest != "}" {
                lines.push(',');
            }
            lines.push_str(rest);
            lines.push('\n');
            if !event.batched() {
                held.write_out();
            }
        }
    }
}

impl Drop for Transcript {
    /// Lines still held go out when the run lets go of its transcript.
    fn drop(&mut self) {
        if let Ok(held) = self.file.get_mut() {
            held.write_out();
        }
    }
}

/// `write_all` that says, when it fails, how much of `bytes` went out.
fn write_whole(file: &mut File, bytes: &[u8]) -> Result<(), (std::io::Error, usize)> {
    let mut written = 0;
    while written < bytes.len() {
        match file.write(&bytes[written..]) {
            Ok(0) => return Err((std::io::ErrorKind::WriteZero.into(), written)),
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err((e, written)),
        }
    }
    Ok(())
}

impl EventSink for Transcript {
    fn emit(&self, event: &Event) {
        self.partial(event);
        if matches!(event, Event::TextDelta { .. }) {
            return;
        }
        self.write(event);
    }

    fn flush(&self) {
        if let Ok(mut held) = self.file.lock() {
            held.write_out();
        }
    }
}
