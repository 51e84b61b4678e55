//! Provider wire code: SSE parsing throughput for a long streamed answer, and the harness's
//! own time per model request against a loopback server next to a bare reqwest request to
//! the same server. Run: `cargo bench --bench providers`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Parsing a turn of the most a turn may be (8 MB) in at most 80 ms.
const MIN_MB_S: f64 = 100.0;
/// A whole step's overhead beyond a bare client (issue 30); a model request is part of it.
const MAX_OVERHEAD_US: f64 = 500.0;

use std::time::{Duration, Instant};

use serde_json::json;
use sup::model::http::{Decoder, Endpoint, HttpOptions, Transport};
use sup::model::openai::{ChatDecoder, ChatModel, Dialect};
use sup::model::sse::SseParser;
use sup::model::{Conversation, Message, Model, ModelRequest};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// A Chat Completions stream of `n` text chunks.
fn stream(n: usize) -> String {
    let mut s = String::new();
    for i in 0..n {
        s.push_str(&format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "bench",
                   "choices": [{"index": 0, "delta": {"content": format!("word{i} and more text ")}, "finish_reason": null}]})
        ));
    }
    s.push_str("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n");
    s.push_str("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5}}\n\ndata: [DONE]\n\n");
    s
}

fn sse_throughput() {
    let text = stream(60_000);
    let mb = text.len() as f64 / 1e6;
    let mut best_parse = f64::MAX;
    let mut best_decode = f64::MAX;
    for _ in 0..5 {
        let started = Instant::now();
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        let mut count = 0;
        for chunk in text.as_bytes().chunks(4096) {
            let _ = parser.feed(chunk, &mut events);
            count += events.len();
            events.clear();
        }
        parser.finish(&mut events);
        best_parse = best_parse.min(started.elapsed().as_secs_f64());
        assert!(count > 60_000);

        let started = Instant::now();
        let mut parser = SseParser::new();
        let mut decoder = ChatDecoder::new();
        for chunk in text.as_bytes().chunks(4096) {
            let _ = parser.feed(chunk, &mut events);
            for e in events.drain(..) {
                decoder.event(&e, &|_| {}).unwrap();
            }
        }
        assert!(decoder.complete());
        best_decode = best_decode.min(started.elapsed().as_secs_f64());
    }
    println!("SSE stream of {mb:.1} MB in 4 KiB chunks:");
    println!(
        "  parser alone         {:>8.0} MB/s   (target: at least {MIN_MB_S} MB/s)",
        mb / best_parse
    );
    println!(
        "  parser + decoding    {:>8.0} MB/s   (target: at least {MIN_MB_S} MB/s)",
        mb / best_decode
    );
}

/// A keep-alive HTTP/1.1 server on loopback answering every POST with `body`.
async fn serve(body: String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            socket.set_nodelay(true).unwrap();
            let body = body.clone();
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut reader = BufReader::new(read);
                loop {
                    let mut len = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let l = line.trim_end().to_ascii_lowercase();
                        if l.is_empty() {
                            break;
                        }
                        if let Some(v) = l.strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap();
                        }
                    }
                    let mut buf = vec![0; len];
                    reader.read_exact(&mut buf).await.unwrap();
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    // One write: no delayed-ACK stall between head and body.
                    write.write_all((head + &body).as_bytes()).await.unwrap();
                }
            });
        }
    });
    url
}

async fn overhead() {
    let body = stream(20);
    let url = serve(body).await;
    let endpoint_url = format!("{url}/v1/chat/completions");
    let client = reqwest::Client::new();
    let model = ChatModel {
        name: "openai:bench".into(),
        model: "bench".into(),
        transport: Transport::new(
            Endpoint::new("openai", endpoint_url.clone(), None, "OPENAI_BASE_URL"),
            HttpOptions::default(),
        )
        .unwrap(),
        dialect: Dialect::default(),
        wire: Default::default(),
    };
    let messages = Conversation::from(vec![
        Message::System {
            content: "You are a benchmark.".into(),
        },
        Message::User {
            content: "Say something.".into(),
        },
    ]);
    let bare_body = json!({"model": "bench", "messages": [{"role": "user", "content": "Say something."}], "stream": true});
    let n = 500;
    let mut bare = Duration::MAX;
    let mut harness = Duration::MAX;
    for round in 0..4 {
        let started = Instant::now();
        for _ in 0..n {
            let r = client
                .post(&endpoint_url)
                .json(&bare_body)
                .send()
                .await
                .unwrap();
            let _ = r.bytes().await.unwrap();
        }
        let b = started.elapsed();
        let started = Instant::now();
        for _ in 0..n {
            let r = model
                .step(ModelRequest {
                    messages: &messages,
                    tools: &[],
                    on_text: &|_| {},
                    json_schema: None,
                    max_output: None,
                    partial: None,
                })
                .await
                .unwrap();
            assert!(!r.text.is_empty());
        }
        let h = started.elapsed();
        if round > 0 {
            bare = bare.min(b);
            harness = harness.min(h);
        }
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(n);
    println!("model request against a loopback server ({n} requests, best of 3):");
    println!("  bare reqwest request {:>8.1} µs", per(bare));
    println!("  sup model step       {:>8.1} µs", per(harness));
    println!(
        "  overhead             {:>8.1} µs per request   (target: at most {MAX_OVERHEAD_US} µs, \
         the whole step's)",
        per(harness) - per(bare)
    );
}

fn main() {
    // reqwest is built without a default TLS provider; `sup` installs ring, and so does the
    // bare client here.
    let _ = rustls::crypto::ring::default_provider().install_default();
    sse_throughput();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(overhead());
}
