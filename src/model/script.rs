//! The `script:` model: plays a file of scripted assistant turns in order, for tests, offline
//! demos and replays of recorded runs. It never says anything it was not scripted to say, and
//! it fails with a clear error when the script runs out.
//!
//! The file is JSON (an array of turns, or `{"turns": [...]}`) or JSONL (one turn a line).
//! A turn: `text`, `tool_calls` (each `id`, `name`, and `input` as JSON or `arguments` as raw
//! text), optional `usage`, `finish` (`stop`, `tool_calls`, `length`), `delay_ms`, and `error`
//! (the model fails at this turn with that message).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    FinishReason, Message, Model, ModelError, ModelRequest, ModelResponse, ToolCall, Usage,
};

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) text: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) tool_calls: Vec<ScriptedCall>,
    pub(crate) usage: Option<Usage>,
    pub(crate) finish: Option<FinishReason>,
    pub(crate) reasoning: Option<String>,
    pub(crate) delay_ms: Option<u64>,
    pub(crate) error: Option<String>,
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScriptedCall {
    id: Option<String>,
    name: String,
    /// The input as JSON.
    input: Option<Value>,
    /// The input as the raw text a model wrote (may be empty or invalid JSON).
    arguments: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    turns: Vec<Turn>,
}

pub struct ScriptModel {
    name: String,
    path: PathBuf,
    turns: Vec<Turn>,
    next: Mutex<usize>,
}

impl ScriptModel {
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ModelError::Config(format!("cannot read script file {}: {e}", path.display()))
        })?;
        let turns = parse(&text)
            .map_err(|e| ModelError::Config(format!("script file {}: {e}", path.display())))?;
        for (i, turn) in turns.iter().enumerate() {
            for call in &turn.tool_calls {
                if call.input.is_some() && call.arguments.is_some() {
                    return Err(ModelError::Config(format!(
                        "script file {}: turn {}: tool call `{}` has both `input` and \
                         `arguments`; give one",
                        path.display(),
                        i + 1,
                        call.name
                    )));
                }
            }
        }
        Ok(ScriptModel {
            name: format!("script:{}", path.display()),
            path: path.to_path_buf(),
            turns,
            next: Mutex::new(0),
        })
    }

    /// The script going on after its first `played` turns: a continued run's, whose
    /// conversation holds those already.
    pub(crate) fn starting_at(self, played: usize) -> Self {
        ScriptModel {
            next: Mutex::new(played),
            ..self
        }
    }
}

/// Parse a script: JSON array, `{"turns": [...]}`, or JSONL.
pub fn parse(text: &str) -> Result<Vec<Turn>, String> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') {
        return serde_json::from_str(text).map_err(|e| e.to_string());
    }
    if let Ok(file) = serde_json::from_str::<ScriptFile>(text) {
        return Ok(file.turns);
    }
    let mut turns = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let turn = serde_json::from_str(line).map_err(|e| format!("line {}: {e}", n + 1))?;
        turns.push(turn);
    }
    Ok(turns)
}

/// A rough token count (four characters a token) for turns that script no usage.
fn estimate_tokens(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

fn message_chars(m: &Message) -> usize {
    match m {
        Message::System { content } | Message::User { content } => content.len(),
        Message::Assistant {
            text, tool_calls, ..
        } => {
            text.len()
                + tool_calls
                    .iter()
                    .map(|c| c.name.len() + c.arguments.len())
                    .sum::<usize>()
        }
        Message::Tool { results } => results.iter().map(|r| r.content.len()).sum(),
    }
}

#[async_trait]
impl Model for ScriptModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn step(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let index = {
            let mut next = self
                .next
                .lock()
                .map_err(|_| ModelError::Script("script state poisoned".into()))?;
            let index = *next;
            *next += 1;
            index
        };
        let Some(turn) = self.turns.get(index) else {
            return Err(ModelError::Script(format!(
                "{} has {} turns and all were played; the run asked for turn {}. \
                 Add turns to the script or lower --max-steps.",
                self.path.display(),
                self.turns.len(),
                index + 1
            )));
        };
        if let Some(ms) = turn.delay_ms {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if let Some(error) = &turn.error {
            return Err(ModelError::Script(format!(
                "turn {} of {} is a scripted error: {error}",
                index + 1,
                self.path.display()
            )));
        }
        let tool_calls: Vec<ToolCall> = turn
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, c)| ToolCall {
                id: c
                    .id
                    .clone()
                    .unwrap_or_else(|| format!("call_{}_{}", index + 1, i + 1)),
                name: c.name.clone(),
                arguments: match (&c.arguments, &c.input) {
                    (Some(raw), _) => raw.clone(),
                    (None, Some(v)) => v.to_string(),
                    (None, None) => String::new(),
                },
            })
            .collect();
        if !turn.text.is_empty() {
            (request.on_text)(&turn.text);
        }
        let finish = turn.finish.unwrap_or(if tool_calls.is_empty() {
            FinishReason::Stop
        } else {
            FinishReason::ToolCalls
        });
        let usage = turn.usage.unwrap_or_else(|| Usage {
            input_tokens: estimate_tokens(request.messages.iter().map(message_chars).sum()),
            output_tokens: estimate_tokens(
                turn.text.len()
                    + tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments.len())
                        .sum::<usize>(),
            ),
            ..Usage::default()
        });
        Ok(ModelResponse {
            text: turn.text.clone(),
            tool_calls,
            finish,
            usage,
            reasoning: turn.reasoning.clone(),
        })
    }
}

/// The turn a response would be scripted as: what `--record` writes.
pub(crate) fn turn_of(response: &ModelResponse) -> Turn {
    Turn {
        text: response.text.clone(),
        tool_calls: response
            .tool_calls
            .iter()
            .map(|c| ScriptedCall {
                id: Some(c.id.clone()),
                name: c.name.clone(),
                input: None,
                arguments: Some(c.arguments.clone()),
            })
            .collect(),
        usage: Some(response.usage),
        finish: Some(response.finish),
        reasoning: response.reasoning.clone(),
        delay_ms: None,
        error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_three_shapes() {
        let a = parse(r#"[{"text":"hi"}]"#).unwrap();
        let b = parse(r#"{"turns":[{"text":"hi"}]}"#).unwrap();
        let c =
            parse("{\"text\":\"hi\"}\n\n{\"tool_calls\":[{\"name\":\"x\",\"arguments\":\"\"}]}\n")
                .unwrap();
        assert_eq!(a[0].text, "hi");
        assert_eq!(b[0].text, "hi");
        assert_eq!(c.len(), 2);
        assert_eq!(c[1].tool_calls[0].arguments.as_deref(), Some(""));
    }

    #[test]
    fn unknown_keys_are_errors_with_a_line() {
        let e = parse("{\"text\":\"hi\"}\n{\"txt\":\"oops\"}").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        assert!(e.contains("txt"), "{e}");
    }
}
