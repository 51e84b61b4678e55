//! The transport shared by the wire protocols: POST a JSON body, retry what is worth
//! retrying (408, 409, 429, 5xx, 529, connection errors, a stream that breaks before any
//! output) with exponential backoff and jitter, honouring `Retry-After` and
//! `retry-after-ms`, within a number of attempts and a total deadline; read the answer whole
//! or as Server-Sent Events with an idle timeout. Errors name the provider, the status, the
//! server's message and what to do. Keys live only in sensitive header values.

use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use super::sse::{SseEvent, SseParser};
use super::windows::{Overflow, overflow};
use super::{ModelError, OnText, Wire, WireCache};

/// Where and how to reach one provider.
#[derive(Clone)]
pub struct Endpoint {
    /// `openai`, `anthropic`, `deepseek`, `ollama`: how errors name it.
    pub(crate) provider: String,
    url: String,
    headers: HeaderMap,
    /// The variable that holds the key, for advice on 401.
    key_var: Option<&'static str>,
    /// The variable that sets the base URL, for advice on 404.
    base_var: &'static str,
}

impl Endpoint {
    pub fn new(
        provider: &str,
        url: String,
        key_var: Option<&'static str>,
        base_var: &'static str,
    ) -> Self {
        Endpoint {
            provider: provider.to_string(),
            url,
            headers: HeaderMap::new(),
            key_var,
            base_var,
        }
    }

    /// Add a header; `secret` values are marked sensitive and never shown.
    pub(crate) fn header(
        &mut self,
        name: &'static str,
        value: &str,
        secret: bool,
    ) -> Result<(), ModelError> {
        let mut v = HeaderValue::from_str(value).map_err(|_| {
            ModelError::Config(format!(
                "{}: the value for header {name} has characters a header cannot carry",
                self.provider
            ))
        })?;
        v.set_sensitive(secret);
        self.headers.insert(HeaderName::from_static(name), v);
        Ok(())
    }
}

/// The HTTP client for model calls to `url`. Redirects are followed only within the same
/// origin (scheme, host and port): the key headers must never reach another server, whichever
/// protocol's header carries them. So a client of a plain `http://` server never speaks TLS
/// (unless through a proxy), and is built without the system's root certificates: reading
/// them was a third of a run's start-up.
pub(crate) fn client(url: &str) -> Result<reqwest::Client, ModelError> {
    let policy = reqwest::redirect::Policy::custom(|attempt| {
        let same_origin = attempt.previous().first().is_some_and(|first| {
            let to = attempt.url();
            first.scheme() == to.scheme()
                && first.host_str() == to.host_str()
                && first.port_or_known_default() == to.port_or_known_default()
        });
        if attempt.previous().len() > 5 {
            attempt.error("more than 5 redirects")
        } else if same_origin {
            attempt.follow()
        } else {
            let to = attempt.url().to_string();
            attempt.error(format!(
                "the server redirected to another origin ({to}); model calls never follow a \
                 redirect to another origin, so that the API key is not sent there. Point the \
                 base URL at the final address"
            ))
        }
    });
    // reqwest is built without a default TLS provider; ring is ours. Installing twice is
    // refused harmlessly.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let plain = url
        .get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
        && ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"]
            .iter()
            .all(|v| std::env::var_os(v).is_none());
    let builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(15))
        .redirect(policy);
    let builder = if plain {
        builder.tls_certs_only(Vec::new())
    } else {
        builder
    };
    builder
        .build()
        .map_err(|e| ModelError::Config(format!("cannot set up the HTTP client: {e}")))
}

/// Timeouts and retries.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    pub stream: bool,
    /// Until the response headers arrive (and, unstreamed, the whole body).
    pub request_timeout: Duration,
    /// The longest a stream may stay silent.
    pub idle_timeout: Duration,
    pub max_attempts: u32,
    /// All attempts and waits together.
    pub deadline: Duration,
    /// Bytes of text (answer, reasoning and tool-call arguments) one model turn may have.
    pub max_turn_bytes: usize,
}

/// The default limit of one model turn: 8 MB of text.
pub(crate) const MAX_TURN_BYTES: usize = 8 * 1024 * 1024;

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            stream: true,
            request_timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(120),
            max_attempts: 5,
            deadline: Duration::from_secs(900),
            max_turn_bytes: MAX_TURN_BYTES,
        }
    }
}

/// A decoding failure: whether another attempt could help (only before any output).
#[derive(Debug)]
pub struct DecodeError {
    pub(crate) message: String,
    pub(crate) retryable: bool,
}

impl DecodeError {
    pub(crate) fn fatal(message: impl Into<String>) -> Self {
        DecodeError {
            message: message.into(),
            retryable: false,
        }
    }
}

/// Turns one protocol's answer into our response, streamed or whole.
pub trait Decoder: Send {
    /// Forget everything: a new attempt begins.
    fn reset(&mut self);
    /// One streamed event.
    fn event(&mut self, event: &SseEvent, on_text: &OnText<'_>) -> Result<(), DecodeError>;
    /// A whole (unstreamed) answer.
    fn body(&mut self, body: Value) -> Result<(), DecodeError>;
    /// Whether any output (text or tool call) has arrived in this attempt.
    fn had_output(&self) -> bool;
    /// Whether the answer is complete (a finish reason, `[DONE]`, `message_stop`).
    fn complete(&self) -> bool;
    /// Bytes of text held so far (answer, reasoning, tool-call arguments).
    fn size(&self) -> usize {
        0
    }
}

#[derive(Default)]
struct Failure {
    retryable: bool,
    wait: Option<Duration>,
    message: String,
    status: Option<StatusCode>,
    /// The error body says the request is past the context window.
    overflow: Option<Overflow>,
}

impl Failure {
    fn retry(message: String) -> Self {
        Failure {
            retryable: true,
            message,
            ..Failure::default()
        }
    }

    /// What failed, with the status and the URL when the server answered.
    fn what(&self, ep: &Endpoint) -> String {
        match self.status {
            Some(status) => format!("HTTP {status} from {}: {}", ep.url, sentence(&self.message)),
            None => self.message.clone(),
        }
    }
}

/// `text` as a sentence of its own: servers seldom end their messages with a period, and
/// sup's advice follows.
fn sentence(text: &str) -> String {
    let text = text.trim_end();
    if text.ends_with(['.', '!', '?']) {
        text.to_string()
    } else {
        format!("{text}.")
    }
}

/// Seconds as a duration; beyond what a `Duration` holds it is `Duration::MAX`.
fn seconds(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

/// The wait a response asks for: `retry-after-ms`, or `Retry-After` in seconds or as an
/// HTTP date. Any number parses: a wait too long to hold is `Duration::MAX`, which is past
/// every deadline.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|ms| !ms.is_nan() && *ms >= 0.0)
    {
        return Some(seconds(ms / 1000.0));
    }
    let value = headers.get("retry-after")?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return (!secs.is_nan() && secs >= 0.0).then(|| seconds(secs));
    }
    let when = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = when.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(wait.to_std().unwrap_or(Duration::ZERO))
}

fn backoff(attempt: u32) -> Duration {
    let base = 0.5 * 2f64.powi(attempt.saturating_sub(1).min(10) as i32);
    seconds(base.min(30.0) * (0.5 + fastrand::f64() * 0.5))
}

fn retryable_status(s: StatusCode) -> bool {
    matches!(s.as_u16(), 408 | 409 | 429 | 500 | 502 | 503 | 504 | 529)
}

/// The server's own words from an error body: `error.message` (both protocols), or the text.
pub(crate) fn server_message(body: &str) -> String {
    let from_json = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error"))
            .and_then(|m| m.as_str().map(str::to_string))
    });
    let text = from_json.unwrap_or_else(|| body.trim().to_string());
    let text: String = crate::redact::text(&text).chars().take(600).collect();
    if text.is_empty() {
        "(no message)".into()
    } else {
        text
    }
}

fn advice(ep: &Endpoint, status: StatusCode, overflow: Option<Overflow>, attempts: u32) -> String {
    match status.as_u16() {
        401 => match ep.key_var {
            Some(var) => format!("Check {var}: the key is missing, wrong or expired."),
            None => "This server wants a key, and this provider sends none.".into(),
        },
        403 => {
            "The key has no access to this model or endpoint; check the account and the model name."
                .into()
        }
        404 => format!(
            "Check the model name and the base URL ({} or --base-url).",
            ep.base_var
        ),
        400 | 413 | 422 if overflow.is_some() => format!(
            "The conversation no longer fits the model's context window{}: sup compacts it \
             when it can; otherwise lower --output-cap, set --context-window, or use a model \
             with a larger window.",
            overflow
                .and_then(|o| o.window)
                .map(|n| format!(" of {n} tokens"))
                .unwrap_or_default()
        ),
        400 | 422 => "The server rejected the request; it is not retried.".into(),
        429 => format!("Still rate limited after {attempts} attempts; wait, or lower the load."),
        _ => {
            format!("The provider is failing (gave up after {attempts} attempts); try again later.")
        }
    }
}

/// A wait as a person reads it; an absurd one is just "longer than a year".
fn shown_wait(wait: Duration) -> String {
    if wait > Duration::from_secs(366 * 24 * 3600) {
        "longer than a year".into()
    } else {
        humantime::format_duration(Duration::from_secs(wait.as_secs())).to_string()
    }
}

/// How a model reaches its provider: the endpoint, the options and the client.
pub struct Transport {
    pub endpoint: Endpoint,
    pub http: HttpOptions,
    client: reqwest::Client,
    /// A stream of this server's did not end within `LINGER` of its complete answer: its
    /// streams are not waited for again.
    slow_end: std::sync::atomic::AtomicBool,
}

/// How long a stream whose answer is complete may take to end (the body's last chunk) before
/// it is dropped, closing the connection.
const LINGER: Duration = Duration::from_millis(250);

/// What a stream may still send after its complete answer, at most, to be read to its end.
const MAX_TRAILING: usize = 64 * 1024;

impl Transport {
    /// A transport to `endpoint` through `client()`, which keeps redirects to its origin.
    pub fn new(endpoint: Endpoint, http: HttpOptions) -> Result<Self, ModelError> {
        Ok(Transport {
            client: client(&endpoint.url)?,
            endpoint,
            http,
            slow_end: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Send the body of `wire` (`exchange`), then give it back to `cache` for the next step,
    /// whether it went through or not.
    pub(crate) async fn send<S: Default>(
        &self,
        cache: &WireCache<S>,
        (wire, body): (Wire<S>, bytes::Bytes),
        decoder: &mut dyn Decoder,
        on_text: &OnText<'_>,
    ) -> Result<(), ModelError> {
        let sent = self.exchange(&body, decoder, on_text).await;
        cache.put(wire, body);
        sent
    }

    /// POST `body` (JSON) and decode the answer, retrying as the module doc says.
    async fn exchange(
        &self,
        body: &bytes::Bytes,
        decoder: &mut dyn Decoder,
        on_text: &OnText<'_>,
    ) -> Result<(), ModelError> {
        let (ep, opts) = (&self.endpoint, &self.http);
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            attempt += 1;
            decoder.reset();
            // One deadline per attempt, streamed answer included: keep-alive comments reset the
            // idle timeout but never this.
            let limit = opts
                .request_timeout
                .min(opts.deadline.saturating_sub(started.elapsed()));
            let once = self.attempt_once(body, decoder, on_text);
            let failure = match tokio::time::timeout(limit, once).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(f)) => f,
                Err(_) => Failure {
                    retryable: !decoder.had_output(),
                    message: format!(
                        "the answer from {} did not finish within {}{}",
                        ep.url,
                        humantime::format_duration(limit),
                        if decoder.had_output() {
                            "; what arrived is kept in the transcript"
                        } else {
                            ""
                        }
                    ),
                    ..Failure::default()
                },
            };
            let wait = failure.wait.unwrap_or_else(|| backoff(attempt));
            let in_time = started.elapsed().saturating_add(wait) <= opts.deadline;
            if failure.retryable && failure.wait.is_some() && !in_time {
                // The server asks for a wait past this request's deadline: give up now.
                return Err(ModelError::Provider {
                    provider: ep.provider.clone(),
                    message: format!(
                        "{} The server asks to wait {} before trying again, past the \
                     deadline of this request ({}); gave up after {attempt} attempt(s).",
                        sentence(&failure.what(ep)),
                        shown_wait(wait),
                        humantime::format_duration(opts.deadline)
                    ),
                });
            }
            if failure.retryable && attempt < opts.max_attempts && in_time {
                // Briefly: the status, the URL and the server's words; a connection's whole
                // error is said once, when the last attempt fails.
                let brief = match failure.status {
                    Some(_) => failure.what(ep).trim_end_matches('.').to_string(),
                    None => format!(
                        "{} ({})",
                        failure.message.split(": ").next().unwrap_or_default(),
                        ep.url
                    ),
                };
                tracing::warn!(
                    "{}: {brief}; attempt {attempt} of {} failed, retrying in {:.1}s",
                    ep.provider,
                    opts.max_attempts,
                    wait.as_secs_f64()
                );
                tokio::time::sleep(wait).await;
                continue;
            }
            let retry_after = failure.wait;
            let kind = failure.status.map(|s| s.as_u16());
            let overflow = failure.overflow;
            let message = match failure.status {
                Some(status) => format!(
                    "{} {}",
                    failure.what(ep),
                    advice(ep, status, overflow, attempt)
                ),
                None if failure.retryable => format!(
                    "{} (gave up after {attempt} attempts{})",
                    failure.message,
                    if in_time {
                        ""
                    } else {
                        " and the retry deadline"
                    }
                ),
                None => failure.message,
            };
            let provider = ep.provider.clone();
            return Err(match kind {
                Some(401 | 403) => ModelError::Authentication { provider, message },
                Some(429) => ModelError::RateLimited {
                    provider,
                    message,
                    retry_after,
                },
                Some(400 | 413 | 422) if overflow.is_some() => ModelError::ContextOverflow {
                    provider,
                    message,
                    window: overflow.and_then(|o| o.window),
                },
                _ => ModelError::Provider { provider, message },
            });
        }
    }

    async fn attempt_once(
        &self,
        body: &bytes::Bytes,
        decoder: &mut dyn Decoder,
        on_text: &OnText<'_>,
    ) -> Result<(), Failure> {
        let (client, ep, opts) = (&self.client, &self.endpoint, &self.http);
        let request = client
            .post(&ep.url)
            .headers(ep.headers.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone());
        let response = match tokio::time::timeout(opts.request_timeout, request.send()).await {
            Err(_) => {
                return Err(Failure::retry(format!(
                    "no answer from {} within {}",
                    ep.url,
                    humantime::format_duration(opts.request_timeout)
                )));
            }
            Ok(Err(e)) if e.is_redirect() => {
                return Err(Failure {
                    message: format!("{}: {}", ep.url, plain(&e)),
                    ..Failure::default()
                });
            }
            Ok(Err(e)) => {
                return Err(Failure::retry(format!(
                    "cannot reach {}: {}",
                    ep.url,
                    plain(&e)
                )));
            }
            Ok(Ok(r)) => r,
        };
        let status = response.status();
        if !status.is_success() {
            let wait = retry_after(response.headers());
            let text = error_body(response).await;
            return Err(Failure {
                retryable: retryable_status(status),
                wait,
                message: server_message(&text),
                status: Some(status),
                overflow: matches!(status.as_u16(), 400 | 413 | 422)
                    .then(|| overflow(&text))
                    .flatten(),
            });
        }
        let too_big = || Failure {
            message: format!(
                "the model's turn is larger than {} of text (the limit of one turn); the run \
             stops here rather than hold a runaway answer",
                shown_bytes(opts.max_turn_bytes)
            ),
            ..Failure::default()
        };
        if !opts.stream {
            // JSON framing of a whole answer is small next to its text: twice the limit holds it.
            let max_body = opts
                .max_turn_bytes
                .saturating_mul(2)
                .saturating_add(64 * 1024);
            let mut response = response;
            let mut bytes = Vec::new();
            loop {
                match response.chunk().await {
                    Ok(Some(chunk)) => {
                        if bytes.len().saturating_add(chunk.len()) > max_body {
                            return Err(too_big());
                        }
                        bytes.extend_from_slice(&chunk);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        return Err(Failure::retry(format!(
                            "reading the answer from {} failed: {}",
                            ep.url,
                            plain(&e)
                        )));
                    }
                }
            }
            let text = String::from_utf8_lossy(&bytes);
            let json: Value = serde_json::from_str(&text).map_err(|e| Failure {
                message: format!(
                    "the answer from {} is not JSON ({e}): {}",
                    ep.url,
                    server_message(&text)
                ),
                ..Failure::default()
            })?;
            decoder.body(json).map_err(|e| Failure {
                retryable: e.retryable,
                message: e.message,
                ..Failure::default()
            })?;
            if decoder.size() > opts.max_turn_bytes {
                return Err(too_big());
            }
            return Ok(());
        }
        let mut stream = response.bytes_stream();
        let mut parser = SseParser::with_max_line(opts.max_turn_bytes.saturating_add(64 * 1024));
        let mut events = Vec::new();
        let broken = |decoder: &dyn Decoder, what: String| Failure {
            retryable: !decoder.had_output(),
            message: if decoder.had_output() {
                format!(
                    "{what} in the middle of the answer; what arrived is kept in the transcript"
                )
            } else {
                what
            },
            ..Failure::default()
        };
        loop {
            let next = match tokio::time::timeout(opts.idle_timeout, stream.next()).await {
                Err(_) => {
                    return Err(broken(
                        decoder,
                        format!(
                            "the stream from {} sent nothing for {}",
                            ep.url,
                            humantime::format_duration(opts.idle_timeout)
                        ),
                    ));
                }
                Ok(n) => n,
            };
            let ended = next.is_none();
            match next {
                Some(Ok(bytes)) => {
                    if parser.feed(&bytes, &mut events).is_err() {
                        return Err(too_big());
                    }
                }
                Some(Err(e)) => {
                    return Err(broken(
                        decoder,
                        format!("the connection to {} dropped: {}", ep.url, plain(&e)),
                    ));
                }
                None => parser.finish(&mut events),
            }
            for event in events.drain(..) {
                decoder.event(&event, on_text).map_err(|e| Failure {
                    retryable: e.retryable && !decoder.had_output(),
                    message: e.message,
                    ..Failure::default()
                })?;
                if decoder.size() > opts.max_turn_bytes {
                    return Err(too_big());
                }
            }
            if decoder.complete() {
                if !ended {
                    self.read_to_end(&mut stream).await;
                }
                return Ok(());
            }
            if ended {
                return Err(broken(
                    decoder,
                    format!(
                        "the stream from {} ended before the answer was complete",
                        ep.url
                    ),
                ));
            }
        }
    }

    /// Read what is left of a stream whose answer is complete, so that its connection is kept
    /// for the next step: many servers write the body's end (the last, empty chunk) apart
    /// from the last event, and a body dropped before its end closes the connection. At most
    /// `MAX_TRAILING` bytes within `LINGER`; a server that does not end in time is not waited
    /// for again.
    async fn read_to_end(
        &self,
        stream: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    ) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.slow_end.load(Relaxed) {
            return;
        }
        let rest = async {
            let mut left = MAX_TRAILING;
            while let Some(Ok(chunk)) = stream.next().await {
                left = match left.checked_sub(chunk.len()) {
                    Some(left) => left,
                    None => return false,
                };
            }
            true
        };
        if !matches!(tokio::time::timeout(LINGER, rest).await, Ok(true)) {
            tracing::debug!(
                "{}: a stream did not end after its answer",
                self.endpoint.url
            );
            self.slow_end.store(true, Relaxed);
        }
    }
}

/// The first 64 KB of an error response's body: enough for any message, bounded for any
/// server.
async fn error_body(mut response: reqwest::Response) -> String {
    const MAX: usize = 64 * 1024;
    let mut bytes = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        bytes.extend_from_slice(&chunk[..chunk.len().min(MAX - bytes.len())]);
        if bytes.len() >= MAX {
            break;
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn shown_bytes(n: usize) -> String {
    if n >= 1024 * 1024 && n.is_multiple_of(1024 * 1024) {
        format!("{} MB", n / (1024 * 1024))
    } else {
        format!("{n} bytes")
    }
}

/// A reqwest error with its causes.
fn plain(e: &reqwest::Error) -> String {
    // The URL is named by the caller already.
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(&format!(" for url ({url})"), "");
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_in_every_form() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", HeaderValue::from_static("150"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(150)));
        let mut h = HeaderMap::new();
        let date = (chrono::Utc::now() + chrono::Duration::seconds(30)).to_rfc2822();
        h.insert("retry-after", HeaderValue::from_str(&date).unwrap());
        let wait = retry_after(&h).unwrap();
        assert!(
            wait > Duration::from_secs(25) && wait <= Duration::from_secs(30),
            "{wait:?}"
        );
        h.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
    }

    #[test]
    fn server_messages_from_both_protocols() {
        assert_eq!(
            server_message(
                r#"{"error":{"message":"Incorrect API key","type":"invalid_request_error"}}"#
            ),
            "Incorrect API key"
        );
        assert_eq!(
            server_message(
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
            ),
            "Overloaded"
        );
        assert_eq!(server_message("Bad Gateway"), "Bad Gateway");
    }
}
