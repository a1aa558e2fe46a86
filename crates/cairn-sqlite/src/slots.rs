//! Keyed concurrency (`cairn_store::Concurrency`): an instance with a key takes a slot of
//! it when claimed and gives it back when it ends, pauses or hibernates; one that finds no
//! slot is parked (out of the claim order) until one frees. All of it runs in the writer's
//! transaction, so a key's count of holders is exact.

use cairn_core::Timestamp;
use cairn_store::{InstanceRef, Result};
use rusqlite::{Connection, OptionalExtension, params};

use crate::map_sqlite;

/// An instance's key (none while it is terminated with rollback: a failed instance's own
/// rollback is its work like any other and needs a slot), whether it holds or waits for a
/// slot, and its workflow: a primary-key probe. Most instances have no key and
/// stop here. (Not a join with `ckeys`: SQLite compiled that statement again for every
/// instance id bound to it, 15 % of the writer thread's time in the throughput profile.)
pub(crate) const KEY_SQL: &str = "SELECT CASE WHEN rollback_trigger IS NULL
                      OR json_extract(rollback_trigger, '$.terminate') IS NOT 1 THEN ckey END,
                 slot, parked, workflow, ckey
             FROM instances WHERE iid = ?1";

/// A key's limits, holders and rate window: a primary-key probe.
pub(crate) const LIMITS_SQL: &str =
    "SELECT slot_limit, holders, rate_n, rate_ms, window_start, window_count, hold_waiting
             FROM ckeys WHERE workflow = ?1 AND ckey = ?2";

/// The best waiting instances of a key (priority, then age) made claimable: a range of
/// `instances_parked`.
pub(crate) const WAKE_SQL: &str =
    "UPDATE instances SET parked = 0, ready_at = created_at WHERE iid IN (
             SELECT iid FROM instances
             WHERE workflow = ?1 AND ckey = ?2 AND parked = 1 AND lease_owner IS NULL
             ORDER BY priority DESC, iid LIMIT ?3)";

/// An instance's place in its key's line: a range of `instances_parked`.
pub(crate) const POSITION_SQL: &str = "SELECT (SELECT COUNT(*) FROM instances o
                     WHERE o.workflow = i.workflow AND o.ckey = i.ckey AND o.parked = 1
                       AND (o.priority > i.priority OR (o.priority = i.priority AND o.iid <= i.iid)))
             FROM instances i WHERE i.iid = ?1 AND i.parked = 1";

/// The gauge's keys with the most waiting instances: a range of `instances_parked` grouped
/// by key and sorted by count, so its cost grows with the instances waiting (not with
/// history); it runs at a gauge refresh, not on the hot path, and is not in `plans.rs`.
pub(crate) const WAITING_SQL: &str =
    "SELECT ckey, COUNT(*) AS n FROM instances WHERE workflow = ?1 AND parked = 1
             GROUP BY ckey ORDER BY n DESC, ckey LIMIT ?2";

/// What a claim may do with a candidate.
pub(crate) enum Take {
    /// Claim it (it has no key, holds a slot already, or just took one).
    Go,
    /// No slot free: it waits, parked.
    Parked,
    /// The key's rate is spent: claimable again when its window ends.
    Later,
}

/// Takes a slot of `iid`'s key if it needs one and one is free. An instance being
/// terminated with rollback needs none: its compensation does not wait for a slot. (One
/// rolling back because it failed does: it may have let its slot go, hibernating while a
/// compensation waits to be retried, and another instance taken it.)
pub(crate) fn take(conn: &Connection, iid: i64, now: Timestamp) -> Result<Take> {
    let Some(key) = key_of(conn, iid)? else {
        return Ok(Take::Go);
    };
    let (Some(live), false) = (&key.live, key.slot) else {
        return Ok(Take::Go);
    };
    let Some(Limits {
        limit,
        holders,
        rate_n,
        rate_ms,
        start,
        count,
        ..
    }) = limits(conn, &key.workflow, live)?
    else {
        return Ok(Take::Go);
    };
    let (workflow, key) = (key.workflow, live.clone());
    if holders >= limit {
        conn.prepare_cached("UPDATE instances SET parked = 1, ready_at = NULL WHERE iid = ?1")
            .and_then(|mut st| st.execute([iid]))
            .map_err(map_sqlite)?;
        return Ok(Take::Parked);
    }
    let now = now.as_millis();
    let (start, count) = match (rate_n, rate_ms) {
        (Some(n), Some(per)) => {
            let (start, count) = match start {
                Some(s) if now < s.saturating_add(per) => (s, count.unwrap_or(0)),
                _ => (now, 0),
            };
            if count >= n {
                let at = start.saturating_add(per);
                conn.prepare_cached("UPDATE instances SET ready_at = ?2 WHERE iid = ?1")
                    .and_then(|mut st| st.execute(params![iid, at]))
                    .map_err(map_sqlite)?;
                return Ok(Take::Later);
            }
            (Some(start), count + 1)
        }
        _ => (start, 0),
    };
    conn.prepare_cached(
        "UPDATE ckeys SET holders = holders + 1, window_start = ?3, window_count = ?4
         WHERE workflow = ?1 AND ckey = ?2",
    )
    .and_then(|mut st| st.execute(params![workflow, key, start, count]))
    .map_err(map_sqlite)?;
    conn.prepare_cached("UPDATE instances SET slot = 1, parked = 0 WHERE iid = ?1")
        .and_then(|mut st| st.execute([iid]))
        .map_err(map_sqlite)?;
    Ok(Take::Go)
}

/// `instance` ends, pauses or restarts: it gives its slot back (the best waiting instance
/// of the key becomes claimable) and stops waiting for one.
pub(crate) fn give_back(conn: &Connection, instance: InstanceRef) -> Result<()> {
    release(conn, instance, false)
}

/// `instance` hibernates: it gives its slot back unless its key lets waiting instances
/// keep theirs.
pub(crate) fn give_back_to_wait(conn: &Connection, instance: InstanceRef) -> Result<()> {
    release(conn, instance, true)
}

/// An instance's key and where it stands with it ([`KEY_SQL`]).
struct Key {
    /// Its key, unless it is terminated with rollback.
    live: Option<String>,
    /// Its key, whatever it is doing.
    any: Option<String>,
    slot: bool,
    parked: bool,
    workflow: String,
}

fn key_of(conn: &Connection, iid: i64) -> Result<Option<Key>> {
    conn.prepare_cached(KEY_SQL)
        .and_then(|mut st| {
            st.query_row([iid], |r| {
                Ok(Key {
                    live: r.get(0)?,
                    slot: r.get(1)?,
                    parked: r.get(2)?,
                    workflow: r.get(3)?,
                    any: r.get(4)?,
                })
            })
            .optional()
        })
        .map_err(map_sqlite)
}

/// A key's row of `ckeys` ([`LIMITS_SQL`]).
pub(crate) struct Limits {
    pub(crate) limit: i64,
    holders: i64,
    rate_n: Option<i64>,
    rate_ms: Option<i64>,
    start: Option<i64>,
    count: Option<i64>,
    hold_waiting: bool,
}

pub(crate) fn limits(conn: &Connection, workflow: &str, key: &str) -> Result<Option<Limits>> {
    conn.prepare_cached(LIMITS_SQL)
        .and_then(|mut st| {
            st.query_row(params![workflow, key], |r| {
                Ok(Limits {
                    limit: r.get(0)?,
                    holders: r.get(1)?,
                    rate_n: r.get(2)?,
                    rate_ms: r.get(3)?,
                    start: r.get(4)?,
                    count: r.get(5)?,
                    hold_waiting: r.get(6)?,
                })
            })
            .optional()
        })
        .map_err(map_sqlite)
}

fn release(conn: &Connection, instance: InstanceRef, waiting: bool) -> Result<()> {
    let Some(Key {
        any: Some(key),
        slot,
        parked,
        workflow,
        ..
    }) = key_of(conn, instance.0)?
    else {
        return Ok(());
    };
    let hold = limits(conn, &workflow, &key)?.map(|l| l.hold_waiting);
    if parked && !waiting {
        conn.prepare_cached("UPDATE instances SET parked = 0 WHERE iid = ?1")
            .and_then(|mut st| st.execute([instance.0]))
            .map_err(map_sqlite)?;
    }
    let frees = slot && !(waiting && hold.unwrap_or(false));
    if frees {
        conn.prepare_cached("UPDATE instances SET slot = 0 WHERE iid = ?1")
            .and_then(|mut st| st.execute([instance.0]))
            .map_err(map_sqlite)?;
        conn.prepare_cached(
            "UPDATE ckeys SET holders = MAX(holders - 1, 0) WHERE workflow = ?1 AND ckey = ?2",
        )
        .and_then(|mut st| st.execute(params![workflow, key]))
        .map_err(map_sqlite)?;
    }
    if frees || !waiting {
        wake(conn, &workflow, &key)?;
    }
    Ok(())
}

/// Makes as many of the key's waiting instances claimable as it has free slots, best
/// first (priority, then age). One woken but gone before its claim (paused, terminated,
/// deleted) costs nothing: the next release wakes again, and one woken too many parks
/// again at its claim.
pub(crate) fn wake(conn: &Connection, workflow: &str, key: &str) -> Result<()> {
    let free: i64 = conn
        .prepare_cached(
            "SELECT MAX(slot_limit - holders, 0) FROM ckeys WHERE workflow = ?1 AND ckey = ?2",
        )
        .and_then(|mut st| {
            st.query_row(params![workflow, key], |r| r.get(0))
                .optional()
        })
        .map_err(map_sqlite)?
        .unwrap_or(0);
    if free == 0 {
        return Ok(());
    }
    conn.prepare_cached(WAKE_SQL)
        .and_then(|mut st| st.execute(params![workflow, key, free]))
        .map_err(map_sqlite)?;
    Ok(())
}

/// `instance`'s place among the instances waiting for a slot of its key (1 = next).
pub(crate) fn position(conn: &Connection, instance: InstanceRef) -> Result<Option<u64>> {
    let n: Option<i64> = conn
        .prepare_cached(POSITION_SQL)
        .and_then(|mut st| st.query_row([instance.0], |r| r.get(0)).optional())
        .map_err(map_sqlite)?;
    Ok(n.and_then(|n| u64::try_from(n).ok()))
}

/// The keys of `workflow` with the most instances waiting for a slot, and all that wait.
pub(crate) fn waiting(
    conn: &Connection,
    workflow: &str,
    limit: usize,
) -> Result<(Vec<(String, u64)>, u64)> {
    let top = conn
        .prepare_cached(WAITING_SQL)
        .and_then(|mut st| {
            st.query_map(
                params![workflow, i64::try_from(limit).unwrap_or(i64::MAX)],
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
            )?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(map_sqlite)?;
    let all: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM instances WHERE workflow = ?1 AND parked = 1")
        .and_then(|mut st| st.query_row([workflow], |r| r.get(0)))
        .map_err(map_sqlite)?;
    Ok((
        top.into_iter()
            .map(|(k, n)| (k, u64::try_from(n).unwrap_or(0)))
            .collect(),
        u64::try_from(all).unwrap_or(0),
    ))
}
