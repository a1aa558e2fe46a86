//! The state of one run lifetime of an instance: the journal loaded at its start, the name
//! counters that give each op its identity, and the commit path that fences every write.
//!
//! Identity is `(kind, name, count)`, claimed synchronously when an op is *created*, so
//! concurrent ops replay deterministically whatever order they are polled in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cairn_core::{
    InstanceId, LogEntry, LogKind, StepKey, StepKind, StepName, StepRecord, Timestamp, WorkflowName,
};
use cairn_store::{Lease, Write};
use tokio::sync::Notify;

use crate::engine::Shared;
use crate::failure::WorkflowError;

/// Why a run lifetime must stop: its writes can no longer land.
#[derive(Debug, Clone)]
pub(crate) enum Abort {
    /// The store refused or failed a write.
    Store(cairn_store::Error),
}

pub(crate) struct RunState {
    pub(crate) shared: Arc<Shared>,
    pub(crate) lease: Lease,
    pub(crate) workflow: WorkflowName,
    pub(crate) instance_id: InstanceId,
    pub(crate) created_at: Timestamp,
    inner: Mutex<Inner>,
    abort: Mutex<Option<Abort>>,
    aborted: Notify,
}

struct Inner {
    journal: HashMap<StepKey, StepRecord>,
    counters: HashMap<(StepKind, String), u32>,
    next_seq: u32,
    run_calls: u32,
}

impl RunState {
    pub(crate) fn new(
        shared: Arc<Shared>,
        lease: Lease,
        workflow: WorkflowName,
        instance_id: InstanceId,
        created_at: Timestamp,
        journal: Vec<StepRecord>,
    ) -> Self {
        let next_seq = journal.iter().map(|s| s.seq).max().unwrap_or(0) + 1;
        RunState {
            shared,
            lease,
            workflow,
            instance_id,
            created_at,
            inner: Mutex::new(Inner {
                journal: journal.into_iter().map(|s| (s.key.clone(), s)).collect(),
                counters: HashMap::new(),
                next_seq,
                run_calls: 0,
            }),
            abort: Mutex::new(None),
            aborted: Notify::new(),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves nothing half-updated worth protecting.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Claims the identity of a new op of `kind` named `name`: validates the name, enforces
    /// the step limit for `run` ops, and takes the next count.
    pub(crate) fn claim(&self, kind: StepKind, name: String) -> Result<StepKey, WorkflowError> {
        let name = StepName::new(name)
            .map_err(|e| WorkflowError::new(crate::failure::ERROR, e.to_string()))?;
        let mut inner = self.inner();
        if kind == StepKind::Run {
            inner.run_calls += 1;
            let limit = self.shared.limits.step_limit;
            if inner.run_calls > limit {
                return Err(WorkflowError::new(
                    crate::failure::ERROR,
                    format!(
                        "The limit of {limit} steps has been reached. This limit can be changed with EngineBuilder::step_limit."
                    ),
                ));
            }
        }
        let counter = inner
            .counters
            .entry((kind, name.as_str().to_owned()))
            .or_insert(0);
        *counter += 1;
        Ok(StepKey {
            kind,
            name: name.as_str().to_owned(),
            count: *counter,
        })
    }

    /// The stored record for `key`, if this instance has one. Each key is claimed once per
    /// lifetime, so the record is handed over rather than copied.
    pub(crate) fn take_record(&self, key: &StepKey) -> Option<StepRecord> {
        self.inner().journal.remove(key)
    }

    /// The next start-order number.
    pub(crate) fn next_seq(&self) -> u32 {
        let mut inner = self.inner();
        let seq = inner.next_seq;
        inner.next_seq += 1;
        seq
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.shared.clock.now()
    }

    /// A lifecycle record for `step` at the current time.
    pub(crate) fn log(
        &self,
        kind: LogKind,
        step: Option<&StepKey>,
        meta: serde_json::Value,
    ) -> Write {
        Write::Log(LogEntry {
            kind,
            at: self.now(),
            step: step.cloned(),
            meta,
        })
    }

    /// Commits `writes` under this lifetime's lease. If the store refuses (lease lost,
    /// instance gone, store down), the lifetime is aborted and this future never resolves:
    /// the driver drops the whole run, and nothing after the failed write happens.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not let the commit land, never half of it.
    pub(crate) async fn commit(&self, writes: Vec<Write>) {
        if let Err(e) = self.shared.store.commit(self.lease, writes).await {
            tracing::debug!(instance = %self.instance_id, error = %e, "commit failed; stopping this run");
            self.abort(Abort::Store(e));
            std::future::pending::<()>().await;
        }
    }

    pub(crate) fn abort(&self, reason: Abort) {
        let mut slot = self
            .abort
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(reason);
        }
        self.aborted.notify_waiters();
        self.aborted.notify_one();
    }

    /// Resolves when the lifetime has been aborted.
    pub(crate) async fn aborted(&self) -> Abort {
        loop {
            let notified = self.aborted.notified();
            if let Some(reason) = self
                .abort
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
            {
                return reason;
            }
            notified.await;
        }
    }

    /// A key stable across attempts and replays of one step of this instance, distinct from
    /// any other instance's (also one that reuses this id later).
    pub(crate) fn idempotency_key(&self, key: &StepKey) -> String {
        format!(
            "{}/{}/{}/{}/{}",
            self.workflow,
            self.instance_id,
            self.created_at.as_millis(),
            key.name,
            key.count
        )
    }
}
