//! The writing operations, each run inside a transaction the writer owns (see `writer.rs`).
//! They mirror the SQLite store's `rows.rs` statement for statement; where PostgreSQL
//! needs more (row locks between engines, leases that expire), it says so.
//!
//! Every operation checks before it writes: an answer such as [`Error::LeaseLost`] leaves
//! nothing to undo, so the other operations of the batch go on. An error after a write (a
//! statement refused, corrupt data) aborts the batch, whose operations are then run again
//! one per transaction.

use std::time::Duration;

use cairn_core::{
    EventType, InstanceStatus, LogEntry, LogKind, StepKey, StepKind, StepRecord, StepState,
    Timestamp,
};
use cairn_store::{
    ChangeKind, Claimed, ControlOutcome, ControlRequest, Created, Error, InstanceRef, Lease,
    NewEvent, NewInstance, ParentLink, Sent, StatusChange, StoredEvent, Write,
};
use deadpool_postgres::Transaction;

use crate::db::{Failure, corrupt};
use crate::reads::{INSTANCE_COLUMNS, instance_at, to_json};

pub(crate) use crate::batch::{Batch, R, exec, query, query_opt};

fn status(code: i64) -> R<InstanceStatus> {
    InstanceStatus::from_code(code)
        .ok_or_else(|| corrupt(format!("unknown status code {code}")).into())
}

pub(crate) async fn create(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    batch: &[NewInstance],
) -> R<Vec<Created>> {
    let mut out = Vec::with_capacity(batch.len());
    for new in batch {
        let row = query_opt(
            tx,
            "INSERT INTO instances (workflow, id, status, params, created_at, ready_rank, ready_at,
                 retain_success_ms, retain_error_ms, parent_iid, parent, priority, ckey, version)
             VALUES ($1, $2, 0, $3, $4, 1, $4, $5, $6, $7, $8, $9, $10, $11)
             ON CONFLICT (workflow, id) DO NOTHING RETURNING iid",
            &[
                &new.workflow.as_str(),
                &new.id.as_str(),
                &new.params,
                &new.created_at.as_millis(),
                &retain_ms(new.retention.success),
                &retain_ms(new.retention.error),
                &new.parent.as_ref().map(|p| p.instance.0),
                &new.parent.as_ref().map(ParentLink::encode),
                &new.priority,
                &new.concurrency.as_ref().map(|c| c.key.as_str()),
                &new.version,
            ],
        )
        .await?;
        b.wrote = true;
        if let (Some(c), Some(_)) = (&new.concurrency, &row) {
            let before: Option<i64> = query_opt(
                tx,
                "SELECT slot_limit FROM ckeys WHERE workflow = $1 AND ckey = $2",
                &[&new.workflow.as_str(), &c.key],
            )
            .await?
            .map(|r| r.get(0));
            // The latest limits written for a key are the key's.
            exec(
                tx,
                b,
                "INSERT INTO ckeys (workflow, ckey, slot_limit, hold_waiting, rate_n, rate_ms)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (workflow, ckey) DO UPDATE SET slot_limit = EXCLUDED.slot_limit,
                     hold_waiting = EXCLUDED.hold_waiting, rate_n = EXCLUDED.rate_n,
                     rate_ms = EXCLUDED.rate_ms",
                &[
                    &new.workflow.as_str(),
                    &c.key,
                    &i64::from(c.limit.max(1)),
                    &c.hold_while_waiting,
                    &c.rate.map(|(n, _)| i64::from(n)),
                    &c.rate.map(|(_, per)| retain_ms(per).max(1)),
                ],
            )
            .await?;
            if before.is_some_and(|limit| i64::from(c.limit.max(1)) > limit) {
                // A higher limit frees slots for the instances already waiting, oldest and
                // best first, not only for this one.
                crate::slots::wake(tx, b, new.workflow.as_str(), &c.key).await?;
            }
        }
        match row {
            None => out.push(Created::AlreadyExists),
            Some(row) => {
                let instance = InstanceRef(row.get(0));
                b.log.append(instance, &[&new.queued])?;
                b.changed(instance, ChangeKind::Written);
                b.claimable = true;
                out.push(Created::New(instance));
            }
        }
    }
    Ok(out)
}

/// The longest retention stored: 2^62 ms, "keep forever", so `ended_at + retain` never
/// overflows a `BIGINT`.
pub(crate) const MAX_RETAIN_MS: i64 = 1 << 62;

fn retain_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis())
        .unwrap_or(i64::MAX)
        .min(MAX_RETAIN_MS)
}

/// Locks the instance's row and checks the lease: the lock keeps a claim by another engine
/// (which moves the epoch) from landing between this check and the commit.
/// Returns the instance's status as it is before the caller's writes.
pub(crate) async fn check_lease(tx: &Transaction<'_>, lease: Lease) -> R<InstanceStatus> {
    let row = query_opt(
        tx,
        "SELECT lease_epoch, lease_owner IS NOT NULL, status FROM instances WHERE iid = $1 FOR UPDATE",
        &[&lease.instance.0],
    )
    .await?;
    match row {
        None => Err(Error::NotFound(lease.instance).into()),
        Some(row) => {
            let epoch: i64 = row.get(0);
            let leased: bool = row.get(1);
            if leased && u64::try_from(epoch).ok() == Some(lease.epoch) {
                status(row.get(2))
            } else {
                Err(Error::LeaseLost(lease.instance).into())
            }
        }
    }
}

pub(crate) async fn commit(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    lease: Lease,
    writes: &[Write],
) -> R<InstanceStatus> {
    // The status after the writes, without reading it again: the row is locked, so only
    // the writes below change it, and each that does returns it.
    let mut now = check_lease(tx, lease).await?;
    let instance = lease.instance;
    // A `STEP_START` may leave its configuration to its step's row in the same commit.
    let steps = cairn_store::packing::committed_steps(writes);
    let mut records: Vec<&LogEntry> = Vec::new();
    for write in writes {
        if let Write::Log(entry) = write {
            records.push(entry);
            continue;
        }
        b.log.append_with(instance, &records, &steps)?;
        records.clear();
        if let Some(status) = apply(tx, b, instance, write).await? {
            now = status;
        }
    }
    b.log.append_with(instance, &records, &steps)?;
    b.changed(instance, ChangeKind::Written);
    // A hibernation or a release makes the instance claimable (maybe by another engine).
    b.claimable |= writes.iter().any(|w| {
        matches!(
            w,
            Write::Hibernate { .. } | Write::Status(StatusChange { release: true, .. })
        )
    });
    Ok(now)
}

/// Applies one write; the instance's new status if it changed it.
async fn apply(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    instance: InstanceRef,
    write: &Write,
) -> R<Option<InstanceStatus>> {
    match write {
        Write::Step(step) => upsert_step(tx, b, instance, step).await.map(|()| None),
        Write::Cancel { step, records } => {
            let found = query_opt(
                tx,
                "SELECT state, output FROM steps WHERE iid = $1 AND kind = $2 AND name = $3
                     AND count = $4",
                &[
                    &instance.0,
                    &step.key.kind.code(),
                    &step.key.name,
                    &i64::from(step.key.count),
                ],
            )
            .await?
            .map(|row| (row.get::<_, i64>(0), row.get::<_, Option<String>>(1)));
            let running = match found {
                Some((state, _)) if state == StepState::Running.code() => true,
                // A wait whose take landed while the workflow was dropping it: the
                // workflow never saw the event, which goes back to the front of its queue.
                Some((state, Some(output)))
                    if state == StepState::Succeeded.code()
                        && step.key.kind == StepKind::WaitForEvent =>
                {
                    put_back_event(tx, b, instance, &step.key, &output).await?;
                    true
                }
                _ => false,
            };
            if running {
                upsert_step(tx, b, instance, step).await?;
                // A cancelled stream step's chunks are no output of anything. Chunks are
                // keyed by name and count only: a sleep or wait of the same name and count
                // as a `run` step has none, and must not drop that step's.
                if step.key.kind == StepKind::Run {
                    exec(
                        tx,
                        b,
                        "DELETE FROM stream_chunks WHERE iid = $1 AND name = $2 AND count = $3",
                        &[&instance.0, &step.key.name, &i64::from(step.key.count)],
                    )
                    .await?;
                }
                b.log
                    .append(instance, &records.iter().collect::<Vec<_>>())?;
            }
            Ok(None)
        }
        Write::Log(entry) => {
            b.log.append(instance, &[entry])?;
            Ok(None)
        }
        Write::Status(change) => change_status(tx, b, instance, change).await.map(Some),
        Write::Hibernate {
            wake_at,
            event_types,
            children,
        } => hibernate(tx, b, instance, *wake_at, event_types, children)
            .await
            .map(Some),
        Write::Create(new) => create(tx, b, std::slice::from_ref(&**new))
            .await
            .map(|_| None),
        Write::RollbackTrigger(trigger) => {
            exec(
                tx,
                b,
                "UPDATE instances SET rollback_trigger = $2 WHERE iid = $1",
                &[&instance.0, &to_json(trigger)?],
            )
            .await?;
            Ok(None)
        }
        Write::Chunk {
            step,
            attempt,
            epoch,
            index,
            data,
        } => {
            // Only while the step runs that attempt: a late write of an ended one is dropped.
            exec(
                tx,
                b,
                "INSERT INTO stream_chunks (iid, name, count, attempt, epoch, idx, data)
                 SELECT $1, $2, $3, $4, $5, $6, $7 WHERE EXISTS (
                     SELECT 1 FROM steps WHERE iid = $1 AND kind = 0 AND name = $2 AND count = $3
                         AND state = 0 AND in_flight AND attempts = $4)
                 ON CONFLICT (iid, name, count, attempt, epoch, idx) DO UPDATE SET data = EXCLUDED.data",
                &[
                    &instance.0,
                    &step.name,
                    &i64::from(step.count),
                    &i64::from(*attempt),
                    &i64::try_from(*epoch).unwrap_or(i64::MAX),
                    &i64::from(*index),
                    data,
                ],
            )
            .await?;
            Ok(None)
        }
        Write::DropChunks { step, keep } => {
            exec(
                tx,
                b,
                "DELETE FROM stream_chunks WHERE iid = $1 AND name = $2 AND count = $3
                     AND attempt IS DISTINCT FROM $4",
                &[
                    &instance.0,
                    &step.name,
                    &i64::from(step.count),
                    &keep.map(i64::from),
                ],
            )
            .await?;
            Ok(None)
        }
        Write::Pause { at, record } => {
            let paused = exec(
                tx,
                b,
                "UPDATE instances SET status = 2, paused_at = $2, lease_owner = NULL, lease_until = NULL,
                     ready_at = NULL
                 WHERE iid = $1 AND status = 6",
                &[&instance.0, &at.as_millis()],
            )
            .await?;
            if paused == 1 {
                b.log.append(instance, &[record])?;
                crate::slots::give_back(tx, b, instance).await?;
                return Ok(Some(InstanceStatus::Paused));
            }
            Ok(None)
        }
    }
}

async fn upsert_step(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    instance: InstanceRef,
    s: &StepRecord,
) -> R<()> {
    let config = cairn_store::packing::shared_config_text(&s.config)?;
    let config = b.configs.id(tx, &config).await?;
    exec(
        tx,
        b,
        "INSERT INTO steps (iid, kind, name, count, seq, state, config, attempts, in_flight, wake_at,
             output, error_name, error_message, started_at, ended_at, has_rollback)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
         ON CONFLICT (iid, kind, name, count) DO UPDATE SET seq = EXCLUDED.seq,
             state = EXCLUDED.state, config = EXCLUDED.config, attempts = EXCLUDED.attempts,
             in_flight = EXCLUDED.in_flight, wake_at = EXCLUDED.wake_at, output = EXCLUDED.output,
             error_name = EXCLUDED.error_name, error_message = EXCLUDED.error_message,
             started_at = EXCLUDED.started_at, ended_at = EXCLUDED.ended_at,
             has_rollback = EXCLUDED.has_rollback",
        &[
            &instance.0,
            &s.key.kind.code(),
            &s.key.name,
            &i64::from(s.key.count),
            &i64::from(s.seq),
            &s.state.code(),
            &config,
            &i64::from(s.attempts),
            &s.in_flight,
            &s.wake_at.map(Timestamp::as_millis),
            &s.output,
            &s.error.as_ref().map(|e| e.name.as_str()),
            &s.error.as_ref().map(|e| e.message.as_str()),
            &s.started_at.as_millis(),
            &s.ended_at.map(Timestamp::as_millis),
            &s.has_rollback,
        ],
    )
    .await?;
    Ok(())
}

async fn change_status(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    instance: InstanceRef,
    c: &StatusChange,
) -> R<InstanceStatus> {
    let outcome = c.rollback_outcome.as_ref().map(to_json).transpose()?;
    b.wrote = true;
    let rows = query(
        tx,
        "UPDATE instances SET
             status = CASE WHEN status = 6 AND $2::bigint IN (1, 7) THEN status ELSE $2::bigint END,
             started_at = COALESCE(started_at, $3),
             ended_at = COALESCE($4, ended_at),
             output = COALESCE($5, output),
             error_name = COALESCE($6, error_name),
             error_message = COALESCE($7, error_message),
             ready_at = $8,
             ready_rank = CASE WHEN $2::bigint = 0 THEN 1 ELSE 0 END,
             lease_owner = CASE WHEN $9 THEN NULL ELSE lease_owner END,
             lease_until = CASE WHEN $9 THEN NULL ELSE lease_until END,
             rollback_outcome = COALESCE($10, rollback_outcome),
             purge_at = CASE WHEN $2::bigint = 5 THEN COALESCE($4::bigint, ended_at) + retain_success_ms
                             WHEN $2::bigint IN (3, 4) THEN COALESCE($4::bigint, ended_at) + retain_error_ms
                             ELSE purge_at END
         WHERE iid = $1 RETURNING status, parent_iid IS NOT NULL, ckey IS NOT NULL",
        &[
            &instance.0,
            &c.status.code(),
            &c.started_at.map(Timestamp::as_millis),
            &c.ended_at.map(Timestamp::as_millis),
            &c.output,
            &c.error.as_ref().map(|e| e.name.as_str()),
            &c.error.as_ref().map(|e| e.message.as_str()),
            &c.ready_at.map(Timestamp::as_millis),
            &c.release,
            &outcome,
        ],
    )
    .await?;
    let row = rows
        .first()
        .ok_or_else(|| Failure::Store(Error::NotFound(instance)))?;
    // Only a child has a parent to wake, only a keyed instance a slot to give back: the
    // others (most ends) pay no statement for either.
    if c.status.is_terminal() {
        if row.get::<_, bool>(1) {
            wake_parent(tx, b, instance).await?;
        }
        if row.get::<_, bool>(2) {
            crate::slots::give_back(tx, b, instance).await?;
        }
    }
    status(row.get(0))
}

/// A child instance has ended (or is being deleted): its parent, if it hibernates, becomes
/// claimable at once, so the `invoke` step waiting for the child takes its outcome. The
/// parent's row is locked whatever its status (the update writes it even when it changes
/// nothing), so a hibernation of the parent either commits first (and is woken here) or
/// waits for this transaction (and then sees the child ended).
/// See `Store::wake_awaiting`: through `instances_next_ready (workflow, ready_at)`, the
/// awaiting ones at their wake time; claimable now, and other engines hear of it.
pub(crate) async fn wake_awaiting(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    workflow: &str,
    version: &str,
    limit: u64,
) -> R<u64> {
    let woken = tx
        .execute(
            &tx.prepare_cached(
                "UPDATE instances SET ready_at = created_at, ready_rank = 0
                 WHERE iid IN (SELECT iid FROM instances
                     WHERE workflow = $1 AND ready_at = $3 AND version = $2 AND status IN (0, 7)
                     ORDER BY iid LIMIT $4)",
            )
            .await?,
            &[
                &workflow,
                &version,
                &cairn_store::AWAITING_WORKER.as_millis(),
                &i64::try_from(limit).unwrap_or(i64::MAX),
            ],
        )
        .await?;
    if woken > 0 {
        b.wrote = true;
        b.claimable = true;
    }
    Ok(woken)
}

/// See `Store::fire_tick`. The schedule's row is locked, so engines firing the same tick
/// take turns, and the second sees the first's.
pub(crate) async fn fire_tick(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    t: &cairn_store::ScheduleTick,
) -> R<cairn_store::TickFired> {
    use cairn_store::TickFired;
    if t.declared {
        exec(
            tx,
            b,
            "INSERT INTO schedules (name, definition, paused, resumed_at, updated_at)
             VALUES ($1, NULL, FALSE, NULL, $2) ON CONFLICT (name) DO NOTHING",
            &[&t.schedule, &t.tick.as_millis()],
        )
        .await?;
    }
    let Some(row) = query_opt(
        tx,
        "SELECT generation, last_tick, last_run, deleted, paused FROM schedules WHERE name = $1 FOR UPDATE",
        &[&t.schedule],
    )
    .await?
    else {
        return Ok(TickFired::Stale);
    };
    let generation: i64 = row.get(0);
    let last_tick: Option<i64> = row.get(1);
    let last_run: Option<String> = row.get(2);
    let deleted: bool = row.get(3);
    let paused: bool = row.get(4);
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
        exec(
            tx,
            b,
            "UPDATE schedules SET last_tick = $2 WHERE name = $1",
            &[&t.schedule, &t.tick.as_millis()],
        )
        .await?;
        return Ok(TickFired::PassedOver);
    }
    let created = create(tx, b, std::slice::from_ref(&t.instance)).await?;
    let run = match created.first() {
        Some(Created::New(_)) => Some(t.instance.id.to_string()),
        _ => None,
    };
    exec(
        tx,
        b,
        "UPDATE schedules SET last_tick = $2, last_run = COALESCE($3, last_run) WHERE name = $1",
        &[&t.schedule, &t.tick.as_millis(), &run],
    )
    .await?;
    Ok(match created.first() {
        Some(Created::New(instance)) => TickFired::Fired(*instance),
        _ => TickFired::Taken,
    })
}

/// A child being restarted: its new link as [`ParentLink::restarted`] decides from its
/// parent's row, read under a share lock so that a claim of the parent moving its epoch on
/// is either seen or waits (adopted by the parent's new run, or detached when the parent
/// has ended); `None` when it stays. Only read: the restart writes it once nothing can
/// refuse it.
async fn restarted_link(
    tx: &Transaction<'_>,
    child: InstanceRef,
    adopt: Option<&cairn_store::Adopt>,
) -> R<Option<ParentLink>> {
    let stored = query_opt(
        tx,
        "SELECT parent_iid, parent FROM instances WHERE iid = $1",
        &[&child.0],
    )
    .await?;
    let (Some(parent_iid), Some(text)) = stored
        .map(|r| (r.get::<_, Option<i64>>(0), r.get::<_, Option<String>>(1)))
        .unwrap_or((None, None))
    else {
        return match adopt {
            Some(adopt) => Err(Failure::Store(Error::LeaseLost(adopt.parent.instance))),
            None => Ok(None),
        };
    };
    let link = ParentLink::decode(InstanceRef(parent_iid), &text)?;
    let parent = match query_opt(
        tx,
        "SELECT status, lease_epoch FROM instances WHERE iid = $1 FOR SHARE",
        &[&parent_iid],
    )
    .await?
    {
        Some(row) => Some((
            status(row.get(0))?,
            u64::try_from(row.get::<_, i64>(1)).map_err(corrupt)?,
        )),
        None => None,
    };
    Ok(link.restarted(parent, adopt)?)
}

pub(crate) async fn wake_parent(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    child: InstanceRef,
) -> R<()> {
    let rows = query(
        tx,
        "UPDATE instances p SET
             ready_at = CASE WHEN p.status = 7 THEN p.created_at ELSE p.ready_at END,
             ready_rank = CASE WHEN p.status = 7 THEN 0 ELSE p.ready_rank END
         FROM instances c WHERE c.iid = $1 AND p.iid = c.parent_iid
         RETURNING p.iid",
        &[&child.0],
    )
    .await?;
    if let Some(row) = rows.first() {
        b.wrote = true;
        b.changed(InstanceRef(row.get(0)), ChangeKind::Written);
        b.claimable = true;
    }
    Ok(())
}

async fn hibernate(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    instance: InstanceRef,
    wake_at: Timestamp,
    event_types: &[EventType],
    children: &[InstanceRef],
) -> R<InstanceStatus> {
    let types: Vec<&str> = event_types.iter().map(EventType::as_str).collect();
    // An event already waiting makes it claimable at once. `send_event` locks the
    // instance's row too, so a send either lands before this (and is seen) or after (and
    // wakes the hibernated instance).
    let mut buffered = query_opt(
        tx,
        "SELECT 1 FROM events WHERE iid = $1 AND type = ANY($2) LIMIT 1",
        &[&instance.0, &types],
    )
    .await?
    .is_some();
    if !children.is_empty() && !buffered {
        // So does a child that has ended (or is gone). A child's end locks this row too
        // (`wake_parent`), so it either lands before this (and is seen) or after (and wakes
        // the hibernated instance). The writer runs this commit after the batch's pipelined
        // ones, so a child's end in the same transaction is seen too.
        let refs: Vec<i64> = children.iter().map(|c| c.0).collect();
        let running = query(
            tx,
            "SELECT iid FROM instances WHERE iid = ANY($1) AND status NOT IN (3, 4, 5)",
            &[&refs],
        )
        .await?
        .len();
        buffered = running < refs.len();
    }
    // A pending pause wins: the instance is paused, not waiting, and not claimable. One
    // that never started (let go before it could: no worker of its version) stays queued.
    b.wrote = true;
    let rows = query(
        tx,
        "UPDATE instances SET
             status = CASE WHEN status = 6 THEN 2 WHEN status = 0 THEN 0 ELSE 7 END,
             ready_rank = 0,
             ready_at = CASE WHEN status = 6 THEN NULL WHEN $3 THEN created_at ELSE $2 END,
             lease_owner = NULL, lease_until = NULL
         WHERE iid = $1 RETURNING status, ckey IS NOT NULL",
        &[&instance.0, &wake_at.as_millis(), &buffered],
    )
    .await?;
    let row = rows
        .first()
        .ok_or_else(|| Failure::Store(Error::NotFound(instance)))?;
    let now = status(row.get(0))?;
    if row.get::<_, bool>(1) {
        if now == InstanceStatus::Paused {
            crate::slots::give_back(tx, b, instance).await?;
        } else {
            crate::slots::give_back_to_wait(tx, b, instance).await?;
        }
    }
    Ok(now)
}

/// Claim order within each query; candidates of the three are merged in it.
pub(crate) const CLAIM_READY_SQL: &str = "SELECT ready_at, iid FROM instances
     WHERE ready_rank = $1 AND ready_at IS NOT NULL AND ready_at <= $2 AND workflow = ANY($3)
     ORDER BY ready_at LIMIT $4 FOR UPDATE SKIP LOCKED";

/// Runnable instances whose owner let the lease run out (it died, stalled or lost its
/// network): claimable by anyone.
pub(crate) const CLAIM_EXPIRED_SQL: &str = "SELECT lease_until, iid FROM instances
     WHERE lease_owner IS NOT NULL AND lease_until < $1 AND status IN (0, 1, 7) AND workflow = ANY($2)
     ORDER BY lease_until LIMIT $3 FOR UPDATE SKIP LOCKED";

pub(crate) async fn claim(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    owner: &str,
    workflows: &[String],
    now: Timestamp,
    ttl: Duration,
    limit: usize,
) -> R<Vec<Claimed>> {
    if workflows.is_empty() || limit == 0 {
        return Ok(Vec::new());
    }
    recover_pauses(tx, b, now).await?;
    let now_ms = now.as_millis();
    let lim = i64::try_from(limit).unwrap_or(i64::MAX);
    // Rows another engine is claiming or writing are skipped, not waited for.
    let mut candidates: Vec<(i64, i64)> = Vec::new();
    for row in query(tx, CLAIM_READY_SQL, &[&0i64, &now_ms, &workflows, &lim]).await? {
        candidates.push((row.get(0), row.get(1)));
    }
    let mut expired = std::collections::HashSet::new();
    for row in query(tx, CLAIM_EXPIRED_SQL, &[&now_ms, &workflows, &lim]).await? {
        candidates.push((row.get(0), row.get(1)));
        expired.insert(row.get::<_, i64>(1));
    }
    candidates.sort_unstable();
    let mut seen = std::collections::HashSet::new();
    let mut iids: Vec<i64> = candidates
        .into_iter()
        .map(|(_, iid)| iid)
        .filter(|iid| seen.insert(*iid))
        .take(limit)
        .collect();
    if iids.len() < limit {
        for row in query(tx, CLAIM_READY_SQL, &[&1i64, &now_ms, &workflows, &lim]).await? {
            let iid: i64 = row.get(1);
            if iids.len() < limit && seen.insert(iid) {
                iids.push(iid);
            }
        }
    }
    // A candidate with a concurrency key needs a slot of it; one that finds none waits.
    // Keys are locked in key order, so claims of two engines never wait in a circle.
    let mut keyed = Vec::new();
    let mut go = Vec::with_capacity(iids.len());
    for iid in &iids {
        match crate::slots::key_of(tx, *iid).await? {
            Some(key) => keyed.push((key, *iid)),
            None => go.push(*iid),
        }
    }
    keyed.sort();
    for (key, iid) in keyed {
        if matches!(
            crate::slots::take(tx, b, iid, &key, now).await?,
            crate::slots::Take::Go
        ) {
            go.push(iid);
        }
    }
    let order: std::collections::HashMap<i64, usize> =
        iids.iter().enumerate().map(|(i, iid)| (*iid, i)).collect();
    go.sort_by_key(|iid| order.get(iid).copied());
    let iids = go;
    if iids.is_empty() {
        return Ok(Vec::new());
    }
    let until = now.saturating_add(ttl).as_millis();
    b.wrote = true;
    let rows = query(
        tx,
        &format!(
            "UPDATE instances SET lease_owner = $1, lease_epoch = lease_epoch + 1, lease_until = $2,
                 ready_at = NULL, parked = FALSE
             WHERE iid = ANY($3)
             RETURNING lease_epoch, {INSTANCE_COLUMNS}"
        ),
        &[&owner, &until, &iids],
    )
    .await?;
    let mut claimed = Vec::with_capacity(rows.len());
    for row in &rows {
        let epoch: i64 = row.get(0);
        let record = instance_at(row, 1)?;
        claimed.push(Claimed {
            lease: Lease {
                instance: record.instance,
                epoch: u64::try_from(epoch).map_err(corrupt)?,
            },
            taken_over: expired.contains(&record.instance.0),
            record,
        });
    }
    // In claim order, as chosen above.
    claimed.sort_by_key(|c| iids.iter().position(|i| *i == c.record.instance.0));
    Ok(claimed)
}

/// Pending pauses whose lease ran out: a range of `instances_pausing` (live work).
pub(crate) const RECOVER_PAUSES_SQL: &str =
    "SELECT iid FROM instances WHERE status = 6 AND lease_owner IS NOT NULL AND lease_until < $1
     FOR UPDATE SKIP LOCKED";

/// A pause whose lease holder vanished before it could complete it takes effect (SPEC
/// E26), paused from the instance's last record, as the SQLite store does at open.
async fn recover_pauses(tx: &Transaction<'_>, b: &mut Batch<'_>, now: Timestamp) -> R<()> {
    let rows = query(tx, RECOVER_PAUSES_SQL, &[&now.as_millis()]).await?;
    complete_pauses(tx, b, rows).await
}

/// See `Store::release_all`.
pub(crate) async fn release_all(tx: &Transaction<'_>, b: &mut Batch<'_>, owner: &str) -> R<()> {
    let rows = query(
        tx,
        "SELECT iid FROM instances WHERE status = 6 AND lease_owner = $1 FOR UPDATE",
        &[&owner],
    )
    .await?;
    complete_pauses(tx, b, rows).await?;
    b.claimable = true;
    exec(
        tx,
        b,
        "UPDATE instances SET lease_owner = NULL, lease_until = NULL,
             ready_at = CASE WHEN status IN (0, 1, 7) THEN created_at ELSE ready_at END,
             ready_rank = CASE WHEN status IN (0, 1, 7) THEN 0 ELSE ready_rank END
         WHERE lease_owner = $1",
        &[&owner],
    )
    .await?;
    Ok(())
}

/// Pauses pending on instances whose lifetime is gone take effect.
async fn complete_pauses(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    rows: Vec<tokio_postgres::Row>,
) -> R<()> {
    for row in rows {
        let iid: i64 = row.get(0);
        let paused = query(
            tx,
            "UPDATE instances SET status = 2, lease_owner = NULL, lease_until = NULL, ready_at = NULL,
                 paused_at = GREATEST(COALESCE(paused_at, 0),
                     COALESCE((SELECT MAX(at) FROM log WHERE log.iid = instances.iid), 0))
             WHERE iid = $1 RETURNING paused_at",
            &[&iid],
        )
        .await?;
        b.wrote = true;
        b.changed(InstanceRef(iid), ChangeKind::Controlled);
        let at: i64 = paused.first().map_or(0, |r| r.get(0));
        b.log.append(
            InstanceRef(iid),
            &[&LogEntry {
                kind: LogKind::WorkflowPaused,
                at: Timestamp::from_millis(at),
                step: None,
                meta: serde_json::json!({ "recovered": true }),
            }],
        )?;
        crate::slots::give_back(tx, b, InstanceRef(iid)).await?;
    }
    Ok(())
}

/// Whether instance row `i` is a child its parent's end did not reach: attached (not
/// detached), not being compensated, linked to its parent's run (a link from before runs
/// were recorded may be a child restarted on purpose after its parent ended), and its
/// parent's row ended or gone. The cascade from the parent's engine terminates such a
/// child; when that engine stopped right after the end, or its store calls failed, the
/// child's own engine finds it here, as its renewal leaves such a lease be: the lifetime
/// stops, its driver takes the instance back and ends it as `family::orphaned` says.
/// Without this, a child that never hibernates (one long step) ran to its end as if its
/// parent were still waiting for it.
macro_rules! orphaned_child {
    () => {
        "(i.parent_iid IS NOT NULL AND i.rollback_trigger IS NULL
         AND (i.parent::jsonb ->> 'detached')::boolean IS NOT TRUE
         AND (i.parent::jsonb -> 'run') IS NOT NULL AND (i.parent::jsonb -> 'run') <> 'null'::jsonb
         AND COALESCE((SELECT p.status FROM instances p WHERE p.iid = i.parent_iid), 5) IN (3, 4, 5))"
    };
}

pub(crate) async fn renew(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    owner: &str,
    leases: &[Lease],
    now: Timestamp,
    until: Timestamp,
) -> R<Vec<Lease>> {
    b.wrote = true;
    let iids: Vec<i64> = leases.iter().map(|l| l.instance.0).collect();
    let epochs = leases
        .iter()
        .map(|l| i64::try_from(l.epoch))
        .collect::<Result<Vec<i64>, _>>()
        .map_err(corrupt)?;
    let rows = query(
        tx,
        concat!(
            "UPDATE instances i SET lease_until = $1
             FROM unnest($4::bigint[], $5::bigint[]) AS l(iid, epoch)
             WHERE i.iid = l.iid AND i.lease_epoch = l.epoch
               AND i.lease_owner = $2 AND i.lease_until >= $3 AND NOT ",
            orphaned_child!(),
            " RETURNING i.iid, i.lease_epoch"
        ),
        &[&until.as_millis(), &owner, &now.as_millis(), &iids, &epochs],
    )
    .await?;
    let mut kept = Vec::with_capacity(rows.len());
    for r in rows {
        kept.push(Lease {
            instance: InstanceRef(r.get(0)),
            epoch: u64::try_from(r.get::<_, i64>(1)).map_err(corrupt)?,
        });
    }
    Ok(kept)
}

/// See `Store::reclaim`.
pub(crate) async fn reclaim(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    owner: &str,
    lease: Lease,
    now: Timestamp,
    ttl: Duration,
) -> R<Lease> {
    let epoch = i64::try_from(lease.epoch).map_err(corrupt)?;
    // Nothing is written unless the lease matched: a refusal leaves the batch be.
    let row = query_opt(
        tx,
        "UPDATE instances SET lease_epoch = lease_epoch + 1, lease_until = $4
         WHERE iid = $1 AND lease_epoch = $2 AND lease_owner = $3 RETURNING lease_epoch",
        &[
            &lease.instance.0,
            &epoch,
            &owner,
            &now.saturating_add(ttl).as_millis(),
        ],
    )
    .await?;
    match row {
        Some(row) => {
            b.wrote = true;
            Ok(Lease {
                instance: lease.instance,
                epoch: u64::try_from(row.get::<_, i64>(0)).map_err(corrupt)?,
            })
        }
        None => Err(Failure::Store(Error::LeaseLost(lease.instance))),
    }
}

pub(crate) async fn send_event(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    workflow: &str,
    id: &str,
    event: &NewEvent,
) -> R<Sent> {
    // The row lock orders this send against a hibernation of the same instance.
    let Some(row) = query_opt(
        tx,
        "SELECT iid, status FROM instances WHERE workflow = $1 AND id = $2 FOR UPDATE",
        &[&workflow, &id],
    )
    .await?
    else {
        return Ok(Sent::NotFound);
    };
    let iid: i64 = row.get(0);
    let st = status(row.get(1))?;
    if let Some(key) = &event.idempotency_key {
        let seen = query_opt(
            tx,
            "SELECT 1 FROM event_keys WHERE iid = $1 AND key = $2",
            &[&iid, key],
        )
        .await?
        .is_some();
        if seen {
            return Ok(Sent::Duplicate(InstanceRef(iid)));
        }
    }
    if st.is_terminal() {
        return Ok(Sent::Finished(st));
    }
    exec(
        tx,
        b,
        "INSERT INTO events (iid, type, payload, at) VALUES ($1, $2, $3, $4)",
        &[
            &iid,
            &event.event_type.as_str(),
            &event.payload,
            &event.at.as_millis(),
        ],
    )
    .await?;
    if let Some(key) = &event.idempotency_key {
        // `currval`: the id this transaction's insert just took.
        exec(
            tx,
            b,
            "INSERT INTO event_keys (iid, key, at, event)
             VALUES ($1, $2, $3, currval(pg_get_serial_sequence('events', 'id')))",
            &[&iid, key, &event.at.as_millis()],
        )
        .await?;
    }
    exec(
        tx,
        b,
        "UPDATE instances SET ready_at = created_at, ready_rank = 0 WHERE iid = $1 AND status = 7",
        &[&iid],
    )
    .await?;
    b.changed(InstanceRef(iid), ChangeKind::Written);
    b.claimable = true;
    Ok(Sent::Buffered(InstanceRef(iid)))
}

pub(crate) async fn take_event(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    lease: Lease,
    step: &StepKey,
    event_type: &EventType,
    at: Timestamp,
) -> R<Option<StoredEvent>> {
    check_lease(tx, lease).await?;
    // A wait that is no longer waiting takes nothing: the workflow dropped it (it lost a
    // `select!`) and its cancel landed while this take was on its way.
    let waiting = query_opt(
        tx,
        "SELECT state FROM steps WHERE iid = $1 AND kind = $2 AND name = $3 AND count = $4",
        &[
            &lease.instance.0,
            &step.kind.code(),
            &step.name,
            &i64::from(step.count),
        ],
    )
    .await?
    .map(|row| row.get::<_, i64>(0));
    if waiting.is_some_and(|state| state != StepState::Running.code()) {
        return Ok(None);
    }
    let Some(row) = query_opt(
        tx,
        "SELECT id, payload, at FROM events WHERE iid = $1 AND type = $2 ORDER BY id LIMIT 1",
        &[&lease.instance.0, &event_type.as_str()],
    )
    .await?
    else {
        return Ok(None);
    };
    let (event_id, payload, sent_at): (i64, String, i64) = (row.get(0), row.get(1), row.get(2));
    let (output, object) =
        cairn_store::taken::wait_output(event_type, &payload, Timestamp::from_millis(sent_at))?;
    exec(tx, b, "DELETE FROM events WHERE id = $1", &[&event_id]).await?;
    // Its key (if it was sent with one) now belongs to this wait: see the restart from a
    // step's use.
    exec(
        tx,
        b,
        "UPDATE event_keys SET taken_by = (SELECT seq FROM steps WHERE iid = $1 AND kind = $2
             AND name = $3 AND count = $4)
         WHERE iid = $1 AND event = $5 AND taken_by IS NULL",
        &[
            &lease.instance.0,
            &step.kind.code(),
            &step.name,
            &i64::from(step.count),
            &event_id,
        ],
    )
    .await?;
    let updated = exec(
        tx,
        b,
        "UPDATE steps SET state = $5, output = $6, ended_at = $7, in_flight = false, wake_at = NULL
         WHERE iid = $1 AND kind = $2 AND name = $3 AND count = $4",
        &[
            &lease.instance.0,
            &step.kind.code(),
            &step.name,
            &i64::from(step.count),
            &StepState::Succeeded.code(),
            &output,
            &at.as_millis(),
        ],
    )
    .await?;
    if updated != 1 {
        return Err(corrupt(format!("wait {} has no journal entry", step.target())).into());
    }
    b.log.append(
        lease.instance,
        &[&LogEntry {
            kind: LogKind::WaitComplete,
            at,
            step: Some(step.clone()),
            meta: object,
        }],
    )?;
    b.changed(lease.instance, ChangeKind::Written);
    Ok(Some(StoredEvent {
        event_type: event_type.clone(),
        payload,
        at: Timestamp::from_millis(sent_at),
    }))
}

/// Buffers again the event a wait's `output` holds (as `take_event` wrote it), ahead of
/// every event buffered now: it was the oldest of its type when it was taken. Event ids
/// are not shown anywhere: it takes the next value of their sequence, negated, which is
/// below every id there is (the sequence's are positive) and every id put back before it,
/// and unique while several engines put events back at once. The take's `WAIT_COMPLETE`
/// goes, also if it is still pending in this transaction: the log shows the wait cancelled
/// and the event received once, by the wait that takes it next.
async fn put_back_event(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    instance: InstanceRef,
    wait: &StepKey,
    output: &str,
) -> R<()> {
    let event = cairn_store::taken::taken_event(output)?;
    exec(
        tx,
        b,
        "INSERT INTO events (id, iid, type, payload, at)
         VALUES (-nextval(pg_get_serial_sequence('events', 'id')), $1, $2, $3, $4)",
        &[
            &instance.0,
            &event.event_type.as_str(),
            &event.payload,
            &event.at.as_millis(),
        ],
    )
    .await?;
    // Its key (if any) names the event again, taken by no wait.
    exec(
        tx,
        b,
        "UPDATE event_keys SET event = -currval(pg_get_serial_sequence('events', 'id')), taken_by = NULL
         WHERE iid = $1 AND taken_by = (SELECT seq FROM steps WHERE iid = $1 AND kind = $2
             AND name = $3 AND count = $4)",
        &[
            &instance.0,
            &wait.kind.code(),
            &wait.name,
            &i64::from(wait.count),
        ],
    )
    .await?;
    exec(
        tx,
        b,
        "DELETE FROM log WHERE iid = $1 AND kind = $2 AND step_kind = $3 AND step_name = $4
             AND step_count = $5",
        &[
            &instance.0,
            &LogKind::WaitComplete.code(),
            &wait.kind.code(),
            &wait.name,
            &i64::from(wait.count),
        ],
    )
    .await?;
    b.log.forget_record(instance, LogKind::WaitComplete, wait);
    Ok(())
}

fn log_now(
    b: &mut Batch<'_>,
    instance: InstanceRef,
    kind: LogKind,
    at: Timestamp,
    meta: serde_json::Value,
) -> R<()> {
    b.log.append(
        instance,
        &[&LogEntry {
            kind,
            at,
            step: None,
            meta,
        }],
    )?;
    Ok(())
}

/// Deletes everything an instance owns but its row.
async fn wipe(tx: &Transaction<'_>, b: &mut Batch<'_>, iid: i64) -> R<()> {
    for sql in [
        "DELETE FROM steps WHERE iid = $1",
        "DELETE FROM stream_chunks WHERE iid = $1",
        "DELETE FROM log WHERE iid = $1",
        "DELETE FROM events WHERE iid = $1",
        "DELETE FROM event_keys WHERE iid = $1",
    ] {
        exec(tx, b, sql, &[&iid]).await?;
    }
    b.log.forget(InstanceRef(iid));
    Ok(())
}

/// Applies a management request; see `ControlRequest`. Runs in a transaction of its own.
pub(crate) async fn control(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    workflow: &str,
    id: &str,
    request: &ControlRequest,
) -> R<ControlOutcome> {
    let Some(row) = query_opt(
        tx,
        "SELECT iid, status, lease_owner IS NOT NULL, paused_at, params, lease_epoch,
             rollback_trigger
         FROM instances WHERE workflow = $1 AND id = $2 FOR UPDATE",
        &[&workflow, &id],
    )
    .await?
    else {
        return Ok(ControlOutcome::NotFound);
    };
    let iid: i64 = row.get(0);
    let from = status(row.get(1))?;
    let leased: bool = row.get(2);
    let paused_at: Option<i64> = row.get(3);
    let params: String = row.get(4);
    let epoch = u64::try_from(row.get::<_, i64>(5)).map_err(corrupt)?;
    let trigger_before: Option<String> = row.get(6);
    let instance = InstanceRef(iid);
    let terminating = trigger_before
        .as_deref()
        .and_then(|t| serde_json::from_str::<cairn_core::RollbackTrigger>(t).ok())
        .is_some_and(|t| t.terminate);
    if matches!(
        request,
        ControlRequest::Terminate {
            rollback: Some(_),
            ..
        }
    ) && terminating
        && !from.is_terminal()
    {
        // Asked twice (a parent's end and its terminate both reach a child): the rollback
        // under way goes on, not fenced and started over.
        return Ok(ControlOutcome::NoOp(from));
    }
    // Other engines hear of it: a running lifetime there must stop, or read its status.
    let (kind, claimable) = match request {
        ControlRequest::Pause { .. } => (ChangeKind::Controlled, false),
        ControlRequest::Resume { .. } => (ChangeKind::Controlled, true),
        ControlRequest::Terminate { rollback, .. } => {
            (ChangeKind::Stopped { epoch }, rollback.is_some())
        }
        ControlRequest::Restart { .. } => (ChangeKind::Stopped { epoch }, true),
        ControlRequest::Delete => (ChangeKind::Stopped { epoch }, false),
    };
    let done = |to| {
        Ok(ControlOutcome::Done {
            instance,
            from,
            to,
            epoch,
        })
    };
    // In a block of its own, so its refusals (`return`) come back here: only a request
    // that took effect is told (a refused restart from a step that does not exist told
    // another engine to stop its run, fenced by nothing).
    let outcome: R<ControlOutcome> = async {
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
                    tx,
                    b,
                    "UPDATE instances SET status = 6, paused_at = $2 WHERE iid = $1",
                    &[&iid, &at.as_millis()],
                )
                .await?;
                return done(InstanceStatus::WaitingForPause);
            }
            exec(
                tx,
                b,
                "UPDATE instances SET status = 2, paused_at = $2, ready_at = NULL WHERE iid = $1",
                &[&iid, &at.as_millis()],
            )
            .await?;
            crate::slots::give_back(tx, b, instance).await?;
            log_now(
                b,
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
                    tx,
                    b,
                    "UPDATE instances SET status = 1, paused_at = NULL WHERE iid = $1",
                    &[&iid],
                )
                .await?;
                done(InstanceStatus::Running)
            }
            InstanceStatus::Paused => {
                // Time spent paused does not count against sleeps, back-offs and timeouts.
                let shift = at
                    .as_millis()
                    .saturating_sub(paused_at.unwrap_or(at.as_millis()))
                    .max(0);
                exec(
                    tx,
                    b,
                    "UPDATE steps SET wake_at = wake_at + $2 WHERE iid = $1 AND state = 0 AND wake_at IS NOT NULL",
                    &[&iid, &shift],
                )
                .await?;
                exec(
                    tx,
                    b,
                    "UPDATE instances SET status = 0, paused_at = NULL, ready_at = created_at, ready_rank = 0
                     WHERE iid = $1",
                    &[&iid],
                )
                .await?;
                log_now(
                    b,
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
            rollback: Some(trigger),
            ..
        } => {
            if from.is_terminal() {
                return Ok(ControlOutcome::Rejected(from));
            }
            // The current lifetime is fenced off; the next claim compensates, then terminates.
            exec(
                tx,
                b,
                "UPDATE instances SET status = 1, rollback_trigger = $2, paused_at = NULL,
                     lease_epoch = lease_epoch + 1, lease_owner = NULL, lease_until = NULL,
                     ready_at = created_at, ready_rank = 0, parked = FALSE
                 WHERE iid = $1",
                &[&iid, &to_json(trigger)?],
            )
            .await?;
            done(InstanceStatus::Running)
        }
        ControlRequest::Terminate { at, rollback: None } => {
            if from.is_terminal() {
                return Ok(ControlOutcome::Rejected(from));
            }
            exec(
                tx,
                b,
                "UPDATE instances SET status = 4, ended_at = $2, lease_epoch = lease_epoch + 1,
                     lease_owner = NULL, lease_until = NULL, ready_at = NULL, paused_at = NULL,
                     purge_at = $2 + retain_error_ms
                 WHERE iid = $1",
                &[&iid, &at.as_millis()],
            )
            .await?;
            wake_parent(tx, b, instance).await?;
            crate::slots::give_back(tx, b, instance).await?;
            log_now(
                b,
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
            let link = restarted_link(tx, instance, adopt.as_ref()).await?;
            match step {
                None => {
                    wipe(tx, b, iid).await?;
                    // As a create logs them: byte sequences as their size, cut when large
                    // (they are stored whole in the row).
                    let params_value = cairn_core::binary::log_view(&params);
                    log_now(
                        b,
                        instance,
                        LogKind::WorkflowQueued,
                        *at,
                        serde_json::json!({ "params": params_value, "trigger": { "source": "api" } }),
                    )?;
                    log_now(
                        b,
                        instance,
                        LogKind::WorkflowStart,
                        *at,
                        serde_json::json!({}),
                    )?;
                }
                Some(key) => {
                    let offset = i64::from(key.count.max(1) - 1);
                    let Some(row) = query_opt(
                        tx,
                        "SELECT seq FROM steps WHERE iid = $1 AND kind = $2 AND name = $3
                         ORDER BY seq LIMIT 1 OFFSET $4",
                        &[&iid, &key.kind.code(), &key.name, &offset],
                    )
                    .await?
                    else {
                        return Ok(ControlOutcome::StepNotFound);
                    };
                    let seq: i64 = row.get(0);
                    // The first step before it a rollback compensated (or tried to).
                    if let Some(row) = query_opt(
                        tx,
                        "SELECT f.name || '-' || f.count FROM steps r
                         JOIN steps f ON f.iid = r.iid AND f.kind = $3 AND f.name = r.name
                             AND f.count = r.count
                         WHERE r.iid = $1 AND r.kind = $4 AND f.seq < $2
                         ORDER BY f.seq LIMIT 1",
                        &[
                            &iid,
                            &seq,
                            &StepKind::Run.code(),
                            &StepKind::Rollback.code(),
                        ],
                    )
                    .await?
                    {
                        return Ok(ControlOutcome::Compensated(row.get(0)));
                    }
                    // Records of the wiped steps go with them, as do the terminal records.
                    // (This runs in a transaction of its own: no record of it is pending.)
                    // Cancelled ops go too, wherever they are (state 3): a race's loser, or
                    // an op the workflow dropped when it failed, whose new run may await it
                    // again; kept, it would never finish, and the run would hang on it.
                    exec(
                        tx,
                        b,
                        "DELETE FROM log WHERE iid = $1 AND (kind IN (2, 3, 4) OR EXISTS (
                             SELECT 1 FROM steps s WHERE s.iid = $1 AND (s.seq >= $2 OR s.state = 3) AND s.kind = log.step_kind
                                 AND s.name = log.step_name AND s.count = log.step_count))",
                        &[&iid, &seq],
                    )
                    .await?;
                    exec(
                        tx,
                        b,
                        "DELETE FROM stream_chunks WHERE iid = $1 AND EXISTS (
                             SELECT 1 FROM steps s WHERE s.iid = $1 AND (s.seq >= $2 OR s.state = 3) AND s.kind = 0
                                 AND s.name = stream_chunks.name AND s.count = stream_chunks.count)",
                        &[&iid, &seq],
                    )
                    .await?;
                    exec(
                        tx,
                        b,
                        "DELETE FROM steps WHERE iid = $1 AND (seq >= $2 OR state = 3)",
                        &[&iid, &seq],
                    )
                    .await?;
                    exec(tx, b, "DELETE FROM events WHERE iid = $1", &[&iid]).await?;
                    // The keys of the events cleared go (buffered, or taken by a wait wiped
                    // above); those of events a kept wait took stay: a retried send of one
                    // is still a duplicate, not a second delivery.
                    exec(
                        tx,
                        b,
                        "DELETE FROM event_keys WHERE iid = $1 AND (taken_by IS NULL OR taken_by >= $2)",
                        &[&iid, &seq],
                    )
                    .await?;
                }
            }
            if let Some(link) = link {
                exec(
                    tx,
                    b,
                    "UPDATE instances SET parent = $2 WHERE iid = $1",
                    &[&iid, &link.encode()],
                )
                .await?;
            }
            crate::slots::give_back(tx, b, instance).await?;
            exec(
                tx,
                b,
                "UPDATE instances SET status = 1, started_at = COALESCE(CASE WHEN $3 THEN NULL ELSE started_at END, $2),
                     ended_at = NULL, output = NULL, error_name = NULL, error_message = NULL, paused_at = NULL,
                     purge_at = NULL, rollback_trigger = NULL, rollback_outcome = NULL,
                     lease_epoch = lease_epoch + 1, lease_owner = NULL, lease_until = NULL,
                     ready_at = created_at, ready_rank = 0
                 WHERE iid = $1",
                &[&iid, &at.as_millis(), &step.is_none()],
            )
            .await?;
            done(InstanceStatus::Running)
        }
        ControlRequest::Delete => {
            let awaited = from.is_terminal()
                && query_opt(tx, AWAITED_BY_ITS_PARENT_SQL, &[&iid])
                    .await?
                    .is_some_and(|r| r.get::<_, bool>(0));
            if awaited {
                // Finished, but its parent has not taken its outcome yet: told "deleted",
                // the parent would lose the child's work. Its retention ends now instead,
                // and the purge deletes it once the parent has the outcome.
                exec(
                    tx,
                    b,
                    "UPDATE instances SET purge_at = 0 WHERE iid = $1",
                    &[&iid],
                )
                .await?;
                return done(from);
            }
            if !from.is_terminal() {
                wake_parent(tx, b, instance).await?;
            }
            crate::slots::give_back(tx, b, instance).await?;
            wipe(tx, b, iid).await?;
            exec(tx, b, "DELETE FROM instances WHERE iid = $1", &[&iid]).await?;
            done(from)
        }
        }
    }
    .await;
    let outcome = outcome?;
    if matches!(outcome, ControlOutcome::Done { .. }) {
        b.changed(instance, kind);
        b.claimable |= claimable;
    }
    Ok(outcome)
}

/// Whether instance row `i` is a child its parent has not taken the outcome of yet: the
/// parent has not ended and its `invoke` step that started the child still runs, and reads
/// the outcome from the child's row. Such a finished child is held from purges and
/// deletes. (A parent that ended with that step unfinished never reads it.)
macro_rules! awaited_by_its_parent {
    () => {
        "(parent_iid IS NOT NULL AND (
         SELECT s.state FROM steps s WHERE s.iid = i.parent_iid AND s.kind = 4
             AND s.name = (i.parent::jsonb -> 'step' ->> 'name')
             AND s.count = (i.parent::jsonb -> 'step' ->> 'count')::bigint
     ) IS NOT DISTINCT FROM 0
     AND (SELECT p.status FROM instances p WHERE p.iid = i.parent_iid) NOT IN (3, 4, 5))"
    };
}
pub(crate) use awaited_by_its_parent;

/// Whether instance row `i` is the parent of a child that has not finished and is not
/// detached: a child the cascade missed (the engine stopped after the parent's end, or the
/// store failed) reads how to end from its parent's row when it is next claimed
/// (`family::orphaned`). Such a finished parent is held from purges. A scalar subquery, so
/// that it is a probe of `instances_children` per row (as `EXISTS`, the planner may turn it
/// into a join over every child there is).
macro_rules! parent_of_an_unfinished_child {
    () => {
        "(SELECT 1 FROM instances c WHERE c.parent_iid = i.iid
             AND c.status NOT IN (3, 4, 5)
             AND (c.parent::jsonb ->> 'detached')::boolean IS NOT TRUE LIMIT 1) IS NOT NULL"
    };
}
pub(crate) use parent_of_an_unfinished_child;

/// Finished instances whose retention is over, skipping any another engine is purging,
/// held children and parents aside.
pub(crate) const DUE_PURGES_SQL: &str = concat!(
    "SELECT iid FROM instances i WHERE purge_at IS NOT NULL AND purge_at <= $1 AND NOT ",
    awaited_by_its_parent!(),
    " AND NOT ",
    parent_of_an_unfinished_child!(),
    " LIMIT $2 FOR UPDATE SKIP LOCKED"
);

/// Whether instance `$1` is a child its parent has not taken the outcome of yet.
const AWAITED_BY_ITS_PARENT_SQL: &str = concat!(
    "SELECT EXISTS (SELECT 1 FROM instances i WHERE i.iid = $1 AND ",
    awaited_by_its_parent!(),
    ")"
);

pub(crate) async fn purge(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    now: Timestamp,
    limit: usize,
) -> R<usize> {
    let lim = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = query(tx, DUE_PURGES_SQL, &[&now.as_millis(), &lim]).await?;
    for row in &rows {
        let iid: i64 = row.get(0);
        wipe(tx, b, iid).await?;
        exec(tx, b, "DELETE FROM instances WHERE iid = $1", &[&iid]).await?;
    }
    Ok(rows.len())
}
