//! Keyed concurrency (`cairn_store::Concurrency`), as the SQLite store has it: a slot of
//! the key taken at claim, given back at the end, a pause or a hibernation; an instance
//! that finds no slot is parked until one frees. A key's row (`ckeys`) is locked while its
//! holders change, so engines claiming together never exceed its limit; a claim takes the
//! key rows in key order, so two claims never wait on each other in a circle.

use cairn_core::Timestamp;
use cairn_store::{ChangeKind, InstanceRef};
use deadpool_postgres::Transaction;

use crate::batch::{Batch, R, exec, query_opt};

/// The best waiting instances of a key (priority, then age) made claimable: a range of
/// `instances_parked`.
pub(crate) const WAKE_SQL: &str = "UPDATE instances SET parked = FALSE, ready_at = created_at
     WHERE iid IN (
         SELECT iid FROM instances
         WHERE workflow = $1 AND ckey = $2 AND parked AND lease_owner IS NULL
         ORDER BY priority DESC, iid LIMIT $3)
     RETURNING iid";

/// An instance's place in its key's line: a range of `instances_parked`.
pub(crate) const POSITION_SQL: &str = "SELECT (SELECT COUNT(*) FROM instances o
         WHERE o.workflow = i.workflow AND o.ckey = i.ckey AND o.parked
           AND (o.priority > i.priority OR (o.priority = i.priority AND o.iid <= i.iid)))
     FROM instances i WHERE i.iid = $1 AND i.parked";

/// What a claim may do with a candidate.
pub(crate) enum Take {
    /// Claim it.
    Go,
    /// No slot (or the key's rate is spent): it waits.
    Wait,
}

/// The key a candidate would take a slot of, if it needs one (for the claim's lock order):
/// none while it is terminated with rollback (a failed instance's own rollback needs one).
pub(crate) async fn key_of(tx: &Transaction<'_>, iid: i64) -> R<Option<(String, String)>> {
    Ok(query_opt(
        tx,
        "SELECT workflow, ckey FROM instances
         WHERE iid = $1 AND ckey IS NOT NULL AND NOT slot
           AND (rollback_trigger IS NULL
                OR NOT COALESCE((rollback_trigger::jsonb ->> 'terminate')::boolean, false))",
        &[&iid],
    )
    .await?
    .map(|r| (r.get(0), r.get(1))))
}

/// Takes a slot of `key` for `iid` if one is free (see the SQLite store's `slots::take`).
pub(crate) async fn take(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    iid: i64,
    key: &(String, String),
    now: Timestamp,
) -> R<Take> {
    let Some(k) = query_opt(
        tx,
        "SELECT slot_limit, holders, rate_n, rate_ms, window_start, window_count FROM ckeys
         WHERE workflow = $1 AND ckey = $2 FOR UPDATE",
        &[&key.0, &key.1],
    )
    .await?
    else {
        return Ok(Take::Go);
    };
    let (limit, holders): (i64, i64) = (k.get(0), k.get(1));
    let (rate_n, rate_ms): (Option<i64>, Option<i64>) = (k.get(2), k.get(3));
    let (start, count): (Option<i64>, i64) = (k.get(4), k.get(5));
    if holders >= limit {
        exec(
            tx,
            b,
            "UPDATE instances SET parked = TRUE, ready_at = NULL WHERE iid = $1",
            &[&iid],
        )
        .await?;
        return Ok(Take::Wait);
    }
    let now = now.as_millis();
    let (start, count) = match (rate_n, rate_ms) {
        (Some(n), Some(per)) => {
            let (start, count) = match start {
                Some(s) if now < s.saturating_add(per) => (s, count),
                _ => (now, 0),
            };
            if count >= n {
                exec(
                    tx,
                    b,
                    "UPDATE instances SET ready_at = $2 WHERE iid = $1",
                    &[&iid, &start.saturating_add(per)],
                )
                .await?;
                return Ok(Take::Wait);
            }
            (Some(start), count + 1)
        }
        _ => (start, 0),
    };
    exec(
        tx,
        b,
        "UPDATE ckeys SET holders = holders + 1, window_start = $3, window_count = $4
         WHERE workflow = $1 AND ckey = $2",
        &[&key.0, &key.1, &start, &count],
    )
    .await?;
    exec(
        tx,
        b,
        "UPDATE instances SET slot = TRUE, parked = FALSE WHERE iid = $1",
        &[&iid],
    )
    .await?;
    Ok(Take::Go)
}

/// `instance` ends, pauses or restarts: it gives its slot back and stops waiting for one.
pub(crate) async fn give_back(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    instance: InstanceRef,
) -> R<()> {
    release(tx, b, instance, false).await
}

/// `instance` hibernates: it gives its slot back unless its key lets it keep it.
pub(crate) async fn give_back_to_wait(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    instance: InstanceRef,
) -> R<()> {
    release(tx, b, instance, true).await
}

async fn release(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    instance: InstanceRef,
    waiting: bool,
) -> R<()> {
    let Some(row) = query_opt(
        tx,
        "SELECT i.slot, i.parked, i.workflow, i.ckey, k.hold_waiting
         FROM instances i LEFT JOIN ckeys k ON k.workflow = i.workflow AND k.ckey = i.ckey
         WHERE i.iid = $1 AND i.ckey IS NOT NULL",
        &[&instance.0],
    )
    .await?
    else {
        return Ok(());
    };
    let (slot, parked, workflow, key): (bool, bool, String, String) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    let hold: Option<bool> = row.get(4);
    if parked && !waiting {
        exec(
            tx,
            b,
            "UPDATE instances SET parked = FALSE WHERE iid = $1",
            &[&instance.0],
        )
        .await?;
    }
    let frees = slot && !(waiting && hold.unwrap_or(false));
    if !frees && waiting {
        return Ok(());
    }
    // The key's row first: holders and the choice of the next instances change together.
    let Some((limit, mut holders)) = locked_key(tx, &workflow, &key).await? else {
        return Ok(());
    };
    if frees {
        exec(
            tx,
            b,
            "UPDATE instances SET slot = FALSE WHERE iid = $1",
            &[&instance.0],
        )
        .await?;
        exec(
            tx,
            b,
            "UPDATE ckeys SET holders = GREATEST(holders - 1, 0) WHERE workflow = $1 AND ckey = $2",
            &[&workflow, &key],
        )
        .await?;
        holders = (holders - 1).max(0);
    }
    wake_free(tx, b, &workflow, &key, (limit - holders).max(0)).await
}

/// Makes as many of the key's waiting instances claimable as it has free slots (its limit
/// was raised).
pub(crate) async fn wake(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    workflow: &str,
    key: &str,
) -> R<()> {
    let Some((limit, holders)) = locked_key(tx, workflow, key).await? else {
        return Ok(());
    };
    wake_free(tx, b, workflow, key, (limit - holders).max(0)).await
}

/// A key's limit and holders, its row locked until the transaction ends.
async fn locked_key(tx: &Transaction<'_>, workflow: &str, key: &str) -> R<Option<(i64, i64)>> {
    Ok(query_opt(
        tx,
        "SELECT slot_limit, holders FROM ckeys WHERE workflow = $1 AND ckey = $2 FOR UPDATE",
        &[&workflow, &key],
    )
    .await?
    .map(|k| (k.get(0), k.get(1))))
}

/// As many of the key's waiting instances as `free` become claimable, best first. Not
/// `SKIP LOCKED`: a waiting instance whose row another transaction holds (an event sent to
/// it) is waited for, not passed over and left waiting.
async fn wake_free(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    workflow: &str,
    key: &str,
    free: i64,
) -> R<()> {
    if free > 0 {
        let woken = crate::batch::query(tx, WAKE_SQL, &[&workflow, &key, &free]).await?;
        for row in &woken {
            b.wrote = true;
            b.changed(InstanceRef(row.get(0)), ChangeKind::Written);
            b.claimable = true;
        }
    }
    Ok(())
}

/// `instance`'s place among the instances waiting for a slot of its key (1 = next).
pub(crate) async fn position(
    client: &impl deadpool_postgres::GenericClient,
    instance: InstanceRef,
) -> cairn_store::Result<Option<u64>> {
    let st = client
        .prepare_cached(POSITION_SQL)
        .await
        .map_err(crate::db::map_pg)?;
    let row = client
        .query_opt(&st, &[&instance.0])
        .await
        .map_err(crate::db::map_pg)?;
    Ok(row.and_then(|r| u64::try_from(r.get::<_, i64>(0)).ok()))
}

/// The keys of `workflow` with the most instances waiting for a slot, and all that wait.
pub(crate) async fn waiting(
    client: &impl deadpool_postgres::GenericClient,
    workflow: &str,
    limit: usize,
) -> cairn_store::Result<(Vec<(String, u64)>, u64)> {
    let st = client
        .prepare_cached(
            "SELECT ckey, COUNT(*) AS n FROM instances WHERE workflow = $1 AND parked
             GROUP BY ckey ORDER BY n DESC, ckey LIMIT $2",
        )
        .await
        .map_err(crate::db::map_pg)?;
    let rows = client
        .query(&st, &[&workflow, &i64::try_from(limit).unwrap_or(i64::MAX)])
        .await
        .map_err(crate::db::map_pg)?;
    let st = client
        .prepare_cached("SELECT COUNT(*) FROM instances WHERE workflow = $1 AND parked")
        .await
        .map_err(crate::db::map_pg)?;
    let all: i64 = client
        .query_one(&st, &[&workflow])
        .await
        .map_err(crate::db::map_pg)?
        .get(0);
    Ok((
        rows.iter()
            .map(|r| {
                (
                    r.get::<_, String>(0),
                    u64::try_from(r.get::<_, i64>(1)).unwrap_or(0),
                )
            })
            .collect(),
        u64::try_from(all).unwrap_or(0),
    ))
}
