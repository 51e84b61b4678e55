//! The model seam: provider-neutral messages and tool specs, the `Model` trait with its one
//! async step, token usage, the conversation (appended to, its rewrites marked), the request
//! body kept between steps that the protocols extend by what is new, and `from_spec`, which turns `PROVIDER:MODEL` into a model.

pub mod anthropic;
pub mod http;
pub mod openai;
pub mod prices;
pub mod record;
pub mod script;
pub mod sse;
pub mod windows;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
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
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) arguments: String,
}

impl ToolCall {
    /// A call as a model would propose it (models outside the crate: benches, tests).
    pub fn new(id: &str, name: &str, arguments: &str) -> Self {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }
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
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    #[serde(default)]
    pub(crate) cache_read_tokens: u64,
    #[serde(default)]
    pub(crate) cache_write_tokens: u64,
}

impl Usage {
    /// Input plus output: what the token budget counts.
    /// Saturates at `u64::MAX`, so a budget still stops a run whatever a provider reports.
    pub(crate) fn total(&self) -> u64 {
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

/// What is called with each piece of an answer's text as it arrives.
pub type OnText<'a> = dyn Fn(&str) + Send + Sync + 'a;

/// What one step sends: the conversation so far and the tools on offer.
pub struct ModelRequest<'a> {
    pub messages: &'a Conversation,
    pub tools: &'a [ToolSpec],
    /// Called with each piece of text as it arrives (streaming providers).
    pub on_text: &'a OnText<'a>,
    /// Ask for the answer as one JSON object of this schema where the protocol offers it
    /// (Chat Completions `response_format`; Anthropic a prefilled `{`); `None` for agent turns.
    pub json_schema: Option<&'a Value>,
    /// The most output tokens this request may ask for (the room the window leaves), when
    /// known: the model's own limit is lowered to it.
    pub max_output: Option<u32>,
    /// Where a step that ends without its answer (an error, a timeout, a broken stream, or
    /// the step dropped on Ctrl-C) leaves what arrived of it.
    pub partial: Option<&'a PartialSlot>,
}

/// What arrived of an answer that did not finish: text, tool calls (their arguments perhaps
/// cut), and the usage known so far.
pub type PartialSlot = Mutex<Option<ModelResponse>>;

/// A decoder that, unless `done` is called, leaves what it holds in the request's partial
/// slot when it goes: on an error returned, and on the step's future dropped mid-stream.
pub(crate) struct KeepPartial<'a, D> {
    decoder: D,
    slot: Option<&'a PartialSlot>,
    answer: fn(&D) -> Option<ModelResponse>,
}

impl<'a, D> KeepPartial<'a, D> {
    pub(crate) fn new(
        decoder: D,
        slot: Option<&'a PartialSlot>,
        answer: fn(&D) -> Option<ModelResponse>,
    ) -> Self {
        KeepPartial {
            decoder,
            slot,
            answer,
        }
    }

    /// The answer is complete: nothing is left as partial.
    pub(crate) fn done(mut self) -> D
    where
        D: Default,
    {
        self.slot = None;
        std::mem::take(&mut self.decoder)
    }
}

impl<D> Drop for KeepPartial<'_, D> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot
            && let Some(answer) = (self.answer)(&self.decoder)
        {
            let mut kept = slot.lock().unwrap_or_else(PoisonError::into_inner);
            // A continuation's part adds to what came before it.
            match kept.as_mut() {
                Some(before) => {
                    before.text.push_str(&answer.text);
                    before.tool_calls.extend(answer.tool_calls);
                    before.usage += answer.usage;
                }
                None => *kept = Some(answer),
            }
        }
    }
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
    /// The conversation no longer fits the model's context window; `window` is the window's
    /// size when the error names it (llama.cpp's `n_ctx`, "maximum context length is N").
    #[error("{provider}: {message}")]
    ContextOverflow {
        provider: String,
        message: String,
        window: Option<u64>,
    },
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

/// A conversation. Messages are only appended to it, except through [`Conversation::clear`]
/// and [`Conversation::rewrite`], which give it a new generation. A generation is never
/// reused, in this conversation or any other: so (generation, length) names the first
/// `length` messages of it for good, and a request body kept from an earlier step is known
/// to be still valid without reading the messages again.
#[derive(Debug)]
pub struct Conversation {
    messages: Vec<Message>,
    generation: u64,
    /// What `prices::message_bytes` counts, summed over the messages.
    bytes: usize,
}

fn next_generation() -> u64 {
    static GENERATIONS: AtomicU64 = AtomicU64::new(0);
    GENERATIONS.fetch_add(1, Ordering::Relaxed)
}

impl Conversation {
    pub fn new() -> Self {
        Self::from(Vec::new())
    }

    pub(crate) fn push(&mut self, message: Message) {
        self.bytes += prices::message_bytes(&message);
        self.messages.push(message);
    }

    /// Start over: a new generation.
    pub(crate) fn clear(&mut self) {
        self.rewrite(Vec::clear);
    }

    /// Change messages already in the conversation (edit, remove, trim): a new generation,
    /// so what was built from the old messages is built again.
    pub(crate) fn rewrite(&mut self, change: impl FnOnce(&mut Vec<Message>)) {
        change(&mut self.messages);
        self.generation = next_generation();
        self.bytes = self.messages.iter().map(prices::message_bytes).sum();
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Bytes of message text (`prices::message_bytes`), kept as messages come.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Default for Conversation {
    fn default() -> Self {
        Self::new()
    }
}

/// A copy is another conversation: a generation of its own.
impl Clone for Conversation {
    fn clone(&self) -> Self {
        Self::from(self.messages.clone())
    }
}

impl From<Vec<Message>> for Conversation {
    fn from(messages: Vec<Message>) -> Self {
        Conversation {
            bytes: messages.iter().map(prices::message_bytes).sum(),
            messages,
            generation: next_generation(),
        }
    }
}

impl std::ops::Deref for Conversation {
    type Target = [Message];
    fn deref(&self) -> &[Message] {
        &self.messages
    }
}

/// The request body of a conversation so far, kept between steps: every message's wire JSON
/// in one buffer, written once, and what the protocol needs to go on writing (`S`). A step
/// writes only the messages appended since; a conversation of another generation (cleared,
/// rewritten, another conversation) is written anew. It is the one copy of the
/// conversation's wire form: the body a step sends is this buffer with the request's tail,
/// lent to the transport and taken back after.
pub struct WireCache<S> {
    kept: Mutex<Option<Wire<S>>>,
    /// The tools as last written (a run's tools do not change from step to step).
    tools: Mutex<Option<(Vec<ToolSpec>, Bytes)>>,
}

impl<S> Default for WireCache<S> {
    fn default() -> Self {
        WireCache {
            kept: Mutex::new(None),
            tools: Mutex::new(None),
        }
    }
}

impl<S> WireCache<S> {
    /// `tools` as `write` writes them, kept for the next request with the same tools.
    pub(crate) fn tools(
        &self,
        tools: &[ToolSpec],
        write: impl FnOnce(&[ToolSpec]) -> Result<Vec<u8>, ModelError>,
    ) -> Result<Bytes, ModelError> {
        let mut kept = self.tools.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((same, json)) = kept.as_ref()
            && same.as_slice() == tools
        {
            return Ok(json.clone());
        }
        let json = Bytes::from(write(tools)?);
        *kept = Some((tools.to_vec(), json.clone()));
        Ok(json)
    }
}

/// The body of one conversation up to the end of its `len` first messages.
pub(crate) struct Wire<S> {
    generation: u64,
    len: usize,
    /// Where the messages end, once the tail is written.
    end: usize,
    buf: BytesMut,
    state: S,
}

impl<S: Default> Wire<S> {
    /// The body of `conversation`, written from nothing.
    pub(crate) fn new(
        conversation: &Conversation,
        open: impl FnOnce(&mut BytesMut) -> Result<(), ModelError>,
        append: impl FnMut(&mut BytesMut, &mut S, &Message) -> Result<(), ModelError>,
    ) -> Result<Self, ModelError> {
        let mut wire = Wire {
            generation: conversation.generation(),
            len: 0,
            end: 0,
            buf: BytesMut::new(),
            state: S::default(),
        };
        open(&mut wire.buf)?;
        wire.extend(conversation, append)?;
        Ok(wire)
    }

    fn extend(
        &mut self,
        conversation: &Conversation,
        mut append: impl FnMut(&mut BytesMut, &mut S, &Message) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        for m in &conversation[self.len..] {
            append(&mut self.buf, &mut self.state, m)?;
            self.len += 1;
        }
        Ok(())
    }

    /// The whole body: the messages, then what `tail` writes. The buffer goes with it, to
    /// come back through `WireCache::put`.
    pub(crate) fn body(
        &mut self,
        tail: impl FnOnce(&mut BytesMut, &S) -> Result<(), ModelError>,
    ) -> Result<Bytes, ModelError> {
        self.end = self.buf.len();
        if let Err(e) = tail(&mut self.buf, &self.state) {
            self.buf.truncate(self.end);
            return Err(e);
        }
        Ok(std::mem::take(&mut self.buf).freeze())
    }
}

impl<S: Default> WireCache<S> {
    /// The kept body of `conversation`, brought up to date by `append`, or written anew
    /// (`open`, then `append` for every message) when what is kept is of another generation.
    /// Give it back with `put` once sent; until then, another step writes its own.
    pub(crate) fn take(
        &self,
        conversation: &Conversation,
        open: impl FnOnce(&mut BytesMut) -> Result<(), ModelError>,
        append: impl FnMut(&mut BytesMut, &mut S, &Message) -> Result<(), ModelError>,
    ) -> Result<Wire<S>, ModelError> {
        // Nothing can panic while the lock is held: a poisoned lock holds nothing half-done.
        let kept = self
            .kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .filter(|w| w.generation == conversation.generation() && w.len <= conversation.len());
        match kept {
            Some(mut wire) => {
                wire.extend(conversation, append)?;
                Ok(wire)
            }
            None => Wire::new(conversation, open, append),
        }
    }

    /// Keep `wire` for the next step, with `body` (from `wire.body`) back as its buffer, the
    /// tail cut off. The buffer is the body's own unless the transport still holds the body;
    /// then the messages are copied once.
    pub(crate) fn put(&self, mut wire: Wire<S>, body: Bytes) {
        wire.buf = match body.try_into_mut() {
            Ok(mut buf) => {
                buf.truncate(wire.end);
                buf
            }
            Err(body) => BytesMut::from(&body[..wire.end]),
        };
        *self.kept.lock().unwrap_or_else(PoisonError::into_inner) = Some(wire);
    }
}

/// The start of a request body, the same in both protocols: `{"model":…,"messages":[`.
pub(crate) fn open_body(out: &mut BytesMut, model: &str) -> Result<(), ModelError> {
    use bytes::BufMut;
    out.extend_from_slice(b"{\"model\":");
    serde_json::to_writer(out.writer(), model)?;
    out.extend_from_slice(b",\"messages\":[");
    Ok(())
}

/// The end of a request body's messages, and whether the answer streams: `],"stream":…`.
pub(crate) fn end_messages(out: &mut BytesMut, stream: bool) {
    out.extend_from_slice(if stream {
        &b"],\"stream\":true"[..]
    } else {
        &b"],\"stream\":false"[..]
    });
}

impl ModelError {
    /// Whether the error is the user's configuration rather than the model failing.
    pub(crate) fn is_config(&self) -> bool {
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
    /// The output token limit of every request (default [`DEFAULT_MAX_TOKENS`]).
    pub max_tokens: Option<u32>,
}

/// The output limit a request carries unless one is set: no answer runs on unbounded
/// (llama-server's own default is no limit at all), and Anthropic requires one.
pub const DEFAULT_MAX_TOKENS: u32 = 8192;

const PROVIDERS: &str = "openai, anthropic, deepseek, ollama, script";

fn env(var: &str) -> Option<String> {
    // Keys were moved out of the process environment at start-up.
    crate::startup::var(var).filter(|v| !v.trim().is_empty())
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
pub(crate) fn resolved_name(spec: &str, base_dir: &Path) -> String {
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
            transport: http::Transport::new(endpoint, opts.http.clone())?,
            dialect,
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
                max_tokens: Some(opts.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
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
                max_tokens: Some(opts.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
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
                max_tokens: Some(opts.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
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
                max_tokens: opts.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
                transport: http::Transport::new(endpoint, opts.http.clone())?,
                wire: WireCache::default(),
            }))
        }
        other => Err(ModelError::Config(format!(
            "unknown model provider `{other}` in `{spec}` (providers: {PROVIDERS})"
        ))),
    }
}

#[cfg(test)]
pub(crate) mod sample;

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn open(out: &mut BytesMut) -> Result<(), ModelError> {
        out.extend_from_slice(b"[");
        Ok(())
    }

    fn append(out: &mut BytesMut, n: &mut usize, m: &Message) -> Result<(), ModelError> {
        if *n > 0 {
            out.extend_from_slice(b",");
        }
        *n += 1;
        serde_json::to_writer(out.writer(), m)?;
        Ok(())
    }

    fn close(out: &mut BytesMut, _: &usize) -> Result<(), ModelError> {
        out.extend_from_slice(b"]");
        Ok(())
    }

    /// The body a step sends is the kept buffer itself, lent to the transport and taken back:
    /// the next step writes on after the messages, copying nothing; a body the transport
    /// still holds is left to it, and the messages are copied once.
    #[test]
    fn the_body_is_lent_and_taken_back_not_copied() {
        let cache = WireCache::default();
        let mut messages = Conversation::from(sample::conversation(2));
        let mut wire = cache.take(&messages, open, append).unwrap();
        let body = wire.body(close).unwrap();
        let at = body.as_ptr();
        let sent: Vec<Message> = serde_json::from_slice(&body).unwrap();
        assert_eq!(sent, *messages);
        cache.put(wire, body);
        let mut wire = cache.take(&messages, open, append).unwrap();
        assert_eq!(wire.buf.as_ptr(), at, "the same buffer, not a copy");
        assert_eq!(wire.buf.last(), Some(&b'}'), "the tail is cut off");
        let body = wire.body(close).unwrap();
        let held = body.clone();
        cache.put(wire, body);
        messages.push(Message::User {
            content: "more".into(),
        });
        let mut wire = cache.take(&messages, open, append).unwrap();
        assert_ne!(wire.buf.as_ptr(), at, "the held body is not written over");
        let body = wire.body(close).unwrap();
        assert_eq!(
            serde_json::from_slice::<Vec<Message>>(&body).unwrap(),
            *messages
        );
        let before: Vec<Message> = serde_json::from_slice(&held).unwrap();
        assert_eq!(before, messages[..messages.len() - 1]);
    }

    /// What a conversation counts of its text follows every change.
    #[test]
    fn a_conversation_keeps_its_size_and_marks_rewrites() {
        let mut c = Conversation::from(sample::conversation(3));
        let count = |c: &Conversation| c.iter().map(prices::message_bytes).sum::<usize>();
        assert_eq!(c.bytes(), count(&c));
        let generation = c.generation();
        c.push(Message::User {
            content: "12345".into(),
        });
        assert_eq!(c.generation(), generation, "appending keeps the generation");
        assert_eq!(c.bytes(), count(&c));
        c.rewrite(|m| m.truncate(3));
        assert_ne!(c.generation(), generation);
        assert_eq!(c.bytes(), count(&c));
        let copy = c.clone();
        assert_ne!(
            copy.generation(),
            c.generation(),
            "a copy is another conversation"
        );
        let generation = c.generation();
        c.clear();
        assert_ne!(c.generation(), generation);
        assert_eq!(c.bytes(), 0);
    }
}
