//! The Chat Completions protocol (`openai:`, and the `deepseek:` and `ollama:` presets of any
//! compatible server): our messages → request JSON, and streamed chunks or a whole answer →
//! our response. Pure conversion apart from the transport, so each is tested from strings.

use std::borrow::Cow;
use std::collections::HashMap;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::{Value, json};

use super::http::{DecodeError, Decoder, Endpoint, HttpOptions, exchange};
use super::sse::SseEvent;
use super::{
    FinishReason, Message, Model, ModelError, ModelRequest, ModelResponse, ToolCall, ToolSpec,
    Usage, WireCache,
};

/// Settings of the request body that vary by server.
#[derive(Clone, Debug, Default)]
pub struct Dialect {
    /// Send `reasoning_content` back on assistant turns (DeepSeek).
    pub send_reasoning: bool,
    /// The name of the output limit field: `max_completion_tokens` (OpenAI) or `max_tokens`.
    pub max_tokens_field: &'static str,
    pub max_tokens: Option<u32>,
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
}

#[derive(Serialize)]
struct WireCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireToolFunction<'a>,
}

#[derive(Serialize)]
struct WireToolFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

impl<'a> WireMessage<'a> {
    fn new(role: &'static str, content: Option<Cow<'a, str>>) -> Self {
        WireMessage {
            role,
            content,
            tool_call_id: None,
            tool_calls: Vec::new(),
            reasoning_content: None,
        }
    }
}

/// One message of ours as wire JSON: one object, or one per tool result, comma-separated.
pub fn message_json(m: &Message, dialect: &Dialect) -> Result<Vec<u8>, ModelError> {
    let mut out = Vec::new();
    match m {
        Message::System { content } => {
            serde_json::to_writer(&mut out, &WireMessage::new("system", Some(content.into())))?
        }
        Message::User { content } => {
            serde_json::to_writer(&mut out, &WireMessage::new("user", Some(content.into())))?
        }
        Message::Assistant {
            text,
            tool_calls,
            reasoning,
        } => {
            let mut msg = WireMessage::new(
                "assistant",
                (!text.is_empty()).then_some(Cow::Borrowed(text.as_str())),
            );
            msg.tool_calls = tool_calls
                .iter()
                .map(|c| WireCall {
                    id: &c.id,
                    kind: "function",
                    function: WireFunction {
                        name: &c.name,
                        arguments: if c.arguments.trim().is_empty() {
                            "{}"
                        } else {
                            &c.arguments
                        },
                    },
                })
                .collect();
            msg.reasoning_content = reasoning.as_deref().filter(|_| dialect.send_reasoning);
            serde_json::to_writer(&mut out, &msg)?;
        }
        Message::Tool { results } => {
            for (i, r) in results.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let content = if r.is_error {
                    Cow::Owned(format!("Error: {}", r.content))
                } else {
                    Cow::Borrowed(r.content.as_str())
                };
                let mut msg = WireMessage::new("tool", Some(content));
                msg.tool_call_id = Some(&r.call_id);
                serde_json::to_writer(&mut out, &msg)?;
            }
        }
    }
    Ok(out)
}

/// The request body, written from each message's wire JSON (`pieces`, in order).
pub fn write_body<'p>(
    model: &str,
    pieces: impl IntoIterator<Item = &'p [u8]>,
    tools: &[ToolSpec],
    stream: bool,
    dialect: &Dialect,
) -> Result<Vec<u8>, ModelError> {
    let pieces: Vec<&[u8]> = pieces.into_iter().filter(|p| !p.is_empty()).collect();
    let size: usize = pieces.iter().map(|p| p.len() + 1).sum();
    let mut out = Vec::with_capacity(size + 256);
    out.extend_from_slice(b"{\"model\":");
    serde_json::to_writer(&mut out, model)?;
    out.extend_from_slice(b",\"messages\":[");
    for (i, p) in pieces.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(p);
    }
    out.extend_from_slice(if stream {
        &b"],\"stream\":true"[..]
    } else {
        &b"],\"stream\":false"[..]
    });
    if !tools.is_empty() {
        out.extend_from_slice(b",\"tools\":");
        let tools: Vec<WireTool> = tools
            .iter()
            .map(|t| WireTool {
                kind: "function",
                function: WireToolFunction {
                    name: &t.name,
                    description: &t.description,
                    parameters: &t.input_schema,
                },
            })
            .collect();
        serde_json::to_writer(&mut out, &tools)?;
    }
    if stream {
        out.extend_from_slice(b",\"stream_options\":{\"include_usage\":true}");
    }
    if let Some(n) = dialect.max_tokens {
        out.push(b',');
        serde_json::to_writer(&mut out, dialect.max_tokens_field)?;
        out.push(b':');
        serde_json::to_writer(&mut out, &n)?;
    }
    out.push(b'}');
    Ok(out)
}

/// The request body of a whole conversation, built from nothing (no cache).
pub fn request_body(
    model: &str,
    messages: &[Message],
    tools: &[ToolSpec],
    stream: bool,
    dialect: &Dialect,
) -> Result<Vec<u8>, ModelError> {
    let pieces = messages
        .iter()
        .map(|m| message_json(m, dialect))
        .collect::<Result<Vec<_>, _>>()?;
    write_body(
        model,
        pieces.iter().map(Vec::as_slice),
        tools,
        stream,
        dialect,
    )
}

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
    pub fn chunk(
        &mut self,
        v: &Value,
        on_text: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<(), DecodeError> {
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

    /// The answer.
    pub fn response(&self) -> Result<ModelResponse, ModelError> {
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

    fn event(
        &mut self,
        event: &SseEvent,
        on_text: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<(), DecodeError> {
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

/// A Chat Completions model.
pub struct ChatModel {
    pub name: String,
    pub model: String,
    pub endpoint: Endpoint,
    pub http: HttpOptions,
    pub dialect: Dialect,
    pub client: reqwest::Client,
    /// Each message's wire JSON, built once.
    pub wire: WireCache<Vec<u8>>,
}

#[async_trait]
impl Model for ChatModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn step(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let body = {
            let pieces = self
                .wire
                .pieces(request.messages, |m| message_json(m, &self.dialect))?;
            write_body(
                &self.model,
                pieces.iter().map(|(_, p)| p.as_slice()),
                request.tools,
                self.http.stream,
                &self.dialect,
            )?
        };
        let body = bytes::Bytes::from(body);
        let mut decoder = ChatDecoder::new();
        exchange(
            &self.client,
            &self.endpoint,
            &self.http,
            &body,
            &mut decoder,
            request.on_text,
        )
        .await?;
        decoder.response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolResult;

    /// The request body as it was built before the wire cache: the reference.
    fn old_request_body(
        model: &str,
        messages: &[Message],
        tools: &[ToolSpec],
        stream: bool,
        dialect: &Dialect,
    ) -> Value {
        let mut out = Vec::new();
        for m in messages {
            match m {
                Message::System { content } => {
                    out.push(json!({"role": "system", "content": content}))
                }
                Message::User { content } => out.push(json!({"role": "user", "content": content})),
                Message::Assistant {
                    text,
                    tool_calls,
                    reasoning,
                } => {
                    let mut msg = json!({
                        "role": "assistant",
                        "content": if text.is_empty() { Value::Null } else { json!(text) },
                    });
                    if !tool_calls.is_empty() {
                        msg["tool_calls"] = tool_calls
                        .iter()
                        .map(|c| {
                            json!({
                                "id": c.id,
                                "type": "function",
                                "function": {
                                    "name": c.name,
                                    "arguments": if c.arguments.trim().is_empty() { "{}" } else { &c.arguments },
                                }
                            })
                        })
                        .collect();
                    }
                    if let (true, Some(r)) = (dialect.send_reasoning, reasoning) {
                        msg["reasoning_content"] = json!(r);
                    }
                    out.push(msg);
                }
                Message::Tool { results } => {
                    for r in results {
                        let content = if r.is_error {
                            format!("Error: {}", r.content)
                        } else {
                            r.content.clone()
                        };
                        out.push(
                            json!({"role": "tool", "tool_call_id": r.call_id, "content": content}),
                        );
                    }
                }
            }
        }
        let mut body = json!({"model": model, "messages": out, "stream": stream});
        if !tools.is_empty() {
            body["tools"] = tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {
                        "name": t.name, "description": t.description, "parameters": t.input_schema,
                    }})
                })
                .collect();
        }
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        if let Some(n) = dialect.max_tokens {
            body[dialect.max_tokens_field] = json!(n);
        }
        body
    }

    fn body_value(
        model: &str,
        messages: &[Message],
        tools: &[ToolSpec],
        stream: bool,
        dialect: &Dialect,
    ) -> Value {
        serde_json::from_slice(&request_body(model, messages, tools, stream, dialect).unwrap())
            .unwrap()
    }

    fn decode(stream: &str) -> ModelResponse {
        let mut d = ChatDecoder::new();
        let mut parser = super::super::sse::SseParser::new();
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
    fn request_carries_tools_calls_and_results_in_order() {
        let messages = vec![
            Message::System {
                content: "sys".into(),
            },
            Message::User {
                content: "hi".into(),
            },
            Message::Assistant {
                text: String::new(),
                tool_calls: vec![
                    ToolCall {
                        id: "a".into(),
                        name: "f".into(),
                        arguments: "".into(),
                    },
                    ToolCall {
                        id: "b".into(),
                        name: "g".into(),
                        arguments: "{\"x\":1}".into(),
                    },
                ],
                reasoning: Some("thought".into()),
            },
            Message::Tool {
                results: vec![
                    ToolResult {
                        call_id: "a".into(),
                        name: "f".into(),
                        content: "ok".into(),
                        is_error: false,
                    },
                    ToolResult {
                        call_id: "b".into(),
                        name: "g".into(),
                        content: "bad".into(),
                        is_error: true,
                    },
                ],
            },
        ];
        let tools = vec![ToolSpec {
            name: "f".into(),
            description: "d".into(),
            input_schema: json!({"type": "object"}),
        }];
        let dialect = Dialect {
            send_reasoning: true,
            max_tokens_field: "max_tokens",
            max_tokens: Some(100),
        };
        let body = body_value("m", &messages, &tools, true, &dialect);
        assert_eq!(body["model"], "m");
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["max_tokens"], 100);
        assert_eq!(body["tools"][0]["function"]["parameters"]["type"], "object");
        let m = body["messages"].as_array().unwrap();
        assert_eq!(m[2]["content"], Value::Null);
        assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], "{}");
        assert_eq!(m[2]["reasoning_content"], "thought");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "a", "content": "ok"})
        );
        assert_eq!(m[4]["content"], "Error: bad");
        let plain = body_value("m", &messages, &tools, false, &Dialect::default());
        assert!(plain["messages"][2].get("reasoning_content").is_none());
        assert!(plain.get("stream_options").is_none());
    }

    fn tools() -> Vec<ToolSpec> {
        vec![
            ToolSpec {
                name: "read_file".into(),
                description: "Read \"a\" file".into(),
                input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            },
            ToolSpec {
                name: "run".into(),
                description: "d".into(),
                input_schema: json!({"type": "object"}),
            },
        ]
    }

    fn dialects() -> Vec<Dialect> {
        vec![
            Dialect::default(),
            Dialect {
                send_reasoning: true,
                max_tokens_field: "max_tokens",
                max_tokens: Some(100),
            },
            Dialect {
                send_reasoning: false,
                max_tokens_field: "max_completion_tokens",
                max_tokens: Some(7),
            },
        ]
    }

    /// Step by step, the body from cached pieces is the old full serialization, for every
    /// prefix of a conversation with every kind of message.
    #[test]
    fn cached_body_equals_the_full_serialization_at_every_step() {
        let all = crate::model::sample::conversation(8);
        for dialect in dialects() {
            let cache = WireCache::default();
            for stream in [true, false] {
                for n in 0..=all.len() {
                    let messages = &all[..n];
                    for tools in [tools(), vec![]] {
                        let pieces = cache
                            .pieces(messages, |m| message_json(m, &dialect))
                            .unwrap();
                        let body = write_body(
                            "gpt \"x\"",
                            pieces.iter().map(|(_, p)| p.as_slice()),
                            &tools,
                            stream,
                            &dialect,
                        )
                        .unwrap();
                        drop(pieces);
                        let got: Value = serde_json::from_slice(&body).unwrap();
                        let want =
                            old_request_body("gpt \"x\"", messages, &tools, stream, &dialect);
                        assert_eq!(got, want, "{n} messages, {dialect:?}, stream {stream}");
                    }
                }
            }
        }
    }

    /// An entry is only used while its message is unchanged: an edited message, a shorter
    /// conversation or another conversation is rebuilt, never sent stale.
    #[test]
    fn an_edited_message_is_never_sent_stale() {
        let dialect = Dialect {
            send_reasoning: true,
            ..Dialect::default()
        };
        let cache = WireCache::default();
        let body = |messages: &[Message]| -> Value {
            let pieces = cache
                .pieces(messages, |m| message_json(m, &dialect))
                .unwrap();
            let body = write_body(
                "m",
                pieces.iter().map(|(_, p)| p.as_slice()),
                &[],
                true,
                &dialect,
            )
            .unwrap();
            serde_json::from_slice(&body).unwrap()
        };
        let mut messages = crate::model::sample::conversation(5);
        body(&messages);
        if let Message::Tool { results } = &mut messages[3] {
            results[0].content.replace_range(0..4, "LINE");
        }
        if let Message::Assistant { reasoning, .. } = &mut messages[4] {
            *reasoning = Some("changed my mind".into());
        }
        let got = body(&messages);
        assert_eq!(got, old_request_body("m", &messages, &[], true, &dialect));
        assert!(got.to_string().contains("LINE"));
        let fresh = crate::model::sample::conversation(1);
        assert_eq!(
            body(&fresh),
            old_request_body("m", &fresh, &[], true, &dialect)
        );
        assert_eq!(
            body(&messages[..2]),
            old_request_body("m", &messages[..2], &[], true, &dialect)
        );
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
