//! The event log and step configurations in SQLite rows, compactly (migration 9), laid out
//! as `cairn_store::packing` describes: a step's configuration stored once per distinct text
//! in `configs` and referred to by id from its journal row and its `STEP_START` record; up
//! to two records of one step per log row.
//!
//! Rows written before migration 9 hold one record each, with the configuration inside
//! `meta`; they read back unchanged.

use std::cell::RefCell;
use std::collections::HashMap;

use cairn_core::{InstanceId, LogEntry, LogRecord};
use cairn_store::packing::{self, StoredRow};
use cairn_store::{Error, InstanceRef, Result, WorkflowLogPage};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::held::{Held, Statements};
use crate::map_sqlite;

fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::Corrupt(what.to_string())
}

/// The configuration ids the writer thread has seen (`worker`): most steps of a workflow
/// share a few configurations, and each step write and `STEP_START` record needs one.
/// An id learnt in a transaction is only *pending* until that transaction commits: should
/// it be rolled back (the group, or the job's savepoint), the row it names may be gone, so
/// the pending ids are forgotten then. Committed ids stay (configurations are never
/// deleted).
#[derive(Default)]
pub(crate) struct ConfigIds {
    committed: HashMap<String, i64>,
    pending: HashMap<String, i64>,
    /// The last one looked up or learnt, compared before hashing: a workflow's steps mostly
    /// share one configuration, and hashing its text was ~1.5 % of the writer's work per
    /// step. Forgotten with the pending ids (it may be one of them).
    last: Option<(String, i64)>,
}

/// More distinct configurations than this (generated ones, say): start over.
const CONFIG_IDS_HELD: usize = 4096;

thread_local! {
    /// Only the writer thread has one (set by [`ConfigIds::keep_on_this_thread`]): it alone
    /// is told when its transactions end.
    static CONFIG_IDS: RefCell<Option<ConfigIds>> = const { RefCell::new(None) };
}

impl ConfigIds {
    /// Caches configuration ids on this thread, which reports the end of each of its
    /// transactions with [`ConfigIds::committed`] or [`ConfigIds::rolled_back`].
    pub(crate) fn keep_on_this_thread() {
        CONFIG_IDS.with(|ids| *ids.borrow_mut() = Some(ConfigIds::default()));
    }

    /// The transaction committed: its ids are durable.
    pub(crate) fn committed() {
        CONFIG_IDS.with(|ids| {
            if let Some(ids) = ids.borrow_mut().as_mut() {
                if ids.committed.len() + ids.pending.len() > CONFIG_IDS_HELD {
                    ids.committed.clear();
                    ids.pending.clear();
                    ids.last = None;
                    return;
                }
                let pending = std::mem::take(&mut ids.pending);
                ids.committed.extend(pending);
            }
        });
    }

    /// The transaction, or part of it, was rolled back: what it learnt may name nothing.
    pub(crate) fn rolled_back() {
        CONFIG_IDS.with(|ids| {
            if let Some(ids) = ids.borrow_mut().as_mut() {
                ids.pending.clear();
                ids.last = None;
            }
        });
    }

    fn get(config: &str) -> Option<i64> {
        CONFIG_IDS.with(|ids| {
            let mut ids = ids.borrow_mut();
            let ids = ids.as_mut()?;
            if let Some((text, id)) = &ids.last
                && text == config
            {
                return Some(*id);
            }
            let id = ids
                .committed
                .get(config)
                .or_else(|| ids.pending.get(config))
                .copied()?;
            ids.last = Some((config.to_owned(), id));
            Some(id)
        })
    }

    fn learnt(config: &str, id: i64) {
        CONFIG_IDS.with(|ids| {
            if let Some(ids) = ids.borrow_mut().as_mut() {
                ids.pending.insert(config.to_owned(), id);
                ids.last = Some((config.to_owned(), id));
            }
        });
    }
}

/// The id of a configuration's text, stored on first use.
pub(crate) fn config_id(conn: &Connection, config: &str) -> Result<i64> {
    if let Some(id) = ConfigIds::get(config) {
        return Ok(id);
    }
    let found: Option<i64> = conn
        .prepare_cached("SELECT id FROM configs WHERE config = ?1")
        .and_then(|mut st| st.query_row([config], |r| r.get(0)).optional())
        .map_err(map_sqlite)?;
    let id = match found {
        Some(id) => id,
        None => {
            conn.prepare_cached("INSERT INTO configs (config) VALUES (?1)")
                .and_then(|mut st| st.execute([config]))
                .map_err(map_sqlite)?;
            conn.last_insert_rowid()
        }
    };
    ConfigIds::learnt(config, id);
    Ok(id)
}

/// The id of the next log row: two past the largest ever used (`AUTOINCREMENT` keeps it in
/// `sqlite_sequence`, also across deletes; the largest present counts too, as SQLite's own
/// allocator does, should that row be missing), so a row's second record has an id of its own.
/// A macro, so statements can `concat!` it: a statement's text is then a constant, not
/// formatted again for every row on the writer thread.
macro_rules! next_log_id {
    () => {
        "MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'log'), 0),
             COALESCE((SELECT MAX(id) FROM log), 0)) + 2"
    };
}
pub(crate) use next_log_id;

/// The id of the next log row, known on the writer thread while its group's transaction is
/// open: the first row of a group reads it (`next_log_id!`, two lookups), the next rows
/// take the one after the last (a row's `id` + [`packing::ROW_ID_STRIDE`]). Within the
/// transaction no other connection writes, so nothing else can take it; a savepoint rolled
/// back and the transaction's end forget it (after a savepoint's rollback it would only
/// leave a gap, which ids may have: forgetting keeps them dense).
pub(crate) struct LogIds;

thread_local! {
    /// `None`: not in a writer's transaction. `Some(None)`: in one, the next id not known yet.
    static NEXT_LOG_ID: std::cell::Cell<Option<Option<i64>>> = const { std::cell::Cell::new(None) };
}

impl LogIds {
    /// The writer thread's transaction began.
    pub(crate) fn began() {
        NEXT_LOG_ID.with(|next| next.set(Some(None)));
    }

    /// A savepoint of the transaction was rolled back: what it inserted is gone.
    pub(crate) fn rolled_back_to_savepoint() {
        NEXT_LOG_ID.with(|next| {
            if next.get().is_some() {
                next.set(Some(None));
            }
        });
    }

    /// The transaction ended (committed or rolled back).
    pub(crate) fn ended() {
        NEXT_LOG_ID.with(|next| next.set(None));
    }

    fn next() -> Option<i64> {
        NEXT_LOG_ID.with(|next| next.get().flatten())
    }

    fn inserted(id: i64) {
        NEXT_LOG_ID.with(|next| {
            if next.get().is_some() {
                next.set(Some(id.checked_add(packing::ROW_ID_STRIDE as i64)));
            }
        });
    }
}

/// Appends records in order, two to a row where they allow it.
pub(crate) fn append(
    conn: &Connection,
    instance: InstanceRef,
    records: &[&LogEntry],
) -> Result<()> {
    insert(conn, instance, &encode(records)?)
}

/// Lays `records` out in rows and encodes them (JSON and all). A lifetime's commit does
/// this on its own thread, so the one writer thread only inserts. The rows' ids are the
/// insert's (`next_log_id!`): 0 until then.
pub(crate) fn encode(records: &[&LogEntry]) -> Result<Vec<StoredRow>> {
    encode_with(records, &[])
}

/// [`encode`] for records committed with step rows (see [`packing::pack_with`]).
pub(crate) fn encode_with(
    records: &[&LogEntry],
    steps: &[&cairn_core::StepRecord],
) -> Result<Vec<StoredRow>> {
    Ok(packing::pack_with(records, steps)?
        .into_iter()
        .map(|row| row.stored(0))
        .collect())
}

/// A log row's insert. `?11` is the row's id when it is known (`COALESCE` then skips the
/// lookups).
const INSERT_SQL: &str = concat!(
    "INSERT INTO log (id, iid, at, kind, step_kind, step_name, step_count, meta, config, kind2, meta2)
     VALUES (COALESCE(?11, ",
    next_log_id!(),
    "), ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
);

/// Inserts encoded rows in order (their ids are chosen here).
pub(crate) fn insert(
    statements: &(impl Statements + ?Sized),
    instance: InstanceRef,
    rows: &[StoredRow],
) -> Result<()> {
    let conn = statements.connection();
    for row in rows {
        let config = row
            .config
            .as_deref()
            .map(|c| config_id(conn, c))
            .transpose()?;
        let (kind2, meta2) = row.second.as_ref().map(|(k, m)| (*k, m.as_str())).unzip();
        let step = row.step.as_ref();
        statements
            .with_held(Held::LogRow, INSERT_SQL, |st| {
                st.execute(params![
                    instance.0,
                    row.at,
                    row.kind,
                    step.map(|s| s.0),
                    step.map(|s| s.1.as_str()),
                    step.map(|s| s.2),
                    row.meta,
                    config,
                    kind2,
                    meta2,
                    LogIds::next(),
                ])
            })
            .map_err(map_sqlite)?;
        LogIds::inserted(conn.last_insert_rowid());
    }
    Ok(())
}

/// The columns [`records`] reads, from `log l` joined with `configs c ON c.id = l.config`.
macro_rules! log_columns {
    () => {
        "l.id, l.at, l.kind, l.step_kind, l.step_name, l.step_count, l.meta, c.config, l.kind2, l.meta2, l.config"
    };
}

/// An instance's rows that may hold records after a cursor: a row's second record has the
/// id after the row's, so the row with the cursor's id is read too.
pub(crate) const LOG_SQL: &str = concat!(
    "SELECT ",
    log_columns!(),
    " FROM log l LEFT JOIN configs c ON c.id = l.config
     WHERE l.iid = ?1 AND l.id >= ?2 ORDER BY l.id LIMIT ?3"
);

/// The records of a row selected with `log_columns!`, in id order.
fn records(r: &Row<'_>) -> rusqlite::Result<Result<Vec<LogRecord>>> {
    let step_kind: Option<i64> = r.get(3)?;
    let step_name: Option<String> = r.get(4)?;
    let step_count: Option<u32> = r.get(5)?;
    let id: i64 = r.get(0)?;
    let kind2: Option<i64> = r.get(8)?;
    let meta2: Option<String> = r.get(9)?;
    let config: Option<String> = r.get(7)?;
    let reference: Option<i64> = r.get(10)?;
    let (second, config) = match (
        StoredRow::second(id, kind2, meta2),
        StoredRow::config(id, reference, config),
    ) {
        (Ok(second), Ok(config)) => (second, config),
        (Err(e), _) | (_, Err(e)) => return Ok(Err(e)),
    };
    let row = StoredRow {
        id,
        at: r.get(1)?,
        kind: r.get(2)?,
        step: match (step_kind, step_name, step_count) {
            (Some(k), Some(name), Some(count)) => Some((k, name, count)),
            _ => None,
        },
        meta: r.get(6)?,
        config,
        second,
    };
    Ok(packing::unpack(row))
}

fn sql_int(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// Up to `limit` records of an instance with ids above `after`.
pub(crate) fn log(
    conn: &Connection,
    instance: InstanceRef,
    after: u64,
    limit: usize,
) -> Result<Vec<LogRecord>> {
    let mut st = conn.prepare_cached(LOG_SQL).map_err(map_sqlite)?;
    let rows = st
        .query_map(
            params![
                instance.0,
                sql_int(after),
                sql_int(packing::rows_for(limit))
            ],
            records,
        )
        .map_err(map_sqlite)?;
    let rows = rows
        .map(|row| row.map_err(map_sqlite)?)
        .collect::<Result<Vec<_>>>()?;
    Ok(packing::instance_page(rows, after, limit))
}

/// A workflow's rows after a cursor, driven by the log's own ids (`CROSS JOIN` fixes the
/// join order): it reads only rows newer than the cursor, so a poll with nothing new is one
/// seek, however many instances the workflow has.
pub(crate) const WORKFLOW_LOG_SQL: &str = concat!(
    "SELECT ",
    log_columns!(),
    ", i.id FROM log l CROSS JOIN instances i ON i.iid = l.iid
     LEFT JOIN configs c ON c.id = l.config
     WHERE l.id >= ?2 AND l.id <= ?4 AND i.workflow = ?1 ORDER BY l.id LIMIT ?3"
);

/// Up to `limit` records of a workflow's instances with ids above `after`, and how far the
/// read looked (see [`WorkflowLogPage`]).
pub(crate) fn workflow_log(
    conn: &Connection,
    workflow: &str,
    after: u64,
    limit: usize,
) -> Result<WorkflowLogPage> {
    // The newest id first (a row's second record is one past its id): with one writer,
    // every id up to it is committed in this snapshot, so the window below never passes
    // over a record that lands later.
    let newest: Option<i64> = conn
        .prepare_cached("SELECT MAX(id) + 1 FROM log")
        .and_then(|mut st| st.query_row([], |r| r.get(0)))
        .map_err(map_sqlite)?;
    let newest = u64::try_from(newest.unwrap_or(0)).unwrap_or(0);
    let Some(until) = packing::workflow_window(after, newest) else {
        return Ok(WorkflowLogPage {
            records: Vec::new(),
            scanned_to: after,
        });
    };
    let mut st = conn.prepare_cached(WORKFLOW_LOG_SQL).map_err(map_sqlite)?;
    let rows = st
        .query_map(
            params![
                workflow,
                sql_int(after),
                sql_int(packing::rows_for(limit)),
                sql_int(until)
            ],
            |r| {
                let id: String = r.get(11)?;
                Ok((id, records(r)?))
            },
        )
        .map_err(map_sqlite)?;
    let rows = rows
        .map(|row| {
            let (id, records) = row.map_err(map_sqlite)?;
            Ok((InstanceId::new(id).map_err(corrupt)?, records?))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(packing::workflow_page(rows, after, until, limit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::{LogKind, Timestamp};

    fn database() -> Connection {
        let mut conn = Connection::open_in_memory().expect("open");
        crate::schema::migrate(&mut conn).expect("migrate");
        conn
    }

    /// One row of an instance's own record (no step: it never shares a row).
    fn one_row(conn: &Connection) -> i64 {
        let entry = LogEntry {
            kind: LogKind::WorkflowQueued,
            at: Timestamp::from_millis(1),
            step: None,
            meta: serde_json::json!({}),
        };
        append(conn, InstanceRef(1), &[&entry]).expect("append");
        conn.last_insert_rowid()
    }

    #[test]
    fn log_ids_are_known_within_a_transaction_and_forgotten_after_it() {
        let conn = database();
        let stride = packing::ROW_ID_STRIDE as i64;
        conn.execute_batch("BEGIN").unwrap();
        LogIds::began();
        let first = one_row(&conn);
        assert_eq!(LogIds::next(), Some(first + stride));
        assert_eq!(one_row(&conn), first + stride);

        // A savepoint rolled back takes its row with it: the next id is read again, so
        // the ids stay dense.
        conn.execute_batch("SAVEPOINT job").unwrap();
        let undone = one_row(&conn);
        conn.execute_batch("ROLLBACK TO job; RELEASE job").unwrap();
        LogIds::rolled_back_to_savepoint();
        assert_eq!(LogIds::next(), None);
        assert_eq!(one_row(&conn), undone);
        conn.execute_batch("COMMIT").unwrap();
        LogIds::ended();
        assert_eq!(
            LogIds::next(),
            None,
            "outside a transaction nothing is known"
        );

        // Between two transactions another writer may take the next id: the next
        // transaction reads past it instead of colliding with it.
        conn.execute(
            "INSERT INTO log (id, iid, at, kind, meta) VALUES (?1, 1, 1, 0, '{}')",
            [undone + stride],
        )
        .unwrap();
        conn.execute_batch("BEGIN").unwrap();
        LogIds::began();
        assert_eq!(one_row(&conn), undone + 2 * stride);
        conn.execute_batch("COMMIT").unwrap();
        LogIds::ended();
    }

    #[test]
    fn outside_a_writer_transaction_every_row_reads_its_id() {
        let conn = database();
        let first = one_row(&conn);
        assert_eq!(LogIds::next(), None);
        conn.execute(
            "INSERT INTO log (id, iid, at, kind, meta) VALUES (?1, 1, 1, 0, '{}')",
            [first + 2],
        )
        .unwrap();
        assert_eq!(one_row(&conn), first + 4);
    }
}
