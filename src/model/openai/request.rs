//! The Chat Completions request body: our conversation → the JSON a compatible server takes,
//! with the settings that vary by server (`Dialect`), written once and extended step by step
//! through the wire cache. Pure.

use std::borrow::Cow;

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;
use serde_json::{Value, json};

use crate::model::{
    Conversation, Message, ModelError, ToolSpec, Wire, WireCache, end_messages, open_body,
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

/// The tools' JSON list, as `tail` writes it.
fn tools_json(tools: &[ToolSpec]) -> Result<Vec<u8>, ModelError> {
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
    Ok(serde_json::to_vec(&tools)?)
}

/// The body's end, after the messages: the stream flag, the tools (`tools_json`, empty for
/// none), the output limit.
fn tail(
    out: &mut BytesMut,
    tools: &[u8],
    stream: bool,
    dialect: &Dialect,
) -> Result<(), ModelError> {
    end_messages(out, stream);
    if !tools.is_empty() {
        out.extend_from_slice(b",\"tools\":");
        out.extend_from_slice(tools);
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
        |out| open_body(out, model),
        |out, written, m| append(out, written, m, dialect),
    )?;
    let tools = match tools {
        [] => Bytes::new(),
        _ => cache.tools(tools, tools_json)?,
    };
    let body = wire.body(|out, _| tail(out, &tools, stream, dialect))?;
    Ok((wire, body))
}

/// `body` asking for an answer that is one JSON object of `schema` (`response_format`), the
/// field written before the body's closing brace; the messages stay where they were.
pub(crate) fn with_response_format(body: Bytes, schema: &Value) -> Result<Bytes, ModelError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::sample;

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
            |out| open_body(out, model),
            |out, written, m| append(out, written, m, dialect),
        )?;
        let tools = if tools.is_empty() {
            Vec::new()
        } else {
            tools_json(tools)?
        };
        wire.body(|out, _| tail(out, &tools, stream, dialect))
    }

    fn json(body: Bytes) -> Value {
        serde_json::from_slice(&body).unwrap()
    }

    #[test]
    fn request_carries_tools_calls_and_results_in_order() {
        let messages = sample::exchange();
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
        let body = json(request_body("m", &messages, &tools, true, &dialect).unwrap());
        assert_eq!(body["model"], "m");
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["max_tokens"], 100);
        assert_eq!(body["tools"][0]["function"]["parameters"]["type"], "object");
        let m = body["messages"].as_array().unwrap();
        assert_eq!(m[2]["content"], Value::Null);
        assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], "{}");
        assert_eq!(m[2]["tool_calls"][1]["function"]["arguments"], "{bad");
        assert_eq!(m[2]["reasoning_content"], "thought");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "a", "content": "ok"})
        );
        assert_eq!(m[4]["content"], "Error: bad");
        let plain = json(request_body("m", &messages, &tools, false, &Dialect::default()).unwrap());
        assert!(plain["messages"][2].get("reasoning_content").is_none());
        assert!(plain.get("stream_options").is_none());
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
                    for tools in [sample::tools(), vec![]] {
                        let model = "gpt \"x\"";
                        let got = sample::step(
                            &cache,
                            cached_body(&cache, model, &messages, &tools, stream, &dialect),
                            request_body(model, &messages, &tools, stream, &dialect),
                            n % 3 == 0,
                        );
                        let want = old_request_body(model, &messages, &tools, stream, &dialect);
                        assert_eq!(got, want, "{n} messages, {dialect:?}, stream {stream}");
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
        let body = |messages: &Conversation| {
            sample::step(
                &cache,
                cached_body(&cache, "m", messages, &[], true, &dialect),
                request_body("m", messages, &[], true, &dialect),
                true,
            )
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
        assert!(edited.to_string().contains("LINE"));
        // Trimmed to fewer messages, then grown back to as many as before.
        messages.rewrite(|m| m.truncate(2));
        body(&messages);
        messages.push(Message::User {
            content: "again".into(),
        });
        body(&messages);
        messages.clear();
        assert_eq!(body(&messages)["messages"], json!([]));
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
}
