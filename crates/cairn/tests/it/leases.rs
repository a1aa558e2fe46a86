//! Leases where they expire (PostgreSQL; a custom store with `lease_ttl`): renewals judge
//! only the lifetimes they were sent for, an engine woken from a stall stops the lifetimes
//! whose leases ran out once and takes them back, and a renewal answered too late extends
//! nothing. Run on both backends (the renewal logic is the engine's, the fence the store's).

use std::sync::Arc;
use std::time::Duration;

use cairn::{CreateOptions, LogKind, Retries};
use serde_json::json;
use tokio::sync::Semaphore;

use super::support::*;

/// A workflow whose one step signals `started` and then waits for a permit of `finish`;
/// `runs` counts its body runs.
fn held(
    runs: Counter,
    started: Arc<Semaphore>,
    finish: Arc<Semaphore>,
    retries: Retries,
) -> FnWorkflow {
    wf(move |_, step| {
        let (runs, started, finish) = (runs.clone(), started.clone(), finish.clone());
        let retries = retries.clone();
        async move {
            let out: u32 = step
                .run("work", move |_| {
                    let (runs, started, finish) = (runs.clone(), started.clone(), finish.clone());
                    async move {
                        runs.bump();
                        started.add_permits(1);
                        finish.acquire().await.unwrap().forget();
                        Ok(1)
                    }
                })
                .retries(retries)
                .await?;
            Ok(json!(out))
        }
    })
}

/// Takes a permit of `semaphore` (a body started), failing after a minute without one.
async fn permit(semaphore: &Semaphore) {
    tokio::time::timeout(Duration::from_secs(60), semaphore.acquire())
        .await
        .expect("no step body started")
        .unwrap()
        .forget();
}

/// Issue 30 §1.1: the renewal's list is taken at its tick; an instance whose claim was in
/// flight then is not in it, and the answer (which cannot name it) must not stop it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewal_does_not_stop_a_lifetime_claimed_while_it_was_in_flight() {
    let (_dir, path) = temp_db();
    let gates = Gates::default();
    let (runs, started, finish) = (
        Counter::default(),
        Arc::new(Semaphore::new(0)),
        Arc::new(Semaphore::new(0)),
    );
    // Long enough that no lease runs out while the test holds a call on a loaded machine:
    // `a`'s renewal is held from its tick (a third of the TTL) until `b`'s body has
    // started, and must land within the TTL of `a`'s claim. 6 s left ~4 s for that, which
    // a full CI run on PostgreSQL once overran (`a` lost its lease, and its attempt).
    let engine = gated_builder(BACKEND, &path, gates.clone())
        .await
        .lease_ttl(Duration::from_secs(12))
        .register(held(
            runs.clone(),
            started.clone(),
            finish.clone(),
            Retries::none(),
        ))
        .start()
        .await
        .unwrap();
    let client = engine.workflow::<FnWorkflow>();
    let a = client
        .create(CreateOptions::new(json!({})).id("a"))
        .await
        .unwrap();
    permit(&started).await;
    // The next claim (which takes b) is sent now and answered only after the next
    // renewal was sent, naming a alone.
    let claim = gates.arm("claim");
    let b = client
        .create(CreateOptions::new(json!({})).id("b"))
        .await
        .unwrap();
    claim.arrived().await;
    let renewal = gates.arm("renew");
    renewal.arrived().await;
    claim.release();
    permit(&started).await;
    renewal.release();
    // The tick after: the answer above has been handled by then.
    let next = gates.arm("renew");
    next.arrived().await;
    next.release();
    finish.add_permits(2);
    for instance in [&a, &b] {
        let status = tokio::time::timeout(Duration::from_secs(60), instance.wait())
            .await
            .expect("the instance never finished")
            .unwrap();
        assert_eq!(status.status, cairn::InstanceStatus::Complete, "{status:?}");
        assert!(
            records(instance, LogKind::AttemptFailure).await.is_empty(),
            "no attempt was interrupted"
        );
    }
    assert_eq!(runs.get(), 2, "each body ran once");
    engine.shutdown().await;
}

/// Issue 35, by a clock that jumps past the lease (a VM pause, SIGSTOP, a long hiccup):
/// every lifetime whose lease ran out is stopped once and taken back at once; instances
/// created after the jump run normally; none waits a TTL.
#[tokio::test(start_paused = true)]
async fn a_clock_jump_past_the_lease_stops_each_stale_lifetime_once_and_new_work_runs_at_once() {
    const TTL: Duration = Duration::from_secs(3);
    let (_dir, path) = temp_db();
    let bodies: Seen<(String, String, u32)> = Seen::default();
    let seen = bodies.clone();
    let workflow = wf(move |event, step| {
        let seen = seen.clone();
        async move {
            let id = event.instance_id.to_string();
            let mut total = 0u64;
            for name in ["s1", "s2", "s3"] {
                let (seen, id) = (seen.clone(), id.clone());
                let out: u64 = step
                    .run(name, move |ctx| {
                        let (seen, id) = (seen.clone(), id.clone());
                        async move {
                            seen.push((id, name.to_owned(), ctx.attempt));
                            // A long attempt: most of a lease.
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            Ok(1)
                        }
                    })
                    // An interrupted attempt is retried at once: what is measured is the
                    // engine's, not a back-off.
                    .retries(Retries::constant(3, Duration::ZERO))
                    .await?;
                total += out;
            }
            Ok(json!(total))
        }
    });
    let engine = builder_at(&path)
        .lease_ttl(TTL)
        .register(workflow)
        .start()
        .await
        .unwrap();
    let client = engine.workflow::<FnWorkflow>();
    create_numbered(&client, 5).await;
    while bodies.all().len() < 5 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The stall: nothing of the engine runs while the clock moves 1.5 leases on.
    tokio::time::advance(TTL * 3 / 2).await;
    let woke = tokio::time::Instant::now();
    for i in 5..10 {
        client
            .create(CreateOptions::new(json!({})).id(format!("i{i}")))
            .await
            .unwrap();
    }
    // Each instance has 6 s of work; after the stall none may wait longer than a lease
    // (an interrupted attempt runs again from the start).
    if tokio::time::timeout(TTL + Duration::from_secs(6 + 2), wait_numbered(&client, 10))
        .await
        .is_err()
    {
        for i in 0..10 {
            let instance = client.get(&format!("i{i}")).await.unwrap();
            eprintln!(
                "i{i}: {:?} {:?}",
                instance.status().await.unwrap().status,
                kinds(&instance).await
            );
        }
        panic!("an instance was held up by more than a lease after the stall");
    }
    eprintln!(
        "all done {:?} after the stall ended",
        tokio::time::Instant::now() - woke
    );
    let runs = bodies.all();
    for i in 0..10 {
        let id = format!("i{i}");
        let instance = client.get(&id).await.unwrap();
        let status = instance.status().await.unwrap();
        assert_eq!(status.status, cairn::InstanceStatus::Complete, "{id}: {status:?}");
        let failures = records(&instance, LogKind::AttemptFailure).await;
        // Stopped at most once by the stall: the attempt it interrupted.
        let most = if i < 5 { 1 } else { 0 };
        assert!(
            failures.len() <= most,
            "{id}: {} interrupted attempts: {failures:?}",
            failures.len()
        );
        let mine: Vec<_> = runs.iter().filter(|(r, _, _)| *r == id).collect();
        let mut unique = mine.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), mine.len(), "{id}: an attempt ran twice: {mine:?}");
    }
    engine.shutdown().await;
}

/// Issue 35: a renewal that answers only after its leases ran out is abandoned, its
/// lifetime stopped and taken back at a new epoch at once (no waiting a TTL for the lease to
/// run out), and when the stale renewal lands it extends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_answered_after_its_deadline_extends_no_lease_and_the_instance_runs_on_at_once()
{
    let (_dir, path) = temp_db();
    let gates = Gates::default();
    let (runs, started, finish) = (
        Counter::default(),
        Arc::new(Semaphore::new(0)),
        Arc::new(Semaphore::new(0)),
    );
    let ttl = Duration::from_millis(1_500);
    let engine = gated_builder(BACKEND, &path, gates.clone())
        .await
        .lease_ttl(ttl)
        .register(held(
            runs.clone(),
            started.clone(),
            finish.clone(),
            Retries::constant(3, Duration::ZERO),
        ))
        .start()
        .await
        .unwrap();
    let client = engine.workflow::<FnWorkflow>();
    let a = client
        .create(CreateOptions::new(json!({})).id("a"))
        .await
        .unwrap();
    permit(&started).await;
    let renewal = gates.arm("renew");
    renewal.arrived().await;
    // No claim goes through from here on: only this engine's taking back of the lease it
    // lost (`Store::reclaim`, at once) can run the instance again, not a claim made once
    // the lease ran out in the store. (A bound on the wall time between the two failed
    // under a loaded CI: 5 s against 3.)
    let claims = gates.arm("claim");
    let held_since = std::time::Instant::now();
    // The renewal is held past the lease: the lifetime is stopped and the instance taken
    // back (its interrupted attempt recorded).
    permit(&started).await;
    eprintln!("the instance ran again {:?} after the renewal was held", held_since.elapsed());
    claims.release();
    renewal.release();
    let kept = renewal.answered().await;
    assert_eq!(kept, "Ok([])", "the stale renewal extended a lease");
    finish.add_permits(1);
    let status = tokio::time::timeout(Duration::from_secs(60), a.wait())
        .await
        .expect("never finished")
        .unwrap();
    assert_eq!(status.status, cairn::InstanceStatus::Complete);
    assert_eq!(runs.get(), 2, "the interrupted attempt and its retry");
    assert_eq!(records(&a, LogKind::AttemptFailure).await.len(), 1);
    engine.shutdown().await;
}

/// Review finding: renewals that fail at once (the store refuses the connection) left the
/// lifetime running past its lease until the next tick, up to a third of the TTL more,
/// while another engine could take the instance and run the same body again. It must stop
/// when its lease runs out, renewal or no renewal. (SQLite with a TTL; the renewal logic is
/// the engine's.)
///
/// Review finding, later: it stopped at the very end of its lease by its own clock, while
/// another engine claims once the lease has run out by *its* clock: one a little ahead
/// claimed, and ran the same body again, while this one's still ran. It now stops a tenth
/// of the TTL early (the margin its writes already kept), so clocks that many seconds apart
/// never run a body twice at once.
#[tokio::test(start_paused = true)]
async fn a_lifetime_whose_renewals_fail_stops_a_tenth_of_the_ttl_before_its_lease_runs_out() {
    const TTL: Duration = Duration::from_secs(3);
    let (_dir, path) = temp_db();
    let started = Arc::new(std::sync::Mutex::new(None::<tokio::time::Instant>));
    let stopped = Arc::new(std::sync::Mutex::new(None::<tokio::time::Instant>));
    /// Notes when the body it lives in is dropped (the lifetime was stopped).
    struct OnDrop(Arc<std::sync::Mutex<Option<tokio::time::Instant>>>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0
                .lock()
                .unwrap()
                .get_or_insert_with(tokio::time::Instant::now);
        }
    }
    let (s, d) = (started.clone(), stopped.clone());
    let workflow = wf(move |_, step| {
        let (s, d) = (s.clone(), d.clone());
        async move {
            step.run("work", move |_| {
                let (s, d) = (s.clone(), d.clone());
                async move {
                    s.lock().unwrap().get_or_insert_with(tokio::time::Instant::now);
                    let _noted = OnDrop(d);
                    std::future::pending::<()>().await;
                    Ok(1u32)
                }
            })
            .await?;
            Ok(json!(null))
        }
    });
    let engine = hooked_builder(&path, |method| match method {
        "renew" => Err(cairn::store::Error::Unavailable("refused".into())),
        _ => Ok(()),
    })
    .clock(cairn::Clock::virtual_now())
    .lease_ttl(TTL)
    .register(workflow)
    .start()
    .await
    .unwrap();
    // Off the renewal's ticks (a third of the TTL from the start): claimed half a tick in.
    tokio::time::sleep(TTL / 6).await;
    engine
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(json!({})).id("a"))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + TTL * 3;
    while stopped.lock().unwrap().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "never stopped");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ran = stopped.lock().unwrap().unwrap() - started.lock().unwrap().unwrap();
    assert!(
        ran <= TTL - TTL / 10 + Duration::from_millis(50),
        "the body ran {ran:?} under a lease of {TTL:?}"
    );
    engine.shutdown().await;
}
