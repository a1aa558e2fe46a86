//! The scheduler: claims runnable instances while there are free slots, runs each in a
//! driver task, purges finished instances whose retention is over, sleeps until the next
//! wake-up, and drains at shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use crate::engine::runtime::Runtime;

/// How often the scheduler looks for claimable instances, at least, where other engines
/// share the store.
const POLL: Duration = Duration::from_secs(1);

/// Claims runnable instances while there are free slots and runs each in a driver task.
pub(crate) async fn schedule(inner: Arc<Runtime>) {
    // Where leases expire, they are renewed until every lifetime has let go.
    let keeper = inner.env.leases.expire().then(|| {
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(crate::engine::leases::keep(Arc::clone(&inner), stopped));
        (stop, task)
    });
    let mut drivers = JoinSet::new();
    let mut shutdown = inner.shutdown.subscribe();
    let mut failures = 0u32;
    // Claim only when there may be something to claim: at start, when woken (new or woken
    // instances), when a timer is due, or when a slot frees up after a claim that filled
    // every slot. A lifetime that merely ended changes nothing claimable.
    let mut claim_now = true;
    loop {
        if *shutdown.borrow_and_update() {
            break;
        }
        while drivers.try_join_next().is_some() {}
        let free = inner.max_running.saturating_sub(drivers.len());
        let mut filled = false;
        if std::mem::take(&mut claim_now) && free > 0 && !inner.names.is_empty() {
            let now = inner.env.clock.now();
            match inner
                .env
                .store
                .claim(
                    &inner.owner,
                    &inner.names,
                    now,
                    inner.env.leases.ttl(),
                    free,
                )
                .await
            {
                Ok(claimed) => {
                    failures = 0;
                    filled = claimed.len() == free;
                    // A shared store's recovery summary: leases that ran out under another
                    // engine. (SQLite says so once, at open, where it takes the dead
                    // engine's leases over.)
                    let taken_over = claimed.iter().filter(|c| c.taken_over).count();
                    if taken_over > 0 {
                        tracing::info!(
                            instances = taken_over,
                            "took over instances whose engine stopped or lost its lease; their interrupted attempts are recorded and retried"
                        );
                    }
                    for c in claimed.iter().filter(|c| c.taken_over) {
                        crate::telemetry::taken_over(&c.record.workflow);
                    }
                    for c in claimed {
                        drivers.spawn(crate::engine::driver::drive(Arc::clone(&inner), c, now));
                    }
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(error = %e, "claiming instances failed; retrying");
                    let backoff = Duration::from_millis(100 << failures.min(8));
                    tokio::select! {
                        () = inner.env.clock.sleep(backoff) => {}
                        _ = shutdown.changed() => {}
                    }
                    claim_now = true;
                    continue;
                }
            }
        }
        if filled {
            // Maybe more are ready; go round once a slot frees up.
            tokio::select! {
                Some(_) = drivers.join_next() => {}
                _ = shutdown.changed() => {}
            }
            claim_now = true;
            continue;
        }
        // Purge finished instances whose retention is over.
        let store = &inner.env.store;
        let now = inner.env.clock.now();
        let next_purge = match store.next_purge().await {
            Ok(Some(at)) if at <= now => match store.purge(now, 1_000).await {
                Ok(purged) => {
                    tracing::debug!(purged, "purged finished instances");
                    inner.statuses_changed();
                    claim_now = true;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "purging finished instances failed");
                    Some(now.saturating_add(Duration::from_secs(60)))
                }
            },
            Ok(at) => at,
            Err(e) => {
                tracing::warn!(error = %e, "reading the next purge failed");
                Some(now.saturating_add(Duration::from_secs(60)))
            }
        };
        // Sleep until the earliest timer of a hibernating instance or purge, a wake-up, or
        // a free slot.
        let next_ready = match store.next_ready(&inner.names).await {
            Ok(at) => at,
            Err(e) => {
                tracing::warn!(error = %e, "reading the next wake-up failed");
                Some(now.saturating_add(Duration::from_secs(1)))
            }
        };
        let next_ready = match (next_ready, next_purge) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timer = async {
            match next_ready {
                Some(at) => inner.env.clock.sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        // Where other engines share the store, their notices are hints: look again at
        // least every POLL (not under a virtual clock, whose tests would crawl through
        // months a second at a time; they get every notice).
        let poll = async {
            if inner.env.leases.expire() && !inner.env.clock.is_virtual() {
                tokio::time::sleep(POLL).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = inner.env.wake.notified() => claim_now = true,
            () = timer => claim_now = true,
            () = poll => claim_now = true,
            Some(_) = drivers.join_next(), if !drivers.is_empty() => {}
            _ = shutdown.changed() => {}
        }
    }
    // Drain: drivers have seen the shutdown; attempts in flight finish and commit, then
    // each lifetime lets go. Whatever is still running at the deadline is dropped (its
    // attempt is recorded as interrupted by the next engine).
    let drained = async { while drivers.join_next().await.is_some() {} };
    tokio::select! {
        () = drained => {}
        () = inner.env.clock.sleep(inner.drain_timeout) => {
            tracing::warn!(running = drivers.len(), "drain deadline reached; dropping the attempts still running");
        }
    }
    drivers.abort_all();
    while drivers.join_next().await.is_some() {}
    if let Some((stop, task)) = keeper {
        let _ = stop.send(());
        let _ = task.await;
    }
}
