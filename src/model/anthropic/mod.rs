//! The Messages protocol (`anthropic:`): our messages → request JSON (system at the top,
//! `tool_use` blocks, `tool_result` blocks first in the next user message, prompt-cache
//! breakpoints), and streamed events or a whole answer → our response. `pause_turn` sends the
//! turn back and continues. Pure conversion apart from the transport.

mod decode;
mod request;

pub use decode::MessagesDecoder;
pub(crate) use request::{Turns, cached_body};

use async_trait::async_trait;
use serde_json::Value;

use super::http::Transport;
use super::{KeepPartial, Model, ModelError, ModelRequest, ModelResponse, WireCache};

/// `pause_turn` continuations at most in one step.
const MAX_CONTINUATIONS: usize = 8;

/// A Messages model.
pub(crate) struct MessagesModel {
    pub(crate) name: String,
    pub(crate) model: String,
    pub(crate) max_tokens: u32,
    pub(crate) transport: Transport,
    /// The request body so far, extended by what each step adds.
    pub(crate) wire: WireCache<Turns>,
}

#[async_trait]
impl Model for MessagesModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn step(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        // A JSON answer is asked for by prefilling its first character.
        let prefill = request.json_schema.map(|_| "{");
        let mut continuation: Vec<Value> = prefill
            .map(|p| serde_json::json!({"type": "text", "text": p}))
            .into_iter()
            .collect();
        let mut merged: Option<ModelResponse> = None;
        for _ in 0..=MAX_CONTINUATIONS {
            let max_tokens = request
                .max_output
                .map_or(self.max_tokens, |room| self.max_tokens.min(room.max(1)));
            let body = cached_body(
                &self.wire,
                (&self.model, max_tokens),
                request.messages,
                request.tools,
                self.transport.http.stream,
                &continuation,
            )?;
            let mut kept =
                KeepPartial::new(MessagesDecoder::new(), request.partial, |d| d.partial());
            self.transport
                .send(&self.wire, body, &mut kept.decoder, request.on_text)
                .await?;
            let decoder = kept.done();
            let part = decoder.response()?;
            let paused = decoder.stop_reason() == Some("pause_turn");
            continuation.extend(decoder.content());
            merged = Some(match merged {
                None => part,
                Some(mut m) => {
                    m.text.push_str(&part.text);
                    m.tool_calls.extend(part.tool_calls);
                    m.usage += part.usage;
                    m.finish = part.finish;
                    m
                }
            });
            if !paused {
                break;
            }
        }
        let mut merged = merged.ok_or_else(|| ModelError::Provider {
            provider: self.transport.endpoint.provider.clone(),
            message: "no answer".into(),
        })?;
        if let Some(p) = prefill {
            merged.text.insert_str(0, p);
        }
        Ok(merged)
    }
}
