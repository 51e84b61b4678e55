//! The fleet's members: registration, leases, and closing the runs of a daemon that died.

use super::*;

impl PgStore {
    /// Register a daemon; returns its id.
    pub(crate) async fn register(
        &self,
        host: &str,
        tags: &[String],
        max_concurrent: usize,
        lease: Duration,
    ) -> Result<String, PgError> {
        let id = format!(
            "{host}-{}-{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..6]
        );
        let c = self.client().await?;
        c.execute(
            "INSERT INTO daemons (id, host, pid, version, tags, max_concurrent, lease_ms,
                 started_at, renewed_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, now(), now())",
            &[
                &id,
                &host,
                &(std::process::id() as i32),
                &env!("CARGO_PKG_VERSION"),
                &tags,
                &(max_concurrent as i32),
                &(lease.as_millis() as i64),
            ],
        )
        .await
        .map_err(|e| self.err(&e))?;
        Ok(id)
    }

    /// Renew a daemon's lease, and learn which of its runs the fleet asked to cancel (overlap
    /// `replace`; `NOTIFY sup_cancel` says it sooner, this when a notification was lost).
    pub(crate) async fn renew(&self, id: &str) -> Result<Renewed, PgError> {
        let c = self.client().await?;
        let row = c
            .query_one(
                "WITH old AS (SELECT state FROM daemons WHERE id = $1)
                 UPDATE daemons SET renewed_at = now(), state = 'alive', stopped_at = NULL
                 WHERE id = $1 RETURNING (SELECT state FROM old),
                     (SELECT coalesce(array_agg(r.id), '{}') FROM runs r
                      WHERE r.daemon_id = $1 AND r.status = 'running' AND r.cancel_requested),
                     (SELECT coalesce(array_agg(d.id ORDER BY d.id), '{}') FROM daemons d
                      WHERE d.state = 'alive'
                        AND d.renewed_at >= now() - d.lease_ms * interval '1 millisecond')",
                &[&id],
            )
            .await
            .map_err(|e| self.err(&e))?;
        Ok(Renewed {
            was_alive: row.get::<_, Option<String>>(0).as_deref() == Some("alive"),
            cancel: row.get(1),
            fleet: row.get(2),
        })
    }

    pub(crate) async fn stop_daemon(&self, id: &str) -> Result<(), PgError> {
        self.execute(
            "UPDATE daemons SET state = 'stopped', stopped_at = now() WHERE id = $1",
            &[&id],
        )
        .await
    }

    /// Daemons whose lease ran out become `dead`; their runs `interrupted`, their occurrences
    /// closed, and runs that ask for it get a retry trigger, unless a newer run replaced
    /// them (the retry would replace that one).
    pub(crate) async fn reap(&self, by: &str) -> Result<Vec<Reaped>, PgError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(&e))?;
        let dead: Vec<String> = tx
            .query(
                "SELECT id FROM daemons WHERE state = 'alive' AND id <> $1
                     AND renewed_at < now() - lease_ms * interval '1 millisecond'
                 FOR UPDATE SKIP LOCKED",
                &[&by],
            )
            .await
            .map_err(|e| self.err(&e))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut out = Vec::new();
        for d in dead {
            tx.execute(
                "UPDATE daemons SET state = 'dead', stopped_at = now() WHERE id = $1",
                &[&d],
            )
            .await
            .map_err(|e| self.err(&e))?;
            let rows = tx
                .query(
                    "UPDATE runs SET status = 'interrupted', stop_reason = 'cancelled',
                         ended_at = now(),
                         error = 'its daemon ' || $1 || ' stopped renewing its lease (killed, machine gone or cut off); marked by ' || $2
                     WHERE daemon_id = $1 AND status = 'running'
                     RETURNING id, goal, retry_interrupted AND NOT cancel_requested",
                    &[&d, &by],
                )
                .await
                .map_err(|e| self.err(&e))?;
            for r in rows {
                let run_id: String = r.get(0);
                let goal: String = r.get(1);
                let retry: bool = r.get(2);
                tx.execute(
                    "UPDATE occurrences SET status = 'interrupted' WHERE run_id = $1",
                    &[&run_id],
                )
                .await
                .map_err(|e| self.err(&e))?;
                if retry {
                    tx.execute(
                        "INSERT INTO triggers (goal, kind, requested_at, requested_by, status)
                         VALUES ($1, 'retry', clock_timestamp(), $2, 'pending')",
                        &[&goal, &format!("retry of {run_id}")],
                    )
                    .await
                    .map_err(|e| self.err(&e))?;
                }
                out.push(Reaped {
                    daemon: d.clone(),
                    run_id,
                    goal,
                    retried: retry,
                });
            }
        }
        if out.iter().any(|r| r.retried) {
            tx.execute("NOTIFY sup_trigger", &[])
                .await
                .map_err(|e| self.err(&e))?;
        }
        tx.commit().await.map_err(|e| self.err(&e))?;
        Ok(out)
    }

    /// The fleet, newest first; dead and stopped members of the last day too.
    pub(crate) async fn daemons(&self) -> Result<Vec<DaemonRow>, PgError> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT d.id, d.host, d.pid, d.version, d.tags, d.max_concurrent, d.started_at,
                     d.renewed_at,
                     CASE WHEN d.state = 'alive'
                          AND d.renewed_at < now() - d.lease_ms * interval '1 millisecond'
                          THEN 'overdue' ELSE d.state END,
                     coalesce((SELECT array_agg(r.goal || ' (' || r.id || ')' ORDER BY r.id)
                               FROM runs r WHERE r.daemon_id = d.id AND r.status = 'running'),
                              '{}')
                 FROM daemons d
                 WHERE d.state = 'alive' OR d.stopped_at > now() - interval '1 day'
                 ORDER BY d.started_at DESC",
                &[],
            )
            .await
            .map_err(|e| self.err(&e))?;
        Ok(rows
            .iter()
            .map(|r| DaemonRow {
                id: r.get(0),
                host: r.get(1),
                pid: r.get(2),
                version: r.get(3),
                tags: r.get(4),
                max_concurrent: r.get(5),
                started_at: r.get(6),
                renewed_at: r.get(7),
                state: r.get(8),
                running: r.get(9),
            })
            .collect())
    }

    /// Whether a daemon with a live lease serves `goal` (it published a version of it).
    pub(crate) async fn live_daemon_for(&self, goal: &str) -> Result<bool, PgError> {
        let c = self.client().await?;
        let row = c
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM daemons d JOIN goal_versions v ON v.daemon_id = d.id
                     WHERE v.goal = $1 AND d.state = 'alive'
                       AND d.renewed_at >= now() - d.lease_ms * interval '1 millisecond')",
                &[&goal],
            )
            .await
            .map_err(|e| self.err(&e))?;
        Ok(row.get(0))
    }
}
