//! SQL for each store operation and the mapping between rows and records.

use std::time::Duration;

use cairn_core::{
    ErrorInfo, EventType, InstanceId, InstanceStatus, LogEntry, LogKind, StepKey, StepKind,
    StepRecord, StepState, Timestamp, WorkflowName,
};
use cairn_store::{
    Claimed, ControlOutcome, ControlRequest, Created, Error, InstanceRecord, InstanceRef, Lease,
    ListQuery, NewEvent, NewInstance, ParentLink, Result, ScheduleState, ScheduleTick, Sent,
    SqlArg, StatusChange, StoredEvent, StoredSchedule, TickFired, Timers, WorkflowVersion, Write,
};
use rusqlite::{Connection, OptionalExtension, Row, params, params_from_iter};

use crate::held::{Held, Statements, Writer};
use crate::map_sqlite;

/// The columns [`instance`] maps, as a literal for `concat!`.
macro_rules! instance_columns {
    () => {
        "iid, workflow, id, status, params, created_at, started_at, ended_at, output, error_name, error_message, ready_at, rollback_trigger, rollback_outcome, parent_iid, parent, priority, ckey, parked, version"
    };
}

pub(crate) const INSTANCE_COLUMNS: &str = instance_columns!();

/// [`INSTANCE_COLUMNS`] for a listing: every column but the params (up to a megabyte each),
/// which a listing never shows (`"null"` in their place, see `Store::list`).
pub(crate) const LIST_COLUMNS: &str = "iid, workflow, id, status, 'null', created_at, started_at, ended_at, output, error_name, error_message, ready_at, rollback_trigger, rollback_outcome, parent_iid, parent, priority, ckey, parked, version";

fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::Corrupt(what.to_string())
}

fn ts(ms: Option<i64>) -> Option<Timestamp> {
    ms.map(Timestamp::from_millis)
}

fn error_info(name: Option<String>, message: Option<String>) -> Option<ErrorInfo> {
    name.map(|name| ErrorInfo::new(name, message.unwrap_or_default()))
}

/// A typed record stored as JSON text (the rollback trigger and outcome).
fn to_json<T: serde::Serialize>(value: &T) -> rusqlite::Result<String> {
    serde_json::to_string(value).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

/// A typed record read back from JSON text; undecodable data is corrupt.
fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(corrupt)
}

/// Maps a row selected with [`INSTANCE_COLUMNS`]. The outer `Result` is SQLite's, the inner
/// one reports undecodable data.
pub(crate) fn instance(row: &Row<'_>) -> rusqlite::Result<Result<InstanceRecord>> {
    instance_at(row, 0)
}

pub(crate) fn insert_instance(conn: &Connection, new: &NewInstance) -> Result<Created> {
    let inserted = conn
        .prepare_cached(
            "INSERT OR FAIL INTO instances (workflow, id, status, params, created_at, ready_rank, ready_at,
                 retain_success_ms, retain_error_ms, parent_iid, parent, priority, ckey, version)
             VALUES (?1, ?2, 0, ?3, ?4, 1, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
             ON CONFLICT (workflow, id) DO NOTHING",
        )
        .and_then(|mut st| {
            st.execute(params![
                new.workflow.as_str(),
                new.id.as_str(),
                new.params,
                new.created_at.as_millis(),
                retain_ms(new.retention.success),
                retain_ms(new.retention.error),
                new.parent.as_ref().map(|p| p.instance.0),
                new.parent.as_ref().map(ParentLink::encode),
                new.priority,
                new.concurrency.as_ref().map(|c| c.key.as_str()),
                new.version,
            ])
        })
        .map_err(map_sqlite)?;
    if inserted == 0 {
        return Ok(Created::AlreadyExists);
    }
    if let Some(c) = &new.concurrency {
        let before = crate::slots::limits(conn, new.workflow.as_str(), &c.key)?.map(|l| l.limit);
        // The latest limits written for a key are the key's.
        conn.prepare_cached(
            "INSERT INTO ckeys (workflow, ckey, slot_limit, hold_waiting, rate_n, rate_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (workflow, ckey) DO UPDATE SET slot_limit = excluded.slot_limit,
                 hold_waiting = excluded.hold_waiting, rate_n = excluded.rate_n,
                 rate_ms = excluded.rate_ms",
        )
        .and_then(|mut st| {
            st.execute(params![
                new.workflow.as_str(),
                c.key,
                c.limit.max(1),
                c.hold_while_waiting,
                c.rate.map(|(n, _)| n),
                c.rate.map(|(_, per)| millis(per).max(1)),
            ])
        })
        .map_err(map_sqlite)?;
        if before.is_some_and(|limit| i64::from(c.limit.max(1)) > limit) {
            // A higher limit frees slots for the instances already waiting, oldest and
            // best first, not only for this one.
            crate::slots::wake(conn, new.workflow.as_str(), &c.key)?;
        }
    }
    let instance = InstanceRef(conn.last_insert_rowid());
    append_log(conn, instance, &new.queued)?;
    Ok(Created::New(instance))
}

pub(crate) fn list(conn: &Connection, query: &ListQuery) -> Result<Vec<InstanceRecord>> {
    let (sql, args) = list_sql(query);
    let mut st = conn.prepare_cached(&sql).map_err(map_sqlite)?;
    let rows = st
        .query_map(params_from_iter(args), instance)
        .map_err(map_sqlite)?;
    rows.map(|r| r.map_err(map_sqlite)?).collect()
}

pub(crate) fn count_matching(conn: &Connection, query: &ListQuery) -> Result<u64> {
    let filter = query.sql_filter(true, placeholder);
    let sql = format!("SELECT count(*) FROM instances WHERE {}", filter.clause);
    let n: i64 = conn
        .prepare_cached(&sql)
        .and_then(|mut st| st.query_row(params_from_iter(values(filter.args)), |r| r.get(0)))
        .map_err(map_sqlite)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

fn placeholder(n: usize) -> String {
    format!("?{n}")
}

fn values(args: Vec<SqlArg>) -> impl Iterator<Item = rusqlite::types::Value> {
    args.into_iter().map(|a| match a {
        SqlArg::Int(n) => n.into(),
        SqlArg::Text(s) => s.into(),
    })
}

/// A page of instances, newest first (or oldest first), and its arguments: a range of
/// `instances_by_workflow` (or of `instances_by_status` with one status), read in order,
/// never sorted.
pub(crate) fn list_sql(query: &ListQuery) -> (String, Vec<rusqlite::types::Value>) {
    let filter = query.sql_filter(true, placeholder);
    let limit = placeholder(filter.args.len() + 1);
    let sql = format!(
        "SELECT {LIST_COLUMNS} FROM instances WHERE {} ORDER BY iid {} LIMIT {limit}",
        filter.clause,
        if query.oldest_first { "ASC" } else { "DESC" },
    );
    let mut args: Vec<_> = values(filter.args).collect();
    args.push(i64::try_from(query.limit).unwrap_or(i64::MAX).into());
    (sql, args)
}

/// Ready instances of one rank, earliest first: a range in `instances_ready`.
pub(crate) const CLAIM_READY_SQL: &str = "SELECT ready_at, iid, workflow FROM instances
     WHERE ready_rank = ?1 AND ready_at IS NOT NULL AND ready_at <= ?2 ORDER BY ready_at";

/// Runnable instances whose lease expired, earliest first: a range in `instances_lease`.
pub(crate) const CLAIM_EXPIRED_SQL: &str =
    "SELECT lease_until, iid, workflow, status FROM instances
     WHERE lease_owner IS NOT NULL AND lease_until < ?1 AND status IN (0, 1, 7)
     ORDER BY lease_until";

/// Up to `limit` `(at, iid)` rows of `sql` (one of the claim queries, in claim order)
/// whose workflow is one of `workflows`; rows of other workflows are passed over.
fn claimable(
    conn: &Connection,
    sql: &str,
    args: impl rusqlite::Params,
    workflows: &[String],
    limit: usize,
) -> Result<Vec<(i64, i64)>> {
    let mut st = conn.prepare_cached(sql).map_err(map_sqlite)?;
    let mut rows = st.query(args).map_err(map_sqlite)?;
    let mut out = Vec::new();
    while out.len() < limit {
        let Some(row) = rows.next().map_err(map_sqlite)? else {
            break;
        };
        let workflow: String = row.get(2).map_err(map_sqlite)?;
        if workflows.contains(&workflow) {
            out.push((
                row.get(0).map_err(map_sqlite)?,
                row.get(1).map_err(map_sqlite)?,
            ));
        }
    }
    Ok(out)
}

pub(crate) fn claim(
    conn: &Connection,
    owner: &str,
    workflows: &[String],
    now: Timestamp,
    ttl: Duration,
    limit: usize,
) -> Result<Vec<Claimed>> {
    if workflows.is_empty() || limit == 0 {
        return Ok(Vec::new());
    }
    // Three index range scans, each in claim order, none over finished history: resuming
    // instances (rank 0) and expired leases by time, then new ones (rank 1) by time. Rows
    // of workflows this engine does not run are skipped as they come.
    let now_ms = now.as_millis();
    let mut candidates = claimable(conn, CLAIM_READY_SQL, params![0, now_ms], workflows, limit)?;
    candidates.extend(claimable(
        conn,
        CLAIM_EXPIRED_SQL,
        params![now_ms],
        workflows,
        limit,
    )?);
    candidates.sort_unstable();
    // An instance can be both ready and under an expired lease: claim it once.
    let mut seen = std::collections::HashSet::new();
    let mut iids: Vec<i64> = candidates
        .into_iter()
        .map(|(_, iid)| iid)
        .filter(|iid| seen.insert(*iid))
        .take(limit)
        .collect();
    if iids.len() < limit {
        let fresh = claimable(conn, CLAIM_READY_SQL, params![1, now_ms], workflows, limit)?;
        let room = limit - iids.len();
        iids.extend(
            fresh
                .into_iter()
                .map(|(_, iid)| iid)
                .filter(|iid| seen.insert(*iid))
                .take(room),
        );
    }
    // A candidate with a concurrency key needs a slot of it; one that finds none waits.
    let mut go = Vec::with_capacity(iids.len());
    for iid in iids {
        if matches!(crate::slots::take(conn, iid, now)?, crate::slots::Take::Go) {
            go.push(iid);
        }
    }
    let iids = go;
    let until = now.saturating_add(ttl).as_millis();
    let mut claimed = Vec::with_capacity(iids.len());
    // An UPDATE, then the row read by its id: SQLite runs a `RETURNING` through a temporary
    // table of its own, which costs more than the second lookup of a row the UPDATE has
    // just brought into the page cache.
    let mut lease = conn
        .prepare_cached(
            "UPDATE instances SET lease_owner = ?1, lease_epoch = lease_epoch + 1, lease_until = ?2,
                 ready_at = NULL, parked = 0
             WHERE iid = ?3",
        )
        .map_err(map_sqlite)?;
    let mut read = conn
        .prepare_cached(concat!(
            "SELECT lease_epoch, ",
            instance_columns!(),
            " FROM instances WHERE iid = ?1"
        ))
        .map_err(map_sqlite)?;
    for iid in iids {
        lease
            .execute(params![owner, until, iid])
            .map_err(map_sqlite)?;
        let (epoch, record) = read
            .query_row([iid], |row| {
                let epoch: i64 = row.get(0)?;
                Ok((epoch, instance_at(row, 1)?))
            })
            .map_err(map_sqlite)?;
        let record = record?;
        claimed.push(Claimed {
            lease: Lease {
                instance: record.instance,
                epoch: u64::try_from(epoch).map_err(corrupt)?,
            },
            record,
            taken_over: false,
        });
    }
    Ok(claimed)
}

/// [`instance`] for a row whose instance columns start at `offset`.
fn instance_at(row: &Row<'_>, offset: usize) -> rusqlite::Result<Result<InstanceRecord>> {
    let g = |i: usize| offset + i;
    let workflow: String = row.get(g(1))?;
    let id: String = row.get(g(2))?;
    let status: i64 = row.get(g(3))?;
    let iid: i64 = row.get(g(0))?;
    let params: String = row.get(g(4))?;
    let created_at: i64 = row.get(g(5))?;
    let started_at: Option<i64> = row.get(g(6))?;
    let ended_at: Option<i64> = row.get(g(7))?;
    let output: Option<String> = row.get(g(8))?;
    let error_name: Option<String> = row.get(g(9))?;
    let error_message: Option<String> = row.get(g(10))?;
    let ready_at: Option<i64> = row.get(g(11))?;
    let rollback_trigger: Option<String> = row.get(g(12))?;
    let rollback_outcome: Option<String> = row.get(g(13))?;
    let parent_iid: Option<i64> = row.get(g(14))?;
    let parent: Option<String> = row.get(g(15))?;
    let priority: i32 = row.get(g(16))?;
    let ckey: Option<String> = row.get(g(17))?;
    let parked: bool = row.get(g(18))?;
    let version: Option<String> = row.get(g(19))?;
    Ok((|| {
        Ok(InstanceRecord {
            instance: InstanceRef(iid),
            workflow: WorkflowName::new(workflow).map_err(corrupt)?,
            id: InstanceId::new(id).map_err(corrupt)?,
            status: InstanceStatus::from_code(status)
                .ok_or_else(|| corrupt(format!("unknown status code {status}")))?,
            params,
            created_at: Timestamp::from_millis(created_at),
            started_at: ts(started_at),
            ended_at: ts(ended_at),
            output,
            error: error_info(error_name, error_message),
            ready_at: ts(ready_at),
            rollback_trigger: rollback_trigger.as_deref().map(from_json).transpose()?,
            rollback_outcome: rollback_outcome.as_deref().map(from_json).transpose()?,
            parent: match (parent_iid, parent) {
                (Some(iid), Some(text)) => Some(ParentLink::decode(InstanceRef(iid), &text)?),
                _ => None,
            },
            priority,
            concurrency_key: ckey,
            waiting_for_slot: parked,
            version,
        })
    })())
}

/// The status of an instance known to exist.
pub(crate) fn status_of(conn: &Connection, instance: InstanceRef) -> Result<InstanceStatus> {
    let code: i64 = conn
        .prepare_cached("SELECT status FROM instances WHERE iid = ?1")
        .and_then(|mut st| st.query_row([instance.0], |r| r.get(0)))
        .map_err(map_sqlite)?;
    InstanceStatus::from_code(code).ok_or_else(|| corrupt(format!("unknown status code {code}")))
}

pub(crate) fn check_lease(conn: &Connection, lease: Lease) -> Result<()> {
    leased_status(conn, lease).map(drop)
}

/// Checks that `lease` holds, and answers the instance's status, read in the same query.
pub(crate) fn leased_status(
    statements: &(impl Statements + ?Sized),
    lease: Lease,
) -> Result<InstanceStatus> {
    let row: Option<(i64, i64)> = statements
        .with_held(
            Held::Lease,
            "SELECT lease_epoch, status FROM instances WHERE iid = ?1 AND lease_owner IS NOT NULL",
            |st| {
                st.query_row([lease.instance.0], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            },
        )
        .map_err(map_sqlite)?;
    match row {
        Some((e, code)) if u64::try_from(e).ok() == Some(lease.epoch) => {
            InstanceStatus::from_code(code)
                .ok_or_else(|| corrupt(format!("unknown status code {code}")))
        }
        Some(_) => Err(Error::LeaseLost(lease.instance)),
        None => {
            let exists: bool = statements
                .connection()
                .prepare_cached("SELECT 1 FROM instances WHERE iid = ?1")
                .and_then(|mut st| st.exists([lease.instance.0]))
                .map_err(map_sqlite)?;
            if exists {
                Err(Error::LeaseLost(lease.instance))
            } else {
                Err(Error::NotFound(lease.instance))
            }
        }
    }
}

/// A commit's writes, its log records encoded (by [`encode_all`]).
// Short-lived, one per write of a commit, moved as it is: boxing `Write` would cost an
// allocation per write for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Encoded {
    Log(Vec<cairn_store::packing::StoredRow>),
    /// A step's row, with its configuration's text.
    Step(StepRecord, String),
    Write(Write),
}

/// Encodes a commit's log records as they will be inserted: on the committing lifetime's
/// thread, so the one writer thread does not spend its time on JSON. Consecutive records
/// are encoded together, so two of the same step can share a row; they are encoded before
/// the writes are taken apart, since a `STEP_START` may leave its configuration to its
/// step's row in the same commit (`packing::pack_with`).
pub(crate) fn encode_all(writes: Vec<Write>) -> Result<Vec<Encoded>> {
    let steps = cairn_store::packing::committed_steps(&writes);
    let runs = writes
        .split(|w| !matches!(w, Write::Log(_)))
        .filter(|run| !run.is_empty())
        .map(|run| {
            let records: Vec<&LogEntry> = run
                .iter()
                .filter_map(|w| match w {
                    Write::Log(entry) => Some(entry),
                    _ => None,
                })
                .collect();
            crate::history::encode_with(&records, &steps)
        })
        .collect::<Result<Vec<_>>>()?;
    // Sized to what it holds, a run of records being one entry: a step's commit (six
    // writes of ~200 bytes) then fits glibc's per-thread cache (1 KB), which a vector
    // sized to the writes overflows, every step (see BENCHMARKS.md).
    let others = writes
        .iter()
        .filter(|w| !matches!(w, Write::Log(_)))
        .count();
    let mut out = Vec::with_capacity(runs.len() + others);
    let mut runs = runs.into_iter();
    let mut in_run = false;
    for write in writes {
        match write {
            // A run's records were encoded above, as its rows: they go once, in its place.
            Write::Log(_) if in_run => {}
            Write::Log(_) => {
                in_run = true;
                let rows = runs
                    .next()
                    .ok_or_else(|| corrupt("a commit's log records were not all encoded"))?;
                out.push(Encoded::Log(rows));
            }
            Write::Step(step) => {
                in_run = false;
                let config = cairn_store::packing::shared_config_text(&step.config)?;
                out.push(Encoded::Step(step, config));
            }
            write => {
                in_run = false;
                out.push(Encoded::Write(write));
            }
        }
    }
    Ok(out)
}

/// Applies a commit's writes, in order.
pub(crate) fn apply_all(
    conn: &Writer<'_>,
    instance: InstanceRef,
    writes: &[Encoded],
) -> Result<()> {
    for write in writes {
        match write {
            Encoded::Log(rows) => crate::history::insert(conn, instance, rows)?,
            Encoded::Step(step, config) => upsert_step(conn, instance, step, config)?,
            Encoded::Write(write) => apply(conn, instance, write)?,
        }
    }
    Ok(())
}

fn apply(conn: &Writer<'_>, instance: InstanceRef, write: &Write) -> Result<()> {
    match write {
        Write::Step(step) => {
            let config = serde_json::to_string(&step.config).map_err(corrupt)?;
            upsert_step(conn, instance, step, &config)
        }
        Write::Cancel { step, records } => {
            let found: Option<(i64, Option<String>)> = conn
                .prepare_cached(
                    "SELECT state, output FROM steps
                     WHERE iid = ?1 AND kind = ?2 AND name = ?3 AND count = ?4",
                )
                .and_then(|mut st| {
                    st.query_row(
                        params![
                            instance.0,
                            step.key.kind.code(),
                            step.key.name,
                            step.key.count
                        ],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()
                })
                .map_err(map_sqlite)?;
            let running = match found {
                Some((state, _)) if state == StepState::Running.code() => true,
                // A wait whose take landed while the workflow was dropping it: the
                // workflow never saw the event, which goes back to the front of its queue.
                Some((state, Some(output)))
                    if state == StepState::Succeeded.code()
                        && step.key.kind == StepKind::WaitForEvent =>
                {
                    put_back_event(conn, instance, &step.key, &output)?;
                    true
                }
                _ => false,
            };
            if running {
                let config = serde_json::to_string(&step.config).map_err(corrupt)?;
                upsert_step(conn, instance, step, &config)?;
                // A cancelled stream step's chunks are no output of anything. Chunks are
                // keyed by name and count only: a sleep or wait of the same name and count
                // as a `run` step has none, and must not drop that step's.
                if step.key.kind == StepKind::Run {
                    crate::streams::drop(conn, instance, &step.key, None)?;
                }
                crate::history::append(conn, instance, &records.iter().collect::<Vec<_>>())?;
            }
            Ok(())
        }
        Write::Log(entry) => append_log(conn, instance, entry),
        Write::Status(change) => change_status(conn, instance, change),
        Write::Hibernate {
            wake_at,
            event_types,
            children,
        } => hibernate(conn, instance, *wake_at, event_types, children),
        Write::Create(new) => insert_instance(conn, new).map(drop),
        Write::RollbackTrigger(trigger) => {
            conn.prepare_cached("UPDATE instances SET rollback_trigger = ?2 WHERE iid = ?1")
                .and_then(|mut st| st.execute(params![instance.0, to_json(trigger)?]))
                .map_err(map_sqlite)?;
            Ok(())
        }
        Write::Chunk {
            step,
            attempt,
            epoch,
            index,
            data,
        } => crate::streams::put(conn, instance, step, *attempt, *epoch, *index, data),
        Write::DropChunks { step, keep } => crate::streams::drop(conn, instance, step, *keep),
        Write::Pause { at, record } => {
            let paused = conn
                .prepare_cached(
                    "UPDATE instances SET status = 2, paused_at = ?2, lease_owner = NULL, lease_until = NULL,
                         ready_at = NULL
                     WHERE iid = ?1 AND status = 6",
                )
                .and_then(|mut st| st.execute(params![instance.0, at.as_millis()]))
                .map_err(map_sqlite)?;
            if paused == 1 {
                append_log(conn, instance, record)?;
                crate::slots::give_back(conn, instance)?;
            }
            Ok(())
        }
    }
}

fn hibernate(
    conn: &Connection,
    instance: InstanceRef,
    wake_at: Timestamp,
    event_types: &[EventType],
    children: &[InstanceRef],
) -> Result<()> {
    let mut ready = wake_at.as_millis();
    let mut st = conn
        .prepare_cached("SELECT 1 FROM events WHERE iid = ?1 AND type = ?2 LIMIT 1")
        .map_err(map_sqlite)?;
    for t in event_types {
        if st
            .exists(params![instance.0, t.as_str()])
            .map_err(map_sqlite)?
        {
            // An event is already waiting: be claimable at once.
            ready = i64::MIN;
            break;
        }
    }
    let mut st = conn
        .prepare_cached("SELECT 1 FROM instances WHERE iid = ?1 AND status NOT IN (3, 4, 5)")
        .map_err(map_sqlite)?;
    for child in children {
        if !st.exists([child.0]).map_err(map_sqlite)? {
            // A child has ended (or is gone): be claimable at once to take its outcome.
            ready = i64::MIN;
            break;
        }
    }
    // A pending pause wins: the instance is paused, not waiting, and not claimable. One
    // that never started (let go before it could: no worker of its version) stays queued.
    let changed = conn
        .prepare_cached(
            "UPDATE OR FAIL instances SET
             status = CASE WHEN status = 6 THEN 2 WHEN status = 0 THEN 0 ELSE 7 END,
             ready_rank = 0,
             ready_at = CASE WHEN status = 6 THEN NULL
                             WHEN ?2 = -9223372036854775808 THEN created_at ELSE ?2 END,
             lease_owner = NULL, lease_until = NULL
         WHERE iid = ?1",
        )
        .and_then(|mut st| st.execute(params![instance.0, ready]))
        .map_err(map_sqlite)?;
    if changed == 0 {
        return Ok(());
    }
    let after = two_facts(
        conn,
        "SELECT status = 2, ckey IS NOT NULL FROM instances WHERE iid = ?1",
        instance,
    )?;
    match after {
        (true, true) => crate::slots::give_back(conn, instance),
        (false, true) => crate::slots::give_back_to_wait(conn, instance),
        _ => Ok(()),
    }
}

pub(crate) fn next_ready(conn: &Connection, workflows: &[String]) -> Result<Option<Timestamp>> {
    // One MIN per workflow: each is a seek in `instances_next_ready`.
    let mut st = conn.prepare_cached(NEXT_READY_SQL).map_err(map_sqlite)?;
    let mut next: Option<i64> = None;
    for workflow in workflows {
        let at: Option<i64> = st.query_row([workflow], |r| r.get(0)).map_err(map_sqlite)?;
        next = match (next, at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok(ts(next))
}

/// The oldest buffered event of a type for an instance.
pub(crate) const TAKE_EVENT_SQL: &str =
    "SELECT id, payload, at FROM events WHERE iid = ?1 AND type = ?2 ORDER BY id LIMIT 1";

/// Whether instance row `i` is a child its parent has not taken the outcome of yet: the
/// parent has not ended and its `invoke` step that started the child still runs, and reads
/// the outcome from the child's row. Such a finished child is held from purges and
/// deletes. (A parent that ended with that step unfinished never reads it.)
macro_rules! awaited_by_its_parent {
    () => {
        "(i.parent_iid IS NOT NULL AND EXISTS (
         SELECT 1 FROM steps s WHERE s.iid = i.parent_iid AND s.kind = 4
             AND s.name = json_extract(i.parent, '$.step.name')
             AND s.count = json_extract(i.parent, '$.step.count') AND s.state = 0)
         AND (SELECT p.status FROM instances p WHERE p.iid = i.parent_iid) NOT IN (3, 4, 5))"
    };
}

/// Whether instance row `i` is the parent of a child that has not finished and is not
/// detached: a child the cascade missed (the engine stopped after the parent's end, or the
/// store failed) reads how to end from its parent's row when it is next claimed
/// (`family::orphaned`). Such a finished parent is held from purges.
macro_rules! parent_of_an_unfinished_child {
    () => {
        "EXISTS (SELECT 1 FROM instances c WHERE c.parent_iid = i.iid
             AND c.status NOT IN (3, 4, 5)
             AND COALESCE(json_extract(c.parent, '$.detached'), 0) = 0)"
    };
}

/// Finished instances whose retention is over, held children and parents aside.
pub(crate) const DUE_PURGES_SQL: &str = concat!(
    "SELECT iid FROM instances i WHERE purge_at IS NOT NULL AND purge_at <= ?1 AND NOT ",
    awaited_by_its_parent!(),
    " AND NOT ",
    parent_of_an_unfinished_child!(),
    " LIMIT ?2"
);

/// When the next purge is due (held children and parents aside, see [`DUE_PURGES_SQL`]).
pub(crate) const NEXT_PURGE_SQL: &str = concat!(
    "SELECT purge_at FROM instances i WHERE purge_at IS NOT NULL AND NOT ",
    awaited_by_its_parent!(),
    " AND NOT ",
    parent_of_an_unfinished_child!(),
    " ORDER BY purge_at LIMIT 1"
);

/// Whether instance `?1` is a child its parent has not taken the outcome of yet.
const AWAITED_BY_ITS_PARENT_SQL: &str = concat!(
    "SELECT EXISTS (SELECT 1 FROM instances i WHERE i.iid = ?1 AND ",
    awaited_by_its_parent!(),
    ")"
);

/// Instances of a workflow in a status: the counter the triggers of migration 8 keep.
pub(crate) const COUNT_SQL: &str =
    "SELECT n FROM instance_counts WHERE workflow = ?1 AND status = ?2";

pub(crate) const NEXT_READY_SQL: &str =
    "SELECT MIN(ready_at) FROM instances WHERE workflow = ?1 AND ready_at IS NOT NULL";

/// The timers of a workflow at a time: due and unclaimed (a wake-up that has come, or a
/// lease of a runnable instance that ran out, counted once if both), and still to come. Range counts over `instances_next_ready` and
/// `instances_lease`: the due ones are the backlog, the pending ones the hibernating.
pub(crate) const TIMERS_SQL: &str = "SELECT
    (SELECT count(*) FROM instances WHERE workflow = ?1 AND ready_at IS NOT NULL AND ready_at <= ?2)
  + (SELECT count(*) FROM instances WHERE lease_owner IS NOT NULL AND lease_until < ?2 AND workflow = ?1
         AND status IN (0, 1, 7) AND (ready_at IS NULL OR ready_at > ?2)),
    (SELECT count(*) FROM instances WHERE workflow = ?1 AND ready_at IS NOT NULL AND ready_at > ?2)";

pub(crate) fn timers(conn: &Connection, workflow: &str, now: Timestamp) -> Result<Timers> {
    let (due, pending): (i64, i64) = conn
        .prepare_cached(TIMERS_SQL)
        .and_then(|mut st| {
            st.query_row(params![workflow, now.as_millis()], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
        })
        .map_err(map_sqlite)?;
    Ok(Timers {
        due: u64::try_from(due).unwrap_or(0),
        pending: u64::try_from(pending).unwrap_or(0),
    })
}

pub(crate) fn send_event(
    conn: &Connection,
    workflow: &str,
    id: &str,
    event: &NewEvent,
) -> Result<Sent> {
    let row: Option<(i64, i64)> = conn
        .prepare_cached("SELECT iid, status FROM instances WHERE workflow = ?1 AND id = ?2")
        .and_then(|mut st| {
            st.query_row(params![workflow, id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(map_sqlite)?;
    let Some((iid, status)) = row else {
        return Ok(Sent::NotFound);
    };
    let status = InstanceStatus::from_code(status)
        .ok_or_else(|| corrupt(format!("unknown status code {status}")))?;
    // A key seen before is a retry of a send that was delivered (and maybe consumed, and
    // the instance maybe finished since): acknowledge it, buffer nothing.
    if let Some(key) = &event.idempotency_key {
        let seen = conn
            .prepare_cached("SELECT 1 FROM event_keys WHERE iid = ?1 AND key = ?2")
            .and_then(|mut st| st.exists(params![iid, key]))
            .map_err(map_sqlite)?;
        if seen {
            return Ok(Sent::Duplicate(InstanceRef(iid)));
        }
    }
    if status.is_terminal() {
        return Ok(Sent::Finished(status));
    }
    conn.prepare_cached("INSERT INTO events (iid, type, payload, at) VALUES (?1, ?2, ?3, ?4)")
        .and_then(|mut st| {
            st.execute(params![
                iid,
                event.event_type.as_str(),
                event.payload,
                event.at.as_millis()
            ])
        })
        .map_err(map_sqlite)?;
    if let Some(key) = &event.idempotency_key {
        conn.prepare_cached(
            "INSERT INTO event_keys (iid, key, at, event) VALUES (?1, ?2, ?3, last_insert_rowid())",
        )
        .and_then(|mut st| st.execute(params![iid, key, event.at.as_millis()]))
        .map_err(map_sqlite)?;
    }
    // A hibernating instance wakes up to take it.
    conn.prepare_cached(
        "UPDATE instances SET ready_at = created_at, ready_rank = 0 WHERE iid = ?1 AND status = 7",
    )
    .and_then(|mut st| st.execute([iid]))
    .map_err(map_sqlite)?;
    Ok(Sent::Buffered(InstanceRef(iid)))
}

/// See `SqliteStore::buffered_events`.
pub(crate) fn buffered_events(
    conn: &Connection,
    instance: InstanceRef,
) -> Result<Vec<StoredEvent>> {
    conn.prepare_cached("SELECT type, payload, at FROM events WHERE iid = ?1 ORDER BY id")
        .and_then(|mut st| {
            st.query_map([instance.0], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(map_sqlite)?
        .into_iter()
        .map(|(event_type, payload, at)| {
            Ok(StoredEvent {
                event_type: EventType::new(event_type).map_err(corrupt)?,
                payload,
                at: Timestamp::from_millis(at),
            })
        })
        .collect()
}

pub(crate) fn take_event(
    conn: &Connection,
    lease: Lease,
    step: &StepKey,
    event_type: &EventType,
    at: Timestamp,
) -> Result<Option<StoredEvent>> {
    check_lease(conn, lease)?;
    // A wait that is no longer waiting takes nothing: the workflow dropped it (it lost a
    // `select!`) and its cancel landed while this take was on its way.
    let waiting = conn
        .prepare_cached(
            "SELECT state FROM steps WHERE iid = ?1 AND kind = ?2 AND name = ?3 AND count = ?4",
        )
        .and_then(|mut st| {
            st.query_row(
                params![lease.instance.0, step.kind.code(), step.name, step.count],
                |r| r.get::<_, i64>(0),
            )
            .optional()
        })
        .map_err(map_sqlite)?;
    if waiting.is_some_and(|state| state != StepState::Running.code()) {
        return Ok(None);
    }
    let found: Option<(i64, String, i64)> = conn
        .prepare_cached(TAKE_EVENT_SQL)
        .and_then(|mut st| {
            st.query_row(params![lease.instance.0, event_type.as_str()], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()
        })
        .map_err(map_sqlite)?;
    let Some((event_id, payload, sent_at)) = found else {
        return Ok(None);
    };
    let (output, object) =
        cairn_store::taken::wait_output(event_type, &payload, Timestamp::from_millis(sent_at))?;
    conn.prepare_cached("DELETE FROM events WHERE id = ?1")
        .and_then(|mut st| st.execute([event_id]))
        .map_err(map_sqlite)?;
    // Its key (if it was sent with one) now belongs to this wait: see `restart_from`'s use.
    conn.prepare_cached(
        "UPDATE event_keys SET taken_by = (SELECT seq FROM steps WHERE iid = ?1 AND kind = ?2
             AND name = ?3 AND count = ?4)
         WHERE iid = ?1 AND event = ?5 AND taken_by IS NULL",
    )
    .and_then(|mut st| {
        st.execute(params![
            lease.instance.0,
            step.kind.code(),
            step.name,
            step.count,
            event_id
        ])
    })
    .map_err(map_sqlite)?;
    let updated = conn
        .prepare_cached(
            "UPDATE steps SET state = ?5, output = ?6, ended_at = ?7, in_flight = 0, wake_at = NULL
             WHERE iid = ?1 AND kind = ?2 AND name = ?3 AND count = ?4",
        )
        .and_then(|mut st| {
            st.execute(params![
                lease.instance.0,
                step.kind.code(),
                step.name,
                step.count,
                StepState::Succeeded.code(),
                output,
                at.as_millis()
            ])
        })
        .map_err(map_sqlite)?;
    if updated != 1 {
        return Err(corrupt(format!(
            "wait {} has no journal entry",
            step.target()
        )));
    }
    append_log(
        conn,
        lease.instance,
        &LogEntry {
            kind: LogKind::WaitComplete,
            at,
            step: Some(step.clone()),
            meta: object,
        },
    )?;
    Ok(Some(StoredEvent {
        event_type: event_type.clone(),
        payload,
        at: Timestamp::from_millis(sent_at),
    }))
}

/// Buffers again the event a wait's `output` holds (as `take_event` wrote it), ahead of
/// every event buffered now: it was the oldest of its type when it was taken. Event ids
/// are not shown anywhere; one below the smallest may be the id of an event taken before
/// (a key that named it has `taken_by` set, which a take's marking of keys skips). The
/// take's `WAIT_COMPLETE` goes: the log shows the wait cancelled and the event received
/// once, by the wait that takes it next.
fn put_back_event(
    conn: &Connection,
    instance: InstanceRef,
    wait: &StepKey,
    output: &str,
) -> Result<()> {
    let event = cairn_store::taken::taken_event(output)?;
    conn.prepare_cached(
        "INSERT INTO events (id, iid, type, payload, at)
         VALUES ((SELECT COALESCE(MIN(id), 1) - 1 FROM events), ?1, ?2, ?3, ?4)",
    )
    .and_then(|mut st| {
        st.execute(params![
            instance.0,
            event.event_type.as_str(),
            event.payload,
            event.at.as_millis()
        ])
    })
    .map_err(map_sqlite)?;
    // Its key (if any) names the event again, taken by no wait.
    conn.prepare_cached(
        "UPDATE event_keys SET event = last_insert_rowid(), taken_by = NULL
         WHERE iid = ?1 AND taken_by = (SELECT seq FROM steps WHERE iid = ?1 AND kind = ?2
             AND name = ?3 AND count = ?4)",
    )
    .and_then(|mut st| st.execute(params![instance.0, wait.kind.code(), wait.name, wait.count]))
    .map_err(map_sqlite)?;
    conn.prepare_cached(
        "DELETE FROM log WHERE iid = ?1 AND kind = ?2 AND step_kind = ?3 AND step_name = ?4
             AND step_count = ?5",
    )
    .and_then(|mut st| {
        st.execute(params![
            instance.0,
            LogKind::WaitComplete.code(),
            wait.kind.code(),
            wait.name,
            wait.count
        ])
    })
    .map_err(map_sqlite)?;
    Ok(())
}

/// A step's row, written whole.
const UPSERT_STEP_SQL: &str =
    "INSERT OR REPLACE INTO steps (iid, kind, name, count, seq, state, config, attempts,
         in_flight, wake_at, output, error_name, error_message, started_at, ended_at, has_rollback)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)";

/// Writes a step's row; `config` is the text of `s.config`.
fn upsert_step(
    statements: &(impl Statements + ?Sized),
    instance: InstanceRef,
    s: &StepRecord,
    config: &str,
) -> Result<()> {
    let config = crate::history::config_id(statements.connection(), config)?;
    statements
        .with_held(Held::StepRow, UPSERT_STEP_SQL, |st| {
            st.execute(params![
                instance.0,
                s.key.kind.code(),
                s.key.name,
                s.key.count,
                s.seq,
                s.state.code(),
                config,
                s.attempts,
                s.in_flight,
                s.wake_at.map(Timestamp::as_millis),
                s.output,
                s.error.as_ref().map(|e| e.name.as_str()),
                s.error.as_ref().map(|e| e.message.as_str()),
                s.started_at.as_millis(),
                s.ended_at.map(Timestamp::as_millis),
                s.has_rollback,
            ])
        })
        .map_err(map_sqlite)?;
    Ok(())
}

pub(crate) fn append_log(conn: &Connection, instance: InstanceRef, e: &LogEntry) -> Result<()> {
    crate::history::append(conn, instance, &[e])
}

/// `OR FAIL` here and on the other hot statements on `instances` (a create, a
/// hibernation): with the count triggers such a statement writes more than one row, and
/// without it SQLite copies every page it touches into a statement journal, to undo the
/// statement alone should it fail half-way. Nothing needs that: a job that fails after
/// writing is undone whole, by its savepoint or with its group (`worker`). Migration 16
/// made the triggers mean the same under `OR FAIL`.
fn change_status(conn: &Connection, instance: InstanceRef, c: &StatusChange) -> Result<()> {
    let changed = conn
        .prepare_cached(
            "UPDATE OR FAIL instances SET
             status = CASE WHEN status = 6 AND ?2 IN (1, 7) THEN status ELSE ?2 END,
             started_at = COALESCE(started_at, ?3),
             ended_at = COALESCE(?4, ended_at),
             output = COALESCE(?5, output),
             error_name = COALESCE(?6, error_name),
             error_message = COALESCE(?7, error_message),
             ready_at = ?8,
             ready_rank = CASE WHEN ?2 = 0 THEN 1 ELSE 0 END,
             lease_owner = CASE WHEN ?9 THEN NULL ELSE lease_owner END,
             lease_until = CASE WHEN ?9 THEN NULL ELSE lease_until END,
             rollback_outcome = COALESCE(?10, rollback_outcome),
             purge_at = CASE WHEN ?2 = 5 THEN COALESCE(?4, ended_at) + retain_success_ms
                             WHEN ?2 IN (3, 4) THEN COALESCE(?4, ended_at) + retain_error_ms
                             ELSE purge_at END
         WHERE iid = ?1",
        )
        .and_then(|mut st| {
            st.execute(params![
                instance.0,
                c.status.code(),
                c.started_at.map(Timestamp::as_millis),
                c.ended_at.map(Timestamp::as_millis),
                c.output,
                c.error.as_ref().map(|e| e.name.as_str()),
                c.error.as_ref().map(|e| e.message.as_str()),
                c.ready_at.map(Timestamp::as_millis),
                c.release,
                c.rollback_outcome.as_ref().map(to_json).transpose()?,
            ])
        })
        .map_err(map_sqlite)?;
    // Only an end can have a parent to wake or a slot to give back, and only a child or a
    // keyed instance has either: the other changes pay no second statement, and an end
    // only a lookup of the row just written (cheaper than a `RETURNING`, see `claim`).
    if !c.status.is_terminal() || changed == 0 {
        return Ok(());
    }
    let (child, keyed) = two_facts(
        conn,
        "SELECT parent_iid IS NOT NULL, ckey IS NOT NULL FROM instances WHERE iid = ?1",
        instance,
    )?;
    if child {
        wake_parent(conn, instance)?;
    }
    if keyed {
        crate::slots::give_back(conn, instance)?;
    }
    Ok(())
}

/// Two yes-or-no facts about an instance's row (`select` names `?1` for its id), read back
/// after an update of it rather than `RETURNING`ed (see `claim`).
fn two_facts(conn: &Connection, select: &str, instance: InstanceRef) -> Result<(bool, bool)> {
    conn.prepare_cached(select)
        .and_then(|mut st| st.query_row([instance.0], |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(map_sqlite)
}

/// A child instance has ended (or is being deleted): its parent, if it hibernates, becomes
/// claimable at once, so the `invoke` step waiting for the child takes its outcome.
fn wake_parent(conn: &Connection, child: InstanceRef) -> Result<()> {
    conn.prepare_cached(
        "UPDATE instances SET ready_at = created_at, ready_rank = 0
         WHERE iid = (SELECT parent_iid FROM instances WHERE iid = ?1) AND status = 7",
    )
    .and_then(|mut st| st.execute([child.0]))
    .map_err(map_sqlite)?;
    Ok(())
}

fn awaited_by_its_parent(conn: &Connection, child: InstanceRef) -> Result<bool> {
    conn.prepare_cached(AWAITED_BY_ITS_PARENT_SQL)
        .and_then(|mut st| st.query_row([child.0], |r| r.get(0)))
        .map_err(map_sqlite)
}

/// A child being restarted: its new link as [`ParentLink::restarted`] decides from its
/// parent's row (adopted by the parent's new run, or detached when the parent has ended),
/// `None` when it stays. Only read: the restart writes it once nothing can refuse it.
fn restarted_link(
    conn: &Connection,
    child: InstanceRef,
    adopt: Option<&cairn_store::Adopt>,
) -> Result<Option<ParentLink>> {
    let stored: Option<(Option<i64>, Option<String>)> = conn
        .prepare_cached("SELECT parent_iid, parent FROM instances WHERE iid = ?1")
        .and_then(|mut st| st.query_row([child.0], |r| Ok((r.get(0)?, r.get(1)?))))
        .optional()
        .map_err(map_sqlite)?;
    let Some((Some(parent_iid), Some(text))) = stored else {
        return match adopt {
            Some(adopt) => Err(Error::LeaseLost(adopt.parent.instance)),
            None => Ok(None),
        };
    };
    let link = ParentLink::decode(InstanceRef(parent_iid), &text)?;
    let parent: Option<(i64, i64)> = conn
        .prepare_cached("SELECT status, lease_epoch FROM instances WHERE iid = ?1")
        .and_then(|mut st| st.query_row([parent_iid], |r| Ok((r.get(0)?, r.get(1)?))))
        .optional()
        .map_err(map_sqlite)?;
    let parent = match parent {
        Some((code, epoch)) => Some((
            InstanceStatus::from_code(code)
                .ok_or_else(|| corrupt(format!("unknown status code {code}")))?,
            u64::try_from(epoch).map_err(corrupt)?,
        )),
        None => None,
    };
    link.restarted(parent, adopt)
}

/// A parent's children, through the partial index `instances_children`.
pub(crate) fn children_sql() -> String {
    format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE parent_iid = ?1 ORDER BY iid")
}

/// The instances `parent`'s `invoke` steps started, oldest first.
pub(crate) fn children(conn: &Connection, parent: InstanceRef) -> Result<Vec<InstanceRecord>> {
    conn.prepare_cached(&children_sql())
        .and_then(|mut st| {
            st.query_map([parent.0], instance)?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(map_sqlite)?
        .into_iter()
        .collect()
}

pub(crate) fn journal(conn: &Connection, instance: InstanceRef) -> Result<Vec<StepRecord>> {
    let mut st = conn
        .prepare_cached(
            "SELECT s.kind, s.name, s.count, s.seq, s.state, c.config, s.attempts, s.in_flight,
                 s.wake_at, s.output, s.error_name, s.error_message, s.started_at, s.ended_at,
                 s.has_rollback
             FROM steps s LEFT JOIN configs c ON c.id = s.config WHERE s.iid = ?1 ORDER BY s.seq",
        )
        .map_err(map_sqlite)?;
    let mut configs = cairn_store::packing::JournalConfigs::default();
    let rows = st
        .query_map([instance.0], |r| {
            let kind: i64 = r.get(0)?;
            let state: i64 = r.get(4)?;
            let config = configs.read(r.get(5)?);
            Ok((|| {
                Ok(StepRecord {
                    key: StepKey {
                        kind: StepKind::from_code(kind)
                            .ok_or_else(|| corrupt(format!("unknown step kind {kind}")))?,
                        name: r.get(1).map_err(map_sqlite)?,
                        count: r.get(2).map_err(map_sqlite)?,
                    },
                    seq: r.get(3).map_err(map_sqlite)?,
                    state: StepState::from_code(state)
                        .ok_or_else(|| corrupt(format!("unknown step state {state}")))?,
                    config: config?,
                    attempts: r.get(6).map_err(map_sqlite)?,
                    in_flight: r.get(7).map_err(map_sqlite)?,
                    wake_at: ts(r.get(8).map_err(map_sqlite)?),
                    output: r.get(9).map_err(map_sqlite)?,
                    error: error_info(
                        r.get(10).map_err(map_sqlite)?,
                        r.get(11).map_err(map_sqlite)?,
                    ),
                    started_at: Timestamp::from_millis(r.get(12).map_err(map_sqlite)?),
                    ended_at: ts(r.get(13).map_err(map_sqlite)?),
                    has_rollback: r.get(14).map_err(map_sqlite)?,
                })
            })())
        })
        .map_err(map_sqlite)?;
    rows.map(|r| r.map_err(map_sqlite)?).collect()
}

pub(crate) const INSTANCE_KEY_SQL: &str =
    "SELECT iid, status, lease_owner IS NOT NULL, paused_at, params, lease_epoch, rollback_trigger
     FROM instances WHERE workflow = ?1 AND id = ?2";

fn log_now(
    conn: &Connection,
    instance: InstanceRef,
    kind: LogKind,
    at: Timestamp,
    meta: serde_json::Value,
) -> Result<()> {
    append_log(
        conn,
        instance,
        &LogEntry {
            kind,
            at,
            step: None,
            meta,
        },
    )
}

/// Whether a stored rollback trigger is a terminate with rollback's.
fn terminating(trigger: Option<&str>) -> bool {
    trigger
        .and_then(|t| serde_json::from_str::<cairn_core::RollbackTrigger>(t).ok())
        .is_some_and(|t| t.terminate)
}

/// Applies a management request; see `ControlRequest`.
pub(crate) fn control(
    conn: &Connection,
    workflow: &str,
    id: &str,
    request: &ControlRequest,
) -> Result<ControlOutcome> {
    type KeyRow = (i64, i64, bool, Option<i64>, String, i64, Option<String>);
    let row: Option<KeyRow> = conn
        .prepare_cached(INSTANCE_KEY_SQL)
        .and_then(|mut st| {
            st.query_row(params![workflow, id], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                ))
            })
            .optional()
        })
        .map_err(map_sqlite)?;
    let Some((iid, code, leased, paused_at, params, epoch, trigger_before)) = row else {
        return Ok(ControlOutcome::NotFound);
    };
    let instance = InstanceRef(iid);
    let from = InstanceStatus::from_code(code)
        .ok_or_else(|| corrupt(format!("unknown status code {code}")))?;
    let exec = |sql: &str, args: &[&dyn rusqlite::ToSql]| -> Result<()> {
        conn.prepare_cached(sql)
            .and_then(|mut st| st.execute(args))
            .map_err(map_sqlite)?;
        Ok(())
    };
    let epoch = u64::try_from(epoch).map_err(corrupt)?;
    let done = |to| {
        Ok(ControlOutcome::Done {
            instance,
            from,
            to,
            epoch,
        })
    };
    match request {
        ControlRequest::Pause { at } => {
            if from.is_terminal() {
                return Ok(ControlOutcome::Rejected(from));
            }
            if matches!(
                from,
                InstanceStatus::Paused | InstanceStatus::WaitingForPause
            ) {
                return Ok(ControlOutcome::NoOp(from));
            }
            if leased {
                // A lifetime is running: it finishes its in-flight attempts, then pauses.
                exec(
                    "UPDATE instances SET status = 6, paused_at = ?2 WHERE iid = ?1",
                    &[&iid, &at.as_millis()],
                )?;
                return done(InstanceStatus::WaitingForPause);
            }
            exec(
                "UPDATE instances SET status = 2, paused_at = ?2, ready_at = NULL WHERE iid = ?1",
                &[&iid, &at.as_millis()],
            )?;
            crate::slots::give_back(conn, instance)?;
            log_now(
                conn,
                instance,
                LogKind::WorkflowPaused,
                *at,
                serde_json::json!({}),
            )?;
            done(InstanceStatus::Paused)
        }
        ControlRequest::Resume { at } => match from {
            s if s.is_terminal() => Ok(ControlOutcome::Rejected(from)),
            InstanceStatus::WaitingForPause => {
                exec(
                    "UPDATE instances SET status = 1, paused_at = NULL WHERE iid = ?1",
                    &[&iid],
                )?;
                done(InstanceStatus::Running)
            }
            InstanceStatus::Paused => {
                // Time spent paused does not count against sleeps, back-offs and timeouts.
                let shift = at
                    .as_millis()
                    .saturating_sub(paused_at.unwrap_or(at.as_millis()))
                    .max(0);
                exec(
                    "UPDATE steps SET wake_at = wake_at + ?2 WHERE iid = ?1 AND state = 0 AND wake_at IS NOT NULL",
                    &[&iid, &shift],
                )?;
                exec(
                    "UPDATE instances SET status = 0, paused_at = NULL, ready_at = created_at, ready_rank = 0
                     WHERE iid = ?1",
                    &[&iid],
                )?;
                log_now(
                    conn,
                    instance,
                    LogKind::WorkflowResumed,
                    *at,
                    serde_json::json!({ "pausedMs": shift }),
                )?;
                done(InstanceStatus::Queued)
            }
            _ => Ok(ControlOutcome::NoOp(from)),
        },
        ControlRequest::Terminate {
            at,
            rollback: Some(trigger),
        } => {
            if from.is_terminal() {
                return Ok(ControlOutcome::Rejected(from));
            }
            if terminating(trigger_before.as_deref()) {
                // Asked twice (a parent's end and its terminate both reach a child): the
                // rollback under way goes on, not fenced and started over.
                return Ok(ControlOutcome::NoOp(from));
            }
            // The current lifetime is fenced off; the next claim compensates, then terminates.
            exec(
                "UPDATE instances SET status = 1, rollback_trigger = ?2, paused_at = NULL,
                     lease_epoch = lease_epoch + 1, lease_owner = NULL, lease_until = NULL,
                     ready_at = created_at, ready_rank = 0, parked = 0
                 WHERE iid = ?1",
                &[&iid, &to_json(trigger).map_err(map_sqlite)?],
            )?;
            let _ = at;
            done(InstanceStatus::Running)
        }
        ControlRequest::Terminate { at, rollback: None } => {
            if from.is_terminal() {
                return Ok(ControlOutcome::Rejected(from));
            }
            exec(
                "UPDATE instances SET status = 4, ended_at = ?2, lease_epoch = lease_epoch + 1,
                     lease_owner = NULL, lease_until = NULL, ready_at = NULL, paused_at = NULL,
                     purge_at = ?2 + retain_error_ms
                 WHERE iid = ?1",
                &[&iid, &at.as_millis()],
            )?;
            wake_parent(conn, instance)?;
            crate::slots::give_back(conn, instance)?;
            log_now(
                conn,
                instance,
                LogKind::WorkflowTerminated,
                *at,
                serde_json::json!({ "trigger": { "source": "api" } }),
            )?;
            done(InstanceStatus::Terminated)
        }
        ControlRequest::Restart {
            at,
            from: step,
            adopt,
        } => {
            // Decided first, written last: a refused adoption, or a restart from a step
            // the journal does not have, changes nothing (the link included).
            let link = restarted_link(conn, instance, adopt.as_ref())?;
            match step {
                None => {
                    for sql in [
                        "DELETE FROM steps WHERE iid = ?1",
                        "DELETE FROM stream_chunks WHERE iid = ?1",
                        "DELETE FROM log WHERE iid = ?1",
                        "DELETE FROM events WHERE iid = ?1",
                        "DELETE FROM event_keys WHERE iid = ?1",
                    ] {
                        exec(sql, &[&iid])?;
                    }
                    // As a create logs them: byte sequences as their size, cut when large
                    // (they are stored whole in the row).
                    let params_value = cairn_core::binary::log_view(&params);
                    log_now(
                        conn,
                        instance,
                        LogKind::WorkflowQueued,
                        *at,
                        serde_json::json!({ "params": params_value, "trigger": { "source": "api" } }),
                    )?;
                    log_now(
                        conn,
                        instance,
                        LogKind::WorkflowStart,
                        *at,
                        serde_json::json!({}),
                    )?;
                }
                Some(key) => {
                    let offset = i64::from(key.count.max(1) - 1);
                    let seq: Option<i64> = conn
                        .prepare_cached(
                            "SELECT seq FROM steps WHERE iid = ?1 AND kind = ?2 AND name = ?3
                             ORDER BY seq LIMIT 1 OFFSET ?4",
                        )
                        .and_then(|mut st| {
                            st.query_row(params![iid, key.kind.code(), key.name, offset], |r| {
                                r.get(0)
                            })
                            .optional()
                        })
                        .map_err(map_sqlite)?;
                    let Some(seq) = seq else {
                        return Ok(ControlOutcome::StepNotFound);
                    };
                    let compensated: Option<String> = conn
                        .prepare_cached(COMPENSATED_BEFORE_SQL)
                        .and_then(|mut st| {
                            st.query_row(
                                params![iid, seq, StepKind::Run.code(), StepKind::Rollback.code()],
                                |r| r.get(0),
                            )
                            .optional()
                        })
                        .map_err(map_sqlite)?;
                    if let Some(step) = compensated {
                        return Ok(ControlOutcome::Compensated(step));
                    }
                    // Log records of the wiped steps go with them, as do the terminal records.
                    // Cancelled ops go too, wherever they are (state 3): a race's loser, or
                    // an op the workflow dropped when it failed, whose new run may await it
                    // again; kept, it would never finish, and the run would hang on it.
                    exec(
                        "DELETE FROM log WHERE iid = ?1 AND (kind IN (2, 3, 4) OR EXISTS (
                             SELECT 1 FROM steps s WHERE s.iid = ?1 AND (s.seq >= ?2 OR s.state = 3) AND s.kind = log.step_kind
                                 AND s.name = log.step_name AND s.count = log.step_count))",
                        &[&iid, &seq],
                    )?;
                    exec(
                        "DELETE FROM stream_chunks WHERE iid = ?1 AND EXISTS (
                             SELECT 1 FROM steps s WHERE s.iid = ?1 AND (s.seq >= ?2 OR s.state = 3) AND s.kind = 0
                                 AND s.name = stream_chunks.name AND s.count = stream_chunks.count)",
                        &[&iid, &seq],
                    )?;
                    exec(
                        "DELETE FROM steps WHERE iid = ?1 AND (seq >= ?2 OR state = 3)",
                        &[&iid, &seq],
                    )?;
                    exec("DELETE FROM events WHERE iid = ?1", &[&iid])?;
                    // The keys of the events cleared go (buffered, or taken by a wait wiped
                    // above); those of events a kept wait took stay: a retried send of one
                    // is still a duplicate, not a second delivery.
                    exec(
                        "DELETE FROM event_keys WHERE iid = ?1 AND (taken_by IS NULL OR taken_by >= ?2)",
                        &[&iid, &seq],
                    )?;
                }
            }
            if let Some(link) = link {
                exec(
                    "UPDATE instances SET parent = ?2 WHERE iid = ?1",
                    &[&iid, &link.encode()],
                )?;
            }
            crate::slots::give_back(conn, instance)?;
            exec(
                "UPDATE instances SET status = 1, started_at = COALESCE(CASE WHEN ?3 THEN NULL ELSE started_at END, ?2),
                     ended_at = NULL, output = NULL, error_name = NULL, error_message = NULL, paused_at = NULL,
                     purge_at = NULL, rollback_trigger = NULL, rollback_outcome = NULL,
                     lease_epoch = lease_epoch + 1, lease_owner = NULL, lease_until = NULL,
                     ready_at = created_at, ready_rank = 0
                 WHERE iid = ?1",
                &[&iid, &at.as_millis(), &step.is_none()],
            )?;
            done(InstanceStatus::Running)
        }
        ControlRequest::Delete => {
            if from.is_terminal() && awaited_by_its_parent(conn, instance)? {
                // Finished, but its parent has not taken its outcome yet: told "deleted",
                // the parent would lose the child's work. Its retention ends now instead,
                // and the purge deletes it once the parent has the outcome.
                exec("UPDATE instances SET purge_at = 0 WHERE iid = ?1", &[&iid])?;
                return done(from);
            }
            if !from.is_terminal() {
                wake_parent(conn, instance)?;
            }
            crate::slots::give_back(conn, instance)?;
            for sql in [
                "DELETE FROM steps WHERE iid = ?1",
                "DELETE FROM stream_chunks WHERE iid = ?1",
                "DELETE FROM log WHERE iid = ?1",
                "DELETE FROM events WHERE iid = ?1",
                "DELETE FROM event_keys WHERE iid = ?1",
                "DELETE FROM instances WHERE iid = ?1",
            ] {
                exec(sql, &[&iid])?;
            }
            done(from)
        }
    }
}

/// The longest retention stored: 2^62 ms, 146 million years, "keep forever". Saturating
/// here (not at `i64::MAX`) keeps `ended_at + retain` in SQL an integer: SQLite turns an
/// overflowing integer sum into a REAL, which then no longer reads back as a timestamp.
pub(crate) const MAX_RETAIN_MS: i64 = 1 << 62;

/// The first `run` step started before seq `?2` that a rollback compensated (or tried to:
/// it has a rollback row), as its target `name-count`; `?3` and `?4` are the `run` and
/// rollback kinds' codes.
const COMPENSATED_BEFORE_SQL: &str = "SELECT f.name || '-' || f.count FROM steps r
     JOIN steps f ON f.iid = r.iid AND f.kind = ?3 AND f.name = r.name AND f.count = r.count
     WHERE r.iid = ?1 AND r.kind = ?4 AND f.seq < ?2
     ORDER BY f.seq LIMIT 1";

fn retain_ms(d: std::time::Duration) -> i64 {
    millis(d).min(MAX_RETAIN_MS)
}

fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn purge(conn: &Connection, now: Timestamp, limit: usize) -> Result<usize> {
    let iids: Vec<i64> = conn
        .prepare_cached(DUE_PURGES_SQL)
        .and_then(|mut st| {
            st.query_map(
                params![now.as_millis(), i64::try_from(limit).unwrap_or(i64::MAX)],
                |r| r.get(0),
            )?
            .collect::<rusqlite::Result<_>>()
        })
        .map_err(map_sqlite)?;
    for iid in &iids {
        for sql in [
            "DELETE FROM steps WHERE iid = ?1",
            "DELETE FROM stream_chunks WHERE iid = ?1",
            "DELETE FROM log WHERE iid = ?1",
            "DELETE FROM events WHERE iid = ?1",
            "DELETE FROM event_keys WHERE iid = ?1",
            "DELETE FROM instances WHERE iid = ?1",
        ] {
            conn.prepare_cached(sql)
                .and_then(|mut st| st.execute([iid]))
                .map_err(map_sqlite)?;
        }
    }
    Ok(iids.len())
}

pub(crate) fn next_purge(conn: &Connection) -> Result<Option<Timestamp>> {
    let at: Option<i64> = conn
        .query_row(NEXT_PURGE_SQL, [], |r| r.get(0))
        .optional()
        .map_err(map_sqlite)?
        .flatten();
    Ok(ts(at))
}

/// Pending pauses of instances whose lifetime is gone take effect. The instance ran on
/// after the pause was requested, up to its last record: timers shift on resume by the
/// time since then, not since the request. Logged as any pause that takes effect is.
pub(crate) fn complete_pauses(conn: &Connection, iids: &[i64]) -> Result<()> {
    for &iid in iids {
        let at: i64 = conn
            .prepare_cached(
                "UPDATE instances SET status = 2, lease_owner = NULL, lease_until = NULL, ready_at = NULL,
                     paused_at = MAX(COALESCE(paused_at, 0),
                                     COALESCE((SELECT MAX(at) FROM log WHERE log.iid = instances.iid), 0))
                 WHERE iid = ?1 RETURNING paused_at",
            )
            .and_then(|mut st| st.query_row([iid], |r| r.get(0)))
            .map_err(map_sqlite)?;
        log_now(
            conn,
            InstanceRef(iid),
            LogKind::WorkflowPaused,
            Timestamp::from_millis(at),
            serde_json::json!({ "recovered": true }),
        )?;
        crate::slots::give_back(conn, InstanceRef(iid))?;
    }
    Ok(())
}

/// See `Store::release_all`: the take-over at open (`take_over`), for one owner.
pub(crate) fn release_all(conn: &Connection, owner: &str) -> Result<()> {
    let pausing: Vec<i64> = conn
        .prepare_cached("SELECT iid FROM instances WHERE status = 6 AND lease_owner = ?1")
        .and_then(|mut st| {
            st.query_map([owner], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()
        })
        .map_err(map_sqlite)?;
    complete_pauses(conn, &pausing)?;
    conn.prepare_cached(
        "UPDATE instances SET lease_owner = NULL, lease_until = NULL,
             ready_at = CASE WHEN status IN (0, 1, 7) THEN created_at ELSE ready_at END,
             ready_rank = CASE WHEN status IN (0, 1, 7) THEN 0 ELSE ready_rank END
         WHERE lease_owner = ?1",
    )
    .and_then(|mut st| st.execute([owner]))
    .map_err(map_sqlite)?;
    Ok(())
}

/// See `Store::reclaim`.
pub(crate) fn reclaim(
    conn: &Connection,
    owner: &str,
    lease: Lease,
    now: Timestamp,
    ttl: Duration,
) -> Result<Lease> {
    let epoch: Option<i64> = conn
        .prepare_cached(
            "UPDATE instances SET lease_epoch = lease_epoch + 1, lease_until = ?4
             WHERE iid = ?1 AND lease_epoch = ?2 AND lease_owner = ?3 RETURNING lease_epoch",
        )
        .and_then(|mut st| {
            st.query_row(
                params![
                    lease.instance.0,
                    i64::try_from(lease.epoch).unwrap_or(i64::MAX),
                    owner,
                    now.saturating_add(ttl).as_millis()
                ],
                |r| r.get(0),
            )
            .optional()
        })
        .map_err(map_sqlite)?;
    match epoch {
        Some(epoch) => Ok(Lease {
            instance: lease.instance,
            epoch: u64::try_from(epoch).map_err(corrupt)?,
        }),
        None => Err(Error::LeaseLost(lease.instance)),
    }
}

pub(crate) fn create_schedule(conn: &Connection, s: &StoredSchedule) -> Result<bool> {
    // A deleted schedule's row is taken over by the new one, as its next generation.
    let written = conn
        .prepare_cached(
            "INSERT INTO schedules (name, definition, paused, resumed_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (name) DO UPDATE SET definition = excluded.definition,
                 paused = excluded.paused, resumed_at = excluded.resumed_at,
                 updated_at = excluded.updated_at, generation = generation + 1,
                 last_tick = NULL, last_run = NULL, deleted = 0, legacy = 0
             WHERE deleted = 1",
        )
        .and_then(|mut st| {
            st.execute(params![
                s.name,
                s.definition,
                s.paused,
                s.resumed_at.map(Timestamp::as_millis),
                s.updated_at.as_millis()
            ])
        })
        .map_err(map_sqlite)?;
    Ok(written == 1)
}

pub(crate) fn set_schedule_state(
    conn: &Connection,
    name: &str,
    state: &ScheduleState,
) -> Result<bool> {
    // A new row is `legacy`: its last tick is inferred from the instances once, as it was
    // for a schedule in code without a row (an engine from before rows were made at start
    // may have fired it). One brought back from deleted is a new schedule: nothing fired.
    let sql = if state.declared && state.only_if_not_live {
        "INSERT INTO schedules (name, definition, paused, resumed_at, updated_at, legacy)
         VALUES (?1, NULL, ?2, ?3, ?4, 1) ON CONFLICT (name) DO UPDATE SET
             paused = excluded.paused, resumed_at = excluded.resumed_at,
             updated_at = excluded.updated_at, definition = NULL,
             generation = generation + 1, last_tick = NULL, last_run = NULL, deleted = 0,
             legacy = 0
         WHERE deleted = 1"
    } else if state.declared {
        "INSERT INTO schedules (name, definition, paused, resumed_at, updated_at)
         VALUES (?1, NULL, ?2, ?3, ?4) ON CONFLICT (name) DO UPDATE SET
             paused = excluded.paused, resumed_at = COALESCE(excluded.resumed_at, resumed_at),
             updated_at = excluded.updated_at, definition = NULL,
             generation = generation + deleted, last_tick = CASE WHEN deleted = 1 THEN NULL ELSE last_tick END,
             last_run = CASE WHEN deleted = 1 THEN NULL ELSE last_run END, deleted = 0"
    } else {
        "UPDATE schedules SET paused = ?2, resumed_at = COALESCE(?3, resumed_at), updated_at = ?4
         WHERE name = ?1 AND definition IS NOT NULL AND deleted = 0"
    };
    let written = conn
        .prepare_cached(sql)
        .and_then(|mut st| {
            st.execute(params![
                name,
                state.paused,
                state.resumed_at.map(Timestamp::as_millis),
                state.at.as_millis()
            ])
        })
        .map_err(map_sqlite)?;
    Ok(written == 1)
}

pub(crate) fn schedules(conn: &Connection) -> Result<Vec<StoredSchedule>> {
    conn.prepare_cached(
        "SELECT name, definition, paused, resumed_at, updated_at, generation, last_tick,
             last_run, legacy
         FROM schedules WHERE deleted = 0 ORDER BY name",
    )
    .and_then(|mut st| {
        st.query_map([], |r| {
            Ok(StoredSchedule {
                name: r.get(0)?,
                definition: r.get(1)?,
                paused: r.get(2)?,
                resumed_at: ts(r.get(3)?),
                updated_at: Timestamp::from_millis(r.get(4)?),
                generation: u64::try_from(r.get::<_, i64>(5)?).unwrap_or(0),
                last_tick: ts(r.get(6)?),
                last_run: r.get(7)?,
                legacy: r.get(8)?,
            })
        })?
        .collect()
    })
    .map_err(map_sqlite)
}

pub(crate) fn delete_schedule(conn: &Connection, name: &str, declared: bool) -> Result<bool> {
    let deleted = conn
        .prepare_cached(
            "UPDATE schedules SET deleted = 1, definition = NULL
             WHERE name = ?1 AND deleted = 0 AND (definition IS NOT NULL OR ?2)",
        )
        .and_then(|mut st| st.execute(params![name, declared]))
        .map_err(map_sqlite)?;
    Ok(deleted == 1)
}

/// See `Store::fire_tick`.
pub(crate) fn fire_tick(conn: &Connection, t: &ScheduleTick) -> Result<TickFired> {
    if t.declared {
        conn.prepare_cached(
            "INSERT INTO schedules (name, definition, paused, resumed_at, updated_at)
             VALUES (?1, NULL, 0, NULL, ?2) ON CONFLICT (name) DO NOTHING",
        )
        .and_then(|mut st| st.execute(params![t.schedule, t.tick.as_millis()]))
        .map_err(map_sqlite)?;
    }
    type Row = (i64, Option<i64>, Option<String>, bool, bool);
    let row: Option<Row> = conn
        .prepare_cached(
            "SELECT generation, last_tick, last_run, deleted, paused FROM schedules WHERE name = ?1",
        )
        .and_then(|mut st| {
            st.query_row([&t.schedule], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .optional()
        })
        .map_err(map_sqlite)?;
    let Some((generation, last_tick, last_run, deleted, paused)) = row else {
        return Ok(TickFired::Stale);
    };
    if deleted || paused || u64::try_from(generation).ok() != Some(t.generation) {
        return Ok(TickFired::Stale);
    }
    // A last tick stored by a clock ahead of this engine's holds nothing back.
    if let Some(last) =
        last_tick.filter(|last| *last >= t.tick.as_millis() && *last <= t.ahead_after.as_millis())
    {
        return Ok(TickFired::AlreadyFired {
            last_tick: Timestamp::from_millis(last),
            last_run,
        });
    }
    if t.passed_over {
        // The run the overlap policy looks at stays the last one started.
        conn.prepare_cached("UPDATE schedules SET last_tick = ?2 WHERE name = ?1")
            .and_then(|mut st| st.execute(params![t.schedule, t.tick.as_millis()]))
            .map_err(map_sqlite)?;
        return Ok(TickFired::PassedOver);
    }
    let created = insert_instance(conn, &t.instance)?;
    let run = match created {
        Created::New(_) => Some(t.instance.id.to_string()),
        Created::AlreadyExists => None,
    };
    conn.prepare_cached(
        "UPDATE schedules SET last_tick = ?2, last_run = COALESCE(?3, last_run) WHERE name = ?1",
    )
    .and_then(|mut st| st.execute(params![t.schedule, t.tick.as_millis(), run]))
    .map_err(map_sqlite)?;
    Ok(match created {
        Created::New(instance) => TickFired::Fired(instance),
        Created::AlreadyExists => TickFired::Taken,
    })
}

/// See `Store::register_versions`.
pub(crate) fn register_versions(conn: &Connection, versions: &[WorkflowVersion]) -> Result<()> {
    let mut st = conn
        .prepare_cached(
            "INSERT INTO workflow_versions (workflow, version, registered_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (workflow, version) DO NOTHING",
        )
        .map_err(map_sqlite)?;
    for v in versions {
        st.execute(params![
            v.workflow.as_str(),
            v.version,
            v.registered_at.as_millis()
        ])
        .map_err(map_sqlite)?;
    }
    Ok(())
}

/// See `Store::workflow_versions`.
pub(crate) fn workflow_versions(conn: &Connection) -> Result<Vec<WorkflowVersion>> {
    let rows: Vec<(String, String, i64)> = conn
        .prepare_cached(
            "SELECT workflow, version, registered_at FROM workflow_versions
             ORDER BY registered_at, workflow, version",
        )
        .and_then(|mut st| {
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(map_sqlite)?;
    rows.into_iter()
        .map(|(workflow, version, at)| {
            Ok(WorkflowVersion {
                workflow: WorkflowName::new(workflow).map_err(corrupt)?,
                version,
                registered_at: Timestamp::from_millis(at),
            })
        })
        .collect()
}

/// See `Store::unfinished_versions`: the workflow's unfinished instances through
/// `instances_by_status (workflow, status, iid)`, one range per unfinished status.
pub(crate) fn unfinished_versions(
    conn: &Connection,
    workflow: &str,
) -> Result<Vec<(Option<String>, u64)>> {
    conn.prepare_cached(
        "SELECT version, count(*) FROM instances
         WHERE workflow = ?1 AND status IN (0, 1, 2, 6, 7)
         GROUP BY version ORDER BY version",
    )
    .and_then(|mut st| {
        st.query_map([workflow], |r| {
            Ok((r.get(0)?, u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0)))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()
    })
    .map_err(map_sqlite)
}

/// See `Store::wake_awaiting`: through `instances_next_ready (workflow, ready_at)`, the
/// awaiting ones at their wake time.
pub(crate) fn wake_awaiting(
    conn: &Connection,
    workflow: &str,
    version: &str,
    limit: u64,
) -> Result<u64> {
    let woken = conn
        .prepare_cached(
            "UPDATE instances SET ready_at = created_at, ready_rank = 0
             WHERE iid IN (SELECT iid FROM instances
                 WHERE workflow = ?1 AND ready_at = ?3 AND version = ?2 AND status IN (0, 7)
                 ORDER BY iid LIMIT ?4)",
        )
        .and_then(|mut st| {
            st.execute(params![
                workflow,
                version,
                cairn_store::AWAITING_WORKER.as_millis(),
                i64::try_from(limit).unwrap_or(i64::MAX)
            ])
        })
        .map_err(map_sqlite)?;
    Ok(u64::try_from(woken).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use cairn_core::{LogKind, StepKind};
    use cairn_store::InstanceRef;
    use rusqlite::Connection;

    use crate::schema::{migrate, migrate_to};

    /// A database written before migration 9 (configs inside rows, one record per log row)
    /// reads back the same after it, and records written after it come later.
    #[test]
    fn history_written_before_migration_9_reads_back_unchanged() {
        let mut conn = Connection::open_in_memory().expect("open");
        migrate_to(&mut conn, 8).expect("migrate to 8");
        let config =
            r#"{"retries":{"backoff":"constant","delay":5,"limit":1},"timeout":"1 minute"}"#;
        conn.execute_batch(&format!(
            "INSERT INTO instances (workflow, id, status, params, created_at) VALUES ('w', 'a', 1, '{{}}', 1);
             INSERT INTO steps VALUES (1, 0, 's', 1, 1, 1, '{config}', 1, 0, NULL, '7', NULL, NULL, 2, 3, 0);
             INSERT INTO log (iid, at, kind, meta) VALUES (1, 1, 0, '{{\"params\":{{}}}}');
             INSERT INTO log (iid, at, kind, step_kind, step_name, step_count, meta)
                 VALUES (1, 2, 5, 0, 's', 1, '{{\"config\":{config},\"hasRollback\":false}}');
             INSERT INTO log (iid, at, kind, step_kind, step_name, step_count, meta)
                 VALUES (1, 2, 10, 0, 's', 1, '{{\"attempt\":1}}');"
        ))
        .expect("v8 rows");
        migrate(&mut conn).expect("migrate");
        let journal = super::journal(&conn, InstanceRef(1)).expect("journal");
        assert_eq!(journal.len(), 1);
        assert_eq!(
            *journal[0].config,
            serde_json::from_str::<serde_json::Value>(config).expect("json")
        );
        assert_eq!(journal[0].output.as_deref(), Some("7"));
        let log = crate::history::log(&conn, InstanceRef(1), 0, 10).expect("log");
        let ids: Vec<u64> = log.iter().map(|r| r.id).collect();
        assert_eq!(ids, [1, 2, 3], "ids are kept");
        assert_eq!(log[1].entry.kind, LogKind::StepStart);
        assert_eq!(
            log[1].entry.meta["config"],
            serde_json::from_str::<serde_json::Value>(config).expect("json")
        );
        assert_eq!(
            log[1].entry.step.as_ref().map(|k| k.kind),
            Some(StepKind::Run)
        );
        let next = cairn_core::LogEntry {
            kind: LogKind::WorkflowSuccess,
            at: cairn_core::Timestamp::from_millis(4),
            step: None,
            meta: serde_json::json!({}),
        };
        crate::history::append(&conn, InstanceRef(1), &[&next]).expect("append");
        let log = crate::history::log(&conn, InstanceRef(1), 3, 10).expect("log");
        assert_eq!(log.len(), 1);
        assert!(log[0].id > 3, "{}", log[0].id);
    }

    /// A step whose configuration row is gone reads as corrupt, never as a journal without
    /// it (replay would run the step again), and so does a record referring to it.
    #[test]
    fn a_missing_configuration_is_corrupt_not_left_out() {
        let mut conn = Connection::open_in_memory().expect("open");
        migrate(&mut conn).expect("migrate");
        conn.execute_batch(
            "INSERT INTO instances (workflow, id, status, params, created_at) VALUES ('w', 'a', 1, '{}', 1);
             INSERT INTO configs (id, config) VALUES (7, '{}');
             INSERT INTO steps VALUES (1, 0, 's', 1, 1, 1, 7, 1, 0, NULL, '7', NULL, NULL, 2, 3, 0);
             INSERT INTO log (id, iid, at, kind, step_kind, step_name, step_count, meta, config)
                 VALUES (2, 1, 2, 5, 0, 's', 1, '{}', 7);
             DELETE FROM configs;",
        )
        .expect("rows");
        let journal = super::journal(&conn, InstanceRef(1));
        assert!(
            matches!(journal, Err(cairn_store::Error::Corrupt(_))),
            "{journal:?}"
        );
        let log = crate::history::log(&conn, InstanceRef(1), 0, 10);
        assert!(
            matches!(log, Err(cairn_store::Error::Corrupt(_))),
            "{log:?}"
        );
    }
}
