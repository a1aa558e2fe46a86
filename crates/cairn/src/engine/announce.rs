//! Tells live views (the server's event streams) that the store committed something.
//!
//! [`Announcing`] wraps the store and, after every successful write, bumps the counters of
//! what the write touched: the instance and its workflow (and one engine-wide counter). A
//! stream that has read the whole log sleeps on its instance's or workflow's counter, so a
//! commit wakes only the streams that can have something new, instead of every stream
//! re-reading the store after every commit of any instance. Only this engine's own writes
//! are seen here; other processes' writes to a shared store arrive as notices (`remote.rs`).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_core::{
    EventType, InstanceId, InstanceStatus, LogRecord, StepKey, StepRecord, Timestamp, WorkflowName,
};
use cairn_store::{
    Claimed, ControlOutcome, ControlRequest, Created, InstanceRecord, InstanceRef, Lease,
    ListQuery, NewEvent, NewInstance, Sent, Store, StoreFuture, StoredEvent, Timers, Write,
};
use tokio::sync::watch;

/// Tells every receiver of `counter` that something new was written.
fn bump(counter: &watch::Sender<u64>) {
    counter.send_modify(|n| *n = after_news(*n));
}

/// A counter's value after news: even. After a start ([`Topics::bump_start`]) it is odd,
/// and a different value than after any other news or several.
fn after_news(n: u64) -> u64 {
    (n | 1).wrapping_add(1)
}

fn after_start(n: u64) -> u64 {
    (n | 1).wrapping_add(2)
}

/// Whether a status counter seen at `seen` and now at `now` has had exactly one news
/// since, an instance's start: it is running, and nothing else was told.
pub(crate) fn only_a_start_since(seen: u64, now: u64) -> bool {
    now == after_start(seen)
}

/// Counters keyed by what a write touched; a key has a counter only while someone watches
/// (give or take the counters not swept yet).
pub(crate) struct Topics<K>(Mutex<Counters<K>>);

struct Counters<K> {
    by_key: HashMap<K, watch::Sender<u64>>,
    /// How many counters the last sweep kept: the next sweeps once there are twice as many.
    /// A sweep on every subscription would make many open waits quadratic.
    kept: usize,
}

/// Counters are swept from this many on.
const SWEEP_FROM: usize = 64;

impl<K: Eq + Hash + Clone> Topics<K> {
    pub(crate) fn new() -> Self {
        Topics(Mutex::new(Counters {
            by_key: HashMap::new(),
            kept: 0,
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counters<K>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn subscribe(&self, key: &K) -> watch::Receiver<u64> {
        let mut topics = self.lock();
        // Forget counters nobody watches any more, so the map follows the open views.
        if topics.by_key.len() >= (2 * topics.kept).max(SWEEP_FROM) {
            topics
                .by_key
                .retain(|_, sender| sender.receiver_count() > 0);
            topics.kept = topics.by_key.len();
        }
        topics
            .by_key
            .entry(key.clone())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    pub(crate) fn bump(&self, key: &K) {
        self.tell(key, after_news);
    }

    /// [`Topics::bump`] saying the news is the start of what `key` names, and nothing else
    /// ([`only_a_start_since`]): a wait for the end need not read it.
    pub(crate) fn bump_start(&self, key: &K) {
        self.tell(key, after_start);
    }

    /// Moves `key`'s counter, if someone watches it, to `after` its value.
    fn tell(&self, key: &K, after: fn(u64) -> u64) {
        if let Some(sender) = self.lock().by_key.get(key) {
            sender.send_modify(|n| *n = after(*n));
        }
    }

    pub(crate) fn bump_all(&self) {
        for sender in self.lock().by_key.values() {
            bump(sender);
        }
    }

    /// How many counters are held, swept or not (for tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.lock().by_key.len()
    }
}

/// Who is told about a write.
pub(crate) struct Commits {
    /// Every write (`Engine::commits`).
    all: watch::Sender<u64>,
    instances: Topics<InstanceRef>,
    workflows: Topics<WorkflowName>,
    /// Per instance, what `Instance::wait_for` watches: bumped by the commit that starts
    /// the instance running (it rides with its first op's commit), and by the driver at the
    /// end of a lifetime, after it let go of the instance (so a waiter that sees `waiting`
    /// or `complete` finds it out of memory); not at every commit.
    pub(crate) statuses: Topics<InstanceRef>,
    /// The workflow of each instance this engine holds a lease on: a commit names only its
    /// lease's instance. Learnt at claim, forgotten when the lease is let go.
    owners: Mutex<HashMap<InstanceRef, WorkflowName>>,
}

impl Commits {
    pub(crate) fn new() -> Self {
        Commits {
            all: watch::channel(0).0,
            instances: Topics::new(),
            workflows: Topics::new(),
            statuses: Topics::new(),
            owners: Mutex::new(HashMap::new()),
        }
    }

    /// Sees every write.
    pub(crate) fn all(&self) -> watch::Receiver<u64> {
        self.all.subscribe()
    }

    /// Sees the writes to one instance.
    pub(crate) fn instance(&self, instance: InstanceRef) -> watch::Receiver<u64> {
        self.instances.subscribe(&instance)
    }

    /// Sees the writes to any instance of one workflow.
    pub(crate) fn workflow(&self, workflow: &WorkflowName) -> watch::Receiver<u64> {
        self.workflows.subscribe(workflow)
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<InstanceRef, WorkflowName>> {
        self.owners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn announce(&self, instance: Option<InstanceRef>, workflow: Option<&WorkflowName>) {
        bump(&self.all);
        if let Some(instance) = instance {
            self.instances.bump(&instance);
        }
        match workflow {
            Some(workflow) => self.workflows.bump(workflow),
            // A write whose workflow is not known here: wake every workflow view.
            None if instance.is_some() => self.workflows.bump_all(),
            None => {}
        }
    }

    /// A write another process made: to `instance`, or to anything.
    pub(crate) fn remote(&self, instance: Option<InstanceRef>) {
        match instance {
            Some(instance) => self.announce(Some(instance), None),
            None => {
                bump(&self.all);
                self.instances.bump_all();
                self.workflows.bump_all();
            }
        }
    }

    /// A write under `lease`: its workflow is the one learnt when it was claimed.
    fn announce_leased(&self, instance: InstanceRef, released: bool) {
        let workflow = if released {
            self.owners().remove(&instance)
        } else {
            self.owners().get(&instance).cloned()
        };
        self.announce(Some(instance), workflow.as_ref());
    }
}

enum RequestKind {
    Delete,
    Other,
}

pub(crate) struct Announcing {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) commits: Arc<Commits>,
}

impl Announcing {
    /// Runs a write and, when it succeeded, announces it with `touched`'s answer.
    fn write<'a, T: Send + 'a>(
        &'a self,
        call: StoreFuture<'a, T>,
        touched: impl FnOnce(&Commits, &T) + Send + 'a,
    ) -> StoreFuture<'a, T> {
        Box::pin(async move {
            let result = call.await;
            if let Ok(value) = &result {
                touched(&self.commits, value);
            }
            result
        })
    }
}

impl Store for Announcing {
    fn create(&self, batch: Vec<NewInstance>) -> StoreFuture<'_, Vec<Created>> {
        let workflows: Vec<WorkflowName> = batch.iter().map(|n| n.workflow.clone()).collect();
        self.write(self.store.create(batch), move |commits, created| {
            for (workflow, created) in workflows.iter().zip(created) {
                if let Created::New(instance) = created {
                    commits.announce(Some(*instance), Some(workflow));
                }
            }
        })
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

    fn count_matching(&self, query: ListQuery) -> StoreFuture<'_, u64> {
        self.store.count_matching(query)
    }

    fn claim(
        &self,
        owner: &str,
        workflows: &[WorkflowName],
        now: Timestamp,
        ttl: Duration,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Claimed>> {
        // A claim writes no log record: no view needs waking, only the owners learnt.
        self.write(
            self.store.claim(owner, workflows, now, ttl, limit),
            |commits, claimed| {
                bump(&commits.all);
                let mut owners = commits.owners();
                for c in claimed {
                    owners.insert(c.lease.instance, c.record.workflow.clone());
                }
            },
        )
    }

    fn release_all(&self, owner: &str) -> StoreFuture<'_, ()> {
        // Instances become claimable: wake this engine's waiters as any release does.
        let released = self.store.release_all(owner);
        let commits = Arc::clone(&self.commits);
        Box::pin(async move {
            released.await?;
            // Which instances changed is not known here: wake every view.
            let leased: Vec<InstanceRef> = commits.owners().drain().map(|(i, _)| i).collect();
            for instance in leased {
                commits.announce(Some(instance), None);
            }
            Ok(())
        })
    }

    fn changes(&self) -> Option<futures::stream::BoxStream<'static, cairn_store::Changes>> {
        self.store.changes()
    }

    fn reclaim(
        &self,
        owner: &str,
        lease: Lease,
        now: Timestamp,
        ttl: std::time::Duration,
    ) -> StoreFuture<'_, Lease> {
        self.store.reclaim(owner, lease, now, ttl)
    }

    fn renew(
        &self,
        owner: &str,
        leases: Vec<Lease>,
        now: Timestamp,
        until: Timestamp,
    ) -> StoreFuture<'_, Vec<Lease>> {
        self.store.renew(owner, leases, now, until)
    }

    fn journal(&self, instance: InstanceRef) -> StoreFuture<'_, Vec<StepRecord>> {
        self.store.journal(instance)
    }

    fn stream_chunk(
        &self,
        instance: InstanceRef,
        step: StepKey,
        attempt: u32,
        epoch: u64,
        index: u32,
    ) -> StoreFuture<'_, Option<Vec<u8>>> {
        self.store
            .stream_chunk(instance, step, attempt, epoch, index)
    }

    fn stream_bytes(&self, instance: InstanceRef) -> StoreFuture<'_, u64> {
        self.store.stream_bytes(instance)
    }

    fn children(&self, parent: InstanceRef) -> StoreFuture<'_, Vec<InstanceRecord>> {
        self.store.children(parent)
    }

    fn slot_position(&self, instance: InstanceRef) -> StoreFuture<'_, Option<u64>> {
        self.store.slot_position(instance)
    }

    fn waiting_for_slots(
        &self,
        workflow: &WorkflowName,
        limit: usize,
    ) -> StoreFuture<'_, (Vec<(String, u64)>, u64)> {
        self.store.waiting_for_slots(workflow, limit)
    }

    fn create_schedule(&self, schedule: cairn_store::StoredSchedule) -> StoreFuture<'_, bool> {
        self.store.create_schedule(schedule)
    }

    fn set_schedule_state(
        &self,
        name: &str,
        state: cairn_store::ScheduleState,
    ) -> StoreFuture<'_, bool> {
        self.store.set_schedule_state(name, state)
    }

    fn schedules(&self) -> StoreFuture<'_, Vec<cairn_store::StoredSchedule>> {
        self.store.schedules()
    }

    fn delete_schedule(&self, name: &str, declared: bool) -> StoreFuture<'_, bool> {
        self.store.delete_schedule(name, declared)
    }

    fn register_versions(
        &self,
        versions: Vec<cairn_store::WorkflowVersion>,
    ) -> StoreFuture<'_, ()> {
        self.store.register_versions(versions)
    }

    fn workflow_versions(&self) -> StoreFuture<'_, Vec<cairn_store::WorkflowVersion>> {
        self.store.workflow_versions()
    }

    fn unfinished_versions(
        &self,
        workflow: &WorkflowName,
    ) -> StoreFuture<'_, Vec<(Option<String>, u64)>> {
        self.store.unfinished_versions(workflow)
    }

    fn wake_awaiting(
        &self,
        workflow: &WorkflowName,
        version: &str,
        limit: u64,
    ) -> StoreFuture<'_, u64> {
        let name = workflow.clone();
        self.write(
            self.store.wake_awaiting(workflow, version, limit),
            move |commits, woken| {
                if *woken > 0 {
                    commits.announce(None, Some(&name));
                }
            },
        )
    }

    fn fire_tick(
        &self,
        tick: cairn_store::ScheduleTick,
    ) -> StoreFuture<'_, cairn_store::TickFired> {
        let workflow = tick.instance.workflow.clone();
        self.write(self.store.fire_tick(tick), move |commits, fired| {
            if let cairn_store::TickFired::Fired(instance) = fired {
                commits.announce(Some(*instance), Some(&workflow));
            }
        })
    }

    fn commit(&self, lease: Lease, writes: Vec<Write>) -> StoreFuture<'_, InstanceStatus> {
        // A child created with the commit: its workflow's streams have its first record.
        let created: Vec<WorkflowName> = writes
            .iter()
            .filter_map(|w| match w {
                Write::Create(new) => Some(new.workflow.clone()),
                _ => None,
            })
            .collect();
        // The instance's start rides with its first op's commit: status waiters learn it
        // here. (Its end is told by the driver once it let go of the instance.)
        let starts = writes.iter().any(
            |w| matches!(w, Write::Status(change) if change.status == InstanceStatus::Running),
        );
        let commit = self.store.commit(lease, writes);
        Box::pin(async move {
            let result = commit.await;
            match &result {
                Ok(status) => {
                    // Hibernated, paused or finished: the lease was let go.
                    let released = status.is_terminal()
                        || matches!(status, InstanceStatus::Waiting | InstanceStatus::Paused);
                    self.commits.announce_leased(lease.instance, released);
                    if starts {
                        // Only a start, if the instance is running now; a commit that
                        // also ended, hibernated or paused it is other news.
                        if *status == InstanceStatus::Running {
                            self.commits.statuses.bump_start(&lease.instance);
                        } else {
                            self.commits.statuses.bump(&lease.instance);
                        }
                    }
                    for workflow in &created {
                        self.commits.announce(None, Some(workflow));
                    }
                }
                // Fenced off or gone: this engine holds no lease on it any more.
                Err(cairn_store::Error::LeaseLost(_) | cairn_store::Error::NotFound(_)) => {
                    self.commits.owners().remove(&lease.instance);
                }
                Err(_) => {}
            }
            result
        })
    }

    fn control(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
        request: ControlRequest,
    ) -> StoreFuture<'_, ControlOutcome> {
        let workflow = workflow.clone();
        let request_kind = match request {
            ControlRequest::Delete => RequestKind::Delete,
            _ => RequestKind::Other,
        };
        self.write(
            self.store.control(&workflow, id, request),
            move |commits, outcome| {
                if let ControlOutcome::Done { instance, to, .. } = outcome {
                    commits.announce(Some(*instance), Some(&workflow));
                    // Terminated or deleted (delete reports the status it had): any lease
                    // this engine held is gone.
                    if to.is_terminal() || matches!(request_kind, RequestKind::Delete) {
                        commits.owners().remove(instance);
                    }
                }
            },
        )
    }

    fn log(
        &self,
        instance: InstanceRef,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<LogRecord>> {
        self.store.log(instance, after, limit)
    }

    fn log_head(&self) -> StoreFuture<'_, u64> {
        self.store.log_head()
    }

    fn workflow_log(
        &self,
        workflow: &WorkflowName,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, cairn_store::WorkflowLogPage> {
        self.store.workflow_log(workflow, after, limit)
    }

    fn next_ready(&self, workflows: &[WorkflowName]) -> StoreFuture<'_, Option<Timestamp>> {
        self.store.next_ready(workflows)
    }

    fn timers(&self, workflow: &WorkflowName, now: Timestamp) -> StoreFuture<'_, Timers> {
        self.store.timers(workflow, now)
    }

    fn send_event(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
        event: NewEvent,
    ) -> StoreFuture<'_, Sent> {
        let workflow = workflow.clone();
        self.write(
            self.store.send_event(&workflow, id, event),
            move |commits, sent| {
                if let Sent::Buffered(instance) = sent {
                    commits.announce(Some(*instance), Some(&workflow));
                }
            },
        )
    }

    fn take_event(
        &self,
        lease: Lease,
        step: StepKey,
        event_type: EventType,
        at: Timestamp,
    ) -> StoreFuture<'_, Option<StoredEvent>> {
        self.write(
            self.store.take_event(lease, step, event_type, at),
            move |commits, _| commits.announce_leased(lease.instance, false),
        )
    }

    fn purge(&self, now: Timestamp, limit: usize) -> StoreFuture<'_, usize> {
        self.write(self.store.purge(now, limit), |commits, purged| {
            if *purged > 0 {
                bump(&commits.all);
                commits.instances.bump_all();
                commits.workflows.bump_all();
            }
        })
    }

    fn next_purge(&self) -> StoreFuture<'_, Option<Timestamp>> {
        self.store.next_purge()
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        self.store.close()
    }
}

#[cfg(test)]
mod tests {
    use super::{SWEEP_FROM, Topics, only_a_start_since};

    /// News told to `topics` on key 7, in order: a start (`true`) or any other.
    fn tell(topics: &Topics<u64>, news: &[bool]) {
        for &start in news {
            if start {
                topics.bump_start(&7);
            } else {
                topics.bump(&7);
            }
        }
    }

    #[test]
    fn only_a_single_start_since_a_waiters_read_spares_its_next_read() {
        // (news before the waiter's read, news after it, whether it may skip reading)
        let cases: &[(&[bool], &[bool], bool)] = &[
            (&[], &[true], true),
            (&[false], &[true], true),
            (&[true], &[true], true),
            (&[false, true], &[true], true),
            (&[], &[false], false),
            (&[true], &[false], false),
            // The end, then a start from a commit settled after the lifetime was aborted:
            // the end must be read.
            (&[], &[false, true], false),
            (&[true], &[false, true], false),
            (&[], &[true, false], false),
            (&[], &[true, true], false),
            (&[], &[false, false], false),
        ];
        for &(before, after, skips) in cases {
            let topics = Topics::<u64>::new();
            let mut rx = topics.subscribe(&7);
            tell(&topics, before);
            let seen = *rx.borrow_and_update();
            tell(&topics, after);
            assert!(rx.has_changed().unwrap(), "every news is a change");
            let now = *rx.borrow_and_update();
            assert_eq!(
                only_a_start_since(seen, now),
                skips,
                "{before:?} then {after:?}"
            );
        }
        // Near the counter's end it wraps and still tells a start apart.
        for seen in [u64::MAX, u64::MAX - 1, u64::MAX - 2] {
            assert!(only_a_start_since(seen, super::after_start(seen)));
            assert!(!only_a_start_since(seen, super::after_news(seen)));
            assert!(!only_a_start_since(
                seen,
                super::after_start(super::after_news(seen))
            ));
        }
    }

    #[test]
    fn counters_nobody_watches_are_swept_and_watched_ones_kept() {
        let topics = Topics::<u64>::new();
        let mut live = topics.subscribe(&0);
        // Many waits come and go, one at a time.
        for key in 1..10_000 {
            drop(topics.subscribe(&key));
            assert!(
                topics.held() <= SWEEP_FROM,
                "{} counters held after {key} waits",
                topics.held()
            );
        }
        // The watched counter survived every sweep: it is still the one bumped.
        topics.bump(&0);
        assert!(live.has_changed().expect("the counter is alive"));
        live.borrow_and_update();
        // Many waits open at once: the map grows with them and no further.
        let open: Vec<_> = (1..1_000).map(|key| topics.subscribe(&key)).collect();
        assert!(topics.held() <= 2 * open.len() + 1, "{}", topics.held());
        drop(open);
        for key in 1_000..1_000 + 4 * SWEEP_FROM as u64 {
            drop(topics.subscribe(&key));
        }
        assert!(topics.held() < 1_000, "{} held", topics.held());
        topics.bump_all();
        assert!(live.has_changed().expect("the counter is alive"));
    }
}
