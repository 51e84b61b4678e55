//! The OTLP/HTTP trace wire, written by hand: finished spans, their two encodings (protobuf
//! and the OTLP JSON mapping) of one `ExportTraceServiceRequest`, and the exporter thread
//! that batches spans and posts them. The messages are few and of fixed shape; the SDK, its
//! generated protobuf code and its metrics were a sixth of a clean release build.

use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio::time::Instant;

use serde_json::{Value as Json, json};

/// How the spans go on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// `http/protobuf`
    Protobuf,
    /// `http/json`
    Json,
}

impl Protocol {
    fn content_type(self) -> &'static str {
        match self {
            Protocol::Protobuf => "application/x-protobuf",
            Protocol::Json => "application/json",
        }
    }
}

/// `Span.SpanKind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Internal = 1,
    Client = 3,
}

/// An attribute's value (`AnyValue`, as far as sup uses it).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Text(String),
    Int(i64),
    Bool(bool),
    Double(f64),
    Texts(Vec<String>),
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_string())
    }
}

/// `From` each type for the variant that holds it.
macro_rules! value_from {
    ($($t:ty => $variant:ident),*) => {
        $(impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::$variant(v)
            }
        })*
    };
}

value_from!(String => Text, i64 => Int, bool => Bool, f64 => Double);

/// Where a span is: its trace and its own id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ids {
    trace: u128,
    span: u64,
}

/// A span, open while `end` is `None`.
#[derive(Clone, Debug)]
pub(crate) struct Span {
    pub(crate) ids: Ids,
    parent: Option<u64>,
    name: String,
    kind: Kind,
    start: SystemTime,
    pub(crate) end: SystemTime,
    attributes: Vec<(&'static str, Value)>,
    /// The error status's message; `None` is status unset.
    pub(crate) error: Option<String>,
}

impl Span {
    /// A span starting at `start`, under `parent` (a new trace without one).
    pub(crate) fn start(parent: Option<Ids>, name: String, kind: Kind, start: SystemTime) -> Self {
        let ids = Ids {
            trace: parent.map_or_else(|| fastrand::u128(1..), |p| p.trace),
            span: fastrand::u64(1..),
        };
        Span {
            ids,
            parent: parent.map(|p| p.span),
            name,
            kind,
            start,
            end: start,
            attributes: Vec::new(),
            error: None,
        }
    }

    /// Set `key`, replacing an earlier value of it.
    pub(crate) fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        let value = value.into();
        match self.attributes.iter_mut().find(|(k, _)| *k == key) {
            Some(kv) => kv.1 = value,
            None => self.attributes.push((key, value)),
        }
    }
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// W3C trace flags: sampled; and the parent is known not to be remote (bits 8 and 9).
const FLAGS: u32 = 0x101;

// ---- protobuf ----

fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn key(buf: &mut Vec<u8>, field: u32, wire: u8) {
    varint(buf, (u64::from(field) << 3) | u64::from(wire));
}

fn len_field(buf: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    key(buf, field, 2);
    varint(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

/// A nested message, written by `write` into its own buffer first (for its length).
fn message(buf: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    write(&mut inner);
    len_field(buf, field, &inner);
}

fn varint_field(buf: &mut Vec<u8>, field: u32, v: u64) {
    key(buf, field, 0);
    varint(buf, v);
}

fn any_value(buf: &mut Vec<u8>, value: &Value) {
    // Oneof members are written even when they hold their type's default.
    match value {
        Value::Text(s) => len_field(buf, 1, s.as_bytes()),
        Value::Bool(b) => varint_field(buf, 2, u64::from(*b)),
        Value::Int(n) => varint_field(buf, 3, *n as u64),
        Value::Double(d) => {
            key(buf, 4, 1);
            buf.extend_from_slice(&d.to_le_bytes());
        }
        Value::Texts(texts) => message(buf, 5, |array| {
            for t in texts {
                message(array, 1, |v| len_field(v, 1, t.as_bytes()));
            }
        }),
    }
}

fn key_value(buf: &mut Vec<u8>, field: u32, k: &str, v: &Value) {
    message(buf, field, |kv| {
        len_field(kv, 1, k.as_bytes());
        message(kv, 2, |any| any_value(any, v));
    });
}

fn span_pb(buf: &mut Vec<u8>, s: &Span) {
    len_field(buf, 1, &s.ids.trace.to_be_bytes());
    len_field(buf, 2, &s.ids.span.to_be_bytes());
    if let Some(parent) = s.parent {
        len_field(buf, 4, &parent.to_be_bytes());
    }
    len_field(buf, 5, s.name.as_bytes());
    varint_field(buf, 6, s.kind as u64);
    key(buf, 7, 1);
    buf.extend_from_slice(&unix_nanos(s.start).to_le_bytes());
    key(buf, 8, 1);
    buf.extend_from_slice(&unix_nanos(s.end).to_le_bytes());
    for (k, v) in &s.attributes {
        key_value(buf, 9, k, v);
    }
    if let Some(error) = &s.error {
        message(buf, 15, |status| {
            len_field(status, 2, error.as_bytes());
            varint_field(status, 3, 2);
        });
    }
    key(buf, 16, 5);
    buf.extend_from_slice(&FLAGS.to_le_bytes());
}

/// `ExportTraceServiceRequest` with one resource (`service.name = sup`) and one scope.
pub(crate) fn protobuf(spans: &[Span]) -> Vec<u8> {
    let mut buf = Vec::new();
    message(&mut buf, 1, |resource_spans| {
        message(resource_spans, 1, |resource| {
            key_value(resource, 1, "service.name", &Value::from("sup"));
        });
        message(resource_spans, 2, |scope_spans| {
            message(scope_spans, 1, |scope| len_field(scope, 1, b"sup"));
            for s in spans {
                message(scope_spans, 2, |span| span_pb(span, s));
            }
        });
    });
    buf
}

// ---- JSON ----

fn any_json(value: &Value) -> Json {
    match value {
        Value::Text(s) => json!({"stringValue": s}),
        Value::Bool(b) => json!({"boolValue": b}),
        // 64-bit integers are strings in the JSON mapping.
        Value::Int(n) => json!({"intValue": n.to_string()}),
        Value::Double(d) => json!({"doubleValue": d}),
        Value::Texts(texts) => json!({"arrayValue": {
            "values": texts.iter().map(|t| json!({"stringValue": t})).collect::<Vec<_>>()
        }}),
    }
}

fn key_json(k: &str, v: &Value) -> Json {
    json!({"key": k, "value": any_json(v)})
}

fn span_json(s: &Span) -> Json {
    let mut span = json!({
        "traceId": format!("{:032x}", s.ids.trace),
        "spanId": format!("{:016x}", s.ids.span),
        "flags": FLAGS,
        "name": s.name,
        "kind": s.kind as u8,
        "startTimeUnixNano": unix_nanos(s.start).to_string(),
        "endTimeUnixNano": unix_nanos(s.end).to_string(),
        "attributes": s.attributes.iter().map(|(k, v)| key_json(k, v)).collect::<Vec<_>>(),
    });
    if let Some(parent) = s.parent {
        span["parentSpanId"] = json!(format!("{parent:016x}"));
    }
    if let Some(error) = &s.error {
        span["status"] = json!({"code": 2, "message": error});
    }
    span
}

/// The same request in the OTLP JSON mapping (ids in hex, enums as numbers).
pub(crate) fn json(spans: &[Span]) -> Vec<u8> {
    json!({"resourceSpans": [{
        "resource": {"attributes": [key_json("service.name", &Value::from("sup"))]},
        "scopeSpans": [{
            "scope": {"name": "sup"},
            "spans": spans.iter().map(span_json).collect::<Vec<_>>(),
        }],
    }]})
    .to_string()
    .into_bytes()
}

// ---- the exporter ----

/// Spans waiting beyond this are dropped, as the SDK's batch processor does.
const QUEUE: usize = 2048;
/// At most this many spans per request.
const BATCH: usize = 512;
/// A span waits at most this long for others to go with it.
const DELAY: Duration = Duration::from_secs(5);

enum Message {
    Span(Box<Span>),
    /// Send what is waiting now.
    Flush,
    /// Send what is waiting, then say so and stop.
    Shutdown(std::sync::mpsc::Sender<()>),
}

/// The handle of the exporter thread.
#[derive(Clone)]
pub(crate) struct Exporter {
    queue: mpsc::Sender<Message>,
}

impl Exporter {
    /// Start the thread that posts to `url`, each request within `timeout`.
    pub(crate) fn start(
        url: reqwest::Url,
        protocol: Protocol,
        timeout: Duration,
    ) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| e.to_string())?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let (queue, taken) = mpsc::channel(QUEUE);
        let post = Post {
            client,
            url,
            protocol,
        };
        std::thread::Builder::new()
            .name("sup-otlp".into())
            .spawn(move || runtime.block_on(post.run(taken)))
            .map_err(|e| e.to_string())?;
        Ok(Exporter { queue })
    }

    /// Queue a finished span; dropped when the queue is full.
    pub(crate) fn export(&self, span: Span) {
        let _ = self.queue.try_send(Message::Span(Box::new(span)));
    }

    /// Ask for what is queued to be sent now, without waiting for it. With the queue full
    /// the thread is sending already.
    pub(crate) fn flush(&self) {
        let _ = self.queue.try_send(Message::Flush);
    }

    /// Send what is queued and stop, waiting at most `wait`.
    pub(crate) fn shutdown(&self, wait: Duration) {
        let (done, finished) = std::sync::mpsc::channel();
        let queue = self.queue.clone();
        // A full queue blocks this request, not the caller.
        std::thread::spawn(move || {
            let _ = queue.blocking_send(Message::Shutdown(done));
        });
        let _ = finished.recv_timeout(wait);
    }
}

struct Post {
    client: reqwest::Client,
    url: reqwest::Url,
    protocol: Protocol,
}

impl Post {
    async fn run(self, mut taken: mpsc::Receiver<Message>) {
        let mut batch: Vec<Span> = Vec::new();
        let mut due = Instant::now();
        loop {
            let message = if batch.is_empty() {
                taken.recv().await
            } else {
                match tokio::time::timeout_at(due, taken.recv()).await {
                    Ok(message) => message,
                    Err(_) => Some(Message::Flush),
                }
            };
            match message {
                Some(Message::Span(span)) => {
                    if batch.is_empty() {
                        due = Instant::now() + DELAY;
                    }
                    batch.push(*span);
                    if batch.len() >= BATCH {
                        self.send(&mut batch).await;
                    }
                }
                Some(Message::Flush) => self.send(&mut batch).await,
                Some(Message::Shutdown(done)) => {
                    self.send(&mut batch).await;
                    let _ = done.send(());
                    return;
                }
                None => {
                    self.send(&mut batch).await;
                    return;
                }
            }
        }
    }

    /// Post the batch and empty it; a collector that fails or is away loses it.
    async fn send(&self, batch: &mut Vec<Span>) {
        if batch.is_empty() {
            return;
        }
        let body = match self.protocol {
            Protocol::Protobuf => protobuf(batch),
            Protocol::Json => json(batch),
        };
        batch.clear();
        let sent = self
            .client
            .post(self.url.clone())
            .header("content-type", self.protocol.content_type())
            .body(body)
            .send()
            .await;
        match sent {
            Ok(r) if !r.status().is_success() => {
                tracing::debug!("the OTLP collector answered {}", r.status());
            }
            Err(e) => tracing::debug!("cannot export spans: {e}"),
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_little_endian_groups_of_seven_bits() {
        let mut buf = Vec::new();
        varint(&mut buf, 300);
        assert_eq!(buf, [0xac, 0x02]);
        buf.clear();
        varint(&mut buf, u64::MAX);
        assert_eq!(buf.len(), 10);
    }

    #[test]
    fn a_negative_or_zero_int_attribute_is_still_written() {
        let mut buf = Vec::new();
        any_value(&mut buf, &Value::Int(0));
        assert_eq!(buf, [0x18, 0]);
        buf.clear();
        any_value(&mut buf, &Value::Int(-1));
        assert_eq!(buf.len(), 11);
    }
}
