//! The event log in PostgreSQL rows, laid out as `cairn_store::packing` describes, and the
//! order of its ids.
//!
//! Readers of a workflow's log resume after the last id they saw, so an id must never
//! become visible after a larger one did. Sequences do not give that with concurrent
//! transactions (a transaction holding id 10 may commit after one holding 11). So records
//! are not inserted as they are written: a transaction collects them ([`Pending`]) and, as
//! its very last statement, takes the ids from the one-row `log_clock` with an `UPDATE` and
//! inserts every row in the same statement. The row lock is held until the commit: the
//! next transaction that writes records reads the clock only after this one is visible,
//! so ids are in commit order. Taking it last keeps the hold short (the insert and the
//! commit) and out of every lock cycle, since nothing is locked after it.

use std::collections::HashMap;

use cairn_core::{InstanceId, LogEntry, LogRecord};
use cairn_store::packing::{self, ROW_ID_STRIDE, StoredRow};
use cairn_store::{InstanceRef, Result, WorkflowLogPage};
use deadpool_postgres::{GenericClient, Transaction};
use tokio_postgres::Row;

use crate::db::{Failure, corrupt, map_pg};

/// A log row waiting for the end of its transaction.
#[derive(Debug, Clone)]
struct Owned {
    iid: i64,
    at: i64,
    kind: i64,
    step: Option<(i64, String, i64)>,
    meta: String,
    config: Option<String>,
    second: Option<(i64, String)>,
}

/// The records a transaction has written so far, in order.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    rows: Vec<Owned>,
    /// Records to drop from the rows of the operations before this one in the same
    /// transaction, once this one's are taken in ([`Pending::extend`]).
    forgotten: Vec<(i64, i64, (i64, String, i64))>,
}

impl Pending {
    /// Appends records of an instance, two to a row where they allow it.
    pub(crate) fn append(&mut self, instance: InstanceRef, records: &[&LogEntry]) -> Result<()> {
        self.append_with(instance, records, &[])
    }

    /// [`Pending::append`] for records committed with step rows (see
    /// [`packing::pack_with`]).
    pub(crate) fn append_with(
        &mut self,
        instance: InstanceRef,
        records: &[&LogEntry],
        steps: &[&cairn_core::StepRecord],
    ) -> Result<()> {
        for row in packing::pack_with(records, steps)? {
            let first = row.first;
            self.rows.push(Owned {
                iid: instance.0,
                at: first.at.as_millis(),
                kind: first.kind.code(),
                step: first
                    .step
                    .as_ref()
                    .map(|k| (k.kind.code(), k.name.clone(), i64::from(k.count))),
                meta: row.meta,
                config: row.config,
                second: row.second.map(|(k, m)| (k.code(), m)),
            });
        }
        Ok(())
    }

    /// Appends another operation's rows after these, dropping first the records it forgot.
    pub(crate) fn extend(&mut self, other: Pending) {
        for (iid, kind, step) in &other.forgotten {
            self.drop_rows(*iid, *kind, step);
        }
        self.forgotten.extend(other.forgotten);
        self.rows.extend(other.rows);
    }

    /// Forgets an instance's pending records of one kind and step, alone in their rows
    /// (as a take's `WAIT_COMPLETE` is), here and in the operations before this one.
    pub(crate) fn forget_record(
        &mut self,
        instance: InstanceRef,
        kind: cairn_core::LogKind,
        step: &cairn_core::StepKey,
    ) {
        let step = (step.kind.code(), step.name.clone(), i64::from(step.count));
        self.drop_rows(instance.0, kind.code(), &step);
        self.forgotten.push((instance.0, kind.code(), step));
    }

    fn drop_rows(&mut self, iid: i64, kind: i64, step: &(i64, String, i64)) {
        self.rows.retain(|r| {
            !(r.iid == iid && r.kind == kind && r.second.is_none() && r.step.as_ref() == Some(step))
        });
    }

    /// Forgets an instance's pending rows (it was deleted or restarted in this transaction).
    pub(crate) fn forget(&mut self, instance: InstanceRef) {
        self.rows.retain(|r| r.iid != instance.0);
    }

    /// Inserts every pending row with ids from the clock: the transaction's last statement.
    pub(crate) async fn flush(
        &mut self,
        tx: &Transaction<'_>,
        configs: &Configs,
    ) -> Result<(), Failure> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let mut config_ids = Vec::with_capacity(self.rows.len());
        for r in &self.rows {
            config_ids.push(match &r.config {
                Some(c) => Some(configs.id(tx, c).await?),
                None => None,
            });
        }
        let n = i64::try_from(self.rows.len()).map_err(corrupt)?;
        let iids: Vec<i64> = self.rows.iter().map(|r| r.iid).collect();
        let ats: Vec<i64> = self.rows.iter().map(|r| r.at).collect();
        let kinds: Vec<i64> = self.rows.iter().map(|r| r.kind).collect();
        let step_kinds: Vec<Option<i64>> = self
            .rows
            .iter()
            .map(|r| r.step.as_ref().map(|s| s.0))
            .collect();
        let step_names: Vec<Option<&str>> = self
            .rows
            .iter()
            .map(|r| r.step.as_ref().map(|s| s.1.as_str()))
            .collect();
        let step_counts: Vec<Option<i64>> = self
            .rows
            .iter()
            .map(|r| r.step.as_ref().map(|s| s.2))
            .collect();
        let metas: Vec<&str> = self.rows.iter().map(|r| r.meta.as_str()).collect();
        let kinds2: Vec<Option<i64>> = self
            .rows
            .iter()
            .map(|r| r.second.as_ref().map(|s| s.0))
            .collect();
        let metas2: Vec<Option<&str>> = self
            .rows
            .iter()
            .map(|r| r.second.as_ref().map(|s| s.1.as_str()))
            .collect();
        let stride = i64::try_from(ROW_ID_STRIDE).map_err(corrupt)?;
        let st = tx
            .prepare_cached(
                "WITH c AS (UPDATE log_clock SET last = last + $1::bigint * $2::bigint RETURNING last)
                 INSERT INTO log (id, iid, at, kind, step_kind, step_name, step_count, meta, config,
                     kind2, meta2)
                 SELECT c.last - $1::bigint * $2::bigint + $2::bigint * u.n, u.iid, u.at, u.kind, u.step_kind, u.step_name,
                     u.step_count, u.meta, u.config, u.kind2, u.meta2
                 FROM c, unnest($3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::text[],
                     $8::bigint[], $9::text[], $10::bigint[], $11::bigint[], $12::text[])
                     WITH ORDINALITY AS u(iid, at, kind, step_kind, step_name, step_count, meta,
                         config, kind2, meta2, n)",
            )
            .await?;
        tx.execute(
            &st,
            &[
                &n,
                &stride,
                &iids,
                &ats,
                &kinds,
                &step_kinds,
                &step_names,
                &step_counts,
                &metas,
                &config_ids,
                &kinds2,
                &metas2,
            ],
        )
        .await?;
        self.rows.clear();
        Ok(())
    }
}

/// Configuration ids by text. Ids are never deleted, so one learnt from a committed
/// transaction stays true; ones learnt in a transaction are kept apart until it commits.
/// Shared by the operations of a transaction, which run concurrently (the locks are never
/// held across an await).
#[derive(Debug, Default)]
pub(crate) struct Configs {
    known: std::sync::Mutex<HashMap<String, i64>>,
    fresh: std::sync::Mutex<HashMap<String, i64>>,
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Configs {
    /// The id of a configuration's text, stored on first use.
    pub(crate) async fn id(&self, tx: &Transaction<'_>, config: &str) -> Result<i64, Failure> {
        let cached = lock(&self.known)
            .get(config)
            .copied()
            .or_else(|| lock(&self.fresh).get(config).copied());
        if let Some(id) = cached {
            return Ok(id);
        }
        // `DO NOTHING` takes no lock on an existing row (it waits only for a transaction
        // inserting the same text right now); the row is then read.
        let st = tx
            .prepare_cached(
                "INSERT INTO configs (config) VALUES ($1) ON CONFLICT (config) DO NOTHING RETURNING id",
            )
            .await?;
        let id: i64 = match tx.query_opt(&st, &[&config]).await? {
            Some(row) => row.get(0),
            None => {
                let st = tx
                    .prepare_cached("SELECT id FROM configs WHERE config = $1")
                    .await?;
                tx.query_one(&st, &[&config]).await?.get(0)
            }
        };
        lock(&self.fresh).insert(config.to_owned(), id);
        Ok(id)
    }

    /// The transaction committed: what it learnt is true from now on.
    pub(crate) fn committed(&self) {
        let fresh: Vec<(String, i64)> = lock(&self.fresh).drain().collect();
        lock(&self.known).extend(fresh);
    }

    /// The transaction rolled back: forget what it learnt.
    pub(crate) fn rolled_back(&self) {
        lock(&self.fresh).clear();
    }
}

/// The columns [`records`] reads, from `log l LEFT JOIN configs c ON c.id = l.config`.
macro_rules! log_columns {
    () => {
        "l.id, l.at, l.kind, l.step_kind, l.step_name, l.step_count, l.meta, c.config, l.kind2, l.meta2, l.config"
    };
}

/// An instance's rows that may hold records after a cursor (from the row with the
/// cursor's id: its second record is after it).
pub(crate) const LOG_SQL: &str = concat!(
    "SELECT ",
    log_columns!(),
    " FROM log l LEFT JOIN configs c ON c.id = l.config
     WHERE l.iid = $1 AND l.id >= $2 ORDER BY l.id LIMIT $3"
);

/// A workflow's rows in a window of ids.
pub(crate) const WORKFLOW_LOG_SQL: &str = concat!(
    "SELECT ",
    log_columns!(),
    ", i.id FROM log l JOIN instances i ON i.iid = l.iid
     LEFT JOIN configs c ON c.id = l.config
     WHERE l.id >= $2 AND l.id <= $4 AND i.workflow = $1 ORDER BY l.id LIMIT $3"
);

fn records(r: &Row) -> Result<Vec<LogRecord>> {
    let get = |e: tokio_postgres::Error| corrupt(e);
    let step_kind: Option<i64> = r.try_get(3).map_err(get)?;
    let step_name: Option<String> = r.try_get(4).map_err(get)?;
    let step_count: Option<i64> = r.try_get(5).map_err(get)?;
    let id: i64 = r.try_get(0).map_err(get)?;
    let kind2: Option<i64> = r.try_get(8).map_err(get)?;
    let meta2: Option<String> = r.try_get(9).map_err(get)?;
    let reference: Option<i64> = r.try_get(10).map_err(get)?;
    let step = match (step_kind, step_name, step_count) {
        (Some(k), Some(name), Some(count)) => {
            Some((k, name, u32::try_from(count).map_err(corrupt)?))
        }
        _ => None,
    };
    packing::unpack(StoredRow {
        id,
        at: r.try_get(1).map_err(get)?,
        kind: r.try_get(2).map_err(get)?,
        step,
        meta: r.try_get(6).map_err(get)?,
        config: StoredRow::config(id, reference, r.try_get(7).map_err(get)?)?,
        second: StoredRow::second(id, kind2, meta2)?,
    })
}

fn sql_int(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// Up to `limit` records of an instance with ids above `after`.
pub(crate) async fn log(
    client: &impl GenericClient,
    instance: InstanceRef,
    after: u64,
    limit: usize,
) -> Result<Vec<LogRecord>> {
    let st = client.prepare_cached(LOG_SQL).await.map_err(map_pg)?;
    let rows = client
        .query(
            &st,
            &[
                &instance.0,
                &sql_int(after),
                &sql_int(packing::rows_for(limit)),
            ],
        )
        .await
        .map_err(map_pg)?;
    let rows = rows.iter().map(records).collect::<Result<Vec<_>>>()?;
    Ok(packing::instance_page(rows, after, limit))
}

/// Up to `limit` records of a workflow's instances with ids above `after`, and how far the
/// read looked. The clock is read first: every id up to it (and the second record of its
/// row) is committed, since it moves only at the end of a writing transaction, under a lock
/// held to the commit.
pub(crate) async fn workflow_log(
    client: &impl GenericClient,
    workflow: &str,
    after: u64,
    limit: usize,
) -> Result<WorkflowLogPage> {
    let st = client
        .prepare_cached("SELECT last FROM log_clock")
        .await
        .map_err(map_pg)?;
    let last: i64 = client.query_one(&st, &[]).await.map_err(map_pg)?.get(0);
    let newest = u64::try_from(last).unwrap_or(0) + 1;
    let Some(until) = packing::workflow_window(after, newest) else {
        return Ok(WorkflowLogPage {
            records: Vec::new(),
            scanned_to: after,
        });
    };
    let st = client
        .prepare_cached(WORKFLOW_LOG_SQL)
        .await
        .map_err(map_pg)?;
    let rows = client
        .query(
            &st,
            &[
                &workflow,
                &sql_int(after),
                &sql_int(packing::rows_for(limit)),
                &sql_int(until),
            ],
        )
        .await
        .map_err(map_pg)?;
    let rows = rows
        .iter()
        .map(|row| {
            let id: String = row.try_get(11).map_err(corrupt)?;
            Ok((InstanceId::new(id).map_err(corrupt)?, records(row)?))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(packing::workflow_page(rows, after, until, limit))
}
