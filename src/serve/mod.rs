//! The web console (`sup serve`, `sup daemon --serve ADDR`): server-rendered pages of runs,
//! live transcripts (server-sent events), approvals and goals, on axum in the same tokio
//! runtime. Templates are maud (compiled into the binary, every value escaped by default);
//! the style sheet and the one small script are embedded. Loopback by default; any other
//! address needs `SUP_SERVE_TOKEN`. Every state-changing request is a POST carrying the
//! session's CSRF token, and none is taken from a process that `sup` started (`peer`);
//! a webhook (`hooks`) carries a signature instead of a session.
//! With a fleet's store (`--store`) runs, transcripts, approvals and goal figures come from
//! PostgreSQL, and answers reach waiting runs on any machine.

mod approvals;
mod auth;
mod goals;
mod hooks;
mod layout;
mod peer;
mod render;
mod runs;
mod thread;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;

pub(crate) use auth::MIN_TOKEN_LEN;
pub(crate) use hooks::MAX_HOOK_BODY;

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
}

/// Set by `sup serve`: a console of its own, outside any daemon, which cannot tell whether a
/// local daemon runs.
pub(crate) static STANDALONE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

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
    name: String,
    csrf: String,
}

pub(crate) struct State {
    cfg: Config,
    /// Listening on a loopback address: requests must name localhost as their host.
    loopback: bool,
    shutdown: CancellationToken,
    sessions: Mutex<HashMap<String, Session>>,
    /// The history the console shows: the fleet's when it serves one, else this SUP_HOME's.
    history: crate::store::history::History,
}

impl State {
    /// Start `sup trigger NAME --goals DIR`, then `args`, as a process of its own with `stdio`
    /// (`Stdio::null` or `Stdio::piped`) for its standard streams: in the environment sup
    /// started with (the run needs the provider keys) and, in a fleet, with the store's URL,
    /// handed to a daemon that serves the goal. Held, so that no run's sweep ends it.
    pub(crate) fn spawn_trigger(
        &self,
        name: &str,
        args: &[&str],
        stdio: fn() -> std::process::Stdio,
    ) -> std::io::Result<(tokio::process::Child, Option<crate::tools::sandbox::Held>)> {
        let mut cmd = tokio::process::Command::new(&self.cfg.exe);
        cmd.arg("trigger")
            .arg(name)
            .arg("--goals")
            .arg(&self.cfg.goals_dir)
            .args(args)
            .env_clear()
            .envs(crate::startup::original_env());
        if let Some((_, url)) = &self.cfg.fleet {
            cmd.env("SUP_STORE", url);
        }
        cmd.stdin(stdio()).stdout(stdio()).stderr(stdio());
        crate::tools::sandbox::spawn_held(&mut cmd)
    }
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
    let history = match &cfg.fleet {
        Some((pg, _)) => crate::store::history::History::Fleet(Box::new(pg.clone())),
        None => crate::store::history::History::Local(cfg.home.clone()),
    };
    let state = Arc::new(State {
        history,
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

/// How long a client has to send a request's headers (the first request's from the
/// connection's start, each later one's from the end of the last response); then the
/// connection is closed, so half-open connections cannot hold the console.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once at most; more are closed as they come.
pub(crate) const MAX_CONNECTIONS: usize = 128;

impl Server {
    /// Serve until the shutdown token is cancelled, then let each connection finish.
    pub(crate) async fn run(self) -> Result<(), ServeError> {
        let stop = self.state.shutdown.clone();
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        loop {
            let (stream, peer) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(a) => a,
                    // Out of descriptors and the like: wait, as a listener does.
                    Err(e) => {
                        tracing::debug!("console accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = stop.cancelled() => break,
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::debug!("console: {MAX_CONNECTIONS} connections open; {peer} closed");
                continue;
            };
            let conn = peer::Conn {
                peer,
                local: stream.local_addr().ok(),
            };
            let app = self
                .app
                .clone()
                .layer(axum::Extension(axum::extract::ConnectInfo(conn)));
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut http = hyper::server::conn::http1::Builder::new();
                http.timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT);
                let served = http.serve_connection(
                    hyper_util::rt::TokioIo::new(stream),
                    hyper_util::service::TowerToHyperService::new(app),
                );
                let mut served = std::pin::pin!(served);
                tokio::select! {
                    _ = served.as_mut() => {}
                    _ = stop.cancelled() => {
                        served.as_mut().graceful_shutdown();
                        let _ = served.await;
                    }
                }
                drop(slot);
            });
        }
        // Every connection has ended when every slot is back.
        let _ = slots.acquire_many(MAX_CONNECTIONS as u32).await;
        Ok(())
    }
}

/// The console's routes over the local store of SUP_HOME `home` and the goals in
/// `goals_dir`, as `sup serve` on loopback builds them (with `token`, sign-in needs it), for
/// driving in-process (`tower::ServiceExt::oneshot`). `conn` is the (peer, local) addresses of
/// the connection every request is taken to come by, as the server adds them per connection;
/// without them, who sent a request cannot be told.
pub fn app(
    home: PathBuf,
    goals_dir: PathBuf,
    token: Option<String>,
    conn: Option<(SocketAddr, SocketAddr)>,
) -> Router {
    let state = Arc::new(State {
        history: crate::store::history::History::Local(home.clone()),
        cfg: Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            goals_dir,
            home,
            token,
            exe: std::env::current_exe().unwrap_or_default(),
            fleet: None,
        },
        loopback: true,
        shutdown: CancellationToken::new(),
        sessions: Mutex::new(HashMap::new()),
    });
    let app = router(state);
    match conn {
        Some((peer, local)) => app.layer(axum::Extension(axum::extract::ConnectInfo(peer::Conn {
            peer,
            local: Some(local),
        }))),
        None => app,
    }
}

fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/", get(layout::index))
        .route("/runs", get(runs::runs))
        .route("/runs/{id}", get(runs::run))
        .route("/runs/{id}/events", get(runs::run_events))
        .route("/runs/{id}/files/{*path}", get(runs::run_file))
        .route("/approvals", get(approvals::approvals))
        .route("/approvals/{id}/{verb}", post(approvals::answer))
        .route("/goals", get(goals::goals))
        .route("/goals/{name}/{verb}", post(goals::goal_action))
        .route(
            "/hooks/{name}",
            post(hooks::hook).layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/signin", get(auth::signin_page).post(auth::signin))
        .route("/signout", post(auth::signout))
        .route("/static/style.css", get(layout::style))
        .route("/static/live.js", get(layout::script))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::guard,
        ))
        .with_state(state)
}
