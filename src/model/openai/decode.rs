//! The Chat Completions answer: streamed chunks or a whole answer → our response (text,
//! tool calls split over deltas, usage, the finish reason). Pure.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::model::http::{DecodeError, Decoder};
use crate::model::sse::SseEvent;
use crate::model::{FinishReason, ModelError, ModelResponse, OnText, ToolCall, Usage};

fn usage_of(u: &Value) -> Usage {
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let prompt = n("/prompt_tokens");
    // OpenAI reports cached tokens inside the prompt; DeepSeek as hit tokens.
    let cached = n("/prompt_tokens_details/cached_tokens").max(n("/prompt_cache_hit_tokens"));
    Usage {
        input_tokens: prompt.saturating_sub(cached),
        output_tokens: n("/completion_tokens"),
        cache_read_tokens: cached,
        cache_write_tokens: 0,
    }
}

#[derive(Debug, Default)]
struct Partial {
    id: String,
    name: String,
    arguments: String,
}

/// Accumulates one answer, streamed or whole.
#[derive(Debug, Default)]
pub struct ChatDecoder {
    text: String,
    reasoning: String,
    calls: Vec<Partial>,
    by_index: HashMap<u64, usize>,
    finish: Option<String>,
    usage: Usage,
    done: bool,
}

impl ChatDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    fn tool_delta(&mut self, tc: &Value) {
        let id = tc
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let index = tc.get("index").and_then(Value::as_u64);
        let current = index
            .and_then(|i| self.by_index.get(&i).copied())
            .or_else(|| {
                index
                    .is_none()
                    .then(|| self.calls.len().checked_sub(1))
                    .flatten()
            });
        // A new id starts a new call, even at a reused index (Ollama) or with no index.
        let slot = match (id, current) {
            (Some(id), Some(c)) if self.calls[c].id == id => c,
            (None, Some(c)) => c,
            _ => {
                self.calls.push(Partial {
                    id: id.map(str::to_string).unwrap_or_default(),
                    ..Partial::default()
                });
                self.calls.len() - 1
            }
        };
        if let Some(i) = index {
            self.by_index.insert(i, slot);
        }
        let call = &mut self.calls[slot];
        if let Some(name) = tc.pointer("/function/name").and_then(Value::as_str)
            && call.name.is_empty()
        {
            call.name = name.to_string();
        }
        if let Some(args) = tc.pointer("/function/arguments") {
            match args {
                Value::String(s) => call.arguments.push_str(s),
                Value::Null => {}
                // Some servers send the arguments as an object.
                other => call.arguments.push_str(&other.to_string()),
            }
        }
    }

    /// One streamed chunk (a `data:` JSON object).
    pub(crate) fn chunk(&mut self, v: &Value, on_text: &OnText<'_>) -> Result<(), DecodeError> {
        if let Some(err) = v.get("error") {
            let message = err
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| err.to_string(), str::to_string);
            return Err(DecodeError {
                message: format!("the server sent an error in the stream: {message}"),
                retryable: true,
            });
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = usage_of(u);
        }
        let Some(choice) = v.pointer("/choices/0") else {
            return Ok(());
        };
        if let Some(delta) = choice.get("delta") {
            if let Some(t) = delta.get("content").and_then(Value::as_str)
                && !t.is_empty()
            {
                on_text(t);
                self.text.push_str(t);
            }
            if let Some(r) = delta.get("reasoning_content").and_then(Value::as_str) {
                self.reasoning.push_str(r);
            }
            if let Some(tcs) = delta.get("tool_calls").and_then(Value::as_array) {
                for tc in tcs {
                    self.tool_delta(tc);
                }
            }
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_string());
        }
        Ok(())
    }

    /// What arrived of an answer that did not finish, if anything did (its usage included).
    pub(super) fn partial(&self) -> Option<ModelResponse> {
        let any = !self.text.is_empty()
            || !self.reasoning.is_empty()
            || !self.calls.is_empty()
            || self.usage.total() > 0;
        let mut r = self.response().ok().filter(|_| any)?;
        r.finish = FinishReason::Stop;
        Some(r)
    }

    /// The answer.
    pub(crate) fn response(&self) -> Result<ModelResponse, ModelError> {
        let tool_calls: Vec<ToolCall> = self
            .calls
            .iter()
            .enumerate()
            .map(|(i, c)| ToolCall {
                id: if c.id.is_empty() {
                    format!("call_{}", i + 1)
                } else {
                    c.id.clone()
                },
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect();
        let finish = match self.finish.as_deref() {
            Some("length") => FinishReason::Length,
            Some("content_filter") => {
                return Err(ModelError::Refused(
                    "the provider's content filter stopped the answer (finish_reason \
                     content_filter); rephrase the goal"
                        .into(),
                ));
            }
            _ if !tool_calls.is_empty() => FinishReason::ToolCalls,
            _ => FinishReason::Stop,
        };
        Ok(ModelResponse {
            text: self.text.clone(),
            tool_calls,
            finish,
            usage: self.usage,
            reasoning: (!self.reasoning.is_empty()).then(|| self.reasoning.clone()),
        })
    }
}

impl Decoder for ChatDecoder {
    fn reset(&mut self) {
        *self = ChatDecoder::default();
    }

    fn event(&mut self, event: &SseEvent, on_text: &OnText<'_>) -> Result<(), DecodeError> {
        let data = event.data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        if data.is_empty() {
            return Ok(());
        }
        let v: Value = serde_json::from_str(data)
            .map_err(|e| DecodeError::fatal(format!("a stream chunk is not JSON ({e}): {data}")))?;
        self.chunk(&v, on_text)
    }

    fn body(&mut self, body: Value) -> Result<(), DecodeError> {
        let Some(message) = body.pointer("/choices/0/message") else {
            return Err(DecodeError::fatal(format!(
                "the answer has no choices[0].message: {body}"
            )));
        };
        if let Some(t) = message.get("content").and_then(Value::as_str) {
            self.text = t.to_string();
        }
        if let Some(r) = message.get("reasoning_content").and_then(Value::as_str) {
            self.reasoning = r.to_string();
        }
        for (i, tc) in message
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let mut tc = tc.clone();
            if tc.get("index").is_none() {
                tc["index"] = json!(i);
            }
            self.tool_delta(&tc);
        }
        self.finish = body
            .pointer("/choices/0/finish_reason")
            .and_then(Value::as_str)
            .map(str::to_string);
        if let Some(u) = body.get("usage") {
            self.usage = usage_of(u);
        }
        self.done = true;
        Ok(())
    }

    fn had_output(&self) -> bool {
        !self.text.is_empty() || !self.calls.is_empty()
    }

    fn size(&self) -> usize {
        self.calls.iter().fold(
            self.text.len().saturating_add(self.reasoning.len()),
            |n, c| n.saturating_add(c.arguments.len()),
        )
    }

    fn complete(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn decode(stream: &str) -> ModelResponse {
        let mut d = ChatDecoder::new();
        let mut parser = crate::model::sse::SseParser::new();
        let mut events = Vec::new();
        parser.feed(stream.as_bytes(), &mut events).unwrap();
        parser.finish(&mut events);
        for e in &events {
            d.event(e, &|_| {}).unwrap();
        }
        assert!(d.complete());
        d.response().unwrap()
    }

    #[test]
    fn arguments_split_over_many_deltas() {
        let r = decode(concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Let me\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" check.\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"ci\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"ty\\\": \\\"Oslo\\\"}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Rome\\\"}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":20,\"prompt_tokens_details\":{\"cached_tokens\":60}}}\n\n",
            "data: [DONE]\n\n"
        ));
        assert_eq!(r.text, "Let me check.");
        assert_eq!(r.finish, FinishReason::ToolCalls);
        assert_eq!(r.tool_calls.len(), 2);
        assert_eq!(r.tool_calls[0].arguments, "{\"city\": \"Oslo\"}");
        assert_eq!(r.tool_calls[1].id, "call_2");
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 40,
                output_tokens: 20,
                cache_read_tokens: 60,
                cache_write_tokens: 0
            }
        );
    }

    #[test]
    fn ollama_reuses_index_zero_and_some_servers_omit_it() {
        let r = decode(concat!(
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"b\",\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"x\\\":1}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"c\",\"function\":{\"name\":\"h\",\"arguments\":\"{\\\"y\\\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\":2}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n"
        ));
        let got: Vec<(&str, &str, &str)> = r
            .tool_calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("a", "f", "{}"),
                ("b", "g", "{\"x\":1}"),
                ("c", "h", "{\"y\":2}")
            ]
        );
        assert_eq!(
            r.finish,
            FinishReason::ToolCalls,
            "calls win over a `stop` finish"
        );
    }

    #[test]
    fn length_and_content_filter() {
        let r = decode(
            "data: {\"choices\":[{\"delta\":{\"content\":\"half\"},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n",
        );
        assert_eq!(r.finish, FinishReason::Length);
        let mut d = ChatDecoder::new();
        d.body(json!({"choices":[{"message":{"content":""},"finish_reason":"content_filter"}]}))
            .unwrap();
        let e = d.response().unwrap_err().to_string();
        assert!(e.contains("content filter"), "{e}");
    }

    #[test]
    fn a_whole_answer() {
        let mut d = ChatDecoder::new();
        d.body(json!({
            "choices": [{"message": {"role": "assistant", "content": null, "reasoning_content": "hmm",
                "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
                "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "prompt_cache_hit_tokens": 4}
        }))
        .unwrap();
        let r = d.response().unwrap();
        assert_eq!(r.tool_calls[0].arguments, "{\"a\":1}");
        assert_eq!(r.reasoning.as_deref(), Some("hmm"));
        assert_eq!(r.usage.cache_read_tokens, 4);
        assert_eq!(r.usage.input_tokens, 6);
    }
}
