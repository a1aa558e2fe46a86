//! What other engines sharing the store did (PostgreSQL's notices, `Store::changes`):
//! wake this engine's scheduler when something became claimable, its streams and status
//! waiters when an instance they follow was written, and its lifetimes when another engine
//! sent them an event, stopped them (terminate, restart, delete) or paused them. Notices
//! are hints; the scheduler still polls.

use std::sync::Arc;

use cairn_store::{ChangeKind, Changes};
use futures::StreamExt;

use crate::engine::runtime::Runtime;
use crate::lifetime::Abort;

/// Follows the store's notices until it closes them or the engine shuts down.
pub(crate) async fn follow(
    inner: Arc<Runtime>,
    mut changes: futures::stream::BoxStream<'static, Changes>,
) {
    let mut shutdown = inner.shutdown.subscribe();
    loop {
        let next = tokio::select! {
            next = changes.next() => next,
            _ = shutdown.changed() => None,
        };
        let Some(changes) = next else { break };
        apply(&inner, changes);
    }
}

fn apply(inner: &Arc<Runtime>, changes: Changes) {
    match changes.instances {
        None => {
            inner.commits.remote(None);
            inner.statuses.bump_all();
            for lifetime in inner.live.all() {
                lifetime.events.notify_waiters();
                observe_later(inner, &lifetime);
            }
        }
        Some(list) => {
            for changed in list {
                inner.commits.remote(Some(changed.instance));
                inner.statuses.bump(&changed.instance);
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
                    ChangeKind::Controlled => observe_later(inner, &lifetime),
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
fn observe_later(inner: &Arc<Runtime>, lifetime: &Arc<crate::lifetime::Lifetime>) {
    let store = Arc::clone(&inner.env.store);
    let lifetime = Arc::clone(lifetime);
    tokio::spawn(async move {
        if let Ok(Some(record)) = store
            .instance(&lifetime.workflow, &lifetime.instance_id)
            .await
        {
            lifetime.observe(record.status);
        }
    });
}
