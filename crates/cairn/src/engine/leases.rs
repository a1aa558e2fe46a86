//! Keeping leases: where several engines share a store (PostgreSQL), a claim holds an
//! instance for a TTL only, and this task renews the leases of the lifetimes running here in
//! one store call per tick (a third of the TTL).
//!
//! Each lifetime knows until when its own lease holds (`Lifetime::lease_until`: from its
//! claim, or from the last renewal that kept it). A lease that ran out by this engine's
//! clock (the process was stopped, the store did not answer the renewal in time) may belong
//! to another engine now: its lifetime is stopped at once, before it starts another
//! attempt, and its driver takes the instance back at a new epoch if no one else took it
//! (`Store::reclaim`), so an engine that wakes from a stall is back to normal at once. The
//! store's fencing already refuses a stale lifetime's writes; stopping it keeps its step
//! body from running on beside the new owner's.
//!
//! A renewal names each lease at its epoch, and its answer judges only the lifetimes it was
//! sent for: one claimed while it was on its way is not in it and keeps the lease of its
//! claim until the next tick. A renewal abandoned at its deadline may still land; at the
//! epoch it names it can extend only a lease no lifetime has moved on since.
//!
//! On SQLite (one engine per file) leases do not expire (`env::UNBOUNDED_LEASE`), and no
//! task runs.

use std::sync::Arc;
use std::time::Duration;

use cairn_core::Timestamp;
use cairn_store::{Error as StoreError, Lease};

use crate::clock::Clock;
use crate::engine::runtime::Runtime;
use crate::lifetime::{Abort, Lifetime};

/// The default TTL where leases expire.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// The least time between two renewals when notices ask for one early.
const EARLY_RENEWAL_GAP: Duration = Duration::from_secs(1);

/// Renews the engine's leases until `stop` (after the drain at shutdown).
pub(crate) async fn keep(inner: Arc<Runtime>, mut stop: tokio::sync::oneshot::Receiver<()>) {
    let ttl = inner.env.leases.ttl();
    let clock = &inner.env.clock;
    // When the last renewal was sent.
    let mut last = clock.now();
    loop {
        // Between ticks too, each lifetime stops when its own lease runs out: after a
        // renewal that failed (the store refused it at once), none is on its way to do it,
        // and the next tick may come up to a third of the TTL too late.
        let live = inner.live.all();
        tokio::select! {
            () = clock.sleep(ttl / 3) => {}
            // Notices may have been lost (`remote.rs`): a lease moved on by a stop is found
            // now, though not more than once a second (a busy deployment's batches too big
            // to list in a notice come often).
            () = async {
                inner.renew_now.notified().await;
                clock.sleep_until(last.saturating_add(EARLY_RENEWAL_GAP)).await;
            } => {}
            () = async {
                stop_as_they_run_out(&inner, clock, &live).await;
                std::future::pending::<()>().await;
            } => {}
            _ = &mut stop => break,
        }
        let now = clock.now();
        last = now;
        let mut sent = Vec::new();
        let mut ran_out = Vec::new();
        for lifetime in inner.live.all() {
            if lifetime.is_aborted() {
                // Stopping already: its lease is not renewed (its driver takes the instance
                // back at a new epoch, or lets it go).
                continue;
            }
            if lifetime.lease_until() <= now {
                ran_out.push(lifetime);
            } else {
                sent.push(lifetime);
            }
        }
        stop_ran_out(&inner, &ran_out, now);
        if sent.is_empty() {
            continue;
        }
        let leases: Vec<Lease> = sent.iter().map(|l| l.lease).collect();
        let renewal = inner
            .env
            .store
            .renew(&inner.owner, leases, now, now.saturating_add(ttl));
        // A renewal stuck behind a stalled store must not keep the lifetimes running past
        // their leases: each stops when its own runs out, answered or not.
        let answer = tokio::select! {
            answer = renewal => answer,
            () = stop_as_they_run_out(&inner, clock, &sent) => continue,
            _ = &mut stop => break,
        };
        match answer {
            Ok(kept) => {
                let kept: std::collections::HashSet<Lease> = kept.into_iter().collect();
                let mut lost = Vec::new();
                for lifetime in sent {
                    if kept.contains(&lifetime.lease) {
                        lifetime.lease_renewed(now);
                    } else {
                        lost.push(lifetime);
                    }
                }
                stop_lost(&inner, &lost);
            }
            Err(e) => {
                tracing::warn!(error = %e, "renewing leases failed; retrying at the next tick");
            }
        }
    }
}

/// Stops each of `sent` whose lease runs out before the renewal answers; resolves once none
/// is left running.
async fn stop_as_they_run_out(inner: &Runtime, clock: &Clock, sent: &[Arc<Lifetime>]) {
    loop {
        let running = || {
            sent.iter()
                .filter(|l| !l.is_aborted() && inner.live.holds(l))
        };
        let Some(next) = running().map(|l| l.lease_until()).min() else {
            return;
        };
        clock.sleep_until(next).await;
        let now = clock.now();
        let ran_out: Vec<_> = running()
            .filter(|l| l.lease_until() <= now)
            .cloned()
            .collect();
        stop_ran_out(inner, &ran_out, now);
    }
}

/// The leases of `ran_out` ran out by this engine's clock before a renewal kept them.
fn stop_ran_out(inner: &Runtime, ran_out: &[Arc<Lifetime>], now: Timestamp) {
    let stopped = stop(inner, ran_out);
    if stopped > 0 {
        let late_ms = ran_out
            .iter()
            .map(|l| now.as_millis() - l.lease_until().as_millis())
            .max()
            .unwrap_or(0);
        tracing::warn!(
            lifetimes = stopped,
            late_ms,
            "leases ran out before they were renewed (the engine or the store stalled); stopping those lifetimes and taking their instances back unless another engine has"
        );
    }
}

/// The renewal did not keep the leases of `lost` (they ran out first by the store's
/// reckoning, or moved on): another engine may own them now.
fn stop_lost(inner: &Runtime, lost: &[Arc<Lifetime>]) {
    let stopped = stop(inner, lost);
    if stopped > 0 {
        tracing::warn!(
            lifetimes = stopped,
            "leases were not renewed; stopping those lifetimes (another engine may own them)"
        );
    }
}

/// Stops each lifetime of `lifetimes` still in the live set; returns how many this call
/// stopped (each is stopped and counted once).
fn stop(inner: &Runtime, lifetimes: &[Arc<Lifetime>]) -> usize {
    let mut stopped = 0;
    for lifetime in lifetimes.iter().filter(|l| inner.live.holds(l)) {
        if lifetime.abort(Abort::Store(StoreError::LeaseLost(lifetime.lease.instance))) {
            tracing::debug!(instance = %lifetime.instance_id, "stopping a lifetime whose lease ran out");
            crate::telemetry::leases_lost(1);
            stopped += 1;
        }
    }
    stopped
}
