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

/// The most finished instances one purge deletes, in one transaction. Small enough that
/// the store's other work (on PostgreSQL, lease renewals queue behind it on the writer)
/// waits for no more than a fraction of a second: a purge of 1,000 instances, several
/// statements each, could outlast a lease renewal's margin, and every lifetime of the
/// engine then stopped as if its leases had run out. A wave of due instances is purged
/// batch after batch all the same.
const PURGE_BATCH: usize = 200;

/// What one round of claims took.
struct Claims {
    /// Each instance, with its place among its workers' slots for a worker's workflow.
    instances: Vec<(
        cairn_store::Claimed,
        Option<crate::engine::workers::Reservation>,
    )>,
    /// The Rust workflows' claim took every free slot: more may be ready.
    filled: bool,
}

/// Claims up to `free` runnable instances: of the workflows registered in Rust, then of
/// each workflow workers run, no more than its workers' free slots.
async fn claim(
    inner: &Arc<Runtime>,
    free: usize,
    now: cairn_core::Timestamp,
) -> cairn_store::Result<Claims> {
    let store = &inner.env.store;
    let ttl = inner.env.leases.ttl();
    let mut claims = Claims {
        instances: Vec::new(),
        filled: false,
    };
    if !inner.names.is_empty() {
        let claimed = store
            .claim(&inner.owner, &inner.names, now, ttl, free)
            .await?;
        claims.filled = claimed.len() == free;
        claims
            .instances
            .extend(claimed.into_iter().map(|c| (c, None)));
    }
    for (workflow, slots) in inner.workers.free() {
        let n = slots.min(free.saturating_sub(claims.instances.len()));
        if n == 0 {
            break;
        }
        let claimed = match store
            .claim(&inner.owner, std::slice::from_ref(&workflow), now, ttl, n)
            .await
        {
            Ok(claimed) => claimed,
            Err(e) if claims.instances.is_empty() => return Err(e),
            // What was claimed already is leased to this engine: run it, claim the rest
            // on the next round.
            Err(e) => {
                tracing::warn!(error = %e, "claiming instances failed; retrying");
                break;
            }
        };
        for c in claimed {
            let reservation = inner.workers.reserve(&workflow);
            claims.instances.push((c, Some(reservation)));
        }
    }
    Ok(claims)
}

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
        if std::mem::take(&mut claim_now) && free > 0 {
            let now = inner.env.clock.now();
            match claim(&inner, free, now).await {
                Ok(claimed) => {
                    failures = 0;
                    filled = claimed.filled;
                    // A shared store's recovery summary: leases that ran out under another
                    // engine. (SQLite says so once, at open, where it takes the dead
                    // engine's leases over.)
                    let taken_over = claimed
                        .instances
                        .iter()
                        .filter(|(c, _)| c.taken_over)
                        .count();
                    if taken_over > 0 {
                        tracing::info!(
                            instances = taken_over,
                            "took over instances whose engine stopped or lost its lease; their interrupted attempts are recorded and retried"
                        );
                    }
                    for (c, _) in claimed.instances.iter().filter(|(c, _)| c.taken_over) {
                        crate::telemetry::taken_over(&c.record.workflow);
                    }
                    for (c, reservation) in claimed.instances {
                        drivers.spawn(crate::engine::driver::drive(
                            Arc::clone(&inner),
                            c,
                            now,
                            reservation,
                        ));
                    }
                    // Every slot taken (by Rust workflows or workers'): go round once one
                    // frees up.
                    filled |= drivers.len() >= inner.max_running;
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
            Ok(Some(at)) if at <= now => match store.purge(now, PURGE_BATCH).await {
                Ok(purged) if purged > 0 => {
                    tracing::debug!(purged, "purged finished instances");
                    inner.statuses_changed();
                    claim_now = true;
                    continue;
                }
                // Due, yet none purged: another engine is purging them (PostgreSQL skips
                // the rows it holds). Looking again at once would spin on the store for as
                // long as that engine's transaction lasts; a second later does.
                Ok(_) => Some(now.saturating_add(Duration::from_secs(1))),
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
        // Workers' workflows count only while their workers have slots to spare (their
        // instances are ready but wait for a slot, which wakes the scheduler when it frees);
        // an instance waiting for a worker of its version has no timer.
        let mut names = inner.names.clone();
        names.extend(inner.workers.free().into_iter().map(|(w, _)| w));
        let next_ready = match store.next_ready(&names).await {
            Ok(at) => at.filter(|at| *at < cairn_store::AWAITING_WORKER),
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
