//! Delivering one notice to one channel: up to three attempts with backoff, each within the
//! table's `timeout`, each attempt recorded in the store. Failure is recorded and logged,
//! never returned: a notice never changes a run's outcome.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tokio::io::AsyncWriteExt;

use super::{ATTEMPTS, Channel, Format, Notice, Notify};
use crate::store::db::{Db, NoticeRow, stamp};

/// The header carrying `sha256=HEX`, the HMAC-SHA256 of the body under `secret_env`'s key.
pub(crate) const SIGNATURE_HEADER: &str = "X-Sup-Signature";

/// The wait before attempt 2, doubled before attempt 3.
const BACKOFF: Duration = Duration::from_millis(500);

/// What one attempt came to: delivered, worth another try, or not.
enum Attempt {
    Ok(String),
    Retry(String),
    Fatal(String),
}

/// `$NAME` and `${NAME}` replaced by the environment's values.
fn expand(value: &str) -> Result<String, String> {
    let re = regex::Regex::new(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
        .map_err(|e| e.to_string())?;
    let mut missing = None;
    let out = re.replace_all(value, |c: &regex::Captures| {
        let name = c.get(1).or_else(|| c.get(2)).map_or("", |m| m.as_str());
        // Secret-named variables left the process environment at start-up; read them from
        // the environment sup started with, and keep the value out of everything written.
        match crate::startup::var(name) {
            Some(v) => {
                crate::redact::add(&v);
                v
            }
            None => {
                missing = Some(name.to_string());
                String::new()
            }
        }
    });
    match missing {
        Some(name) => Err(format!("${name} is not set in the environment")),
        None => Ok(out.into_owned()),
    }
}

fn signature(key: &[u8], body: &[u8]) -> Result<String, String> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).map_err(|e| e.to_string())?;
    mac.update(body);
    let bytes = mac.finalize().into_bytes();
    Ok(format!(
        "sha256={}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

/// The channel as recorded: a webhook's URL without credentials or query, or the program.
fn shown(channel: &Channel) -> String {
    match channel {
        Channel::Webhook { url, .. } => {
            format!(
                "{}://{}{}",
                url.scheme(),
                url.host_str().unwrap_or(""),
                url.port().map(|p| format!(":{p}")).unwrap_or_default()
            ) + url.path()
        }
        Channel::Command(argv, _) => argv.first().cloned().unwrap_or_default(),
    }
}

/// Records, if dropped before `done`, that attempt `next` of a delivery was never made or
/// never finished: the process ended first.
struct Unfinished<'a> {
    home: &'a Path,
    notice: &'a Notice,
    channel: &'a str,
    next: u32,
    done: bool,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if !self.done {
            record(
                self.home,
                self.notice,
                self.channel,
                self.next,
                false,
                "not made: sup ended first (a run's end waits for its notices at most the \
                 notify timeout)",
            );
        }
    }
}

/// Deliver `notice` through `n`, recording every attempt under `home`. Each attempt has the
/// table's `timeout`; the whole delivery takes at most `ATTEMPTS` timeouts and the backoff.
pub(crate) async fn deliver(home: &Path, n: &Notify, notice: &Notice) {
    let channel = shown(&n.channel);
    let mut unfinished = Unfinished {
        home,
        notice,
        channel: &channel,
        next: 1,
        done: false,
    };
    // Whatever a check printed, no secret sup knows leaves in a notice.
    let mut value = serde_json::to_value(notice).unwrap_or_default();
    crate::redact::value(&mut value);
    let json = serde_json::to_vec(&value).unwrap_or_default();
    let mut wait = BACKOFF;
    for attempt in 1..=ATTEMPTS {
        unfinished.next = attempt;
        let result = match tokio::time::timeout(n.timeout, once(n, notice, &json)).await {
            Ok(r) => r,
            Err(_) => Attempt::Retry(format!(
                "no answer within the notify timeout of {}",
                humantime::format_duration(n.timeout)
            )),
        };
        let (ok, detail, again) = match result {
            Attempt::Ok(d) => (true, d, false),
            Attempt::Retry(d) => (false, d, true),
            Attempt::Fatal(d) => (false, d, false),
        };
        if !ok {
            tracing::warn!(
                "notify {channel} ({}): attempt {attempt}: {detail}",
                notice.event.as_str()
            );
        }
        record(home, notice, &channel, attempt, ok, &detail);
        if !again || attempt == ATTEMPTS {
            unfinished.done = true;
            return;
        }
        unfinished.next = attempt + 1;
        tokio::time::sleep(wait).await;
        wait *= 2;
    }
}

fn record(home: &Path, notice: &Notice, channel: &str, attempt: u32, ok: bool, detail: &str) {
    let row = NoticeRow {
        run_id: notice.run_id.clone(),
        goal: notice.goal.clone(),
        event: notice.event.as_str().to_string(),
        channel: channel.to_string(),
        attempt,
        at: stamp(chrono::Utc::now()),
        ok,
        detail: detail.to_string(),
    };
    if let Err(e) = Db::open(home).and_then(|db| db.record_notice(&row)) {
        tracing::warn!("cannot record a notification attempt: {e}");
    }
}

/// The notice as `format` writes it, with its content type.
fn body(format: Format, notice: &Notice, json: &[u8]) -> (Vec<u8>, &'static str) {
    let text = || crate::redact::text(&notice.text()).into_owned();
    match format {
        Format::Json => (json.to_vec(), "application/json"),
        Format::Slack => (
            serde_json::to_vec(&serde_json::json!({ "text": text() })).unwrap_or_default(),
            "application/json",
        ),
        Format::Text => (text().into_bytes(), "text/plain; charset=utf-8"),
    }
}

async fn once(n: &Notify, notice: &Notice, json: &[u8]) -> Attempt {
    match &n.channel {
        Channel::Webhook {
            url,
            format,
            headers,
            secret_env,
        } => {
            let (body, content_type) = body(*format, notice, json);
            let client = match reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
            {
                Ok(c) => c,
                Err(e) => return Attempt::Fatal(format!("cannot set up HTTP: {e}")),
            };
            let mut req = client
                .post(url.clone())
                .header("content-type", content_type)
                .header("user-agent", concat!("sup/", env!("CARGO_PKG_VERSION")))
                .header("x-sup-event", notice.event.as_str());
            for (name, value) in headers {
                match expand(value) {
                    Ok(v) => req = req.header(name.as_str(), v),
                    Err(e) => return Attempt::Fatal(format!("header {name}: {e}")),
                }
            }
            if let Some(var) = secret_env {
                let Some(key) = crate::startup::var(var).filter(|k| !k.is_empty()) else {
                    return Attempt::Fatal(format!(
                        "secret_env: ${var} is not set in the environment"
                    ));
                };
                match signature(key.as_bytes(), &body) {
                    Ok(sig) => req = req.header(SIGNATURE_HEADER, sig),
                    Err(e) => return Attempt::Fatal(format!("signature: {e}")),
                }
            }
            match req.body(body).send().await {
                Ok(r) if r.status().is_success() => {
                    Attempt::Ok(format!("HTTP {}", r.status().as_u16()))
                }
                Ok(r) => {
                    let s = r.status();
                    let detail = format!("HTTP {}", s.as_u16());
                    if s.is_server_error() || s.as_u16() == 408 || s.as_u16() == 429 {
                        Attempt::Retry(detail)
                    } else {
                        Attempt::Fatal(detail)
                    }
                }
                Err(e) => Attempt::Retry(format!("cannot reach it: {e}")),
            }
        }
        Channel::Command(argv, format) => {
            let (input, _) = body(*format, notice, json);
            let mut cmd = tokio::process::Command::new(&argv[0]);
            // The user's own command: it gets the environment sup started with.
            cmd.args(&argv[1..])
                .env_clear()
                .envs(crate::startup::original_env())
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true);
            // Held, so that no run's sweep ends it.
            let (mut child, _held) = match crate::tools::sandbox::spawn_held(&mut cmd) {
                Ok(c) => c,
                Err(e) => return Attempt::Fatal(format!("cannot start {}: {e}", argv[0])),
            };
            if let Some(mut stdin) = child.stdin.take() {
                // A command that does not read its input still counts by its exit status.
                let _ = stdin.write_all(&input).await;
            }
            match child.wait().await {
                Ok(s) if s.success() => Attempt::Ok("exit 0".into()),
                Ok(s) => Attempt::Retry(match s.code() {
                    Some(c) => format!("exit {c}"),
                    None => "killed by a signal".into(),
                }),
                Err(e) => Attempt::Retry(format!("cannot wait for {}: {e}", argv[0])),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_in_hex() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?").unwrap(),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn header_values_come_from_the_environment() {
        // SAFETY: no other test of this binary reads this variable.
        unsafe { std::env::set_var("SUP_NOTIFY_TEST_TOKEN", "abc") };
        assert_eq!(
            expand("Bearer $SUP_NOTIFY_TEST_TOKEN").unwrap(),
            "Bearer abc"
        );
        assert_eq!(expand("${SUP_NOTIFY_TEST_TOKEN}x").unwrap(), "abcx");
        assert!(expand("$SUP_NOTIFY_TEST_NOT_SET").is_err());
    }
}
