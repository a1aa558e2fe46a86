//! The reading operations: each one statement on a pooled connection, outside the writer.

use cairn_core::{
    ErrorInfo, InstanceId, InstanceStatus, StepKey, StepKind, StepRecord, StepState, Timestamp,
    WorkflowName,
};
use cairn_store::{
    InstanceRecord, InstanceRef, ListQuery, ParentLink, Result, ScheduleState, SqlArg,
    StoredSchedule, Timers,
};
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use crate::db::{corrupt, map_pg};

pub(crate) const INSTANCE_COLUMNS: &str = "iid, workflow, id, status, params, created_at, started_at, ended_at, output, error_name, error_message, ready_at, rollback_trigger, rollback_outcome, parent_iid, parent, priority, ckey, parked, version";

/// [`INSTANCE_COLUMNS`] for a listing: every column but the params (up to a megabyte each),
/// which a listing never shows (`"null"` in their place, see `Store::list`).
const LIST_COLUMNS: &str = "iid, workflow, id, status, 'null'::text, created_at, started_at, ended_at, output, error_name, error_message, ready_at, rollback_trigger, rollback_outcome, parent_iid, parent, priority, ckey, parked, version";

fn ts(ms: Option<i64>) -> Option<Timestamp> {
    ms.map(Timestamp::from_millis)
}

fn error_info(name: Option<String>, message: Option<String>) -> Option<ErrorInfo> {
    name.map(|name| ErrorInfo::new(name, message.unwrap_or_default()))
}

/// A typed record stored as JSON text (the rollback trigger and outcome).
pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(corrupt)
}

fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(corrupt)
}

/// An instance from a row whose [`INSTANCE_COLUMNS`] start at `offset`.
pub(crate) fn instance_at(row: &Row, offset: usize) -> Result<InstanceRecord> {
    let g = |i: usize| offset + i;
    let status: i64 = row.try_get(g(3)).map_err(corrupt)?;
    let workflow: String = row.try_get(g(1)).map_err(corrupt)?;
    let id: String = row.try_get(g(2)).map_err(corrupt)?;
    let rollback_trigger: Option<String> = row.try_get(g(12)).map_err(corrupt)?;
    let rollback_outcome: Option<String> = row.try_get(g(13)).map_err(corrupt)?;
    let parent_iid: Option<i64> = row.try_get(g(14)).map_err(corrupt)?;
    let parent: Option<String> = row.try_get(g(15)).map_err(corrupt)?;
    Ok(InstanceRecord {
        instance: InstanceRef(row.try_get(g(0)).map_err(corrupt)?),
        workflow: WorkflowName::new(workflow).map_err(corrupt)?,
        id: InstanceId::new(id).map_err(corrupt)?,
        status: InstanceStatus::from_code(status)
            .ok_or_else(|| corrupt(format!("unknown status code {status}")))?,
        params: row.try_get(g(4)).map_err(corrupt)?,
        created_at: Timestamp::from_millis(row.try_get(g(5)).map_err(corrupt)?),
        started_at: ts(row.try_get(g(6)).map_err(corrupt)?),
        ended_at: ts(row.try_get(g(7)).map_err(corrupt)?),
        output: row.try_get(g(8)).map_err(corrupt)?,
        error: error_info(
            row.try_get(g(9)).map_err(corrupt)?,
            row.try_get(g(10)).map_err(corrupt)?,
        ),
        ready_at: ts(row.try_get(g(11)).map_err(corrupt)?),
        rollback_trigger: rollback_trigger.as_deref().map(from_json).transpose()?,
        rollback_outcome: rollback_outcome.as_deref().map(from_json).transpose()?,
        parent: match (parent_iid, parent) {
            (Some(iid), Some(text)) => Some(ParentLink::decode(InstanceRef(iid), &text)?),
            _ => None,
        },
        priority: row.try_get(g(16)).map_err(corrupt)?,
        concurrency_key: row.try_get(g(17)).map_err(corrupt)?,
        waiting_for_slot: row.try_get(g(18)).map_err(corrupt)?,
        version: row.try_get(g(19)).map_err(corrupt)?,
    })
}

/// A parent's children, through the partial index `instances_children`.
pub(crate) fn children_sql() -> String {
    format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE parent_iid = $1 ORDER BY iid")
}

/// The instances `parent`'s `invoke` steps started, oldest first.
pub(crate) async fn children(
    client: &impl GenericClient,
    parent: InstanceRef,
) -> Result<Vec<InstanceRecord>> {
    let rows = query(client, &children_sql(), &[&parent.0]).await?;
    rows.iter().map(|r| instance_at(r, 0)).collect()
}

async fn query(
    client: &impl GenericClient,
    sql: &str,
    args: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<Row>> {
    let st = client.prepare_cached(sql).await.map_err(map_pg)?;
    client.query(&st, args).await.map_err(map_pg)
}

pub(crate) async fn instance(
    client: &impl GenericClient,
    workflow: &str,
    id: &str,
) -> Result<Option<InstanceRecord>> {
    let rows = query(
        client,
        &format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE workflow = $1 AND id = $2"),
        &[&workflow, &id],
    )
    .await?;
    rows.first().map(|r| instance_at(r, 0)).transpose()
}

/// A page of instances, newest first (or oldest first), and its arguments: a range of
/// `instances_by_workflow` (or of `instances_by_status` with one status), read in order,
/// never sorted.
pub(crate) fn list_sql(q: &ListQuery) -> (String, Vec<SqlArg>) {
    let filter = q.sql_filter(true, placeholder);
    let mut args = filter.args;
    args.push(SqlArg::Int(i64::try_from(q.limit).unwrap_or(i64::MAX)));
    let sql = format!(
        "SELECT {LIST_COLUMNS} FROM instances WHERE {} ORDER BY iid {} LIMIT {}",
        filter.clause,
        if q.oldest_first { "ASC" } else { "DESC" },
        placeholder(args.len())
    );
    (sql, args)
}

fn placeholder(n: usize) -> String {
    format!("${n}")
}

/// `args` as tokio-postgres takes them.
pub(crate) fn bound(args: &[SqlArg]) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
    args.iter()
        .map(|a| match a {
            SqlArg::Int(n) => n as &(dyn tokio_postgres::types::ToSql + Sync),
            SqlArg::Text(s) => s,
        })
        .collect()
}

pub(crate) async fn list(
    client: &impl GenericClient,
    q: &ListQuery,
) -> Result<Vec<InstanceRecord>> {
    let (sql, args) = list_sql(q);
    let rows = query(client, &sql, &bound(&args)).await?;
    rows.iter().map(|r| instance_at(r, 0)).collect()
}

pub(crate) async fn count_matching(client: &impl GenericClient, q: &ListQuery) -> Result<u64> {
    let filter = q.sql_filter(true, placeholder);
    let sql = format!("SELECT count(*) FROM instances WHERE {}", filter.clause);
    let rows = query(client, &sql, &bound(&filter.args)).await?;
    let n: i64 = rows.first().map_or(0, |r| r.get(0));
    Ok(u64::try_from(n).unwrap_or(0))
}

pub(crate) async fn log_head(client: &impl GenericClient) -> Result<u64> {
    let rows = query(client, "SELECT max(id) FROM log", &[]).await?;
    let id: Option<i64> = rows.first().and_then(|r| r.get(0));
    Ok(id.and_then(|id| u64::try_from(id).ok()).unwrap_or(0))
}

/// Instances of a workflow in a status: the folded count plus the deltas not folded yet.
pub(crate) const COUNT_SQL: &str =
    "SELECT (COALESCE((SELECT n FROM instance_counts WHERE workflow = $1 AND status = $2), 0)
           + COALESCE((SELECT SUM(delta) FROM instance_count_deltas
                       WHERE workflow = $1 AND status = $2), 0))::bigint";

pub(crate) async fn count(
    client: &impl GenericClient,
    workflow: &str,
    status: InstanceStatus,
) -> Result<u64> {
    let rows = query(client, COUNT_SQL, &[&workflow, &status.code()]).await?;
    let n: i64 = rows.first().map_or(0, |r| r.get(0));
    Ok(u64::try_from(n).unwrap_or(0))
}

pub(crate) async fn journal(
    client: &impl GenericClient,
    instance: InstanceRef,
) -> Result<Vec<StepRecord>> {
    let rows = query(
        client,
        "SELECT s.kind, s.name, s.count, s.seq, s.state, c.config, s.attempts, s.in_flight,
             s.wake_at, s.output, s.error_name, s.error_message, s.started_at, s.ended_at,
             s.has_rollback
         FROM steps s LEFT JOIN configs c ON c.id = s.config WHERE s.iid = $1 ORDER BY s.seq",
        &[&instance.0],
    )
    .await?;
    let mut configs = cairn_store::packing::JournalConfigs::default();
    rows.iter().map(|r| step_record(r, &mut configs)).collect()
}

pub(crate) async fn stream_chunk(
    client: &impl GenericClient,
    instance: InstanceRef,
    step: &StepKey,
    attempt: u32,
    epoch: u64,
    index: u32,
) -> Result<Option<Vec<u8>>> {
    let rows = query(
        client,
        "SELECT data FROM stream_chunks
         WHERE iid = $1 AND name = $2 AND count = $3 AND attempt = $4 AND epoch = $5 AND idx = $6",
        &[
            &instance.0,
            &step.name,
            &i64::from(step.count),
            &i64::from(attempt),
            &i64::try_from(epoch).unwrap_or(i64::MAX),
            &i64::from(index),
        ],
    )
    .await?;
    rows.first()
        .map(|r| r.try_get(0).map_err(corrupt))
        .transpose()
}

pub(crate) async fn stream_bytes(
    client: &impl GenericClient,
    instance: InstanceRef,
) -> Result<u64> {
    let rows = query(
        client,
        "SELECT COALESCE(SUM(octet_length(data)), 0)::BIGINT FROM stream_chunks WHERE iid = $1",
        &[&instance.0],
    )
    .await?;
    let n: i64 = rows
        .first()
        .map_or(Ok(0), |r| r.try_get(0).map_err(corrupt))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

fn step_record(r: &Row, configs: &mut cairn_store::packing::JournalConfigs) -> Result<StepRecord> {
    let kind: i64 = r.try_get(0).map_err(corrupt)?;
    let state: i64 = r.try_get(4).map_err(corrupt)?;
    let config = configs.read(r.try_get(5).map_err(corrupt)?)?;
    let int = |i: usize| -> Result<u32> {
        let v: i64 = r.try_get(i).map_err(corrupt)?;
        u32::try_from(v).map_err(corrupt)
    };
    Ok(StepRecord {
        key: StepKey {
            kind: StepKind::from_code(kind)
                .ok_or_else(|| corrupt(format!("unknown step kind {kind}")))?,
            name: r.try_get(1).map_err(corrupt)?,
            count: int(2)?,
        },
        seq: int(3)?,
        state: StepState::from_code(state)
            .ok_or_else(|| corrupt(format!("unknown step state {state}")))?,
        config,
        attempts: int(6)?,
        in_flight: r.try_get(7).map_err(corrupt)?,
        wake_at: ts(r.try_get(8).map_err(corrupt)?),
        output: r.try_get(9).map_err(corrupt)?,
        error: error_info(
            r.try_get(10).map_err(corrupt)?,
            r.try_get(11).map_err(corrupt)?,
        ),
        started_at: Timestamp::from_millis(r.try_get(12).map_err(corrupt)?),
        ended_at: ts(r.try_get(13).map_err(corrupt)?),
        has_rollback: r.try_get(14).map_err(corrupt)?,
    })
}

/// The earliest moment one of the workflows has an instance to claim: a due `ready_at`, or
/// a lease that runs out (its owner may be gone). One seek per workflow in
/// `instances_next_ready`; leases are live work.
pub(crate) const NEXT_READY_SQL: &str =
    "SELECT LEAST((SELECT MIN(ready_at) FROM instances WHERE workflow = $1 AND ready_at IS NOT NULL),
                  (SELECT MIN(lease_until) FROM instances
                   WHERE lease_owner IS NOT NULL AND workflow = $1 AND status IN (0, 1, 6, 7)))";

pub(crate) async fn next_ready(
    client: &impl GenericClient,
    workflows: &[String],
) -> Result<Option<Timestamp>> {
    let st = client
        .prepare_cached(NEXT_READY_SQL)
        .await
        .map_err(map_pg)?;
    let mut next: Option<i64> = None;
    for w in workflows {
        let at: Option<i64> = client.query_one(&st, &[w]).await.map_err(map_pg)?.get(0);
        next = match (next, at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok(ts(next))
}

/// The timers of a workflow at a time (see the SQLite store's `TIMERS_SQL`).
pub(crate) const TIMERS_SQL: &str = "SELECT
    (SELECT count(*) FROM instances WHERE workflow = $1 AND ready_at IS NOT NULL AND ready_at <= $2)
  + (SELECT count(*) FROM instances WHERE lease_owner IS NOT NULL AND lease_until < $2 AND workflow = $1
         AND status IN (0, 1, 7) AND (ready_at IS NULL OR ready_at > $2)),
    (SELECT count(*) FROM instances WHERE workflow = $1 AND ready_at IS NOT NULL AND ready_at > $2)";

pub(crate) async fn timers(
    client: &impl GenericClient,
    workflow: &str,
    now: Timestamp,
) -> Result<Timers> {
    let rows = query(client, TIMERS_SQL, &[&workflow, &now.as_millis()]).await?;
    let count = |i: usize| -> Result<u64> {
        let n: i64 = rows
            .first()
            .map_or(Ok(0), |r| r.try_get(i))
            .map_err(corrupt)?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    Ok(Timers {
        due: count(0)?,
        pending: count(1)?,
    })
}

/// Held children and parents aside (see `ops::DUE_PURGES_SQL`).
pub(crate) const NEXT_PURGE_SQL: &str = concat!(
    "SELECT purge_at FROM instances i WHERE purge_at IS NOT NULL AND NOT ",
    crate::ops::awaited_by_its_parent!(),
    " AND NOT ",
    crate::ops::parent_of_an_unfinished_child!(),
    " ORDER BY purge_at LIMIT 1"
);

pub(crate) async fn next_purge(client: &impl GenericClient) -> Result<Option<Timestamp>> {
    let rows = query(client, NEXT_PURGE_SQL, &[]).await?;
    Ok(ts(rows.first().and_then(|r| r.get(0))))
}

/// Schedules are written outside the writer's batches: they touch no instance and no log.
pub(crate) async fn create_schedule(
    client: &impl GenericClient,
    s: &StoredSchedule,
) -> Result<bool> {
    let st = client
        .prepare_cached(
            "INSERT INTO schedules (name, definition, paused, resumed_at, updated_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (name) DO UPDATE SET definition = EXCLUDED.definition,
                 paused = EXCLUDED.paused, resumed_at = EXCLUDED.resumed_at,
                 updated_at = EXCLUDED.updated_at, generation = schedules.generation + 1,
                 last_tick = NULL, last_run = NULL, deleted = FALSE, legacy = FALSE
             WHERE schedules.deleted",
        )
        .await
        .map_err(map_pg)?;
    let written = client
        .execute(
            &st,
            &[
                &s.name,
                &s.definition,
                &s.paused,
                &s.resumed_at.map(Timestamp::as_millis),
                &s.updated_at.as_millis(),
            ],
        )
        .await
        .map_err(map_pg)?;
    Ok(written == 1)
}

pub(crate) async fn set_schedule_state(
    client: &impl GenericClient,
    name: &str,
    state: &ScheduleState,
) -> Result<bool> {
    // As in the SQLite store: a new row infers its last tick once (`legacy`), one brought
    // back from deleted is a new schedule.
    let sql = if state.declared && state.only_if_not_live {
        "INSERT INTO schedules (name, definition, paused, resumed_at, updated_at, legacy)
         VALUES ($1, NULL, $2, $3, $4, TRUE) ON CONFLICT (name) DO UPDATE SET
             paused = EXCLUDED.paused, resumed_at = EXCLUDED.resumed_at,
             updated_at = EXCLUDED.updated_at, definition = NULL,
             generation = schedules.generation + 1, last_tick = NULL, last_run = NULL,
             deleted = FALSE, legacy = FALSE
         WHERE schedules.deleted"
    } else if state.declared {
        "INSERT INTO schedules (name, definition, paused, resumed_at, updated_at)
         VALUES ($1, NULL, $2, $3, $4) ON CONFLICT (name) DO UPDATE SET
             paused = EXCLUDED.paused,
             resumed_at = COALESCE(EXCLUDED.resumed_at, schedules.resumed_at),
             updated_at = EXCLUDED.updated_at, definition = NULL,
             generation = schedules.generation + CASE WHEN schedules.deleted THEN 1 ELSE 0 END,
             last_tick = CASE WHEN schedules.deleted THEN NULL ELSE schedules.last_tick END,
             last_run = CASE WHEN schedules.deleted THEN NULL ELSE schedules.last_run END,
             deleted = FALSE"
    } else {
        "UPDATE schedules SET paused = $2, resumed_at = COALESCE($3, resumed_at), updated_at = $4
         WHERE name = $1 AND definition IS NOT NULL AND NOT deleted"
    };
    let st = client.prepare_cached(sql).await.map_err(map_pg)?;
    let written = client
        .execute(
            &st,
            &[
                &name,
                &state.paused,
                &state.resumed_at.map(Timestamp::as_millis),
                &state.at.as_millis(),
            ],
        )
        .await
        .map_err(map_pg)?;
    Ok(written == 1)
}

pub(crate) async fn schedules(client: &impl GenericClient) -> Result<Vec<StoredSchedule>> {
    let rows = query(
        client,
        "SELECT name, definition, paused, resumed_at, updated_at, generation, last_tick,
             last_run, legacy
         FROM schedules WHERE NOT deleted ORDER BY name",
        &[],
    )
    .await?;
    rows.iter()
        .map(|r| {
            Ok(StoredSchedule {
                name: r.try_get(0).map_err(corrupt)?,
                definition: r.try_get(1).map_err(corrupt)?,
                paused: r.try_get(2).map_err(corrupt)?,
                resumed_at: ts(r.try_get(3).map_err(corrupt)?),
                updated_at: Timestamp::from_millis(r.try_get(4).map_err(corrupt)?),
                generation: u64::try_from(r.try_get::<_, i64>(5).map_err(corrupt)?)
                    .map_err(corrupt)?,
                last_tick: ts(r.try_get(6).map_err(corrupt)?),
                last_run: r.try_get(7).map_err(corrupt)?,
                legacy: r.try_get(8).map_err(corrupt)?,
            })
        })
        .collect()
}

pub(crate) async fn delete_schedule(
    client: &impl GenericClient,
    name: &str,
    declared: bool,
) -> Result<bool> {
    let st = client
        .prepare_cached(
            "UPDATE schedules SET deleted = TRUE, definition = NULL
             WHERE name = $1 AND NOT deleted AND (definition IS NOT NULL OR $2)",
        )
        .await
        .map_err(map_pg)?;
    Ok(client
        .execute(&st, &[&name, &declared])
        .await
        .map_err(map_pg)?
        == 1)
}

/// See `Store::register_versions`. Written outside the writer's batches: no instance, no
/// log.
pub(crate) async fn register_versions(
    client: &impl GenericClient,
    versions: &[cairn_store::WorkflowVersion],
) -> Result<()> {
    let st = client
        .prepare_cached(
            "INSERT INTO workflow_versions (workflow, version, registered_at) VALUES ($1, $2, $3)
             ON CONFLICT (workflow, version) DO NOTHING",
        )
        .await
        .map_err(map_pg)?;
    for v in versions {
        client
            .execute(
                &st,
                &[
                    &v.workflow.as_str(),
                    &v.version,
                    &v.registered_at.as_millis(),
                ],
            )
            .await
            .map_err(map_pg)?;
    }
    Ok(())
}

/// See `Store::workflow_versions`.
pub(crate) async fn workflow_versions(
    client: &impl GenericClient,
) -> Result<Vec<cairn_store::WorkflowVersion>> {
    let rows = query(
        client,
        "SELECT workflow, version, registered_at FROM workflow_versions
         ORDER BY registered_at, workflow, version",
        &[],
    )
    .await?;
    rows.iter()
        .map(|r| {
            Ok(cairn_store::WorkflowVersion {
                workflow: WorkflowName::new(r.try_get::<_, String>(0).map_err(corrupt)?)
                    .map_err(corrupt)?,
                version: r.try_get(1).map_err(corrupt)?,
                registered_at: Timestamp::from_millis(r.try_get(2).map_err(corrupt)?),
            })
        })
        .collect()
}

/// See `Store::unfinished_versions`.
pub(crate) async fn unfinished_versions(
    client: &impl GenericClient,
    workflow: &str,
) -> Result<Vec<(Option<String>, u64)>> {
    let rows = query(
        client,
        "SELECT version, count(*) FROM instances
         WHERE workflow = $1 AND status IN (0, 1, 2, 6, 7)
         GROUP BY version ORDER BY version",
        &[&workflow],
    )
    .await?;
    rows.iter()
        .map(|r| {
            Ok((
                r.try_get(0).map_err(corrupt)?,
                u64::try_from(r.try_get::<_, i64>(1).map_err(corrupt)?).unwrap_or(0),
            ))
        })
        .collect()
}
