//! Stream step outputs: chunks per attempt, dropped but for the attempt that succeeded.

use cairn_core::StepKey;
use cairn_store::{InstanceRef, Result};
use rusqlite::{Connection, OptionalExtension, params};

use crate::map_sqlite;

/// Stores a chunk, only while the step runs that attempt (a late write of an attempt that
/// has ended is dropped).
pub(crate) fn put(
    conn: &Connection,
    instance: InstanceRef,
    step: &StepKey,
    attempt: u32,
    epoch: u64,
    index: u32,
    data: &[u8],
) -> Result<()> {
    let epoch = i64::try_from(epoch).unwrap_or(i64::MAX);
    conn.prepare_cached(
        "INSERT OR REPLACE INTO stream_chunks (iid, name, count, attempt, epoch, idx, data)
         SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7 WHERE EXISTS (
             SELECT 1 FROM steps WHERE iid = ?1 AND kind = 0 AND name = ?2 AND count = ?3
                 AND state = 0 AND in_flight = 1 AND attempts = ?4)",
    )
    .and_then(|mut st| {
        st.execute(params![
            instance.0, step.name, step.count, attempt, epoch, index, data
        ])
    })
    .map_err(map_sqlite)?;
    Ok(())
}

/// Drops the chunks of `step` but for those of attempt `keep`.
pub(crate) fn drop(
    conn: &Connection,
    instance: InstanceRef,
    step: &StepKey,
    keep: Option<u32>,
) -> Result<()> {
    conn.prepare_cached(
        "DELETE FROM stream_chunks WHERE iid = ?1 AND name = ?2 AND count = ?3
             AND attempt IS NOT ?4",
    )
    .and_then(|mut st| st.execute(params![instance.0, step.name, step.count, keep]))
    .map_err(map_sqlite)?;
    Ok(())
}

pub(crate) fn chunk(
    conn: &Connection,
    instance: InstanceRef,
    step: &StepKey,
    attempt: u32,
    epoch: u64,
    index: u32,
) -> Result<Option<Vec<u8>>> {
    let epoch = i64::try_from(epoch).unwrap_or(i64::MAX);
    conn.prepare_cached(
        "SELECT data FROM stream_chunks
         WHERE iid = ?1 AND name = ?2 AND count = ?3 AND attempt = ?4 AND epoch = ?5 AND idx = ?6",
    )
    .and_then(|mut st| {
        st.query_row(
            params![instance.0, step.name, step.count, attempt, epoch, index],
            |r| r.get(0),
        )
        .optional()
    })
    .map_err(map_sqlite)
}

pub(crate) fn bytes(conn: &Connection, instance: InstanceRef) -> Result<u64> {
    let n: i64 = conn
        .prepare_cached("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM stream_chunks WHERE iid = ?1")
        .and_then(|mut st| st.query_row([instance.0], |r| r.get(0)))
        .map_err(map_sqlite)?;
    Ok(u64::try_from(n).unwrap_or(0))
}
