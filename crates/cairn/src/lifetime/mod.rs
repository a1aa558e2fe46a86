//! The state of one run lifetime of an instance: the journal loaded at its start, the name
//! counters that give each op its identity, and the commit path that fences every write.
//!
//! Identity is `(kind, name, count)`, claimed synchronously when an op is *created*, so
//! concurrent ops replay deterministically whatever order they are polled in.

mod answer;
mod current;

pub(crate) use current::{CURRENT, is_current};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cairn_core::{
    EventType, InstanceId, InstanceStatus, LogEntry, LogKind, StepKey, StepKind, StepName,
    StepRecord, StepState, Timestamp, WorkflowName,
};
use cairn_store::{Lease, Write};
use tokio::sync::Notify;

use crate::env::Env;
use crate::failure::WorkflowError;
use answer::{Answer, SharedAnswer};

/// Why a run lifetime must stop: its writes can no longer land.
#[derive(Debug, Clone)]
pub(crate) enum Abort {
    /// The store refused or failed a write.
    Store(cairn_store::Error),
    /// A user terminated, restarted or deleted the instance.
    Stopped,
    /// Engine code panicked inside the workflow's future (an op), or a worker broke the
    /// protocol about its run; the message.
    Panic(String),
    /// The worker running the instance's code went away (`engine/workers`).
    WorkerLost,
}

pub(crate) struct Lifetime {
    pub(crate) env: Arc<Env>,
    pub(crate) lease: Lease,
    /// Since when the lease holds for the TTL (ms): the `now` the claim counted it from,
    /// moved on by each renewal that kept it (`engine/leases.rs`).
    lease_from: AtomicI64,
    pub(crate) workflow: WorkflowName,
    pub(crate) instance_id: InstanceId,
    pub(crate) created_at: Timestamp,
    /// When the instance first started (set by the driver at the first start).
    started_at: std::sync::OnceLock<Timestamp>,
    /// See [`Lifetime::idempotency_prefix`].
    idempotency_prefix: std::sync::OnceLock<String>,
    inner: Mutex<Inner>,
    abort: Mutex<Option<Abort>>,
    aborted: Notify,
    /// Notified when an event is sent to this instance.
    pub(crate) events: Notify,
    /// Whether a pause is pending (bit 0: no new attempts start, and completed ops do not
    /// return), and how many times it changed or a pause or resume was told (the bits
    /// above): one value, so that a late answer's change and a telling meanwhile cannot
    /// interleave ([`Lifetime::observe_read`]).
    pause: AtomicU64,
    /// The engine is shutting down (see [`Lifetime::start_draining`]).
    draining: AtomicBool,
    /// The worker running the code went away (`Abort::WorkerLost` was the abort): the gate
    /// is closed for good from that moment, before the driver notices.
    worker_lost: AtomicBool,
    /// Wakes the driver when the pause state changes, or a commit of an op is done.
    pub(crate) control: Arc<Notify>,
    /// Commits on their way (see [`Lifetime::committing`]).
    flights: Arc<Flights>,
    /// Wakes ops held at the pause gate when a pause is cancelled.
    resumed: Notify,
    /// Whether steps started together queue their starts in start order (a run on a
    /// worker; see [`Lifetime::start_in_call_order`]).
    in_call_order: AtomicBool,
    /// First attempts waiting to queue their start, by start-order number; see
    /// [`Lifetime::start_in_turn`].
    starting: Mutex<std::collections::BTreeSet<u32>>,
    /// Wakes them when one of them has queued its start (or was dropped).
    turn: Notify,
    /// Attempts whose outcome is not recorded yet.
    in_flight: AtomicUsize,
    /// Forward, rollback-registration replay, or rollback.
    phase: std::sync::atomic::AtomicU8,
    /// Writes that could not or need not be made where they arose (an op dropped by the
    /// workflow cannot await a commit; a sleep's completion is no effect worth a commit of
    /// its own): they ride along with this lifetime's next commit, which the driver makes
    /// as soon as the workflow is pending without one.
    deferred: Mutex<Deferred>,
    /// The batch of deferred writes that records the instance's first start, until a
    /// commit carrying it has landed (0: none waits).
    first_start: AtomicU64,
    /// The commits that took deferred writes along and are not known to have landed (a
    /// failed one stays): a commit answers only once those carrying what was deferred
    /// before it was made have landed, and is sent only then unless it merely starts an
    /// attempt (see [`Lifetime::commit_now`]).
    carriers: Mutex<Vec<Arc<Carrier>>>,
    /// The instance has started children (`invoke`): when it ends, the unfinished ones are
    /// ended with it.
    invoked: AtomicBool,
    /// A replay check (`engine/check.rs`): a registration replay that notes what it sees
    /// (see [`Seen`]) and parks at a sleep with no record.
    checking: AtomicBool,
    seen: Mutex<Seen>,
    /// What the instance's stream chunks held in the store when a stream step of this
    /// lifetime first looked, and what this lifetime has written since: its storage, as the
    /// limit counts it (`ops/stream.rs`).
    stream_base: tokio::sync::OnceCell<u64>,
    stream_written: std::sync::atomic::AtomicU64,
    /// Of `stream_written`, what each stream step took in since its chunks were last
    /// dropped: what a failed attempt's drop gives back.
    stream_by_step: Mutex<HashMap<StepKey, u64>>,
    /// Stream chunks read (progress, for the replay check and the rollback registration).
    reads: AtomicUsize,
    /// The instance's end is committed.
    finished: AtomicBool,
    /// A commit's answer was left undecided by a pause or resume told while it was on its
    /// way: the driver reads the status again ([`Lifetime::take_undecided`]).
    undecided: AtomicBool,
}

/// What a replay in registration mode saw of the journal: the records it took, in order;
/// the ops it reached that have no record (new work); the records whose stored outcome the
/// code no longer reads. The replay check (`engine/check.rs`) reports from it.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Every op created (claimed), polled or not.
    pub(crate) claimed: std::collections::HashSet<StepKey>,
    pub(crate) taken: Vec<(StepKey, u32)>,
    pub(crate) new_work: Vec<StepKey>,
    pub(crate) mismatches: Vec<(StepKey, String)>,
}

const FORWARD: u8 = 0;
const REGISTERING: u8 = 1;
const ROLLING_BACK: u8 = 2;

struct Inner {
    journal: HashMap<StepKey, StepRecord>,
    counters: HashMap<(StepKind, String), u32>,
    next_seq: u32,
    run_calls: u32,
    /// Ops doing work now: running a body, committing, or not yet in a durable wait.
    active: usize,
    /// Durable waits in progress, by registration id.
    waits: HashMap<u64, Wait>,
    next_wait: u64,
    /// Waits created so far, by event type (a test's mocked events go by this order).
    waits_by_type: HashMap<EventType, usize>,
}

/// A durable wait an op is blocked on: it ends at `wake_at`, or earlier when an event of
/// `event_type` arrives or the child instance `child` ends.
#[derive(Debug, Clone)]
pub(crate) struct Wait {
    pub(crate) wake_at: Timestamp,
    pub(crate) event_type: Option<EventType>,
    pub(crate) child: Option<cairn_store::InstanceRef>,
}

/// What the driver records when it hibernates the instance.
#[derive(Debug, Clone)]
pub(crate) struct Hibernation {
    pub(crate) wake_at: Timestamp,
    pub(crate) event_types: Vec<EventType>,
    pub(crate) children: Vec<cairn_store::InstanceRef>,
}

impl Lifetime {
    pub(crate) fn new(
        env: Arc<Env>,
        lease: Lease,
        claimed_at: Timestamp,
        workflow: WorkflowName,
        instance_id: InstanceId,
        created_at: Timestamp,
    ) -> Self {
        let control = Arc::new(Notify::new());
        Lifetime {
            lease_from: AtomicI64::new(claimed_at.as_millis()),
            env,
            lease,
            workflow,
            instance_id,
            created_at,
            started_at: std::sync::OnceLock::new(),
            idempotency_prefix: std::sync::OnceLock::new(),
            inner: Mutex::new(Inner {
                journal: HashMap::new(),
                counters: HashMap::new(),
                next_seq: 1,
                run_calls: 0,
                active: 0,
                waits: HashMap::new(),
                next_wait: 0,
                waits_by_type: HashMap::new(),
            }),
            abort: Mutex::new(None),
            aborted: Notify::new(),
            events: Notify::new(),
            pause: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            worker_lost: AtomicBool::new(false),
            control: Arc::clone(&control),
            flights: Arc::new(Flights {
                n: AtomicUsize::new(0),
                watched: AtomicBool::new(false),
                wake: control,
            }),
            resumed: Notify::new(),
            in_call_order: AtomicBool::new(false),
            starting: Mutex::default(),
            turn: Notify::new(),
            in_flight: AtomicUsize::new(0),
            phase: std::sync::atomic::AtomicU8::new(FORWARD),
            deferred: Mutex::new(Deferred::default()),
            first_start: AtomicU64::new(0),
            carriers: Mutex::new(Vec::new()),
            invoked: AtomicBool::new(false),
            checking: AtomicBool::new(false),
            seen: Mutex::new(Seen::default()),
            stream_base: tokio::sync::OnceCell::new(),
            stream_written: std::sync::atomic::AtomicU64::new(0),
            stream_by_step: Mutex::new(HashMap::new()),
            reads: AtomicUsize::new(0),
            finished: AtomicBool::new(false),
            undecided: AtomicBool::new(false),
        }
    }

    /// For a unit test: a lifetime of instance `w/i` (row 7) under lease `epoch`.
    #[cfg(test)]
    pub(crate) fn for_tests(env: &Arc<Env>, epoch: u64) -> Self {
        Lifetime::new(
            Arc::clone(env),
            Lease {
                instance: cairn_store::InstanceRef(7),
                epoch,
            },
            Timestamp::from_millis(0),
            WorkflowName::new("w").unwrap(),
            InstanceId::new("i").unwrap(),
            Timestamp::from_millis(0),
        )
    }

    /// The instance's end is committed (the driver's last write).
    pub(crate) fn set_finished(&self) {
        self.finished.store(true, Ordering::SeqCst);
    }

    pub(crate) fn finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }

    /// Replays only to see where the code fits the journal (the replay check): a
    /// registration replay that notes what it meets.
    pub(crate) fn start_checking(&self) {
        self.checking.store(true, Ordering::SeqCst);
        self.start_registering();
    }

    pub(crate) fn checking(&self) -> bool {
        self.checking.load(Ordering::SeqCst)
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// In a registration replay: an op with no record was reached (it would start work).
    pub(crate) fn note_new_work(&self, key: &StepKey) {
        if self.checking() {
            self.seen().new_work.push(key.clone());
        }
    }

    /// In a registration replay: the stored outcome of `key` does not read as the code
    /// expects (`message` says how).
    pub(crate) fn note_mismatch(&self, key: &StepKey, message: String) {
        if self.checking() {
            self.seen().mismatches.push((key.clone(), message));
        }
    }

    /// How far the replay check has come: ops created, records taken.
    pub(crate) fn progress(&self) -> usize {
        let seen = self.seen();
        seen.claimed.len() + seen.taken.len() + self.reads.load(Ordering::SeqCst)
    }

    /// A stream chunk is being read: the run moves on.
    pub(crate) fn note_read(&self) {
        self.reads.fetch_add(1, Ordering::SeqCst);
    }

    /// The bytes of the instance's stream chunks, as far as this lifetime knows: what the
    /// store held at its first look, and what its streams took in since, written or still
    /// buffered, less what a failed attempt's drop of its chunks gave back (chunks of an
    /// earlier lifetime that such a drop removed still count: the limit errs on the safe
    /// side until the next lifetime looks again). A store
    /// that cannot answer stops the run, as a failed commit does.
    pub(crate) async fn stream_storage_used(&self) -> u64 {
        let store = &self.env.store;
        let instance = self.lease.instance;
        let base = match self
            .stream_base
            .get_or_try_init(|| store.stream_bytes(instance))
            .await
        {
            Ok(base) => *base,
            Err(e) => {
                self.abort(Abort::Store(e));
                return std::future::pending().await;
            }
        };
        base.saturating_add(self.stream_written.load(Ordering::SeqCst))
    }

    /// The stream of `step` took in `bytes` more, to be stored in its chunks.
    pub(crate) fn stream_taken(&self, step: &StepKey, bytes: u64) {
        self.stream_written.fetch_add(bytes, Ordering::SeqCst);
        *self
            .stream_by_step
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(step.clone())
            .or_default() += bytes;
    }

    /// A commit dropping every chunk of `step` (its attempt failed) has landed: what its
    /// stream took in is no longer stored, and a retry is not charged for it.
    pub(crate) fn stream_dropped(&self, step: &StepKey) {
        let given_back = self
            .stream_by_step
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(step)
            .unwrap_or_default();
        self.stream_written.fetch_sub(given_back, Ordering::SeqCst);
    }

    /// What the replay check saw, and the journal records of ops it never created.
    pub(crate) fn take_seen(&self) -> (Seen, Vec<StepRecord>) {
        let seen = std::mem::take(&mut *self.seen());
        let untaken = self
            .inner()
            .journal
            .values()
            .filter(|r| !seen.claimed.contains(&r.key))
            .cloned()
            .collect();
        (seen, untaken)
    }

    /// Notes that the instance has started a child (or may have: an `invoke` step is in
    /// its journal).
    pub(crate) fn set_invoked(&self) {
        self.invoked.store(true, Ordering::SeqCst);
    }

    /// Whether the instance may have children.
    pub(crate) fn invoked(&self) -> bool {
        self.invoked.load(Ordering::SeqCst)
    }

    /// Loads the journal this lifetime replays against; called once, before `run`.
    pub(crate) fn load_journal(&self, journal: Vec<StepRecord>) {
        if journal.iter().any(|s| s.key.kind == StepKind::Invoke) {
            self.set_invoked();
        }
        let mut inner = self.inner();
        inner.next_seq = journal.iter().map(|s| s.seq).max().unwrap_or(0) + 1;
        inner.journal = journal.into_iter().map(|s| (s.key.clone(), s)).collect();
    }

    /// Replays `run` only to register rollback handlers: ops return stored outcomes and
    /// start nothing (SPEC §4.6).
    pub(crate) fn start_registering(&self) {
        self.phase.store(REGISTERING, Ordering::SeqCst);
    }

    pub(crate) fn registering(&self) -> bool {
        self.phase.load(Ordering::SeqCst) == REGISTERING
    }

    /// From now on, new step ops are refused.
    pub(crate) fn enter_rollback_phase(&self) {
        self.phase.store(ROLLING_BACK, Ordering::SeqCst);
    }

    /// Whether no op is doing work (all are parked or waiting).
    pub(crate) fn idle(&self) -> bool {
        self.inner().active == 0
    }

    /// Learns the instance's status when nothing else can have been told yet (the claim's
    /// read, on a new lifetime): a pending pause starts pausing; none stops it.
    pub(crate) fn observe(&self, status: InstanceStatus) {
        match status {
            InstanceStatus::WaitingForPause => self.set_pausing(true),
            InstanceStatus::Running if self.pausing() => self.set_pausing(false),
            _ => {}
        }
    }

    /// Learns a status read (a commit's answer, a read of the instance) that began when
    /// [`Lifetime::tellings`] was `told`. A read that agrees with what the lifetime knows
    /// changes nothing (every step's answer, as a rule: a plain load on the hot path). One
    /// that would change it (a `running` that cancels the pending pause, a
    /// `waitingForPause` that starts one) is taken only if nothing was told since it
    /// began: told after, a pause or a resume may be newer than it, or older, and no one
    /// can say which. `None` then: a read begun now decides
    /// ([`Lifetime::learn_stored_status`]). Otherwise the status as learnt.
    pub(crate) fn observe_read(&self, status: InstanceStatus, told: u64) -> Option<InstanceStatus> {
        let pausing = match status {
            InstanceStatus::WaitingForPause => true,
            InstanceStatus::Running => false,
            _ => return Some(status),
        };
        let now = self.pause.load(Ordering::SeqCst);
        if (now & 1 == 1) == pausing {
            return Some(status);
        }
        if now >> 1 != told {
            return None;
        }
        let to = ((told + 1) << 1) | u64::from(pausing);
        self.pause
            .compare_exchange(now, to, Ordering::SeqCst, Ordering::SeqCst)
            .ok()?;
        self.pause_state_changed(pausing);
        Some(status)
    }

    /// How many times the pause state changed, or a pause or resume was told, so far:
    /// taken when a status read begins, to tell its answer's age
    /// ([`Lifetime::observe_read`]).
    pub(crate) fn tellings(&self) -> u64 {
        self.pause.load(Ordering::SeqCst) >> 1
    }

    pub(crate) fn set_pausing(&self, pausing: bool) {
        let _ = self
            .pause
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(((v >> 1) + 1) << 1 | u64::from(pausing))
            });
        self.pause_state_changed(pausing);
    }

    /// Wakes what waits on the pause state: the ops held at the gate once it opens, and
    /// the driver.
    fn pause_state_changed(&self, pausing: bool) {
        if !pausing {
            self.resumed.notify_waiters();
        }
        self.control.notify_one();
    }

    pub(crate) fn pausing(&self) -> bool {
        self.pause.load(Ordering::SeqCst) & 1 == 1
    }

    /// The engine is shutting down: the pause gate closes for good, attempts in flight
    /// finish and commit, and then the lifetime is dropped.
    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.control.notify_one();
    }

    pub(crate) fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// The worker running the code went away: no attempt starts, and the driver settles
    /// what the worker's answers left before the instance runs again elsewhere.
    pub(crate) fn worker_lost(&self) -> bool {
        self.worker_lost.load(Ordering::SeqCst)
    }

    /// No attempt may start now: a pause is pending, the engine is draining, or the
    /// worker has gone.
    fn gate_closed(&self) -> bool {
        self.pausing() || self.draining() || self.worker_lost()
    }

    /// Attempts started and not yet recorded.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub(crate) fn attempt_started(&self) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn attempt_ended(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// Holds an op at a step boundary while a pause is pending; returns when it is
    /// cancelled. (If the pause takes effect, the lifetime is dropped while waiting here.)
    pub(crate) async fn pause_gate(&self) {
        // No pause pending (the common case): no waiter to register and take back, which
        // cost two locks of `resumed` at each of a step's three gates.
        if !self.gate_closed() {
            return;
        }
        loop {
            let resumed = self.resumed.notified();
            let mut resumed = std::pin::pin!(resumed);
            resumed.as_mut().enable();
            if !self.gate_closed() {
                return;
            }
            self.control.notify_one();
            resumed.await;
        }
    }

    /// Marks an op as doing work until the returned guard is dropped or suspended.
    pub(crate) fn activity(self: &Arc<Self>) -> Activity {
        self.inner().active += 1;
        Activity {
            state: Arc::clone(self),
            suspended: None,
        }
    }

    /// If every op is blocked on a durable wait, when the instance would wake by itself and
    /// which events would wake it earlier. Called by the driver right after the workflow
    /// future returned `Pending`.
    pub(crate) fn hibernation(&self) -> Option<Hibernation> {
        let inner = self.inner();
        if inner.active > 0 || inner.waits.is_empty() {
            return None;
        }
        let wake_at = inner.waits.values().map(|w| w.wake_at).min()?;
        let mut event_types: Vec<EventType> = inner
            .waits
            .values()
            .filter_map(|w| w.event_type.clone())
            .collect();
        event_types.sort();
        event_types.dedup();
        let mut children: Vec<cairn_store::InstanceRef> =
            inner.waits.values().filter_map(|w| w.child).collect();
        children.sort();
        children.dedup();
        Some(Hibernation {
            wake_at,
            event_types,
            children,
        })
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
        if self.phase.load(Ordering::SeqCst) == ROLLING_BACK {
            return Err(WorkflowError::new(
                crate::failure::ERROR,
                "Cannot execute steps during rollback phase",
            ));
        }
        let name = StepName::new(name)
            .map_err(|e| WorkflowError::new(crate::failure::ERROR, e.to_string()))?;
        let mut inner = self.inner();
        if matches!(kind, StepKind::Run | StepKind::Invoke) {
            inner.run_calls += 1;
            let limit = self.env.limits.step_limit;
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
        let key = StepKey {
            kind,
            name: name.as_str().to_owned(),
            count: *counter,
        };
        drop(inner);
        if self.checking() {
            // An op the code creates is reached, whether or not it is polled (the loser of
            // a `select!` whose winner answers from the journal is not).
            self.seen().claimed.insert(key.clone());
        }
        Ok(key)
    }

    /// The instance, as a test's hooks look it up.
    pub(crate) fn who(&self) -> crate::hooks::Who<'_> {
        crate::hooks::Who {
            workflow: &self.workflow,
            id: &self.instance_id,
            instance: self.lease.instance,
        }
    }

    /// How many waits for `event_type` this run created before this one (0 for the first).
    pub(crate) fn wait_ordinal(&self, event_type: &EventType) -> usize {
        let mut inner = self.inner();
        let n = inner.waits_by_type.entry(event_type.clone()).or_insert(0);
        *n += 1;
        *n - 1
    }

    /// Whether `key`'s record is still untaken: no op of this lifetime's run has reached
    /// it (after a registration replay: the replay stopped before it).
    pub(crate) fn unreached(&self, key: &StepKey) -> bool {
        self.inner().journal.contains_key(key)
    }

    /// The stored record for `key`, if this instance has one. Each key is claimed once per
    /// lifetime, so the record is handed over rather than copied.
    pub(crate) fn take_record(&self, key: &StepKey) -> Option<StepRecord> {
        let record = self.inner().journal.remove(key);
        if let Some(r) = &record
            && self.checking()
        {
            self.seen().taken.push((key.clone(), r.seq));
        }
        record
    }

    /// The next start-order number.
    pub(crate) fn next_seq(&self) -> u32 {
        let mut inner = self.inner();
        let seq = inner.next_seq;
        inner.next_seq += 1;
        seq
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.env.clock.now()
    }

    /// A lifecycle record for `step` at the current time.
    pub(crate) fn log(
        &self,
        kind: LogKind,
        step: Option<&StepKey>,
        meta: serde_json::Value,
    ) -> Write {
        Write::Log(self.log_entry(kind, step, meta))
    }

    /// [`Lifetime::log`] at `at`: for the records of one moment (a step's start, its
    /// success), which then read the clock once between them.
    pub(crate) fn log_at(
        &self,
        kind: LogKind,
        step: Option<&StepKey>,
        meta: serde_json::Value,
        at: Timestamp,
    ) -> Write {
        Write::Log(Self::entry_at(kind, step, meta, at))
    }

    /// The record [`Lifetime::log`] writes, for writes that carry their own record.
    pub(crate) fn log_entry(
        &self,
        kind: LogKind,
        step: Option<&StepKey>,
        meta: serde_json::Value,
    ) -> LogEntry {
        Self::entry_at(kind, step, meta, self.now())
    }

    fn entry_at(
        kind: LogKind,
        step: Option<&StepKey>,
        meta: serde_json::Value,
        at: Timestamp,
    ) -> LogEntry {
        LogEntry {
            kind,
            at,
            step: step.cloned(),
            meta,
        }
    }

    /// Commits `writes` under this lifetime's lease. If the store refuses (lease lost,
    /// instance gone, store down), the lifetime is aborted and this future never resolves:
    /// the driver drops the whole run, and nothing after the failed write happens.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not let the commit land, never half of it.
    pub(crate) async fn commit(&self, writes: Vec<Write>) {
        match self.commit_now(writes).await {
            // Its status is learnt already.
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(instance = %self.instance_id, error = %e, "commit failed; stopping this run");
                self.abort(Abort::Store(e));
                std::future::pending::<()>().await;
            }
        }
    }

    /// Commits `writes` under the lease, after any deferred writes, and returns the store's
    /// answer: for the driver's own commits, which handle a failure themselves.
    ///
    /// Deferred writes (a step's success) are known to code that runs before they are
    /// committed: the step's output went on to the workflow, which may hand it to a branch
    /// that starts another op while the commit carrying them is in flight. Commits of one
    /// lifetime are queued in order, but an earlier one can fail alone (its group
    /// abandoned, its connection lost) while a later one lands. So a commit answers `Ok`
    /// only once the commits carrying what was deferred before it was made have landed
    /// ([`Lifetime::carried`]): nothing goes on from a step whose success was lost. And a
    /// commit is not even sent before then, unless it only starts an attempt: anything
    /// else it writes (a child, the end, a sleep's wake-up time, a failed `invoke`, a
    /// cancel, a pause) may have been made from the lost success and would outlive it. An
    /// attempt's start is sent at once, so that the next op's start and the flush of the
    /// last success share the store's round trip (a TypeScript workflow's next step
    /// otherwise waits a commit for the flush made while its worker computed); should the
    /// flush fail alone, the run stops there, and the start that landed is an attempt
    /// interrupted as by a crash right after it (SPEC A.7). A carrying commit whose caller
    /// went away (an op that lost a `select!`) is still followed to its end.
    ///
    /// # Cancel safety
    /// Dropped while it waits to be sent, it has taken and sent nothing.
    pub(crate) async fn commit_now(
        &self,
        mut writes: Vec<Write>,
    ) -> Result<InstanceStatus, cairn_store::Error> {
        let made = self.deferred_so_far();
        let at_once = writes.iter().all(starts_an_attempt);
        if at_once {
            // Not even an attempt's start lands before the instance's first start has
            // (an attempt's start has waited already, `Lifetime::first_start_landed`).
            self.first_start_carried().await?;
        } else {
            self.carried_through(made).await?;
        }
        let first_start = self.first_start.load(Ordering::SeqCst);
        // From here on nothing awaits until the commit is queued.
        // Checked before the deferred writes are taken: refused here, they stay for the
        // next commit (after a late renewal) instead of being lost with no carrier to say so.
        if !self.holds_lease() {
            return Err(cairn_store::Error::LeaseLost(self.lease.instance));
        }
        let (deferred, first) = self
            .deferred
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let carries = !deferred.is_empty();
        // This commit carries the first start: once it has landed, no later one waits.
        let carries_first_start = carries && first_start != 0 && first <= first_start;
        // Attempts the workflow stopped awaiting, counted once their cancel is committed.
        let cancelled: Vec<String> = deferred
            .iter()
            .filter_map(|w| match w {
                Write::Cancel { step, records }
                    if records.iter().any(|r| r.kind == LogKind::AttemptFailure) =>
                {
                    Some(step.key.name.clone())
                }
                _ => None,
            })
            .collect();
        if !deferred.is_empty() {
            // The deferred writes first, in one vector of the right size.
            let mut all = Vec::with_capacity(deferred.len() + writes.len());
            all.extend(deferred);
            all.append(&mut writes);
            writes = all;
        }
        let start = std::time::Instant::now();
        let told = self.tellings();
        // Queued now, in this poll, so the store sees this lifetime's commits in order.
        let store = Arc::clone(&self.env.store);
        let lease = self.lease;
        let commit: Answer = Box::pin(async move { store.commit(lease, writes).await });
        let ticket = Ticket::new(&self.flights);
        let mut landing = if carries {
            let carrier = Arc::new(Carrier {
                first,
                outcome: std::sync::atomic::AtomicU8::new(0),
                commit: SharedAnswer::new(commit),
                ticket: Mutex::new(Some(ticket)),
            });
            self.carriers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(Arc::clone(&carrier));
            Landing {
                commit: None,
                carrier: Some(carrier),
                ticket: None,
            }
        } else {
            Landing {
                commit: Some(commit),
                carrier: None,
                ticket: Some(ticket),
            }
        };
        let mut committed = landing.land().await;
        if committed.is_ok() && carries_first_start {
            self.first_start.store(0, Ordering::SeqCst);
        }
        if committed.is_ok()
            && at_once
            && let Err(e) = self.carried_through(made).await
        {
            committed = Err(e);
        }
        crate::telemetry::committed(start.elapsed());
        if committed.is_ok() {
            // (If the step's own outcome landed first, the store kept it and skipped the
            // cancel; that outcome was never counted, since its commit's await was dropped
            // with the op: the attempt is still counted once, as cancelled.)
            for step in &cancelled {
                crate::telemetry::attempt(
                    self.env.seen(),
                    &self.workflow,
                    step,
                    false,
                    crate::telemetry::AttemptOutcome::Cancelled,
                    None,
                );
            }
        }
        // Learnt here, against what was told when it was queued: a pause told since (from
        // the pause's own answer, which can come first) may be newer than the `running`
        // this commit read; taken as it is, that status would cancel the pause, and the
        // next step would start under it. A resume told since, likewise, for a
        // `waitingForPause` that would close the gate again.
        let status = committed?;
        if let Some(learnt) = self.observe_read(status, told) {
            return Ok(learnt);
        }
        // Read before a pause or resume told since: which came last, a read begun now says
        // (only around a pause of this instance; the hot path never comes here). The
        // driver makes that read, polled beside the workflow: made here, in the op's own
        // future, it would hang on an op the workflow stopped polling (a `select!`'s
        // loser), and with it the driver's pause. Meanwhile, the safe side: a gate closed,
        // which the read opens again if a resume came last.
        if status == InstanceStatus::WaitingForPause {
            self.set_pausing(true);
        }
        self.undecided.store(true, Ordering::SeqCst);
        self.control.notify_one();
        Ok(if self.pausing() {
            InstanceStatus::WaitingForPause
        } else {
            status
        })
    }

    /// Whether a commit's answer was left undecided since the last call: the driver then
    /// reads the status again ([`Lifetime::learn_stored_status`]).
    pub(crate) fn take_undecided(&self) -> bool {
        // A plain load first: the driver asks at every poll, and the answer is no.
        self.undecided.load(Ordering::SeqCst) && self.undecided.swap(false, Ordering::SeqCst)
    }

    /// A pause or resume has landed (`Some(true)`: a pause, `Some(false)`: a resume, made
    /// here; `None`: another engine's, from its notice): told, then the status read
    /// ([`Lifetime::learn_stored_status`]). A read that fails takes the safe side for a
    /// pause, or a request not known: the gate closes (the driver's conditional pause
    /// opens it again if a resume came last); after a resume it stays as it is, for the
    /// next commit's answer to tell.
    pub(crate) async fn learn_control(&self, pause: Option<bool>) {
        if let Err(e) = self.learn_stored_status(true).await {
            if pause != Some(false) {
                self.set_pausing(true);
            }
            tracing::warn!(workflow = %self.workflow, instance = %self.instance_id, error = %e, "a paused or resumed instance's status could not be read; its next commit's answer tells it");
        }
    }

    /// Reads the instance's status and learns it ([`Lifetime::observe_read`]), again while
    /// something told during the read leaves it undecided. `control`: a pause or resume
    /// has just landed (this engine's, or another's notice): told first, so a read still
    /// on its way from before it cannot change the state on its own answer. Rounds end:
    /// each needs a telling during its read, and only control and a change of the state
    /// tell. Answers the status as learnt (`None`: the instance is gone).
    pub(crate) async fn learn_stored_status(
        &self,
        control: bool,
    ) -> Result<Option<InstanceStatus>, cairn_store::Error> {
        if control {
            self.pause.fetch_add(2, Ordering::SeqCst);
        }
        loop {
            let told = self.tellings();
            let Some(record) = self
                .env
                .store
                .instance(&self.workflow, &self.instance_id)
                .await?
            else {
                return Ok(None);
            };
            if let Some(learnt) = self.observe_read(record.status, told) {
                return Ok(Some(learnt));
            }
        }
    }

    /// When the instance first started, once known.
    pub(crate) fn started_at(&self) -> Option<Timestamp> {
        self.started_at.get().copied()
    }

    /// Records when the instance first started (the first call wins).
    pub(crate) fn set_started_at(&self, at: Timestamp) {
        let _ = self.started_at.set(at);
    }

    /// When this lifetime must stop unless its lease is renewed before: the end of the
    /// lease by this engine's clock less the margin its writes keep ([`Leases::usable`]).
    /// Another engine claims once the lease has run out by its own clock; stopping a tenth
    /// of the TTL early keeps a body from running on beside that engine's run of it while
    /// the two clocks are less than that apart.
    ///
    /// [`Leases::usable`]: crate::env::Leases::usable
    pub(crate) fn lease_until(&self) -> Timestamp {
        Timestamp::from_millis(self.lease_from.load(Ordering::SeqCst))
            .saturating_add(self.env.leases.usable())
    }

    /// A renewal sent at `at` kept this lifetime's lease: it holds for the TTL from then.
    pub(crate) fn lease_renewed(&self, at: Timestamp) {
        self.lease_from.fetch_max(at.as_millis(), Ordering::SeqCst);
    }

    /// Whether the lease still holds. Past it, another engine may own the instance (and not
    /// have written yet, so the epoch would not fence a write off): write nothing.
    fn holds_lease(&self) -> bool {
        self.lease_until() > self.env.clock.now()
    }

    /// Whether the lifetime has been aborted (it is stopping, or has stopped).
    pub(crate) fn is_aborted(&self) -> bool {
        self.abort
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some()
    }

    /// Why the lifetime was aborted, if it was.
    pub(crate) fn abort_reason(&self) -> Option<Abort> {
        self.abort
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether a commit of this lifetime is on its way, for the driver about to wait: it
    /// makes no commit of its own meanwhile, since it would wait for that one (a carrier,
    /// `commit_now`; or a store that takes calls strictly in turn), whose op it does not
    /// poll while it waits. When this says `true`, the driver is told through `control`
    /// once the last one is done.
    ///
    /// The watch is set before the count is read, and a commit done clears it after
    /// counting itself out: either the driver reads the count without it, or the commit
    /// sees the watch and wakes the driver. Nothing is lost between the two.
    pub(crate) fn committing(&self) -> bool {
        self.flights.watched.store(true, Ordering::SeqCst);
        self.flights.n.load(Ordering::SeqCst) > 0
    }

    /// The driver is polling: it reads [`Lifetime::committing`] again before it waits, so
    /// a commit done meanwhile need not wake it. (Each step's commit is done while the
    /// driver polls the op that awaits it: waking the driver then cost each step a second
    /// poll of the whole lifetime, and a turn of its loop.)
    pub(crate) fn polling(&self) {
        self.flights.watched.store(false, Ordering::SeqCst);
    }

    /// Waits until every write deferred so far has landed, or is still waiting for a
    /// commit (which then takes it along); an error if a commit carrying such writes did
    /// not land. What is sent or read back from the store afterwards sees them.
    pub(crate) async fn carried(&self) -> Result<(), cairn_store::Error> {
        self.carried_through(self.deferred_so_far()).await
    }

    /// How many batches of writes have been deferred so far: a commit made now may depend
    /// on any of them, not on those deferred after it.
    fn deferred_so_far(&self) -> u64 {
        self.deferred
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .made
    }

    /// [`Lifetime::carried`] for the first `made` batches. A commit that carries only
    /// batches deferred later (another branch's next step) is not waited for, so a branch
    /// that runs steps back to back cannot hold another one's commit back.
    async fn carried_through(&self, made: u64) -> Result<(), cairn_store::Error> {
        loop {
            let waiting_for = {
                let mut carriers = self
                    .carriers
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                carriers.retain(|c| c.outcome.load(Ordering::SeqCst) != LANDED);
                if carriers
                    .iter()
                    .any(|c| c.outcome.load(Ordering::SeqCst) == FAILED)
                {
                    return Err(cairn_store::Error::Unavailable(
                        "an earlier commit of this run, which carried a step's outcome, did not land"
                            .into(),
                    ));
                }
                // A batch deferred before this commit was made and taken along by another
                // commit since (even one that waited with this one) is waited for too.
                carriers.iter().find(|c| c.first <= made).cloned()
            };
            let Some(carrier) = waiting_for else {
                return Ok(());
            };
            // Driven from here too: the op that made it may be kept unpolled meanwhile.
            let _ = carrier.land().await;
        }
    }

    /// Whether writes wait for this lifetime's next commit.
    pub(crate) fn has_deferred(&self) -> bool {
        !self
            .deferred
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .writes
            .is_empty()
    }

    /// Queues `writes` for this lifetime's next commit. If the lifetime ends without one
    /// (a crash, shutdown, a lost lease), they are lost with it, as any unrecorded work is.
    pub(crate) fn defer(&self, writes: Vec<Write>) {
        self.deferred
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(writes);
    }

    /// Waits until the instance's first start has landed, if a commit carries it (or
    /// is yet to: then nothing to wait for, the next commit takes it along). An attempt's
    /// start waits here before it counts as in progress, so that one dropped while it
    /// waits has started nothing, and [`Lifetime::commit_now`] waits no more. Like
    /// [`Lifetime::commit`], never resolves if that commit failed: the lifetime is
    /// aborted.
    pub(crate) async fn first_start_landed(&self) {
        if let Err(e) = self.first_start_carried().await {
            self.abort(Abort::Store(e));
            std::future::pending::<()>().await;
        }
    }

    /// Waits until the commit carrying the instance's first start has landed, if one
    /// does; an error if it did not land. A step row stored for an instance never started
    /// would be taken for none by its next lifetime, which reads no journal for such an
    /// instance (`engine/driver.rs`). Only a step started beside the first (a `join!`)
    /// waits: the first step's start carries it.
    async fn first_start_carried(&self) -> Result<(), cairn_store::Error> {
        match self.first_start.load(Ordering::SeqCst) {
            0 => Ok(()),
            first_start => self.carried_through(first_start).await,
        }
    }

    /// Steps started together queue their starts in the order they were started (their
    /// start-order numbers), whichever is polled first: this lifetime runs on a worker,
    /// whose ops are numbered in the order its code made them, and where Cloudflare's rule
    /// is that a step starts when it is called. Set before the first op is made.
    pub(crate) fn start_in_call_order(&self) {
        self.in_call_order.store(true, Ordering::SeqCst);
    }

    /// Waits until the instance's first start has landed ([`Lifetime::first_start_landed`]);
    /// then, in a lifetime that starts steps in call order ([`Lifetime::start_in_call_order`]),
    /// until no first attempt started before this one (numbered lower than `seq`) still
    /// waits to queue its start. Steps started together (two `step.do` calls before either is
    /// awaited) all wait for the first start; when it lands, whichever is polled first would
    /// otherwise queue its start first, and its body would run first: a worker's op made
    /// later, polled first by its `FuturesUnordered`, did. The returned turn is dropped once
    /// the start is queued, letting the next one go.
    ///
    /// Only a worker's run waits in turn, because it polls every op whenever it is woken
    /// until the run ends. A Rust workflow need not: a `select!` that another step won
    /// keeps the loser, polled once and left waiting here, unpolled while the code runs a
    /// later step, which would wait for it for ever. There, steps started together start in
    /// the order they are polled once the first start has landed (their start-order
    /// numbers, which the rollback order follows, are still the order they were started).
    pub(crate) async fn start_in_turn(&self, seq: u32) -> StartTurn<'_> {
        if !self.in_call_order.load(Ordering::SeqCst) {
            self.first_start_landed().await;
            return StartTurn {
                lifetime: self,
                seq: None,
            };
        }
        {
            let mut starting = self
                .starting
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // The usual case, a step started after the first start landed with none
            // waiting: its start is queued in this poll, before any later one can be.
            // Nothing to wait for or to wake, and no node of the set to allocate.
            if starting.is_empty() && self.first_start.load(Ordering::SeqCst) == 0 {
                return StartTurn {
                    lifetime: self,
                    seq: None,
                };
            }
            starting.insert(seq);
        }
        let turn = StartTurn {
            lifetime: self,
            seq: Some(seq),
        };
        self.first_start_landed().await;
        loop {
            let notified = self.turn.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let first = self
                .starting
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .first()
                .copied();
            if first.is_none_or(|first| first >= seq) {
                return turn;
            }
            notified.await;
        }
    }

    /// [`Lifetime::defer`] for the writes that record the instance's first start: no
    /// step's start lands before they have ([`Lifetime::commit_now`]).
    pub(crate) fn defer_first_start(&self, writes: Vec<Write>) {
        let mut deferred = self
            .deferred
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        deferred.push(writes);
        self.first_start.store(deferred.made, Ordering::SeqCst);
    }

    /// Returns whether this call set the reason (the first abort wins).
    pub(crate) fn abort(&self, reason: Abort) -> bool {
        let mut slot = self
            .abort
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let first = slot.is_none();
        if first {
            if matches!(reason, Abort::WorkerLost) {
                self.worker_lost.store(true, Ordering::SeqCst);
            }
            *slot = Some(reason);
        }
        drop(slot);
        self.aborted.notify_waiters();
        self.aborted.notify_one();
        first
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

    /// Under the lease, takes the oldest buffered event of `event_type` as the output of the
    /// wait `key`. On a store failure the lifetime is aborted and this never resolves.
    pub(crate) async fn take_event(
        &self,
        key: &StepKey,
        event_type: &EventType,
    ) -> Option<cairn_store::StoredEvent> {
        // Taking an event commits on its own: what waits for a commit goes first, so the
        // log keeps the order things happened in (a sleep's completion before the wait's),
        // and so does a commit that carries it and is still on its way.
        if self.has_deferred() {
            self.commit(Vec::new()).await;
        } else if let Err(e) = self.carried().await {
            self.abort(Abort::Store(e));
            std::future::pending::<()>().await;
        }
        let taken = if self.holds_lease() {
            self.env
                .store
                .take_event(self.lease, key.clone(), event_type.clone(), self.now())
                .await
        } else {
            Err(cairn_store::Error::LeaseLost(self.lease.instance))
        };
        match taken {
            Ok(found) => found,
            Err(e) => {
                self.abort(Abort::Store(e));
                std::future::pending().await
            }
        }
    }

    /// The instance's part of its steps' idempotency keys (`StepContext::idempotency_key`
    /// adds the step's name and count): stable across attempts and replays, distinct from
    /// any other instance's (also one that reuses this id later). Made once per lifetime.
    pub(crate) fn idempotency_prefix(&self) -> &str {
        self.idempotency_prefix.get_or_init(|| {
            format!(
                "{}/{}/{}",
                self.workflow,
                self.instance_id,
                self.created_at.as_millis()
            )
        })
    }
}

/// A first attempt's turn to queue its start ([`Lifetime::start_in_turn`]): dropped, the
/// next one goes.
pub(crate) struct StartTurn<'a> {
    lifetime: &'a Lifetime,
    /// `None`: the start never waited in turn (nobody else did either).
    seq: Option<u32>,
}

impl Drop for StartTurn<'_> {
    fn drop(&mut self) {
        let Some(seq) = self.seq else { return };
        self.lifetime
            .starting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&seq);
        self.lifetime.turn.notify_waiters();
    }
}

/// An op at work. While it exists (and is not suspended in a durable wait) the instance is
/// busy and cannot hibernate.
pub(crate) struct Activity {
    state: Arc<Lifetime>,
    /// The wait registration while suspended.
    suspended: Option<u64>,
}

impl Activity {
    /// Waits durably until `wake_at`, or until `until` resolves first (an event arrived):
    /// meanwhile the op counts as idle, so the instance may hibernate.
    ///
    /// # Cancel safety
    /// Dropping the future removes the wait registration; nothing durable happens here.
    pub(crate) async fn wait<F: std::future::Future<Output = ()>>(
        &mut self,
        wake_at: Timestamp,
        event_type: Option<EventType>,
        until: F,
    ) -> bool {
        self.wait_on(
            Wait {
                wake_at,
                event_type,
                child: None,
            },
            until,
        )
        .await
    }

    /// [`Activity::wait`] for any [`Wait`] (an `invoke` waiting for its child).
    pub(crate) async fn wait_on<F: std::future::Future<Output = ()>>(
        &mut self,
        wait: Wait,
        until: F,
    ) -> bool {
        let sleep = self.state.env.clock.sleep_until(wait.wake_at);
        self.suspend(wait);
        let woke_by_event = tokio::select! {
            () = sleep => false,
            () = until => true,
        };
        self.resume();
        woke_by_event
    }

    fn suspend(&mut self, wait: Wait) {
        let mut inner = self.state.inner();
        let id = inner.next_wait;
        inner.next_wait += 1;
        inner.waits.insert(id, wait);
        inner.active -= 1;
        self.suspended = Some(id);
    }

    fn resume(&mut self) {
        if let Some(id) = self.suspended.take() {
            let mut inner = self.state.inner();
            inner.waits.remove(&id);
            inner.active += 1;
        }
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        let mut inner = self.state.inner();
        match self.suspended.take() {
            Some(id) => {
                inner.waits.remove(&id);
            }
            None => inner.active -= 1,
        }
    }
}

/// Whether `write` is part of an attempt's start (a step's or a rollback handler's): a
/// commit of nothing else is sent without waiting for the commits carrying earlier
/// successes (see [`Lifetime::commit_now`]); its body runs only once they landed.
fn starts_an_attempt(write: &Write) -> bool {
    match write {
        Write::Log(entry) => matches!(
            entry.kind,
            LogKind::StepStart
                | LogKind::AttemptStart
                | LogKind::RollbackStepStart
                | LogKind::RollbackAttemptStart
        ),
        Write::Step(record) => record.state == StepState::Running && record.in_flight,
        _ => false,
    }
}

/// Writes waiting for a lifetime's next commit, numbered by the batch they came in.
#[derive(Default)]
struct Deferred {
    writes: Vec<Write>,
    /// How many batches have been deferred so far (the number of the last one).
    made: u64,
    /// The number of the first batch in `writes`, when there are any.
    first: u64,
}

impl Deferred {
    fn push(&mut self, writes: Vec<Write>) {
        self.made += 1;
        if self.writes.is_empty() {
            self.first = self.made;
            // The usual case (a step's success): keep the vector, no copy.
            self.writes = writes;
        } else {
            self.writes.extend(writes);
        }
    }

    /// The writes, and the number of the first batch among them.
    fn take(&mut self) -> (Vec<Write>, u64) {
        (std::mem::take(&mut self.writes), self.first)
    }
}

/// A commit that carried deferred writes, and whether it landed.
struct Carrier {
    /// The number of the first batch of deferred writes it carries (the others are later).
    first: u64,
    /// 0 while in flight, then [`LANDED`] or [`FAILED`].
    outcome: std::sync::atomic::AtomicU8,
    /// The commit itself, driven by whoever waits for it: the op that made it, or a later
    /// commit of the lifetime that must know it landed first. The op cannot be the only
    /// one: workflow code may keep it unpolled after its first poll (a `select!` another
    /// branch won) while it runs other steps, whose commits would wait for it for ever.
    commit: SharedAnswer,
    /// Counts it among the lifetime's commits on their way until it is settled, whoever
    /// drove it: an op kept unpolled does not keep the driver from flushing after it.
    ticket: Mutex<Option<Ticket>>,
}

/// How many commits of a lifetime are on their way, and the driver's wake-up.
struct Flights {
    n: AtomicUsize,
    /// Whether the driver waits to be told that none is (`Lifetime::committing`).
    watched: AtomicBool,
    wake: Arc<Notify>,
}

/// One commit on its way, counted in [`Flights`] until dropped.
struct Ticket(Arc<Flights>);

impl Ticket {
    fn new(flights: &Arc<Flights>) -> Self {
        flights.n.fetch_add(1, Ordering::SeqCst);
        Ticket(Arc::clone(flights))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.0.n.fetch_sub(1, Ordering::SeqCst) == 1
            && self.0.watched.swap(false, Ordering::SeqCst)
        {
            self.0.wake.notify_one();
        }
    }
}

const LANDED: u8 = 1;
const FAILED: u8 = 2;

impl Carrier {
    /// The first outcome known is kept; then the commit is no longer on its way (the
    /// ticket goes after the outcome, so the driver it wakes finds the outcome stored).
    fn settle(&self, landed: bool) {
        let outcome = if landed { LANDED } else { FAILED };
        let _ = self
            .outcome
            .compare_exchange(0, outcome, Ordering::SeqCst, Ordering::SeqCst);
        let ticket = self
            .ticket
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        drop(ticket);
    }

    /// Drives the commit to its answer, with whoever else waits for it, and settles.
    async fn land(&self) -> Result<InstanceStatus, cairn_store::Error> {
        let mut slot = None;
        let answer = std::future::poll_fn(|cx| self.commit.poll(&mut slot, cx)).await;
        self.settle(answer.is_ok());
        answer
    }
}

/// A commit on its way: its own, or, if it carries deferred writes, its carrier's.
struct Landing {
    commit: Option<Answer>,
    carrier: Option<Arc<Carrier>>,
    /// A commit that carries nothing: given back once the commit is done with. (A
    /// carrier holds its own until settled.)
    ticket: Option<Ticket>,
}

impl Landing {
    async fn land(&mut self) -> Result<InstanceStatus, cairn_store::Error> {
        let answer = match (self.commit.as_mut(), self.carrier.as_ref()) {
            (_, Some(carrier)) => carrier.land().await,
            (Some(commit), None) => commit.await,
            (None, None) => return Err(cairn_store::Error::Unavailable("committed twice".into())),
        };
        self.commit = None;
        self.carrier = None;
        self.ticket = None;
        answer
    }
}

impl Drop for Landing {
    /// Dropped on its way: a carrying commit is followed to its end on a task of its own,
    /// so the commits after it (and the driver, which its ticket holds back) learn whether
    /// it landed without one of them having to drive it.
    fn drop(&mut self) {
        let Some(carrier) = self.carrier.take() else {
            return;
        };
        if carrier.outcome.load(Ordering::SeqCst) != 0 {
            return;
        }
        let settle = Settle(Some(carrier));
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    // Settled by `land`; the guard settles it as failed only if the
                    // runtime drops this task first.
                    if let Some(carrier) = &settle.0 {
                        let _ = carrier.land().await;
                    }
                    drop(settle);
                });
            }
            // No runtime to finish it on: not known to have landed.
            Err(_) => drop(settle),
        }
    }
}

/// Settles its carrier as failed if dropped unsettled (the runtime shut down under it).
struct Settle(Option<Arc<Carrier>>);

impl Drop for Settle {
    fn drop(&mut self) {
        if let Some(carrier) = self.0.take() {
            carrier.settle(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Lifetime;
    use crate::env::Env;

    /// A lifetime whose first start waits for a commit to take it along, as a new
    /// instance's does until its first op.
    fn new_instances(dir: &std::path::Path) -> Arc<Lifetime> {
        let lifetime = Arc::new(Lifetime::for_tests(&Env::for_tests(dir), 1));
        lifetime.defer_first_start(Vec::new());
        lifetime
    }

    /// On a worker, a step started after another queues its start only once the earlier
    /// one has queued its own (its turn dropped), even when it is polled first.
    #[tokio::test]
    async fn on_a_worker_a_step_queues_its_start_only_after_the_steps_started_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let lifetime = new_instances(dir.path());
        lifetime.start_in_call_order();
        let first = lifetime.start_in_turn(0).await;
        let mut second = std::pin::pin!(lifetime.start_in_turn(1));
        assert!(
            futures::poll!(second.as_mut()).is_pending(),
            "the second start went while the first had not queued its own"
        );
        drop(first);
        drop(second.await);
        assert!(
            lifetime.starting.lock().unwrap().is_empty(),
            "a dropped turn leaves the set"
        );
    }

    /// A status read begun before a pause was told, answering `running` after the pause's
    /// own answer, leaves the pause pending and asks for a newer read; one begun after it
    /// tells a resume.
    #[tokio::test]
    async fn a_running_read_before_a_pause_learnt_since_does_not_cancel_it() {
        use cairn_core::InstanceStatus;
        let dir = tempfile::tempdir().unwrap();
        let lifetime = new_instances(dir.path());
        let older = lifetime.tellings();
        lifetime.observe(InstanceStatus::WaitingForPause);
        assert_eq!(lifetime.observe_read(InstanceStatus::Running, older), None);
        assert!(lifetime.pausing(), "a stale running cancelled the pause");
        // Told again (another caller's pause, or this engine's after a resume): a read
        // begun before that telling cannot be ordered against it either.
        let before_telling = lifetime.tellings();
        lifetime
            .pause
            .fetch_add(2, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            lifetime.observe_read(InstanceStatus::Running, before_telling),
            None
        );
        let newer = lifetime.tellings();
        assert_eq!(
            lifetime.observe_read(InstanceStatus::Running, newer),
            Some(InstanceStatus::Running)
        );
        assert!(
            !lifetime.pausing(),
            "a resume read after the pause was not told"
        );
    }

    /// The other way round: a `waitingForPause` read before a resume was learnt does not
    /// close the gate again once it is open; a read that agrees with what is known is
    /// taken whatever its age (every step's commit answer: `running`, nothing pending).
    #[tokio::test]
    async fn a_pause_read_before_a_resume_learnt_since_does_not_close_the_gate_again() {
        use cairn_core::InstanceStatus;
        let dir = tempfile::tempdir().unwrap();
        let lifetime = new_instances(dir.path());
        lifetime.observe(InstanceStatus::WaitingForPause);
        let older = lifetime.tellings();
        assert_eq!(
            lifetime.observe_read(InstanceStatus::Running, older),
            Some(InstanceStatus::Running)
        );
        assert!(!lifetime.pausing());
        assert_eq!(
            lifetime.observe_read(InstanceStatus::WaitingForPause, older),
            None
        );
        assert!(!lifetime.pausing(), "a stale pause closed the gate again");
        assert_eq!(
            lifetime.observe_read(InstanceStatus::Running, 0),
            Some(InstanceStatus::Running)
        );
        let newer = lifetime.tellings();
        assert_eq!(
            lifetime.observe_read(InstanceStatus::WaitingForPause, newer),
            Some(InstanceStatus::WaitingForPause)
        );
        assert!(
            lifetime.pausing(),
            "a pause read after the resume was not told"
        );
    }

    /// A pause or resume that has just landed is told before its lifetime reads the
    /// instance again: a read still on its way from before it, whose answer would change
    /// the pause state, is left undecided (its caller reads again), even when the new read
    /// finds nothing to change.
    #[tokio::test]
    async fn a_pause_or_resume_told_leaves_a_read_from_before_it_undecided() {
        use cairn_core::InstanceStatus;
        let dir = tempfile::tempdir().unwrap();
        let lifetime = new_instances(dir.path());
        let before = lifetime.tellings();
        // This lifetime's instance is not in the store: the read finds nothing to learn.
        assert_eq!(lifetime.learn_stored_status(true).await.unwrap(), None);
        assert_eq!(
            lifetime.observe_read(InstanceStatus::WaitingForPause, before),
            None
        );
        assert!(!lifetime.pausing());
    }

    /// In a Rust workflow, a step polled once and left waiting by the code (a `select!`'s
    /// loser) holds no later step back: the later one takes no turn.
    #[tokio::test]
    async fn in_rust_a_step_left_waiting_holds_no_later_step_back() {
        let dir = tempfile::tempdir().unwrap();
        let lifetime = new_instances(dir.path());
        let _left_waiting = lifetime.start_in_turn(0).await;
        let mut later = std::pin::pin!(lifetime.start_in_turn(1));
        assert!(futures::poll!(later.as_mut()).is_ready());
    }
}
