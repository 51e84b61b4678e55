//! `--record FILE`: a model wrapper that writes every turn of a run, from any provider, as a
//! `script:` file, rewritten whole after each turn so it is valid even if the run dies.
//! Replaying it with `--model script:FILE` takes the same tool calls to the same outcome.

use std::path::PathBuf;
use std::sync::Mutex;

use async_trait::async_trait;

use super::script::{Turn, turn_of};
use super::{Model, ModelError, ModelRequest, ModelResponse};

pub(crate) struct Recorder {
    inner: Box<dyn Model>,
    path: PathBuf,
    turns: Mutex<Vec<Turn>>,
}

impl Recorder {
    pub(crate) fn new(inner: Box<dyn Model>, path: PathBuf) -> Result<Self, ModelError> {
        let recorder = Recorder {
            inner,
            path,
            turns: Mutex::new(Vec::new()),
        };
        recorder.save(&[])?;
        Ok(recorder)
    }

    fn save(&self, turns: &[Turn]) -> Result<(), ModelError> {
        let turns = crate::redact::serde(&turns.to_vec()).unwrap_or_else(|| turns.to_vec());
        let text = serde_json::to_string_pretty(&turns)
            .map_err(|e| ModelError::Config(format!("cannot encode the recording: {e}")))?;
        std::fs::write(&self.path, text + "\n").map_err(|e| {
            ModelError::Config(format!(
                "cannot write the recording {}: {e}",
                self.path.display()
            ))
        })
    }
}

#[async_trait]
impl Model for Recorder {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn step(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let result = self.inner.step(request).await;
        let turn = match &result {
            Ok(response) => turn_of(response),
            // A failed turn replays as the same failure.
            Err(e) => Turn {
                error: Some(e.to_string()),
                ..Turn::default()
            },
        };
        let snapshot = {
            let mut turns = self
                .turns
                .lock()
                .map_err(|_| ModelError::Config("recording state poisoned".into()))?;
            turns.push(turn);
            turns.clone()
        };
        if let Err(e) = self.save(&snapshot) {
            tracing::warn!("{e}");
        }
        result
    }
}
