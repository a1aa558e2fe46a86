//! The conformance suite: the behaviour every [`Store`] backend must have.
//!
//! Each case is an `async fn(Arc<dyn Store>)` that panics on a violation. A backend runs them
//! all with one macro call, given an async factory producing a fresh, empty store:
//!
//! ```text
//! cairn_store::conformance_tests!(my_factory);
//! ```

#![allow(clippy::unwrap_used, missing_docs)] // test code: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use cairn_core::{
    ErrorInfo, InstanceId, InstanceStatus, LogEntry, LogKind, StepKey, StepKind, StepRecord,
    StepState, Timestamp, WorkflowName,
};

use crate::{
    ControlOutcome, ControlRequest, Created, Error, InstanceRecord, ListQuery, NewInstance,
    ParentLink, StatusChange, Store, Write,
};

const T0: Timestamp = Timestamp::from_millis(1_700_000_000_000);
const TTL: Duration = Duration::from_secs(30);

fn wf(name: &str) -> WorkflowName {
    WorkflowName::new(name).unwrap()
}

/// A new instance `id` of `workflow` with small params, created at a fixed time, as every
/// case makes them (and a backend's own tests, from its `..` defaults).
pub fn new_instance(workflow: &str, id: &str) -> NewInstance {
    NewInstance {
        workflow: wf(workflow),
        id: InstanceId::new(id).unwrap(),
        params: r#"{"n":1}"#.into(),
        created_at: T0,
        queued: log(LogKind::WorkflowQueued, None),
        retention: crate::Retention {
            success: Duration::from_secs(60),
            error: Duration::from_secs(120),
        },
        parent: None,
        priority: 0,
        concurrency: None,
        version: None,
    }
}

fn log(kind: LogKind, step: Option<StepKey>) -> LogEntry {
    LogEntry {
        kind,
        at: T0,
        step,
        meta: serde_json::json!({}),
    }
}

fn step(name: &str, count: u32, seq: u32, state: StepState) -> StepRecord {
    StepRecord {
        key: StepKey {
            kind: StepKind::Run,
            name: name.into(),
            count,
        },
        seq,
        state,
        config: serde_json::json!({"retries": {"limit": 5}}).into(),
        attempts: 1,
        in_flight: state == StepState::Running,
        wake_at: None,
        output: (state == StepState::Succeeded).then(|| "42".to_owned()),
        error: (state == StepState::Failed).then(|| ErrorInfo::new("Error", "boom")),
        started_at: T0,
        ended_at: (state != StepState::Running).then_some(T0),
        has_rollback: false,
    }
}

/// The one claimable instance of `workflow`, claimed by owner `o` at `T0`.
async fn claim_one(store: &dyn Store, workflow: &str) -> crate::Claimed {
    store
        .claim("o", &[wf(workflow)], T0, TTL, 1)
        .await
        .unwrap()
        .remove(0)
}

async fn create_one(store: &dyn Store, workflow: &str, id: &str) -> crate::InstanceRef {
    match store
        .create(vec![new_instance(workflow, id)])
        .await
        .unwrap()[..]
    {
        [Created::New(r)] => r,
        ref other => panic!("expected a new instance, got {other:?}"),
    }
}

pub async fn create_and_read(store: Arc<dyn Store>) {
    let r = create_one(&*store, "wf", "a").await;
    let rec = store
        .instance(&wf("wf"), &InstanceId::new("a").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.instance, r);
    assert_eq!(rec.status, InstanceStatus::Queued);
    assert_eq!(rec.params, r#"{"n":1}"#);
    assert_eq!(rec.created_at, T0);
    assert_eq!(rec.ready_at, Some(T0));
    let logs = store.log(r, 0, 10).await.unwrap();
    assert_eq!(logs.len(), 1);
    assert_eq!(logs[0].entry.kind, LogKind::WorkflowQueued);
    assert!(
        store
            .instance(&wf("wf"), &InstanceId::new("b").unwrap())
            .await
            .unwrap()
            .is_none()
    );
}

/// Issue 30 §3: an instance's params are stored once, in its row: a restart's
/// `WORKFLOW_QUEUED` record shows them cut when they are large.
pub async fn a_restart_logs_large_params_cut(store: Arc<dyn Store>) {
    let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(100_000));
    let mut new = new_instance("wf", "big");
    new.params = big.clone();
    store.create(vec![new]).await.unwrap();
    store
        .control(
            &wf("wf"),
            &InstanceId::new("big").unwrap(),
            ControlRequest::Restart {
                at: T0,
                from: None,
                adopt: None,
            },
        )
        .await
        .unwrap();
    let record = store
        .instance(&wf("wf"), &InstanceId::new("big").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.params, big, "the row keeps them whole");
    let log = store.log(record.instance, 0, 10).await.unwrap();
    let queued = &log[0].entry;
    assert_eq!(queued.kind, LogKind::WorkflowQueued);
    let shown = queued.meta["params"].as_str().expect("cut to a string");
    assert!(shown.len() < 4_200, "{} bytes", shown.len());
    assert!(shown.ends_with("[truncated: 100011 bytes]"), "{shown}");
}

pub async fn ids_are_unique_per_workflow(store: Arc<dyn Store>) {
    create_one(&*store, "wf", "a").await;
    let out = store
        .create(vec![
            new_instance("wf", "a"),
            new_instance("other", "a"),
            new_instance("wf", "b"),
        ])
        .await
        .unwrap();
    assert_eq!(out[0], Created::AlreadyExists);
    assert!(
        matches!(out[1], Created::New(_)),
        "same id in another workflow is allowed"
    );
    assert!(matches!(out[2], Created::New(_)));
}

pub async fn claim_takes_each_ready_instance_once(store: Arc<dyn Store>) {
    create_one(&*store, "wf", "a").await;
    create_one(&*store, "wf", "b").await;
    create_one(&*store, "unregistered", "c").await;
    let first = store
        .claim("owner-1", &[wf("wf")], T0, TTL, 10)
        .await
        .unwrap();
    assert_eq!(first.len(), 2, "only instances of the given workflows");
    assert!(first.iter().all(|c| c.lease.epoch == 1));
    let again = store
        .claim("owner-2", &[wf("wf")], T0, TTL, 10)
        .await
        .unwrap();
    assert!(again.is_empty(), "a leased instance is not claimed twice");
}

pub async fn claim_respects_limit_and_ready_time(store: Arc<dyn Store>) {
    for id in ["a", "b", "c"] {
        create_one(&*store, "wf", id).await;
    }
    let early = Timestamp::from_millis(T0.as_millis() - 1);
    assert!(
        store
            .claim("o", &[wf("wf")], early, TTL, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let some = store.claim("o", &[wf("wf")], T0, TTL, 2).await.unwrap();
    assert_eq!(some.len(), 2);
    assert_eq!(some[0].record.id.as_str(), "a", "oldest first");
}

pub async fn stale_lease_is_fenced(store: Arc<dyn Store>) {
    create_one(&*store, "wf", "a").await;
    let claimed = store
        .claim("owner-1", &[wf("wf")], T0, TTL, 1)
        .await
        .unwrap()
        .remove(0);
    let lease = claimed.lease;
    store
        .commit(
            lease,
            vec![Write::Step(step("s", 1, 1, StepState::Running))],
        )
        .await
        .unwrap();

    // The lease expires; another owner claims the instance and the epoch moves on.
    let later = T0.saturating_add(TTL * 2);
    let stolen = store
        .claim("owner-2", &[wf("wf")], later, TTL, 1)
        .await
        .unwrap();
    assert_eq!(stolen.len(), 1, "an expired lease is claimable");
    assert_eq!(stolen[0].lease.epoch, lease.epoch + 1);

    let err = store
        .commit(
            lease,
            vec![Write::Step(step("s", 1, 1, StepState::Succeeded))],
        )
        .await
        .unwrap_err();
    assert_eq!(err, Error::LeaseLost(lease.instance));
    let journal = store.journal(lease.instance).await.unwrap();
    assert_eq!(
        journal[0].state,
        StepState::Running,
        "the fenced write did not land"
    );
}

pub async fn renew_keeps_a_lease(store: Arc<dyn Store>) {
    create_one(&*store, "wf", "a").await;
    let a = store
        .claim("owner-1", &[wf("wf")], T0, TTL, 1)
        .await
        .unwrap()[0]
        .lease;
    let renewed = store
        .renew("owner-1", vec![a], T0, T0.saturating_add(TTL * 10))
        .await
        .unwrap();
    assert_eq!(renewed, [a], "the renewed leases are reported");
    let later = T0.saturating_add(TTL * 2);
    assert!(
        store
            .claim("owner-2", &[wf("wf")], later, TTL, 1)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A lease that ran out is lost: its owner cannot renew it back (it stopped that lifetime),
/// and another engine claims the instance with a newer epoch, fencing the old one off.
pub async fn an_expired_lease_is_not_renewed_and_is_claimed(store: Arc<dyn Store>) {
    create_one(&*store, "wf", "a").await;
    let first = store
        .claim("owner-1", &[wf("wf")], T0, TTL, 1)
        .await
        .unwrap()[0]
        .lease;
    let late = T0.saturating_add(TTL * 2);
    let renewed = store
        .renew("owner-1", vec![first], late, late.saturating_add(TTL))
        .await
        .unwrap();
    assert!(
        renewed.is_empty(),
        "the lost lease is reported as not renewed"
    );
    let taken = store
        .claim("owner-2", &[wf("wf")], late, TTL, 1)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1, "the expired lease is claimable");
    assert!(taken[0].lease.epoch > first.epoch);
    let err = store
        .commit(first, vec![Write::Log(log(LogKind::WorkflowStart, None))])
        .await
        .unwrap_err();
    assert_eq!(err, Error::LeaseLost(first.instance));
}

pub async fn commit_is_atomic(store: Arc<dyn Store>) {
    create_one(&*store, "wf", "a").await;
    let lease = claim_one(&*store, "wf").await.lease;
    let key = StepKey {
        kind: StepKind::Run,
        name: "s".into(),
        count: 1,
    };
    store
        .commit(
            lease,
            vec![
                Write::Step(step("s", 1, 1, StepState::Succeeded)),
                Write::Log(log(LogKind::StepSuccess, Some(key.clone()))),
                Write::Status(StatusChange {
                    started_at: Some(T0),
                    ..StatusChange::to(InstanceStatus::Running)
                }),
            ],
        )
        .await
        .unwrap();
    let rec = store
        .instance(&wf("wf"), &InstanceId::new("a").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, InstanceStatus::Running);
    assert_eq!(rec.started_at, Some(T0));
    let journal = store.journal(lease.instance).await.unwrap();
    assert_eq!(journal, vec![step("s", 1, 1, StepState::Succeeded)]);
    let logs = store.log(lease.instance, 0, 100).await.unwrap();
    assert_eq!(logs.last().unwrap().entry.step, Some(key));
}

pub async fn journal_upserts_by_key_in_start_order(store: Arc<dyn Store>) {
    create_one(&*store, "wf", "a").await;
    let lease = claim_one(&*store, "wf").await.lease;
    store
        .commit(
            lease,
            vec![
                Write::Step(step("b", 1, 2, StepState::Running)),
                Write::Step(step("a", 1, 1, StepState::Running)),
            ],
        )
        .await
        .unwrap();
    store
        .commit(lease, vec![Write::Step(step("b", 1, 2, StepState::Failed))])
        .await
        .unwrap();
    let journal = store.journal(lease.instance).await.unwrap();
    assert_eq!(journal.len(), 2);
    assert_eq!(journal[0].key.name, "a");
    assert_eq!(journal[1].state, StepState::Failed);
    assert_eq!(journal[1].error, Some(ErrorInfo::new("Error", "boom")));
}

pub async fn log_ids_are_monotonic_and_paged(store: Arc<dyn Store>) {
    let a = create_one(&*store, "wf", "a").await;
    let b = create_one(&*store, "wf", "b").await;
    let leases = store.claim("o", &[wf("wf")], T0, TTL, 2).await.unwrap();
    for _ in 0..3 {
        for c in &leases {
            store
                .commit(c.lease, vec![Write::Log(log(LogKind::WorkflowStart, None))])
                .await
                .unwrap();
        }
    }
    let la = store.log(a, 0, 100).await.unwrap();
    let lb = store.log(b, 0, 100).await.unwrap();
    assert_eq!(la.len(), 4);
    assert!(la.windows(2).all(|w| w[0].id < w[1].id));
    assert!(la.iter().all(|r| !lb.iter().any(|s| s.id == r.id)));
    let page = store.workflow_log(&wf("wf"), 0, 100).await.unwrap();
    assert!(page.scanned_to >= page.records.last().unwrap().1.id);
    let all = page.records;
    assert_eq!(all.len(), 8, "both instances' records");
    assert!(all.windows(2).all(|w| w[0].1.id < w[1].1.id));
    assert_eq!(
        store
            .workflow_log(&wf("wf"), all[5].1.id, 100)
            .await
            .unwrap()
            .records
            .len(),
        2
    );
    // A workflow with nothing new still moves on past the others' records.
    let quiet = store.workflow_log(&wf("quiet"), 0, 100).await.unwrap();
    assert!(quiet.records.is_empty());
    assert!(
        quiet.scanned_to >= all.last().unwrap().1.id,
        "scanned to {}, the newest record is {}",
        quiet.scanned_to,
        all.last().unwrap().1.id
    );
    let again = store
        .workflow_log(&wf("quiet"), quiet.scanned_to, 100)
        .await
        .unwrap();
    assert_eq!(again.scanned_to, quiet.scanned_to, "nothing newer: stays");
    let tail = store.log(a, la[1].id, 100).await.unwrap();
    assert_eq!(tail, la[2..].to_vec(), "resumes strictly after the cursor");
    assert_eq!(store.log(a, 0, 2).await.unwrap().len(), 2);
}

pub async fn release_makes_an_instance_claimable_again(store: Arc<dyn Store>) {
    create_one(&*store, "wf", "a").await;
    let first = claim_one(&*store, "wf").await;
    let wake = T0.saturating_add(Duration::from_secs(60));
    store
        .commit(
            first.lease,
            vec![Write::Status(StatusChange {
                ready_at: Some(wake),
                release: true,
                ..StatusChange::to(InstanceStatus::Waiting)
            })],
        )
        .await
        .unwrap();
    assert!(
        store
            .claim("o", &[wf("wf")], T0, TTL, 1)
            .await
            .unwrap()
            .is_empty(),
        "not before its wake time"
    );
    let again = store.claim("o", &[wf("wf")], wake, TTL, 1).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].lease.epoch, first.lease.epoch + 1);
    let err = store.commit(first.lease, vec![]).await.unwrap_err();
    assert_eq!(
        err,
        Error::LeaseLost(first.lease.instance),
        "the old lease is fenced"
    );
}

pub async fn resuming_instances_are_claimed_before_new_ones(store: Arc<dyn Store>) {
    create_one(&*store, "wf", "old").await;
    let old = claim_one(&*store, "wf").await;
    create_one(&*store, "wf", "new").await;
    store
        .commit(
            old.lease,
            vec![Write::Status(StatusChange {
                ready_at: Some(T0.saturating_add(Duration::from_secs(1))),
                release: true,
                ..StatusChange::to(InstanceStatus::Waiting)
            })],
        )
        .await
        .unwrap();
    let later = T0.saturating_add(Duration::from_secs(5));
    let next = store.claim("o", &[wf("wf")], later, TTL, 1).await.unwrap();
    assert_eq!(next[0].record.id.as_str(), "old");
}

pub async fn list_is_newest_first_with_filters(store: Arc<dyn Store>) {
    for id in ["a", "b", "c"] {
        create_one(&*store, "wf", id).await;
    }
    create_one(&*store, "other", "z").await;
    let all = store
        .list(ListQuery {
            workflow: Some(wf("wf")),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    let ids: Vec<_> = all.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["c", "b", "a"]);
    // A listing never reads the params (up to a megabyte each): read the instance for them.
    assert!(all.iter().all(|r| r.params == "null"), "{all:?}");
    let page = store
        .list(ListQuery {
            workflow: Some(wf("wf")),
            after: Some(all[0].instance),
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page[0].id.as_str(), "b");
    // Oldest first, and its cursor continues towards the newer rows.
    let oldest = store
        .list(ListQuery {
            workflow: Some(wf("wf")),
            oldest_first: true,
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let ids: Vec<_> = oldest.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    let rest = store
        .list(ListQuery {
            workflow: Some(wf("wf")),
            oldest_first: true,
            after: Some(oldest[1].instance),
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let ids: Vec<_> = rest.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["c"]);
    let running = store
        .list(ListQuery {
            statuses: vec![InstanceStatus::Running],
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(running.is_empty());
    assert_eq!(
        store
            .count(&wf("wf"), InstanceStatus::Queued)
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        store
            .count(&wf("wf"), InstanceStatus::Running)
            .await
            .unwrap(),
        0
    );
}

/// The dashboard's filters (several statuses, a creation range, an id prefix, with and
/// without a workflow) select the same rows in `list` and `count_matching`, and a prefix
/// is literal: `_` matches only itself.
pub async fn list_filters_and_count_matching_agree(store: Arc<dyn Store>) {
    let ids = ["ord-1", "ord-2", "ord_3", "ordx", "inv-1", "ordy"];
    for (i, id) in ids.iter().enumerate() {
        let mut new = new_instance("wf", id);
        new.created_at = T0.saturating_add(Duration::from_secs(60 * i as u64));
        store.create(vec![new]).await.unwrap();
    }
    create_one(&*store, "other", "ord-9").await;
    // ord-2 runs and waits, ord_3 runs: three statuses in play.
    let later = T0.saturating_add(Duration::from_secs(3600));
    let claimed = store.claim("o", &[wf("wf")], later, TTL, 10).await.unwrap();
    for (id, status) in [
        ("ord-2", InstanceStatus::Waiting),
        ("ord_3", InstanceStatus::Running),
    ] {
        let lease = claimed
            .iter()
            .find(|c| c.record.id.as_str() == id)
            .expect("claimed")
            .lease;
        store
            .commit(lease, vec![Write::Status(StatusChange::to(status))])
            .await
            .unwrap();
    }
    let ids_of = |rows: Vec<InstanceRecord>| -> Vec<String> {
        rows.into_iter().map(|r| r.id.to_string()).collect()
    };
    let check = |query: ListQuery, want: &[&str]| {
        let store = store.clone();
        let want: Vec<String> = want.iter().map(|s| (*s).to_owned()).collect();
        async move {
            let listed = ids_of(store.list(query.clone()).await.unwrap());
            assert_eq!(listed, want, "{query:?}");
            let n = store.count_matching(query.clone()).await.unwrap();
            assert_eq!(n, want.len() as u64, "count of {query:?}");
        }
    };
    let of = |statuses: Vec<InstanceStatus>| ListQuery {
        workflow: Some(wf("wf")),
        statuses,
        limit: 100,
        ..Default::default()
    };
    check(
        of(vec![InstanceStatus::Waiting, InstanceStatus::Running]),
        &["ord_3", "ord-2"],
    )
    .await;
    check(
        ListQuery {
            id_prefix: Some("ord-".into()),
            ..of(vec![])
        },
        &["ord-2", "ord-1"],
    )
    .await;
    check(
        ListQuery {
            id_prefix: Some("ord_".into()),
            ..of(vec![])
        },
        &["ord_3"],
    )
    .await;
    check(
        ListQuery {
            id_prefix: Some("ord-".into()),
            limit: 100,
            ..Default::default()
        },
        &["ord-9", "ord-2", "ord-1"],
    )
    .await;
    check(
        ListQuery {
            created_from: Some(T0.saturating_add(Duration::from_secs(60))),
            created_before: Some(T0.saturating_add(Duration::from_secs(180))),
            ..of(vec![])
        },
        &["ord_3", "ord-2"],
    )
    .await;
    check(
        ListQuery {
            statuses: vec![InstanceStatus::Queued],
            id_prefix: Some("ord".into()),
            created_from: Some(T0.saturating_add(Duration::from_secs(60))),
            ..of(vec![])
        },
        &["ordy", "ordx"],
    )
    .await;
    // A cursor applies to both: a listing pinned at ord_3 and its count.
    let all = store.list(of(vec![])).await.unwrap();
    let ord_3 = all
        .iter()
        .find(|r| r.id.as_str() == "ord_3")
        .unwrap()
        .instance;
    check(
        ListQuery {
            id_prefix: Some("ord".into()),
            after: Some(ord_3),
            ..of(vec![])
        },
        &["ord-2", "ord-1"],
    )
    .await;
}

pub async fn commit_to_a_missing_instance_is_not_found(store: Arc<dyn Store>) {
    let lease = crate::Lease {
        instance: crate::InstanceRef(987_654),
        epoch: 1,
    };
    assert_eq!(
        store.commit(lease, vec![]).await.unwrap_err(),
        Error::NotFound(lease.instance)
    );
}

pub async fn finished_instances_are_purged_after_their_retention(store: Arc<dyn Store>) {
    let r = create_one(&*store, "wf", "a").await;
    let lease = claim_one(&*store, "wf").await.lease;
    assert_eq!(
        store.next_purge().await.unwrap(),
        None,
        "a running instance is never purged"
    );
    store
        .commit(
            lease,
            vec![Write::Status(StatusChange {
                ended_at: Some(T0),
                output: Some("1".into()),
                release: true,
                ..StatusChange::to(InstanceStatus::Complete)
            })],
        )
        .await
        .unwrap();
    let due = T0.saturating_add(Duration::from_secs(60));
    assert_eq!(
        store.next_purge().await.unwrap(),
        Some(due),
        "success retention: 60 s"
    );
    assert_eq!(store.purge(T0, 10).await.unwrap(), 0);
    assert_eq!(store.purge(due, 10).await.unwrap(), 1);
    assert!(
        store
            .instance(&wf("wf"), &InstanceId::new("a").unwrap())
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store.log(r, 0, 10).await.unwrap().is_empty(),
        "its log went with it"
    );
    create_one(&*store, "wf", "a").await; // the id is free again
}

/// A lease of a deleted instance must never commit into a later instance, even one that
/// took the deleted one's place as the newest row (on SQLite: the same rowid).
pub async fn fencing_survives_instance_row_reuse(store: Arc<dyn Store>) {
    let old = create_one(&*store, "wf", "a").await;
    let stale = store
        .claim("owner-1", &[wf("wf")], T0, TTL, 1)
        .await
        .unwrap();
    let stale = stale[0].lease;
    let deleted = store
        .control(
            &wf("wf"),
            &InstanceId::new("a").unwrap(),
            ControlRequest::Delete,
        )
        .await
        .unwrap();
    assert!(
        matches!(deleted, ControlOutcome::Done { .. }),
        "{deleted:?}"
    );
    for id in ["a", "b"] {
        let new = create_one(&*store, "wf", id).await;
        assert_ne!(new, old, "an instance ref is never given out twice");
        let claimed = store
            .claim("owner-2", &[wf("wf")], T0, TTL, 1)
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1);
        let err = store
            .commit(
                stale,
                vec![Write::Status(StatusChange::to(InstanceStatus::Complete))],
            )
            .await
            .expect_err("a stale lease of a deleted instance must not commit");
        assert!(
            matches!(err, Error::LeaseLost(_) | Error::NotFound(_)),
            "{err:?}"
        );
        let rec = store
            .instance(&wf("wf"), &InstanceId::new(id).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            rec.status,
            InstanceStatus::Queued,
            "untouched by the stale lease"
        );
        store
            .control(
                &wf("wf"),
                &InstanceId::new(id).unwrap(),
                ControlRequest::Delete,
            )
            .await
            .unwrap();
    }
}

/// "Keep forever" (`Duration::MAX`) retention never overflows: the instance is never due
/// and reading the next purge time keeps working.
pub async fn keep_forever_retention_does_not_overflow(store: Arc<dyn Store>) {
    let mut forever = new_instance("wf", "a");
    forever.retention = crate::Retention {
        success: Duration::MAX,
        error: Duration::MAX,
    };
    store.create(vec![forever]).await.unwrap();
    let lease = store.claim("o", &[wf("wf")], T0, TTL, 1).await.unwrap()[0].lease;
    store
        .commit(
            lease,
            vec![Write::Status(StatusChange {
                ended_at: Some(T0),
                output: Some("1".into()),
                release: true,
                ..StatusChange::to(InstanceStatus::Complete)
            })],
        )
        .await
        .unwrap();
    let next = store.next_purge().await.expect("next_purge must not fail");
    let far = T0.saturating_add(Duration::from_secs(100_000 * 365 * 86_400));
    assert!(next.is_none_or(|at| at > far), "{next:?}");
    assert_eq!(store.purge(far, 10).await.unwrap(), 0);
}

/// A pause cancelled (resumed) before the lease holder completes it: the completion
/// changes nothing and logs no `WORKFLOW_PAUSED`.
pub async fn a_cancelled_pause_logs_no_workflow_paused(store: Arc<dyn Store>) {
    let r = create_one(&*store, "wf", "a").await;
    let lease = store.claim("o", &[wf("wf")], T0, TTL, 1).await.unwrap()[0].lease;
    let id = InstanceId::new("a").unwrap();
    store
        .control(&wf("wf"), &id, ControlRequest::Pause { at: T0 })
        .await
        .unwrap();
    store
        .control(&wf("wf"), &id, ControlRequest::Resume { at: T0 })
        .await
        .unwrap();
    let paused = Write::Pause {
        at: T0,
        record: log(LogKind::WorkflowPaused, None),
    };
    let status = store.commit(lease, vec![paused]).await.unwrap();
    assert_ne!(status, InstanceStatus::Paused);
    let kinds: Vec<LogKind> = store
        .log(r, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.entry.kind)
        .collect();
    assert!(!kinds.contains(&LogKind::WorkflowPaused), "{kinds:?}");
    // A pause that does take effect logs it.
    store
        .control(&wf("wf"), &id, ControlRequest::Pause { at: T0 })
        .await
        .unwrap();
    let paused = Write::Pause {
        at: T0,
        record: log(LogKind::WorkflowPaused, None),
    };
    assert_eq!(
        store.commit(lease, vec![paused]).await.unwrap(),
        InstanceStatus::Paused
    );
    let logged = store.log(r, 0, 100).await.unwrap();
    assert_eq!(
        logged
            .iter()
            .filter(|l| l.entry.kind == LogKind::WorkflowPaused)
            .count(),
        1
    );
}

/// An event sent twice with one idempotency key is buffered once; the second send is a
/// duplicate also after the first was consumed and after the instance finished. Without a
/// key every send is buffered.
pub async fn an_event_sent_twice_with_one_key_is_buffered_once(store: Arc<dyn Store>) {
    let r = create_one(&*store, "wf", "a").await;
    let id = InstanceId::new("a").unwrap();
    let event = |key: Option<&str>| crate::NewEvent {
        event_type: cairn_core::EventType::new("go").unwrap(),
        payload: "1".into(),
        at: T0,
        idempotency_key: key.map(str::to_owned),
    };
    let send = |key| store.send_event(&wf("wf"), &id, event(key));
    assert_eq!(send(Some("k1")).await.unwrap(), crate::Sent::Buffered(r));
    assert_eq!(send(Some("k1")).await.unwrap(), crate::Sent::Duplicate(r));
    assert_eq!(send(Some("k2")).await.unwrap(), crate::Sent::Buffered(r));
    assert_eq!(send(None).await.unwrap(), crate::Sent::Buffered(r));
    let lease = store.claim("o", &[wf("wf")], T0, TTL, 1).await.unwrap()[0].lease;
    let mut taken = 0;
    for n in 1..=4 {
        let key = StepKey {
            kind: StepKind::WaitForEvent,
            name: "w".into(),
            count: n,
        };
        let mut wait = step("w", n, n, StepState::Running);
        wait.key = key.clone();
        store.commit(lease, vec![Write::Step(wait)]).await.unwrap();
        let go = cairn_core::EventType::new("go").unwrap();
        if store
            .take_event(lease, key, go, T0)
            .await
            .unwrap()
            .is_some()
        {
            taken += 1;
        }
    }
    assert_eq!(taken, 3, "k1 once, k2, and the unkeyed one");
    assert_eq!(
        send(Some("k1")).await.unwrap(),
        crate::Sent::Duplicate(r),
        "after it was consumed"
    );
    store
        .commit(
            lease,
            vec![Write::Status(StatusChange {
                ended_at: Some(T0),
                release: true,
                ..StatusChange::to(InstanceStatus::Complete)
            })],
        )
        .await
        .unwrap();
    assert_eq!(
        send(Some("k2")).await.unwrap(),
        crate::Sent::Duplicate(r),
        "after it finished"
    );
    assert_eq!(
        send(Some("k3")).await.unwrap(),
        crate::Sent::Finished(InstanceStatus::Complete)
    );
}

/// A wait for an event, `name`-1 at start order `seq`, still waiting.
fn waiting(name: &str, seq: u32) -> StepRecord {
    let mut wait = step(name, 1, seq, StepState::Running);
    wait.key.kind = StepKind::WaitForEvent;
    wait
}

/// What the engine commits for `wait` when the workflow drops it (it lost a `select!`).
fn cancelled(mut wait: StepRecord) -> Write {
    wait.state = StepState::Cancelled;
    wait.error = Some(ErrorInfo::new("StepCancelled", "dropped"));
    Write::Cancel {
        step: wait,
        records: Vec::new(),
    }
}

/// Restarts instance `a` of `wf` from its step `name`-1, which must go ahead.
async fn restart_from(store: &dyn Store, name: &str) {
    let restarted = store
        .control(
            &wf("wf"),
            &InstanceId::new("a").unwrap(),
            ControlRequest::Restart {
                at: T0,
                from: Some(StepKey {
                    kind: StepKind::Run,
                    name: name.into(),
                    count: 1,
                }),
                adopt: None,
            },
        )
        .await
        .unwrap();
    assert!(
        matches!(restarted, ControlOutcome::Done { .. }),
        "{restarted:?}"
    );
}

/// A restart from a step keeps the idempotency keys of the events its kept waits took: a
/// retried send of one stays a duplicate (buffered again, a later wait of its type would
/// receive it a second time). The keys of the events it clears go, so those can be sent
/// again: buffered ones, ones taken by a wait it wipes, and one a cancelled wait put back.
pub async fn a_restart_from_a_step_keeps_the_keys_of_the_events_its_kept_waits_took(
    store: Arc<dyn Store>,
) {
    let r = create_one(&*store, "wf", "a").await;
    let id = InstanceId::new("a").unwrap();
    let go = cairn_core::EventType::new("go").unwrap();
    let send = |key: &str| {
        store.send_event(
            &wf("wf"),
            &id,
            crate::NewEvent {
                event_type: go.clone(),
                payload: format!("{:?}", key),
                at: T0,
                idempotency_key: Some(key.to_owned()),
            },
        )
    };
    let lease = store.claim("o", &[wf("wf")], T0, TTL, 1).await.unwrap()[0].lease;
    let take = |wait: StepRecord| store.take_event(lease, wait.key, go.clone(), T0);
    // Kept: `first` (seq 1) takes k1. Wiped: `mid` (seq 2) and what follows.
    assert_eq!(send("k1").await.unwrap(), crate::Sent::Buffered(r));
    store
        .commit(lease, vec![Write::Step(waiting("first", 1))])
        .await
        .unwrap();
    assert!(take(waiting("first", 1)).await.unwrap().is_some());
    store
        .commit(
            lease,
            vec![Write::Step(step("mid", 1, 2, StepState::Succeeded))],
        )
        .await
        .unwrap();
    // `later` (seq 3) takes k2.
    assert_eq!(send("k2").await.unwrap(), crate::Sent::Buffered(r));
    store
        .commit(lease, vec![Write::Step(waiting("later", 3))])
        .await
        .unwrap();
    assert!(take(waiting("later", 3)).await.unwrap().is_some());
    // `dropped` (seq 4) takes k4's event, and its cancel puts it back, buffered; k3 is
    // buffered after it.
    store
        .commit(lease, vec![Write::Step(waiting("dropped", 4))])
        .await
        .unwrap();
    assert_eq!(send("k4").await.unwrap(), crate::Sent::Buffered(r));
    let taken = take(waiting("dropped", 4)).await.unwrap();
    assert_eq!(taken.map(|e| e.payload).as_deref(), Some("\"k4\""));
    store
        .commit(lease, vec![cancelled(waiting("dropped", 4))])
        .await
        .unwrap();
    assert_eq!(send("k3").await.unwrap(), crate::Sent::Buffered(r));
    restart_from(&*store, "mid").await;
    assert_eq!(
        send("k1").await.unwrap(),
        crate::Sent::Duplicate(r),
        "k1's event was taken by a step the restart kept"
    );
    for key in ["k2", "k3", "k4"] {
        assert_eq!(
            send(key).await.unwrap(),
            crate::Sent::Buffered(r),
            "{key}'s event was cleared by the restart"
        );
    }
}

/// A put-back event may take the id of an event taken before (SQLite puts it back one below
/// the smallest id there is): the take of the put-back event marks its own key, never the
/// key of the event that had that id, which a restart from a later step must keep.
pub async fn a_put_back_event_under_a_reused_id_marks_only_its_own_key(store: Arc<dyn Store>) {
    let r = create_one(&*store, "wf", "a").await;
    let id = InstanceId::new("a").unwrap();
    let event = |ty: &str, key: Option<&str>| crate::NewEvent {
        event_type: cairn_core::EventType::new(ty).unwrap(),
        payload: "1".into(),
        at: T0,
        idempotency_key: key.map(str::to_owned),
    };
    let send = |ty: &'static str, key: Option<&'static str>| {
        store.send_event(&wf("wf"), &id, event(ty, key))
    };
    // Three events in id order: x (k1), z (no key), y (k2).
    send("x", Some("k1")).await.unwrap();
    send("z", None).await.unwrap();
    send("y", Some("k2")).await.unwrap();
    let lease = store.claim("o", &[wf("wf")], T0, TTL, 1).await.unwrap()[0].lease;
    let ty = |t: &str| cairn_core::EventType::new(t).unwrap();
    // `w1` (seq 1) takes x; `w2` (seq 2) takes y and is cancelled: y goes back, under the
    // id x had on SQLite.
    store
        .commit(lease, vec![Write::Step(waiting("w1", 1))])
        .await
        .unwrap();
    assert!(
        store
            .take_event(lease, waiting("w1", 1).key, ty("x"), T0)
            .await
            .unwrap()
            .is_some()
    );
    store
        .commit(lease, vec![Write::Step(waiting("w2", 2))])
        .await
        .unwrap();
    assert!(
        store
            .take_event(lease, waiting("w2", 2).key, ty("y"), T0)
            .await
            .unwrap()
            .is_some()
    );
    store
        .commit(lease, vec![cancelled(waiting("w2", 2))])
        .await
        .unwrap();
    // `w3` (seq 4) takes y again, after a step at seq 3.
    store
        .commit(
            lease,
            vec![Write::Step(step("mid", 1, 3, StepState::Succeeded))],
        )
        .await
        .unwrap();
    store
        .commit(lease, vec![Write::Step(waiting("w3", 4))])
        .await
        .unwrap();
    assert!(
        store
            .take_event(lease, waiting("w3", 4).key, ty("y"), T0)
            .await
            .unwrap()
            .is_some()
    );
    restart_from(&*store, "mid").await;
    assert_eq!(
        send("x", Some("k1")).await.unwrap(),
        crate::Sent::Duplicate(r),
        "k1's event was taken by w1, which the restart kept"
    );
    assert_eq!(
        send("y", Some("k2")).await.unwrap(),
        crate::Sent::Buffered(r)
    );
}

/// A cancel applies only to a step still running: one whose outcome landed first keeps it.
pub async fn a_cancel_never_overwrites_an_outcome(store: Arc<dyn Store>) {
    let r = create_one(&*store, "wf", "a").await;
    let lease = store.claim("o", &[wf("wf")], T0, TTL, 1).await.unwrap()[0].lease;
    let cancel = |name: &str| {
        let mut step = step(name, 1, 1, StepState::Cancelled);
        step.error = Some(ErrorInfo::new("StepCancelled", "dropped"));
        Write::Cancel {
            step,
            records: vec![log(LogKind::StepFailure, Some(step_key(name)))],
        }
    };
    store
        .commit(
            lease,
            vec![
                Write::Step(step("done", 1, 1, StepState::Succeeded)),
                Write::Step(step("busy", 1, 2, StepState::Running)),
            ],
        )
        .await
        .unwrap();
    store
        .commit(lease, vec![cancel("done"), cancel("busy")])
        .await
        .unwrap();
    let journal = store.journal(r).await.unwrap();
    let state = |name: &str| journal.iter().find(|s| s.key.name == name).unwrap().state;
    assert_eq!(state("done"), StepState::Succeeded, "the outcome stands");
    assert_eq!(state("busy"), StepState::Cancelled);
    let failures = store
        .log(r, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|l| l.entry.kind == LogKind::StepFailure)
        .count();
    assert_eq!(failures, 1, "only the cancel that took effect is logged");
}

/// A wait's cancel that finds it finished by a take (the take landed while the workflow was
/// dropping the wait, so the workflow never saw the event) puts the event back ahead of
/// the events of its type sent after it, and the wait is cancelled; a take for a wait that
/// is no longer waiting takes nothing.
pub async fn a_cancelled_wait_puts_back_the_event_a_take_gave_it(store: Arc<dyn Store>) {
    let r = create_one(&*store, "wf", "a").await;
    let id = InstanceId::new("a").unwrap();
    let go = cairn_core::EventType::new("go").unwrap();
    for (payload, at) in [("1", T0), ("2", T0.saturating_add(Duration::from_secs(1)))] {
        let event = crate::NewEvent {
            event_type: go.clone(),
            payload: payload.into(),
            at,
            idempotency_key: None,
        };
        store.send_event(&wf("wf"), &id, event).await.unwrap();
    }
    let lease = store.claim("o", &[wf("wf")], T0, TTL, 1).await.unwrap()[0].lease;
    let wait = |n: u32| {
        let mut wait = step("w", n, n, StepState::Running);
        wait.key.kind = StepKind::WaitForEvent;
        wait
    };
    store
        .commit(lease, vec![Write::Step(wait(1))])
        .await
        .unwrap();
    let taken = store
        .take_event(lease, wait(1).key, go.clone(), T0)
        .await
        .unwrap();
    assert_eq!(taken.map(|e| e.payload).as_deref(), Some("1"));
    let mut cancelled = wait(1);
    cancelled.state = StepState::Cancelled;
    cancelled.error = Some(ErrorInfo::new("StepCancelled", "dropped"));
    let records = vec![LogEntry {
        kind: LogKind::WaitComplete,
        at: T0,
        step: Some(wait(1).key),
        meta: serde_json::json!({ "cancelled": true }),
    }];
    store
        .commit(
            lease,
            vec![Write::Cancel {
                step: cancelled,
                records,
            }],
        )
        .await
        .unwrap();
    let journal = store.journal(r).await.unwrap();
    assert_eq!(journal[0].state, StepState::Cancelled, "{journal:?}");
    assert_eq!(
        store
            .take_event(lease, wait(1).key, go.clone(), T0)
            .await
            .unwrap(),
        None,
        "a cancelled wait takes nothing"
    );
    let mut next = Vec::new();
    for n in 2..=3 {
        store
            .commit(lease, vec![Write::Step(wait(n))])
            .await
            .unwrap();
        let event = store
            .take_event(lease, wait(n).key, go.clone(), T0)
            .await
            .unwrap()
            .unwrap();
        next.push((event.payload, event.at));
    }
    assert_eq!(
        next,
        [
            ("1".to_owned(), T0),
            ("2".to_owned(), T0.saturating_add(Duration::from_secs(1)))
        ],
        "the event put back comes first, with the time it was sent"
    );
}

fn step_key(name: &str) -> StepKey {
    StepKey {
        kind: StepKind::Run,
        name: name.into(),
        count: 1,
    }
}

/// A fencing transition reports the lease epoch it fenced, so the engine aborts only the
/// lifetimes that predate it, never one claimed right after it.
pub async fn control_reports_the_epoch_it_fenced(store: Arc<dyn Store>) {
    create_one(&*store, "wf", "a").await;
    let id = InstanceId::new("a").unwrap();
    let first = store.claim("o", &[wf("wf")], T0, TTL, 1).await.unwrap()[0].lease;
    let outcome = store
        .control(
            &wf("wf"),
            &id,
            ControlRequest::Restart {
                at: T0,
                from: None,
                adopt: None,
            },
        )
        .await
        .unwrap();
    let ControlOutcome::Done { epoch, .. } = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(epoch, first.epoch);
    let second = store.claim("o", &[wf("wf")], T0, TTL, 1).await.unwrap()[0].lease;
    assert!(second.epoch > epoch, "a lifetime claimed after it is newer");
}

/// A `STEP_START` committed with its step's row but without a `config` of its own (as the
/// engine commits a step's start) reads back with the step's configuration, as if it had
/// carried it; one whose step is not in its commit reads back without any.
pub async fn a_step_start_reads_back_with_its_steps_configuration(store: Arc<dyn Store>) {
    create_one(&*store, "wf", "a").await;
    let lease = claim_one(&*store, "wf").await.lease;
    let start = |name: &str| LogEntry {
        kind: LogKind::StepStart,
        at: T0,
        step: Some(step(name, 1, 1, StepState::Running).key),
        meta: serde_json::json!({"hasRollback": false}),
    };
    let mut other = step("other", 1, 2, StepState::Running);
    other.config = serde_json::json!({"timeout": "1 minute"}).into();
    store
        .commit(
            lease,
            vec![
                Write::Log(start("s")),
                Write::Log(log(LogKind::AttemptStart, start("s").step)),
                Write::Step(other),
                Write::Step(step("s", 1, 1, StepState::Running)),
            ],
        )
        .await
        .unwrap();
    store
        .commit(lease, vec![Write::Log(start("alone"))])
        .await
        .unwrap();
    let logs = store.log(lease.instance, 0, 100).await.unwrap();
    let starts: Vec<_> = logs
        .iter()
        .filter(|r| r.entry.kind == LogKind::StepStart)
        .map(|r| r.entry.clone())
        .collect();
    assert_eq!(starts.len(), 2, "{logs:#?}");
    assert_eq!(
        starts[0].meta,
        serde_json::json!({"config": {"retries": {"limit": 5}}, "hasRollback": false}),
        "its own step's configuration, not the other step's"
    );
    assert_eq!(starts[0].step, start("s").step);
    assert_eq!(
        starts[1].meta,
        serde_json::json!({"hasRollback": false}),
        "no step in its commit: none"
    );
}

/// Records come back exactly as committed (kind, time, step, every `meta` field, the step's
/// configuration included), in commit order, with distinct increasing ids, and paging at
/// any page size, by instance or by workflow, returns each exactly once: however a backend
/// packs records into rows.
pub async fn records_read_back_exactly_at_every_page_size(store: Arc<dyn Store>) {
    let a = create_one(&*store, "wf", "a").await;
    let b = create_one(&*store, "wf", "b").await;
    let leases = store.claim("o", &[wf("wf")], T0, TTL, 2).await.unwrap();
    let key = |name: &str| StepKey {
        kind: StepKind::Run,
        name: name.into(),
        count: 1,
    };
    let at = |ms: i64| Timestamp::from_millis(T0.as_millis() + ms);
    let entry = |kind, ms, step: Option<StepKey>, meta| LogEntry {
        kind,
        at: at(ms),
        step,
        meta,
    };
    let config = serde_json::json!({"retries": {"limit": 2, "delay": 250}, "timeout": "1 minute"});
    for (n, lease) in leases.iter().enumerate() {
        let s = key(&format!("step {n}"));
        let t = key("other");
        let batches = vec![
            vec![
                entry(LogKind::WorkflowStart, 1, None, serde_json::json!({})),
                entry(
                    LogKind::StepStart,
                    2,
                    Some(s.clone()),
                    serde_json::json!({"config": config, "hasRollback": true}),
                ),
                entry(
                    LogKind::AttemptStart,
                    2,
                    Some(s.clone()),
                    serde_json::json!({"attempt": 1}),
                ),
            ],
            vec![
                // Same step, different times; then two steps at one time.
                entry(
                    LogKind::AttemptFailure,
                    3,
                    Some(s.clone()),
                    serde_json::json!({"attempt": 1, "retryDelayMs": 250}),
                ),
                entry(
                    LogKind::AttemptStart,
                    4,
                    Some(s.clone()),
                    serde_json::json!({"attempt": 2}),
                ),
                entry(
                    LogKind::AttemptSuccess,
                    5,
                    Some(s.clone()),
                    serde_json::json!({"attempt": 2}),
                ),
                entry(
                    LogKind::StepSuccess,
                    5,
                    Some(t.clone()),
                    serde_json::json!({"result": [1, 2]}),
                ),
            ],
            vec![
                entry(
                    LogKind::StepStart,
                    6,
                    Some(t.clone()),
                    serde_json::json!({"config": {}, "hasRollback": false}),
                ),
                entry(
                    LogKind::AttemptStart,
                    6,
                    Some(t.clone()),
                    serde_json::json!({"attempt": 1}),
                ),
                entry(
                    LogKind::AttemptSuccess,
                    7,
                    Some(t.clone()),
                    serde_json::json!({"attempt": 1}),
                ),
                entry(
                    LogKind::StepSuccess,
                    7,
                    Some(t.clone()),
                    serde_json::json!({"result": {"a": "b"}}),
                ),
                entry(
                    LogKind::WorkflowSuccess,
                    7,
                    None,
                    serde_json::json!({"result": null}),
                ),
            ],
        ];
        for batch in batches {
            let writes = batch.into_iter().map(Write::Log).collect();
            store.commit(lease.lease, writes).await.unwrap();
        }
    }
    let full_a = store.log(a, 0, 1000).await.unwrap();
    let full_b = store.log(b, 0, 1000).await.unwrap();
    assert_eq!(full_a.len(), 13, "{full_a:#?}");
    assert_eq!(full_b.len(), 13);
    assert!(full_a.windows(2).all(|w| w[0].id < w[1].id));
    assert_eq!(full_a[0].entry.kind, LogKind::WorkflowQueued);
    assert_eq!(
        full_a[2].entry.meta,
        serde_json::json!({"config": config, "hasRollback": true}),
        "a STEP_START keeps its configuration"
    );
    assert_eq!(full_a[2].entry.step, Some(key("step 0")));
    assert_eq!(full_a[3].entry.kind, LogKind::AttemptStart);
    assert_eq!(full_a[3].entry.at, at(2));
    assert_eq!(
        full_a[4].entry.meta,
        serde_json::json!({"attempt": 1, "retryDelayMs": 250})
    );
    assert_eq!(full_a[7].entry.step, Some(key("other")));
    assert_eq!(full_a[7].entry.meta, serde_json::json!({"result": [1, 2]}));
    assert_eq!(
        full_a[8].entry.meta,
        serde_json::json!({"config": {}, "hasRollback": false})
    );
    assert_eq!(full_a[12].entry.kind, LogKind::WorkflowSuccess);
    for limit in 1..=14 {
        let mut paged = Vec::new();
        let mut after = 0;
        loop {
            let page = store.log(a, after, limit).await.unwrap();
            assert!(page.len() <= limit);
            let Some(last) = page.last() else { break };
            after = last.id;
            paged.extend(page);
        }
        assert_eq!(paged, full_a, "instance log paged by {limit}");
        let mut paged = Vec::new();
        let mut after = 0;
        for _ in 0..1000 {
            let page = store.workflow_log(&wf("wf"), after, limit).await.unwrap();
            assert!(page.records.len() <= limit);
            assert!(page.scanned_to >= after);
            if page.scanned_to == after && page.records.is_empty() {
                break;
            }
            after = page.scanned_to;
            paged.extend(page.records);
        }
        let mut both: Vec<_> = full_a
            .iter()
            .map(|r| ("a", r.clone()))
            .chain(full_b.iter().map(|r| ("b", r.clone())))
            .collect();
        both.sort_by_key(|(_, r)| r.id);
        let paged: Vec<_> = paged
            .into_iter()
            .map(|(id, r)| (if id.as_str() == "a" { "a" } else { "b" }, r))
            .collect();
        assert_eq!(paged, both, "workflow log paged by {limit}");
    }
}

/// An engine shutting down gives its leases up: its instances are claimable at once by
/// another owner, a pause it was to complete takes effect (logged), and other owners'
/// leases stay.
pub async fn release_all_frees_only_the_owners_instances(store: Arc<dyn Store>) {
    for id in ["a", "b", "c"] {
        create_one(&*store, "wf", id).await;
    }
    let mine = store.claim("me", &[wf("wf")], T0, TTL, 2).await.unwrap();
    let theirs = store.claim("them", &[wf("wf")], T0, TTL, 1).await.unwrap();
    assert_eq!((mine.len(), theirs.len()), (2, 1));
    let pausing = &mine[1].record;
    let outcome = store
        .control(
            &pausing.workflow,
            &pausing.id,
            ControlRequest::Pause { at: T0 },
        )
        .await
        .unwrap();
    assert!(
        matches!(
            outcome,
            ControlOutcome::Done {
                to: InstanceStatus::WaitingForPause,
                ..
            }
        ),
        "{outcome:?}"
    );
    store.release_all("me").await.unwrap();
    let again = store
        .claim("other", &[wf("wf")], T0, TTL, 10)
        .await
        .unwrap();
    let ids: Vec<&str> = again.iter().map(|c| c.record.id.as_str()).collect();
    assert_eq!(
        ids,
        [mine[0].record.id.as_str()],
        "only the running one, at once"
    );
    let paused = store
        .instance(&pausing.workflow, &pausing.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(paused.status, InstanceStatus::Paused);
    let kinds: Vec<LogKind> = store
        .log(pausing.instance, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.entry.kind)
        .collect();
    assert_eq!(kinds.last(), Some(&LogKind::WorkflowPaused));
    store
        .commit(
            theirs[0].lease,
            vec![Write::Log(log(LogKind::WorkflowStart, None))],
        )
        .await
        .expect("another owner's lease stays");
}

/// A renewal names the instances its engine runs: a lease held by none of them (a claim
/// whose answer was lost) is not renewed, runs out, and is claimed again.
pub async fn renew_keeps_only_the_instances_named(store: Arc<dyn Store>) {
    create_one(&*store, "wf", "a").await;
    create_one(&*store, "wf", "b").await;
    let claimed = store
        .claim("owner-1", &[wf("wf")], T0, TTL, 2)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    let running = claimed[0].lease;
    let orphan = claimed[1].lease.instance;
    let kept = store
        .renew("owner-1", vec![running], T0, T0.saturating_add(TTL * 10))
        .await
        .unwrap();
    assert_eq!(kept, [running]);
    let later = T0.saturating_add(TTL * 2);
    let taken = store
        .claim("owner-2", &[wf("wf")], later, TTL, 10)
        .await
        .unwrap();
    let taken: Vec<_> = taken.iter().map(|c| c.lease.instance).collect();
    assert_eq!(taken, [orphan], "only the orphan ran out");
}

/// A renewal names each lease at its epoch: one that lands after the lease moved on (the
/// owner reclaimed it after stopping the lifetime the renewal was sent for) extends
/// nothing, so a renewal abandoned by its engine never keeps a lease it gave up.
pub async fn a_renewal_at_an_epoch_that_moved_on_extends_nothing(store: Arc<dyn Store>) {
    create_one(&*store, "wf", "a").await;
    let old = store
        .claim("owner-1", &[wf("wf")], T0, TTL, 1)
        .await
        .unwrap()[0]
        .lease;
    let new = store.reclaim("owner-1", old, T0, TTL).await.unwrap();
    let stale = store
        .renew("owner-1", vec![old], T0, T0.saturating_add(TTL * 100))
        .await
        .unwrap();
    assert!(
        stale.is_empty(),
        "a moved-on epoch is not renewed: {stale:?}"
    );
    // The reclaimed lease was not extended by it: it runs out at T0 + TTL.
    let later = T0.saturating_add(TTL * 2);
    let taken = store
        .claim("owner-2", &[wf("wf")], later, TTL, 1)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1, "the lease ran out when it was due");
    assert!(taken[0].lease.epoch > new.epoch);
}

/// A reclaim moves the owner's lease to a new epoch: writes under the old epoch are fenced
/// off, writes under the new one land; another owner or a stale epoch cannot reclaim.
pub async fn reclaim_moves_the_epoch_and_fences_the_old_one(store: Arc<dyn Store>) {
    create_one(&*store, "wf", "a").await;
    let old = store
        .claim("owner-1", &[wf("wf")], T0, TTL, 1)
        .await
        .unwrap()[0]
        .lease;
    assert_eq!(
        store.reclaim("owner-2", old, T0, TTL).await.unwrap_err(),
        Error::LeaseLost(old.instance),
        "not another owner's"
    );
    let new = store.reclaim("owner-1", old, T0, TTL).await.unwrap();
    assert!(new.epoch > old.epoch);
    assert_eq!(
        store.reclaim("owner-1", old, T0, TTL).await.unwrap_err(),
        Error::LeaseLost(old.instance),
        "not from a stale epoch"
    );
    let write = || vec![Write::Log(log(LogKind::WorkflowStart, None))];
    assert_eq!(
        store.commit(old, write()).await.unwrap_err(),
        Error::LeaseLost(old.instance)
    );
    store
        .commit(new, write())
        .await
        .expect("the new epoch writes");
    // Extended: still held past the first TTL.
    let later = T0.saturating_add(TTL / 2);
    let renewed_to = store.reclaim("owner-1", new, later, TTL).await.unwrap();
    let past_first = T0.saturating_add(TTL + TTL / 4);
    assert!(
        store
            .claim("owner-2", &[wf("wf")], past_first, TTL, 1)
            .await
            .unwrap()
            .is_empty(),
        "the reclaim extended the lease"
    );
    let _ = renewed_to;
}

/// A parent that creates a child in a commit and hibernates waiting for it: `(parent's
/// lease as claimed, child's reference)`, with the parent hibernated and the child claimable.
async fn parent_waiting_for_a_child(store: &dyn Store) -> (crate::Lease, crate::InstanceRef) {
    create_one(store, "parent", "p").await;
    let parent = claim_one(store, "parent").await;
    let key = StepKey {
        kind: StepKind::Invoke,
        name: "child".into(),
        count: 1,
    };
    let mut child = new_instance("child", "p-child-1");
    child.parent = Some(ParentLink {
        instance: parent.lease.instance,
        workflow: wf("parent"),
        id: InstanceId::new("p").unwrap(),
        step: key,
        detached: false,
        run: Some(parent.lease.epoch),
    });
    // The parent runs (an instance that never started stays queued when it hibernates)
    // and creates its child.
    store
        .commit(
            parent.lease,
            vec![
                Write::Status(StatusChange {
                    started_at: Some(T0),
                    ..StatusChange::to(InstanceStatus::Running)
                }),
                Write::Create(Box::new(child.clone())),
            ],
        )
        .await
        .unwrap();
    // Creating it again (a replay) writes nothing.
    store
        .commit(parent.lease, vec![Write::Create(Box::new(child))])
        .await
        .unwrap();
    let found = store
        .instance(&wf("child"), &InstanceId::new("p-child-1").unwrap())
        .await
        .unwrap()
        .expect("the child was created with the commit");
    let link = found.parent.clone().expect("the child knows its parent");
    assert_eq!(link.instance, parent.lease.instance);
    assert_eq!((link.step.kind, link.step.count), (StepKind::Invoke, 1));
    assert_eq!(store.log(found.instance, 0, 10).await.unwrap().len(), 1);
    let children = store.children(parent.lease.instance).await.unwrap();
    assert_eq!(children.len(), 1);
    assert_eq!(children[0].instance, found.instance);
    assert!(store.children(found.instance).await.unwrap().is_empty());
    let far = T0.saturating_add(Duration::from_secs(86_400));
    store
        .commit(
            parent.lease,
            vec![Write::Hibernate {
                wake_at: far,
                event_types: Vec::new(),
                children: vec![found.instance],
            }],
        )
        .await
        .unwrap();
    (parent.lease, found.instance)
}

/// A parent's new run takes a child over (`Adopt`) only under the parent's lease as it is
/// now, recording its run in the link; an operator's restart leaves the link alone while
/// the parent runs, and detaches the child once the parent has ended. Decided from the
/// stored rows, never from times.
pub async fn a_child_is_adopted_under_its_parents_lease_and_detached_once_it_has_ended(
    store: Arc<dyn Store>,
) {
    let (parent, child) = parent_waiting_for_a_child(&*store).await;
    let child_id = InstanceId::new("p-child-1").unwrap();
    let link = || async {
        store
            .instance(&wf("child"), &child_id)
            .await
            .unwrap()
            .unwrap()
            .parent
            .unwrap()
    };
    let restart = |adopt: Option<crate::Adopt>| {
        let store = Arc::clone(&store);
        let id = child_id.clone();
        async move {
            store
                .control(
                    &wf("child"),
                    &id,
                    ControlRequest::Restart {
                        at: T0,
                        from: None,
                        adopt,
                    },
                )
                .await
        }
    };
    let stale = crate::Lease {
        instance: parent.instance,
        epoch: parent.epoch + 7,
    };
    assert_eq!(
        restart(Some(crate::Adopt {
            parent: stale,
            run: 99,
            detached: false
        }))
        .await
        .unwrap_err(),
        Error::LeaseLost(parent.instance),
        "not under a lease that is not the parent's now"
    );
    assert_eq!(
        link().await.run,
        Some(parent.epoch),
        "a refusal changes nothing"
    );
    assert_eq!(
        restart(Some(crate::Adopt {
            parent: crate::Lease {
                instance: child,
                epoch: parent.epoch
            },
            run: 99,
            detached: false
        }))
        .await
        .unwrap_err(),
        Error::LeaseLost(child),
        "not by another instance's lease"
    );
    restart(Some(crate::Adopt {
        parent,
        run: 99,
        detached: false,
    }))
    .await
    .unwrap();
    let adopted = link().await;
    assert_eq!((adopted.run, adopted.detached), (Some(99), false));
    restart(None).await.unwrap();
    assert_eq!(link().await, adopted, "the parent runs on: the link stays");
    store
        .control(
            &wf("parent"),
            &InstanceId::new("p").unwrap(),
            ControlRequest::Terminate {
                at: T0,
                rollback: None,
            },
        )
        .await
        .unwrap();
    // A restart the store refuses (from a step the journal does not have) changes
    // nothing, the link included: detached, the child would escape its parent's end.
    let refused = store
        .control(
            &wf("child"),
            &child_id,
            ControlRequest::Restart {
                at: T0,
                from: Some(StepKey {
                    kind: StepKind::Run,
                    name: "no such step".into(),
                    count: 1,
                }),
                adopt: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(refused, ControlOutcome::StepNotFound);
    assert_eq!(
        link().await,
        adopted,
        "a refused restart left the child detached"
    );
    restart(None).await.unwrap();
    let freed = link().await;
    assert!(
        freed.detached,
        "restarted after its parent ended: it runs on"
    );
    assert_eq!(freed.run, Some(99));
}

pub async fn a_childs_end_wakes_its_hibernated_parent(store: Arc<dyn Store>) {
    let (parent, child) = parent_waiting_for_a_child(&*store).await;
    let claimed = claim_one(&*store, "child").await;
    assert_eq!(claimed.lease.instance, child);
    assert!(
        store
            .claim("o", &[wf("parent")], T0, TTL, 1)
            .await
            .unwrap()
            .is_empty(),
        "the parent sleeps while its child runs"
    );
    store
        .commit(
            claimed.lease,
            vec![Write::Status(StatusChange {
                ended_at: Some(T0),
                output: Some("7".into()),
                release: true,
                ..StatusChange::to(InstanceStatus::Complete)
            })],
        )
        .await
        .unwrap();
    let woken = store.claim("o", &[wf("parent")], T0, TTL, 1).await.unwrap();
    assert_eq!(woken.len(), 1, "the child's end made its parent claimable");
    assert_eq!(woken[0].lease.instance, parent.instance);
}

pub async fn a_parent_hibernating_after_its_child_ended_stays_claimable(store: Arc<dyn Store>) {
    create_one(&*store, "parent", "p").await;
    let parent = claim_one(&*store, "parent").await;
    let child = create_one(&*store, "child", "c").await;
    let claimed = claim_one(&*store, "child").await;
    store
        .commit(
            claimed.lease,
            vec![Write::Status(StatusChange {
                ended_at: Some(T0),
                release: true,
                ..StatusChange::to(InstanceStatus::Errored)
            })],
        )
        .await
        .unwrap();
    store
        .commit(
            parent.lease,
            vec![Write::Hibernate {
                wake_at: T0.saturating_add(Duration::from_secs(86_400)),
                event_types: Vec::new(),
                children: vec![child],
            }],
        )
        .await
        .unwrap();
    let woken = store.claim("o", &[wf("parent")], T0, TTL, 1).await.unwrap();
    assert_eq!(woken.len(), 1, "an ended child keeps its parent claimable");
}

pub async fn terminating_or_deleting_a_child_wakes_its_parent(store: Arc<dyn Store>) {
    for request in [
        ControlRequest::Terminate {
            at: T0,
            rollback: None,
        },
        ControlRequest::Delete,
    ] {
        let (parent, _child) = parent_waiting_for_a_child(&*store).await;
        let outcome = store
            .control(
                &wf("child"),
                &InstanceId::new("p-child-1").unwrap(),
                request.clone(),
            )
            .await
            .unwrap();
        assert!(
            matches!(outcome, ControlOutcome::Done { .. }),
            "{outcome:?}"
        );
        let woken = store.claim("o", &[wf("parent")], T0, TTL, 1).await.unwrap();
        assert_eq!(woken.len(), 1, "{request:?} wakes the parent");
        assert_eq!(woken[0].lease.instance, parent.instance);
        // Make room for the next round.
        for (w, id) in [("parent", "p"), ("child", "p-child-1")] {
            store
                .control(
                    &wf(w),
                    &InstanceId::new(id).unwrap(),
                    ControlRequest::Delete,
                )
                .await
                .unwrap();
        }
    }
}

/// Issue 30 §2: a tick fires once, recorded with its instance in one transaction; a later
/// or equal tick is refused as fired (with what fired), a stale generation changes
/// nothing, a schedule created again under its name starts afresh as the next generation,
/// a paused one fires nothing until resumed, and a tick whose id is taken counts as fired
/// without creating anything.
pub async fn ticks_fire_once_as_stored_state_per_generation(store: Arc<dyn Store>) {
    let at = |minutes: u64| T0.saturating_add(Duration::from_secs(60 * minutes));
    let tick = |generation: u64, minutes: u64, declared: bool| {
        let id = format!("s-{minutes}");
        crate::ScheduleTick {
            schedule: "s".into(),
            generation,
            tick: at(minutes),
            declared,
            instance: new_instance("wf", &id),
            passed_over: false,
            ahead_after: at(minutes + 5),
        }
    };
    // Declared in code: its row is made at its first tick.
    let fired = store.fire_tick(tick(1, 1, true)).await.unwrap();
    assert!(matches!(fired, crate::TickFired::Fired(_)), "{fired:?}");
    assert_eq!(
        store.fire_tick(tick(1, 1, true)).await.unwrap(),
        crate::TickFired::AlreadyFired {
            last_tick: at(1),
            last_run: Some("s-1".into())
        },
        "once"
    );
    assert!(matches!(
        store.fire_tick(tick(1, 0, true)).await.unwrap(),
        crate::TickFired::AlreadyFired { .. }
    ));
    assert_eq!(
        store.fire_tick(tick(2, 2, true)).await.unwrap(),
        crate::TickFired::Stale
    );
    let row = store.schedules().await.unwrap().remove(0);
    assert_eq!(
        (row.generation, row.last_tick, row.last_run.as_deref()),
        (1, Some(at(1)), Some("s-1"))
    );
    // Deleting the tick's instance changes nothing about what fired.
    let s1 = InstanceId::new("s-1").unwrap();
    store
        .control(&wf("wf"), &s1, ControlRequest::Delete)
        .await
        .unwrap();
    assert!(matches!(
        store.fire_tick(tick(1, 1, true)).await.unwrap(),
        crate::TickFired::AlreadyFired { .. }
    ));
    // An id taken by another instance: the tick counts, nothing is created.
    store.create(vec![new_instance("wf", "s-3")]).await.unwrap();
    assert_eq!(
        store.fire_tick(tick(1, 3, true)).await.unwrap(),
        crate::TickFired::Taken
    );
    assert_eq!(store.schedules().await.unwrap()[0].last_tick, Some(at(3)));
    // Passed over by the overlap policy: recorded as the last tick, nothing created, the
    // last run (the one the policy looks at) kept; once.
    let over = crate::ScheduleTick {
        passed_over: true,
        ..tick(1, 4, true)
    };
    assert_eq!(
        store.fire_tick(over.clone()).await.unwrap(),
        crate::TickFired::PassedOver
    );
    assert!(matches!(
        store.fire_tick(over).await.unwrap(),
        crate::TickFired::AlreadyFired { .. }
    ));
    let row = store.schedules().await.unwrap().remove(0);
    assert_eq!(
        (row.last_tick, row.last_run.as_deref()),
        (Some(at(4)), Some("s-1"))
    );
    assert!(
        store
            .instance(&wf("wf"), &InstanceId::new("s-4").unwrap())
            .await
            .unwrap()
            .is_none(),
        "nothing created"
    );

    // A last tick past the firing engine's now and its margin was stored by a clock ahead:
    // it holds back no tick up to that now, and the tick fired takes its place.
    let ahead = store.fire_tick(tick(1, 60, true)).await.unwrap();
    assert!(matches!(ahead, crate::TickFired::Fired(_)), "{ahead:?}");
    let on_time = |minutes: u64| crate::ScheduleTick {
        ahead_after: at(11),
        ..tick(1, minutes, true)
    };
    let fired = store.fire_tick(on_time(5)).await.unwrap();
    assert!(matches!(fired, crate::TickFired::Fired(_)), "{fired:?}");
    assert_eq!(store.schedules().await.unwrap()[0].last_tick, Some(at(5)));
    assert!(matches!(
        store.fire_tick(on_time(5)).await.unwrap(),
        crate::TickFired::AlreadyFired { .. }
    ));

    // A stored schedule, deleted and created again: a new generation, fresh state.
    let stored = crate::StoredSchedule {
        name: "api".into(),
        definition: Some("{}".into()),
        paused: false,
        resumed_at: None,
        updated_at: T0,
        generation: 0,
        last_tick: None,
        last_run: None,
        legacy: false,
    };
    assert!(store.create_schedule(stored.clone()).await.unwrap());
    let api = |generation: u64, minutes: u64| crate::ScheduleTick {
        schedule: "api".into(),
        generation,
        tick: at(minutes),
        declared: false,
        instance: new_instance("wf", &format!("api-{generation}-{minutes}")),
        passed_over: false,
        ahead_after: at(minutes + 5),
    };
    assert!(matches!(
        store.fire_tick(api(1, 5)).await.unwrap(),
        crate::TickFired::Fired(_)
    ));
    assert!(store.delete_schedule("api", false).await.unwrap());
    assert_eq!(
        store.fire_tick(api(1, 6)).await.unwrap(),
        crate::TickFired::Stale,
        "deleted"
    );
    assert!(store.create_schedule(stored).await.unwrap());
    let again = store
        .schedules()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.name == "api")
        .unwrap();
    assert_eq!((again.generation, again.last_tick), (2, None));
    assert_eq!(
        store.fire_tick(api(1, 7)).await.unwrap(),
        crate::TickFired::Stale,
        "the old generation's runner"
    );
    assert!(matches!(
        store.fire_tick(api(2, 5)).await.unwrap(),
        crate::TickFired::Fired(_)
    ));
    // Paused (on another engine, whose runner has not heard yet): no tick fires until it
    // is resumed.
    let state = |paused: bool| crate::ScheduleState {
        paused,
        resumed_at: (!paused).then_some(at(9)),
        at: at(8),
        declared: false,
        only_if_not_live: false,
    };
    assert!(store.set_schedule_state("api", state(true)).await.unwrap());
    assert_eq!(
        store.fire_tick(api(2, 8)).await.unwrap(),
        crate::TickFired::Stale,
        "paused"
    );
    assert!(
        store
            .instance(&wf("wf"), &InstanceId::new("api-2-8").unwrap())
            .await
            .unwrap()
            .is_none(),
        "nothing created while paused"
    );
    assert!(store.set_schedule_state("api", state(false)).await.unwrap());
    assert!(matches!(
        store.fire_tick(api(2, 9)).await.unwrap(),
        crate::TickFired::Fired(_)
    ));
    // Not declared and never stored: nothing is made up.
    let mut ghost = api(1, 1);
    ghost.schedule = "ghost".into();
    assert_eq!(
        store.fire_tick(ghost).await.unwrap(),
        crate::TickFired::Stale
    );
}

pub async fn schedules_are_created_once_replaced_and_deleted(store: Arc<dyn Store>) {
    let row = |name: &str, definition: Option<&str>, paused: bool| crate::StoredSchedule {
        name: name.into(),
        definition: definition.map(str::to_owned),
        paused,
        resumed_at: None,
        updated_at: T0,
        generation: 1,
        last_tick: None,
        last_run: None,
        legacy: false,
    };
    let state =
        |paused: bool, resumed_at: Option<Timestamp>, declared: bool| crate::ScheduleState {
            paused,
            resumed_at,
            at: T0,
            declared,
            only_if_not_live: false,
        };
    assert!(store.schedules().await.unwrap().is_empty());
    assert!(
        store
            .create_schedule(row("b", Some("{}"), false))
            .await
            .unwrap()
    );
    assert!(
        !store
            .create_schedule(row("b", Some("[1]"), true))
            .await
            .unwrap(),
        "a name is created once"
    );
    // The state of a schedule in code: a row of its own, created on demand.
    assert!(
        store
            .set_schedule_state("a", state(true, None, true))
            .await
            .unwrap()
    );
    assert_eq!(
        store.schedules().await.unwrap(),
        [row("a", None, true), row("b", Some("{}"), false)]
    );
    // A state change leaves the definition alone, and never makes a stored schedule up.
    let resumed = T0.saturating_add(Duration::from_secs(5));
    assert!(
        store
            .set_schedule_state("b", state(true, None, false))
            .await
            .unwrap()
    );
    assert!(
        store
            .set_schedule_state("b", state(false, Some(resumed), false))
            .await
            .unwrap()
    );
    assert!(
        store
            .set_schedule_state("b", state(true, None, false))
            .await
            .unwrap()
    );
    let b = store.schedules().await.unwrap().remove(1);
    assert_eq!(
        (b.definition.as_deref(), b.paused, b.resumed_at),
        (Some("{}"), true, Some(resumed))
    );
    assert!(
        !store
            .set_schedule_state("gone", state(true, None, false))
            .await
            .unwrap()
    );
    assert!(store.delete_schedule("b", false).await.unwrap());
    assert!(!store.delete_schedule("b", false).await.unwrap());
    assert!(
        !store
            .set_schedule_state("b", state(false, Some(resumed), false))
            .await
            .unwrap(),
        "a deleted schedule is not brought back"
    );
    assert_eq!(store.schedules().await.unwrap(), [row("a", None, true)]);
    // A schedule declared in code keeps its state row.
    assert!(!store.delete_schedule("a", false).await.unwrap());
    assert_eq!(store.schedules().await.unwrap(), [row("a", None, true)]);
    // A schedule in code taking its name's row as an engine starts it: a live row (here
    // paused) is left as it is, a deleted one comes back as a new schedule (the next
    // generation, nothing fired), a missing one is made (its last tick inferred once).
    let adopt = |name: &'static str| {
        let store = Arc::clone(&store);
        async move {
            let state = crate::ScheduleState {
                only_if_not_live: true,
                ..state(false, None, true)
            };
            store.set_schedule_state(name, state).await.unwrap()
        }
    };
    assert!(!adopt("a").await, "a live row is left alone");
    assert!(adopt("b").await);
    assert!(adopt("c").await);
    let rows = store.schedules().await.unwrap();
    assert_eq!(
        rows,
        [
            row("a", None, true),
            crate::StoredSchedule {
                generation: 2,
                ..row("b", None, false)
            },
            crate::StoredSchedule {
                legacy: true,
                ..row("c", None, false)
            },
        ]
    );
    // Unless the delete says no engine declares it any more.
    assert!(store.delete_schedule("a", true).await.unwrap());
    assert_eq!(store.schedules().await.unwrap().len(), 2);
}

pub async fn a_second_terminate_with_rollback_is_a_no_op(store: Arc<dyn Store>) {
    create_one(&*store, "wf", "a").await;
    let id = InstanceId::new("a").unwrap();
    let request = ControlRequest::Terminate {
        at: T0,
        rollback: Some(cairn_core::RollbackTrigger::terminate()),
    };
    let first = store
        .control(&wf("wf"), &id, request.clone())
        .await
        .unwrap();
    assert!(matches!(first, ControlOutcome::Done { .. }), "{first:?}");
    let claimed = claim_one(&*store, "wf").await;
    let second = store.control(&wf("wf"), &id, request).await.unwrap();
    assert!(matches!(second, ControlOutcome::NoOp(_)), "{second:?}");
    // The rollback under way is not fenced off.
    store.commit(claimed.lease, vec![]).await.unwrap();
}

pub async fn a_key_runs_its_limit_at_once_and_frees_slots_by_priority(store: Arc<dyn Store>) {
    const HOUR: Duration = Duration::from_secs(3600);
    let keyed = |id: &str, priority: i32| {
        let mut new = new_instance("wf", id);
        new.priority = priority;
        new.concurrency = Some(crate::Concurrency {
            key: "k".into(),
            limit: 1,
            rate: None,
            hold_while_waiting: false,
        });
        new
    };
    store
        .create(vec![keyed("a", 0), keyed("b", 0), keyed("c", 5)])
        .await
        .unwrap();
    let claimed = store.claim("o", &[wf("wf")], T0, HOUR, 10).await.unwrap();
    assert_eq!(claimed.len(), 1, "one slot: {claimed:?}");
    assert_eq!(claimed[0].record.id.as_str(), "a", "the oldest first");
    let b = store
        .instance(&wf("wf"), &InstanceId::new("b").unwrap())
        .await
        .unwrap()
        .unwrap();
    let c = store
        .instance(&wf("wf"), &InstanceId::new("c").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(b.waiting_for_slot && c.waiting_for_slot);
    assert_eq!(
        store.slot_position(c.instance).await.unwrap(),
        Some(1),
        "priority first"
    );
    assert_eq!(store.slot_position(b.instance).await.unwrap(), Some(2));
    assert!(
        store
            .claim("o", &[wf("wf")], T0, HOUR, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // The holder hibernates: its slot goes to the highest priority waiting.
    store
        .commit(
            claimed[0].lease,
            vec![Write::Hibernate {
                wake_at: T0.saturating_add(Duration::from_secs(60)),
                event_types: Vec::new(),
                children: Vec::new(),
            }],
        )
        .await
        .unwrap();
    let next = store.claim("o", &[wf("wf")], T0, HOUR, 10).await.unwrap();
    assert_eq!(next.len(), 1, "{next:?}");
    assert_eq!(next[0].record.id.as_str(), "c");
    // Woken, the first waits for a slot again; the end of `c` gives the slot to the best
    // waiting: `a` and `b` have the same priority, and `a` is the older.
    let later = T0.saturating_add(Duration::from_secs(61));
    let none = store
        .claim("o", &[wf("wf")], later, HOUR, 10)
        .await
        .unwrap();
    assert!(none.is_empty(), "{none:?}");
    store
        .commit(
            next[0].lease,
            vec![Write::Status(StatusChange {
                ended_at: Some(later),
                release: true,
                ..StatusChange::to(InstanceStatus::Complete)
            })],
        )
        .await
        .unwrap();
    let third = store
        .claim("o", &[wf("wf")], later, HOUR, 10)
        .await
        .unwrap();
    assert_eq!(third.len(), 1, "{third:?}");
    assert_eq!(
        third[0].record.id.as_str(),
        "a",
        "a was parked before b (same priority, older)"
    );
}

pub async fn a_slot_is_never_lost_to_an_instance_that_leaves_before_its_claim(
    store: Arc<dyn Store>,
) {
    const HOUR: Duration = Duration::from_secs(3600);
    let keyed = |id: &str| {
        let mut new = new_instance("wf", id);
        new.concurrency = Some(crate::Concurrency {
            key: "k".into(),
            limit: 1,
            rate: None,
            hold_while_waiting: false,
        });
        new
    };
    store
        .create(vec![keyed("a"), keyed("b"), keyed("c")])
        .await
        .unwrap();
    let a = store.claim("o", &[wf("wf")], T0, HOUR, 10).await.unwrap();
    assert_eq!(a.len(), 1);
    // A pause of the holder that its engine never completed: recovery completes it, and
    // gives the slot back.
    let pause = ControlRequest::Pause { at: T0 };
    store
        .control(&wf("wf"), &InstanceId::new("a").unwrap(), pause)
        .await
        .unwrap();
    store.release_all("o").await.unwrap();
    let a_now = store
        .instance(&wf("wf"), &InstanceId::new("a").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a_now.status, InstanceStatus::Paused);
    // `b` was made claimable by the freed slot; it is deleted before any claim.
    store
        .control(
            &wf("wf"),
            &InstanceId::new("b").unwrap(),
            ControlRequest::Delete,
        )
        .await
        .unwrap();
    let c = store.claim("o", &[wf("wf")], T0, HOUR, 10).await.unwrap();
    assert_eq!(c.len(), 1, "the slot went on to c: {c:?}");
    assert_eq!(c[0].record.id.as_str(), "c");
}

/// Stream chunks: written under the lease (a stale one is fenced) and only while the step
/// runs that attempt, read back by attempt and epoch, dropped but for the attempt kept,
/// counted per instance, and gone with a cancel, a restart from their step, a full restart
/// and a delete.
pub async fn stream_chunks_are_fenced_kept_by_attempt_and_dropped_with_their_step(
    store: Arc<dyn Store>,
) {
    let iid = create_one(&*store, "wf", "a").await;
    let claim = |store: Arc<dyn Store>| async move { claim_one(&*store, "wf").await.lease };
    let lease = claim(Arc::clone(&store)).await;
    let key = StepKey {
        kind: StepKind::Run,
        name: "export".into(),
        count: 1,
    };
    let chunk =
        |lease: crate::Lease, attempt: u32, index: u32, byte: u8, len: usize| Write::Chunk {
            step: key.clone(),
            attempt,
            epoch: lease.epoch,
            index,
            data: vec![byte; len],
        };
    let running = |attempts: u32| {
        let mut s = step("export", 1, 0, StepState::Running);
        s.attempts = attempts;
        Write::Step(s)
    };
    store
        .commit(
            lease,
            vec![
                running(1),
                chunk(lease, 1, 0, 1, 100),
                chunk(lease, 1, 1, 2, 50),
            ],
        )
        .await
        .unwrap();
    assert_eq!(store.stream_bytes(iid).await.unwrap(), 150);
    assert_eq!(
        store
            .stream_chunk(iid, key.clone(), 1, lease.epoch, 1)
            .await
            .unwrap(),
        Some(vec![2; 50])
    );
    assert_eq!(
        store
            .stream_chunk(iid, key.clone(), 1, lease.epoch + 1, 1)
            .await
            .unwrap(),
        None,
        "another epoch's chunk"
    );
    // Attempt 2 runs: a late chunk of attempt 1 is dropped, attempt 2's is kept.
    store
        .commit(
            lease,
            vec![
                running(2),
                chunk(lease, 2, 0, 3, 70),
                chunk(lease, 1, 2, 9, 10),
            ],
        )
        .await
        .unwrap();
    assert_eq!(store.stream_bytes(iid).await.unwrap(), 220);
    // Attempt 2 succeeded: attempt 1's chunks go.
    store
        .commit(
            lease,
            vec![Write::DropChunks {
                step: key.clone(),
                keep: Some(2),
            }],
        )
        .await
        .unwrap();
    assert_eq!(store.stream_bytes(iid).await.unwrap(), 70);
    assert_eq!(
        store
            .stream_chunk(iid, key.clone(), 2, lease.epoch, 0)
            .await
            .unwrap(),
        Some(vec![3; 70])
    );
    // A restart from the step drops its chunks; the stale lease writes none.
    let id = InstanceId::new("a").unwrap();
    store
        .control(
            &wf("wf"),
            &id,
            ControlRequest::Restart {
                at: T0,
                from: Some(key.clone()),
                adopt: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        store.stream_bytes(iid).await.unwrap(),
        0,
        "restart from the step"
    );
    assert!(
        store
            .commit(lease, vec![chunk(lease, 2, 1, 4, 10)])
            .await
            .is_err()
    );
    let lease = claim(Arc::clone(&store)).await;
    store
        .commit(lease, vec![running(1), chunk(lease, 1, 0, 5, 30)])
        .await
        .unwrap();
    // A failed attempt drops what the step holds.
    store
        .commit(
            lease,
            vec![Write::DropChunks {
                step: key.clone(),
                keep: None,
            }],
        )
        .await
        .unwrap();
    assert_eq!(store.stream_bytes(iid).await.unwrap(), 0);
    // A cancel that takes effect drops them too.
    store
        .commit(lease, vec![running(2), chunk(lease, 2, 0, 6, 40)])
        .await
        .unwrap();
    assert_eq!(store.stream_bytes(iid).await.unwrap(), 40);
    let mut cancelled = step("export", 1, 0, StepState::Cancelled);
    cancelled.in_flight = false;
    store
        .commit(
            lease,
            vec![Write::Cancel {
                step: cancelled,
                records: vec![],
            }],
        )
        .await
        .unwrap();
    assert_eq!(store.stream_bytes(iid).await.unwrap(), 0, "cancel");
    // A full restart and a delete drop everything.
    store
        .control(
            &wf("wf"),
            &id,
            ControlRequest::Restart {
                at: T0,
                from: None,
                adopt: None,
            },
        )
        .await
        .unwrap();
    let lease = claim(Arc::clone(&store)).await;
    store
        .commit(lease, vec![running(1), chunk(lease, 1, 0, 7, 20)])
        .await
        .unwrap();
    assert_eq!(store.stream_bytes(iid).await.unwrap(), 20);
    store
        .control(
            &wf("wf"),
            &id,
            ControlRequest::Restart {
                at: T0,
                from: None,
                adopt: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(store.stream_bytes(iid).await.unwrap(), 0, "full restart");
    let lease = claim(Arc::clone(&store)).await;
    store
        .commit(lease, vec![running(1), chunk(lease, 1, 0, 8, 20)])
        .await
        .unwrap();
    store
        .control(&wf("wf"), &id, ControlRequest::Delete)
        .await
        .unwrap();
    assert_eq!(store.stream_bytes(iid).await.unwrap(), 0, "delete");
}

/// An instance that hibernates waiting for an event already buffered for it (sent while it
/// ran, after its wait looked and found nothing) stays claimable at once: the hibernation
/// looks at the buffered events itself, as the only net when the sender is another process
/// whose notice the engine may miss.
pub async fn an_instance_hibernating_for_an_event_already_buffered_stays_claimable(
    store: Arc<dyn Store>,
) {
    create_one(&*store, "wf", "a").await;
    let running = claim_one(&*store, "wf").await;
    store
        .commit(
            running.lease,
            vec![Write::Status(StatusChange {
                started_at: Some(T0),
                ..StatusChange::to(InstanceStatus::Running)
            })],
        )
        .await
        .unwrap();
    let sent = store
        .send_event(
            &wf("wf"),
            &InstanceId::new("a").unwrap(),
            crate::NewEvent {
                event_type: cairn_core::EventType::new("go").unwrap(),
                payload: "1".into(),
                at: T0,
                idempotency_key: None,
            },
        )
        .await
        .unwrap();
    assert!(matches!(sent, crate::Sent::Buffered(_)), "{sent:?}");
    store
        .commit(
            running.lease,
            vec![Write::Hibernate {
                wake_at: T0.saturating_add(Duration::from_secs(86_400)),
                event_types: vec![cairn_core::EventType::new("go").unwrap()],
                children: Vec::new(),
            }],
        )
        .await
        .unwrap();
    let woken = store.claim("o", &[wf("wf")], T0, TTL, 1).await.unwrap();
    assert_eq!(
        woken.len(),
        1,
        "the instance slept past the event buffered for its wait"
    );
}

/// Expands one `#[tokio::test]` per conformance case, each on a fresh store from `$factory`
/// (an `async fn() -> Arc<dyn Store>` or a fn returning such a future).
#[macro_export]
macro_rules! conformance_tests {
    ($factory:ident) => {
        $crate::conformance_tests!(@cases $factory;
            create_and_read,
            a_restart_logs_large_params_cut,
            ids_are_unique_per_workflow,
            claim_takes_each_ready_instance_once,
            claim_respects_limit_and_ready_time,
            stale_lease_is_fenced,
            renew_keeps_a_lease,
            commit_is_atomic,
            journal_upserts_by_key_in_start_order,
            log_ids_are_monotonic_and_paged,
            release_makes_an_instance_claimable_again,
            resuming_instances_are_claimed_before_new_ones,
            list_is_newest_first_with_filters,
            list_filters_and_count_matching_agree,
            commit_to_a_missing_instance_is_not_found,
            finished_instances_are_purged_after_their_retention,
            fencing_survives_instance_row_reuse,
            keep_forever_retention_does_not_overflow,
            a_cancelled_pause_logs_no_workflow_paused,
            an_event_sent_twice_with_one_key_is_buffered_once,
            a_restart_from_a_step_keeps_the_keys_of_the_events_its_kept_waits_took,
            a_put_back_event_under_a_reused_id_marks_only_its_own_key,
            a_cancel_never_overwrites_an_outcome,
            a_cancelled_wait_puts_back_the_event_a_take_gave_it,
            control_reports_the_epoch_it_fenced,
            records_read_back_exactly_at_every_page_size,
            a_step_start_reads_back_with_its_steps_configuration,
            an_expired_lease_is_not_renewed_and_is_claimed,
            release_all_frees_only_the_owners_instances,
            renew_keeps_only_the_instances_named,
            a_renewal_at_an_epoch_that_moved_on_extends_nothing,
            reclaim_moves_the_epoch_and_fences_the_old_one,
            a_childs_end_wakes_its_hibernated_parent,
            a_child_is_adopted_under_its_parents_lease_and_detached_once_it_has_ended,
            a_parent_hibernating_after_its_child_ended_stays_claimable,
            an_instance_hibernating_for_an_event_already_buffered_stays_claimable,
            terminating_or_deleting_a_child_wakes_its_parent,
            schedules_are_created_once_replaced_and_deleted,
            ticks_fire_once_as_stored_state_per_generation,
            a_second_terminate_with_rollback_is_a_no_op,
            a_key_runs_its_limit_at_once_and_frees_slots_by_priority,
            a_slot_is_never_lost_to_an_instance_that_leaves_before_its_claim,
            stream_chunks_are_fenced_kept_by_attempt_and_dropped_with_their_step,
        );
    };
    (@cases $factory:ident; $($case:ident,)*) => {
        mod conformance {
            $(
                #[tokio::test]
                async fn $case() {
                    let store = super::$factory().await;
                    $crate::conformance::$case(store).await;
                }
            )*
        }
    };
    // A factory returning `Option<Arc<dyn Store>>`: `None` skips the cases (for a backend
    // whose server is not available; the factory says so, loudly).
    (optional $factory:ident) => {
        $crate::conformance_tests!(@optional $factory;
            create_and_read,
            a_restart_logs_large_params_cut,
            ids_are_unique_per_workflow,
            claim_takes_each_ready_instance_once,
            claim_respects_limit_and_ready_time,
            stale_lease_is_fenced,
            renew_keeps_a_lease,
            commit_is_atomic,
            journal_upserts_by_key_in_start_order,
            log_ids_are_monotonic_and_paged,
            release_makes_an_instance_claimable_again,
            resuming_instances_are_claimed_before_new_ones,
            list_is_newest_first_with_filters,
            list_filters_and_count_matching_agree,
            commit_to_a_missing_instance_is_not_found,
            finished_instances_are_purged_after_their_retention,
            fencing_survives_instance_row_reuse,
            keep_forever_retention_does_not_overflow,
            a_cancelled_pause_logs_no_workflow_paused,
            an_event_sent_twice_with_one_key_is_buffered_once,
            a_restart_from_a_step_keeps_the_keys_of_the_events_its_kept_waits_took,
            a_put_back_event_under_a_reused_id_marks_only_its_own_key,
            a_cancel_never_overwrites_an_outcome,
            a_cancelled_wait_puts_back_the_event_a_take_gave_it,
            control_reports_the_epoch_it_fenced,
            records_read_back_exactly_at_every_page_size,
            a_step_start_reads_back_with_its_steps_configuration,
            an_expired_lease_is_not_renewed_and_is_claimed,
            release_all_frees_only_the_owners_instances,
            renew_keeps_only_the_instances_named,
            a_renewal_at_an_epoch_that_moved_on_extends_nothing,
            reclaim_moves_the_epoch_and_fences_the_old_one,
            a_childs_end_wakes_its_hibernated_parent,
            a_child_is_adopted_under_its_parents_lease_and_detached_once_it_has_ended,
            a_parent_hibernating_after_its_child_ended_stays_claimable,
            an_instance_hibernating_for_an_event_already_buffered_stays_claimable,
            terminating_or_deleting_a_child_wakes_its_parent,
            schedules_are_created_once_replaced_and_deleted,
            ticks_fire_once_as_stored_state_per_generation,
            a_second_terminate_with_rollback_is_a_no_op,
            a_key_runs_its_limit_at_once_and_frees_slots_by_priority,
            a_slot_is_never_lost_to_an_instance_that_leaves_before_its_claim,
            stream_chunks_are_fenced_kept_by_attempt_and_dropped_with_their_step,
        );
    };
    (@optional $factory:ident; $($case:ident,)*) => {
        mod conformance {
            $(
                #[tokio::test]
                async fn $case() {
                    let Some(store) = super::$factory().await else {
                        return;
                    };
                    $crate::conformance::$case(store).await;
                }
            )*
        }
    };
}
