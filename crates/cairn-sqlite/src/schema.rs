//! The schema and its migrations. Each migration runs once, in order, recorded in
//! `PRAGMA user_version`.

use rusqlite::Connection;

const MIGRATIONS: &[&str] = &[
    // 1: instances, the journal and the event log.
    "
    CREATE TABLE instances (
        iid           INTEGER PRIMARY KEY,
        workflow      TEXT NOT NULL,
        id            TEXT NOT NULL,
        status        INTEGER NOT NULL,
        params        TEXT NOT NULL,
        created_at    INTEGER NOT NULL,
        started_at    INTEGER,
        ended_at      INTEGER,
        output        TEXT,
        error_name    TEXT,
        error_message TEXT,
        -- claimable from ready_at on; rank 0 (resuming) is claimed before rank 1 (new)
        ready_rank    INTEGER NOT NULL DEFAULT 1,
        ready_at      INTEGER,
        lease_owner   TEXT,
        lease_epoch   INTEGER NOT NULL DEFAULT 0,
        lease_until   INTEGER,
        UNIQUE (workflow, id)
    );
    CREATE INDEX instances_ready ON instances (ready_rank, ready_at) WHERE ready_at IS NOT NULL;
    CREATE INDEX instances_lease ON instances (lease_until) WHERE lease_owner IS NOT NULL;
    CREATE INDEX instances_by_status ON instances (workflow, status, iid);

    CREATE TABLE steps (
        iid           INTEGER NOT NULL,
        kind          INTEGER NOT NULL,
        name          TEXT NOT NULL,
        count         INTEGER NOT NULL,
        seq           INTEGER NOT NULL,
        state         INTEGER NOT NULL,
        config        TEXT NOT NULL,
        attempts      INTEGER NOT NULL,
        in_flight     INTEGER NOT NULL,
        wake_at       INTEGER,
        output        TEXT,
        error_name    TEXT,
        error_message TEXT,
        started_at    INTEGER NOT NULL,
        ended_at      INTEGER,
        has_rollback  INTEGER NOT NULL,
        PRIMARY KEY (iid, kind, name, count)
    ) WITHOUT ROWID;

    CREATE TABLE log (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        iid        INTEGER NOT NULL,
        at         INTEGER NOT NULL,
        kind       INTEGER NOT NULL,
        step_kind  INTEGER,
        step_name  TEXT,
        step_count INTEGER,
        meta       TEXT NOT NULL
    );
    CREATE INDEX log_by_instance ON log (iid, id);
    ",
    // 2: buffered events, first in first out per instance and type.
    "
    CREATE TABLE events (
        id      INTEGER PRIMARY KEY AUTOINCREMENT,
        iid     INTEGER NOT NULL,
        type    TEXT NOT NULL,
        payload TEXT NOT NULL,
        at      INTEGER NOT NULL
    );
    CREATE INDEX events_by_type ON events (iid, type, id);
    ",
    // 3: when a pause was requested (or took effect), to shift timers on resume.
    "
    ALTER TABLE instances ADD COLUMN paused_at INTEGER;
    ",
    // 4: retention: how long to keep a finished instance, and when it is due.
    "
    ALTER TABLE instances ADD COLUMN retain_success_ms INTEGER NOT NULL DEFAULT 604800000;
    ALTER TABLE instances ADD COLUMN retain_error_ms INTEGER NOT NULL DEFAULT 604800000;
    ALTER TABLE instances ADD COLUMN purge_at INTEGER;
    CREATE INDEX instances_purge ON instances (purge_at) WHERE purge_at IS NOT NULL;
    ",
    // 5: saga rollbacks: what triggered one (set when it begins) and how it ended.
    "
    ALTER TABLE instances ADD COLUMN rollback_trigger TEXT;
    ALTER TABLE instances ADD COLUMN rollback_outcome TEXT;
    ",
    // 6: instance refs are never reused (and retention saturates, see below). Without AUTOINCREMENT, deleting or purging the
    // newest instance gave the next one the same rowid, and (at its first claim) the same
    // lease epoch: a stale lifetime of the deleted instance could then commit into the new
    // one. SQLite cannot add AUTOINCREMENT to a column, so the table is rebuilt.
    "
    CREATE TABLE instances_v6 (
        iid               INTEGER PRIMARY KEY AUTOINCREMENT,
        workflow          TEXT NOT NULL,
        id                TEXT NOT NULL,
        status            INTEGER NOT NULL,
        params            TEXT NOT NULL,
        created_at        INTEGER NOT NULL,
        started_at        INTEGER,
        ended_at          INTEGER,
        output            TEXT,
        error_name        TEXT,
        error_message     TEXT,
        ready_rank        INTEGER NOT NULL DEFAULT 1,
        ready_at          INTEGER,
        lease_owner       TEXT,
        lease_epoch       INTEGER NOT NULL DEFAULT 0,
        lease_until       INTEGER,
        paused_at         INTEGER,
        retain_success_ms INTEGER NOT NULL DEFAULT 604800000,
        retain_error_ms   INTEGER NOT NULL DEFAULT 604800000,
        purge_at          INTEGER,
        rollback_trigger  TEXT,
        rollback_outcome  TEXT,
        UNIQUE (workflow, id)
    );
    INSERT INTO instances_v6 (iid, workflow, id, status, params, created_at, started_at,
        ended_at, output, error_name, error_message, ready_rank, ready_at, lease_owner,
        lease_epoch, lease_until, paused_at, retain_success_ms, retain_error_ms, purge_at,
        rollback_trigger, rollback_outcome)
    SELECT iid, workflow, id, status, params, created_at, started_at,
        ended_at, output, error_name, error_message, ready_rank, ready_at, lease_owner,
        lease_epoch, lease_until, paused_at,
        -- Retention saturates at 2^62 ms (rows.rs, MAX_RETAIN_MS); a purge time that
        -- overflowed into a REAL is computed again.
        MIN(retain_success_ms, 4611686018427387904), MIN(retain_error_ms, 4611686018427387904),
        CASE WHEN typeof(purge_at) = 'real' THEN ended_at + MIN(
            CASE WHEN status = 5 THEN retain_success_ms ELSE retain_error_ms END,
            4611686018427387904) ELSE purge_at END,
        rollback_trigger, rollback_outcome
    FROM instances;
    DROP TABLE instances;
    ALTER TABLE instances_v6 RENAME TO instances;
    CREATE INDEX instances_ready ON instances (ready_rank, ready_at) WHERE ready_at IS NOT NULL;
    CREATE INDEX instances_lease ON instances (lease_until) WHERE lease_owner IS NOT NULL;
    CREATE INDEX instances_by_status ON instances (workflow, status, iid);
    CREATE INDEX instances_purge ON instances (purge_at) WHERE purge_at IS NOT NULL;
    -- Rows a reused rowid may have left behind belong to no instance.
    DELETE FROM steps WHERE iid NOT IN (SELECT iid FROM instances);
    DELETE FROM log WHERE iid NOT IN (SELECT iid FROM instances);
    DELETE FROM events WHERE iid NOT IN (SELECT iid FROM instances);
    ",
    // 7: idempotency keys of sent events, so a retried send is delivered once; kept with
    // the instance (also after its event is consumed), cleared by restart and delete.
    "
    CREATE TABLE event_keys (
        iid INTEGER NOT NULL,
        key TEXT NOT NULL,
        at  INTEGER NOT NULL,
        PRIMARY KEY (iid, key)
    ) WITHOUT ROWID;
    ",
    // 8: every hot query an index seek or a bounded range, however much history is kept.
    // The next wake-up per workflow (MIN over a partial index), a workflow's instances
    // newest first (listing without a status), the pending pauses taken over at open, and
    // counts by status kept by triggers in the same transaction as the change, instead of
    // counting the rows.
    "
    CREATE INDEX instances_next_ready ON instances (workflow, ready_at) WHERE ready_at IS NOT NULL;
    CREATE INDEX instances_by_workflow ON instances (workflow, iid);
    CREATE INDEX instances_pausing ON instances (status) WHERE status = 6;
    CREATE TABLE instance_counts (
        workflow TEXT NOT NULL,
        status   INTEGER NOT NULL,
        n        INTEGER NOT NULL,
        PRIMARY KEY (workflow, status)
    ) WITHOUT ROWID;
    INSERT INTO instance_counts (workflow, status, n)
        SELECT workflow, status, COUNT(*) FROM instances GROUP BY workflow, status;
    CREATE TRIGGER instances_counted_insert AFTER INSERT ON instances BEGIN
        INSERT OR IGNORE INTO instance_counts (workflow, status, n) VALUES (NEW.workflow, NEW.status, 0);
        UPDATE instance_counts SET n = n + 1 WHERE workflow = NEW.workflow AND status = NEW.status;
    END;
    CREATE TRIGGER instances_counted_delete AFTER DELETE ON instances BEGIN
        UPDATE instance_counts SET n = n - 1 WHERE workflow = OLD.workflow AND status = OLD.status;
    END;
    CREATE TRIGGER instances_counted_update AFTER UPDATE OF status ON instances
    WHEN OLD.status <> NEW.status BEGIN
        UPDATE instance_counts SET n = n - 1 WHERE workflow = OLD.workflow AND status = OLD.status;
        INSERT OR IGNORE INTO instance_counts (workflow, status, n) VALUES (NEW.workflow, NEW.status, 0);
        UPDATE instance_counts SET n = n + 1 WHERE workflow = NEW.workflow AND status = NEW.status;
    END;
    ANALYZE;
    ",
    // 9: smaller history. A step's configuration is stored once per distinct text
    // (`configs`), referenced by the step and by its `STEP_START` record instead of being
    // written into both; and a log row holds up to two records of the same step committed
    // together (`kind2`, `meta2`: `STEP_START` + `ATTEMPT_START`, `ATTEMPT_SUCCESS` +
    // `STEP_SUCCESS`), the second with the id after the row's. Rows written from now on take
    // ids two apart; older rows keep theirs and their full `meta`.
    "
    CREATE TABLE configs (
        id     INTEGER PRIMARY KEY,
        config TEXT NOT NULL UNIQUE
    );
    INSERT OR IGNORE INTO configs (config) SELECT config FROM steps;
    CREATE TABLE steps_v9 (
        iid           INTEGER NOT NULL,
        kind          INTEGER NOT NULL,
        name          TEXT NOT NULL,
        count         INTEGER NOT NULL,
        seq           INTEGER NOT NULL,
        state         INTEGER NOT NULL,
        config        INTEGER NOT NULL,
        attempts      INTEGER NOT NULL,
        in_flight     INTEGER NOT NULL,
        wake_at       INTEGER,
        output        TEXT,
        error_name    TEXT,
        error_message TEXT,
        started_at    INTEGER NOT NULL,
        ended_at      INTEGER,
        has_rollback  INTEGER NOT NULL,
        PRIMARY KEY (iid, kind, name, count)
    ) WITHOUT ROWID;
    INSERT INTO steps_v9 SELECT s.iid, s.kind, s.name, s.count, s.seq, s.state, c.id, s.attempts,
        s.in_flight, s.wake_at, s.output, s.error_name, s.error_message, s.started_at, s.ended_at,
        s.has_rollback
    FROM steps s JOIN configs c ON c.config = s.config;
    DROP TABLE steps;
    ALTER TABLE steps_v9 RENAME TO steps;
    ALTER TABLE log ADD COLUMN config INTEGER;
    ALTER TABLE log ADD COLUMN kind2 INTEGER;
    ALTER TABLE log ADD COLUMN meta2 TEXT;
    ANALYZE;
    ",
    // 10: child workflows: the parent instance and `invoke` step that started an instance.
    // The reference has a column of its own, indexed, to find a parent's children and to
    // wake a parent when a child ends; the rest of the link is JSON (`ParentLink::encode`).
    "
    ALTER TABLE instances ADD COLUMN parent_iid INTEGER;
    ALTER TABLE instances ADD COLUMN parent TEXT;
    CREATE INDEX instances_children ON instances (parent_iid) WHERE parent_iid IS NOT NULL;
    ",
    // 11: cron schedules created over the API, and the paused state of those in code.
    "
    CREATE TABLE schedules (
        name       TEXT PRIMARY KEY,
        definition TEXT,
        paused     INTEGER NOT NULL,
        resumed_at INTEGER,
        updated_at INTEGER NOT NULL
    );
    ",
    // 12: keyed concurrency and priority. `slot`: the instance holds a slot of its key;
    // `parked`: it waits for one (out of the claim order, in `instances_parked`, whose order
    // is priority, then age). A key's limits and holders are one row of `ckeys`.
    "
    ALTER TABLE instances ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE instances ADD COLUMN ckey TEXT;
    ALTER TABLE instances ADD COLUMN slot INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE instances ADD COLUMN parked INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX instances_parked ON instances (workflow, ckey, priority DESC, iid) WHERE parked = 1;
    CREATE TABLE ckeys (
        workflow     TEXT NOT NULL,
        ckey         TEXT NOT NULL,
        slot_limit   INTEGER NOT NULL,
        hold_waiting INTEGER NOT NULL,
        rate_n       INTEGER,
        rate_ms      INTEGER,
        holders      INTEGER NOT NULL DEFAULT 0,
        window_start INTEGER,
        window_count INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (workflow, ckey)
    ) WITHOUT ROWID;
    ",
    // 13: stream step outputs, in chunks of up to 256 KiB per attempt: pending until the
    // step's success names the attempt whose chunks are the output.
    "
    CREATE TABLE stream_chunks (
        iid     INTEGER NOT NULL,
        name    TEXT NOT NULL,
        count   INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        epoch   INTEGER NOT NULL,
        idx     INTEGER NOT NULL,
        data    BLOB NOT NULL,
        PRIMARY KEY (iid, name, count, attempt, epoch, idx)
    ) WITHOUT ROWID;
    ",
    // 14: what each schedule has fired, stored (not inferred from instances): its last
    // tick and run, advanced with the tick's create; a generation per schedule of a name
    // (a deleted schedule's row stays, `deleted`, so one created again is a new one);
    // `legacy` rows were written before, and infer their last tick once.
    "
    ALTER TABLE schedules ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE schedules ADD COLUMN last_tick INTEGER;
    ALTER TABLE schedules ADD COLUMN last_run TEXT;
    ALTER TABLE schedules ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE schedules ADD COLUMN legacy INTEGER NOT NULL DEFAULT 0;
    UPDATE schedules SET legacy = 1;
    ",
    // 15: workflows run by workers (`docs/worker-protocol.md`): the versions they
    // registered, and the version each instance is pinned to.
    "
    CREATE TABLE workflow_versions (
        workflow      TEXT NOT NULL,
        version       TEXT NOT NULL,
        registered_at INTEGER NOT NULL,
        PRIMARY KEY (workflow, version)
    ) WITHOUT ROWID;
    ALTER TABLE instances ADD COLUMN version TEXT;
    ",
    // 16: the count triggers without a conflict clause of their own, so that a statement
    // on `instances` can say `OR FAIL` (which a trigger's statements inherit) and keep its
    // meaning. `OR FAIL` spares the hot status changes and inserts a statement journal:
    // with a trigger, SQLite otherwise copies every page such a statement touches into
    // one, in case it must undo the statement alone (`rows::change_status`).
    "
    DROP TRIGGER instances_counted_insert;
    DROP TRIGGER instances_counted_update;
    CREATE TRIGGER instances_counted_insert AFTER INSERT ON instances BEGIN
        INSERT INTO instance_counts (workflow, status, n)
            SELECT NEW.workflow, NEW.status, 0 WHERE NOT EXISTS
                (SELECT 1 FROM instance_counts WHERE workflow = NEW.workflow AND status = NEW.status);
        UPDATE instance_counts SET n = n + 1 WHERE workflow = NEW.workflow AND status = NEW.status;
    END;
    CREATE TRIGGER instances_counted_update AFTER UPDATE OF status ON instances
    WHEN OLD.status <> NEW.status BEGIN
        UPDATE instance_counts SET n = n - 1 WHERE workflow = OLD.workflow AND status = OLD.status;
        INSERT INTO instance_counts (workflow, status, n)
            SELECT NEW.workflow, NEW.status, 0 WHERE NOT EXISTS
                (SELECT 1 FROM instance_counts WHERE workflow = NEW.workflow AND status = NEW.status);
        UPDATE instance_counts SET n = n + 1 WHERE workflow = NEW.workflow AND status = NEW.status;
    END;
    ",
    // 17: the count triggers insert a status's missing row with `ON CONFLICT DO NOTHING`.
    // Migration 16's `INSERT … SELECT … WHERE NOT EXISTS` reads the table it inserts into,
    // which SQLite runs through a temporary table of its own: three per instance (its
    // insert, its start, its end), about a twentieth of the writer thread's instructions in
    // `cairn-bench throughput`. An upsert's `DO NOTHING` is not a conflict clause: a
    // statement's `OR FAIL`, which the trigger's statements inherit, does not override it
    // (the test below). Neither `DO UPDATE` nor a function call (`changes()`) would do: SQLite
    // counts either as a way to abort, and every status change would then keep a statement
    // journal, which costs more than the temporary tables.
    "
    DROP TRIGGER instances_counted_insert;
    DROP TRIGGER instances_counted_update;
    CREATE TRIGGER instances_counted_insert AFTER INSERT ON instances BEGIN
        INSERT INTO instance_counts (workflow, status, n) VALUES (NEW.workflow, NEW.status, 0)
            ON CONFLICT (workflow, status) DO NOTHING;
        UPDATE instance_counts SET n = n + 1 WHERE workflow = NEW.workflow AND status = NEW.status;
    END;
    CREATE TRIGGER instances_counted_update AFTER UPDATE OF status ON instances
    WHEN OLD.status <> NEW.status BEGIN
        UPDATE instance_counts SET n = n - 1 WHERE workflow = OLD.workflow AND status = OLD.status;
        INSERT INTO instance_counts (workflow, status, n) VALUES (NEW.workflow, NEW.status, 0)
            ON CONFLICT (workflow, status) DO NOTHING;
        UPDATE instance_counts SET n = n + 1 WHERE workflow = NEW.workflow AND status = NEW.status;
    END;
    ",
    // 18: which event each idempotency key sent, and which wait took it (its step's `seq`):
    // a restart from a step keeps the keys of the events its kept waits took (a retried send
    // of one stays a duplicate) and drops the others'. Keys stored before have neither, and
    // go on such a restart, as all keys went before.
    "
    ALTER TABLE event_keys ADD COLUMN event INTEGER;
    ALTER TABLE event_keys ADD COLUMN taken_by INTEGER;
    CREATE INDEX event_keys_by_event ON event_keys (iid, event);
    ",
];

/// Brings the schema up to date.
pub(crate) fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    migrate_to(conn, MIGRATIONS.len())
}

/// Runs the migrations up to and including number `to`.
pub(crate) fn migrate_to(conn: &mut Connection, to: usize) -> rusqlite::Result<()> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let version = usize::try_from(version).unwrap_or(0);
    for (i, sql) in MIGRATIONS.iter().enumerate().take(to).skip(version) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(
            None,
            "user_version",
            i64::try_from(i + 1).unwrap_or(i64::MAX),
        )?;
        tx.commit()?;
    }
    Ok(())
}

/// The schema version this build writes.
pub(crate) fn current_version() -> usize {
    MIGRATIONS.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The statements on `instances` say `OR FAIL`, which the count triggers inherit: the
    /// triggers of migrations 16 and 17 keep the counts through it, whether or not a status
    /// has a count row yet (before 16, a trigger's `INSERT OR IGNORE` became `OR FAIL` and
    /// failed on an existing row), and the counts match the rows through inserts, changes
    /// and deletes.
    #[test]
    fn the_count_triggers_keep_their_meaning_under_or_fail() {
        let changes = [
            "INSERT OR FAIL INTO instances (workflow, id, status, params, created_at) VALUES ('w', 'a', 0, '{}', 1)",
            "INSERT OR FAIL INTO instances (workflow, id, status, params, created_at) VALUES ('w', 'b', 0, '{}', 1)",
            "INSERT OR FAIL INTO instances (workflow, id, status, params, created_at) VALUES ('v', 'a', 0, '{}', 1)",
            "UPDATE OR FAIL instances SET status = 1 WHERE id = 'a'",
            "UPDATE OR FAIL instances SET status = 1 WHERE workflow = 'w' AND id = 'b'",
            "UPDATE OR FAIL instances SET status = 5 WHERE workflow = 'w' AND id = 'a'",
            "UPDATE OR FAIL instances SET status = 5 WHERE workflow = 'w' AND id = 'a'",
            "DELETE FROM instances WHERE workflow = 'v'",
        ];
        let counts = |conn: &Connection, table: &str| -> Vec<(String, i64, i64)> {
            let sql = if table == "instance_counts" {
                "SELECT workflow, status, n FROM instance_counts WHERE n > 0 ORDER BY 1, 2"
            } else {
                "SELECT workflow, status, COUNT(*) FROM instances GROUP BY 1, 2 ORDER BY 1, 2"
            };
            let mut st = conn.prepare(sql).expect("prepare");
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .expect("query")
                .collect::<rusqlite::Result<_>>()
                .expect("rows")
        };
        let mut conn = Connection::open_in_memory().expect("open");
        migrate(&mut conn).expect("migrate");
        for sql in changes {
            conn.execute(sql, [])
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            assert_eq!(counts(&conn, "instance_counts"), counts(&conn, "instances"));
        }
        assert_eq!(
            counts(&conn, "instance_counts"),
            [("w".to_string(), 1, 1), ("w".to_string(), 5, 1)]
        );

        // A store upgraded from 16 to 17 in the middle keeps counting.
        let mut upgraded = Connection::open_in_memory().expect("open");
        migrate_to(&mut upgraded, 16).expect("migrate to 16");
        for (i, sql) in changes.iter().enumerate() {
            if i == 4 {
                migrate(&mut upgraded).expect("migrate from 16");
            }
            upgraded
                .execute(sql, [])
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            assert_eq!(
                counts(&upgraded, "instance_counts"),
                counts(&upgraded, "instances")
            );
        }

        // The triggers before 16 could not take it: the second insert fails.
        let mut old = Connection::open_in_memory().expect("open");
        migrate_to(&mut old, 15).expect("migrate to 15");
        old.execute(changes[0], []).expect("first insert");
        assert!(old.execute(changes[1], []).is_err());
    }
}
