//! The simulator's store: a real store with seeded faults on the engine's writes (commits
//! lost, landed but reported failed, the engine crashing before or after one, or living on
//! as a zombie) and outages (every call fails for a while).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
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
    /// As [`WriteFault::CrashBefore`], but the engine's lifetimes live on for `secs` (virtual)
    /// seconds: this write and their later ones reach the live store once another engine
    /// has claimed the instance, where the fence must refuse them.
    ZombieBefore { secs: u64 },
    /// As [`WriteFault::CrashAfter`] (the write landed, and its answer reaches the engine),
    /// with the lifetimes living on as for [`WriteFault::ZombieBefore`].
    ZombieAfter { secs: u64 },
}

/// Which store faults a run may see, and how often.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreFaults {
    pub(crate) rate: f64,
    pub(crate) lost: bool,
    pub(crate) landed_but_failed: bool,
    pub(crate) crashes: bool,
    pub(crate) zombies: bool,
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
    /// Writes of a crashed engine that the live store accepted: each is a broken fence.
    pub(crate) violations: Vec<String>,
    /// Writes of a crashed engine that the live store refused (the fence held).
    pub(crate) zombie_refused: u64,
    /// Every event send and what the store answered, in order: its idempotency key and
    /// whether the event was buffered.
    pub(crate) sends: Vec<(Option<String>, Sent)>,
    /// Sends the store itself refused (not a simulated fault): a send is answered with an
    /// outcome (buffered, a duplicate, no instance, finished), never an error, so each is
    /// a defect (e.g. a keyed retry that trips over its own key).
    pub(crate) send_errors: Vec<String>,
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
            violations: Vec::new(),
            zombie_refused: 0,
            sends: Vec::new(),
            send_errors: Vec::new(),
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
        match kind {
            WriteFault::Outage(_) => kind = WriteFault::Outage(1 + self.rng.below(8) as u32),
            WriteFault::CrashBefore | WriteFault::CrashAfter
                if faults.zombies && self.rng.chance(0.5) =>
            {
                let secs = 1 + self.rng.below(60);
                kind = if kind == WriteFault::CrashBefore {
                    WriteFault::ZombieBefore { secs }
                } else {
                    WriteFault::ZombieAfter { secs }
                };
            }
            _ => {}
        }
        self.budget -= 1;
        self.injected
            .push(format!("write {}: {kind:?}", self.writes));
        Some(kind)
    }
}

/// Where the calls of a crashed engine's zombie lifetimes go: the run's live store (the
/// current engine's), once a live engine has claimed the instance after the crash.
#[derive(Default)]
pub(crate) struct Live {
    current: Mutex<Option<Arc<FaultStore>>>,
    /// Claims that took an instance, counted over the run's live stores.
    claims: AtomicU64,
    claimed: tokio::sync::Notify,
}

impl Live {
    /// `store` is the run's live store from now on.
    pub(crate) fn set(&self, store: &Arc<FaultStore>) {
        *self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::clone(store));
    }

    fn current(&self) -> Option<Arc<FaultStore>> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// A store's state: up, crashed (every call but `close` fails), or crashed with its
/// engine's lifetimes living on (a zombie).
const ALIVE: u8 = 0;
const DEAD: u8 = 1;
const ZOMBIE: u8 = 2;

/// A store call made for a zombie: whether it is a fenced write (its acceptance breaks the
/// fence) or a read.
#[derive(Clone, Copy)]
enum Zombied {
    Write(&'static str),
    Read,
}

/// A store that injects its run's [`Plan`] into a real one. A crash makes it dead (every
/// call but `close` fails) and tells the simulator, which opens a new engine on a new one.
/// A zombie crash leaves its engine running: its fenced writes and reads wait until a live
/// engine has claimed the instance (or the zombie's time is up) and then go to the live
/// store, where the fence must refuse every write.
///
/// It lets one call through to the real store at a time, in the order they are first
/// awaited (callers await a store call at once): the store's answers then come back in that
/// order too, whatever the threads under it do, so a seed's run takes the same course.
pub(crate) struct FaultStore {
    pub(crate) inner: Arc<dyn Store>,
    pub(crate) plan: Arc<Mutex<Plan>>,
    pub(crate) crashed: Arc<tokio::sync::Notify>,
    live: Arc<Live>,
    state: AtomicU8,
    /// A zombie: how long its engine lives on (seconds), and the live claims counted when
    /// it crashed (its calls wait for a later one).
    zombie_secs: AtomicU64,
    claims_at_crash: AtomicU64,
    /// Set when the zombie's time is up: its calls go through whether or not a claim came.
    released: tokio::sync::watch::Sender<bool>,
    turn: Arc<tokio::sync::Mutex<()>>,
}

/// `call` as a store call for any store it is given (a closure's signature, inferred).
fn store_call<T, F>(call: F) -> F
where
    F: for<'s> FnOnce(&'s dyn Store) -> StoreFuture<'s, T>,
{
    call
}

fn down<'a, T: Send + 'a>(why: &'static str) -> StoreFuture<'a, T> {
    Box::pin(async move { Err(Error::Unavailable(format!("simulated fault: {why}"))) })
}

impl FaultStore {
    pub(crate) fn new(
        inner: Arc<dyn Store>,
        plan: Arc<Mutex<Plan>>,
        crashed: Arc<tokio::sync::Notify>,
        live: Arc<Live>,
    ) -> Self {
        FaultStore {
            inner,
            plan,
            crashed,
            live,
            state: AtomicU8::new(ALIVE),
            zombie_secs: AtomicU64::new(0),
            claims_at_crash: AtomicU64::new(0),
            released: tokio::sync::watch::channel(false).0,
            turn: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    fn plan(&self) -> MutexGuard<'_, Plan> {
        self.plan
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new engine opens after a crash: an outage of a few calls is over by then (it
    /// would otherwise fail the new engine's start, which is not a fault of the engine).
    pub(crate) fn end_outage(&self) {
        self.plan().outage = 0;
    }

    /// Whether a call may go through now (not dead, no outage).
    fn up(&self) -> Result<(), &'static str> {
        if self.state.load(Ordering::SeqCst) != ALIVE {
            return Err("the engine crashed");
        }
        let mut plan = self.plan();
        if plan.outage > 0 {
            plan.outage -= 1;
            return Err("the store is unavailable");
        }
        Ok(())
    }

    /// Whether this store's engine crashed (as a zombie or not).
    pub(crate) fn is_dead(&self) -> bool {
        self.state.load(Ordering::SeqCst) != ALIVE
    }

    /// How long this store's engine lives on after its crash, if it is a zombie.
    pub(crate) fn zombie_for(&self) -> Option<Duration> {
        (self.state.load(Ordering::SeqCst) == ZOMBIE)
            .then(|| Duration::from_secs(self.zombie_secs.load(Ordering::SeqCst)))
    }

    /// The zombie's time is up: its calls waiting for a claim go through now.
    pub(crate) fn release_zombie(&self) {
        self.released.send_replace(true);
    }

    fn crash(&self) {
        self.state.store(DEAD, Ordering::SeqCst);
        self.crashed.notify_one();
    }

    fn become_zombie(&self, secs: u64) {
        self.zombie_secs.store(secs, Ordering::SeqCst);
        self.claims_at_crash
            .store(self.live.claims.load(Ordering::SeqCst), Ordering::SeqCst);
        self.state.store(ZOMBIE, Ordering::SeqCst);
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

    /// A read, or a client's call: only an outage or a crash stops it. A zombie's read
    /// (`zombie`) goes to the live store.
    fn read<T, F>(&self, zombie: bool, call: F) -> StoreFuture<'_, T>
    where
        T: Send + 'static,
        F: for<'s> FnOnce(&'s dyn Store) -> StoreFuture<'s, T> + Send + 'static,
    {
        if zombie && self.zombie_for().is_some() {
            return self.zombie(Zombied::Read, call);
        }
        match self.up() {
            Ok(()) => self.in_turn(call(&*self.inner)),
            Err(why) => down(why),
        }
    }

    /// An engine's write under a lease: the plan decides its fate. A zombie's goes to the
    /// live store.
    fn write<T, F>(&self, what: &'static str, call: F) -> StoreFuture<'_, T>
    where
        T: Send + 'static,
        F: for<'s> FnOnce(&'s dyn Store) -> StoreFuture<'s, T> + Send + 'static,
    {
        if self.zombie_for().is_some() {
            return self.zombie(Zombied::Write(what), call);
        }
        if let Err(why) = self.up() {
            return down(why);
        }
        let fault = self.plan().write_fault();
        match fault {
            None => self.in_turn(call(&*self.inner)),
            Some(WriteFault::Lost) => down("the write was lost"),
            Some(WriteFault::Outage(n)) => {
                self.plan().outage = n;
                down("the store is unavailable")
            }
            Some(WriteFault::CrashBefore) => {
                self.crash();
                down("the engine crashed")
            }
            Some(WriteFault::ZombieBefore { secs }) => {
                self.become_zombie(secs);
                self.zombie(Zombied::Write(what), call)
            }
            Some(WriteFault::LandedButFailed) => {
                let landed = self.in_turn(call(&*self.inner));
                Box::pin(async move {
                    landed.await?;
                    Err(Error::Unavailable(
                        "simulated fault: the write landed but its answer was lost".into(),
                    ))
                })
            }
            Some(WriteFault::CrashAfter) => {
                let landed = self.in_turn(call(&*self.inner));
                Box::pin(async move {
                    let result = landed.await;
                    self.crash();
                    result?;
                    Err(Error::Unavailable(
                        "simulated fault: the engine crashed after the write".into(),
                    ))
                })
            }
            Some(WriteFault::ZombieAfter { secs }) => {
                // The write lands and the engine hears so: it goes on as if nothing happened,
                // while another engine takes the instance over.
                let landed = self.in_turn(call(&*self.inner));
                Box::pin(async move {
                    let result = landed.await;
                    self.become_zombie(secs);
                    result
                })
            }
        }
    }

    /// A zombie's call: it waits until a live engine has claimed an instance since the
    /// crash (or the zombie's time is up), then goes to the live store in its turn. A write
    /// the live store accepts is a broken fence, recorded in the plan.
    fn zombie<T, F>(&self, what: Zombied, call: F) -> StoreFuture<'_, T>
    where
        T: Send + 'static,
        F: for<'s> FnOnce(&'s dyn Store) -> StoreFuture<'s, T> + Send + 'static,
    {
        let mut released = self.released.subscribe();
        Box::pin(async move {
            let since = self.claims_at_crash.load(Ordering::SeqCst);
            loop {
                // Listen before looking, so a claim in between is not missed.
                let claimed = self.live.claimed.notified();
                let mut claimed = std::pin::pin!(claimed);
                claimed.as_mut().enable();
                if *released.borrow_and_update() || self.live.claims.load(Ordering::SeqCst) > since
                {
                    break;
                }
                tokio::select! {
                    () = claimed => {}
                    _ = released.changed() => {}
                }
            }
            let Some(live) = self.live.current() else {
                return Err(Error::Unavailable("simulated fault: no live store".into()));
            };
            let inner = Arc::clone(&live.inner);
            let answer = live.in_turn(call(&*inner)).await;
            if let Zombied::Write(what) = what {
                let mut plan = self.plan();
                match &answer {
                    Ok(_) => plan.violations.push(format!(
                        "a crashed engine's {what} was accepted after another engine claimed the instance"
                    )),
                    Err(Error::LeaseLost(_) | Error::NotFound(_)) => plan.zombie_refused += 1,
                    Err(_) => {}
                }
            }
            answer
        })
    }

    /// Counts a claim that took an instance: zombies waiting for one go on.
    fn claimed(&self, claimed: &[Claimed]) {
        if !claimed.is_empty() {
            self.live.claims.fetch_add(1, Ordering::SeqCst);
            self.live.claimed.notify_waiters();
        }
    }
}

impl Store for FaultStore {
    fn create(&self, batch: Vec<NewInstance>) -> StoreFuture<'_, Vec<Created>> {
        self.read(false, move |s| s.create(batch))
    }

    fn instance(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
    ) -> StoreFuture<'_, Option<InstanceRecord>> {
        let (workflow, id) = (workflow.clone(), id.clone());
        self.read(true, move |s| {
            Box::pin(async move { s.instance(&workflow, &id).await })
        })
    }

    fn list(&self, query: ListQuery) -> StoreFuture<'_, Vec<InstanceRecord>> {
        self.read(false, move |s| s.list(query))
    }

    fn count(&self, workflow: &WorkflowName, status: InstanceStatus) -> StoreFuture<'_, u64> {
        let workflow = workflow.clone();
        self.read(false, move |s| {
            Box::pin(async move { s.count(&workflow, status).await })
        })
    }

    fn count_matching(&self, query: ListQuery) -> StoreFuture<'_, u64> {
        self.read(false, move |s| s.count_matching(query))
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
        let claim = self.read(false, move |s| {
            Box::pin(async move { s.claim(&owner, &workflows, now, ttl, limit).await })
        });
        Box::pin(async move {
            let claimed = claim.await?;
            self.claimed(&claimed);
            Ok(claimed)
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
        self.read(false, move |s| {
            Box::pin(async move { s.renew(&owner, leases, now, until).await })
        })
    }

    fn reclaim(
        &self,
        owner: &str,
        lease: Lease,
        now: Timestamp,
        ttl: Duration,
    ) -> StoreFuture<'_, Lease> {
        let owner = owner.to_owned();
        let call =
            store_call(move |s| Box::pin(async move { s.reclaim(&owner, lease, now, ttl).await }));
        if self.zombie_for().is_some() {
            // A zombie taking its lease back after a failed write: the fence must refuse.
            return self.zombie(Zombied::Write("reclaim"), call);
        }
        self.read(false, call)
    }

    fn release_all(&self, owner: &str) -> StoreFuture<'_, ()> {
        let owner = owner.to_owned();
        self.read(false, move |s| {
            Box::pin(async move { s.release_all(&owner).await })
        })
    }

    fn slot_position(&self, instance: InstanceRef) -> StoreFuture<'_, Option<u64>> {
        self.read(true, move |s| s.slot_position(instance))
    }

    fn waiting_for_slots(
        &self,
        workflow: &WorkflowName,
        limit: usize,
    ) -> StoreFuture<'_, (Vec<(String, u64)>, u64)> {
        let workflow = workflow.clone();
        self.read(false, move |s| {
            Box::pin(async move { s.waiting_for_slots(&workflow, limit).await })
        })
    }

    fn children(&self, parent: InstanceRef) -> StoreFuture<'_, Vec<InstanceRecord>> {
        self.read(true, move |s| s.children(parent))
    }

    fn journal(&self, instance: InstanceRef) -> StoreFuture<'_, Vec<StepRecord>> {
        self.read(true, move |s| s.journal(instance))
    }

    fn stream_chunk(
        &self,
        instance: InstanceRef,
        step: StepKey,
        attempt: u32,
        epoch: u64,
        index: u32,
    ) -> StoreFuture<'_, Option<Vec<u8>>> {
        self.read(true, move |s| {
            s.stream_chunk(instance, step, attempt, epoch, index)
        })
    }

    fn stream_bytes(&self, instance: InstanceRef) -> StoreFuture<'_, u64> {
        self.read(true, move |s| s.stream_bytes(instance))
    }

    fn commit(&self, lease: Lease, writes: Vec<Write>) -> StoreFuture<'_, InstanceStatus> {
        self.write("commit", move |s| s.commit(lease, writes))
    }

    fn control(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
        request: ControlRequest,
    ) -> StoreFuture<'_, ControlOutcome> {
        let (workflow, id) = (workflow.clone(), id.clone());
        self.read(false, move |s| {
            Box::pin(async move { s.control(&workflow, &id, request).await })
        })
    }

    fn log(
        &self,
        instance: InstanceRef,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<LogRecord>> {
        self.read(true, move |s| s.log(instance, after, limit))
    }

    fn workflow_log(
        &self,
        workflow: &WorkflowName,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, cairn_store::WorkflowLogPage> {
        let workflow = workflow.clone();
        self.read(false, move |s| {
            Box::pin(async move { s.workflow_log(&workflow, after, limit).await })
        })
    }

    fn log_head(&self) -> StoreFuture<'_, u64> {
        self.read(false, |s| s.log_head())
    }

    fn next_ready(&self, workflows: &[WorkflowName]) -> StoreFuture<'_, Option<Timestamp>> {
        let workflows = workflows.to_vec();
        self.read(false, move |s| {
            Box::pin(async move { s.next_ready(&workflows).await })
        })
    }

    fn timers(&self, workflow: &WorkflowName, now: Timestamp) -> StoreFuture<'_, Timers> {
        let workflow = workflow.clone();
        self.read(false, move |s| {
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
        let key = event.idempotency_key.clone();
        let send = self.read(false, move |s| {
            Box::pin(async move { s.send_event(&workflow, &id, event).await })
        });
        // The simulator accounts for every event sent: what the store answered each send.
        Box::pin(async move {
            match send.await {
                Ok(sent) => {
                    self.plan().sends.push((key, sent));
                    Ok(sent)
                }
                Err(e) => {
                    if !e.to_string().contains("simulated fault") {
                        self.plan()
                            .send_errors
                            .push(format!("a send with key {key:?}: {e}"));
                    }
                    Err(e)
                }
            }
        })
    }

    fn take_event(
        &self,
        lease: Lease,
        step: StepKey,
        event_type: EventType,
        at: Timestamp,
    ) -> StoreFuture<'_, Option<StoredEvent>> {
        self.write("take_event", move |s| {
            s.take_event(lease, step, event_type, at)
        })
    }

    fn purge(&self, now: Timestamp, limit: usize) -> StoreFuture<'_, usize> {
        self.read(false, move |s| s.purge(now, limit))
    }

    fn next_purge(&self) -> StoreFuture<'_, Option<Timestamp>> {
        self.read(false, |s| s.next_purge())
    }

    fn create_schedule(&self, schedule: cairn_store::StoredSchedule) -> StoreFuture<'_, bool> {
        self.read(false, move |s| s.create_schedule(schedule))
    }

    fn set_schedule_state(
        &self,
        name: &str,
        state: cairn_store::ScheduleState,
    ) -> StoreFuture<'_, bool> {
        let name = name.to_owned();
        self.read(false, move |s| {
            Box::pin(async move { s.set_schedule_state(&name, state).await })
        })
    }

    fn schedules(&self) -> StoreFuture<'_, Vec<cairn_store::StoredSchedule>> {
        self.read(false, |s| s.schedules())
    }

    fn delete_schedule(&self, name: &str, declared: bool) -> StoreFuture<'_, bool> {
        let name = name.to_owned();
        self.read(false, move |s| {
            Box::pin(async move { s.delete_schedule(&name, declared).await })
        })
    }

    fn register_versions(
        &self,
        versions: Vec<cairn_store::WorkflowVersion>,
    ) -> StoreFuture<'_, ()> {
        self.read(false, move |s| s.register_versions(versions))
    }

    fn workflow_versions(&self) -> StoreFuture<'_, Vec<cairn_store::WorkflowVersion>> {
        self.read(false, |s| s.workflow_versions())
    }

    fn unfinished_versions(
        &self,
        workflow: &cairn_core::WorkflowName,
    ) -> StoreFuture<'_, Vec<(Option<String>, u64)>> {
        let workflow = workflow.clone();
        self.read(false, move |s| {
            Box::pin(async move { s.unfinished_versions(&workflow).await })
        })
    }

    fn wake_awaiting(
        &self,
        workflow: &cairn_core::WorkflowName,
        version: &str,
        limit: u64,
    ) -> StoreFuture<'_, u64> {
        let (workflow, version) = (workflow.clone(), version.to_owned());
        self.read(false, move |s| {
            Box::pin(async move { s.wake_awaiting(&workflow, &version, limit).await })
        })
    }

    fn fire_tick(
        &self,
        tick: cairn_store::ScheduleTick,
    ) -> StoreFuture<'_, cairn_store::TickFired> {
        self.read(false, move |s| s.fire_tick(tick))
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        // Even a crashed engine's store lets go of the database, so the next one opens it.
        self.inner.close()
    }
}
