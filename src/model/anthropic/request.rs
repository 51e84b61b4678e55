//! The Messages request body: our conversation → the JSON Anthropic's API takes (system at
//! the top, `tool_use` blocks, `tool_result` blocks first in the next user message, prompt-cache
//! breakpoints), written once and extended step by step through the wire cache. Pure.

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;
use serde_json::{Value, json};

use crate::model::{
    Conversation, Message, ModelError, ToolSpec, Wire, WireCache, end_messages, open_body,
};

fn cache_mark(block: &mut Value) {
    block["cache_control"] = json!({"type": "ephemeral"});
}

/// Which side of the conversation a wire message is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    User,
    Assistant,
}

impl Role {
    fn wire(self) -> &'static [u8] {
        match self {
            Role::User => b"user",
            Role::Assistant => b"assistant",
        }
    }
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock<'a> {
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: &'a str,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

#[derive(Serialize)]
struct WireSystem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
    cache_control: Ephemeral,
}

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<Ephemeral>,
}

#[derive(Serialize)]
struct Ephemeral {
    #[serde(rename = "type")]
    kind: &'static str,
}

const EPHEMERAL: Ephemeral = Ephemeral { kind: "ephemeral" };
const MARK: &[u8] = b",\"cache_control\":{\"type\":\"ephemeral\"}}";

/// Where the body stands after the messages written so far. Messages of one role in a row
/// share one wire message. The latest block is left open, without its closing brace, for the
/// tail to close: with the cache breakpoint mark, so that the next step re-reads all of
/// this, or without it when a paused turn follows. The mark moves on with every turn, so it
/// is never kept.
#[derive(Default)]
pub(crate) struct Turns {
    /// The role of the last wire message, once there is one.
    role: Option<Role>,
    /// Whether that message has a block yet (then its last one is open).
    open_block: bool,
    /// The text of the system messages, joined; sent apart from the messages.
    system: Option<String>,
}

impl Turns {
    /// Start a wire message of `role`.
    fn start(&mut self, out: &mut BytesMut, role: Role) {
        if self.open_block {
            out.extend_from_slice(b"}");
            self.open_block = false;
        }
        if self.role.is_some() {
            out.extend_from_slice(b"]},");
        }
        out.extend_from_slice(b"{\"role\":\"");
        out.extend_from_slice(role.wire());
        out.extend_from_slice(b"\",\"content\":[");
        self.role = Some(role);
    }

    /// Write one block of the last wire message, left open.
    fn block(&mut self, out: &mut BytesMut, block: &WireBlock) -> Result<(), ModelError> {
        if self.open_block {
            out.extend_from_slice(b"},");
        }
        serde_json::to_writer(out.writer(), block)?;
        if out.last() != Some(&b'}') {
            return Err(ModelError::Encode(
                "a content block is not an object".into(),
            ));
        }
        out.truncate(out.len() - 1);
        self.open_block = true;
        Ok(())
    }
}

/// A call's arguments as a `tool_use` input: an object, `{}` when they are none or invalid.
fn tool_input(arguments: &str) -> Value {
    serde_json::from_str::<Value>(arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// One message of ours as wire blocks at the end of the body: tool results are blocks of a
/// user message, system text is kept for the tail.
fn append(out: &mut BytesMut, turns: &mut Turns, m: &Message) -> Result<(), ModelError> {
    let role = match m {
        Message::System { content } => {
            match &mut turns.system {
                Some(system) => {
                    system.push_str("\n\n");
                    system.push_str(content);
                }
                None => turns.system = Some(content.clone()),
            }
            return Ok(());
        }
        Message::User { .. } | Message::Tool { .. } => Role::User,
        Message::Assistant { .. } => Role::Assistant,
    };
    if turns.role != Some(role) {
        turns.start(out, role);
    }
    match m {
        Message::System { .. } => {}
        Message::User { content } => turns.block(out, &WireBlock::Text { text: content })?,
        Message::Assistant {
            text, tool_calls, ..
        } => {
            if !text.is_empty() {
                turns.block(out, &WireBlock::Text { text })?;
            }
            for c in tool_calls {
                turns.block(
                    out,
                    &WireBlock::ToolUse {
                        id: &c.id,
                        name: &c.name,
                        input: tool_input(&c.arguments),
                    },
                )?;
            }
            if text.is_empty() && tool_calls.is_empty() {
                turns.block(
                    out,
                    &WireBlock::Text {
                        text: "(no answer)",
                    },
                )?;
            }
        }
        Message::Tool { results } => {
            for r in results {
                turns.block(
                    out,
                    &WireBlock::ToolResult {
                        tool_use_id: &r.call_id,
                        content: &r.content,
                        is_error: r.is_error,
                    },
                )?;
            }
        }
    }
    Ok(())
}

/// The body's end, after the messages: the latest block closed with the cache mark, or the
/// paused assistant turn's blocks (`continuation`) with the mark on their last; then the
/// stream flag, the output limit, the system text and the tools (`tools_json`, empty for none),
/// each marked as a breakpoint too.
fn tail(
    out: &mut BytesMut,
    turns: &Turns,
    continuation: &[Value],
    tools: &[u8],
    (stream, max_tokens): (bool, u32),
) -> Result<(), ModelError> {
    let mut role = turns.role;
    if continuation.is_empty() {
        if turns.open_block {
            out.extend_from_slice(MARK);
        }
    } else {
        let mut any = turns.open_block;
        if turns.open_block {
            out.extend_from_slice(b"}");
        }
        if role != Some(Role::Assistant) {
            if role.is_some() {
                out.extend_from_slice(b"]},");
            }
            out.extend_from_slice(b"{\"role\":\"assistant\",\"content\":[");
            role = Some(Role::Assistant);
            any = false;
        }
        for (i, b) in continuation.iter().enumerate() {
            if any {
                out.extend_from_slice(b",");
            }
            any = true;
            if i + 1 == continuation.len() {
                // It may carry any keys.
                let mut b = b.clone();
                cache_mark(&mut b);
                serde_json::to_writer(out.writer(), &b)?;
            } else {
                serde_json::to_writer(out.writer(), b)?;
            }
        }
    }
    if role.is_some() {
        out.extend_from_slice(b"]}");
    }
    end_messages(out, stream);
    out.extend_from_slice(b",\"max_tokens\":");
    serde_json::to_writer(out.writer(), &max_tokens)?;
    if let Some(system) = &turns.system {
        out.extend_from_slice(b",\"system\":");
        serde_json::to_writer(
            out.writer(),
            &[WireSystem {
                kind: "text",
                text: system,
                cache_control: EPHEMERAL,
            }],
        )?;
    }
    if !tools.is_empty() {
        out.extend_from_slice(b",\"tools\":");
        out.extend_from_slice(tools);
    }
    out.extend_from_slice(b"}");
    Ok(())
}

/// The tools' JSON list, as `tail` writes it: the last marked as a breakpoint.
fn tools_json(tools: &[ToolSpec]) -> Result<Vec<u8>, ModelError> {
    let list: Vec<WireTool> = tools
        .iter()
        .enumerate()
        .map(|(i, t)| WireTool {
            name: &t.name,
            description: &t.description,
            input_schema: &t.input_schema,
            cache_control: (i + 1 == tools.len()).then_some(EPHEMERAL),
        })
        .collect();
    Ok(serde_json::to_vec(&list)?)
}

/// The request body of `messages`, kept in `cache` and extended by what is new.
/// `continuation` holds the content of a paused assistant turn.
pub(crate) fn cached_body(
    cache: &WireCache<Turns>,
    (model, max_tokens): (&str, u32),
    messages: &Conversation,
    tools: &[ToolSpec],
    stream: bool,
    continuation: &[Value],
) -> Result<(Wire<Turns>, Bytes), ModelError> {
    let mut wire = cache.take(messages, |out| open_body(out, model), append)?;
    let tools = match tools {
        [] => Bytes::new(),
        _ => cache.tools(tools, tools_json)?,
    };
    let body =
        wire.body(|out, turns| tail(out, turns, continuation, &tools, (stream, max_tokens)))?;
    Ok((wire, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::sample;

    /// One request: what `cached_body` takes besides the cache, for the three ways its body
    /// is written.
    struct Request<'a> {
        model: (&'a str, u32),
        messages: &'a Conversation,
        tools: &'a [ToolSpec],
        stream: bool,
        continuation: &'a [Value],
    }

    /// The request with the model `m`, the conversation alone, streamed.
    fn plain(messages: &Conversation) -> Request<'_> {
        Request {
            model: ("m", 10),
            messages,
            tools: &[],
            stream: true,
            continuation: &[],
        }
    }

    impl Request<'_> {
        /// The body through the wire cache, checked against the one written from nothing
        /// (`sample::step`), as JSON.
        fn step(&self, cache: &WireCache<Turns>, held: bool) -> Value {
            let cached = cached_body(
                cache,
                self.model,
                self.messages,
                self.tools,
                self.stream,
                self.continuation,
            );
            sample::step(cache, cached, self.fresh(), held)
        }

        /// The body of the whole conversation, written from nothing.
        fn fresh(&self) -> Result<Bytes, ModelError> {
            let (model, max_tokens) = self.model;
            let mut wire = Wire::new(self.messages, |out| open_body(out, model), append)?;
            let tools = if self.tools.is_empty() {
                Vec::new()
            } else {
                tools_json(self.tools)?
            };
            wire.body(|out, turns| {
                tail(
                    out,
                    turns,
                    self.continuation,
                    &tools,
                    (self.stream, max_tokens),
                )
            })
        }
    }

    /// The request body as it was built before the wire cache: the reference.
    fn old_request_body(request: &Request) -> Value {
        let Request {
            model: (model, max_tokens),
            messages,
            tools,
            stream,
            continuation,
        } = *request;
        let mut system = Vec::new();
        let mut out: Vec<Value> = Vec::new();
        let mut push = |role: &str, blocks: Vec<Value>| {
            if let Some(last) = out.last_mut().filter(|m| m["role"] == role)
                && let Some(content) = last["content"].as_array_mut()
            {
                content.extend(blocks);
                return;
            }
            out.push(json!({"role": role, "content": blocks}));
        };
        for m in messages.iter() {
            match m {
                Message::System { content } => system.push(content.clone()),
                Message::User { content } => {
                    push("user", vec![json!({"type": "text", "text": content})])
                }
                Message::Assistant {
                    text, tool_calls, ..
                } => {
                    let mut blocks = Vec::new();
                    if !text.is_empty() {
                        blocks.push(json!({"type": "text", "text": text}));
                    }
                    for c in tool_calls {
                        let input = tool_input(&c.arguments);
                        blocks.push(
                            json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}),
                        );
                    }
                    if blocks.is_empty() {
                        blocks.push(json!({"type": "text", "text": "(no answer)"}));
                    }
                    push("assistant", blocks);
                }
                Message::Tool { results } => {
                    let blocks = results
                    .iter()
                    .map(|r| {
                        let mut b = json!({"type": "tool_result", "tool_use_id": r.call_id, "content": r.content});
                        if r.is_error {
                            b["is_error"] = json!(true);
                        }
                        b
                    })
                    .collect();
                    push("user", blocks);
                }
            }
        }
        if !continuation.is_empty() {
            push("assistant", continuation.to_vec());
        }
        // The latest turn is a cache breakpoint, so the next step re-reads all of this.
        if let Some(block) = out
            .last_mut()
            .and_then(|m| m["content"].as_array_mut())
            .and_then(|c| c.last_mut())
        {
            cache_mark(block);
        }
        let mut body =
            json!({"model": model, "max_tokens": max_tokens, "messages": out, "stream": stream});
        if !system.is_empty() {
            let mut block = json!({"type": "text", "text": system.join("\n\n")});
            cache_mark(&mut block);
            body["system"] = json!([block]);
        }
        if !tools.is_empty() {
            let mut list: Vec<Value> = tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
            .collect();
            if let Some(last) = list.last_mut() {
                cache_mark(last);
            }
            body["tools"] = json!(list);
        }
        body
    }

    /// Step by step, the body kept and extended is byte for byte the body written from
    /// nothing, and the old full serialization, for every prefix of a conversation: the cache
    /// breakpoint moves to the latest block each step and the block it left is sent without
    /// it; with and without a paused turn to continue; also when the transport still held the
    /// last body.
    #[test]
    fn kept_body_equals_the_full_serialization_at_every_step() {
        let all = crate::model::sample::conversation(8);
        let cache = WireCache::default();
        let paused = [
            json!({"type": "text", "text": "Let me"}),
            json!({"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {"q": "x"}}),
        ];
        let mut messages = Conversation::new();
        for n in 0..=all.len() {
            if n > 0 {
                messages.push(all[n - 1].clone());
            }
            for (tools, stream, continuation) in [
                (sample::tools(), true, &[][..]),
                (vec![], false, &[][..]),
                (sample::tools(), true, &paused[..]),
                (sample::tools(), true, &paused[..1]),
            ] {
                let request = Request {
                    model: ("claude", 1000),
                    messages: &messages,
                    tools: &tools,
                    stream,
                    continuation,
                };
                let got = request.step(&cache, n % 3 == 0);
                assert_eq!(
                    got,
                    old_request_body(&request),
                    "{n} messages, continuation {}",
                    continuation.len()
                );
                let marks = got.to_string().matches("cache_control").count();
                let expected = usize::from(got.get("system").is_some())
                    + usize::from(!tools.is_empty())
                    + usize::from(got["messages"].as_array().is_some_and(|m| !m.is_empty()));
                assert_eq!(marks, expected, "one breakpoint on the latest block only");
            }
        }
    }

    /// A rewritten conversation is written anew, never sent stale.
    #[test]
    fn a_rewritten_conversation_is_never_sent_stale() {
        let cache = WireCache::default();
        let body = |messages: &Conversation| plain(messages).step(&cache, true);
        let mut messages = Conversation::from(crate::model::sample::conversation(5));
        body(&messages);
        messages.rewrite(|m| {
            if let Message::Assistant { tool_calls, .. } = &mut m[2] {
                tool_calls[0].arguments = "{\"path\": \"other.txt\"}".into();
            }
        });
        let got = body(&messages);
        assert_eq!(got, old_request_body(&plain(&messages)));
        assert!(got.to_string().contains("other.txt"));
        let fresh = Conversation::from(crate::model::sample::conversation(1));
        assert_eq!(body(&fresh), old_request_body(&plain(&fresh)));
    }

    #[test]
    fn request_puts_results_first_and_marks_cache_breakpoints() {
        let messages = Conversation::from(sample::exchange());
        let tools = vec![ToolSpec {
            name: "f".into(),
            description: "d".into(),
            input_schema: json!({"type": "object"}),
        }];
        let request = Request {
            model: ("claude", 1000),
            messages: &messages,
            tools: &tools,
            stream: true,
            continuation: &[],
        };
        let body: Value = serde_json::from_slice(&request.fresh().unwrap()).unwrap();
        assert_eq!(body["max_tokens"], 1000);
        assert_eq!(body["system"][0]["text"], "sys");
        assert_eq!(body["system"][0]["cache_control"]["type"], "ephemeral");
        assert_eq!(body["tools"][0]["input_schema"]["type"], "object");
        assert_eq!(body["tools"][0]["cache_control"]["type"], "ephemeral");
        let m = body["messages"].as_array().unwrap();
        assert_eq!(
            m.len(),
            3,
            "results and the next user text share one message"
        );
        assert_eq!(m[1]["content"][0]["input"], json!({}));
        assert_eq!(m[1]["content"][1]["input"], json!({}));
        let last = m[2]["content"].as_array().unwrap();
        assert_eq!(last[0]["type"], "tool_result");
        assert_eq!(last[0]["tool_use_id"], "a");
        assert!(last[0].get("is_error").is_none());
        assert_eq!(last[1]["is_error"], true);
        assert_eq!(last[2]["type"], "text");
        assert_eq!(last[2]["cache_control"]["type"], "ephemeral");
    }
}
