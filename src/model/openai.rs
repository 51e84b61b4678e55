//! The Chat Completions protocol (`openai:`, and the `deepseek:` and `ollama:` presets of any
//! compatible server): our messages → request JSON, and streamed chunks or a whole answer →
//! our response. Pure conversion apart from the transport, so each is tested from strings.

use std::borrow::Cow;
use std::collections::HashMap;

use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;
use serde_json::{Value, json};

use super::http::{DecodeError, Decoder, Endpoint, HttpOptions, exchange};
use super::sse::SseEvent;
use super::{
    Conversation, FinishReason, KeepPartial, Message, Model, ModelError, ModelRequest,
    ModelResponse, ToolCall, ToolSpec, Usage, Wire, WireCache,
};

/// Settings of the request body that vary by server.
#[derive(Clone, Debug, Default)]
pub struct Dialect {
    /// Send `reasoning_content` back on assistant turns (DeepSeek).
    pub(crate) send_reasoning: bool,
    /// The name of the output limit field: `max_completion_tokens` (OpenAI) or `max_tokens`.
    pub(crate) max_tokens_field: &'static str,
    pub(crate) max_tokens: Option<u32>,
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

/// The body's start: `{"model":…,"messages":[`.
fn open(out: &mut BytesMut, model: &str) -> Result<(), ModelError> {
    out.extend_from_slice(b"{\"model\":");
    serde_json::to_writer(out.writer(), model)?;
    out.extend_from_slice(b",\"messages\":[");
    Ok(())
}

/// Whether the body holds a wire message yet (the next one needs a comma).
#[derive(Default)]
pub struct Written(bool);

fn object(out: &mut BytesMut, written: &mut Written, msg: &WireMessage) -> Result<(), ModelError> {
    if written.0 {
        out.extend_from_slice(b",");
    }
    serde_json::to_writer(out.writer(), msg)?;
    written.0 = true;
    Ok(())
}

/// One message of ours as wire JSON at the end of the body: one object, or one per tool
/// result.
fn append(
    out: &mut BytesMut,
    written: &mut Written,
    m: &Message,
    dialect: &Dialect,
) -> Result<(), ModelError> {
    match m {
        Message::System { content } => object(
            out,
            written,
            &WireMessage::new("system", Some(content.into())),
        ),
        Message::User { content } => object(
            out,
            written,
            &WireMessage::new("user", Some(content.into())),
        ),
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
            object(out, written, &msg)
        }
        Message::Tool { results } => {
            for r in results {
                let content = if r.is_error {
                    Cow::Owned(format!("Error: {}", r.content))
                } else {
                    Cow::Borrowed(r.content.as_str())
                };
                let mut msg = WireMessage::new("tool", Some(content));
                msg.tool_call_id = Some(&r.call_id);
                object(out, written, &msg)?;
            }
            Ok(())
        }
    }
}

/// The body's end, after the messages: the stream flag, the tools, the output limit.
fn tail(
    out: &mut BytesMut,
    tools: &[ToolSpec],
    stream: bool,
    dialect: &Dialect,
) -> Result<(), ModelError> {
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
        serde_json::to_writer(out.writer(), &tools)?;
    }
    if stream {
        out.extend_from_slice(b",\"stream_options\":{\"include_usage\":true}");
    }
    if let Some(n) = dialect.max_tokens {
        out.extend_from_slice(b",");
        serde_json::to_writer(out.writer(), dialect.max_tokens_field)?;
        out.extend_from_slice(b":");
        serde_json::to_writer(out.writer(), &n)?;
    }
    out.extend_from_slice(b"}");
    Ok(())
}

/// The request body of `messages`, kept in `cache` and extended by what is new.
pub(crate) fn cached_body(
    cache: &WireCache<Written>,
    model: &str,
    messages: &Conversation,
    tools: &[ToolSpec],
    stream: bool,
    dialect: &Dialect,
) -> Result<(Wire<Written>, Bytes), ModelError> {
    let mut wire = cache.take(
        messages,
        |out| open(out, model),
        |out, written, m| append(out, written, m, dialect),
    )?;
    let body = wire.body(|out, _| tail(out, tools, stream, dialect))?;
    Ok((wire, body))
}

/// `body` asking for an answer that is one JSON object of `schema` (`response_format`), the
/// field written before the body's closing brace; the messages stay where they were.
fn with_response_format(body: Bytes, schema: &Value) -> Result<Bytes, ModelError> {
    let mut buf = body
        .try_into_mut()
        .unwrap_or_else(|b| BytesMut::from(&b[..]));
    if buf.last() == Some(&b'}') {
        buf.truncate(buf.len() - 1);
    }
    let format = json!({"type": "json_schema",
        "json_schema": {"name": "answer", "strict": true, "schema": schema}});
    buf.extend_from_slice(b",\"response_format\":");
    serde_json::to_writer((&mut buf).writer(), &format)?;
    buf.extend_from_slice(b"}");
    Ok(buf.freeze())
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
    pub(crate) fn chunk(
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

    /// What arrived of an answer that did not finish, if anything did (its usage included).
    fn partial(&self) -> Option<ModelResponse> {
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
            self.http.stream,
            &dialect,
        )?;
        let body = match request.json_schema {
            Some(schema) => with_response_format(body, schema)?,
            None => body,
        };
        let mut kept = KeepPartial::new(ChatDecoder::new(), request.partial, ChatDecoder::partial);
        let sent = exchange(
            &self.client,
            &self.endpoint,
            &self.http,
            &body,
            &mut kept.decoder,
            request.on_text,
        )
        .await;
        self.wire.put(wire, body);
        sent?;
        kept.done().response()
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

    /// The request body of a whole conversation, written from nothing.
    fn request_body(
        model: &str,
        messages: &[Message],
        tools: &[ToolSpec],
        stream: bool,
        dialect: &Dialect,
    ) -> Result<Bytes, ModelError> {
        let mut wire = Wire::new(
            &Conversation::from(messages.to_vec()),
            |out| open(out, model),
            |out, written, m| append(out, written, m, dialect),
        )?;
        wire.body(|out, _| tail(out, tools, stream, dialect))
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

    /// Step by step, the body kept and extended is byte for byte the body written from
    /// nothing, and the old full serialization, for every prefix of a conversation with every
    /// kind of message; also when the transport still held the last body.
    #[test]
    fn kept_body_equals_the_full_serialization_at_every_step() {
        let all = crate::model::sample::conversation(8);
        for dialect in dialects() {
            let cache = WireCache::default();
            let mut messages = Conversation::new();
            for n in 0..=all.len() {
                if n > 0 {
                    messages.push(all[n - 1].clone());
                }
                for stream in [true, false] {
                    for tools in [tools(), vec![]] {
                        let (wire, body) =
                            cached_body(&cache, "gpt \"x\"", &messages, &tools, stream, &dialect)
                                .unwrap();
                        let fresh =
                            request_body("gpt \"x\"", &messages, &tools, stream, &dialect).unwrap();
                        assert_eq!(body, fresh, "{n} messages, {dialect:?}, stream {stream}");
                        let got: Value = serde_json::from_slice(&body).unwrap();
                        let want =
                            old_request_body("gpt \"x\"", &messages, &tools, stream, &dialect);
                        assert_eq!(got, want, "{n} messages, {dialect:?}, stream {stream}");
                        let held = (n % 3 == 0).then(|| body.clone());
                        cache.put(wire, body);
                        drop(held);
                    }
                }
            }
        }
    }

    /// A rewritten conversation is written anew, never sent stale: an edit in place that
    /// keeps every length, a trimmed conversation, a cleared one, another one.
    #[test]
    fn a_rewritten_conversation_is_never_sent_stale() {
        let dialect = Dialect {
            send_reasoning: true,
            ..Dialect::default()
        };
        let cache = WireCache::default();
        let body = |messages: &Conversation| -> Bytes {
            let (wire, body) = cached_body(&cache, "m", messages, &[], true, &dialect).unwrap();
            cache.put(wire, body.clone());
            assert_eq!(
                body,
                request_body("m", messages, &[], true, &dialect).unwrap(),
                "the kept body is the fresh one"
            );
            body
        };
        let mut messages = Conversation::from(crate::model::sample::conversation(5));
        let before = body(&messages);
        messages.rewrite(|m| {
            if let Message::Tool { results } = &mut m[3] {
                results[0].content.replace_range(0..4, "LINE");
            }
            if let Message::Assistant { reasoning, .. } = &mut m[4] {
                *reasoning = Some("changed my mind".into());
            }
        });
        let edited = body(&messages);
        assert_ne!(edited, before);
        assert!(String::from_utf8_lossy(&edited).contains("LINE"));
        // Trimmed to fewer messages, then grown back to as many as before.
        messages.rewrite(|m| m.truncate(2));
        body(&messages);
        messages.push(Message::User {
            content: "again".into(),
        });
        body(&messages);
        messages.clear();
        assert_eq!(
            serde_json::from_slice::<Value>(&body(&messages)).unwrap()["messages"],
            json!([])
        );
        let mut other = Conversation::from(crate::model::sample::conversation(1));
        body(&other);
        // A copy is another conversation: what it gets is not sent for the original.
        let mut copy = other.clone();
        copy.push(Message::User {
            content: "only in the copy".into(),
        });
        body(&copy);
        other.push(Message::User {
            content: "only in the original".into(),
        });
        body(&other);
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
