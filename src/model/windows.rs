//! Context windows: a built-in table of the windows of known hosted models, which
//! `[models."provider:model"] context_window` in the user config extends or overrides; and
//! what a provider's error says when a request does not fit its window, in each real
//! server's words (OpenAI, Anthropic, llama.cpp, vLLM, Ollama), with the window when the
//! error names it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the user config says about one model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelInfo {
    /// Tokens the model's context window holds, input and output together.
    #[serde(default, deserialize_with = "crate::model::windows::positive")]
    pub(crate) context_window: Option<u64>,
}

/// A token count that is not 0.
pub(crate) fn positive<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let n = Option::<u64>::deserialize(d)?;
    if n == Some(0) {
        return Err(serde::de::Error::custom(
            "must be at least 1 token (a window of 0 holds nothing)",
        ));
    }
    Ok(n)
}

/// The built-in table, by `provider:model`; a longer name (a dated version) matches its
/// prefix, as prices do.
const TABLE: &[(&str, u64)] = &[
    ("openai:gpt-5", 400_000),
    ("openai:gpt-5-mini", 400_000),
    ("openai:gpt-5-nano", 400_000),
    ("openai:gpt-4.1", 1_047_576),
    ("openai:gpt-4.1-mini", 1_047_576),
    ("openai:gpt-4.1-nano", 1_047_576),
    ("openai:gpt-4o", 128_000),
    ("openai:gpt-4o-mini", 128_000),
    ("openai:o3", 200_000),
    ("openai:o3-mini", 200_000),
    ("openai:o4-mini", 200_000),
    ("anthropic:claude-opus-4-1", 200_000),
    ("anthropic:claude-opus-4", 200_000),
    ("anthropic:claude-sonnet-4-5", 200_000),
    ("anthropic:claude-sonnet-4", 200_000),
    ("anthropic:claude-3-7-sonnet", 200_000),
    ("anthropic:claude-haiku-4-5", 200_000),
    ("anthropic:claude-3-5-haiku", 200_000),
    ("deepseek:deepseek-chat", 128_000),
    ("deepseek:deepseek-reasoner", 128_000),
];

/// The window of `provider:model`, the user's over the built-in table (`prices::lookup`).
pub(crate) fn window(model: &str, user: &BTreeMap<String, ModelInfo>) -> Option<u64> {
    super::prices::lookup(
        model,
        user.iter()
            .filter_map(|(m, i)| Some((m.as_str(), i.context_window?))),
        TABLE,
    )
}

/// An error that says the request does not fit the model's context window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Overflow {
    /// The window, when the error names it.
    pub(crate) window: Option<u64>,
}

/// Words by which servers say a request is past the window, lowercased.
const WORDS: &[&str] = &[
    // OpenAI's code, and its and vLLM's message: "This model's maximum context length is N".
    "context_length_exceeded",
    "maximum context length",
    // Anthropic: "prompt is too long: 210000 tokens > 200000 maximum".
    "prompt is too long",
    // llama.cpp: "request (N tokens) exceeds the available context size (M tokens)".
    "exceed_context_size_error",
    "exceeds the available context size",
    // Ollama: "the input length exceeds the context length", "input exceeds context length".
    "exceeds the context length",
    "exceeds context length",
    // Others.
    "context window",
    "context length",
];

/// Whether the error body of a rejected request (HTTP 400, 413, 422) says the request is past
/// the context window, and the window when it names it: llama.cpp's `n_ctx`, or the number
/// in the message.
pub(crate) fn overflow(body: &str) -> Option<Overflow> {
    let lower = body.to_lowercase();
    if !WORDS.iter().any(|w| lower.contains(w)) {
        return None;
    }
    let json = serde_json::from_str::<Value>(body).ok();
    let n_ctx = json
        .as_ref()
        .and_then(|v| v.pointer("/error/n_ctx").or_else(|| v.get("n_ctx")))
        .and_then(Value::as_u64);
    let window = n_ctx
        .or_else(|| number_after(&lower, "available context size ("))
        .or_else(|| number_after(&lower, "maximum context length is "))
        .or_else(|| {
            // Anthropic: "… tokens > 200000 maximum".
            let at = lower.find(" maximum")?;
            let before = lower[..at].trim_end();
            let digits: String = before
                .chars()
                .rev()
                .take_while(char::is_ascii_digit)
                .collect();
            let digits: String = digits.chars().rev().collect();
            before[..before.len() - digits.len()]
                .trim_end()
                .ends_with('>')
                .then(|| digits.parse().ok())
                .flatten()
        })
        .filter(|n| *n > 0);
    Some(Overflow { window })
}

/// The number that follows `phrase` in `text`.
fn number_after(text: &str, phrase: &str) -> Option<u64> {
    let at = text.find(phrase)? + phrase.len();
    let digits: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each real server's words, as they answer a request past the window.
    #[test]
    fn every_servers_wording_is_an_overflow_and_names_its_window() {
        let cases: &[(&str, &str, Option<u64>)] = &[
            (
                "openai",
                r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130123 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
                Some(128_000),
            ),
            (
                "openai, code only",
                r#"{"error":{"message":"Input tokens exceed the configured limit of 272000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
                None,
            ),
            (
                "anthropic",
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210431 tokens > 200000 maximum"}}"#,
                Some(200_000),
            ),
            (
                "llama.cpp",
                r#"{"error":{"code":400,"message":"request (21901 tokens) exceeds the available context size (8192 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":21901,"n_ctx":8192}}"#,
                Some(8192),
            ),
            (
                "llama.cpp, message only",
                "request (9000 tokens) exceeds the available context size (4096 tokens), try increasing it",
                Some(4096),
            ),
            (
                "vllm",
                r#"{"object":"error","message":"This model's maximum context length is 16384 tokens. However, you requested 122946 tokens (112946 in the messages, 10000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}"#,
                Some(16_384),
            ),
            (
                "ollama",
                r#"{"error":"the input length exceeds the context length"}"#,
                None,
            ),
            ("ollama, older", "input exceeds context length", None),
        ];
        for (server, body, window) in cases {
            assert_eq!(
                overflow(body),
                Some(Overflow { window: *window }),
                "{server}: {body}"
            );
        }
        for other in [
            r#"{"error":{"message":"Invalid API Key","type":"invalid_request_error"}}"#,
            r#"{"error":{"message":"max_tokens: 300000 > 64000, which is the maximum allowed"}}"#,
            "Bad Request",
        ] {
            assert_eq!(overflow(other), None, "{other}");
        }
    }

    #[test]
    fn dated_names_match_their_prefix_and_user_windows_win() {
        let mut user = BTreeMap::new();
        user.insert(
            "openai:gpt-4o".to_string(),
            ModelInfo {
                context_window: Some(1000),
            },
        );
        user.insert(
            "ollama:qwen3".to_string(),
            ModelInfo {
                context_window: Some(32_768),
            },
        );
        assert_eq!(window("openai:gpt-4o", &user), Some(1000));
        assert_eq!(window("openai:gpt-4o-mini", &user), Some(128_000));
        assert_eq!(
            window("anthropic:claude-sonnet-4-5-20250929", &user),
            Some(200_000)
        );
        assert_eq!(window("ollama:qwen3", &user), Some(32_768));
        assert_eq!(window("ollama:llama3", &user), None);
        assert_eq!(window("openai:gpt-4oops", &user), None);
    }
}
