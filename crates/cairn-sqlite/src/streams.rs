//! Stream step outputs: chunks per attempt, dropped but for the attempt that succeeded.

use cairn_core::StepKey;
use cairn_store::{InstanceRef, Result};
use rusqlite::{Connection, OptionalExtension, params};

use crate::worker::map_sqlite;

pub(crate) fn put(
    conn: &Connection,
    instance: InstanceRef,
    step: &StepKey,
    attempt: u32,
    index: u32,
    data: &[u8],
) -> Result<()> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO stream_chunks (iid, name, count, attempt, idx, data)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut st| {
        st.execute(params![
            instance.0, step.name, step.count, attempt, index, data
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
    index: u32,
) -> Result<Option<Vec<u8>>> {
    conn.prepare_cached(
        "SELECT data FROM stream_chunks
         WHERE iid = ?1 AND name = ?2 AND count = ?3 AND attempt = ?4 AND idx = ?5",
    )
    .and_then(|mut st| {
        st.query_row(
            params![instance.0, step.name, step.count, attempt, index],
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
