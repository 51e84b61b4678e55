//! `sup serve` and the console of `sup daemon --serve`: read `SUP_SERVE_TOKEN`, bind, say
//! where it listens, serve until SIGTERM or Ctrl-C; with `--store`, the fleet's console.

use std::net::SocketAddr;
use std::path::PathBuf;

use tokio_util::sync::CancellationToken;

use super::{Ending, Fail};
use crate::serve;
use crate::store;

/// Bind the console (refusing a non-loopback address without a token) and start serving it
/// in the background; it stops when `shutdown` is cancelled.
pub(crate) async fn start(
    listen: SocketAddr,
    goals: PathBuf,
    fleet: Option<(crate::store::pg::PgStore, String)>,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, Fail> {
    // Read from the environment sup started with: secret-named variables leave the
    // process environment at start-up.
    let token = crate::startup::var("SUP_SERVE_TOKEN").filter(|t| !t.trim().is_empty());
    let cfg = serve::Config {
        listen,
        goals_dir: std::path::absolute(&goals).unwrap_or(goals),
        home: store::home(),
        token,
        exe: std::env::current_exe().map_err(Fail::usage)?,
        fleet,
    };
    let server = serve::bind(cfg, shutdown).await.map_err(Fail::usage)?;
    eprintln!("sup serve: listening on http://{}", server.addr);
    Ok(tokio::spawn(async move {
        if let Err(e) = server.run().await {
            tracing::error!("{e}");
        }
    }))
}

pub(crate) async fn serve(
    listen: SocketAddr,
    goals: PathBuf,
    fleet: Option<(crate::store::pg::PgStore, String)>,
) -> Result<Ending, Fail> {
    use tokio::signal::unix::{SignalKind, signal};
    let shutdown = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).map_err(Fail::usage)?;
    serve::STANDALONE.store(true, std::sync::atomic::Ordering::Relaxed);
    let handle = start(listen, goals, fleet, shutdown.clone()).await?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    shutdown.cancel();
    let _ = handle.await;
    Ok(Ending::Achieved)
}
