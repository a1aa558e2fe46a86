//! Workflows run by workers (`docs/worker-protocol.md`), driven frame by frame by a worker
//! written here: the engine's side of the protocol, on the virtual clock. (The TypeScript
//! SDK's own tests and `tests/typescript.rs` in cairn-cli run real workers.)

use std::time::Duration;

use super::support::{engine, wf};
use cairn::prelude::*;
use cairn::{Engine, InstanceStatus, WorkerConnection};
use serde_json::{Value, json};

/// A worker speaking the protocol by hand.
struct Worker {
    conn: WorkerConnection,
}

impl Worker {
    async fn hello(engine: &Engine, workflows: &[(&str, &str)], concurrency: usize) -> Worker {
        let workflows: Vec<Value> = workflows
            .iter()
            .map(|(name, version)| json!({ "name": name, "version": version }))
            .collect();
        let hello = json!({
            "type": "hello", "protocol": 1, "worker": "test",
            "workflows": workflows, "concurrency": concurrency,
        });
        let conn = engine.connect_worker(&hello.to_string()).await.unwrap();
        let mut worker = Worker { conn };
        worker.expect("welcome").await;
        worker
    }

    async fn next(&mut self) -> Value {
        let frame = self.conn.next_frame().await.expect("a frame");
        serde_json::from_str(&frame).unwrap()
    }

    /// The next frame, which must be of `kind`.
    async fn expect(&mut self, kind: &str) -> Value {
        let frame = self.next().await;
        assert_eq!(frame["type"], kind, "{frame}");
        frame
    }

    fn send(&self, frame: Value) {
        self.conn.receive(&frame.to_string());
    }

    /// Sends op `seq` of `run` (fields of `op` merged in).
    fn op(&self, run: &Value, seq: u64, op: Value) {
        let mut frame = json!({ "type": "op", "run": run, "seq": seq });
        for (k, v) in op.as_object().unwrap() {
            frame[k] = v.clone();
        }
        self.send(frame);
    }

    fn idle(&self, run: &Value, ops: u64) {
        self.send(json!({ "type": "idle", "run": run, "ops": ops }));
    }

    fn answer(&self, asked: &Value, kind: &str, outcome: Result<Value, Value>) {
        let mut frame = json!({ "type": kind, "run": asked["run"], "task": asked["task"] });
        match outcome {
            Ok(v) => frame["ok"] = v,
            Err(e) => frame["error"] = e,
        }
        self.send(frame);
    }

    fn returns(&self, run: &Value, outcome: Result<Value, Value>) {
        let mut frame = json!({ "type": "runResult", "run": run });
        match outcome {
            Ok(v) => frame["ok"] = v,
            Err(e) => frame["error"] = e,
        }
        self.send(frame);
    }
}

async fn create(engine: &Engine, workflow: &str, id: &str, params: Value) -> cairn::Instance {
    engine
        .workflow_by_name(workflow)
        .unwrap()
        .create(CreateOptions::new(params).id(id))
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_workers_workflow_runs_each_step_once_with_its_params_exactly() {
    let (engine, _dir) = engine(|b| b).await;
    let mut worker = Worker::hello(&engine, &[("checkout", "v1")], 4).await;
    // Params as the client wrote them, `$` keys too.
    let params = json!({ "cart": 3, "$bytes": "not bytes", "$$x": [1] });
    let instance = create(&engine, "checkout", "order-1", params.clone()).await;
    let start = worker.expect("start").await;
    assert_eq!(start["workflow"], "checkout");
    assert_eq!(start["version"], "v1");
    assert_eq!(start["instance"]["id"], "order-1");
    assert_eq!(start["instance"]["params"], params);
    let run = start["run"].clone();
    worker.op(&run, 0, json!({ "op": "do", "name": "charge", "config": null }));
    let attempt = worker.expect("attempt").await;
    assert_eq!(attempt["seq"], 0);
    assert_eq!(attempt["attempt"], 1);
    assert_eq!(attempt["step"], json!({ "name": "charge", "count": 1 }));
    assert_eq!(attempt["config"]["retries"]["limit"], 5);
    worker.answer(&attempt, "attemptResult", Ok(json!({ "charge": "ch_1", "$k": 1 })));
    let result = worker.expect("opResult").await;
    assert_eq!(result["seq"], 0);
    assert_eq!(result["ok"], json!({ "charge": "ch_1", "$k": 1 }));
    worker.returns(&run, Ok(json!({ "receipt": "r-1" })));
    assert_eq!(worker.expect("stop").await["reason"], "done");
    let status = instance.wait().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Complete);
    assert_eq!(status.output, Some(json!({ "receipt": "r-1" })));
    let details = instance.details().await.unwrap();
    assert_eq!(details.steps.len(), 1);
    assert_eq!(details.steps[0].name, "charge");
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_worker_lost_mid_attempt_leaves_the_attempt_interrupted_and_another_worker_retries_it() {
    let (engine, _dir) = engine(|b| b).await;
    let mut first = Worker::hello(&engine, &[("checkout", "v1")], 4).await;
    let instance = create(&engine, "checkout", "order-1", json!({})).await;
    let start = first.expect("start").await;
    let run = start["run"].clone();
    first.op(&run, 0, json!({ "op": "do", "name": "done once", "config": null }));
    let attempt = first.expect("attempt").await;
    first.answer(&attempt, "attemptResult", Ok(json!(1)));
    first.expect("opResult").await;
    first.op(&run, 1, json!({ "op": "do", "name": "charge", "config": null }));
    first.expect("attempt").await;
    // The worker dies with the attempt in flight.
    drop(first);
    let mut second = Worker::hello(&engine, &[("checkout", "v1")], 4).await;
    let start = second.expect("start").await;
    let run = start["run"].clone();
    // The replay: the finished step answers from the journal, no attempt asked.
    second.op(&run, 0, json!({ "op": "do", "name": "done once", "config": null }));
    let answered = second.expect("opResult").await;
    assert_eq!(answered["ok"], 1);
    second.op(&run, 1, json!({ "op": "do", "name": "charge", "config": null }));
    let attempt = second.expect("attempt").await;
    // The interrupted attempt counted.
    assert_eq!(attempt["attempt"], 2);
    second.answer(&attempt, "attemptResult", Ok(json!("ch_1")));
    second.expect("opResult").await;
    second.returns(&run, Ok(Value::Null));
    second.expect("stop").await;
    assert_eq!(
        instance.wait().await.unwrap().status,
        InstanceStatus::Complete
    );
    engine.shutdown().await;
}

/// Creates `n` instances of `checkout` for `worker`, makes op 0 of each run with `op`, and
/// returns the instances and the attempts the worker was asked for.
async fn first_attempts(
    engine: &Engine,
    worker: &mut Worker,
    n: usize,
    op: impl Fn() -> Value,
) -> (Vec<cairn::Instance>, Vec<Value>) {
    let mut instances = Vec::new();
    for i in 0..n {
        instances.push(create(engine, "checkout", &format!("order-{i}"), json!({})).await);
    }
    let mut attempts = Vec::new();
    while attempts.len() < n {
        let frame = worker.next().await;
        match frame["type"].as_str() {
            Some("start") => worker.op(&frame["run"], 0, op()),
            Some("attempt") => attempts.push(frame),
            _ => panic!("unexpected {frame}"),
        }
    }
    (instances, attempts)
}

/// A worker that answers its last attempt and closes at once (`CairnWorker.close()` does,
/// as soon as nothing runs): the success arrived before the close and must be committed,
/// not dropped with the run. The driver used to return on the loss before polling the
/// step half of the time (`select!`'s random order), so the step ran again on the next
/// worker, or, with no retries left, failed as interrupted. Sixteen instances: before the
/// fix, all sixteen passing had a chance of 2^-16.
#[tokio::test(start_paused = true)]
async fn a_worker_that_closes_right_after_its_answer_loses_no_success() {
    const N: usize = 16;
    let charge = || json!({ "op": "do", "name": "charge", "config": { "retries": { "limit": 0, "delay": 0 } } });
    let (engine, _dir) = engine(|b| b).await;
    let mut first = Worker::hello(&engine, &[("checkout", "v1")], N).await;
    let (instances, attempts) = first_attempts(&engine, &mut first, N, charge).await;
    for attempt in &attempts {
        first.answer(attempt, "attemptResult", Ok(json!("ch_1")));
    }
    drop(first);
    let mut second = Worker::hello(&engine, &[("checkout", "v1")], N).await;
    let mut replayed = 0;
    while replayed < N {
        let frame = second.next().await;
        match frame["type"].as_str() {
            Some("start") => second.op(&frame["run"], 0, charge()),
            Some("opResult") => {
                assert_eq!(frame["ok"], "ch_1", "the success was lost: {frame}");
                second.returns(&frame["run"], Ok(Value::Null));
                replayed += 1;
            }
            Some("attempt") => panic!("the step ran again: {frame}"),
            Some("stop") => assert_eq!(frame["reason"], "done", "{frame}"),
            _ => panic!("unexpected {frame}"),
        }
    }
    for instance in &instances {
        assert_eq!(
            instance.wait().await.unwrap().status,
            InstanceStatus::Complete
        );
    }
    engine.shutdown().await;
}

/// A `sleepUntil` whose time is past what milliseconds in an i64 hold (JavaScript's
/// `Number.MAX_VALUE`) is a time too far away, answered as the step's error: the frame
/// used to be refused whole, the run was never told, and it waited for that op for ever.
#[tokio::test(start_paused = true)]
async fn a_sleep_until_beyond_any_timestamp_is_answered_as_too_far_away() {
    let (engine, _dir) = engine(|b| b).await;
    let mut worker = Worker::hello(&engine, &[("checkout", "v1")], 4).await;
    let instance = create(&engine, "checkout", "order-1", json!({})).await;
    let start = worker.expect("start").await;
    let run = start["run"].clone();
    worker.op(&run, 0, json!({ "op": "sleepUntil", "name": "never", "until": 1.7976931348623157e308 }));
    let answered = worker.expect("opResult").await;
    let message = answered["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("365 days"), "{answered}");
    worker.returns(&run, Ok(Value::Null));
    worker.expect("stop").await;
    assert_eq!(
        instance.wait().await.unwrap().status,
        InstanceStatus::Complete
    );
    engine.shutdown().await;
}

/// `Promise.all([step.do("a").then(() => step.do("b")), step.waitForEvent(.., "7 days")])`:
/// the worker says `idle` after making both ops, and "a" is answered before that `idle`
/// reaches the engine (at once from the journal on a replay). The `idle` is stale: the
/// answer makes the code go on to "b". Taken as it was, it let the run hibernate for the
/// wait's seven days before "b" arrived (then refused as stale), so "b" ran only after
/// the event or the timeout.
#[tokio::test(start_paused = true)]
async fn an_idle_sent_before_an_answer_reached_the_worker_does_not_hibernate_the_run() {
    let (engine, _dir) = engine(|b| b).await;
    let mut worker = Worker::hello(&engine, &[("checkout", "v1")], 4).await;
    let instance = create(&engine, "checkout", "order-1", json!({})).await;
    let run = worker.expect("start").await["run"].clone();
    worker.op(&run, 0, json!({ "op": "do", "name": "a", "config": null }));
    worker.op(
        &run,
        1,
        json!({ "op": "waitForEvent", "name": "approval", "eventType": "approve", "timeout": "7 days" }),
    );
    let attempt = worker.expect("attempt").await;
    worker.answer(&attempt, "attemptResult", Ok(json!(1)));
    assert_eq!(worker.expect("opResult").await["seq"], 0);
    // Sent before the answer above reached the worker.
    worker.send(json!({ "type": "idle", "run": run, "ops": 2, "answers": 0 }));
    tokio::time::sleep(Duration::from_millis(50)).await;
    worker.op(&run, 2, json!({ "op": "do", "name": "b", "config": null }));
    let frame = worker.next().await;
    assert_eq!(frame["type"], "attempt", "{frame}");
    assert_eq!(frame["step"]["name"], "b");
    worker.answer(&frame, "attemptResult", Ok(json!(2)));
    assert_eq!(worker.expect("opResult").await["seq"], 2);
    worker.returns(&run, Ok(Value::Null));
    worker.expect("stop").await;
    assert_eq!(
        instance.wait().await.unwrap().status,
        InstanceStatus::Complete
    );
    engine.shutdown().await;
}

/// A worker that answers an attempt with a retryable error, sends an op out of order and
/// closes, all at once: the failure's commit is on its way in an op the run stops polling
/// (the op out of order gives the run up). Settling what the worker's answers left, the
/// driver used to wait for that commit for ever, so the instance stayed leased with no run.
#[tokio::test(start_paused = true)]
async fn a_worker_that_fails_an_attempt_breaks_the_protocol_and_closes_leaves_no_instance_stuck() {
    const N: usize = 16;
    let charge = || json!({ "op": "do", "name": "charge", "config": { "retries": { "limit": 1, "delay": "1 hour" } } });
    let (engine, _dir) = engine(|b| b).await;
    let mut first = Worker::hello(&engine, &[("checkout", "v1")], N).await;
    let (_, attempts) = first_attempts(&engine, &mut first, N, charge).await;
    for attempt in &attempts {
        first.answer(attempt, "attemptResult", Err(json!({ "name": "Error", "message": "declined" })));
        first.op(&attempt["run"], 9, charge());
    }
    drop(first);
    let mut second = Worker::hello(&engine, &[("checkout", "v1")], N).await;
    let mut started = std::collections::HashSet::new();
    while started.len() < N {
        let frame = tokio::time::timeout(Duration::from_secs(300), second.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {N} instances ran again", started.len()));
        if frame["type"] == "start" {
            started.insert(frame["instance"]["id"].as_str().unwrap().to_owned());
        }
    }
    engine.shutdown().await;
}

/// A worker that sends an op and closes at once (it crashed right after): the op arrives
/// with the loss, and no attempt of it may start, since nobody is left to run it. The
/// gate used to close only once the driver noticed the loss, so half the time the step's
/// start was committed first, and the next run counted an attempt that never ran as
/// interrupted (with no retries left, the step failed for good).
#[tokio::test(start_paused = true)]
async fn an_op_sent_by_a_worker_that_closes_at_once_starts_no_attempt() {
    const N: usize = 16;
    let step = |name: &str| json!({ "op": "do", "name": name, "config": { "retries": { "limit": 0, "delay": 0 } } });
    let (engine, _dir) = engine(|b| b).await;
    let mut first = Worker::hello(&engine, &[("checkout", "v1")], N).await;
    for i in 0..N {
        create(&engine, "checkout", &format!("order-{i}"), json!({})).await;
    }
    let mut runs = Vec::new();
    while runs.len() < N {
        let frame = first.next().await;
        match frame["type"].as_str() {
            Some("start") => first.op(&frame["run"], 0, step("a")),
            Some("attempt") => first.answer(&frame, "attemptResult", Ok(json!(1))),
            Some("opResult") => runs.push(frame["run"].clone()),
            _ => panic!("unexpected {frame}"),
        }
    }
    // Each run's next op, and the close, before the engine reads any of them.
    for run in &runs {
        first.op(run, 1, step("b"));
    }
    drop(first);
    let mut second = Worker::hello(&engine, &[("checkout", "v1")], N).await;
    let mut attempted = 0;
    while attempted < N {
        let frame = second.next().await;
        match frame["type"].as_str() {
            Some("start") => {
                second.op(&frame["run"], 0, step("a"));
                second.op(&frame["run"], 1, step("b"));
            }
            Some("opResult") => assert_eq!(frame["seq"], 0, "{frame}"),
            Some("attempt") => {
                assert_eq!(frame["step"]["name"], "b");
                assert_eq!(frame["attempt"], 1, "an attempt nobody ran was counted: {frame}");
                attempted += 1;
            }
            _ => panic!("unexpected {frame}"),
        }
    }
    engine.shutdown().await;
}

/// Many answers and then the close: 300 attempts failed (each committing its failure),
/// then the last one succeeded. Settling took as many answers per poll as the task's
/// budget allowed, so two polls with nothing deferred came before the success was taken,
/// and it was lost (the step ran again).
#[tokio::test(start_paused = true)]
async fn a_success_behind_many_failures_answered_before_a_worker_closes_is_kept() {
    const OPS: u64 = 301;
    let (engine, _dir) = engine(|b| b).await;
    let mut first = Worker::hello(&engine, &[("checkout", "v1")], 4).await;
    create(&engine, "checkout", "order-1", json!({})).await;
    let run = first.expect("start").await["run"].clone();
    let op = |seq: u64| {
        let limit = if seq == OPS - 1 { 0 } else { 1 };
        json!({ "op": "do", "name": format!("s{seq}"), "config": { "retries": { "limit": limit, "delay": "1 hour" } } })
    };
    for seq in 0..OPS {
        first.op(&run, seq, op(seq));
    }
    let mut attempts = Vec::new();
    while attempts.len() < OPS as usize {
        let frame = first.expect("attempt").await;
        attempts.push(frame);
    }
    attempts.sort_by_key(|a| a["seq"].as_u64());
    for attempt in &attempts {
        let outcome = if attempt["seq"] == OPS - 1 {
            Ok(json!("kept"))
        } else {
            Err(json!({ "name": "Error", "message": "declined" }))
        };
        first.answer(attempt, "attemptResult", outcome);
    }
    drop(first);
    let mut second = Worker::hello(&engine, &[("checkout", "v1")], 4).await;
    let run = second.expect("start").await["run"].clone();
    second.op(&run, 0, op(OPS - 1));
    let frame = second.next().await;
    assert_eq!(frame["type"], "opResult", "the success was lost: {frame}");
    assert_eq!(frame["ok"], "kept", "{frame}");
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_instance_pinned_to_a_version_waits_for_a_worker_of_it_and_new_ones_take_the_newest()
{
    let (engine, _dir) = engine(|b| b).await;
    let v1 = Worker::hello(&engine, &[("checkout", "v1")], 4).await;
    drop(v1);
    // No worker: created on v1 (the newest known), it stays queued.
    let old = create(&engine, "checkout", "old", json!({})).await;
    let mut v2 = Worker::hello(&engine, &[("checkout", "v2")], 4).await;
    let new = create(&engine, "checkout", "new", json!({})).await;
    // v2 runs only the instance created on v2 (the old one is parked, still queued).
    let start = v2.expect("start").await;
    assert_eq!(start["instance"]["id"], "new");
    assert_eq!(start["version"], "v2");
    v2.returns(&start["run"], Ok(json!("v2")));
    v2.expect("stop").await;
    assert_eq!(new.wait().await.unwrap().output, Some(json!("v2")));
    // Parked, still queued, and it says for which version.
    while old.details().await.unwrap().waiting_for_worker.is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let details = old.details().await.unwrap();
    assert_eq!(details.status, InstanceStatus::Queued);
    assert_eq!(details.waiting_for_worker.as_deref(), Some("v1"));
    assert_eq!(details.version.as_deref(), Some("v1"));
    let versions = engine.workflow_versions("checkout").await.unwrap();
    let shown: Vec<(String, u64, usize, bool)> = versions
        .iter()
        .map(|v| (v.version.clone(), v.unfinished, v.workers, v.newest))
        .collect();
    assert_eq!(
        shown,
        [
            ("v1".to_owned(), 1, 0, false),
            ("v2".to_owned(), 0, 1, true)
        ]
    );
    // A worker of v1 comes back: the old instance runs on it.
    let mut v1 = Worker::hello(&engine, &[("checkout", "v1")], 4).await;
    let start = v1.expect("start").await;
    assert_eq!(start["instance"]["id"], "old");
    assert_eq!(start["version"], "v1");
    v1.returns(&start["run"], Ok(json!("v1")));
    assert_eq!(old.wait().await.unwrap().output, Some(json!("v1")));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_run_waiting_on_a_long_sleep_hibernates_once_the_worker_is_idle_and_replays_later() {
    let (engine, _dir) = engine(|b| b).await;
    let mut worker = Worker::hello(&engine, &[("nap", "v1")], 4).await;
    let instance = create(&engine, "nap", "n", json!({})).await;
    let run = worker.expect("start").await["run"].clone();
    // Promise.all([sleep 1 hour, do]): the sleep alone must not hibernate the run before
    // the worker has made every op it is going to make.
    worker.op(&run, 0, json!({ "op": "sleep", "name": "cool off", "duration": "1 hour" }));
    worker.op(&run, 1, json!({ "op": "do", "name": "meanwhile", "config": null }));
    let attempt = worker.expect("attempt").await;
    worker.answer(&attempt, "attemptResult", Ok(json!("done")));
    let result = worker.expect("opResult").await;
    assert_eq!(result["seq"], 1);
    worker.idle(&run, 2);
    assert_eq!(worker.expect("stop").await["reason"], "hibernated");
    instance
        .wait_for(|s| s.status == InstanceStatus::Waiting)
        .await
        .unwrap();
    // An hour on, the run starts again: both ops answer at once from the journal.
    let run = worker.expect("start").await["run"].clone();
    worker.op(&run, 0, json!({ "op": "sleep", "name": "cool off", "duration": 3_600_000 }));
    worker.op(&run, 1, json!({ "op": "do", "name": "meanwhile", "config": null }));
    let mut answered = [worker.expect("opResult").await, worker.expect("opResult").await];
    answered.sort_by_key(|f| f["seq"].as_u64());
    assert_eq!(answered[0]["ok"], Value::Null);
    assert_eq!(answered[1]["ok"], "done");
    worker.returns(&run, Ok(json!("rested")));
    assert_eq!(
        instance.wait().await.unwrap().output,
        Some(json!("rested"))
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn e21_a_failed_run_rolls_back_the_steps_that_started_on_the_worker() {
    let (engine, _dir) = engine(|b| b).await;
    let mut worker = Worker::hello(&engine, &[("saga", "v1")], 4).await;
    let instance = create(&engine, "saga", "s", json!({})).await;
    let run = worker.expect("start").await["run"].clone();
    worker.op(
        &run,
        0,
        json!({ "op": "do", "name": "reserve", "config": null, "rollback": { "config": null } }),
    );
    let attempt = worker.expect("attempt").await;
    worker.answer(&attempt, "attemptResult", Ok(json!({ "hold": 5 })));
    worker.expect("opResult").await;
    worker.op(
        &run,
        1,
        json!({ "op": "do", "name": "charge", "config": { "retries": { "limit": 0, "delay": 0 } } }),
    );
    let attempt = worker.expect("attempt").await;
    worker.answer(
        &attempt,
        "attemptResult",
        Err(json!({ "name": "NonRetryableError", "message": "card declined", "nonRetryable": true })),
    );
    let failed = worker.expect("opResult").await;
    assert_eq!(failed["error"]["name"], "NonRetryableError");
    worker.returns(
        &run,
        Err(json!({ "name": "NonRetryableError", "message": "card declined" })),
    );
    let rollback = worker.expect("rollback").await;
    assert_eq!(rollback["seq"], 0);
    assert_eq!(rollback["output"], json!({ "hold": 5 }));
    assert_eq!(rollback["error"]["message"], "card declined");
    worker.answer(&rollback, "rollbackResult", Ok(Value::Null));
    assert_eq!(worker.expect("stop").await["reason"], "done");
    let status = instance.wait().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Errored);
    assert_eq!(status.error.unwrap().message, "card declined");
    engine.shutdown().await;
}

/// A step the code did not await, answered in the same burst as the run's end (the
/// worker sends `attemptResult` then `runResult` without waiting for the `opResult`): the
/// step's success is kept, and its rollback gets its output. Before, the engine picked
/// either frame first at random and, picking the end, recorded the step as cancelled: the
/// charge had happened, and its refund got no output to refund.
#[tokio::test(start_paused = true)]
async fn e21_a_success_answered_with_the_runs_end_is_kept_and_rolled_back_with_its_output() {
    let (engine, _dir) = engine(|b| b).await;
    let mut worker = Worker::hello(&engine, &[("saga", "v1")], 1).await;
    // Each try had an even chance to lose the success: 20 of them all keep it only if
    // the answer is always taken first.
    for i in 0..20 {
        let instance = create(&engine, "saga", &format!("s{i}"), json!({})).await;
        let run = worker.expect("start").await["run"].clone();
        worker.op(
            &run,
            0,
            json!({ "op": "do", "name": "charge", "config": null, "rollback": { "config": null } }),
        );
        let attempt = worker.expect("attempt").await;
        worker.answer(&attempt, "attemptResult", Ok(json!({ "charge": i })));
        worker.returns(&run, Err(json!({ "name": "Error", "message": "gave up" })));
        // The op's result may or may not go out before the run's end is taken.
        let mut rollback = worker.next().await;
        if rollback["type"] == "opResult" {
            rollback = worker.next().await;
        }
        assert_eq!(rollback["type"], "rollback", "{rollback}");
        assert_eq!(rollback["output"], json!({ "charge": i }), "try {i}: {rollback}");
        worker.answer(&rollback, "rollbackResult", Ok(Value::Null));
        assert_eq!(worker.expect("stop").await["reason"], "done");
        let status = instance.wait().await.unwrap();
        assert_eq!(status.status, InstanceStatus::Errored);
        let details = instance.details().await.unwrap();
        assert_eq!(details.steps[0].success, Some(true), "try {i}");
        assert_eq!(details.steps[0].output, Some(json!({ "charge": i })), "try {i}");
    }
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_delay_function_runs_on_the_worker_and_a_timed_out_attempt_is_cancelled() {
    let (engine, _dir) = engine(|b| b).await;
    let mut worker = Worker::hello(&engine, &[("retry", "v1")], 4).await;
    let instance = create(&engine, "retry", "r", json!({})).await;
    let run = worker.expect("start").await["run"].clone();
    worker.op(
        &run,
        0,
        json!({
            "op": "do", "name": "flaky", "delayFunction": true,
            "config": { "retries": { "limit": 2, "backoff": "constant" }, "timeout": "1 minute" },
        }),
    );
    let first = worker.expect("attempt").await;
    worker.answer(
        &first,
        "attemptResult",
        Err(json!({ "name": "Error", "message": "rate limit" })),
    );
    let asked = worker.expect("delay").await;
    assert_eq!(asked["attempt"], 1);
    assert_eq!(asked["error"]["message"], "rate limit");
    let before = engine.clock().now();
    worker.answer(&asked, "delayResult", Ok(json!("7 seconds")));
    let second = worker.expect("attempt").await;
    assert_eq!(second["attempt"], 2);
    let waited = engine.clock().now().since(before);
    assert!(
        waited >= Duration::from_secs(7) && waited < Duration::from_secs(8),
        "{waited:?}"
    );
    // No answer within the timeout: the engine gives the attempt up and says so.
    let cancel = worker.expect("cancel").await;
    assert_eq!(cancel["task"], second["task"]);
    let asked = worker.expect("delay").await;
    assert_eq!(asked["error"]["name"], "WorkflowTimeoutError");
    worker.answer(&asked, "delayResult", Ok(json!(1000)));
    let third = worker.expect("attempt").await;
    // A late answer to the given-up attempt is stale, and changes nothing.
    worker.answer(&second, "attemptResult", Ok(json!("late")));
    assert_eq!(worker.expect("error").await["code"], "protocol.stale");
    worker.answer(&third, "attemptResult", Ok(json!("third")));
    assert_eq!(worker.expect("opResult").await["ok"], "third");
    worker.returns(&run, Ok(Value::Null));
    instance.wait().await.unwrap();
    let details = instance.details().await.unwrap();
    assert_eq!(details.steps[0].attempts.len(), 3);
    engine.shutdown().await;
}

/// SPEC B §1.6: a delay function's value that is no delay (a negative number, `null`, an
/// object) fails the step with Cloudflare's "returned an invalid delay value", not as if
/// the function had thrown.
#[tokio::test(start_paused = true)]
async fn a_delay_value_that_is_no_delay_fails_the_step_as_invalid() {
    let (engine, _dir) = engine(|b| b).await;
    let mut worker = Worker::hello(&engine, &[("retry", "v1")], 4).await;
    for (i, value) in [json!(-5), json!(null), json!({ "ms": 5 }), json!("")].into_iter().enumerate() {
        let instance = create(&engine, "retry", &format!("r{i}"), json!({})).await;
        let run = worker.expect("start").await["run"].clone();
        let op = json!({ "op": "do", "name": "flaky", "delayFunction": true, "config": { "retries": { "limit": 2 } } });
        worker.op(&run, 0, op);
        let first = worker.expect("attempt").await;
        worker.answer(&first, "attemptResult", Err(json!({ "name": "Error", "message": "down" })));
        let asked = worker.expect("delay").await;
        worker.answer(&asked, "delayResult", Ok(value.clone()));
        let failed = worker.expect("opResult").await;
        let message = failed["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("The delay function for step \"flaky-1\" returned an invalid delay value"),
            "{value}: {failed}"
        );
        worker.returns(&run, Ok(Value::Null));
        assert_eq!(worker.expect("stop").await["reason"], "done");
        instance.wait().await.unwrap();
    }
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_terminate_or_a_pause_stops_the_run_and_says_why() {
    let (engine, _dir) = engine(|b| b).await;
    let mut worker = Worker::hello(&engine, &[("long", "v1")], 4).await;
    let paused = create(&engine, "long", "p", json!({})).await;
    let run = worker.expect("start").await["run"].clone();
    worker.op(&run, 0, json!({ "op": "do", "name": "work", "config": null }));
    let attempt = worker.expect("attempt").await;
    // A pause lets the attempt in flight finish, then stops the run.
    paused.pause().await.unwrap();
    worker.answer(&attempt, "attemptResult", Ok(json!(1)));
    assert_eq!(worker.expect("stop").await["reason"], "paused");
    paused
        .wait_for(|s| s.status == InstanceStatus::Paused)
        .await
        .unwrap();
    paused.resume().await.unwrap();
    let run = worker.expect("start").await["run"].clone();
    worker.op(&run, 0, json!({ "op": "do", "name": "work", "config": null }));
    assert_eq!(worker.expect("opResult").await["ok"], 1);
    worker.op(&run, 1, json!({ "op": "do", "name": "more", "config": null }));
    worker.expect("attempt").await;
    paused.terminate().await.unwrap();
    let mut frames = [worker.next().await, worker.next().await];
    frames.sort_by_key(|f| f["type"].as_str().map(str::to_owned));
    assert_eq!(frames[0]["type"], "cancel");
    assert_eq!(frames[1]["type"], "stop");
    assert_eq!(frames[1]["reason"], "stopped");
    assert_eq!(
        paused.status().await.unwrap().status,
        InstanceStatus::Terminated
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_worker_gets_no_more_runs_than_its_concurrency() {
    let (engine, _dir) = engine(|b| b).await;
    let mut worker = Worker::hello(&engine, &[("one", "v1")], 1).await;
    let a = create(&engine, "one", "a", json!({})).await;
    let b = create(&engine, "one", "b", json!({})).await;
    let first = worker.expect("start").await;
    // Both are claimable, but the worker takes one at a time.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(engine.workers()[0].running, 1);
    worker.returns(&first["run"], Ok(json!(1)));
    worker.expect("stop").await;
    let second = worker.expect("start").await;
    assert_ne!(second["instance"]["id"], first["instance"]["id"]);
    worker.returns(&second["run"], Ok(json!(2)));
    a.wait().await.unwrap();
    b.wait().await.unwrap();
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn workflows_in_rust_and_on_workers_invoke_each_other_and_wait_for_events() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|event, step| async move {
            // A Rust parent of a worker's child.
            let out = step
                .invoke_by_name("ship", "shipping", json!({ "order": event.payload["order"] }))
                .await?;
            Ok(json!({ "shipped": out }))
        }))
    })
    .await;
    let mut worker = Worker::hello(&engine, &[("shipping", "v1")], 4).await;
    let parent = engine
        .workflow_by_name("test")
        .unwrap()
        .create(CreateOptions::new(json!({ "order": 17 })).id("parent"))
        .await
        .unwrap();
    let start = worker.expect("start").await;
    assert_eq!(start["instance"]["params"], json!({ "order": 17 }));
    let run = start["run"].clone();
    worker.op(
        &run,
        0,
        json!({ "op": "waitForEvent", "name": "label", "eventType": "printed", "timeout": "1 hour" }),
    );
    worker.idle(&run, 1);
    let child_id = start["instance"]["id"].as_str().unwrap().to_owned();
    let child = engine
        .workflow_by_name("shipping")
        .unwrap()
        .get(&child_id)
        .await
        .unwrap();
    // The wait hibernates the child (a long timeout, nothing else to do).
    assert_eq!(worker.expect("stop").await["reason"], "hibernated");
    child
        .send_event("printed", &json!({ "label": "L-1" }))
        .await
        .unwrap();
    let run = worker.expect("start").await["run"].clone();
    worker.op(
        &run,
        0,
        json!({ "op": "waitForEvent", "name": "label", "eventType": "printed", "timeout": "1 hour" }),
    );
    let event = worker.expect("opResult").await;
    assert_eq!(event["ok"]["payload"], json!({ "label": "L-1" }));
    assert_eq!(event["ok"]["type"], "printed");
    worker.returns(&run, Ok(json!("L-1")));
    let status = parent.wait().await.unwrap();
    assert_eq!(status.output, Some(json!({ "shipped": "L-1" })));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn bad_frames_are_answered_with_codes_and_change_nothing() {
    let (engine, _dir) = engine(|b| b.register(wf(|_, _| async { Ok(Value::Null) }))).await;
    // A hello that cannot be taken.
    let refused = engine
        .connect_worker(r#"{"type":"hello","protocol":1,"workflows":[{"name":"test","version":"1"}],"concurrency":1}"#)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), "protocol.workflow");
    let refused = engine
        .connect_worker(r#"{"type":"hello","protocol":9,"workflows":[],"concurrency":1}"#)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), "protocol.version");
    let refused = engine.connect_worker("{").await.unwrap_err();
    assert_eq!(refused.code(), "protocol.malformed");
    let mut worker = Worker::hello(&engine, &[("strict", "v1")], 1).await;
    worker.conn.receive("not json");
    assert_eq!(worker.expect("error").await["code"], "protocol.malformed");
    worker.send(json!({ "type": "dance", "run": "r1" }));
    assert_eq!(worker.expect("error").await["code"], "protocol.unknown_type");
    worker.send(json!({ "type": "runResult", "run": "r99", "ok": 1 }));
    let stale = worker.expect("error").await;
    assert_eq!(stale["code"], "protocol.stale");
    assert_eq!(stale["run"], "r99");
    let instance = create(&engine, "strict", "s", json!({})).await;
    let run = worker.expect("start").await["run"].clone();
    // An op out of order: the run is given up (nothing recorded) and comes back later.
    worker.op(&run, 3, json!({ "op": "do", "name": "skip", "config": null }));
    assert_eq!(worker.expect("error").await["code"], "protocol.sequence");
    assert_eq!(worker.expect("stop").await["reason"], "lost");
    let run = worker.expect("start").await["run"].clone();
    worker.op(&run, 0, json!({ "op": "do", "name": "x", "config": { "retries": { "limit": 1 } } }));
    // A config Cloudflare would refuse fails the op, not the session.
    let failed = worker.expect("opResult").await;
    assert!(failed["error"]["message"].as_str().unwrap().contains("delay"), "{failed}");
    worker.returns(&run, Ok(json!("fine")));
    assert_eq!(instance.wait().await.unwrap().output, Some(json!("fine")));
    assert!(instance.details().await.unwrap().steps.is_empty());
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_replay_check_replays_a_workers_instance_on_a_worker_of_its_version() {
    let (engine, _dir) = engine(|b| b).await;
    let mut worker = Worker::hello(&engine, &[("billing", "v1")], 4).await;
    let instance = create(&engine, "billing", "b", json!({})).await;
    let run = worker.expect("start").await["run"].clone();
    worker.op(&run, 0, json!({ "op": "do", "name": "charge", "config": null }));
    let attempt = worker.expect("attempt").await;
    worker.answer(&attempt, "attemptResult", Ok(json!(1)));
    worker.expect("opResult").await;
    worker.op(&run, 1, json!({ "op": "sleep", "name": "nap", "duration": "1 day" }));
    worker.idle(&run, 2);
    assert_eq!(worker.expect("stop").await["reason"], "hibernated");
    instance
        .wait_for(|s| s.status == InstanceStatus::Waiting)
        .await
        .unwrap();
    // The code on the worker renamed the step: the check replays it there, in check mode.
    let worker_side = async {
        let start = worker.expect("start").await;
        assert_eq!(start["check"], true);
        let run = start["run"].clone();
        worker.op(&run, 0, json!({ "op": "do", "name": "bill", "config": null }));
        worker.idle(&run, 1);
    };
    let (report, ()) = tokio::join!(engine.replay_check(), worker_side);
    let report = report.unwrap();
    assert_eq!(report.checked, 1);
    let problems = &report.incompatible[0].problems;
    assert!(
        problems.iter().any(|p| p.contains("\"charge\"")),
        "{problems:?}"
    );
    // No attempt was asked for: a check runs nothing.
    assert_eq!(worker.expect("stop").await["type"], "stop");
    engine.shutdown().await;
}

/// Two workers connecting at once: the first one's read of the registered workflows is
/// made before the second registers, and its answer comes after the second connected. The
/// second's workflow must stay known (the TypeScript SDK's tests saw `workflow.not_found`
/// for a worker that had just connected).
#[tokio::test]
async fn workers_connecting_at_once_each_keep_their_workflows_known() {
    let (_dir, path) = super::support::temp_db();
    let store = super::support::raw_store_on(super::support::BACKEND, &path).await;
    let gates = super::support::Gates::default();
    let engine = super::support::gated_builder_on(std::sync::Arc::clone(&store), gates.clone())
        .start()
        .await
        .unwrap();
    let hello = |workflow: &str| {
        json!({
            "type": "hello", "protocol": 1, "worker": workflow,
            "workflows": [{ "name": workflow, "version": "v1" }], "concurrency": 1,
        })
        .to_string()
    };
    let read = gates.arm("workflow_versions");
    let first = tokio::spawn({
        let (engine, hello) = (engine.clone(), hello("first"));
        async move { engine.connect_worker(&hello).await.map(drop) }
    });
    read.arrived().await;
    let second = tokio::spawn({
        let (engine, hello) = (engine.clone(), hello("second"));
        async move { engine.connect_worker(&hello).await.map(drop) }
    });
    // The second worker's workflow is registered in the store before the first one's read
    // answers.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !store
        .workflow_versions()
        .await
        .unwrap()
        .iter()
        .any(|v| v.workflow.as_str() == "second")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the second worker never registered"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    read.release();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    for workflow in ["first", "second"] {
        assert!(
            engine.workflow_by_name(workflow).is_ok(),
            "{workflow} is not known after its worker connected"
        );
    }
    engine.shutdown().await;
}
