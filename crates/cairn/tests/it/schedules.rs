//! Cron schedules on the virtual clock: each tick fires once, across restarts around it;
//! the overlap and catch-up policies; daylight saving time.

use std::path::Path;
use std::time::Duration;

use cairn::prelude::*;
use cairn::{CatchUp, Clock, ListOptions, Overlap, Schedule, ScheduleError, Timestamp};
use serde_json::{Value, json};

use crate::support::temp_db;

/// 2026-03-01T00:00:00Z.
const T0: Timestamp = Timestamp::from_millis(1_772_323_200_000);
/// When the first engine of a test starts: 00:02, past the grace of the 00:00 tick.
const START: Timestamp = Timestamp::from_millis(1_772_323_200_000 + 120_000);
const MINUTE: Duration = Duration::from_secs(60);

/// One quick step.
struct Tick;

impl Workflow for Tick {
    const NAME: &'static str = "tick";
    type Params = Value;
    type Output = ();

    async fn run(&self, _: WorkflowEvent<Value>, step: WorkflowStep) -> Result<(), WorkflowError> {
        step.run("work", |_| async { Ok(()) }).await
    }
}

/// Runs until an event `done` arrives: a run that does not finish by itself.
struct Long;

impl Workflow for Long {
    const NAME: &'static str = "long";
    type Params = Value;
    type Output = ();

    async fn run(&self, _: WorkflowEvent<Value>, step: WorkflowStep) -> Result<(), WorkflowError> {
        step.wait_for_event::<Value>("until done", "done")
            .timeout("30 days")
            .await?;
        Ok(())
    }
}

fn every_5_minutes() -> Schedule {
    Schedule::new::<Tick>("every5", "*/5 * * * *", json!({ "from": "schedule" })).unwrap()
}

async fn start(path: &Path, at: Timestamp, schedule: Schedule) -> Engine {
    Engine::builder()
        .sqlite(path)
        .clock(Clock::virtual_at(at))
        // Some of these tests tick every second.
        .min_schedule_interval(Duration::from_secs(1))
        .register(Tick)
        .register(Long)
        .schedule(schedule)
        .start()
        .await
        .unwrap()
}

/// Lets the virtual clock run until `until`.
async fn run_until(engine: &Engine, until: Timestamp) {
    while engine.clock().now() < until {
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}

/// The ticks fired so far, as minutes after T0, oldest first.
async fn fired(engine: &Engine, workflow: &str, schedule: &str) -> Vec<i64> {
    let mut ticks = Vec::new();
    let mut options = ListOptions::default()
        .id_prefix(format!("{schedule}-"))
        .limit(1000);
    loop {
        let page = engine
            .list_instances(Some(workflow), &options)
            .await
            .unwrap();
        for i in page
            .instances
            .iter()
            .filter(|i| !i.id.as_str().contains("-manual-"))
        {
            let digits = i.id.as_str().rsplit('-').next().unwrap();
            let at = chrono_like(digits);
            ticks.push((at - T0.as_millis()) / 60_000);
        }
        match page.cursor {
            Some(c) => options = options.cursor(c),
            None => break,
        }
    }
    ticks.sort_unstable();
    ticks
}

/// `YYYYMMDDhhmmss` (UTC) as epoch milliseconds.
fn chrono_like(digits: &str) -> i64 {
    chrono::NaiveDateTime::parse_from_str(digits, "%Y%m%d%H%M%S")
        .unwrap()
        .and_utc()
        .timestamp_millis()
}

#[tokio::test(start_paused = true)]
async fn a_schedule_every_5_minutes_fires_288_times_in_a_virtual_day_once_each() {
    let (_dir, path) = temp_db();
    let engine = start(&path, START, every_5_minutes()).await;
    run_until(
        &engine,
        T0.saturating_add(Duration::from_secs(86_400) + MINUTE),
    )
    .await;
    let ticks = fired(&engine, "tick", "every5").await;
    assert_eq!(ticks.len(), 288, "{ticks:?}");
    let expected: Vec<i64> = (1..=288).map(|k| k * 5).collect();
    assert_eq!(ticks, expected);
    // Each tick's instance ran with the schedule's params.
    let one = engine
        .workflow::<Tick>()
        .get("every5-20260301000500")
        .await
        .unwrap();
    assert_eq!(one.status().await.unwrap().status, InstanceStatus::Complete);
    assert_eq!(
        one.details().await.unwrap().params,
        json!({ "from": "schedule" })
    );
    let (last, next) = engine.schedule_ticks("every5").await.unwrap();
    assert_eq!(last, Some(T0.saturating_add(Duration::from_secs(86_400))));
    assert!(next.unwrap() > engine.clock().now());
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_restart_at_each_point_around_a_tick_neither_skips_nor_doubles_it() {
    // The 00:05 tick has fired; stop at a moment around the 00:10 tick, restart some
    // seconds later (within the grace), run past 00:15: each tick fired exactly once.
    for (stop, restart) in [
        (9 * 60 + 59, 10 * 60 + 1),  // just before the tick, back just after it
        (10 * 60, 10 * 60 + 30),     // at the tick, back within the grace
        (10 * 60 + 1, 10 * 60 + 2),  // just after it fired, back at once
        (10 * 60 + 1, 14 * 60 + 59), // after it fired, back just before the next
    ] {
        let (_dir, path) = temp_db();
        let first = start(&path, START, every_5_minutes()).await;
        run_until(&first, T0.saturating_add(Duration::from_secs(stop))).await;
        first.shutdown().await;
        drop(first);
        let second = start(
            &path,
            T0.saturating_add(Duration::from_secs(restart)),
            every_5_minutes(),
        )
        .await;
        run_until(&second, T0.saturating_add(15 * MINUTE + MINUTE / 2)).await;
        assert_eq!(
            fired(&second, "tick", "every5").await,
            [5, 10, 15],
            "stopped at {stop} s, back at {restart} s"
        );
        second.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn missed_ticks_follow_the_catch_up_policy() {
    for (policy, expected) in [
        (CatchUp::Skip, vec![5, 70]),
        (CatchUp::RunOnce, vec![5, 65, 70]),
        (CatchUp::RunAll(3), vec![5, 55, 60, 65, 70]),
    ] {
        let (_dir, path) = temp_db();
        // Missed ticks obey the overlap policy too: Allow, so that none waits for another.
        let schedule = || every_5_minutes().catch_up(policy).overlap(Overlap::Allow);
        let first = start(&path, START, schedule()).await;
        run_until(&first, T0.saturating_add(6 * MINUTE)).await;
        first.shutdown().await;
        drop(first);
        // Down from 00:06 to 01:07: twelve ticks missed (00:10 … 01:05).
        let second = start(&path, T0.saturating_add(67 * MINUTE), schedule()).await;
        run_until(&second, T0.saturating_add(71 * MINUTE)).await;
        assert_eq!(
            fired(&second, "tick", "every5").await,
            expected,
            "{policy:?}"
        );
        second.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_unfinished_run_makes_the_next_ticks_skip_wait_or_overlap() {
    for (overlap, expected_before, expected_after) in [
        (Overlap::Skip, vec![5], vec![5, 25]),
        (Overlap::Allow, vec![5, 10, 15, 20], vec![5, 10, 15, 20, 25]),
        (Overlap::BufferOne, vec![5], vec![5, 10, 25]),
    ] {
        let (_dir, path) = temp_db();
        let schedule = Schedule::new::<Long>("long", "*/5 * * * *", json!({}))
            .unwrap()
            .overlap(overlap);
        let engine = start(&path, START, schedule.clone()).await;
        run_until(&engine, T0.saturating_add(21 * MINUTE)).await;
        assert_eq!(
            fired(&engine, "long", "long").await,
            expected_before,
            "{overlap:?}"
        );
        // Review finding: the API showed the last tick's id as the last instance, one a
        // tick passed over never started.
        let (_, last_run) = engine.last_fired_of(&schedule).await.unwrap();
        let newest = *expected_before.last().unwrap();
        assert_eq!(
            last_run,
            Some(format!("long-2026030100{newest:02}00")),
            "{overlap:?}"
        );
        // The first run finishes at 00:21.
        let first = engine
            .workflow::<Long>()
            .get("long-20260301000500")
            .await
            .unwrap();
        first.send_event("done", &json!({})).await.unwrap();
        first.wait().await.unwrap();
        if overlap == Overlap::Allow {
            for id in [
                "long-20260301001000",
                "long-20260301001500",
                "long-20260301002000",
            ] {
                let i = engine.workflow::<Long>().get(id).await.unwrap();
                i.send_event("done", &json!({})).await.unwrap();
            }
        }
        run_until(&engine, T0.saturating_add(26 * MINUTE)).await;
        if overlap == Overlap::BufferOne {
            // The buffered run (of the 00:10 tick) started when the first finished; it is
            // unfinished at 00:25, which waits for it in turn.
            let buffered = engine
                .workflow::<Long>()
                .get("long-20260301001000")
                .await
                .unwrap();
            buffered.send_event("done", &json!({})).await.unwrap();
            buffered.wait().await.unwrap();
            run_until(&engine, T0.saturating_add(27 * MINUTE)).await;
        }
        assert_eq!(
            fired(&engine, "long", "long").await,
            expected_after,
            "{overlap:?}"
        );
        engine.shutdown().await;
    }
}

/// Ticks the overlap policy passed over are not "missed" ticks: a restart after the long
/// run finished does not catch them up. Only the runner had known it passed them over;
/// the store's last tick stayed at the long run's, so the next engine fired the ticks the
/// policy had refused (all of them with run-all).
#[tokio::test(start_paused = true)]
async fn ticks_the_overlap_policy_passed_over_are_not_caught_up_after_a_restart() {
    for overlap in [Overlap::Skip, Overlap::BufferOne] {
        let (_dir, path) = temp_db();
        let schedule = || {
            Schedule::new::<Long>("long", "*/5 * * * *", json!({}))
                .unwrap()
                .overlap(overlap)
                .catch_up(CatchUp::RunAll(10))
        };
        let engine = start(&path, START, schedule()).await;
        run_until(&engine, T0.saturating_add(21 * MINUTE)).await;
        assert_eq!(fired(&engine, "long", "long").await, [5], "{overlap:?}");
        // The 00:05 run ends at 00:21 (with BufferOne, the buffered 00:10 tick starts then
        // and the 00:15 and 00:20 ones are dropped; it ends too).
        let mut ended = vec!["long-20260301000500"];
        if overlap == Overlap::BufferOne {
            ended.push("long-20260301001000");
        }
        for id in ended {
            let run = loop {
                match engine.workflow::<Long>().get(id).await {
                    Ok(run) => break run,
                    Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
                }
            };
            run.send_event("done", &json!({})).await.unwrap();
            run.wait().await.unwrap();
        }
        engine.shutdown().await;
        drop(engine);
        let engine = start(&path, T0.saturating_add(22 * MINUTE), schedule()).await;
        run_until(&engine, T0.saturating_add(26 * MINUTE)).await;
        let expected: &[i64] = match overlap {
            Overlap::Skip => &[5, 25],
            _ => &[5, 10, 25],
        };
        assert_eq!(
            fired(&engine, "long", "long").await,
            expected,
            "{overlap:?}"
        );
        engine.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_restart_keeps_skipping_while_the_last_run_is_unfinished() {
    let (_dir, path) = temp_db();
    let schedule = || Schedule::new::<Long>("long", "*/5 * * * *", json!({})).unwrap();
    let first = start(&path, START, schedule()).await;
    run_until(&first, T0.saturating_add(6 * MINUTE)).await;
    first.shutdown().await;
    drop(first);
    // Back at 00:07: the 00:05 run (recovered, waiting) still holds the next ticks off.
    let second = start(&path, T0.saturating_add(7 * MINUTE), schedule()).await;
    run_until(&second, T0.saturating_add(16 * MINUTE)).await;
    assert_eq!(fired(&second, "long", "long").await, [5]);
    second.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_purged_tick_is_not_fired_again_when_an_older_one_is_kept() {
    // Errors are kept an hour, successes two minutes: the 00:05 run errors and stays, the
    // 00:10 run completes and is purged. A restart must not take 00:05 for the last tick.
    struct Flaky;
    impl Workflow for Flaky {
        const NAME: &'static str = "flaky";
        type Params = Value;
        type Output = ();
        async fn run(&self, e: WorkflowEvent<Value>, _: WorkflowStep) -> Result<(), WorkflowError> {
            if e.instance_id.as_str().ends_with("000500") {
                return Err(NonRetryableError::new("the first run fails").into());
            }
            Ok(())
        }
    }
    let (_dir, path) = temp_db();
    let engine_at = |at: Timestamp| {
        Engine::builder()
            .sqlite(&path)
            .clock(Clock::virtual_at(at))
            .register(Flaky)
            .workflow_retention(
                "flaky",
                cairn::Retention {
                    success: 2 * MINUTE,
                    error: 60 * MINUTE,
                },
            )
            .schedule(
                Schedule::new::<Flaky>("flaky", "*/5 * * * *", json!({}))
                    .unwrap()
                    .catch_up(CatchUp::RunAll(10)),
            )
            .start()
    };
    let first = engine_at(START).await.unwrap();
    run_until(&first, T0.saturating_add(14 * MINUTE)).await;
    assert_eq!(
        fired(&first, "flaky", "flaky").await,
        [5],
        "00:10 ran and was purged"
    );
    first.shutdown().await;
    drop(first);
    let second = engine_at(T0.saturating_add(14 * MINUTE + MINUTE / 2))
        .await
        .unwrap();
    run_until(&second, T0.saturating_add(15 * MINUTE + MINUTE / 2)).await;
    // 00:15 fired on time; 00:10 did not fire a second time.
    assert_eq!(fired(&second, "flaky", "flaky").await, [5, 15]);
    second.shutdown().await;
}

fn at(rfc3339: &str) -> Timestamp {
    Timestamp::from_millis(
        chrono::DateTime::parse_from_rfc3339(rfc3339)
            .unwrap()
            .timestamp_millis(),
    )
}

#[test]
fn daylight_saving_time_a_skipped_hour_does_not_fire_a_repeated_one_fires_once() {
    // Europe/Berlin: 2026-03-29 02:00 CET jumps to 03:00 CEST; 2026-10-25 03:00 CEST
    // falls back to 02:00 CET.
    let daily = Schedule::new::<Tick>("daily", "30 2 * * *", json!({}))
        .unwrap()
        .time_zone("Europe/Berlin")
        .unwrap();
    let ticks = |from: &str, n: usize| {
        let mut t = at(from);
        (0..n)
            .map(|_| {
                t = daily.next_after(t).unwrap();
                t.to_rfc3339()
            })
            .collect::<Vec<_>>()
    };
    // 02:30 does not exist on 29 March: no tick that day.
    assert_eq!(
        ticks("2026-03-27T12:00:00Z", 3),
        [
            "2026-03-28T01:30:00.000Z",
            "2026-03-30T00:30:00.000Z",
            "2026-03-31T00:30:00.000Z"
        ]
    );
    // 02:30 happens twice on 25 October: one tick, at the first (CEST, 00:30 UTC).
    assert_eq!(
        ticks("2026-10-24T12:00:00Z", 3),
        [
            "2026-10-25T00:30:00.000Z",
            "2026-10-26T01:30:00.000Z",
            "2026-10-27T01:30:00.000Z"
        ]
    );
    // An expression over every hour follows real time through the repeated hour.
    let half_hourly = Schedule::new::<Tick>("half", "*/30 * * * *", json!({}))
        .unwrap()
        .time_zone("Europe/Berlin")
        .unwrap();
    let mut t = at("2026-10-24T23:45:00Z");
    let mut seen = Vec::new();
    for _ in 0..6 {
        t = half_hourly.next_after(t).unwrap();
        seen.push(t.to_rfc3339());
    }
    assert_eq!(
        seen,
        [
            "2026-10-25T00:00:00.000Z", // 02:00 CEST
            "2026-10-25T00:30:00.000Z", // 02:30 CEST
            "2026-10-25T01:00:00.000Z", // 02:00 CET
            "2026-10-25T01:30:00.000Z", // 02:30 CET
            "2026-10-25T02:00:00.000Z", // 03:00 CET
            "2026-10-25T02:30:00.000Z",
        ]
    );
    assert_eq!(
        daily.tick_id(at("2026-10-25T00:30:00Z")),
        "daily-20261025003000"
    );
}

#[tokio::test]
async fn bad_schedules_are_refused_with_what_is_wrong() {
    let bad_cron = Schedule::new::<Tick>("x", "61 * * * *", json!({})).unwrap_err();
    assert!(matches!(bad_cron, ScheduleError::Cron { .. }), "{bad_cron}");
    assert!(bad_cron.to_string().contains("61 * * * *"));
    let bad_zone = Schedule::new::<Tick>("x", "* * * * *", json!({}))
        .unwrap()
        .time_zone("Mars/Olympus")
        .unwrap_err();
    assert!(bad_zone.to_string().contains("Mars/Olympus"));
    for name in ["", "-x", "has space", &"n".repeat(81)] {
        assert!(matches!(
            Schedule::new::<Tick>(name, "* * * * *", json!({})),
            Err(ScheduleError::Name(_))
        ));
    }
    // A schedule of a workflow that is not registered, or declared twice, stops the start.
    let (_dir, path) = temp_db();
    let err = Engine::builder()
        .sqlite(&path)
        .schedule(every_5_minutes())
        .start()
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("not registered"), "{err}");
    let err = Engine::builder()
        .sqlite(&path)
        .register(Tick)
        .schedule(every_5_minutes())
        .schedule(every_5_minutes())
        .start()
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("declared twice"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_new_schedule_starts_at_its_next_tick_not_with_ticks_before_it_existed() {
    let (_dir, path) = temp_db();
    let schedule = Schedule::new::<Tick>("dense", "* * * * * *", json!({}))
        .unwrap()
        .overlap(Overlap::Allow);
    let start_at = T0.saturating_add(Duration::from_millis(30_500));
    let engine = start(&path, start_at, schedule).await;
    while engine.clock().now() < T0.saturating_add(Duration::from_millis(33_500)) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let page = engine
        .list_instances(Some("tick"), &ListOptions::default().id_prefix("dense-"))
        .await
        .unwrap();
    let mut ids: Vec<String> = page.instances.iter().map(|i| i.id.to_string()).collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            "dense-20260301000031",
            "dense-20260301000032",
            "dense-20260301000033"
        ]
    );
    engine.shutdown().await;
}

/// An engine with the workflows and no schedule in code.
async fn start_bare(path: &Path, at: Timestamp) -> Engine {
    Engine::builder()
        .sqlite(path)
        .clock(Clock::virtual_at(at))
        .register(Tick)
        .register(Long)
        .start()
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_schedule_created_at_run_time_ticks_pauses_resumes_without_catching_up_and_is_deleted() {
    let (_dir, path) = temp_db();
    let engine = start_bare(&path, START).await;
    let made = Schedule::untyped("made", "*/5 * * * *", "tick", json!({ "by": "api" }))
        .unwrap()
        .catch_up(CatchUp::RunAll(100));
    engine.create_schedule(made.clone()).await.unwrap();
    let again = engine.create_schedule(made.clone()).await.unwrap_err();
    assert_eq!(again.code(), "schedule.already_exists");
    run_until(&engine, T0.saturating_add(16 * MINUTE)).await;
    assert_eq!(fired(&engine, "tick", "made").await, [5, 10, 15]);

    engine.pause_schedule("made").await.unwrap();
    let listed = engine.list_schedules().await.unwrap();
    assert!(listed[0].paused && !listed[0].in_code, "{listed:?}");
    run_until(&engine, T0.saturating_add(31 * MINUTE)).await;
    assert_eq!(fired(&engine, "tick", "made").await, [5, 10, 15], "paused");
    engine.resume_schedule("made").await.unwrap();
    run_until(&engine, T0.saturating_add(41 * MINUTE)).await;
    assert_eq!(
        fired(&engine, "tick", "made").await,
        [5, 10, 15, 35, 40],
        "the ticks missed while paused are not caught up, even with run-all"
    );
    engine.shutdown().await;

    // Stored: a new engine on the database runs it, and its pause.
    let engine = start_bare(&path, T0.saturating_add(42 * MINUTE)).await;
    run_until(&engine, T0.saturating_add(46 * MINUTE)).await;
    assert_eq!(
        fired(&engine, "tick", "made").await,
        [5, 10, 15, 35, 40, 45]
    );
    let (last, _) = engine.schedule_ticks("made").await.unwrap();
    assert_eq!(last, Some(T0.saturating_add(45 * MINUTE)));
    let manual = engine.trigger_schedule("made").await.unwrap();
    assert!(manual.id().as_str().starts_with("made-manual-"));

    engine.delete_schedule("made").await.unwrap();
    assert_eq!(
        engine.delete_schedule("made").await.unwrap_err().code(),
        "schedule.not_found"
    );
    run_until(&engine, T0.saturating_add(61 * MINUTE)).await;
    assert_eq!(
        fired(&engine, "tick", "made").await,
        [5, 10, 15, 35, 40, 45],
        "deleted: no more ticks; the runs are kept"
    );
    assert!(engine.list_schedules().await.unwrap().is_empty());
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_schedule_in_code_can_be_paused_and_resumed_but_not_deleted_or_shadowed() {
    let (_dir, path) = temp_db();
    let engine = start(&path, START, every_5_minutes()).await;
    assert_eq!(
        engine.delete_schedule("every5").await.unwrap_err().code(),
        "schedule.declared_in_code"
    );
    let shadow = Schedule::untyped("every5", "* * * * *", "tick", json!({})).unwrap();
    assert_eq!(
        engine.create_schedule(shadow).await.unwrap_err().code(),
        "schedule.already_exists"
    );
    let unknown = Schedule::untyped("other", "* * * * *", "nope", json!({})).unwrap();
    assert_eq!(
        engine.create_schedule(unknown).await.unwrap_err().code(),
        "workflow.not_found"
    );
    engine.pause_schedule("every5").await.unwrap();
    engine.shutdown().await;
    // The pause is stored: a restart keeps it.
    let engine = start(&path, T0.saturating_add(3 * MINUTE), every_5_minutes()).await;
    run_until(&engine, T0.saturating_add(21 * MINUTE)).await;
    assert!(fired(&engine, "tick", "every5").await.is_empty(), "paused");
    assert!(engine.list_schedules().await.unwrap()[0].paused);
    engine.resume_schedule("every5").await.unwrap();
    run_until(&engine, T0.saturating_add(26 * MINUTE)).await;
    assert_eq!(fired(&engine, "tick", "every5").await, [25]);
    assert_eq!(
        engine.pause_schedule("nope").await.unwrap_err().code(),
        "schedule.not_found"
    );
    engine.shutdown().await;
}

/// Review finding: a tick fired by an engine whose clock was ahead (a VM restored, a clock
/// before NTP) was stored as the last tick, and every tick before it was refused as fired
/// once the clock was right again: an engine 6 hours ahead, then one on time, fired
/// nothing for 6 hours, silently. A last tick after the firing engine's clock no longer
/// holds back the ticks up to its now.
#[tokio::test(start_paused = true)]
async fn a_tick_fired_by_a_clock_ahead_does_not_hold_back_the_ticks_before_it() {
    let (_dir, path) = temp_db();
    let ahead = start(
        &path,
        START.saturating_add(6 * 60 * MINUTE),
        every_5_minutes(),
    )
    .await;
    run_until(&ahead, T0.saturating_add(6 * 60 * MINUTE + 6 * MINUTE)).await;
    assert_eq!(fired(&ahead, "tick", "every5").await, [365]);
    ahead.shutdown().await;
    let on_time = start(&path, START, every_5_minutes()).await;
    run_until(&on_time, T0.saturating_add(31 * MINUTE)).await;
    assert_eq!(
        fired(&on_time, "tick", "every5").await,
        [5, 10, 15, 20, 25, 30, 365]
    );
    on_time.shutdown().await;
}

/// Review finding: on SQLite, a schedule created while the read that follows the change
/// failed had no runner until the next change or a restart: every tick was lost. The
/// sync is now tried again every few seconds until it reads.
#[tokio::test(start_paused = true)]
async fn a_schedule_created_while_reading_schedules_fails_ticks_once_a_read_succeeds() {
    use std::sync::atomic::{AtomicU8, Ordering};
    let (_dir, path) = temp_db();
    // 0: nothing created yet; 1: created, the next read fails; 2: failed once.
    let phase = std::sync::Arc::new(AtomicU8::new(0));
    let seen = std::sync::Arc::clone(&phase);
    let engine = crate::support::hooked_builder(&path, move |method| {
        match method {
            "create_schedule" => seen.store(1, Ordering::SeqCst),
            "schedules"
                if seen
                    .compare_exchange(1, 2, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok() =>
            {
                return Err(cairn::store::Error::Unavailable(
                    "a test's failed read".into(),
                ));
            }
            _ => {}
        }
        Ok(())
    })
    .clock(Clock::virtual_at(START))
    .register(Tick)
    .start()
    .await
    .unwrap();
    let made = Schedule::untyped("made", "*/5 * * * *", "tick", json!({})).unwrap();
    engine.create_schedule(made).await.unwrap();
    assert_eq!(
        phase.load(Ordering::SeqCst),
        2,
        "the read after the create failed"
    );
    run_until(&engine, T0.saturating_add(11 * MINUTE)).await;
    assert_eq!(fired(&engine, "tick", "made").await, [5, 10]);
    engine.shutdown().await;
}

/// An engine on `path` that declares no schedule (another server on the store, one
/// started with `--no-schedules`).
async fn without_schedules(path: &Path) -> Engine {
    Engine::builder()
        .sqlite(path)
        .clock(Clock::virtual_at(T0))
        .register(Tick)
        .start()
        .await
        .unwrap()
}

/// Review finding: an engine that does not declare a schedule in code (another server on
/// the shared store, one started with `--no-schedules`) deleted it, state row and all: the
/// engine that declares it then made it again, not paused, its last tick forgotten. A
/// schedule in code is refused (409) by every engine.
#[tokio::test(start_paused = true)]
async fn a_schedule_in_code_is_not_deleted_by_an_engine_that_does_not_declare_it() {
    let (_dir, path) = temp_db();
    let engine = start(&path, T0, every_5_minutes()).await;
    engine.pause_schedule("every5").await.unwrap();
    engine.shutdown().await;
    let other = without_schedules(&path).await;
    assert_eq!(
        other.delete_schedule("every5").await.unwrap_err().code(),
        "schedule.declared_in_code"
    );
    other.shutdown().await;
    let engine = start(&path, T0.saturating_add(3 * MINUTE), every_5_minutes()).await;
    run_until(&engine, T0.saturating_add(11 * MINUTE)).await;
    assert!(engine.list_schedules().await.unwrap()[0].paused);
    assert!(
        fired(&engine, "tick", "every5").await.is_empty(),
        "still paused"
    );
    // The engine that declares it does not forget it either.
    assert_eq!(
        engine.forget_schedule("every5").await.unwrap_err().code(),
        "schedule.declared_in_code"
    );
    engine.shutdown().await;
    // Review finding: once removed from the code, its row could be deleted by no one, and
    // its name was taken for good. Forgotten, the name is free again.
    let other = without_schedules(&path).await;
    other.forget_schedule("every5").await.unwrap();
    let again = Schedule::untyped("every5", "*/5 * * * *", "tick", json!({})).unwrap();
    other.create_schedule(again).await.unwrap();
    assert!(!other.list_schedules().await.unwrap()[0].paused);
    assert_eq!(
        other.forget_schedule("nope").await.unwrap_err().code(),
        "schedule.not_found"
    );
    other.shutdown().await;
}

#[test]
fn policies_parse_from_their_names_and_refuse_others() {
    assert_eq!(Overlap::parse("bufferOne").unwrap(), Overlap::BufferOne);
    assert_eq!(Overlap::parse("allow").unwrap().as_str(), "allow");
    assert!(Overlap::parse("sometimes").is_err());
    assert_eq!(CatchUp::parse("runAll:7").unwrap(), CatchUp::RunAll(7));
    assert_eq!(CatchUp::parse("run-once").unwrap(), CatchUp::RunOnce);
    assert_eq!(CatchUp::RunAll(3).to_name(), "runAll:3");
    for bad in ["runAll:0", "runAll:1001", "runAll:x", "later"] {
        let e = CatchUp::parse(bad).unwrap_err();
        assert!(matches!(e, ScheduleError::Policy { .. }), "{bad}: {e}");
    }
}

/// Review findings: a schedule deleted and created again under its name starts afresh (no
/// catch-up of ticks from before it was created); what every tick would refuse (params too
/// large, a policy that would not read back) is refused at create, and nothing is stored.
#[tokio::test(start_paused = true)]
async fn a_re_created_schedule_starts_afresh_and_bad_ones_are_refused_at_create() {
    let (_dir, path) = temp_db();
    let engine = Engine::builder()
        .sqlite(&path)
        .clock(Clock::virtual_at(START))
        .payload_limit(200)
        .register(Tick)
        .start()
        .await
        .unwrap();
    let every = |cron: &str| {
        Schedule::untyped("made", cron, "tick", json!({}))
            .unwrap()
            .catch_up(CatchUp::RunAll(100))
    };
    engine.create_schedule(every("*/5 * * * *")).await.unwrap();
    run_until(&engine, T0.saturating_add(16 * MINUTE)).await;
    engine.delete_schedule("made").await.unwrap();
    run_until(&engine, T0.saturating_add(31 * MINUTE)).await;
    engine.create_schedule(every("*/10 * * * *")).await.unwrap();
    run_until(&engine, T0.saturating_add(41 * MINUTE)).await;
    assert_eq!(
        fired(&engine, "tick", "made").await,
        [5, 10, 15, 40],
        "no tick from before the new schedule existed"
    );

    let big = Schedule::untyped(
        "big",
        "* * * * *",
        "tick",
        json!({ "pad": "x".repeat(300) }),
    )
    .unwrap();
    assert_eq!(
        engine.create_schedule(big).await.unwrap_err().code(),
        "payload.too_large"
    );
    let unreadable = Schedule::untyped("odd", "* * * * *", "tick", json!({}))
        .unwrap()
        .catch_up(CatchUp::RunAll(0));
    assert_eq!(
        engine.create_schedule(unreadable).await.unwrap_err().code(),
        "schedule.invalid"
    );
    let names: Vec<String> = engine
        .list_schedules()
        .await
        .unwrap()
        .iter()
        .map(|e| e.schedule.name().to_owned())
        .collect();
    assert_eq!(names, ["made"], "nothing refused was stored");
    engine.shutdown().await;
}

/// Issue 30 §2: which ticks fired is stored with each tick, so deleting a tick's instance
/// by hand does not make the tick look unfired: a restart does not fire it again.
#[tokio::test(start_paused = true)]
async fn deleting_a_ticks_instance_by_hand_does_not_make_the_tick_fire_again() {
    let (_dir, path) = temp_db();
    let engine = start(&path, START, every_5_minutes()).await;
    run_until(&engine, T0.saturating_add(11 * MINUTE)).await;
    assert_eq!(fired(&engine, "tick", "every5").await, [5, 10]);
    engine
        .workflow::<Tick>()
        .get("every5-20260301001000")
        .await
        .unwrap()
        .delete()
        .await
        .unwrap();
    engine.shutdown().await;
    drop(engine);
    let engine = start(&path, T0.saturating_add(12 * MINUTE), every_5_minutes()).await;
    run_until(&engine, T0.saturating_add(14 * MINUTE)).await;
    assert_eq!(
        fired(&engine, "tick", "every5").await,
        [5],
        "00:10 fired once; its instance was deleted, not unfired"
    );
    let (last, _) = engine.schedule_ticks("every5").await.unwrap();
    assert_eq!(last, Some(T0.saturating_add(10 * MINUTE)));
    engine.shutdown().await;
}

/// Issue 30 §2: a schedule deleted and created again under its name is a new schedule: the
/// old one's unfinished run does not hold its first tick back (overlap `skip`), and the old
/// one's last tick is not reported as its own.
#[tokio::test(start_paused = true)]
async fn a_schedule_created_again_under_its_name_fires_at_its_next_tick_despite_the_old_ones_run() {
    let (_dir, path) = temp_db();
    let engine = start_bare(&path, START).await;
    let made = || Schedule::untyped("made", "*/5 * * * *", "long", json!({})).unwrap();
    engine.create_schedule(made()).await.unwrap();
    run_until(&engine, T0.saturating_add(6 * MINUTE)).await;
    assert_eq!(
        fired(&engine, "long", "made").await,
        [5],
        "a run that stays"
    );
    engine.delete_schedule("made").await.unwrap();
    engine.create_schedule(made()).await.unwrap();
    let (last, _) = engine.schedule_ticks("made").await.unwrap();
    assert_eq!(last, None, "the new schedule has fired nothing yet");
    run_until(&engine, T0.saturating_add(11 * MINUTE)).await;
    assert_eq!(fired(&engine, "long", "made").await, [5, 10]);
    run_until(&engine, T0.saturating_add(16 * MINUTE)).await;
    assert_eq!(
        fired(&engine, "long", "made").await,
        [5, 10],
        "its own unfinished run makes its next tick skip"
    );
    engine.shutdown().await;
}

/// A schedule declared in code under the name of an API schedule deleted before: the
/// deleted one's row stayed, hidden, and every tick of the declared one found it deleted
/// and gave up without a word (listed as ticking, it never fired). The name is the code's
/// now: the declared schedule starts at its next tick.
#[tokio::test(start_paused = true)]
async fn a_schedule_declared_under_the_name_of_a_deleted_one_fires() {
    let (_dir, path) = temp_db();
    let engine = start_bare(&path, START).await;
    let made = Schedule::untyped("every5", "*/5 * * * *", "long", json!({})).unwrap();
    engine.create_schedule(made).await.unwrap();
    run_until(&engine, T0.saturating_add(6 * MINUTE)).await;
    assert_eq!(fired(&engine, "long", "every5").await, [5]);
    engine.delete_schedule("every5").await.unwrap();
    engine.shutdown().await;

    let engine = start(&path, T0.saturating_add(10 * MINUTE), every_5_minutes()).await;
    run_until(&engine, T0.saturating_add(16 * MINUTE)).await;
    assert_eq!(fired(&engine, "tick", "every5").await, [15]);
    let listed = engine.list_schedules().await.unwrap();
    assert!(listed[0].in_code && !listed[0].paused, "{listed:?}");
    engine.shutdown().await;
}

/// Issue 30 §2: expressions that never fire (a date that does not exist, a year gone by)
/// and schedules that would fire more often than once a minute are refused, declared or
/// created over the API, unless the engine allows shorter intervals.
#[tokio::test(start_paused = true)]
async fn schedules_that_never_fire_or_fire_more_than_once_a_minute_are_refused() {
    let (_dir, path) = temp_db();
    let engine = start_bare(&path, START).await;
    for (cron, says) in [
        ("0 0 31 2 *", "never fires"),
        ("0 0 0 1 1 * 2020", "never fires"),
        ("*/30 * * * * *", "fires every 30s"),
        ("0,10 * * * * *", "fires every 10s"),
    ] {
        let schedule = Schedule::untyped("odd", cron, "tick", json!({})).unwrap();
        let error = engine.create_schedule(schedule).await.unwrap_err();
        assert_eq!(error.code(), "schedule.invalid", "{cron}");
        assert!(error.to_string().contains(says), "{cron}: {error}");
    }
    assert!(engine.list_schedules().await.unwrap().is_empty());
    engine.shutdown().await;
    let declared = |cron: &str| Schedule::new::<Tick>("fast", cron, json!({})).unwrap();
    let (_dir2, path2) = temp_db();
    let Err(refused) = Engine::builder()
        .sqlite(&path2)
        .clock(Clock::virtual_at(START))
        .register(Tick)
        .schedule(declared("*/10 * * * * *"))
        .start()
        .await
    else {
        panic!("refused at start");
    };
    assert!(refused.to_string().contains("fires every 10s"), "{refused}");
    let allowed = Engine::builder()
        .sqlite(&path2)
        .clock(Clock::virtual_at(START))
        .register(Tick)
        .min_schedule_interval(Duration::from_secs(10))
        .schedule(declared("*/10 * * * * *"))
        .start()
        .await
        .unwrap();
    // To 31 s exactly: `run_until`'s steps of 10 s end at 40 s, where the tick of 40 s and
    // this test's look race (CI saw 4 ticks once).
    let left = START.as_millis() + 31_000 - allowed.clock().now().as_millis();
    tokio::time::sleep(Duration::from_millis(u64::try_from(left).unwrap())).await;
    assert_eq!(
        allowed
            .list_instances(Some("tick"), &ListOptions::default())
            .await
            .unwrap()
            .instances
            .len(),
        3
    );
    allowed.shutdown().await;
}

/// Issue 30 §2, with two engines on one PostgreSQL database, one 30 s behind the other,
/// and runs purged as soon as they complete: every tick fires once (the late engine used
/// to find the purged tick unfired and fire it again).
#[tokio::test(start_paused = true)]
#[cfg_attr(
    not(cairn_test_pg),
    ignore = "needs CAIRN_TEST_PG_URL (two engines on one PostgreSQL database)"
)]
async fn a_tick_purged_before_a_late_engine_reaches_it_fires_once() {
    #[cfg(feature = "postgres")]
    {
        if cairn::postgres::test_url().is_none() {
            return;
        }
        let runs: crate::support::Seen<String> = crate::support::Seen::default();
        struct Counted(crate::support::Seen<String>);
        impl Workflow for Counted {
            const NAME: &'static str = "counted";
            type Params = Value;
            type Output = ();
            async fn run(
                &self,
                e: WorkflowEvent<Value>,
                _: WorkflowStep,
            ) -> Result<(), WorkflowError> {
                self.0.push(e.instance_id.to_string());
                Ok(())
            }
        }
        let (_dir, path) = temp_db();
        let engine_at = |at: Timestamp| {
            crate::support::builder_on(crate::support::Backend::Postgres, &path)
                .clock(Clock::virtual_at(at))
                .register(Counted(runs.clone()))
                .workflow_retention(
                    "counted",
                    cairn::Retention {
                        success: Duration::ZERO,
                        error: Duration::ZERO,
                    },
                )
                .schedule(
                    Schedule::new::<Counted>("each", "* * * * *", json!({}))
                        .unwrap()
                        .catch_up(CatchUp::RunAll(100)),
                )
                .start()
        };
        let ahead = engine_at(START).await.unwrap();
        let behind = engine_at(START.saturating_sub(Duration::from_secs(30)))
            .await
            .unwrap();
        run_until(&ahead, START.saturating_add(8 * MINUTE + MINUTE / 2)).await;
        ahead.shutdown().await;
        behind.shutdown().await;
        let mut all = runs.all();
        all.sort();
        let mut once = all.clone();
        once.dedup();
        assert_eq!(all, once, "a tick ran twice");
        assert!(once.len() >= 8, "{once:?}");
    }
}
