//! The model seam: provider-neutral messages and tool specs, the `Model` trait with its one
//! async step, token usage, the per-message cache of wire bytes the protocols build their
//! request bodies from, and `from_spec`, which turns `PROVIDER:MODEL` into a model.

pub mod anthropic;
pub mod http;
pub mod openai;
pub mod prices;
pub mod record;
pub mod script;
pub mod sse;

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One message of a conversation, in no provider's wire format.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        #[serde(default, skip_serializing_if = "String::is_empty")]
        text: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        /// Reasoning text some providers send and want back (DeepSeek's `reasoning_content`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reasoning: Option<String>,
    },
    /// The results of one step's tool calls, in the order the calls were made.
    Tool {
        results: Vec<ToolResult>,
    },
}

/// A tool call as the model proposed it. `arguments` is the raw JSON text the model wrote,
/// which may be empty or invalid: the work loop judges it, not the provider.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub call_id: String,
    pub name: String,
    pub content: String,
    #[serde(default)]
    pub is_error: bool,
}

/// What the model is told about a tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// Why the model ended its turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model finished its answer.
    Stop,
    /// The model wants its tool calls executed.
    ToolCalls,
    /// The model ran out of output tokens.
    Length,
}

/// Tokens spent. Cache counts are part of `input_tokens`' story but reported apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_read_tokens: u64,
    #[serde(default)]
    pub cache_write_tokens: u64,
}

impl Usage {
    /// Input plus output: what the token budget counts.
    /// Saturates at `u64::MAX`, so a budget still stops a run whatever a provider reports.
    pub fn total(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.output_tokens)
            .saturating_add(self.cache_read_tokens)
            .saturating_add(self.cache_write_tokens)
    }
}

/// Adding saturates at `u64::MAX`: counts never wrap.
impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, o: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(o.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(o.output_tokens);
        self.cache_read_tokens = self.cache_read_tokens.saturating_add(o.cache_read_tokens);
        self.cache_write_tokens = self.cache_write_tokens.saturating_add(o.cache_write_tokens);
    }
}

/// One answer of the model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelResponse {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub finish: FinishReason,
    pub usage: Usage,
    pub reasoning: Option<String>,
}

/// What one step sends: the conversation so far and the tools on offer.
pub struct ModelRequest<'a> {
    pub messages: &'a [Message],
    pub tools: &'a [ToolSpec],
    /// Called with each piece of text as it arrives (streaming providers).
    pub on_text: &'a (dyn Fn(&str) + Send + Sync),
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The model could not be set up: a bad spec, a missing file or key. Exit 2.
    #[error("{0}")]
    Config(String),
    /// The scripted model cannot go on.
    #[error("script model: {0}")]
    Script(String),
    /// The provider answered with an error, or could not be reached.
    #[error("{provider}: {message}")]
    Provider { provider: String, message: String },
    /// The key is missing, wrong, expired or without access (HTTP 401, 403).
    #[error("{provider}: {message}")]
    Authentication { provider: String, message: String },
    /// Still rate limited after every attempt; `retry_after` is what the provider last asked.
    #[error("{provider}: {message}")]
    RateLimited {
        provider: String,
        message: String,
        retry_after: Option<std::time::Duration>,
    },
    /// The conversation no longer fits the model's context window.
    #[error("{provider}: {message}")]
    ContextOverflow { provider: String, message: String },
    /// The model would not or could not answer (refusal, content filter, context window).
    #[error("{0}")]
    Refused(String),
    /// The request body could not be written.
    #[error("cannot encode the request: {0}")]
    Encode(String),
}

impl From<serde_json::Error> for ModelError {
    fn from(e: serde_json::Error) -> Self {
        ModelError::Encode(e.to_string())
    }
}

/// Each message's wire form (`P`), built once. A conversation only grows, so a step builds
/// only what is new. Every entry keeps a copy of the message it was built from and is used
/// only while the conversation still holds an equal message at its place: an edited or
/// replaced message (another conversation, `--fresh`) is rebuilt, never sent stale.
pub struct WireCache<P> {
    entries: Mutex<Vec<(Message, P)>>,
}

impl<P> Default for WireCache<P> {
    fn default() -> Self {
        WireCache {
            entries: Mutex::new(Vec::new()),
        }
    }
}

impl<P> WireCache<P> {
    /// The wire form of every message of `messages`, in order, building what is missing.
    pub fn pieces<'a>(
        &'a self,
        messages: &[Message],
        mut build: impl FnMut(&Message) -> Result<P, ModelError>,
    ) -> Result<MutexGuard<'a, Vec<(Message, P)>>, ModelError> {
        // A poisoned lock only means a panic elsewhere mid-build: start over.
        let mut entries = self.entries.lock().unwrap_or_else(|poisoned| {
            self.entries.clear_poison();
            let mut e = poisoned.into_inner();
            e.clear();
            e
        });
        let valid = entries
            .iter()
            .zip(messages)
            .take_while(|((built_from, _), m)| built_from == *m)
            .count();
        entries.truncate(valid);
        for m in &messages[valid..] {
            let piece = build(m)?;
            entries.push((m.clone(), piece));
        }
        Ok(entries)
    }
}

impl ModelError {
    /// Whether the error is the user's configuration rather than the model failing.
    pub fn is_config(&self) -> bool {
        matches!(self, ModelError::Config(_))
    }
}

#[async_trait]
pub trait Model: Send + Sync {
    /// `PROVIDER:MODEL`, for the trace.
    fn name(&self) -> &str;
    /// Ask the model for its next turn.
    async fn step(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError>;
}

/// Settings for real providers.
#[derive(Clone, Debug, Default)]
pub struct ProviderOptions {
    /// Overrides the provider's base URL (and its environment variable).
    pub base_url: Option<String>,
    pub http: http::HttpOptions,
    /// The output token limit (Anthropic requires one; default 8192).
    pub max_tokens: Option<u32>,
}

const PROVIDERS: &str = "openai, anthropic, deepseek, ollama, script";

fn env(var: &str) -> Option<String> {
    // Keys were moved out of the process environment at start-up.
    crate::tools::sandbox::var(var).filter(|v| !v.trim().is_empty())
}

/// A provider key from the environment, known to the redactor from here on.
fn secret_env(var: &str) -> Option<String> {
    let key = env(var)?;
    crate::redact::add(&key);
    Some(key)
}

/// Where a `script:` model's file is: `rest` from `base_dir`.
fn script_path(rest: &str, base_dir: &Path) -> std::path::PathBuf {
    if base_dir == Path::new(".") {
        Path::new(rest).to_path_buf()
    } else {
        base_dir.join(rest)
    }
}

/// The name the model of `spec` gives itself once built: a `script:` model names its file
/// from `base_dir`, any other model its spec. Reads and makes nothing.
pub fn resolved_name(spec: &str, base_dir: &Path) -> String {
    match spec.split_once(':') {
        Some(("script", rest)) if !rest.trim().is_empty() => {
            format!("script:{}", script_path(rest, base_dir).display())
        }
        _ => spec.to_string(),
    }
}

/// Build a model from `PROVIDER:MODEL`. Relative `script:` paths resolve against `base_dir`.
pub fn from_spec(
    spec: &str,
    base_dir: &Path,
    opts: &ProviderOptions,
) -> Result<Box<dyn Model>, ModelError> {
    let Some((provider, rest)) = spec.split_once(':') else {
        return Err(ModelError::Config(format!(
            "model `{spec}` has no provider: write PROVIDER:MODEL, e.g. `openai:gpt-4o-mini` or \
             `script:turns.json` (providers: {PROVIDERS})"
        )));
    };
    if rest.trim().is_empty() {
        return Err(ModelError::Config(format!(
            "model `{spec}` names no model after `{provider}:`"
        )));
    }
    let client = http::client;
    let base = |var: &str, default: &str| {
        opts.base_url
            .clone()
            .or_else(|| env(var))
            .unwrap_or_else(|| default.to_string())
            .trim_end_matches('/')
            .to_string()
    };
    let chat = |name: &str,
                url_base: String,
                key_var: Option<&'static str>,
                base_var: &'static str,
                dialect: openai::Dialect|
     -> Result<Box<dyn Model>, ModelError> {
        let mut endpoint = http::Endpoint::new(
            name,
            format!("{url_base}/chat/completions"),
            key_var,
            base_var,
        );
        if let Some(key) = key_var.and_then(secret_env) {
            endpoint.header("authorization", &format!("Bearer {key}"), true)?;
        }
        Ok(Box::new(openai::ChatModel {
            name: spec.to_string(),
            model: rest.to_string(),
            endpoint,
            http: opts.http.clone(),
            dialect,
            client: client()?,
            wire: WireCache::default(),
        }))
    };
    let need_key = |var: &str| {
        if env(var).is_none() {
            Err(ModelError::Config(format!(
                "{provider}: no API key: set {var} (or pick another --model)"
            )))
        } else {
            Ok(())
        }
    };
    match provider {
        "script" => Ok(Box::new(script::ScriptModel::load(&script_path(
            rest, base_dir,
        ))?)),
        "openai" => {
            const OPENAI: &str = "https://api.openai.com/v1";
            let url = base("OPENAI_BASE_URL", OPENAI);
            // A compatible server elsewhere may need no key; OpenAI itself does.
            if url == OPENAI {
                need_key("OPENAI_API_KEY")?;
            }
            let dialect = openai::Dialect {
                send_reasoning: false,
                max_tokens_field: if url == OPENAI {
                    "max_completion_tokens"
                } else {
                    "max_tokens"
                },
                max_tokens: opts.max_tokens,
            };
            chat(
                "openai",
                url,
                Some("OPENAI_API_KEY"),
                "OPENAI_BASE_URL",
                dialect,
            )
        }
        "deepseek" => {
            need_key("DEEPSEEK_API_KEY")?;
            let dialect = openai::Dialect {
                send_reasoning: true,
                max_tokens_field: "max_tokens",
                max_tokens: opts.max_tokens,
            };
            let url = base("DEEPSEEK_BASE_URL", "https://api.deepseek.com");
            chat(
                "deepseek",
                url,
                Some("DEEPSEEK_API_KEY"),
                "DEEPSEEK_BASE_URL",
                dialect,
            )
        }
        "ollama" => {
            let dialect = openai::Dialect {
                send_reasoning: false,
                max_tokens_field: "max_tokens",
                max_tokens: opts.max_tokens,
            };
            let url = base("OLLAMA_BASE_URL", "http://localhost:11434/v1");
            chat("ollama", url, None, "OLLAMA_BASE_URL", dialect)
        }
        "anthropic" => {
            need_key("ANTHROPIC_API_KEY")?;
            let url = base("ANTHROPIC_BASE_URL", "https://api.anthropic.com");
            let mut endpoint = http::Endpoint::new(
                "anthropic",
                format!("{url}/v1/messages"),
                Some("ANTHROPIC_API_KEY"),
                "ANTHROPIC_BASE_URL",
            );
            let key = secret_env("ANTHROPIC_API_KEY").unwrap_or_default();
            endpoint.header("x-api-key", &key, true)?;
            endpoint.header("anthropic-version", "2023-06-01", false)?;
            Ok(Box::new(anthropic::MessagesModel {
                name: spec.to_string(),
                model: rest.to_string(),
                max_tokens: opts.max_tokens.unwrap_or(anthropic::DEFAULT_MAX_TOKENS),
                endpoint,
                http: opts.http.clone(),
                client: client()?,
                wire: WireCache::default(),
            }))
        }
        other => Err(ModelError::Config(format!(
            "unknown model provider `{other}` in `{spec}` (providers: {PROVIDERS})"
        ))),
    }
}

#[cfg(test)]
pub(crate) mod sample {
    use super::{Message, ToolCall, ToolResult};

    /// A conversation of `turns` steps with every kind of message and field: system text
    /// (twice), user text, assistant text, tool calls with empty, invalid and valid
    /// arguments, reasoning, error results, an empty result list, quotes and non-ASCII.
    pub fn conversation(turns: usize) -> Vec<Message> {
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
}
