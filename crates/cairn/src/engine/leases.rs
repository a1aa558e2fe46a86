//! Keeping leases: where several engines share a store (PostgreSQL), a claim holds an
//! instance for a TTL only, and this task renews all of the engine's leases in one store
//! call per tick (a third of the TTL). An engine that could not renew in time (the store
//! unreachable, the process stalled or stopped) must assume another engine took its
//! instances over: it stops every lifetime at once, before any of them starts another
//! attempt. The store's fencing already refuses their writes; stopping them keeps their
//! step bodies from running on beside the new owner's. A lease that ran out is never
//! renewed back (see `Store::renew`): the instance is claimed again, by anyone.
//!
//! On SQLite (one engine per file) leases do not expire (`env::UNBOUNDED_LEASE`), and no
//! task runs.

use std::sync::Arc;
use std::time::Duration;

use cairn_core::Timestamp;
use cairn_store::{Error as StoreError, InstanceRef};

use crate::engine::runtime::Runtime;
use crate::lifetime::Abort;

/// The default TTL where leases expire.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// Renews the engine's leases until `stop` (after the drain at shutdown).
pub(crate) async fn keep(inner: Arc<Runtime>, mut stop: tokio::sync::oneshot::Receiver<()>) {
    let ttl = inner.env.leases.ttl();
    let tick = ttl / 3;
    let clock = &inner.env.clock;
    // Leases taken from now on are good until at least this plus the TTL.
    let mut renewed = clock.now();
    loop {
        tokio::select! {
            () = clock.sleep(tick) => {}
            _ = &mut stop => break,
        }
        let now = clock.now();
        if inner.live.len() == 0 {
            // Nothing runs here, so no lease is held: nothing to renew or to lose.
            renewed = now;
            inner.env.leases.renewed(now);
            continue;
        }
        if now >= renewed.saturating_add(ttl) {
            stop_all(&inner, now.as_millis() - renewed.as_millis());
        }
        // Only the instances running here: a lease held by no lifetime (a claim whose
        // answer was lost) must run out, not be kept forever.
        let running: Vec<InstanceRef> = inner.live.all().iter().map(|l| l.lease.instance).collect();
        let renewal = inner
            .env
            .store
            .renew(&inner.owner, running, now, now.saturating_add(ttl));
        // A renewal stuck behind a stalled store must not keep the lifetimes running past
        // their leases: at the deadline they stop, whether or not it has answered.
        let deadline = clock.sleep_until(renewed.saturating_add(ttl));
        let answer = tokio::select! {
            answer = renewal => Some(answer),
            () = deadline => None,
        };
        match answer {
            Some(Ok(kept)) => {
                renewed = now;
                inner.env.leases.renewed(now);
                stop_lost(&inner, now, &kept);
            }
            Some(Err(e)) => tracing::warn!(error = %e, "renewing leases failed; retrying"),
            None => {
                let late = clock.now().as_millis() - renewed.as_millis();
                stop_all(&inner, late);
            }
        }
    }
}

/// Lifetimes claimed before the renewal whose lease was not renewed lost it (it ran out
/// first, and maybe another engine has the instance now): stop them.
fn stop_lost(inner: &Runtime, at: Timestamp, kept: &[InstanceRef]) {
    let kept: std::collections::HashSet<InstanceRef> = kept.iter().copied().collect();
    for lifetime in inner.live.all() {
        if lifetime.claimed_at() < at && !kept.contains(&lifetime.lease.instance) {
            tracing::warn!(
                instance = %lifetime.instance_id,
                "lease ran out before it was renewed; stopping this run (another engine may own it)"
            );
            // Counted once per lifetime, however many ticks find it still stopping.
            if lifetime.abort(Abort::Store(StoreError::LeaseLost(lifetime.lease.instance))) {
                crate::telemetry::leases_lost(1);
            }
        }
    }
}

/// The leases may all be gone: stop every lifetime.
fn stop_all(inner: &Runtime, late_ms: i64) {
    let lifetimes = inner.live.all();
    if lifetimes.is_empty() {
        return;
    }
    tracing::warn!(
        lifetimes = lifetimes.len(),
        late_ms,
        "leases not renewed within their TTL; stopping every lifetime (another engine may own them now)"
    );
    for lifetime in lifetimes {
        if lifetime.abort(Abort::Store(StoreError::LeaseLost(lifetime.lease.instance))) {
            crate::telemetry::leases_lost(1);
        }
    }
}
