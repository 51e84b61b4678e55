//! The Messages answer: streamed events or a whole answer → our response (text, tool
//! calls, usage, the stop reason). Pure.

use serde_json::{Value, json};

use crate::model::http::{DecodeError, Decoder};
use crate::model::sse::SseEvent;
use crate::model::{FinishReason, ModelError, ModelResponse, OnText, ToolCall, Usage};

#[derive(Debug, Clone)]
enum Block {
    Text(String),
    Tool {
        id: String,
        name: String,
        json: String,
    },
    Other(Value),
}

/// Accumulates one answer, streamed or whole.
#[derive(Debug, Default)]
pub struct MessagesDecoder {
    blocks: Vec<(u64, Block)>,
    stop_reason: Option<String>,
    usage: Usage,
    done: bool,
    output: bool,
}

fn usage_into(usage: &mut Usage, u: &Value) {
    let set = |field: &mut u64, key: &str| {
        if let Some(n) = u.get(key).and_then(Value::as_u64) {
            *field = n;
        }
    };
    set(&mut usage.input_tokens, "input_tokens");
    set(&mut usage.output_tokens, "output_tokens");
    set(&mut usage.cache_read_tokens, "cache_read_input_tokens");
    set(&mut usage.cache_write_tokens, "cache_creation_input_tokens");
}

impl MessagesDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    fn block(&mut self, index: u64) -> Option<&mut Block> {
        self.blocks
            .iter_mut()
            .find(|(i, _)| *i == index)
            .map(|(_, b)| b)
    }

    fn start(&mut self, index: u64, block: &Value) {
        let b = match block["type"].as_str() {
            Some("text") => Block::Text(block["text"].as_str().unwrap_or("").to_string()),
            Some("tool_use") => {
                self.output = true;
                let input = block
                    .get("input")
                    .filter(|i| i.as_object().is_some_and(|o| !o.is_empty()));
                Block::Tool {
                    id: block["id"].as_str().unwrap_or("").to_string(),
                    name: block["name"].as_str().unwrap_or("").to_string(),
                    json: input.map(Value::to_string).unwrap_or_default(),
                }
            }
            _ => Block::Other(block.clone()),
        };
        self.blocks.push((index, b));
    }

    /// The content blocks as they would be sent back (for `pause_turn`).
    pub(super) fn content(&self) -> Vec<Value> {
        self.blocks
            .iter()
            .map(|(_, b)| match b {
                Block::Text(t) => json!({"type": "text", "text": t}),
                Block::Tool { id, name, json } => json!({
                    "type": "tool_use", "id": id, "name": name,
                    "input": serde_json::from_str::<Value>(json).unwrap_or_else(|_| json!({})),
                }),
                Block::Other(v) => v.clone(),
            })
            .collect()
    }

    pub(super) fn stop_reason(&self) -> Option<&str> {
        self.stop_reason.as_deref()
    }

    /// The answer of this exchange.
    pub(crate) fn response(&self) -> Result<ModelResponse, ModelError> {
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        for (_, b) in &self.blocks {
            match b {
                Block::Text(t) => text.push_str(t),
                Block::Tool { id, name, json } => tool_calls.push(ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: json.clone(),
                }),
                Block::Other(_) => {}
            }
        }
        let finish = match self.stop_reason() {
            Some("max_tokens") => FinishReason::Length,
            Some("refusal") => {
                return Err(ModelError::Refused(
                    "the model declined to go on (stop_reason refusal); rephrase the goal".into(),
                ));
            }
            Some("model_context_window_exceeded") => {
                return Err(ModelError::Refused(
                    "the conversation filled the model's context window \
                     (model_context_window_exceeded): lower --max-steps or --output-cap"
                        .into(),
                ));
            }
            _ if !tool_calls.is_empty() => FinishReason::ToolCalls,
            _ => FinishReason::Stop,
        };
        Ok(ModelResponse {
            text,
            tool_calls,
            finish,
            usage: self.usage,
            reasoning: None,
        })
    }

    /// What arrived of an answer that did not finish, if anything did (its usage included).
    pub(super) fn partial(&self) -> Option<ModelResponse> {
        let mut r = ModelResponse {
            text: String::new(),
            tool_calls: Vec::new(),
            finish: FinishReason::Stop,
            usage: self.usage,
            reasoning: None,
        };
        for (_, b) in &self.blocks {
            match b {
                Block::Text(t) => r.text.push_str(t),
                Block::Tool { id, name, json } => r.tool_calls.push(ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: json.clone(),
                }),
                Block::Other(_) => {}
            }
        }
        let any = !r.text.is_empty() || !r.tool_calls.is_empty() || r.usage.total() > 0;
        any.then_some(r)
    }

    /// One streamed event, by its JSON `type`.
    pub(crate) fn handle(&mut self, v: &Value, on_text: &OnText<'_>) -> Result<(), DecodeError> {
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        match v["type"].as_str().unwrap_or("") {
            "message_start" => {
                if let Some(u) = v.pointer("/message/usage") {
                    usage_into(&mut self.usage, u);
                }
            }
            "content_block_start" => self.start(index, &v["content_block"]),
            "content_block_delta" => {
                let delta = &v["delta"];
                match (delta["type"].as_str(), self.block(index)) {
                    (Some("text_delta"), Some(Block::Text(t))) => {
                        let piece = delta["text"].as_str().unwrap_or("");
                        t.push_str(piece);
                        if !piece.is_empty() {
                            self.output = true;
                            on_text(piece);
                        }
                    }
                    (Some("input_json_delta"), Some(Block::Tool { json, .. })) => {
                        json.push_str(delta["partial_json"].as_str().unwrap_or(""));
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                // Parse the whole input once it is complete; invalid JSON stays raw so the
                // work loop can tell the model what was wrong.
                if let Some(Block::Tool { json, .. }) = self.block(index)
                    && let Ok(parsed) = serde_json::from_str::<Value>(json)
                {
                    *json = parsed.to_string();
                }
            }
            "message_delta" => {
                if let Some(r) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(r.to_string());
                }
                if let Some(u) = v.get("usage") {
                    usage_into(&mut self.usage, u);
                }
            }
            "message_stop" => self.done = true,
            "error" => {
                let kind = v
                    .pointer("/error/type")
                    .and_then(Value::as_str)
                    .unwrap_or("error");
                let message = v
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                return Err(DecodeError {
                    message: format!("the stream carried an error event: {kind}: {message}"),
                    retryable: matches!(
                        kind,
                        "overloaded_error" | "api_error" | "rate_limit_error"
                    ),
                });
            }
            _ => {}
        }
        Ok(())
    }
}

impl Decoder for MessagesDecoder {
    fn reset(&mut self) {
        *self = MessagesDecoder::default();
    }

    fn event(&mut self, event: &SseEvent, on_text: &OnText<'_>) -> Result<(), DecodeError> {
        if event.data.trim().is_empty() {
            return Ok(());
        }
        let v: Value = serde_json::from_str(&event.data).map_err(|e| {
            DecodeError::fatal(format!("a stream event is not JSON ({e}): {}", event.data))
        })?;
        self.handle(&v, on_text)
    }

    fn body(&mut self, body: Value) -> Result<(), DecodeError> {
        for (i, block) in body["content"].as_array().into_iter().flatten().enumerate() {
            self.start(i as u64, block);
        }
        self.output = !self.blocks.is_empty();
        self.stop_reason = body["stop_reason"].as_str().map(str::to_string);
        usage_into(&mut self.usage, &body["usage"]);
        self.done = true;
        Ok(())
    }

    fn had_output(&self) -> bool {
        self.output
    }

    fn size(&self) -> usize {
        self.blocks.iter().fold(0usize, |n, (_, b)| {
            n.saturating_add(match b {
                Block::Text(t) => t.len(),
                Block::Tool { json, .. } => json.len(),
                Block::Other(_) => 0,
            })
        })
    }

    fn complete(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(events: &[Value]) -> MessagesDecoder {
        let mut d = MessagesDecoder::new();
        for e in events {
            d.handle(e, &|_| {}).unwrap();
        }
        d
    }

    #[test]
    fn a_streamed_tool_use_parsed_at_block_stop() {
        let d = decode(&[
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 50, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 10, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "ping"}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Checking"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"city\": "}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"Paris\"}"}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "something_new", "index": 9}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 42}}),
            json!({"type": "message_stop"}),
        ]);
        assert!(d.complete());
        let r = d.response().unwrap();
        assert_eq!(r.text, "Checking");
        assert_eq!(r.finish, FinishReason::ToolCalls);
        assert_eq!(r.tool_calls[0].arguments, "{\"city\":\"Paris\"}");
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 50,
                output_tokens: 42,
                cache_read_tokens: 900,
                cache_write_tokens: 10
            }
        );
    }

    #[test]
    fn empty_and_invalid_input_json() {
        let d = decode(&[
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "a", "name": "f", "input": {}}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "b", "name": "f", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"x\": tru"}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}}),
            json!({"type": "message_stop"}),
        ]);
        let r = d.response().unwrap();
        assert_eq!(r.tool_calls[0].arguments, "");
        assert_eq!(r.tool_calls[1].arguments, "{\"x\": tru");
    }

    #[test]
    fn stop_reasons() {
        let stop = |reason: &str| {
            let mut d = MessagesDecoder::new();
            d.body(json!({"content": [{"type": "text", "text": "x"}], "stop_reason": reason, "usage": {}})).unwrap();
            d.response()
        };
        assert_eq!(stop("end_turn").unwrap().finish, FinishReason::Stop);
        assert_eq!(stop("max_tokens").unwrap().finish, FinishReason::Length);
        assert!(stop("refusal").unwrap_err().to_string().contains("refusal"));
        assert!(
            stop("model_context_window_exceeded")
                .unwrap_err()
                .to_string()
                .contains("context window")
        );
    }

    #[test]
    fn an_error_event_is_retryable_only_when_overloaded() {
        let mut d = MessagesDecoder::new();
        let e = d
            .handle(&json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}), &|_| {})
            .unwrap_err();
        assert!(e.retryable && e.message.contains("overloaded_error"));
        let e = d
            .handle(&json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}), &|_| {})
            .unwrap_err();
        assert!(!e.retryable);
    }
}
