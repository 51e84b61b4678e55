//! What the request-body tests of both protocols share: one step through a `WireCache` checked
//! against the body written from nothing (`step`), and one short exchange (`exchange`).

use bytes::Bytes;
use serde_json::{Value, json};

use super::{Message, ModelError, ToolCall, ToolResult, ToolSpec, Wire, WireCache};

/// One step's body through `cache`: what a protocol's `cached_body` took from it
/// (`cached`) is byte for byte `fresh`, the body written from nothing. It goes back as a
/// step gives it back, a copy kept meanwhile when `held`, as by a transport that still
/// holds the body. The body as JSON.
#[track_caller]
pub(crate) fn step<S: Default>(
    cache: &WireCache<S>,
    cached: Result<(Wire<S>, Bytes), ModelError>,
    fresh: Result<Bytes, ModelError>,
    held: bool,
) -> Value {
    let (wire, body) = cached.unwrap();
    assert_eq!(body, fresh.unwrap(), "the kept body is the fresh one");
    let json = serde_json::from_slice(&body).unwrap();
    let held = held.then(|| body.clone());
    cache.put(wire, body);
    drop(held);
    json
}

/// A short exchange: system and user text; an assistant turn with no text, reasoning and
/// two calls, one without arguments and one with invalid ones; their results, the second
/// an error; then user text.
pub(crate) fn exchange() -> Vec<Message> {
    vec![
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
                    arguments: "{bad".into(),
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
        Message::User {
            content: "checks failed".into(),
        },
    ]
}

/// Two tools, one with a description that needs escaping.
pub(crate) fn tools() -> Vec<ToolSpec> {
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

/// A conversation of `turns` steps with every kind of message and field: system text
/// (twice), user text, assistant text, tool calls with empty, invalid and valid
/// arguments, reasoning, error results, an empty result list, quotes and non-ASCII.
pub(crate) fn conversation(turns: usize) -> Vec<Message> {
    let mut m = vec![
        Message::System {
            content: "You are \"sup\" — be brief.".into(),
        },
        Message::User {
            content: "Read the files, then say 完成.".into(),
        },
    ];
    for i in 0..turns {
        m.push(Message::Assistant {
            text: if i % 3 == 0 {
                String::new()
            } else {
                format!("step {i}\n")
            },
            tool_calls: vec![
                ToolCall {
                    id: format!("call_{i}_a"),
                    name: "read_file".into(),
                    arguments: format!("{{\"path\": \"f{i}.txt\"}}"),
                },
                ToolCall {
                    id: format!("call_{i}_b"),
                    name: "run".into(),
                    arguments: if i % 2 == 0 { "".into() } else { "{bad".into() },
                },
            ],
            reasoning: (i % 2 == 1).then(|| format!("thinking about {i}")),
        });
        m.push(Message::Tool {
            results: vec![
                ToolResult {
                    call_id: format!("call_{i}_a"),
                    name: "read_file".into(),
                    content: format!("line \"{i}\"\n\ttabbed ✓\n").repeat(20),
                    is_error: false,
                },
                ToolResult {
                    call_id: format!("call_{i}_b"),
                    name: "run".into(),
                    content: "invalid input".into(),
                    is_error: true,
                },
            ],
        });
        if i == 2 {
            m.push(Message::User {
                content: "checks failed: tests.sh exited 1".into(),
            });
            m.push(Message::System {
                content: "second system text".into(),
            });
        }
        if i == 4 {
            m.push(Message::Tool { results: vec![] });
        }
    }
    m.push(Message::Assistant {
        text: String::new(),
        tool_calls: vec![],
        reasoning: None,
    });
    m.push(Message::Assistant {
        text: "Done: 完成".into(),
        tool_calls: vec![],
        reasoning: None,
    });
    m
}
