//! The commands only a shared PostgreSQL store (`--store postgres://…` or `SUP_STORE`) has:
//! the fleet daemon and `sup daemons`. The history commands, `sup trigger` among them, are
//! `manage`'s, over `store::history`, for either store.

use std::io::Write;

use anyhow::anyhow;
use tokio_util::sync::CancellationToken;

use super::manage::short;
use super::run::invocation;
use super::{DaemonArgs, Ending, Fail};
use crate::config::Settings;
use crate::run::Invocation;
use crate::schedule::fleet;
use crate::store::{self, db::stamp, pg};

/// Open the store named by `--store`; its faults are usage errors (exit 2) with the
/// server's words and what to check.
pub(crate) async fn open(url: &str) -> Result<pg::PgStore, Fail> {
    if !pg::is_pg_url(url) {
        let url = pg::without_password(url);
        return Err(Fail::usage(anyhow!(
            "--store `{url}` is not a PostgreSQL URL: write postgres://USER@HOST:PORT/DATABASE, \
             or leave --store and SUP_STORE out for the SQLite store under SUP_HOME"
        )));
    }
    pg::PgStore::open(url).await.map_err(Fail::usage)
}

fn defaults() -> Result<Invocation, Fail> {
    invocation(Settings::default())
}

pub(crate) async fn daemon(url: &str, a: DaemonArgs) -> Result<Ending, Fail> {
    if !a.goals.is_dir() {
        return Err(Fail::usage(anyhow!(
            "the goals folder {} does not exist; pass --goals DIR",
            a.goals.display()
        )));
    }
    let store = open(url).await?;
    let shutdown = CancellationToken::new();
    let reload_rx = super::manage::daemon_signals(&shutdown).map_err(Fail::usage)?;
    let console = match a.serve {
        Some(addr) => Some(
            super::serve::start(
                addr,
                a.goals.clone(),
                Some((store.clone(), url.to_string())),
                shutdown.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let cfg = fleet::Config {
        goals_dir: a.goals,
        home: store::home(),
        max_concurrent: a.max_concurrent,
        grace: a.grace,
        lease: a.lease,
        tags: a.tags,
        defaults: defaults()?,
        store,
        clock: std::sync::Arc::new(crate::schedule::clock::SystemClock),
    };
    fleet::run(cfg, shutdown, reload_rx)
        .await
        .map_err(Fail::usage)?;
    if let Some(c) = console {
        let _ = c.await;
    }
    Ok(Ending::Achieved)
}

pub(crate) async fn daemons(url: &str, json_out: bool) -> Result<Ending, Fail> {
    let rows = open(url).await?.daemons().await.map_err(Fail::usage)?;
    let mut out = std::io::stdout().lock();
    if json_out {
        let _ = writeln!(out, "{}", serde_json::to_string(&rows).unwrap_or_default());
        return Ok(Ending::Achieved);
    }
    if rows.is_empty() {
        let _ = writeln!(out, "no daemons have joined this store");
    }
    for d in rows {
        let _ = writeln!(
            out,
            "{}  {}  host {} · pid {} · sup {} · max {} · tags [{}]\n    started {} · renewed {}",
            d.id,
            d.state,
            d.host,
            d.pid,
            d.version,
            d.max_concurrent,
            d.tags.join(", "),
            short(&stamp(d.started_at)),
            short(&stamp(d.renewed_at)),
        );
        if d.running.is_empty() {
            let _ = writeln!(out, "    running nothing");
        } else {
            let _ = writeln!(out, "    running {}", d.running.join(", "));
        }
    }
    Ok(Ending::Achieved)
}
