//! The raw bound for the benchmark harness: the rows the engine writes for a step, written
//! by a bare loop on one connection, without an engine.

use std::time::{Duration, Instant};

use tokio_postgres::NoTls;

/// What [`raw_step_writes`] measured.
#[derive(Debug, Clone, Copy)]
pub struct RawBound {
    /// Transactions committed.
    pub commits: usize,
    /// Step units written (each: a journal-row upsert and one log row of two records, as the
    /// engine writes at a step's start and at its outcome, ids from the log clock).
    pub units: usize,
    /// Wall time.
    pub elapsed: Duration,
}

impl RawBound {
    /// Commits per second.
    pub fn commits_per_sec(&self) -> f64 {
        self.commits as f64 / self.elapsed.as_secs_f64()
    }

    /// Steps per second (two units per step).
    pub fn steps_per_sec(&self) -> f64 {
        self.units as f64 / 2.0 / self.elapsed.as_secs_f64()
    }
}

/// Writes `units` step units, `per_commit` to a transaction, into a fresh schema `schema`
/// (dropped first) of the database at `url`.
///
/// # Errors
/// When the server cannot be reached or a statement fails.
pub async fn raw_step_writes(
    url: &str,
    schema: &str,
    units: usize,
    per_commit: usize,
) -> Result<RawBound, crate::OpenError> {
    let err = |e: tokio_postgres::Error| crate::OpenError::new(crate::db::describe(&e));
    {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await.map_err(err)?;
        let task = tokio::spawn(connection);
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await
            .map_err(err)?;
        drop(client);
        let _ = task.await;
    }
    // The schema as the store creates it.
    let store = crate::PostgresStore::open(crate::Options::new(url).schema(schema)).await?;
    cairn_store::Store::close(&store).await.ok();
    let mut config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| crate::OpenError::new(format!("invalid URL: {e}")))?;
    config.options(format!("-c search_path=\"{schema}\""));
    let (mut client, connection) = config.connect(NoTls).await.map_err(err)?;
    let task = tokio::spawn(connection);
    client
        .batch_execute(
            "INSERT INTO instances (workflow, id, status, params, created_at, retain_success_ms, retain_error_ms)
             VALUES ('raw', 'raw', 1, '{}', 0, 0, 0);
             INSERT INTO configs (config) VALUES ('{\"retries\":{\"limit\":5}}');",
        )
        .await
        .map_err(err)?;
    let iid: i64 = client
        .query_one("SELECT iid FROM instances WHERE id = 'raw'", &[])
        .await
        .map_err(err)?
        .get(0);
    let config: i64 = client
        .query_one("SELECT id FROM configs", &[])
        .await
        .map_err(err)?
        .get(0);
    let per_commit = per_commit.max(1);
    let start = Instant::now();
    let (mut commits, mut written) = (0, 0);
    while written < units {
        let tx = client.transaction().await.map_err(err)?;
        let upsert = tx
            .prepare(
                "INSERT INTO steps (iid, kind, name, count, seq, state, config, attempts, in_flight,
                     wake_at, output, error_name, error_message, started_at, ended_at, has_rollback)
                 VALUES ($1, 0, 'step', $2, $2, 1, $3, 1, false, NULL, 'null', NULL, NULL, 0, 0, false)
                 ON CONFLICT (iid, kind, name, count) DO UPDATE SET state = EXCLUDED.state",
            )
            .await
            .map_err(err)?;
        let n = per_commit.min(units - written);
        let mut counts = Vec::with_capacity(n);
        for k in 0..n {
            let count = i64::try_from((written + k) / 2).unwrap_or(i64::MAX);
            tx.execute(&upsert, &[&iid, &count, &config])
                .await
                .map_err(err)?;
            counts.push(count);
        }
        // The log rows in one statement with ids from the clock, as the writer does.
        let rows = i64::try_from(n).unwrap_or(i64::MAX);
        tx.execute(
            "WITH c AS (UPDATE log_clock SET last = last + 2 * $1::bigint RETURNING last)
             INSERT INTO log (id, iid, at, kind, step_kind, step_name, step_count, meta, kind2, meta2)
             SELECT c.last - 2 * $1::bigint + 2 * u.n, $2, 0, 10, 0, 'step', u.count,
                 '{\"attempt\":1}', 11, '{\"attempt\":1}'
             FROM c, unnest($3::bigint[]) WITH ORDINALITY AS u(count, n)",
            &[&rows, &iid, &counts],
        )
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        commits += 1;
        written += n;
    }
    let elapsed = start.elapsed();
    drop(client);
    let _ = task.await;
    Ok(RawBound {
        commits,
        units,
        elapsed,
    })
}
