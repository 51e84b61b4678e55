//! The SQLite schema: its migrations, in order, each applied once (`user_version`).

pub(super) const MIGRATIONS: &[&str] = &[
    // 1: the first schema.
    "CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        goal TEXT NOT NULL,
        trigger TEXT NOT NULL,
        scheduled_for TEXT,
        status TEXT NOT NULL,
        stop_reason TEXT,
        tries INTEGER NOT NULL DEFAULT 0,
        steps INTEGER NOT NULL DEFAULT 0,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        cache_read_tokens INTEGER NOT NULL DEFAULT 0,
        cache_write_tokens INTEGER NOT NULL DEFAULT 0,
        started_at TEXT NOT NULL,
        ended_at TEXT,
        error TEXT,
        pid INTEGER NOT NULL,
        model TEXT NOT NULL,
        workspace TEXT NOT NULL,
        dir TEXT NOT NULL
    );
    CREATE INDEX runs_goal ON runs (goal, started_at);
    CREATE TABLE checks (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        try INTEGER NOT NULL,
        idx INTEGER NOT NULL,
        name TEXT NOT NULL,
        passed INTEGER NOT NULL,
        exit_status INTEGER,
        outcome TEXT NOT NULL,
        duration_ms INTEGER NOT NULL,
        output_path TEXT,
        PRIMARY KEY (run_id, try, idx)
    );
    CREATE TABLE occurrences (
        goal TEXT NOT NULL,
        scheduled_for TEXT NOT NULL,
        status TEXT NOT NULL,
        run_id TEXT,
        claimed_by TEXT NOT NULL,
        claimed_at TEXT NOT NULL,
        PRIMARY KEY (goal, scheduled_for)
    );
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        goal TEXT NOT NULL,
        kind TEXT NOT NULL,
        tool TEXT NOT NULL,
        input TEXT NOT NULL,
        created_at TEXT NOT NULL,
        deadline TEXT NOT NULL,
        status TEXT NOT NULL,
        always INTEGER NOT NULL DEFAULT 0,
        reason TEXT,
        decided_at TEXT,
        decided_by TEXT
    );
    CREATE INDEX approvals_status ON approvals (status);
    CREATE TABLE goal_state (
        goal TEXT PRIMARY KEY,
        paused INTEGER NOT NULL DEFAULT 0,
        last_occurrence TEXT
    );",
    // 2: unattended operation: the answer (for `{{ previous.answer }}`), the cost in US
    // dollars, and every notification attempt.
    "ALTER TABLE runs ADD COLUMN answer TEXT;
    ALTER TABLE runs ADD COLUMN cost REAL;
    CREATE TABLE notifications (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT,
        goal TEXT NOT NULL,
        event TEXT NOT NULL,
        channel TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        at TEXT NOT NULL,
        ok INTEGER NOT NULL,
        detail TEXT NOT NULL
    );
    CREATE INDEX notifications_run ON notifications (run_id);",
    // 3: the newest runs first, by status (the web console's pages, orphan sweeps).
    "CREATE INDEX runs_started ON runs (started_at, id);
    CREATE INDEX runs_status ON runs (status, started_at);",
    // 4: times written with a fixed width (milliseconds), so that comparing their text
    // compares the times: the times written before are rewritten so. And what pruned runs
    // cost, for `max_cost_per_day`, kept for two days.
    "UPDATE runs SET
        started_at = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', started_at), started_at),
        ended_at = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', ended_at), ended_at),
        scheduled_for = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', scheduled_for), scheduled_for);
    UPDATE OR IGNORE occurrences SET
        scheduled_for = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', scheduled_for), scheduled_for),
        claimed_at = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', claimed_at), claimed_at);
    UPDATE approvals SET
        created_at = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', created_at), created_at),
        deadline = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', deadline), deadline),
        decided_at = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', decided_at), decided_at);
    UPDATE notifications SET
        at = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', at), at);
    UPDATE goal_state SET
        last_occurrence = coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', last_occurrence), last_occurrence);
    CREATE TABLE spent (goal TEXT NOT NULL, started_at TEXT NOT NULL, cost REAL NOT NULL);
    CREATE INDEX spent_goal ON spent (goal, started_at);",
    // 5: runs tied together and what an isolated run left (`crate::store::lineage`): the run
    // a continued run goes on from, a parallel attempt's run and number, the worktree branch,
    // its base and commit, the diff's summary and the repository.
    concat!(
        lineage_ddl!(),
        "
    CREATE INDEX runs_parent ON runs (parent);
    CREATE INDEX runs_continued ON runs (continued_from);"
    ),
    // 6: the webhook deliveries a goal took, so that one delivered again runs nothing.
    "CREATE TABLE webhook_deliveries (
        goal TEXT NOT NULL,
        delivery TEXT NOT NULL,
        received_at TEXT NOT NULL,
        PRIMARY KEY (goal, delivery)
    );",
];
