//! The web console (`sup serve`, `sup daemon --serve ADDR`): server-rendered pages of runs,
//! live transcripts (server-sent events), approvals and goals, on axum in the same tokio
//! runtime. Templates are maud (compiled into the binary, every value escaped by default);
//! the style sheet and the one small script are embedded. Loopback by default; any other
//! address needs `SUP_SERVE_TOKEN`. Every state-changing request is a POST carrying the
//! session's CSRF token, and none is taken from a process that `sup` started (`peer`).
//! With a fleet's store (`--store`) runs, transcripts, approvals and goal figures come from
//! PostgreSQL, and answers reach waiting runs on any machine.

mod auth;
mod pages;
mod peer;
mod render;
mod thread;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;

pub(crate) use auth::MIN_TOKEN_LEN;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    #[error(
        "the web console on {0} would be reachable from other machines: set SUP_SERVE_TOKEN to a \
         long random secret ({MIN_TOKEN_LEN} characters at least), or listen on 127.0.0.1"
    )]
    NeedsToken(SocketAddr),
    #[error("SUP_SERVE_TOKEN is too short: use {MIN_TOKEN_LEN} characters at least")]
    ShortToken,
    #[error("cannot listen on {addr}: {source}; pick another address with --listen")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the web console stopped: {0}")]
    Serve(std::io::Error),
}

/// What the console serves and how.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub listen: SocketAddr,
    pub goals_dir: PathBuf,
    pub home: PathBuf,
    /// `SUP_SERVE_TOKEN`: required to sign in when set; must be set off loopback.
    pub token: Option<String>,
    /// This binary, for "run now" (`sup trigger NAME`).
    pub exe: PathBuf,
    /// A fleet's store, and its URL for the processes the console starts.
    pub fleet: Option<(crate::store::pg::PgStore, String)>,
}

/// A signed-in person.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    pub(crate) name: String,
    pub(crate) csrf: String,
}

pub(crate) struct State {
    pub(crate) cfg: Config,
    /// Listening on a loopback address: requests must name localhost as their host.
    pub(crate) loopback: bool,
    pub(crate) shutdown: CancellationToken,
    pub(crate) sessions: Mutex<HashMap<String, Session>>,
}

/// A bound console, ready to run.
pub(crate) struct Server {
    listener: tokio::net::TcpListener,
    app: Router,
    state: Arc<State>,
    /// The address it listens on (the port chosen when 0 was asked for).
    pub(crate) addr: SocketAddr,
}

/// Check the token rules and bind the address.
pub(crate) async fn bind(cfg: Config, shutdown: CancellationToken) -> Result<Server, ServeError> {
    let loopback = cfg.listen.ip().is_loopback();
    match cfg.token.as_deref() {
        None if !loopback => return Err(ServeError::NeedsToken(cfg.listen)),
        Some(t) if t.len() < MIN_TOKEN_LEN => return Err(ServeError::ShortToken),
        _ => {}
    }
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: cfg.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: cfg.listen,
        source,
    })?;
    let state = Arc::new(State {
        cfg,
        loopback,
        shutdown,
        sessions: Mutex::new(HashMap::new()),
    });
    Ok(Server {
        listener,
        app: router(state.clone()),
        state,
        addr,
    })
}

impl Server {
    /// Serve until the shutdown token is cancelled.
    pub(crate) async fn run(self) -> Result<(), ServeError> {
        let stop = self.state.shutdown.clone();
        let app = self.app.into_make_service_with_connect_info::<peer::Conn>();
        axum::serve(self.listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .map_err(ServeError::Serve)
    }
}

fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/", get(pages::index))
        .route("/runs", get(pages::runs))
        .route("/runs/{id}", get(pages::run))
        .route("/runs/{id}/events", get(pages::run_events))
        .route("/runs/{id}/files/{*path}", get(pages::run_file))
        .route("/approvals", get(pages::approvals))
        .route("/approvals/{id}/{verb}", post(pages::answer))
        .route("/goals", get(pages::goals))
        .route("/goals/{name}/{verb}", post(pages::goal_action))
        .route("/signin", get(auth::signin_page).post(auth::signin))
        .route("/signout", post(auth::signout))
        .route("/static/style.css", get(pages::style))
        .route("/static/live.js", get(pages::script))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::guard,
        ))
        .with_state(state)
}
