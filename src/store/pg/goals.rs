//! Per-goal state in the fleet: pause, and the versions of each goal its daemons hold.

use super::*;

impl PgStore {
    pub(crate) async fn set_paused(&self, goal: &str, paused: bool) -> Result<(), PgError> {
        self.execute(
            "INSERT INTO goal_state (goal, paused) VALUES ($1, $2)
             ON CONFLICT (goal) DO UPDATE SET paused = excluded.paused",
            &[&goal, &paused],
        )
        .await
    }

    /// Publish this daemon's goal versions: (name, content hash, file modified time).
    pub(crate) async fn publish_goals(
        &self,
        daemon: &str,
        goals: &[(String, String, DateTime<Utc>)],
    ) -> Result<(), PgError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(&e))?;
        tx.execute("DELETE FROM goal_versions WHERE daemon_id = $1", &[&daemon])
            .await
            .map_err(|e| self.err(&e))?;
        let n: Vec<&str> = goals.iter().map(|g| g.0.as_str()).collect();
        let h: Vec<&str> = goals.iter().map(|g| g.1.as_str()).collect();
        let m: Vec<DateTime<Utc>> = goals.iter().map(|g| g.2).collect();
        tx.execute(
            "INSERT INTO goal_versions (goal, daemon_id, hash, modified_at)
             SELECT n, $4, h, m FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS u(n, h, m)",
            &[&n, &h, &m, &daemon],
        )
        .await
        .map_err(|e| self.err(&e))?;
        tx.commit().await.map_err(|e| self.err(&e))
    }

    /// Goals whose live daemons hold different versions: (goal, [(daemon, hash, modified)]),
    /// the newest first.
    pub(crate) async fn goal_versions(&self) -> Result<Vec<(String, Vec<GoalVersion>)>, PgError> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT v.goal, v.daemon_id, v.hash, v.modified_at FROM goal_versions v
                 JOIN daemons d ON d.id = v.daemon_id
                 WHERE d.state = 'alive'
                   AND d.renewed_at >= now() - d.lease_ms * interval '1 millisecond'
                   AND v.goal IN (SELECT goal FROM goal_versions vv JOIN daemons dd ON dd.id = vv.daemon_id
                                  WHERE dd.state = 'alive' GROUP BY goal HAVING count(DISTINCT hash) > 1)
                 ORDER BY v.goal, v.modified_at DESC",
                &[],
            )
            .await
            .map_err(|e| self.err(&e))?;
        let mut out: Vec<(String, Vec<GoalVersion>)> = Vec::new();
        for r in rows {
            let goal: String = r.get(0);
            let v = (r.get(1), r.get(2), r.get(3));
            match out.last_mut() {
                Some((g, vs)) if *g == goal => vs.push(v),
                _ => out.push((goal, vec![v])),
            }
        }
        Ok(out)
    }
}
