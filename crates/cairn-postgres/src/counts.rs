//! Folding the count deltas (see the schema) into the counts, about once a second per
//! writer. One engine at a time folds (a transaction-level advisory lock, tried, never
//! waited for); each delta is folded once, since it is deleted in the same statement.

use std::time::{Duration, Instant};

use deadpool_postgres::Object;

/// How often a writer folds.
pub(crate) const EVERY: Duration = Duration::from_secs(1);

/// Folds the committed deltas into the counts; `Ok(false)` when another engine is at it.
pub(crate) async fn fold(conn: &mut Object) -> Result<bool, tokio_postgres::Error> {
    let tx = conn.transaction().await?;
    let st = tx
        .prepare_cached(
            "SELECT pg_try_advisory_xact_lock(hashtext('cairn_counts.' || current_schema()))",
        )
        .await?;
    let locked: bool = tx.query_one(&st, &[]).await?.get(0);
    if !locked {
        return Ok(false);
    }
    let st = tx
        .prepare_cached(
            "WITH moved AS (DELETE FROM instance_count_deltas RETURNING workflow, status, delta),
                  sums AS (SELECT workflow, status, SUM(delta)::bigint AS n FROM moved
                           GROUP BY workflow, status)
             INSERT INTO instance_counts (workflow, status, n) SELECT workflow, status, n FROM sums
             ON CONFLICT (workflow, status) DO UPDATE SET n = instance_counts.n + EXCLUDED.n",
        )
        .await?;
    tx.execute(&st, &[]).await?;
    tx.commit().await?;
    Ok(true)
}

/// When a writer last folded (or tried).
#[derive(Debug)]
pub(crate) struct Folding {
    last: Instant,
}

impl Default for Folding {
    fn default() -> Self {
        Folding {
            last: Instant::now(),
        }
    }
}

impl Folding {
    /// Whether it is time to fold again; if so, the clock restarts.
    pub(crate) fn due(&mut self) -> bool {
        if self.last.elapsed() < EVERY {
            return false;
        }
        self.last = Instant::now();
        true
    }
}
