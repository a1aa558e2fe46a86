//! Crash consistency: a store that fails at the Nth commit, for every N of a multi-step
//! instance, with the write either not landing or landing but reported as failed. A new
//! engine on the same database must then finish the instance with the same output, and a
//! step whose result was committed must never run again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{FnWorkflow, wf};
use cairn::prelude::*;
use cairn::sqlite::{Durability, Options, SqliteStore};
use cairn::store::{
    Claimed, ControlOutcome, ControlRequest, Created, Error, InstanceRecord, InstanceRef, Lease,
    ListQuery, NewEvent, NewInstance, Sent, Store, StoreFuture, StoredEvent, Write,
};
use cairn::{
    Clock, EventType, InstanceId, InstanceStatus, LogRecord, StepKey, StepRecord, Timestamp,
    WorkflowName,
};
use serde_json::json;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// The Nth commit does not land.
    Lost,
    /// The Nth commit lands but the caller is told it failed.
    LandedButReportedFailed,
}

/// Delegates to a real store until the Nth commit, then fails that one and every later call.
struct FailingStore {
    inner: Arc<dyn Store>,
    fail_at: usize,
    mode: Mode,
    commits: AtomicUsize,
    tripped: AtomicBool,
    notify: tokio::sync::Notify,
}

impl FailingStore {
    fn dead(&self) -> bool {
        self.tripped.load(Ordering::SeqCst)
    }
}

fn down<'a, T: Send + 'a>() -> StoreFuture<'a, T> {
    Box::pin(async { Err(Error::Unavailable("injected failure".into())) })
}

impl Store for FailingStore {
    fn create(&self, batch: Vec<NewInstance>) -> StoreFuture<'_, Vec<Created>> {
        if self.dead() {
            return down();
        }
        self.inner.create(batch)
    }
    fn instance(
        &self,
        w: &WorkflowName,
        id: &InstanceId,
    ) -> StoreFuture<'_, Option<InstanceRecord>> {
        self.inner.instance(w, id)
    }
    fn list(&self, q: ListQuery) -> StoreFuture<'_, Vec<InstanceRecord>> {
        self.inner.list(q)
    }
    fn count(&self, w: &WorkflowName, s: InstanceStatus) -> StoreFuture<'_, u64> {
        self.inner.count(w, s)
    }
    fn count_matching(&self, q: cairn_store::ListQuery) -> StoreFuture<'_, u64> {
        self.inner.count_matching(q)
    }
    fn claim(
        &self,
        owner: &str,
        w: &[WorkflowName],
        now: Timestamp,
        ttl: Duration,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Claimed>> {
        if self.dead() {
            return down();
        }
        self.inner.claim(owner, w, now, ttl, limit)
    }
    fn release_all(&self, owner: &str) -> StoreFuture<'_, ()> {
        self.inner.release_all(owner)
    }

    fn reclaim(
        &self,
        owner: &str,
        lease: Lease,
        now: Timestamp,
        ttl: std::time::Duration,
    ) -> StoreFuture<'_, Lease> {
        self.inner.reclaim(owner, lease, now, ttl)
    }

    fn renew(
        &self,
        owner: &str,
        leases: Vec<Lease>,
        now: Timestamp,
        until: Timestamp,
    ) -> StoreFuture<'_, Vec<Lease>> {
        self.inner.renew(owner, leases, now, until)
    }
    fn journal(&self, i: InstanceRef) -> StoreFuture<'_, Vec<StepRecord>> {
        self.inner.journal(i)
    }
    fn stream_chunk(
        &self,
        i: InstanceRef,
        step: StepKey,
        attempt: u32,
        epoch: u64,
        index: u32,
    ) -> StoreFuture<'_, Option<Vec<u8>>> {
        self.inner.stream_chunk(i, step, attempt, epoch, index)
    }
    fn stream_bytes(&self, i: InstanceRef) -> StoreFuture<'_, u64> {
        self.inner.stream_bytes(i)
    }
    fn children(&self, i: InstanceRef) -> StoreFuture<'_, Vec<cairn::store::InstanceRecord>> {
        self.inner.children(i)
    }
    fn slot_position(&self, i: InstanceRef) -> StoreFuture<'_, Option<u64>> {
        self.inner.slot_position(i)
    }
    fn waiting_for_slots(
        &self,
        w: &cairn::WorkflowName,
        limit: usize,
    ) -> StoreFuture<'_, (Vec<(String, u64)>, u64)> {
        self.inner.waiting_for_slots(w, limit)
    }
    fn create_schedule(&self, s: cairn::store::StoredSchedule) -> StoreFuture<'_, bool> {
        self.inner.create_schedule(s)
    }
    fn set_schedule_state(
        &self,
        name: &str,
        state: cairn::store::ScheduleState,
    ) -> StoreFuture<'_, bool> {
        self.inner.set_schedule_state(name, state)
    }
    fn schedules(&self) -> StoreFuture<'_, Vec<cairn::store::StoredSchedule>> {
        self.inner.schedules()
    }
    fn delete_schedule(&self, name: &str, declared: bool) -> StoreFuture<'_, bool> {
        self.inner.delete_schedule(name, declared)
    }
    fn register_versions(&self, v: Vec<cairn::store::WorkflowVersion>) -> StoreFuture<'_, ()> {
        self.inner.register_versions(v)
    }
    fn workflow_versions(&self) -> StoreFuture<'_, Vec<cairn::store::WorkflowVersion>> {
        self.inner.workflow_versions()
    }
    fn unfinished_versions(
        &self,
        w: &cairn::WorkflowName,
    ) -> StoreFuture<'_, Vec<(Option<String>, u64)>> {
        self.inner.unfinished_versions(w)
    }
    fn wake_awaiting(&self, w: &cairn::WorkflowName, v: &str, n: u64) -> StoreFuture<'_, u64> {
        self.inner.wake_awaiting(w, v, n)
    }
    fn fire_tick(&self, t: cairn::store::ScheduleTick) -> StoreFuture<'_, cairn::store::TickFired> {
        self.inner.fire_tick(t)
    }
    fn control(
        &self,
        w: &WorkflowName,
        id: &InstanceId,
        r: ControlRequest,
    ) -> StoreFuture<'_, ControlOutcome> {
        if self.dead() {
            return down();
        }
        self.inner.control(w, id, r)
    }
    fn commit(&self, lease: Lease, writes: Vec<Write>) -> StoreFuture<'_, InstanceStatus> {
        if self.dead() {
            return down();
        }
        let n = self.commits.fetch_add(1, Ordering::SeqCst) + 1;
        if n < self.fail_at {
            return self.inner.commit(lease, writes);
        }
        self.tripped.store(true, Ordering::SeqCst);
        self.notify.notify_one();
        match self.mode {
            Mode::Lost => down(),
            Mode::LandedButReportedFailed => {
                let landed = self.inner.commit(lease, writes);
                Box::pin(async move {
                    landed.await?;
                    Err(Error::Unavailable(
                        "injected failure after the write landed".into(),
                    ))
                })
            }
        }
    }
    fn log(&self, i: InstanceRef, after: u64, limit: usize) -> StoreFuture<'_, Vec<LogRecord>> {
        self.inner.log(i, after, limit)
    }
    fn log_head(&self) -> StoreFuture<'_, u64> {
        self.inner.log_head()
    }
    fn workflow_log(
        &self,
        w: &WorkflowName,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, cairn::store::WorkflowLogPage> {
        self.inner.workflow_log(w, after, limit)
    }
    fn next_ready(&self, w: &[WorkflowName]) -> StoreFuture<'_, Option<Timestamp>> {
        self.inner.next_ready(w)
    }
    fn timers(&self, w: &WorkflowName, now: Timestamp) -> StoreFuture<'_, cairn::store::Timers> {
        self.inner.timers(w, now)
    }
    fn send_event(&self, w: &WorkflowName, id: &InstanceId, e: NewEvent) -> StoreFuture<'_, Sent> {
        if self.dead() {
            return down();
        }
        self.inner.send_event(w, id, e)
    }
    fn take_event(
        &self,
        lease: Lease,
        step: StepKey,
        t: EventType,
        at: Timestamp,
    ) -> StoreFuture<'_, Option<StoredEvent>> {
        if self.dead() {
            return down();
        }
        self.inner.take_event(lease, step, t, at)
    }
    fn purge(&self, now: Timestamp, limit: usize) -> StoreFuture<'_, usize> {
        if self.dead() {
            return down();
        }
        self.inner.purge(now, limit)
    }
    fn next_purge(&self) -> StoreFuture<'_, Option<Timestamp>> {
        self.inner.next_purge()
    }
    fn close(&self) -> StoreFuture<'_, ()> {
        self.inner.close()
    }
}

/// How many times each step body ran, by step name.
type Runs = Arc<Mutex<HashMap<String, u32>>>;

fn bump(runs: &Runs, name: &'static str) {
    *runs.lock().unwrap().entry(name.to_owned()).or_insert(0) += 1;
}

/// Four steps, each feeding the next, one of them retried once, so the journal has
/// starts, failures, retries and successes.
fn workflow(runs: Runs) -> FnWorkflow {
    wf(move |event, step| {
        let runs = runs.clone();
        async move {
            let bump = |name: &'static str| bump(&runs, name);
            let base = event.payload["base"].as_u64().unwrap_or(0);
            let a: u64 = step
                .run("a", |_| {
                    bump("a");
                    async move { Ok(base + 1) }
                })
                .await?;
            let b: u64 = step
                .run("b", |ctx| {
                    bump("b");
                    async move {
                        if ctx.attempt == 1 {
                            Err("flaky".into())
                        } else {
                            Ok(a * 10)
                        }
                    }
                })
                .retries(Retries::constant(3, Duration::from_secs(1)))
                .await?;
            let (c, d): (u64, u64) = futures::try_join!(
                step.run("c", |_| {
                    bump("c");
                    async move { Ok(b + 2) }
                }),
                step.run("d", |_| {
                    bump("d");
                    async move { Ok(b + 3) }
                }),
            )?;
            Ok(json!(a + b + c + d))
        }
    })
}

const EXPECTED: u64 = 1 + 10 + 12 + 13;

fn open_store(path: &std::path::Path) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(path, Options::default().durability(Durability::Normal)).unwrap())
}

/// Fails the instance's `fail_at`th commit, then finishes it on a new engine. Returns
/// false, having checked the output, when the instance finished first: this run made fewer
/// commits (how many steps share a group commit depends on the writer thread's timing).
async fn crash_at(fail_at: usize, mode: Mode) -> bool {
    let (_dir, path) = crate::support::temp_db();
    let runs = Runs::default();
    let failing = Arc::new(FailingStore {
        inner: open_store(&path),
        fail_at,
        mode,
        commits: AtomicUsize::new(0),
        tripped: AtomicBool::new(false),
        notify: tokio::sync::Notify::new(),
    });
    let first = Engine::builder()
        .store(failing.clone())
        .clock(Clock::virtual_now())
        .register(workflow(runs.clone()))
        .start()
        .await
        .unwrap();
    let instance = first
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(json!({"base": 0})).id("x"))
        .await
        .unwrap();
    tokio::select! {
        biased;
        () = failing.notify.notified() => {}
        status = instance.wait() => {
            assert_eq!(status.unwrap().output, Some(json!(EXPECTED)));
            let made = failing.commits.load(Ordering::SeqCst);
            assert!(made < fail_at, "{made} commits made, write {fail_at} not failed");
            first.shutdown().await;
            return false;
        }
    }
    // The "crash": whatever was in flight stops where it is.
    first.shutdown().await;
    let committed: Vec<String> = {
        let store = open_store(&path);
        let journal = crate::support::journal_of(store.as_ref(), "test", "x").await;
        store.close().await.unwrap();
        journal
            .into_iter()
            .filter(|s| s.state == cairn::StepState::Succeeded)
            .map(|s| s.key.name)
            .collect()
    };
    let before = runs.lock().unwrap().clone();

    let second = crate::support::builder_at(&path)
        .register(workflow(runs.clone()))
        .start()
        .await
        .unwrap();
    let instance = second.workflow::<FnWorkflow>().get("x").await.unwrap();
    let status = instance.wait().await.unwrap();
    assert_eq!(
        status.output,
        Some(json!(EXPECTED)),
        "crash at write {fail_at} ({mode:?})"
    );
    let after = runs.lock().unwrap().clone();
    for name in &committed {
        assert_eq!(
            before.get(name),
            after.get(name),
            "step {name:?} was committed before the crash at write {fail_at} ({mode:?}) and ran again"
        );
    }
    for name in ["a", "b", "c", "d"] {
        assert!(
            after.get(name).copied().unwrap_or(0) >= 1,
            "step {name} ran"
        );
    }
    second.shutdown().await;
    true
}

#[tokio::test(start_paused = true)]
async fn every_commit_can_fail_and_a_new_engine_finishes_with_the_same_output() {
    for mode in [Mode::Lost, Mode::LandedButReportedFailed] {
        let mut failed = 0;
        while crash_at(failed + 1, mode).await {
            failed += 1;
            assert!(failed < 64, "the workflow never finished ({mode:?})");
        }
        // At least: a's start (with the instance's), b's (with a's success), b's failure,
        // its retry, c's and d's starts (with b's success), the end (with theirs).
        assert!(failed >= 7, "{mode:?}: only {failed} commits were made");
        eprintln!("{mode:?}: each of the {failed} commits failed in turn");
    }
}
