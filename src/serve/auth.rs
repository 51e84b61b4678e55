//! Who may do what on the console: the host check on loopback (no DNS rebinding), the
//! sign-in (a name, plus `SUP_SERVE_TOKEN` when one is set) that keeps a session cookie, the
//! CSRF token every POST must carry, the refusal of every POST from a process `sup` started,
//! and the security headers of every response.

use std::sync::Arc;

use axum::extract::{Form, FromRequest, Query, Request, State as Ext};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::layout::{PageError, Viewer, error_page, layout};
use super::peer::{Conn, Peer, identify};
use super::{Session, State};

/// The shortest token accepted.
pub(crate) const MIN_TOKEN_LEN: usize = 16;
const SESSION: &str = "sup_session";
const SIGNIN: &str = "sup_signin";
const CSP: &str = "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; \
                   img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

fn random() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Equal, in time that does not depend on where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn session_of(state: &State, headers: &HeaderMap) -> Option<Session> {
    let id = cookie(headers, SESSION)?;
    state.sessions.lock().ok()?.get(id).cloned()
}

/// `localhost`, `127.0.0.1`, `[::1]`, with or without a port.
fn local_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    matches!(name, "localhost" | "127.0.0.1" | "::1")
}

/// Every request: the host check, sign-in when a token is set, the viewer for the pages,
/// and the security headers.
pub(crate) async fn guard(Ext(state): Ext<Arc<State>>, mut req: Request, next: Next) -> Response {
    let headers = req.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let mut resp = if state.loopback && !local_host(host) {
        error_page(
            StatusCode::FORBIDDEN,
            "This console answers only to localhost, 127.0.0.1 or [::1].",
        )
    } else if let Some(refusal) = refusal(
        state.cfg.token.is_some(),
        req.method().clone(),
        req.uri().path().to_string(),
        req.extensions()
            .get::<axum::extract::ConnectInfo<Conn>>()
            .map(|c| c.0),
    )
    .await
    {
        refusal
    } else {
        let path = req.uri().path();
        // A webhook is signed instead (`hooks`); the peer check above still holds.
        let open = path == "/signin" || path.starts_with("/static/") || path.starts_with("/hooks/");
        let viewer = session_of(&state, headers);
        if viewer.is_none() && state.cfg.token.is_some() && !open {
            if req.method() == axum::http::Method::GET {
                let next = req
                    .uri()
                    .path_and_query()
                    .map(|p| p.as_str())
                    .unwrap_or("/");
                let to = format!("/signin?next={}", form_urlencoded_component(next));
                Redirect::to(&to).into_response()
            } else {
                error_page(StatusCode::UNAUTHORIZED, "Sign in first.")
            }
        } else {
            req.extensions_mut().insert(Viewer(viewer));
            next.run(req).await
        }
    };
    let h = resp.headers_mut();
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

/// A sign-in or any other state-changing request from a process `sup` started (the agent's
/// commands): 403, logged. So is one from a process of this machine that cannot be identified
/// (another user's, or an SSH tunnel's), unless the console has a token: the agent never sees
/// `SUP_SERVE_TOKEN`, so a sign-in with it stands for a person.
async fn refusal(
    token: bool,
    method: Method,
    path: String,
    conn: Option<Conn>,
) -> Option<Response> {
    if matches!(method, Method::GET | Method::HEAD) {
        return None;
    }
    let peer = match conn {
        Some(Conn {
            peer,
            local: Some(local),
        }) => tokio::task::spawn_blocking(move || identify(peer, local))
            .await
            .unwrap_or_else(|e| Peer::Unknown(e.to_string())),
        _ => Peer::Unknown("the connection's addresses are unknown".into()),
    };
    let text = match peer {
        Peer::Remote | Peer::Outside => return None,
        Peer::Unknown(_) if token => return None,
        Peer::Sup { pid, comm, by } => format!(
            "Refused: this request comes from process {pid} ({comm}), which sup started \
             ({by}). A run's own commands cannot sign in or answer approvals; answer from a \
             browser or terminal that sup did not start."
        ),
        Peer::Unknown(why) => format!(
            "Refused: sup cannot tell which process sent this request ({why}), so it cannot \
             rule out a run's own commands. Answer from a browser on this machine that sup can \
             see (same user, or sup running as root), or give the console a token \
             (SUP_SERVE_TOKEN) and sign in with it."
        ),
    };
    tracing::warn!("console: refused {method} {path}: {text}");
    Some(error_page(StatusCode::FORBIDDEN, &text))
}

fn form_urlencoded_component(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A state-changing form post that passed `authorize`: a handler that takes one cannot run
/// for a request that is not signed in, from another site, or without the session's CSRF
/// token. It reads the body, so it comes last among a handler's extractors.
pub(crate) struct Authorized<F> {
    pub(crate) session: Session,
    pub(crate) form: F,
}

/// A form that carries the session's CSRF token.
pub(crate) trait Csrf {
    fn csrf(&self) -> &str;
}

impl<S: Send + Sync, F: Csrf + DeserializeOwned + Send> FromRequest<S> for Authorized<F> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        // `guard` puts the viewer on every request; without it nobody is signed in.
        let viewer = req.extensions().get::<Viewer>().cloned();
        let headers = req.headers().clone();
        let Form(form) = Form::<F>::from_request(req, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let session = authorize(&viewer.unwrap_or(Viewer(None)), &headers, form.csrf())
            .map_err(IntoResponse::into_response)?;
        Ok(Authorized { session, form })
    }
}

/// A state-changing request: signed in, from this site, with the session's CSRF token.
fn authorize(viewer: &Viewer, headers: &HeaderMap, csrf: &str) -> Result<Session, PageError> {
    let Some(session) = &viewer.0 else {
        return Err(PageError::new(
            StatusCode::FORBIDDEN,
            "Sign in first: answers are recorded with the name you give.",
        ));
    };
    if !same_origin(headers) || !same(csrf, &session.csrf) {
        return Err(PageError::new(
            StatusCode::FORBIDDEN,
            "This form did not come from this console's page (CSRF check failed). Reload the \
             page and try again.",
        ));
    }
    Ok(session.clone())
}

/// No `Origin` (or `Sec-Fetch-Site`) that names another site.
fn same_origin(headers: &HeaderMap) -> bool {
    let get = |k: &str| headers.get(k).and_then(|v| v.to_str().ok());
    if get("sec-fetch-site").is_some_and(|s| s == "cross-site" || s == "same-site") {
        return false;
    }
    match (get("origin"), get("host")) {
        (Some(origin), Some(host)) => {
            origin == format!("http://{host}") || origin == format!("https://{host}")
        }
        (Some(_), None) => false,
        (None, _) => true,
    }
}

#[derive(Deserialize)]
pub(crate) struct NextQuery {
    next: Option<String>,
}

/// Only a path on this site.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n) if n.starts_with('/') && !n.starts_with("//") && !n.contains('\\') => n.into(),
        _ => "/runs".into(),
    }
}

fn signin_form(state: &State, csrf: &str, next: &str, problem: Option<&str>) -> maud::Markup {
    layout(
        "Sign in",
        &Viewer(None),
        html! {
            @if let Some(p) = problem { p.problem { (p) } }
            form.signin method="post" action="/signin" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="next" value=(next);
                label { "Your name " small { "(answers are recorded as web:NAME)" }
                    input type="text" name="name" required maxlength="64" autofocus; }
                @if state.cfg.token.is_some() {
                    label { "Token " small { "(SUP_SERVE_TOKEN)" }
                        input type="password" name="token" required; }
                }
                button type="submit" { "Sign in" }
            }
        },
    )
}

pub(crate) async fn signin_page(
    Ext(state): Ext<Arc<State>>,
    headers: HeaderMap,
    Query(q): Query<NextQuery>,
) -> Response {
    let csrf = cookie(&headers, SIGNIN)
        .filter(|c| c.len() == 64)
        .map(str::to_string)
        .unwrap_or_else(random);
    let page = signin_form(&state, &csrf, &safe_next(q.next.as_deref()), None);
    let set = format!("{SIGNIN}={csrf}; Path=/signin; HttpOnly; SameSite=Strict");
    ([(header::SET_COOKIE, set)], page).into_response()
}

#[derive(Deserialize)]
pub(crate) struct SigninForm {
    name: String,
    #[serde(default)]
    token: String,
    csrf: String,
    next: Option<String>,
}

pub(crate) async fn signin(
    Ext(state): Ext<Arc<State>>,
    headers: HeaderMap,
    Form(f): Form<SigninForm>,
) -> Response {
    let next = safe_next(f.next.as_deref());
    let fresh = cookie(&headers, SIGNIN).is_some_and(|c| same(c, &f.csrf));
    if !fresh || !same_origin(&headers) {
        return error_page(
            StatusCode::FORBIDDEN,
            "This sign-in form did not come from this console's page (CSRF check failed). \
             Open /signin and try again.",
        );
    }
    if let Some(token) = &state.cfg.token
        && !same(token, &f.token)
    {
        // Slow down guessing.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let page = signin_form(&state, &f.csrf, &next, Some("Wrong token."));
        return (StatusCode::UNAUTHORIZED, page).into_response();
    }
    let name = f.name.trim();
    if name.is_empty() || name.chars().count() > 64 || name.chars().any(char::is_control) {
        let page = signin_form(
            &state,
            &f.csrf,
            &next,
            Some("Give a name of 1 to 64 characters."),
        );
        return (StatusCode::BAD_REQUEST, page).into_response();
    }
    let id = random();
    if let Ok(mut s) = state.sessions.lock() {
        s.insert(
            id.clone(),
            Session {
                name: name.to_string(),
                csrf: random(),
            },
        );
    }
    let set = format!("{SESSION}={id}; Path=/; HttpOnly; SameSite=Strict");
    ([(header::SET_COOKIE, set)], Redirect::to(&next)).into_response()
}

/// A form that carries nothing but the CSRF token.
#[derive(Deserialize)]
pub(crate) struct CsrfForm {
    csrf: String,
}

impl Csrf for CsrfForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

pub(crate) async fn signout(
    Ext(state): Ext<Arc<State>>,
    headers: HeaderMap,
    _: Authorized<CsrfForm>,
) -> Response {
    if let (Some(id), Ok(mut s)) = (cookie(&headers, SESSION), state.sessions.lock()) {
        s.remove(id);
    }
    let clear = format!("{SESSION}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, clear)], Redirect::to("/signin")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_next_paths() {
        assert!(local_host("127.0.0.1:7878"));
        assert!(local_host("localhost"));
        assert!(local_host("[::1]:80"));
        assert!(!local_host("evil.example:7878"));
        assert!(!local_host("127.0.0.1.evil.example"));
        assert_eq!(safe_next(Some("//evil.example")), "/runs");
        assert_eq!(safe_next(Some("https://evil.example")), "/runs");
        assert_eq!(safe_next(Some("/goals")), "/goals");
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }
}
