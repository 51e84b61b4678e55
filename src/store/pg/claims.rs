//! Claims of occurrences and manual triggers: each exactly once, pause and overlap decided
//! under a per-goal lock.

use super::*;

// The claim's statements (see `PgStore::claim`).
const CLAIM_LOCK: &str = "SELECT pg_advisory_xact_lock(h) FROM
    (SELECT DISTINCT hashtext(g) AS h FROM unnest($1::text[]) g ORDER BY 1) s";
const CLAIM_INSERT: &str = "WITH ins AS (
        INSERT INTO occurrences (goal, scheduled_for, kind, status, claimed_by, claimed_at)
        SELECT g, t, $3, 'claimed', $4, now() FROM unnest($1::text[], $2::timestamptz[]) AS u(g, t)
        ON CONFLICT DO NOTHING RETURNING goal, scheduled_for),
    last AS (
        INSERT INTO goal_state (goal, last_occurrence)
        SELECT goal, max(scheduled_for) FROM ins WHERE $3::text = 'schedule' GROUP BY goal
        ON CONFLICT (goal) DO UPDATE SET last_occurrence =
            greatest(goal_state.last_occurrence, excluded.last_occurrence))
    SELECT goal, scheduled_for FROM ins";
/// Of each goal that is paused, running or has an occurrence waiting: (goal, paused, running
/// run ids, waiting).
const CLAIM_STATE: &str = "SELECT * FROM (
        SELECT g.goal,
            coalesce((SELECT s.paused FROM goal_state s WHERE s.goal = g.goal), false) AS p,
            coalesce((SELECT array_agg(r.id ORDER BY r.id) FROM runs r
                      WHERE r.goal = g.goal AND r.status = 'running'), '{}') AS r,
            EXISTS (SELECT 1 FROM occurrences o WHERE o.goal = g.goal AND o.status = 'queued') AS q
        FROM (SELECT DISTINCT unnest($1::text[]) AS goal) g) x
    WHERE p OR q OR cardinality(r) > 0";
const CLAIM_START: &str = "WITH made AS (
        INSERT INTO runs (id, goal, trigger, scheduled_for, status, started_at, daemon_id, host,
            pid, retry_interrupted)
        SELECT i, g, $4::text, CASE WHEN $4::text = 'schedule' THEN t END, 'running',
            clock_timestamp(), $5, $6, $7, r
        FROM unnest($1::text[], $2::text[], $3::timestamptz[], $8::bool[]) AS u(i, g, t, r))
    UPDATE occurrences o SET status = 'running', run_id = u.i
    FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS u(i, g, t)
    WHERE o.goal = u.g AND o.scheduled_for = u.t";
const CLAIM_SETTLE: &str = "UPDATE occurrences o SET status = u.s
    FROM unnest($1::text[], $2::timestamptz[], $3::text[]) AS u(g, t, s)
    WHERE o.goal = u.g AND o.scheduled_for = u.t";
const CLAIM_REPLACE: &str = "WITH asked AS (
        UPDATE runs r SET cancel_requested = true,
            error = coalesce(r.error, 'replaced by run ' || u.n || ' (overlap replace)')
        FROM unnest($1::text[], $2::text[]) AS u(o, n) WHERE r.id = u.o AND r.status = 'running'
        RETURNING r.id)
    SELECT pg_notify('sup_cancel', id) FROM asked";
const CLAIM_OWNED: &str = "SELECT o.goal, o.scheduled_for, o.status, o.run_id FROM occurrences o
    JOIN unnest($1::text[], $2::timestamptz[]) AS u(g, t)
        ON o.goal = u.g AND o.scheduled_for = u.t
    WHERE o.claimed_by = $3";

impl PgStore {
    /// Claim occurrences in one transaction: each is inserted once (unique on goal and time);
    /// under a per-goal lock, pause and overlap are decided from the store; a run row is made
    /// for each that starts. Safe to call again after a failed commit: what this daemon
    /// already owns is reported again. Four round trips whatever the batch's size: the
    /// statements are prepared once per connection and sent in two pipelines.
    pub(crate) async fn claim(
        &self,
        me: &Claimer,
        kind: TriggerKind,
        due: &[Due],
    ) -> Result<Vec<Claimed>, PgError> {
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let err = |e: tokio_postgres::Error| self.err(&e);
        // The store keeps microseconds: compare what it will give back.
        let due: Vec<Due> = due
            .iter()
            .cloned()
            .map(|mut d| {
                d.at = d.at.trunc_subsecs(6);
                d
            })
            .collect();
        let goals: Vec<&str> = due.iter().map(|d| d.goal.as_str()).collect();
        let ats: Vec<DateTime<Utc>> = due.iter().map(|d| d.at).collect();
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(err)?;
        let (lock, insert, state, start, settle, ask, owned) = futures::try_join!(
            tx.prepare_cached(CLAIM_LOCK),
            tx.prepare_cached(CLAIM_INSERT),
            tx.prepare_cached(CLAIM_STATE),
            tx.prepare_cached(CLAIM_START),
            tx.prepare_cached(CLAIM_SETTLE),
            tx.prepare_cached(CLAIM_REPLACE),
            tx.prepare_cached(CLAIM_OWNED),
        )
        .map_err(err)?;
        // One pipeline: the per-goal locks (in a fixed order, so daemons never deadlock),
        // the occurrences inserted once, and what the store says of each goal.
        let by_goal: [&(dyn ToSql + Sync); 1] = [&goals];
        let insert_params: [&(dyn ToSql + Sync); 4] = [&goals, &ats, &kind, &me.id];
        let (_, fresh, state) = futures::try_join!(
            tx.execute(&lock, &by_goal),
            tx.query(&insert, &insert_params),
            tx.query(&state, &by_goal),
        )
        .map_err(err)?;
        let fresh: HashSet<(String, DateTime<Utc>)> =
            fresh.iter().map(|r| (r.get(0), r.get(1))).collect();
        let mut paused: HashSet<String> = HashSet::new();
        let mut running: HashMap<String, Vec<String>> = HashMap::new();
        let mut waiting: HashSet<String> = HashSet::new();
        for r in &state {
            let goal: String = r.get(0);
            if r.get(1) {
                paused.insert(goal.clone());
            }
            if r.get(3) {
                waiting.insert(goal.clone());
            }
            running.insert(goal, r.get(2));
        }
        let mut starts: Vec<(&Due, String)> = Vec::new();
        let mut nots: Vec<(&Due, OccurrenceStatus)> = Vec::new();
        // Runs a newer occurrence replaces (overlap `replace`), each with its replacement.
        let mut replace: Vec<(String, String)> = Vec::new();
        for d in due
            .iter()
            .filter(|d| fresh.contains(&(d.goal.clone(), d.at)))
        {
            if paused.contains(&d.goal) {
                nots.push((d, OccurrenceStatus::Paused));
                continue;
            }
            let busy = running.get(&d.goal).is_some_and(|r| !r.is_empty());
            let replaced = match policy::overlap(d.overlap, busy, waiting.contains(&d.goal)) {
                Decision::Start => Vec::new(),
                Decision::Replace => running.remove(&d.goal).unwrap_or_default(),
                Decision::Queue => {
                    waiting.insert(d.goal.clone());
                    nots.push((d, OccurrenceStatus::Queued));
                    continue;
                }
                Decision::Skip => {
                    nots.push((d, OccurrenceStatus::Skipped));
                    continue;
                }
            };
            let id = crate::store::new_run_id();
            replace.extend(replaced.into_iter().map(|old| (old, id.clone())));
            running.entry(d.goal.clone()).or_default().push(id.clone());
            starts.push((d, id));
        }
        let ids: Vec<&str> = starts.iter().map(|(_, id)| id.as_str()).collect();
        let start_goals: Vec<&str> = starts.iter().map(|(d, _)| d.goal.as_str()).collect();
        let start_ats: Vec<DateTime<Utc>> = starts.iter().map(|(d, _)| d.at).collect();
        let retry: Vec<bool> = starts.iter().map(|(d, _)| d.retry_interrupted).collect();
        let not_goals: Vec<&str> = nots.iter().map(|(d, _)| d.goal.as_str()).collect();
        let not_ats: Vec<DateTime<Utc>> = nots.iter().map(|(d, _)| d.at).collect();
        let not_status: Vec<OccurrenceStatus> = nots.iter().map(|(_, s)| *s).collect();
        let (old, new): (Vec<&str>, Vec<&str>) = replace
            .iter()
            .map(|(o, n)| (o.as_str(), n.as_str()))
            .unzip();
        let pid = std::process::id() as i32;
        // The other pipeline: run rows for what starts, the others' statuses, the replaced
        // runs told (at once by `NOTIFY`, or at their daemon's next renewal), and what this
        // daemon owns of the batch (with what an earlier attempt whose commit went unanswered
        // claimed).
        let start_params: [&(dyn ToSql + Sync); 8] = [
            &ids,
            &start_goals,
            &start_ats,
            &kind,
            &me.id,
            &me.host,
            &pid,
            &retry,
        ];
        let settle_params: [&(dyn ToSql + Sync); 3] = [&not_goals, &not_ats, &not_status];
        let ask_params: [&(dyn ToSql + Sync); 2] = [&old, &new];
        let owned_params: [&(dyn ToSql + Sync); 3] = [&goals, &ats, &me.id];
        let (_, _, _, owned) = futures::try_join!(
            tx.execute(&start, &start_params),
            tx.execute(&settle, &settle_params),
            tx.execute(&ask, &ask_params),
            tx.query(&owned, &owned_params),
        )
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(owned
            .iter()
            .map(|r| {
                let goal: String = r.get(0);
                let at: DateTime<Utc> = r.get(1);
                let status: OccurrenceStatus = r.get(2);
                match (status, r.get::<_, Option<String>>(3)) {
                    (OccurrenceStatus::Running, Some(run_id)) => Claimed::Run { goal, at, run_id },
                    _ => Claimed::Not { goal, at, status },
                }
            })
            .collect())
    }

    /// Record occurrences that no one will run (missed while no daemon ran).
    pub(crate) async fn missed(
        &self,
        me: &Claimer,
        goal: &str,
        ats: &[DateTime<Utc>],
    ) -> Result<(), PgError> {
        if ats.is_empty() {
            return Ok(());
        }
        let c = self.client().await?;
        c.execute(
            "INSERT INTO occurrences (goal, scheduled_for, kind, status, claimed_by, claimed_at)
             SELECT $1, t, 'schedule', 'missed', $3, now() FROM unnest($2::timestamptz[]) t
             ON CONFLICT DO NOTHING",
            &[&goal, &ats, &me.id],
        )
        .await
        .map_err(|e| self.err(&e))?;
        c.execute(
            "INSERT INTO goal_state (goal, last_occurrence) VALUES ($1, $2)
             ON CONFLICT (goal) DO UPDATE SET last_occurrence =
                 greatest(goal_state.last_occurrence, excluded.last_occurrence)",
            &[&goal, &ats.iter().max()],
        )
        .await
        .map_err(|e| self.err(&e))?;
        Ok(())
    }

    /// The latest claimed occurrence of each goal.
    pub(crate) async fn last_occurrences(&self) -> Result<HashMap<String, DateTime<Utc>>, PgError> {
        let rows = self.rows(
            "SELECT goal, last_occurrence FROM goal_state WHERE last_occurrence IS NOT NULL",
            &[],
            |r| (r.get(0), r.get(1)),
        );
        Ok(rows.await?.into_iter().collect())
    }

    /// After a run of `goal` ended: the oldest queued occurrence starts when nothing else of
    /// the goal runs.
    pub(crate) async fn take_queued(
        &self,
        me: &Claimer,
        goal: &str,
        retry_interrupted: bool,
    ) -> Result<Option<(DateTime<Utc>, String)>, PgError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(&e))?;
        tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&goal])
            .await
            .map_err(|e| self.err(&e))?;
        let busy: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM runs WHERE goal = $1 AND status = 'running')",
                &[&goal],
            )
            .await
            .map_err(|e| self.err(&e))?
            .get(0);
        if busy {
            return Ok(None);
        }
        let Some(row) = tx
            .query_opt(
                "SELECT scheduled_for, kind FROM occurrences WHERE goal = $1 AND status = 'queued'
                 ORDER BY scheduled_for LIMIT 1 FOR UPDATE SKIP LOCKED",
                &[&goal],
            )
            .await
            .map_err(|e| self.err(&e))?
        else {
            return Ok(None);
        };
        let at: DateTime<Utc> = row.get(0);
        let kind: TriggerKind = row.get(1);
        let id = crate::store::new_run_id();
        tx.execute(
            "INSERT INTO runs (id, goal, trigger, scheduled_for, status, started_at, daemon_id, host,
                 pid, retry_interrupted)
             VALUES ($1, $2, $3, CASE WHEN $3 = 'schedule' THEN $4::timestamptz END, 'running',
                 clock_timestamp(), $5, $6, $7, $8)",
            &[
                &id,
                &goal,
                &kind,
                &at,
                &me.id,
                &me.host,
                &(std::process::id() as i32),
                &retry_interrupted,
            ],
        )
        .await
        .map_err(|e| self.err(&e))?;
        tx.execute(
            "UPDATE occurrences SET status = 'running', run_id = $3, claimed_by = $4
             WHERE goal = $1 AND scheduled_for = $2",
            &[&goal, &at, &id, &me.id],
        )
        .await
        .map_err(|e| self.err(&e))?;
        tx.commit().await.map_err(|e| self.err(&e))?;
        Ok(Some((at, id)))
    }

    /// Ask for a run of `goal` (manual, or a webhook's with its body); a daemon that serves
    /// it picks it up.
    pub(crate) async fn request_trigger(
        &self,
        goal: &str,
        by: &str,
        kind: TriggerKind,
        payload: Option<&str>,
    ) -> Result<i64, PgError> {
        let c = self.client().await?;
        let row = c
            .query_one(
                "INSERT INTO triggers (goal, kind, requested_at, requested_by, status, payload)
                 VALUES ($1, $3, clock_timestamp(), $2, 'pending', $4) RETURNING id",
                &[&goal, &by, &kind, &payload],
            )
            .await
            .map_err(|e| self.err(&e))?;
        c.execute("NOTIFY sup_trigger", &[])
            .await
            .map_err(|e| self.err(&e))?;
        Ok(row.get(0))
    }

    /// Take up to `limit` pending triggers of the goals this daemon serves.
    pub(crate) async fn take_triggers(
        &self,
        me: &Claimer,
        goals: &[String],
        limit: i64,
    ) -> Result<Vec<Taken>, PgError> {
        self.rows(
            "UPDATE triggers SET status = 'claimed', claimed_by = $3 WHERE id IN
                 (SELECT id FROM triggers WHERE status = 'pending' AND goal = ANY($1)
                  ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)
             RETURNING id, goal, kind, requested_at, payload",
            &[&goals, &limit, &me.id],
            |r| Taken {
                id: r.get(0),
                goal: r.get(1),
                kind: r.get(2),
                at: r.get(3),
                payload: r.get(4),
            },
        )
        .await
    }

    /// Record a webhook delivery of `goal`: whether it is new (one seen before, by any
    /// console of the fleet, runs nothing).
    pub(crate) async fn new_delivery(&self, goal: &str, delivery: &str) -> Result<bool, PgError> {
        let c = self.client().await?;
        // Bounded as the local store's (see `crate::store::REPLAY_WINDOW`).
        let window = crate::store::REPLAY_WINDOW.as_secs_f64();
        c.execute(
            "DELETE FROM webhook_deliveries
             WHERE received_at < clock_timestamp() - make_interval(secs => $1)",
            &[&window],
        )
        .await
        .map_err(|e| self.err(&e))?;
        let n = c
            .execute(
                "INSERT INTO webhook_deliveries (goal, delivery, received_at)
                 VALUES ($1, $2, clock_timestamp()) ON CONFLICT DO NOTHING",
                &[&goal, &delivery],
            )
            .await
            .map_err(|e| self.err(&e))?;
        if n == 1 {
            c.execute(
                "DELETE FROM webhook_deliveries WHERE goal = $1 AND delivery IN (
                     SELECT delivery FROM webhook_deliveries WHERE goal = $1
                     ORDER BY received_at DESC OFFSET $2)",
                &[&goal, &crate::store::MAX_DELIVERIES],
            )
            .await
            .map_err(|e| self.err(&e))?;
        }
        Ok(n == 1)
    }

    /// Forget a delivery whose run could not start, so that it may be delivered again.
    pub(crate) async fn forget_delivery(&self, goal: &str, delivery: &str) -> Result<(), PgError> {
        self.execute(
            "DELETE FROM webhook_deliveries WHERE goal = $1 AND delivery = $2",
            &[&goal, &delivery],
        )
        .await
    }

    /// What became of a trigger: its occurrence's status and run.
    pub(crate) async fn settle_trigger(
        &self,
        id: i64,
        status: &str,
        run_id: Option<&str>,
    ) -> Result<(), PgError> {
        self.execute(
            "UPDATE triggers SET status = $2, run_id = $3 WHERE id = $1",
            &[&id, &status, &run_id],
        )
        .await
    }

    /// A trigger's state: (status, run id).
    pub(crate) async fn trigger_state(&self, id: i64) -> Result<(String, Option<String>), PgError> {
        let c = self.client().await?;
        let r = c
            .query_one("SELECT status, run_id FROM triggers WHERE id = $1", &[&id])
            .await
            .map_err(|e| self.err(&e))?;
        Ok((r.get(0), r.get(1)))
    }
}
