//! Races with the store, driven by holding chosen store calls (`support::Gates`) or by
//! tampering with one: an event sent between a wait's empty take and the commit that
//! hibernates the instance wakes it at once; a fenced store job that fails after it wrote
//! (SQLite's group commit) leaves nothing of its writes behind.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cairn::prelude::*;
use cairn::store::{
    Claimed, ControlOutcome, ControlRequest, Created, InstanceRecord, InstanceRef, Lease,
    ListQuery, NewEvent, NewInstance, Sent, Store, StoreFuture, StoredEvent, Write,
};
use cairn::{Clock, InstanceStatus, LogKind, LogRecord, StepKey, StepState};
use serde_json::{Value, json};

use crate::support::{
    Backend, FnWorkflow, Gates, gated_builder_on, raw_store_on, records, temp_db, wf,
};

/// Waits for `approve` (a day at most) and returns its payload.
fn approval() -> FnWorkflow {
    wf(|_, step| async move {
        let approval = step
            .wait_for_event::<Value>("approval", "approve")
            .timeout("1 day")
            .await?;
        Ok(approval.payload)
    })
}

/// The wait finds no event, and the instance is about to hibernate (its commit held) when
/// the event is sent: the send finds it still running (nothing to wake), so only the
/// hibernation's own look at the buffered events keeps it from sleeping through to its
/// timeout. It must wake at once and take the event.
async fn an_event_sent_between_the_empty_take_and_the_hibernation_wakes_the_instance(
    backend: Backend,
) {
    let (_dir, path) = temp_db();
    let gates = Gates::default();
    let store = raw_store_on(backend, &path).await;
    let engine = gated_builder_on(Arc::clone(&store), gates.clone())
        .clock(Clock::virtual_now())
        .register(approval())
        .start()
        .await
        .unwrap();
    let take = gates.arm("take_event");
    let instance = engine
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(json!({})))
        .await
        .unwrap();
    take.arrived().await;
    // Nothing is buffered yet: the take comes back empty, and the next commit is the
    // hibernation (the wait's start and anything deferred were committed before the take).
    let hibernation = gates.arm("commit");
    take.release();
    hibernation.arrived().await;
    // Sent to the database as another process would (another engine on PostgreSQL, a
    // second `cairn serve`): no in-memory notice reaches this engine's lifetime, so only
    // the store's look at the buffered events at hibernation can wake it.
    let sent = store
        .send_event(
            instance.workflow(),
            instance.id(),
            NewEvent {
                event_type: cairn_core::EventType::new("approve").unwrap(),
                payload: json!("ada").to_string(),
                at: engine.clock().now(),
                idempotency_key: None,
            },
        )
        .await
        .unwrap();
    assert!(matches!(sent, Sent::Buffered(_)), "{sent:?}");
    hibernation.release();
    let status = instance
        .wait_timeout(Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the instance slept through the event sent while it hibernated");
    assert_eq!(status.status, InstanceStatus::Complete, "{status:?}");
    assert_eq!(status.output, Some(json!("ada")));
    // At once, not when the wait's day-long timeout woke it (a replay then also finds the
    // buffered event, so the output alone cannot tell; the engine's virtual clock jumps to
    // the next timer when nothing else can run).
    let started = records(&instance, LogKind::WaitStart).await[0].entry.at;
    let completed = records(&instance, LogKind::WaitComplete).await[0].entry.at;
    let took = completed.since(started);
    assert!(
        took < Duration::from_secs(3600),
        "the event waited {took:?}, until the wait's timeout woke the instance"
    );
    assert_eq!(
        records(&instance, LogKind::WorkflowWaiting).await.len(),
        1,
        "it hibernated once, with the held commit"
    );
    assert_eq!(records(&instance, LogKind::WaitComplete).await.len(), 1);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_event_sent_between_a_waits_empty_take_and_its_hibernation_wakes_it_on_sqlite() {
    an_event_sent_between_the_empty_take_and_the_hibernation_wakes_the_instance(Backend::Sqlite)
        .await;
}

#[tokio::test(start_paused = true)]
async fn an_event_sent_between_a_waits_empty_take_and_its_hibernation_wakes_it_on_postgres() {
    an_event_sent_between_the_empty_take_and_the_hibernation_wakes_the_instance(Backend::Postgres)
        .await;
}

/// Waits for `approve` while a step waits for the test's `go`; whichever wins, a second
/// wait for `approve` follows. Returns the winner and what the second wait received.
fn approval_racing_a_step(go: &Arc<tokio::sync::Notify>) -> FnWorkflow {
    let go = Arc::clone(go);
    wf(move |_, step| {
        let go = Arc::clone(&go);
        async move {
            let winner = tokio::select! {
                biased;
                event = step.wait_for_event::<Value>("approval", "approve").timeout("7 days") => {
                    event?;
                    "approval"
                }
                other = step.run("other", move |_| {
                    let go = Arc::clone(&go);
                    async move {
                        go.notified().await;
                        Ok(1u32)
                    }
                }) => {
                    other?;
                    "other"
                }
            };
            let again = step
                .wait_for_event::<Value>("again", "approve")
                .timeout("7 days")
                .await?;
            Ok(json!({ "winner": winner, "again": again.payload }))
        }
    })
}

/// A wait loses a `select!` while its store call taking an event is on its way (sent to
/// the database, not yet answered). The event must not be lost with the dropped wait,
/// whichever lands first: the take, or the commit carrying the wait's cancel. Before,
/// a take that landed first consumed the event for a wait nobody awaited any more (the
/// cancel then found it finished and left it so), and a take that landed after the
/// cancel took the event all the same, and made the cancelled wait succeed. Either way
/// the next wait for the same type waited out its timeout.
async fn a_wait_dropped_while_its_take_is_on_its_way_loses_no_event(
    backend: Backend,
    take_lands_first: bool,
) {
    let go = Arc::new(tokio::sync::Notify::new());
    let run = RaceRun::start(backend, approval_racing_a_step(&go)).await;
    let (lost_wait_take, next_wait_take) = (&run.first_take, &run.second_take);
    // The wait's take is on its way, the event is buffered: then the step wins the race.
    lost_wait_take.arrived().await;
    run.instance
        .send_event("approve", &json!("ada"))
        .await
        .unwrap();
    if take_lands_first {
        let carrying_the_cancel = run.gates.arm_unsent_commit();
        go.notify_one();
        carrying_the_cancel.arrived().await;
        lost_wait_take.release();
        let answer = lost_wait_take.answered().await;
        assert!(
            answer.starts_with("Ok(Some("),
            "the take found the event: {answer}"
        );
        carrying_the_cancel.release();
    } else {
        go.notify_one();
        while run.approval().await.state != StepState::Cancelled {
            tokio::task::yield_now().await;
        }
        lost_wait_take.release();
        assert_eq!(
            lost_wait_take.answered().await,
            "Ok(None)",
            "a take that landed after its wait's cancel took the event"
        );
    }
    next_wait_take.arrived().await;
    next_wait_take.release();
    run.assert_the_event_went_to_the_next_wait().await;
}

/// One run of a workflow racing a wait for `approve` (named `approval`), with its first two
/// takes held.
struct RaceRun {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    gates: Gates,
    engine: cairn::Engine,
    instance: cairn::Instance<Value>,
    first_take: crate::support::Gate,
    second_take: crate::support::Gate,
}

impl RaceRun {
    /// Starts an engine running `workflow` (on the virtual clock) and its instance `x`.
    async fn start(backend: Backend, workflow: FnWorkflow) -> RaceRun {
        let (dir, path) = temp_db();
        let gates = Gates::default();
        let store = raw_store_on(backend, &path).await;
        let engine = gated_builder_on(Arc::clone(&store), gates.clone())
            .clock(Clock::virtual_now())
            .register(workflow)
            .start()
            .await
            .unwrap();
        let first_take = gates.arm("take_event");
        let second_take = gates.arm("take_event");
        let instance = engine
            .workflow::<FnWorkflow>()
            .create(CreateOptions::new(json!({})).id("x"))
            .await
            .unwrap();
        RaceRun {
            _dir: dir,
            store,
            gates,
            engine,
            instance,
            first_take,
            second_take,
        }
    }

    /// The wait that lost the race, as stored.
    async fn approval(&self) -> cairn::StepRecord {
        crate::support::journal_of(&*self.store, "test", "x")
            .await
            .into_iter()
            .find(|s| s.key.name == "approval")
            .unwrap()
    }

    /// The race went the other way, the wait in it is cancelled, and the event went to the
    /// next wait: the log shows it received once, by that wait.
    async fn assert_the_event_went_to_the_next_wait(self) {
        let status = self
            .instance
            .wait_timeout(Duration::from_secs(30 * 86_400))
            .await
            .unwrap()
            .expect("the instance did not end");
        assert_eq!(status.status, InstanceStatus::Complete, "{status:?}");
        assert_eq!(
            status.output,
            Some(json!({ "winner": "other", "again": "ada" })),
            "the event went with the dropped wait"
        );
        let approval = self.approval().await;
        assert_eq!(approval.state, StepState::Cancelled, "{approval:?}");
        let completions: Vec<(String, Value)> = records(&self.instance, LogKind::WaitComplete)
            .await
            .into_iter()
            .map(|r| (r.entry.step.unwrap().name, r.entry.meta))
            .collect();
        assert_eq!(completions.len(), 2, "{completions:?}");
        assert_eq!(completions[0].0, "approval", "{completions:?}");
        assert_eq!(completions[0].1["cancelled"], true, "{completions:?}");
        assert_eq!(completions[1].0, "again", "{completions:?}");
        assert_eq!(completions[1].1["payload"], "ada", "{completions:?}");
        self.engine.shutdown().await;
    }
}

/// Beside a step that waits for the test's `finish`, a wait for `approve` races the test's
/// `go` (an await that is no step); a second wait for `approve` follows.
fn approval_racing_a_signal_beside_a_step(
    go: &Arc<tokio::sync::Notify>,
    finish: &Arc<tokio::sync::Notify>,
) -> FnWorkflow {
    let (go, finish) = (Arc::clone(go), Arc::clone(finish));
    wf(move |_, step| {
        let (go, finish) = (Arc::clone(&go), Arc::clone(&finish));
        async move {
            let slow = step.run("slow", move |_| {
                let finish = Arc::clone(&finish);
                async move {
                    finish.notified().await;
                    Ok(1u32)
                }
            });
            let race = async {
                tokio::select! {
                    biased;
                    event = step.wait_for_event::<Value>("approval", "approve").timeout("7 days") => {
                        event.map(|_| "approval")
                    }
                    () = go.notified() => Ok("other"),
                }
            };
            let (slow, winner) = tokio::join!(slow, race);
            slow?;
            let winner = winner?;
            let again = step
                .wait_for_event::<Value>("again", "approve")
                .timeout("7 days")
                .await?;
            Ok(json!({ "winner": winner, "again": again.payload }))
        }
    })
}

/// The same race with a pause pending (a step's attempt in flight beside it), and an
/// await that is no step winning it: the wait's take is answered while the workflow drops
/// the wait, the pause takes effect once the step ends, and the replay after the resume
/// must race the same way and find the event for the next wait. (A wait that has its
/// event stays armed for its cancel also while it waits at the pause gate to hand it over,
/// where a race may still drop it; no test reaches that point deterministically.)
async fn a_wait_dropped_under_a_pending_pause_loses_no_event(backend: Backend) {
    let (go, finish) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let run = RaceRun::start(
        backend,
        approval_racing_a_signal_beside_a_step(&go, &finish),
    )
    .await;
    let (empty_take, the_take, instance) = (&run.first_take, &run.second_take, &run.instance);
    empty_take.arrived().await;
    empty_take.release();
    assert_eq!(empty_take.answered().await, "Ok(None)");
    // Pending while `slow`'s attempt runs; the event comes, and the wait takes it.
    instance.pause().await.unwrap();
    instance.send_event("approve", &json!("ada")).await.unwrap();
    the_take.arrived().await;
    the_take.release();
    let answer = the_take.answered().await;
    assert!(
        answer.starts_with("Ok(Some("),
        "the take found the event: {answer}"
    );
    // The race goes the other way while the wait waits at the gate; then `slow` ends,
    // and the pause takes effect.
    go.notify_one();
    finish.notify_one();
    while instance.status().await.unwrap().status != InstanceStatus::Paused {
        tokio::task::yield_now().await;
    }
    // The replay after the resume races the same way.
    go.notify_one();
    instance.resume().await.unwrap();
    run.assert_the_event_went_to_the_next_wait().await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_dropped_under_a_pending_pause_loses_no_event_on_sqlite() {
    a_wait_dropped_under_a_pending_pause_loses_no_event(Backend::Sqlite).await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_dropped_under_a_pending_pause_loses_no_event_on_postgres() {
    a_wait_dropped_under_a_pending_pause_loses_no_event(Backend::Postgres).await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_dropped_while_its_take_is_on_its_way_loses_no_event_take_first_on_sqlite() {
    a_wait_dropped_while_its_take_is_on_its_way_loses_no_event(Backend::Sqlite, true).await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_dropped_while_its_take_is_on_its_way_loses_no_event_cancel_first_on_sqlite() {
    a_wait_dropped_while_its_take_is_on_its_way_loses_no_event(Backend::Sqlite, false).await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_dropped_while_its_take_is_on_its_way_loses_no_event_take_first_on_postgres() {
    a_wait_dropped_while_its_take_is_on_its_way_loses_no_event(Backend::Postgres, true).await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_dropped_while_its_take_is_on_its_way_loses_no_event_cancel_first_on_postgres() {
    a_wait_dropped_while_its_take_is_on_its_way_loses_no_event(Backend::Postgres, false).await;
}

/// A SQLite store whose first `take_event` names a wait the journal does not have: the
/// store deletes the event, then fails on the missing entry. A fenced job (no savepoint)
/// that fails after it wrote: nothing of its group may land.
struct Tampered {
    inner: Arc<dyn Store>,
    tampered: AtomicBool,
    /// Set when the tampered take failed (the test's precondition).
    failed: Arc<AtomicBool>,
}

/// The event taken by a wait whose first take failed after deleting it (a fenced job that
/// wrote, then failed, in SQLite's group commit) is still there: the group was abandoned,
/// the engine told the store is unavailable, and the replay's take delivers it, once.
#[tokio::test(start_paused = true)]
async fn a_fenced_job_that_fails_after_writing_leaves_nothing_and_the_event_is_delivered_once() {
    let (_dir, path) = temp_db();
    let store = cairn::sqlite::SqliteStore::open(&path, Default::default()).unwrap();
    let failed = Arc::new(AtomicBool::new(false));
    let engine = cairn::Engine::builder()
        .store(Arc::new(Tampered {
            inner: Arc::new(store),
            tampered: AtomicBool::new(false),
            failed: failed.clone(),
        }))
        .clock(Clock::virtual_now())
        .register(wf(|_, step| async move {
            // Asleep (hibernated) while the event is sent: the first take finds it.
            step.sleep("nap", "1 minute").await?;
            let approval = step
                .wait_for_event::<Value>("approval", "approve")
                .timeout("1 day")
                .await?;
            Ok(approval.payload)
        }))
        .start()
        .await
        .unwrap();
    let instance = engine
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(json!({})))
        .await
        .unwrap();
    instance.send_event("approve", &json!("ada")).await.unwrap();
    let status = instance
        .wait_timeout(Duration::from_secs(3600))
        .await
        .unwrap()
        .expect("the event was lost with the failed take");
    assert_eq!(status.status, InstanceStatus::Complete, "{status:?}");
    assert_eq!(status.output, Some(json!("ada")));
    assert!(failed.load(Ordering::SeqCst), "the tampered take failed");
    let taken: Vec<LogRecord> = records(&instance, LogKind::WaitComplete).await;
    assert_eq!(taken.len(), 1, "{taken:?}");
    engine.shutdown().await;
}

impl Store for Tampered {
    fn create(&self, batch: Vec<NewInstance>) -> StoreFuture<'_, Vec<Created>> {
        self.inner.create(batch)
    }
    fn instance(
        &self,
        w: &cairn::WorkflowName,
        id: &cairn::InstanceId,
    ) -> StoreFuture<'_, Option<InstanceRecord>> {
        self.inner.instance(w, id)
    }
    fn list(&self, q: ListQuery) -> StoreFuture<'_, Vec<InstanceRecord>> {
        self.inner.list(q)
    }
    fn count(&self, w: &cairn::WorkflowName, s: cairn::InstanceStatus) -> StoreFuture<'_, u64> {
        self.inner.count(w, s)
    }
    fn count_matching(&self, q: cairn_store::ListQuery) -> StoreFuture<'_, u64> {
        self.inner.count_matching(q)
    }
    fn claim(
        &self,
        owner: &str,
        w: &[cairn::WorkflowName],
        now: cairn::Timestamp,
        ttl: std::time::Duration,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Claimed>> {
        self.inner.claim(owner, w, now, ttl, limit)
    }
    fn release_all(&self, owner: &str) -> StoreFuture<'_, ()> {
        self.inner.release_all(owner)
    }

    fn reclaim(
        &self,
        owner: &str,
        lease: cairn::store::Lease,
        now: cairn::Timestamp,
        ttl: std::time::Duration,
    ) -> StoreFuture<'_, cairn::store::Lease> {
        self.inner.reclaim(owner, lease, now, ttl)
    }

    fn renew(
        &self,
        owner: &str,
        leases: Vec<cairn::store::Lease>,
        now: cairn::Timestamp,
        until: cairn::Timestamp,
    ) -> StoreFuture<'_, Vec<cairn::store::Lease>> {
        self.inner.renew(owner, leases, now, until)
    }
    fn journal(&self, i: InstanceRef) -> StoreFuture<'_, Vec<cairn::StepRecord>> {
        self.inner.journal(i)
    }
    fn stream_chunk(
        &self,
        i: InstanceRef,
        step: cairn::StepKey,
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
    fn commit(&self, lease: Lease, writes: Vec<Write>) -> StoreFuture<'_, cairn::InstanceStatus> {
        self.inner.commit(lease, writes)
    }
    fn control(
        &self,
        w: &cairn::WorkflowName,
        id: &cairn::InstanceId,
        r: ControlRequest,
    ) -> StoreFuture<'_, ControlOutcome> {
        self.inner.control(w, id, r)
    }
    fn log(&self, i: InstanceRef, after: u64, limit: usize) -> StoreFuture<'_, Vec<LogRecord>> {
        self.inner.log(i, after, limit)
    }
    fn log_head(&self) -> StoreFuture<'_, u64> {
        self.inner.log_head()
    }
    fn workflow_log(
        &self,
        w: &cairn::WorkflowName,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, cairn::store::WorkflowLogPage> {
        self.inner.workflow_log(w, after, limit)
    }
    fn next_ready(&self, w: &[cairn::WorkflowName]) -> StoreFuture<'_, Option<cairn::Timestamp>> {
        self.inner.next_ready(w)
    }
    fn timers(
        &self,
        w: &cairn::WorkflowName,
        now: cairn::Timestamp,
    ) -> StoreFuture<'_, cairn::store::Timers> {
        self.inner.timers(w, now)
    }
    fn send_event(
        &self,
        w: &cairn::WorkflowName,
        id: &cairn::InstanceId,
        e: NewEvent,
    ) -> StoreFuture<'_, Sent> {
        self.inner.send_event(w, id, e)
    }
    fn take_event(
        &self,
        lease: Lease,
        step: StepKey,
        t: cairn::EventType,
        at: cairn::Timestamp,
    ) -> StoreFuture<'_, Option<StoredEvent>> {
        // The first take names a wait the journal does not have: the store deletes the
        // event, then fails at the wait's missing entry, after it wrote.
        if self.tampered.swap(true, Ordering::SeqCst) {
            return self.inner.take_event(lease, step, t, at);
        }
        let step = StepKey {
            name: format!("{} (not journaled)", step.name),
            ..step
        };
        let take = self.inner.take_event(lease, step, t, at);
        let failed = Arc::clone(&self.failed);
        Box::pin(async move {
            let taken = take.await;
            failed.store(taken.is_err(), Ordering::SeqCst);
            taken
        })
    }
    fn purge(&self, now: cairn::Timestamp, limit: usize) -> StoreFuture<'_, usize> {
        self.inner.purge(now, limit)
    }
    fn next_purge(&self) -> StoreFuture<'_, Option<cairn::Timestamp>> {
        self.inner.next_purge()
    }
    fn changes(&self) -> Option<futures::stream::BoxStream<'static, cairn::store::Changes>> {
        self.inner.changes()
    }
    fn close(&self) -> StoreFuture<'_, ()> {
        self.inner.close()
    }
}

/// Review finding: a step dropped (it lost a `select!`) while the start of its retry is on
/// its way was recorded as cancelled with the previous attempt's count ("while it waited to
/// retry after attempt 1"), leaving the retry's `ATTEMPT_START` without an outcome. Every
/// attempt started must end in the log, and the step's row count it.
#[tokio::test(start_paused = true)]
async fn a_step_dropped_while_its_retrys_start_is_on_its_way_records_that_attempt_cancelled() {
    let (_dir, path) = temp_db();
    let gates = Gates::default();
    let go = Arc::new(tokio::sync::Notify::new());
    let g = Arc::clone(&go);
    let store = raw_store_on(Backend::Sqlite, &path).await;
    let engine = gated_builder_on(store, gates.clone())
        .clock(Clock::virtual_now())
        .register(wf(move |_, step| {
            let go = Arc::clone(&g);
            async move {
                let won = tokio::select! {
                    biased;
                    out = step
                        .run("flaky", |ctx| async move {
                            if ctx.attempt == 1 {
                                Err(cairn::StepError::from("try again"))
                            } else {
                                std::future::pending::<Result<u32, StepError>>().await
                            }
                        })
                        .retries(cairn::Retries::constant(3, Duration::from_secs(1))) => {
                        out?;
                        "flaky"
                    }
                    () = go.notified() => "go",
                };
                Ok(json!(won))
            }
        }))
        .start()
        .await
        .unwrap();
    let instance = engine
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(json!({})).id("x"))
        .await
        .unwrap();
    crate::support::until_logged(&instance, LogKind::AttemptFailure, 1).await;
    // The next commit is the retry's start, after its back-off: its answer is held.
    let retry_start = gates.arm("commit");
    retry_start.arrived().await;
    go.notify_one();
    retry_start.release();
    let status = instance.wait().await.unwrap();
    assert_eq!(status.output, Some(json!("go")), "{status:?}");
    let starts = records(&instance, LogKind::AttemptStart).await.len();
    let ends = records(&instance, LogKind::AttemptFailure).await.len()
        + records(&instance, LogKind::AttemptSuccess).await.len();
    assert_eq!(starts, 2, "{:?}", crate::support::kinds(&instance).await);
    assert_eq!(
        ends,
        starts,
        "an attempt started without an outcome: {:?}",
        crate::support::kinds(&instance).await
    );
    engine.shutdown().await;
}
