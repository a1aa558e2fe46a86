//! The raw storage bound, for the benchmark harness: the rows the engine writes for a no-op
//! step, written by a bare loop on the same SQLite settings, with nothing else in the way.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, params};

use crate::{Durability, OpenError, configure, schema};

/// What [`raw_step_writes`] measured.
#[derive(Debug, Clone, Copy)]
pub struct RawBound {
    /// Commits made.
    pub commits: usize,
    /// Step units written (each: a step-row upsert and one log row of two records, as the
    /// engine writes at a step's start and at its outcome).
    pub units: usize,
    /// Wall time.
    pub elapsed: Duration,
}

impl RawBound {
    /// Commits per second.
    pub fn commits_per_sec(&self) -> f64 {
        self.commits as f64 / self.elapsed.as_secs_f64()
    }

    /// No-op steps per second this bound allows: a step is two units.
    pub fn steps_per_sec(&self) -> f64 {
        self.units as f64 / 2.0 / self.elapsed.as_secs_f64()
    }
}

/// Writes `units` step units into a fresh database at `path`, `per_commit` units per
/// transaction: `per_commit = 1` is one commit per engine write, a large value is the
/// best case of group commit.
///
/// The steps go round-robin to `instances` instances (at least one), as a group commit
/// of the engine carries one write of each of many instances: with one instance every
/// row lands at the end of its table and index, with many they land in as many places
/// of the `steps` table and of the log's per-instance index, as the engine's do.
///
/// # Errors
/// When the database cannot be created or written.
pub fn raw_step_writes(
    path: &Path,
    durability: Durability,
    units: usize,
    per_commit: usize,
    instances: usize,
) -> Result<RawBound, OpenError> {
    let err =
        |e: rusqlite::Error| OpenError::other(format!("raw bound on {}: {e}", path.display()));
    // A fresh database every time: remove what an earlier measurement left.
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let _ = std::fs::remove_file(&file);
    }
    let mut conn = Connection::open(path).map_err(err)?;
    configure(&conn, &crate::Options::default().durability(durability)).map_err(err)?;
    schema::migrate(&mut conn).map_err(err)?;
    let instances = instances.max(1);
    let mut iids = Vec::with_capacity(instances);
    let tx = conn.transaction().map_err(err)?;
    for i in 0..instances {
        tx.execute(
            "INSERT INTO instances (workflow, id, status, params, created_at) VALUES ('raw', ?1, 1, '{}', 0)",
            [format!("raw-{i}")],
        )
        .map_err(err)?;
        iids.push(tx.last_insert_rowid());
    }
    tx.commit().map_err(err)?;
    conn.execute(
        "INSERT INTO configs (config) VALUES ('{\"retries\":{\"limit\":5}}')",
        [],
    )
    .map_err(err)?;
    let config = conn.last_insert_rowid();
    let per_commit = per_commit.max(1);
    let start = Instant::now();
    let mut commits = 0;
    let mut written = 0;
    while written < units {
        let tx = conn.transaction().map_err(err)?;
        for _ in 0..per_commit.min(units - written) {
            // A step is two units (its start and its outcome) of the same instance.
            let step = written / 2;
            let iid = iids[step % instances];
            let n = i64::try_from(step / instances).unwrap_or(i64::MAX);
            tx.prepare_cached(
                "INSERT OR REPLACE INTO steps (iid, kind, name, count, seq, state, config, attempts,
                     in_flight, wake_at, output, error_name, error_message, started_at, ended_at, has_rollback)
                 VALUES (?1, 0, 'step', ?2, ?2, 1, ?3, 1, 0, NULL, 'null', NULL, NULL, 0, 0, 0)",
            )
            .and_then(|mut st| st.execute(params![iid, n, config]))
            .map_err(err)?;
            // Two records of the step in one row, as the engine writes them.
            tx.prepare_cached(concat!(
                "INSERT INTO log (id, iid, at, kind, step_kind, step_name, step_count, meta, kind2, meta2)
                 VALUES (",
                crate::history::next_log_id!(),
                ", ?1, 0, 10, 0, 'step', ?2, '{\"attempt\":1}', 11, '{\"attempt\":1}')"
            ))
            .and_then(|mut st| st.execute(params![iid, n]))
            .map_err(err)?;
            written += 1;
        }
        tx.commit().map_err(err)?;
        commits += 1;
    }
    Ok(RawBound {
        commits,
        units,
        elapsed: start.elapsed(),
    })
}

/// Copies instances the engine wrote into `count` more of each, with their steps and log
/// rows (not buffered events), for the benchmark harness's `scale` workload: history as
/// the engine writes it, built in seconds instead of hours. `templates` are `(workflow,
/// instance id, copies)`; copies get ids `<template id>-<n>`. The database must not be in use.
///
/// # Errors
/// When the database cannot be opened or written, or a template does not exist.
pub fn replicate_instances(
    path: &Path,
    templates: &[(&str, &str, usize)],
) -> Result<(), OpenError> {
    let err =
        |e: rusqlite::Error| OpenError::other(format!("replicate in {}: {e}", path.display()));
    let mut conn = Connection::open(path).map_err(err)?;
    conn.pragma_update(None, "synchronous", "OFF")
        .map_err(err)?;
    for &(workflow, id, copies) in templates {
        let template: i64 = conn
            .query_row(
                "SELECT iid FROM instances WHERE workflow = ?1 AND id = ?2",
                params![workflow, id],
                |r| r.get(0),
            )
            .map_err(err)?;
        let chunk = 20_000;
        let mut done = 0;
        while done < copies {
            let upto = (done + chunk).min(copies);
            let tx = conn.transaction().map_err(err)?;
            let base: i64 = tx
                .query_row("SELECT COALESCE(MAX(iid), 0) FROM instances", [], |r| {
                    r.get(0)
                })
                .map_err(err)?;
            let numbers =
                "WITH RECURSIVE n(i) AS (SELECT ?2 UNION ALL SELECT i + 1 FROM n WHERE i < ?3)";
            tx.execute(
                &format!(
                    "{numbers} INSERT INTO instances (iid, workflow, id, status, params, created_at,
                         started_at, ended_at, output, error_name, error_message, ready_rank, ready_at,
                         lease_owner, lease_epoch, lease_until, paused_at, retain_success_ms,
                         retain_error_ms, purge_at, rollback_trigger, rollback_outcome)
                     SELECT ?4 + n.i - ?2 + 1, workflow, id || '-' || n.i, status, params, created_at,
                         started_at, ended_at, output, error_name, error_message, ready_rank, ready_at,
                         NULL, lease_epoch, NULL, paused_at, retain_success_ms, retain_error_ms,
                         purge_at, rollback_trigger, rollback_outcome
                     FROM instances, n WHERE iid = ?1 ORDER BY n.i"
                ),
                params![template, done as i64, upto as i64 - 1, base],
            )
            .map_err(err)?;
            tx.execute(
                &format!(
                    "{numbers} INSERT INTO steps SELECT ?4 + n.i - ?2 + 1, kind, name, count, seq, state,
                         config, attempts, in_flight, wake_at, output, error_name, error_message,
                         started_at, ended_at, has_rollback
                     FROM steps, n WHERE iid = ?1"
                ),
                params![template, done as i64, upto as i64 - 1, base],
            )
            .map_err(err)?;
            // Log rows take ids two apart (see `history`): numbered here, not by SQLite.
            let (last_id, rows): (i64, i64) = tx
                .query_row(
                    "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'log'), 0),
                         (SELECT COUNT(*) FROM log WHERE iid = ?1)",
                    [template],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(err)?;
            tx.execute(
                &format!(
                    "{numbers}, t AS (SELECT ROW_NUMBER() OVER (ORDER BY id) AS k, * FROM log WHERE iid = ?1)
                     INSERT INTO log (id, iid, at, kind, step_kind, step_name, step_count, meta,
                         config, kind2, meta2)
                     SELECT ?5 + 2 * ((n.i - ?2) * ?6 + t.k), ?4 + n.i - ?2 + 1, at, kind, step_kind,
                         step_name, step_count, meta, config, kind2, meta2
                     FROM t, n ORDER BY n.i, t.k"
                ),
                params![template, done as i64, upto as i64 - 1, base, last_id, rows],
            )
            .map_err(err)?;
            tx.commit().map_err(err)?;
            done = upto;
        }
    }
    conn.execute_batch("ANALYZE; PRAGMA wal_checkpoint(TRUNCATE);")
        .map_err(err)?;
    drop(conn);
    // Loaded without syncing: flush it now, or the engine's first checkpoint pays for
    // writing the whole load out (which the first measurement would then include).
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| OpenError::other(format!("sync {}: {e}", path.display())))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_raw_bound_spreads_its_steps_over_the_instances_it_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raw.db");
        let bound = raw_step_writes(&path, Durability::Normal, 24, 5, 3).unwrap();
        assert_eq!((bound.units, bound.commits), (24, 5));
        let conn = Connection::open(&path).unwrap();
        let per_instance = |sql: &str| -> Vec<(String, i64)> {
            let mut st = conn.prepare(sql).unwrap();
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };
        // 12 steps round-robin over 3 instances: 4 steps each, one row per step and two
        // log rows (its start and its outcome).
        let steps = "SELECT i.id, COUNT(*) FROM steps s JOIN instances i ON i.iid = s.iid
                     GROUP BY i.id ORDER BY i.id";
        let logs = "SELECT i.id, COUNT(*) FROM log l JOIN instances i ON i.iid = l.iid
                    GROUP BY i.id ORDER BY i.id";
        let each = |n| (0..3).map(|i| (format!("raw-{i}"), n)).collect::<Vec<_>>();
        assert_eq!(per_instance(steps), each(4));
        assert_eq!(per_instance(logs), each(8));
    }
}
