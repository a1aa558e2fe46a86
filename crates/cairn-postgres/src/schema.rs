//! The schema and its migrations. Each runs once, in order, in its own transaction
//! (PostgreSQL's DDL is transactional), recorded in `cairn_schema`; a database written by a
//! newer build (a version this build does not know) is refused.
//!
//! The layout mirrors the SQLite store's after its migration 9 (`cairn_store::packing`):
//! configurations stored once, two records of one step per log row. Log ids are handed out
//! by `log_clock` at the very end of each writing transaction, under its row lock, so ids
//! are in commit order (see `history.rs`).

use std::time::Duration;

use tokio_postgres::Client;

const MIGRATIONS: &[&str] = &[
    // 1: everything.
    "
    CREATE TABLE instances (
        iid               BIGSERIAL PRIMARY KEY,
        workflow          TEXT NOT NULL,
        id                TEXT NOT NULL,
        status            BIGINT NOT NULL,
        params            TEXT NOT NULL,
        created_at        BIGINT NOT NULL,
        started_at        BIGINT,
        ended_at          BIGINT,
        output            TEXT,
        error_name        TEXT,
        error_message     TEXT,
        -- claimable from ready_at on; rank 0 (resuming) is claimed before rank 1 (new)
        ready_rank        BIGINT NOT NULL DEFAULT 1,
        ready_at          BIGINT,
        lease_owner       TEXT,
        lease_epoch       BIGINT NOT NULL DEFAULT 0,
        lease_until       BIGINT,
        paused_at         BIGINT,
        retain_success_ms BIGINT NOT NULL,
        retain_error_ms   BIGINT NOT NULL,
        purge_at          BIGINT,
        rollback_trigger  TEXT,
        rollback_outcome  TEXT,
        UNIQUE (workflow, id)
    );
    CREATE INDEX instances_ready ON instances (ready_rank, ready_at) WHERE ready_at IS NOT NULL;
    CREATE INDEX instances_next_ready ON instances (workflow, ready_at) WHERE ready_at IS NOT NULL;
    CREATE INDEX instances_lease ON instances (lease_until) WHERE lease_owner IS NOT NULL;
    CREATE INDEX instances_lease_owner ON instances (lease_owner) WHERE lease_owner IS NOT NULL;
    CREATE INDEX instances_by_status ON instances (workflow, status, iid);
    CREATE INDEX instances_by_workflow ON instances (workflow, iid);
    CREATE INDEX instances_purge ON instances (purge_at) WHERE purge_at IS NOT NULL;
    CREATE INDEX instances_pausing ON instances (lease_until) WHERE status = 6;

    -- Counts by status without counting rows: a trigger appends each change as a delta
    -- row in the same transaction (appends only: concurrent engines never wait on one
    -- counter row, nor deadlock on two), and the writers fold the deltas into
    -- `instance_counts` every second (`counts.rs`). A count is the folded value plus the
    -- few deltas not folded yet.
    CREATE TABLE instance_counts (
        workflow TEXT NOT NULL,
        status   BIGINT NOT NULL,
        n        BIGINT NOT NULL,
        PRIMARY KEY (workflow, status)
    );
    CREATE TABLE instance_count_deltas (
        id       BIGSERIAL PRIMARY KEY,
        workflow TEXT NOT NULL,
        status   BIGINT NOT NULL,
        delta    BIGINT NOT NULL
    );
    CREATE INDEX instance_count_deltas_by_status ON instance_count_deltas (workflow, status);
    CREATE FUNCTION cairn_count_instances() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP IN ('UPDATE', 'DELETE') THEN
            INSERT INTO instance_count_deltas (workflow, status, delta)
            VALUES (OLD.workflow, OLD.status, -1);
        END IF;
        IF TG_OP IN ('UPDATE', 'INSERT') THEN
            INSERT INTO instance_count_deltas (workflow, status, delta)
            VALUES (NEW.workflow, NEW.status, 1);
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER instances_counted_insert AFTER INSERT OR DELETE ON instances
        FOR EACH ROW EXECUTE FUNCTION cairn_count_instances();
    CREATE TRIGGER instances_counted_update AFTER UPDATE OF status ON instances
        FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
        EXECUTE FUNCTION cairn_count_instances();

    CREATE TABLE configs (
        id     BIGSERIAL PRIMARY KEY,
        config TEXT NOT NULL UNIQUE
    );

    CREATE TABLE steps (
        iid           BIGINT NOT NULL,
        kind          BIGINT NOT NULL,
        name          TEXT NOT NULL,
        count         BIGINT NOT NULL,
        seq           BIGINT NOT NULL,
        state         BIGINT NOT NULL,
        config        BIGINT NOT NULL,
        attempts      BIGINT NOT NULL,
        in_flight     BOOLEAN NOT NULL,
        wake_at       BIGINT,
        output        TEXT,
        error_name    TEXT,
        error_message TEXT,
        started_at    BIGINT NOT NULL,
        ended_at      BIGINT,
        has_rollback  BOOLEAN NOT NULL,
        PRIMARY KEY (iid, kind, name, count)
    );

    -- The last log id handed out. Its row lock, taken last in every transaction that
    -- writes records, orders ids by commit.
    CREATE TABLE log_clock (last BIGINT NOT NULL);
    INSERT INTO log_clock VALUES (0);

    CREATE TABLE log (
        id         BIGINT PRIMARY KEY,
        iid        BIGINT NOT NULL,
        at         BIGINT NOT NULL,
        kind       BIGINT NOT NULL,
        step_kind  BIGINT,
        step_name  TEXT,
        step_count BIGINT,
        meta       TEXT NOT NULL,
        config     BIGINT,
        kind2      BIGINT,
        meta2      TEXT
    );
    CREATE INDEX log_by_instance ON log (iid, id);

    CREATE TABLE events (
        id      BIGSERIAL PRIMARY KEY,
        iid     BIGINT NOT NULL,
        type    TEXT NOT NULL,
        payload TEXT NOT NULL,
        at      BIGINT NOT NULL
    );
    CREATE INDEX events_by_type ON events (iid, type, id);

    CREATE TABLE event_keys (
        iid BIGINT NOT NULL,
        key TEXT NOT NULL,
        at  BIGINT NOT NULL,
        PRIMARY KEY (iid, key)
    );
    ",
    // 2: child workflows: the parent instance and `invoke` step that started an instance
    // (the reference indexed, to find a parent's children and wake a parent; the rest of
    // the link as JSON, `ParentLink::encode`).
    "
    ALTER TABLE instances ADD COLUMN parent_iid BIGINT;
    ALTER TABLE instances ADD COLUMN parent TEXT;
    CREATE INDEX instances_children ON instances (parent_iid, iid) WHERE parent_iid IS NOT NULL;
    ",
    // 3: cron schedules created over the API, and the paused state of those in code.
    "
    CREATE TABLE schedules (
        name       TEXT PRIMARY KEY,
        definition TEXT,
        paused     BOOLEAN NOT NULL,
        resumed_at BIGINT,
        updated_at BIGINT NOT NULL
    );
    ",
    // 4: keyed concurrency and priority (as SQLite's migration 12).
    "
    ALTER TABLE instances ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE instances ADD COLUMN ckey TEXT;
    ALTER TABLE instances ADD COLUMN slot BOOLEAN NOT NULL DEFAULT FALSE;
    ALTER TABLE instances ADD COLUMN parked BOOLEAN NOT NULL DEFAULT FALSE;
    CREATE INDEX instances_parked ON instances (workflow, ckey, priority DESC, iid) WHERE parked;
    CREATE TABLE ckeys (
        workflow     TEXT NOT NULL,
        ckey         TEXT NOT NULL,
        slot_limit   BIGINT NOT NULL,
        hold_waiting BOOLEAN NOT NULL,
        rate_n       BIGINT,
        rate_ms      BIGINT,
        holders      BIGINT NOT NULL DEFAULT 0,
        window_start BIGINT,
        window_count BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (workflow, ckey)
    );
    ",
    // 5: stream step outputs (as SQLite's migration 13).
    "
    CREATE TABLE stream_chunks (
        iid     BIGINT NOT NULL,
        name    TEXT NOT NULL,
        count   BIGINT NOT NULL,
        attempt BIGINT NOT NULL,
        epoch   BIGINT NOT NULL,
        idx     BIGINT NOT NULL,
        data    BYTEA NOT NULL,
        PRIMARY KEY (iid, name, count, attempt, epoch, idx)
    );
    ",
    // 6: what each schedule has fired, stored (as SQLite's migration 14).
    "
    ALTER TABLE schedules ADD COLUMN generation BIGINT NOT NULL DEFAULT 1;
    ALTER TABLE schedules ADD COLUMN last_tick BIGINT;
    ALTER TABLE schedules ADD COLUMN last_run TEXT;
    ALTER TABLE schedules ADD COLUMN deleted BOOLEAN NOT NULL DEFAULT FALSE;
    ALTER TABLE schedules ADD COLUMN legacy BOOLEAN NOT NULL DEFAULT FALSE;
    UPDATE schedules SET legacy = TRUE;
    ",
    // 7: workflows run by workers (as SQLite's migration 15).
    "
    CREATE TABLE workflow_versions (
        workflow      TEXT NOT NULL,
        version       TEXT NOT NULL,
        registered_at BIGINT NOT NULL,
        PRIMARY KEY (workflow, version)
    );
    ALTER TABLE instances ADD COLUMN version TEXT;
    ",
    // 8: which event each idempotency key sent, and which wait took it (as SQLite's
    // migration 18).
    "
    ALTER TABLE event_keys ADD COLUMN event BIGINT;
    ALTER TABLE event_keys ADD COLUMN taken_by BIGINT;
    CREATE INDEX event_keys_by_event ON event_keys (iid, event);
    ",
];

/// Why the schema could not be brought up to date.
#[derive(Debug)]
pub(crate) enum MigrateError {
    Db(tokio_postgres::Error),
    Newer(i64),
    /// Another engine's migration of the same schema did not finish in time.
    Busy(Duration),
}

/// How long an engine waits for another engine's migration of its schema to finish.
const MIGRATION_WAIT: Duration = Duration::from_secs(15 * 60);

impl From<tokio_postgres::Error> for MigrateError {
    fn from(e: tokio_postgres::Error) -> Self {
        MigrateError::Db(e)
    }
}

/// Brings the schema up to date. Engines starting together serialise on an advisory lock
/// (per schema), so each migration runs once; one that finds another engine migrating
/// waits for it (up to [`MIGRATION_WAIT`], saying so every 10 s). The migration's
/// transaction runs without the session's lock, statement and idle limits, which are there
/// for the hot path: a long step on a big table must not be cancelled each time.
pub(crate) async fn migrate(client: &mut Client) -> Result<(), MigrateError> {
    let tx = client.transaction().await?;
    tx.batch_execute(
        "SET LOCAL lock_timeout = 0;
         SET LOCAL statement_timeout = 0;
         SET LOCAL idle_in_transaction_session_timeout = 0;",
    )
    .await?;
    let started = std::time::Instant::now();
    let mut told = started;
    loop {
        let locked: bool = tx
            .query_one(
                "SELECT pg_try_advisory_xact_lock(hashtext('cairn_schema.' || current_schema()))",
                &[],
            )
            .await?
            .get(0);
        if locked {
            break;
        }
        if started.elapsed() >= MIGRATION_WAIT {
            return Err(MigrateError::Busy(MIGRATION_WAIT));
        }
        if told.elapsed() >= Duration::from_secs(10) {
            told = std::time::Instant::now();
            tracing::info!(
                waited_s = started.elapsed().as_secs(),
                "another engine is migrating this schema; waiting for it to finish"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tx.batch_execute("CREATE TABLE IF NOT EXISTS cairn_schema (version BIGINT NOT NULL)")
        .await?;
    let version: Option<i64> = tx
        .query_opt("SELECT MAX(version) FROM cairn_schema", &[])
        .await?
        .and_then(|r| r.get(0));
    let version = version.unwrap_or(0);
    let known = i64::try_from(MIGRATIONS.len()).unwrap_or(i64::MAX);
    if version > known {
        return Err(MigrateError::Newer(version));
    }
    for (i, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(version).unwrap_or(0))
    {
        tx.batch_execute(sql).await?;
        let n = i64::try_from(i + 1).unwrap_or(i64::MAX);
        tx.execute("INSERT INTO cairn_schema (version) VALUES ($1)", &[&n])
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The schema version of the database (0 when Cairn has never written it).
pub(crate) async fn version(client: &Client) -> Result<usize, tokio_postgres::Error> {
    let exists: bool = client
        .query_one("SELECT to_regclass('cairn_schema') IS NOT NULL", &[])
        .await?
        .get(0);
    if !exists {
        return Ok(0);
    }
    let version: Option<i64> = client
        .query_one("SELECT MAX(version) FROM cairn_schema", &[])
        .await?
        .get(0);
    Ok(usize::try_from(version.unwrap_or(0)).unwrap_or(usize::MAX))
}

/// The schema version this build writes.
pub(crate) fn current_version() -> usize {
    MIGRATIONS.len()
}
