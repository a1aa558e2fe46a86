//! What other engines sharing the store did (PostgreSQL's notices, `Store::changes`):
//! wake this engine's scheduler when something became claimable, its streams and status
//! waiters when an instance they follow was written, and its lifetimes when another engine
//! sent them an event, stopped them (terminate, restart, delete) or paused them. Notices
//! are hints; the scheduler still polls.
//!
//! A notice that names no instance ("anything may have changed": a batch too big to list,
//! or a listener that reconnected) makes every lifetime here read its status again, for a
//! pause requested elsewhere, and renews the leases at once, for a stop: a lifetime whose
//! lease a terminate, restart or delete moved on stops then, not at the next tick. Those
//! reads are one sweep at a time, one read after another,
//! and notices that come during a sweep make one more sweep, not one each: a burst of such
//! notices handed over together costs at most two reads per lifetime (one handed over in
//! pieces, a sweep for each piece after a sweep ended), never a read per lifetime per
//! notice.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use cairn_store::{ChangeKind, Changes};
use futures::StreamExt;

use crate::engine::runtime::Runtime;
use crate::lifetime::Abort;

/// No sweep runs.
const IDLE: u8 = 0;
/// A sweep runs.
const SWEEPING: u8 = 1;
/// A sweep runs, and another must follow it.
const AGAIN: u8 = 2;

/// Follows the store's notices until it closes them or the engine shuts down.
pub(crate) async fn follow(
    inner: Arc<Runtime>,
    mut changes: futures::stream::BoxStream<'static, Changes>,
) {
    let mut shutdown = inner.shutdown.subscribe();
    let sweep = Arc::new(AtomicU8::new(IDLE));
    loop {
        let next = tokio::select! {
            next = changes.next() => next,
            _ = shutdown.changed() => None,
        };
        let Some(changes) = next else { break };
        apply(&inner, &sweep, changes);
    }
}

fn apply(inner: &Arc<Runtime>, sweep: &Arc<AtomicU8>, changes: Changes) {
    match changes.instances {
        None => {
            inner.commits.remote(None);
            inner.commits.statuses.bump_all();
            for lifetime in inner.live.all() {
                lifetime.events.notify_waiters();
            }
            observe_all(inner, sweep);
            // A stop (terminate, restart, delete) may have been among the notices lost: a
            // status read does not tell a restart, a renewal does (its lease moved on).
            inner.renew_now.notify_one();
        }
        Some(list) => {
            for changed in list {
                inner.commits.remote(Some(changed.instance));
                inner.commits.statuses.bump(&changed.instance);
                let Some(lifetime) = inner.live.get(changed.instance) else {
                    continue;
                };
                match changed.kind {
                    ChangeKind::Written => lifetime.events.notify_waiters(),
                    ChangeKind::Stopped { epoch } => {
                        if let Some(fenced) = inner.live.fenced_by(changed.instance, epoch) {
                            fenced.abort(Abort::Stopped);
                        }
                    }
                    ChangeKind::Controlled => observe_later(&lifetime),
                }
            }
        }
    }
    inner.changed();
    if changes.claimable {
        inner.env.wake.notify_one();
    }
}

/// Reads the instance's status and hands it to its lifetime (a pause requested elsewhere
/// closes its gate now, not at its next commit).
fn observe_later(lifetime: &Arc<crate::lifetime::Lifetime>) {
    let lifetime = Arc::clone(lifetime);
    tokio::spawn(async move { lifetime.learn_control(None).await });
}

/// Every lifetime here reads its status again, in the one sweep that runs (see the module).
fn observe_all(inner: &Arc<Runtime>, sweep: &Arc<AtomicU8>) {
    // A sweep under way takes one more round; otherwise this call starts one.
    if sweep
        .compare_exchange(IDLE, SWEEPING, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        sweep.store(AGAIN, Ordering::SeqCst);
        return;
    }
    let inner = Arc::clone(inner);
    let sweep = Arc::clone(sweep);
    tokio::spawn(async move {
        loop {
            for lifetime in inner.live.all() {
                lifetime.learn_control(None).await;
            }
            if sweep
                .compare_exchange(SWEEPING, IDLE, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return;
            }
            // More notices came during the sweep: one more, for all of them.
            sweep.store(SWEEPING, Ordering::SeqCst);
        }
    });
}
