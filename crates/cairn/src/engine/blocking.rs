//! Keeps virtual time still while the store works.
//!
//! Under tokio's paused clock, time jumps to the next timer whenever the runtime has nothing
//! to do, including while it waits for the SQLite writer thread. That would fire a
//! 10-minute step timeout while a commit is in flight. tokio does not advance paused time
//! while a `spawn_blocking` task runs, so with a virtual clock every store call is made
//! from one, on a current-thread runtime (the only kind whose clock can be paused).

use std::sync::Arc;
use std::time::Duration;

use cairn_core::{
    EventType, InstanceId, InstanceStatus, LogRecord, StepKey, StepRecord, Timestamp, WorkflowName,
};
use cairn_store::{
    Claimed, ControlOutcome, ControlRequest, Created, Error, InstanceRecord, InstanceRef, Lease,
    ListQuery, NewEvent, NewInstance, Sent, Store, StoreFuture, StoredEvent, Timers, Write,
};

pub(crate) struct Blocking(pub(crate) Arc<dyn Store>);

fn blocking<T, F>(store: &Arc<dyn Store>, call: F) -> StoreFuture<'static, T>
where
    T: Send + 'static,
    F: for<'a> FnOnce(&'a dyn Store) -> StoreFuture<'a, T> + Send + 'static,
{
    let store = Arc::clone(store);
    Box::pin(async move {
        tokio::task::spawn_blocking(move || futures::executor::block_on(call(&*store)))
            .await
            .map_err(|e| Error::Unavailable(format!("store call did not finish: {e}")))?
    })
}

impl Store for Blocking {
    fn create(&self, batch: Vec<NewInstance>) -> StoreFuture<'_, Vec<Created>> {
        blocking(&self.0, move |s| s.create(batch))
    }

    fn instance(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
    ) -> StoreFuture<'_, Option<InstanceRecord>> {
        let (workflow, id) = (workflow.clone(), id.clone());
        blocking(&self.0, move |s| {
            Box::pin(async move { s.instance(&workflow, &id).await })
        })
    }

    fn list(&self, query: ListQuery) -> StoreFuture<'_, Vec<InstanceRecord>> {
        blocking(&self.0, move |s| s.list(query))
    }

    fn count_matching(&self, query: ListQuery) -> StoreFuture<'_, u64> {
        blocking(&self.0, move |s| s.count_matching(query))
    }

    fn count(&self, workflow: &WorkflowName, status: InstanceStatus) -> StoreFuture<'_, u64> {
        let workflow = workflow.clone();
        blocking(&self.0, move |s| {
            Box::pin(async move { s.count(&workflow, status).await })
        })
    }

    fn claim(
        &self,
        owner: &str,
        workflows: &[WorkflowName],
        now: Timestamp,
        ttl: Duration,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Claimed>> {
        let (owner, workflows) = (owner.to_owned(), workflows.to_vec());
        blocking(&self.0, move |s| {
            Box::pin(async move { s.claim(&owner, &workflows, now, ttl, limit).await })
        })
    }

    fn changes(&self) -> Option<futures::stream::BoxStream<'static, cairn_store::Changes>> {
        self.0.changes()
    }

    fn release_all(&self, owner: &str) -> StoreFuture<'_, ()> {
        let owner = owner.to_owned();
        blocking(&self.0, move |s| {
            Box::pin(async move { s.release_all(&owner).await })
        })
    }

    fn reclaim(
        &self,
        owner: &str,
        lease: Lease,
        now: Timestamp,
        ttl: std::time::Duration,
    ) -> StoreFuture<'_, Lease> {
        let owner = owner.to_owned();
        blocking(&self.0, move |s| {
            Box::pin(async move { s.reclaim(&owner, lease, now, ttl).await })
        })
    }

    fn renew(
        &self,
        owner: &str,
        leases: Vec<Lease>,
        now: Timestamp,
        until: Timestamp,
    ) -> StoreFuture<'_, Vec<Lease>> {
        let owner = owner.to_owned();
        blocking(&self.0, move |s| {
            Box::pin(async move { s.renew(&owner, leases, now, until).await })
        })
    }

    fn journal(&self, instance: InstanceRef) -> StoreFuture<'_, Vec<StepRecord>> {
        blocking(&self.0, move |s| s.journal(instance))
    }

    fn stream_chunk(
        &self,
        instance: InstanceRef,
        step: StepKey,
        attempt: u32,
        epoch: u64,
        index: u32,
    ) -> StoreFuture<'_, Option<Vec<u8>>> {
        blocking(&self.0, move |s| {
            s.stream_chunk(instance, step, attempt, epoch, index)
        })
    }

    fn stream_bytes(&self, instance: InstanceRef) -> StoreFuture<'_, u64> {
        blocking(&self.0, move |s| s.stream_bytes(instance))
    }

    fn children(&self, parent: InstanceRef) -> StoreFuture<'_, Vec<InstanceRecord>> {
        blocking(&self.0, move |s| s.children(parent))
    }

    fn slot_position(&self, instance: InstanceRef) -> StoreFuture<'_, Option<u64>> {
        blocking(&self.0, move |s| s.slot_position(instance))
    }

    fn waiting_for_slots(
        &self,
        workflow: &WorkflowName,
        limit: usize,
    ) -> StoreFuture<'_, (Vec<(String, u64)>, u64)> {
        let workflow = workflow.clone();
        blocking(&self.0, move |s| {
            Box::pin(async move { s.waiting_for_slots(&workflow, limit).await })
        })
    }

    fn create_schedule(&self, schedule: cairn_store::StoredSchedule) -> StoreFuture<'_, bool> {
        blocking(&self.0, move |s| s.create_schedule(schedule))
    }

    fn set_schedule_state(
        &self,
        name: &str,
        state: cairn_store::ScheduleState,
    ) -> StoreFuture<'_, bool> {
        let name = name.to_owned();
        blocking(&self.0, move |s| {
            Box::pin(async move { s.set_schedule_state(&name, state).await })
        })
    }

    fn schedules(&self) -> StoreFuture<'_, Vec<cairn_store::StoredSchedule>> {
        blocking(&self.0, move |s| s.schedules())
    }

    fn delete_schedule(&self, name: &str, declared: bool) -> StoreFuture<'_, bool> {
        let name = name.to_owned();
        blocking(&self.0, move |s| {
            Box::pin(async move { s.delete_schedule(&name, declared).await })
        })
    }

    fn register_versions(
        &self,
        versions: Vec<cairn_store::WorkflowVersion>,
    ) -> StoreFuture<'_, ()> {
        blocking(&self.0, move |s| s.register_versions(versions))
    }

    fn workflow_versions(&self) -> StoreFuture<'_, Vec<cairn_store::WorkflowVersion>> {
        blocking(&self.0, |s| s.workflow_versions())
    }

    fn unfinished_versions(
        &self,
        workflow: &WorkflowName,
    ) -> StoreFuture<'_, Vec<(Option<String>, u64)>> {
        let workflow = workflow.clone();
        blocking(&self.0, move |s| {
            Box::pin(async move { s.unfinished_versions(&workflow).await })
        })
    }

    fn wake_awaiting(
        &self,
        workflow: &WorkflowName,
        version: &str,
        limit: u64,
    ) -> StoreFuture<'_, u64> {
        let (workflow, version) = (workflow.clone(), version.to_owned());
        blocking(&self.0, move |s| {
            Box::pin(async move { s.wake_awaiting(&workflow, &version, limit).await })
        })
    }

    fn fire_tick(
        &self,
        tick: cairn_store::ScheduleTick,
    ) -> StoreFuture<'_, cairn_store::TickFired> {
        blocking(&self.0, move |s| s.fire_tick(tick))
    }

    fn commit(&self, lease: Lease, writes: Vec<Write>) -> StoreFuture<'_, InstanceStatus> {
        blocking(&self.0, move |s| s.commit(lease, writes))
    }

    fn control(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
        request: ControlRequest,
    ) -> StoreFuture<'_, ControlOutcome> {
        let (workflow, id) = (workflow.clone(), id.clone());
        blocking(&self.0, move |s| {
            Box::pin(async move { s.control(&workflow, &id, request).await })
        })
    }

    fn log(
        &self,
        instance: InstanceRef,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<LogRecord>> {
        blocking(&self.0, move |s| s.log(instance, after, limit))
    }

    fn log_head(&self) -> StoreFuture<'_, u64> {
        blocking(&self.0, |s| s.log_head())
    }

    fn workflow_log(
        &self,
        workflow: &WorkflowName,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, cairn_store::WorkflowLogPage> {
        let workflow = workflow.clone();
        blocking(&self.0, move |s| {
            Box::pin(async move { s.workflow_log(&workflow, after, limit).await })
        })
    }

    fn next_ready(&self, workflows: &[WorkflowName]) -> StoreFuture<'_, Option<Timestamp>> {
        let workflows = workflows.to_vec();
        blocking(&self.0, move |s| {
            Box::pin(async move { s.next_ready(&workflows).await })
        })
    }

    fn timers(&self, workflow: &WorkflowName, now: Timestamp) -> StoreFuture<'_, Timers> {
        let workflow = workflow.clone();
        blocking(&self.0, move |s| {
            Box::pin(async move { s.timers(&workflow, now).await })
        })
    }

    fn send_event(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
        event: NewEvent,
    ) -> StoreFuture<'_, Sent> {
        let (workflow, id) = (workflow.clone(), id.clone());
        blocking(&self.0, move |s| {
            Box::pin(async move { s.send_event(&workflow, &id, event).await })
        })
    }

    fn take_event(
        &self,
        lease: Lease,
        step: StepKey,
        event_type: EventType,
        at: Timestamp,
    ) -> StoreFuture<'_, Option<StoredEvent>> {
        blocking(&self.0, move |s| s.take_event(lease, step, event_type, at))
    }

    fn purge(&self, now: Timestamp, limit: usize) -> StoreFuture<'_, usize> {
        blocking(&self.0, move |s| s.purge(now, limit))
    }

    fn next_purge(&self) -> StoreFuture<'_, Option<Timestamp>> {
        blocking(&self.0, |s| s.next_purge())
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        blocking(&self.0, |s| s.close())
    }
}
