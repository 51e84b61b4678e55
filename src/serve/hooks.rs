//! Webhook triggers: `POST /hooks/GOAL` starts a goal that has `[webhook] secret_env`, as
//! `sup trigger GOAL` does (the same process, claims, overlap and pause rules), recorded as
//! `webhook`, with the body as `{{ trigger.payload }}`. No sign-in: the body's HMAC-SHA256
//! under the secret (`X-Hub-Signature-256` or `X-Sup-Signature`, `sha256=HEX`) stands for
//! the sender, checked in constant time; the peer check of every POST still refuses a run's
//! own processes. A delivery id (`X-GitHub-Delivery`, `X-Sup-Delivery`) seen before is
//! answered 200 and runs nothing; ids are kept in the store. A paused goal, or one whose
//! overlap skips while a run of it goes on, is answered 200 with why, and nothing runs.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State as Ext};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use super::State;
use super::layout::{db_error, history_error, with_db};
use crate::config::Overlap;
use crate::schedule::overview;
use crate::store::RunStatus;

/// The largest body a webhook may send.
pub(crate) const MAX_HOOK_BODY: usize = 1024 * 1024;

/// How long the answer waits for the run's id.
const START_PATIENCE: Duration = Duration::from_secs(30);

fn answer(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn refuse(status: StatusCode, error: impl Into<String>) -> Response {
    answer(status, json!({ "error": error.into() }))
}

/// `sha256=HEX` or bare `HEX`, as bytes.
fn signature(headers: &HeaderMap) -> Option<Vec<u8>> {
    let value = ["x-hub-signature-256", "x-sup-signature"]
        .iter()
        .find_map(|h| headers.get(*h)?.to_str().ok())?
        .trim();
    let hex = value.strip_prefix("sha256=").unwrap_or(value);
    if hex.len() != 64 {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Whether `sig` is the HMAC-SHA256 of `body` under `key` (compared in constant time).
fn signed(key: &[u8], body: &[u8], sig: &[u8]) -> bool {
    let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(key) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(sig).is_ok()
}

fn delivery(headers: &HeaderMap) -> Option<String> {
    ["x-github-delivery", "x-sup-delivery"]
        .iter()
        .find_map(|h| headers.get(*h)?.to_str().ok())
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.chars().take(200).collect())
}

pub(crate) async fn hook(
    Ext(state): Ext<Arc<State>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let dir = state.cfg.goals_dir.clone();
    let goal = {
        let name = name.clone();
        tokio::task::spawn_blocking(move || overview::find(&dir, &name)).await
    };
    let (secret_env, overlap) = match goal {
        Ok(Ok(g)) => match g.file.settings.webhook {
            Some(w) => (w.into_inner().secret_env, g.timing.overlap),
            None => {
                return refuse(
                    StatusCode::NOT_FOUND,
                    format!("goal `{name}` has no [webhook] table"),
                );
            }
        },
        Ok(Err(e @ overview::OverviewError::NoGoal { .. })) => {
            return refuse(StatusCode::NOT_FOUND, e.to_string());
        }
        Ok(Err(e)) => return refuse(StatusCode::CONFLICT, e.to_string()),
        Err(e) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    // Read from the environment sup started with: secret-named variables leave the process
    // environment at start-up.
    let Some(secret) = crate::startup::var(&secret_env).filter(|s| !s.is_empty()) else {
        tracing::warn!("webhook of {name}: {secret_env} is not set; nothing runs");
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the goal's secret is not set: set {secret_env} where sup runs"),
        );
    };
    let too_long = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .is_some_and(|n| n > MAX_HOOK_BODY);
    let body = match too_long {
        true => None,
        false => axum::body::to_bytes(body, MAX_HOOK_BODY).await.ok(),
    };
    let Some(body) = body else {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is over {MAX_HOOK_BODY} bytes"),
        );
    };
    let good = signature(&headers).is_some_and(|sig| signed(secret.as_bytes(), &body, &sig));
    if !good {
        tracing::warn!("webhook of {name}: missing or bad signature; nothing runs");
        return refuse(
            StatusCode::UNAUTHORIZED,
            "missing or bad signature: send X-Hub-Signature-256 (or X-Sup-Signature) = \
             sha256=HEX, the HMAC-SHA256 of the body under the goal's secret",
        );
    }
    if serde_json::from_slice::<Value>(&body).is_err() {
        return refuse(
            StatusCode::BAD_REQUEST,
            "the body is not JSON: send it as application/json",
        );
    }
    let delivered = delivery(&headers);
    if let Some(id) = &delivered {
        let new = state
            .history
            .new_delivery(&name, id)
            .await
            .map_err(history_error);
        match new {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!("webhook of {name}: delivery {id} seen before; nothing runs");
                return answer(
                    StatusCode::OK,
                    json!({"goal": name, "delivery": id, "status": "duplicate"}),
                );
            }
            Err(e) => return e.into_response(),
        }
    }
    // A fleet's claim decides pause and overlap; on one machine they are decided here.
    if !state.history.is_fleet() {
        let goal = name.clone();
        let state_of = with_db(&state, move |db| {
            let paused = db.paused(&goal).map_err(db_error)?;
            let running = db
                .runs(Some(&goal), Some(RunStatus::Running), 1)
                .map_err(db_error)?;
            Ok((paused, !running.is_empty()))
        })
        .await;
        let not_run = match state_of {
            Ok((true, _)) => Some("paused"),
            // No run waits on one machine: `queue` skips as `skip` does.
            Ok((false, true)) if matches!(overlap, Overlap::Skip | Overlap::Queue) => {
                Some("skipped")
            }
            Ok(_) => None,
            Err(e) => return e.into_response(),
        };
        if let Some(status) = not_run {
            tracing::info!("webhook of {name}: not run: {status}");
            return answer(StatusCode::OK, json!({"goal": name, "status": status}));
        }
    }
    let started = start(&state, &name, body.to_vec()).await;
    // A delivery whose run could not start may be delivered again.
    if let Some(id) = delivered.filter(|_| started.status().is_server_error()) {
        let forgot = state
            .history
            .forget_delivery(&name, &id)
            .await
            .map_err(history_error);
        if let Err(e) = forgot {
            tracing::warn!("webhook of {name}: {}", e.1);
        }
    }
    started
}

/// `sup trigger NAME --webhook --json` with the body on stdin; answered with the run's id
/// when it shows.
async fn start(state: &State, name: &str, body: Vec<u8>) -> Response {
    let (mut child, held) =
        match state.spawn_trigger(name, &["--json", "--webhook"], std::process::Stdio::piped) {
            Ok(c) => c,
            Err(e) => {
                return refuse(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("cannot start `sup trigger {name}`: {e}"),
                );
            }
        };
    let (Some(mut stdin), Some(stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return refuse(StatusCode::INTERNAL_SERVER_ERROR, "no pipes to sup trigger");
    };
    tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    let errors = tokio::spawn(async move {
        let mut text = String::new();
        let _ = (&mut stderr)
            .take(64 * 1024)
            .read_to_string(&mut text)
            .await;
        // The rest is drained, so the run never waits on a full pipe.
        let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
        text
    });
    let (tx, rx) = tokio::sync::oneshot::channel();
    let goal = name.to_string();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let mut tx = Some(tx);
        while let Ok(Some(line)) = lines.next_line().await {
            let Some(v) = serde_json::from_str::<Value>(&line).ok() else {
                continue;
            };
            let said = v.get("run_id").or_else(|| v.get("status")).is_some();
            if said && let Some(tx) = tx.take() {
                let _ = tx.send(v);
            }
        }
        let status = child.wait().await;
        drop(held);
        if let Some(tx) = tx.take() {
            let why = errors.await.unwrap_or_default();
            let _ = tx.send(json!({"exit": status.ok().and_then(|s| s.code()), "error": why}));
        }
        tracing::debug!("webhook of {goal}: its `sup trigger` ended");
    });
    let said = match tokio::time::timeout(START_PATIENCE, rx).await {
        Ok(Ok(v)) => v,
        _ => {
            return answer(
                StatusCode::ACCEPTED,
                json!({"goal": name, "status": "pending"}),
            );
        }
    };
    if let Some(run_id) = said.get("run_id").and_then(Value::as_str) {
        tracing::info!("webhook of {name}: started run {run_id}");
        return answer(
            StatusCode::ACCEPTED,
            json!({"goal": name, "status": "running", "run_id": run_id}),
        );
    }
    if let Some(status) = said.get("status").and_then(Value::as_str) {
        // Handed to the fleet, waiting for a daemon with room.
        if status == "pending" {
            return answer(
                StatusCode::ACCEPTED,
                json!({"goal": name, "status": status}),
            );
        }
        tracing::info!("webhook of {name}: not run: {status}");
        return answer(StatusCode::OK, json!({"goal": name, "status": status}));
    }
    let why = said["error"].as_str().unwrap_or("").trim().to_string();
    tracing::warn!("webhook of {name}: the run did not start: {why}");
    refuse(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("the run did not start: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_in_either_header_with_or_without_the_prefix() {
        let key = b"k";
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap();
        mac.update(b"{}");
        let hex: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        for (h, v) in [
            ("x-hub-signature-256", format!("sha256={hex}")),
            ("x-sup-signature", hex.clone()),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(h, v.parse().unwrap());
            let sig = signature(&headers).unwrap();
            assert!(signed(key, b"{}", &sig));
            assert!(!signed(key, b"{ }", &sig));
            assert!(!signed(b"other", b"{}", &sig));
        }
        let mut headers = HeaderMap::new();
        headers.insert("x-sup-signature", "sha256=zz".parse().unwrap());
        assert!(signature(&headers).is_none());
    }
}
