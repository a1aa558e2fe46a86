//! The simulator's store: a real store with seeded faults on the engine's writes (commits
//! lost, landed but reported failed, the engine crashing before or after one) and outages
//! (every call fails for a while).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cairn_core::{
    EventType, InstanceId, InstanceStatus, LogRecord, StepKey, StepRecord, Timestamp, WorkflowName,
};
use cairn_store::{
    Claimed, ControlOutcome, ControlRequest, Created, Error, InstanceRecord, InstanceRef, Lease,
    ListQuery, NewEvent, NewInstance, Sent, Store, StoreFuture, StoredEvent, Timers, Write,
};

/// A small seeded generator (splitmix64): the same seed, the same faults.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// What happens to one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteFault {
    /// Fails; nothing lands.
    Lost,
    /// Lands; the engine is told it failed.
    LandedButFailed,
    /// The engine dies just before it: nothing lands.
    CrashBefore,
    /// The engine dies just after it landed.
    CrashAfter,
    /// The store is down for this call and the next few of any kind.
    Outage(u32),
}

/// Which store faults a run may see, and how often.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreFaults {
    pub(crate) rate: f64,
    pub(crate) lost: bool,
    pub(crate) landed_but_failed: bool,
    pub(crate) crashes: bool,
    pub(crate) outages: bool,
}

/// The faults of one run: its generator, budget and the account of what it injected. Shared
/// by every store the run opens (a crash opens a new one), so a seed's sequence goes on.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) rng: Rng,
    pub(crate) faults: Option<StoreFaults>,
    /// Faults left to inject (store faults and the simulator's own actions).
    pub(crate) budget: u32,
    outage: u32,
    writes: u64,
    /// What was injected, in order.
    pub(crate) injected: Vec<String>,
}

impl Plan {
    pub(crate) fn new(seed: u64, faults: Option<StoreFaults>, budget: u32) -> Self {
        Plan {
            rng: Rng::new(seed),
            faults,
            budget,
            outage: 0,
            writes: 0,
            injected: Vec::new(),
        }
    }

    fn write_fault(&mut self) -> Option<WriteFault> {
        self.writes += 1;
        let faults = self.faults?;
        if self.budget == 0 || !self.rng.chance(faults.rate) {
            return None;
        }
        let kinds: Vec<WriteFault> = [
            (faults.lost, WriteFault::Lost),
            (faults.landed_but_failed, WriteFault::LandedButFailed),
            (faults.crashes, WriteFault::CrashBefore),
            (faults.crashes, WriteFault::CrashAfter),
            (faults.outages, WriteFault::Outage(1)),
        ]
        .into_iter()
        .filter_map(|(on, kind)| on.then_some(kind))
        .collect();
        if kinds.is_empty() {
            return None;
        }
        let mut kind = kinds[self.rng.below(kinds.len() as u64) as usize];
        if let WriteFault::Outage(_) = kind {
            kind = WriteFault::Outage(1 + self.rng.below(8) as u32);
        }
        self.budget -= 1;
        self.injected
            .push(format!("write {}: {kind:?}", self.writes));
        Some(kind)
    }
}

/// A store that injects its run's [`Plan`] into a real one. A crash makes it dead (every
/// call but `close` fails) and tells the simulator, which opens a new engine on a new one.
///
/// It lets one call through to the real store at a time, in the order they are first
/// awaited (callers await a store call at once): the store's answers then come back in that
/// order too, whatever the threads under it do, so a seed's run takes the same course.
pub(crate) struct FaultStore {
    pub(crate) inner: Arc<dyn Store>,
    pub(crate) plan: Arc<Mutex<Plan>>,
    pub(crate) crashed: Arc<tokio::sync::Notify>,
    dead: AtomicBool,
    turn: Arc<tokio::sync::Mutex<()>>,
}

fn down<'a, T: Send + 'a>(why: &'static str) -> StoreFuture<'a, T> {
    Box::pin(async move { Err(Error::Unavailable(format!("simulated fault: {why}"))) })
}

impl FaultStore {
    pub(crate) fn new(
        inner: Arc<dyn Store>,
        plan: Arc<Mutex<Plan>>,
        crashed: Arc<tokio::sync::Notify>,
    ) -> Self {
        FaultStore {
            inner,
            plan,
            crashed,
            dead: AtomicBool::new(false),
            turn: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    fn plan(&self) -> MutexGuard<'_, Plan> {
        self.plan
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a call may go through now (not dead, no outage).
    fn up(&self) -> Result<(), &'static str> {
        if self.dead.load(Ordering::SeqCst) {
            return Err("the engine crashed");
        }
        let mut plan = self.plan();
        if plan.outage > 0 {
            plan.outage -= 1;
            return Err("the store is unavailable");
        }
        Ok(())
    }

    /// Whether this store's engine crashed.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    fn crash(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.crashed.notify_one();
    }

    /// `call`'s future, run when the calls made before it have finished.
    fn in_turn<'a, T: Send + 'a>(&self, call: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
        // Queued when first polled, in that order (tokio's mutex is fair).
        let turn = Arc::clone(&self.turn).lock_owned();
        Box::pin(async move {
            let _turn = turn.await;
            call.await
        })
    }

    /// A read, or a client's call: only an outage or a crash stops it.
    fn read<'a, T: Send + 'a>(
        &self,
        call: impl FnOnce() -> StoreFuture<'a, T>,
    ) -> StoreFuture<'a, T> {
        match self.up() {
            Ok(()) => self.in_turn(call()),
            Err(why) => down(why),
        }
    }

    /// An engine's write under a lease: the plan decides its fate.
    fn write<'a, T: Send + 'a>(
        &'a self,
        call: impl FnOnce() -> StoreFuture<'a, T>,
    ) -> StoreFuture<'a, T> {
        if let Err(why) = self.up() {
            return down(why);
        }
        let fault = self.plan().write_fault();
        match fault {
            None => self.in_turn(call()),
            Some(WriteFault::Lost) => down("the write was lost"),
            Some(WriteFault::Outage(n)) => {
                self.plan().outage = n;
                down("the store is unavailable")
            }
            Some(WriteFault::CrashBefore) => {
                self.crash();
                down("the engine crashed")
            }
            Some(WriteFault::LandedButFailed) => {
                let landed = self.in_turn(call());
                Box::pin(async move {
                    landed.await?;
                    Err(Error::Unavailable(
                        "simulated fault: the write landed but its answer was lost".into(),
                    ))
                })
            }
            Some(WriteFault::CrashAfter) => {
                let landed = self.in_turn(call());
                Box::pin(async move {
                    let result = landed.await;
                    self.crash();
                    result?;
                    Err(Error::Unavailable(
                        "simulated fault: the engine crashed after the write".into(),
                    ))
                })
            }
        }
    }
}

impl Store for FaultStore {
    fn create(&self, batch: Vec<NewInstance>) -> StoreFuture<'_, Vec<Created>> {
        self.read(|| self.inner.create(batch))
    }

    fn instance(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
    ) -> StoreFuture<'_, Option<InstanceRecord>> {
        let (workflow, id) = (workflow.clone(), id.clone());
        self.read(|| Box::pin(async move { self.inner.instance(&workflow, &id).await }))
    }

    fn list(&self, query: ListQuery) -> StoreFuture<'_, Vec<InstanceRecord>> {
        self.read(|| self.inner.list(query))
    }

    fn count(&self, workflow: &WorkflowName, status: InstanceStatus) -> StoreFuture<'_, u64> {
        let workflow = workflow.clone();
        self.read(|| Box::pin(async move { self.inner.count(&workflow, status).await }))
    }

    fn count_matching(&self, query: ListQuery) -> StoreFuture<'_, u64> {
        self.read(|| self.inner.count_matching(query))
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
        self.read(|| {
            Box::pin(async move { self.inner.claim(&owner, &workflows, now, ttl, limit).await })
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
        self.read(|| Box::pin(async move { self.inner.renew(&owner, leases, now, until).await }))
    }

    fn reclaim(
        &self,
        owner: &str,
        lease: Lease,
        now: Timestamp,
        ttl: Duration,
    ) -> StoreFuture<'_, Lease> {
        let owner = owner.to_owned();
        self.read(|| Box::pin(async move { self.inner.reclaim(&owner, lease, now, ttl).await }))
    }

    fn release_all(&self, owner: &str) -> StoreFuture<'_, ()> {
        let owner = owner.to_owned();
        self.read(|| Box::pin(async move { self.inner.release_all(&owner).await }))
    }

    fn slot_position(&self, instance: InstanceRef) -> StoreFuture<'_, Option<u64>> {
        self.read(|| self.inner.slot_position(instance))
    }

    fn waiting_for_slots(
        &self,
        workflow: &WorkflowName,
        limit: usize,
    ) -> StoreFuture<'_, (Vec<(String, u64)>, u64)> {
        let workflow = workflow.clone();
        self.read(|| Box::pin(async move { self.inner.waiting_for_slots(&workflow, limit).await }))
    }

    fn children(&self, parent: InstanceRef) -> StoreFuture<'_, Vec<InstanceRecord>> {
        self.read(|| self.inner.children(parent))
    }

    fn journal(&self, instance: InstanceRef) -> StoreFuture<'_, Vec<StepRecord>> {
        self.read(|| self.inner.journal(instance))
    }

    fn stream_chunk(
        &self,
        instance: InstanceRef,
        step: StepKey,
        attempt: u32,
        epoch: u64,
        index: u32,
    ) -> StoreFuture<'_, Option<Vec<u8>>> {
        self.read(|| {
            self.inner
                .stream_chunk(instance, step, attempt, epoch, index)
        })
    }

    fn stream_bytes(&self, instance: InstanceRef) -> StoreFuture<'_, u64> {
        self.read(|| self.inner.stream_bytes(instance))
    }

    fn commit(&self, lease: Lease, writes: Vec<Write>) -> StoreFuture<'_, InstanceStatus> {
        self.write(|| self.inner.commit(lease, writes))
    }

    fn control(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
        request: ControlRequest,
    ) -> StoreFuture<'_, ControlOutcome> {
        let (workflow, id) = (workflow.clone(), id.clone());
        self.read(|| Box::pin(async move { self.inner.control(&workflow, &id, request).await }))
    }

    fn log(
        &self,
        instance: InstanceRef,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<LogRecord>> {
        self.read(|| self.inner.log(instance, after, limit))
    }

    fn workflow_log(
        &self,
        workflow: &WorkflowName,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, cairn_store::WorkflowLogPage> {
        let workflow = workflow.clone();
        self.read(|| {
            Box::pin(async move { self.inner.workflow_log(&workflow, after, limit).await })
        })
    }

    fn log_head(&self) -> StoreFuture<'_, u64> {
        self.read(|| self.inner.log_head())
    }

    fn next_ready(&self, workflows: &[WorkflowName]) -> StoreFuture<'_, Option<Timestamp>> {
        let workflows = workflows.to_vec();
        self.read(|| Box::pin(async move { self.inner.next_ready(&workflows).await }))
    }

    fn timers(&self, workflow: &WorkflowName, now: Timestamp) -> StoreFuture<'_, Timers> {
        let workflow = workflow.clone();
        self.read(|| Box::pin(async move { self.inner.timers(&workflow, now).await }))
    }

    fn send_event(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
        event: NewEvent,
    ) -> StoreFuture<'_, Sent> {
        let (workflow, id) = (workflow.clone(), id.clone());
        self.read(|| Box::pin(async move { self.inner.send_event(&workflow, &id, event).await }))
    }

    fn take_event(
        &self,
        lease: Lease,
        step: StepKey,
        event_type: EventType,
        at: Timestamp,
    ) -> StoreFuture<'_, Option<StoredEvent>> {
        self.write(|| self.inner.take_event(lease, step, event_type, at))
    }

    fn purge(&self, now: Timestamp, limit: usize) -> StoreFuture<'_, usize> {
        self.read(|| self.inner.purge(now, limit))
    }

    fn next_purge(&self) -> StoreFuture<'_, Option<Timestamp>> {
        self.read(|| self.inner.next_purge())
    }

    fn create_schedule(&self, schedule: cairn_store::StoredSchedule) -> StoreFuture<'_, bool> {
        self.read(|| self.inner.create_schedule(schedule))
    }

    fn set_schedule_state(
        &self,
        name: &str,
        state: cairn_store::ScheduleState,
    ) -> StoreFuture<'_, bool> {
        let name = name.to_owned();
        self.read(|| Box::pin(async move { self.inner.set_schedule_state(&name, state).await }))
    }

    fn schedules(&self) -> StoreFuture<'_, Vec<cairn_store::StoredSchedule>> {
        self.read(|| self.inner.schedules())
    }

    fn delete_schedule(&self, name: &str) -> StoreFuture<'_, bool> {
        let name = name.to_owned();
        self.read(|| Box::pin(async move { self.inner.delete_schedule(&name).await }))
    }

    fn register_versions(
        &self,
        versions: Vec<cairn_store::WorkflowVersion>,
    ) -> StoreFuture<'_, ()> {
        self.read(|| self.inner.register_versions(versions))
    }

    fn workflow_versions(&self) -> StoreFuture<'_, Vec<cairn_store::WorkflowVersion>> {
        self.read(|| self.inner.workflow_versions())
    }

    fn unfinished_versions(
        &self,
        workflow: &cairn_core::WorkflowName,
    ) -> StoreFuture<'_, Vec<(Option<String>, u64)>> {
        self.read(|| self.inner.unfinished_versions(workflow))
    }

    fn wake_awaiting(
        &self,
        workflow: &cairn_core::WorkflowName,
        version: &str,
    ) -> StoreFuture<'_, u64> {
        self.read(|| self.inner.wake_awaiting(workflow, version))
    }

    fn fire_tick(
        &self,
        tick: cairn_store::ScheduleTick,
    ) -> StoreFuture<'_, cairn_store::TickFired> {
        self.read(|| self.inner.fire_tick(tick))
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        // Even a crashed engine's store lets go of the database, so the next one opens it.
        self.inner.close()
    }
}
