//! The Chat Completions protocol (`openai:`, and the `deepseek:` and `ollama:` presets of any
//! compatible server): our messages → request JSON, and streamed chunks or a whole answer →
//! our response. Pure conversion apart from the transport, so each is tested from strings.

mod decode;
mod request;

pub use decode::ChatDecoder;
pub use request::Dialect;
pub(crate) use request::{Written, cached_body, with_response_format};

use async_trait::async_trait;

use super::http::Transport;
use super::{KeepPartial, Model, ModelError, ModelRequest, ModelResponse, WireCache};

/// A Chat Completions model.
pub struct ChatModel {
    pub name: String,
    pub model: String,
    pub transport: Transport,
    pub dialect: Dialect,
    /// The request body so far, extended by what each step adds.
    pub wire: WireCache<Written>,
}

#[async_trait]
impl Model for ChatModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn step(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let mut dialect = self.dialect.clone();
        if let Some(room) = request.max_output {
            dialect.max_tokens = Some(dialect.max_tokens.map_or(room, |n| n.min(room)).max(1));
        }
        let (wire, body) = cached_body(
            &self.wire,
            &self.model,
            request.messages,
            request.tools,
            self.transport.http.stream,
            &dialect,
        )?;
        let body = match request.json_schema {
            Some(schema) => with_response_format(body, schema)?,
            None => body,
        };
        let mut kept = KeepPartial::new(ChatDecoder::new(), request.partial, ChatDecoder::partial);
        self.transport
            .send(&self.wire, (wire, body), &mut kept.decoder, request.on_text)
            .await?;
        kept.done().response()
    }
}
