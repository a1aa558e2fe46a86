//! The gauges read from the store (instances by status, the due backlog, pending timers)
//! and from memory (lifetimes held): refreshed every [`EVERY`] and on demand
//! ([`crate::Engine::refresh_gauges`], which `cairn serve` calls before each scrape).

use std::sync::Arc;
use std::time::Duration;

use cairn_core::InstanceStatus;

use crate::engine::runtime::Runtime;

/// How often the engine refreshes its gauges on its own.
pub(crate) const EVERY: Duration = Duration::from_secs(15);

/// Refreshes closer together than this answer from the last one: scrapers from several
/// Prometheus servers, or a scrape beside the periodic refresh, cost one set of reads.
const FRESH: Duration = Duration::from_secs(1);

/// Reads the store's counts and timers of every registered workflow into the gauges, one
/// refresh at a time, and not again within [`FRESH`] of the last.
pub(crate) async fn refresh(inner: &Runtime) -> Result<(), cairn_store::Error> {
    let mut last = inner.gauges_refreshed.lock().await;
    if last.is_some_and(|at| at.elapsed() < FRESH) {
        return Ok(());
    }
    read(inner).await?;
    *last = Some(std::time::Instant::now());
    Ok(())
}

async fn read(inner: &Runtime) -> Result<(), cairn_store::Error> {
    let store = &inner.env.store;
    let now = inner.env.clock.now();
    let mut names = inner.names.clone();
    names.extend(inner.env.remote.names());
    for workflow in &names {
        for status in InstanceStatus::ALL {
            let n = store.count(workflow, status).await?;
            crate::telemetry::instance_gauges(workflow, status, n);
        }
        let timers = store.timers(workflow, now).await?;
        crate::telemetry::timer_gauges(workflow, timers.due, timers.pending);
        if inner.concurrency.contains_key(workflow) {
            let (top, all) = store
                .waiting_for_slots(workflow, crate::telemetry::MAX_KEY_LABELS)
                .await?;
            crate::telemetry::slot_gauges(workflow, &top, all);
        }
    }
    crate::telemetry::in_memory(inner.live.len());
    Ok(())
}

/// Refreshes the gauges every [`EVERY`] until shutdown. Not on a virtual clock: a test's
/// idle runtime jumps to its next timer, and a 30-day sleep would stop every 15 s.
pub(crate) async fn keep(inner: Arc<Runtime>) {
    let mut shutdown = inner.shutdown.subscribe();
    loop {
        tokio::select! {
            () = tokio::time::sleep(EVERY) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        if let Err(e) = refresh(&inner).await {
            tracing::debug!(error = %e, "refreshing the gauges failed; trying again later");
        }
    }
}
