//! Tells live views (the server's event streams) that the store committed something.
//!
//! [`Announcing`] wraps the store and bumps a counter after every successful write, so a
//! stream that has read the whole log sleeps on [`Engine::commits`](crate::Engine::commits)
//! instead of polling the database. Only this engine's own writes are seen; a view that must
//! also follow other processes keeps a slow poll as its fallback.

use std::sync::Arc;
use std::time::Duration;

use cairn_core::{
    EventType, InstanceId, InstanceStatus, LogRecord, StepKey, StepRecord, Timestamp, WorkflowName,
};
use cairn_store::{
    Claimed, ControlOutcome, ControlRequest, Created, InstanceRecord, InstanceRef, Lease,
    ListQuery, NewEvent, NewInstance, Sent, Store, StoreFuture, StoredEvent, Write,
};
use tokio::sync::watch;

pub(crate) struct Announcing {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) commits: Arc<watch::Sender<u64>>,
}

impl Announcing {
    /// Runs a write and, when it succeeded, announces it.
    fn write<'a, T: Send + 'a>(&'a self, call: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
        Box::pin(async move {
            let result = call.await;
            if result.is_ok() {
                self.commits.send_modify(|n| *n = n.wrapping_add(1));
            }
            result
        })
    }
}

impl Store for Announcing {
    fn create(&self, batch: Vec<NewInstance>) -> StoreFuture<'_, Vec<Created>> {
        self.write(self.store.create(batch))
    }

    fn instance(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
    ) -> StoreFuture<'_, Option<InstanceRecord>> {
        self.store.instance(workflow, id)
    }

    fn list(&self, query: ListQuery) -> StoreFuture<'_, Vec<InstanceRecord>> {
        self.store.list(query)
    }

    fn count(&self, workflow: &WorkflowName, status: InstanceStatus) -> StoreFuture<'_, u64> {
        self.store.count(workflow, status)
    }

    fn claim(
        &self,
        owner: &str,
        workflows: &[WorkflowName],
        now: Timestamp,
        ttl: Duration,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Claimed>> {
        self.write(self.store.claim(owner, workflows, now, ttl, limit))
    }

    fn renew(&self, owner: &str, until: Timestamp) -> StoreFuture<'_, ()> {
        self.store.renew(owner, until)
    }

    fn journal(&self, instance: InstanceRef) -> StoreFuture<'_, Vec<StepRecord>> {
        self.store.journal(instance)
    }

    fn commit(&self, lease: Lease, writes: Vec<Write>) -> StoreFuture<'_, InstanceStatus> {
        self.write(self.store.commit(lease, writes))
    }

    fn control(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
        request: ControlRequest,
    ) -> StoreFuture<'_, ControlOutcome> {
        self.write(self.store.control(workflow, id, request))
    }

    fn log(
        &self,
        instance: InstanceRef,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<LogRecord>> {
        self.store.log(instance, after, limit)
    }

    fn workflow_log(
        &self,
        workflow: &WorkflowName,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<(InstanceId, LogRecord)>> {
        self.store.workflow_log(workflow, after, limit)
    }

    fn next_ready(&self, workflows: &[WorkflowName]) -> StoreFuture<'_, Option<Timestamp>> {
        self.store.next_ready(workflows)
    }

    fn send_event(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
        event: NewEvent,
    ) -> StoreFuture<'_, Sent> {
        self.write(self.store.send_event(workflow, id, event))
    }

    fn take_event(
        &self,
        lease: Lease,
        step: StepKey,
        event_type: EventType,
        at: Timestamp,
    ) -> StoreFuture<'_, Option<StoredEvent>> {
        self.write(self.store.take_event(lease, step, event_type, at))
    }

    fn purge(&self, now: Timestamp, limit: usize) -> StoreFuture<'_, usize> {
        self.write(self.store.purge(now, limit))
    }

    fn next_purge(&self) -> StoreFuture<'_, Option<Timestamp>> {
        self.store.next_purge()
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        self.store.close()
    }
}
