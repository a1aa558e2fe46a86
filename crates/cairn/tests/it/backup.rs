//! Issue 33: `cairn::sqlite::backup` (`cairn backup`) copies a live database while its
//! engine runs 1,000 instances. The copy passes SQLite's integrity check; an engine started
//! on it finishes every instance that was unfinished in it, and no step committed in the
//! copy runs again (bodies are counted in the user's world, per engine).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn::prelude::*;
use cairn::store::{ListQuery, Store};
use cairn_core::StepState;
use serde_json::{Value, json};

use super::support::{FnWorkflow, builder_at, wf};

const INSTANCES: usize = 1000;

/// Step bodies run, as (instance, step).
type Ledger = Arc<Mutex<Vec<(String, String)>>>;

/// `a`, a nap of two seconds (the instances hibernate), `b`: each body notes itself in
/// `ledger`.
fn napper(ledger: Ledger) -> FnWorkflow<0> {
    wf(move |event: WorkflowEvent<Value>, step: WorkflowStep| {
        let ledger = Arc::clone(&ledger);
        async move {
            let id = event.instance_id.to_string();
            for name in ["a", "b"] {
                let (ledger, id) = (Arc::clone(&ledger), id.clone());
                step.run(name, move |_| {
                    let (ledger, id) = (Arc::clone(&ledger), id.clone());
                    async move {
                        ledger.lock().unwrap().push((id, name.to_owned()));
                        Ok(json!(name))
                    }
                })
                .await?;
                if name == "a" {
                    step.sleep("nap", "2 seconds").await?;
                }
            }
            Ok(json!("done"))
        }
    })
}

async fn every_instance(store: &dyn Store) -> Vec<cairn::store::InstanceRecord> {
    let mut out = Vec::new();
    let mut before = None;
    loop {
        let page = store
            .list(ListQuery {
                after: before,
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        before = Some(last.instance);
        out.extend(page);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_of_a_live_database_opens_and_finishes_its_instances_without_rerunning_a_step() {
    let dir = tempfile::tempdir().unwrap();
    let (live, copy) = (dir.path().join("live.db"), dir.path().join("copy.db"));
    let first: Ledger = Ledger::default();
    let engine = builder_at(&live)
        .register(napper(Arc::clone(&first)))
        .start()
        .await
        .unwrap();
    let client = engine.workflow::<FnWorkflow<0>>();
    for start in (0..INSTANCES).step_by(100) {
        let batch = (start..start + 100)
            .map(|i| cairn::CreateOptions::new(json!({})).id(format!("i{i}")))
            .collect();
        client.create_batch(batch).await.unwrap();
    }
    // The backup is taken while the engine works: once some instances nap (step a
    // committed), others are still queued or running theirs.
    let untyped = engine.workflow_by_name("test").unwrap();
    while untyped.count(InstanceStatus::Waiting).await.unwrap() < 200 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let backup = tokio::task::spawn_blocking({
        let (live, copy) = (live.clone(), copy.clone());
        move || cairn::sqlite::backup(&live, &copy)
    });
    let taken = backup.await.unwrap().expect("the backup");
    assert!(taken.pages > 0 && taken.bytes > 0, "{taken:?}");
    engine.shutdown().await;
    // A second backup to the same file is refused: a backup never overwrites.
    let again = cairn::sqlite::backup(&live, &copy).unwrap_err();
    assert!(again.contains("never overwrites"), "{again}");

    // What the copy holds, read before any engine touches it: each instance, and whether
    // its step `a` is committed there.
    let store = cairn::sqlite::SqliteStore::open(&copy, Default::default()).unwrap();
    let held = every_instance(&store).await;
    assert!(
        !held.is_empty() && held.len() <= INSTANCES,
        "the copy holds {} instances",
        held.len()
    );
    let mut committed_a = std::collections::HashSet::new();
    for record in &held {
        let journal = store.journal(record.instance).await.unwrap();
        if journal
            .iter()
            .any(|s| s.key.name == "a" && s.state == StepState::Succeeded)
        {
            committed_a.insert(record.id.to_string());
        }
    }
    drop(store);
    eprintln!(
        "the backup holds {} instances, {} with step a committed ({} pages)",
        held.len(),
        committed_a.len(),
        taken.pages
    );

    // An engine on the copy: everything unfinished in it finishes.
    let second: Ledger = Ledger::default();
    let restored = Engine::builder()
        .sqlite(&copy)
        .clock(cairn::Clock::virtual_now())
        .register(napper(Arc::clone(&second)))
        .start()
        .await
        .unwrap();
    let client = restored.workflow::<FnWorkflow<0>>();
    for record in &held {
        let instance = client.get(record.id.as_str()).await.unwrap();
        if tokio::time::timeout(Duration::from_secs(60), instance.wait())
            .await
            .is_err()
        {
            let details = instance.details().await.unwrap();
            panic!(
                "{} never finished on the copy: {}",
                record.id,
                serde_json::to_string(&details).unwrap()
            );
        }
        assert_eq!(
            instance.status().await.unwrap().status,
            InstanceStatus::Complete,
            "{}",
            record.id
        );
    }
    restored.shutdown().await;
    let reran: Vec<_> = second
        .lock()
        .unwrap()
        .iter()
        .filter(|(id, step)| step == "a" && committed_a.contains(id))
        .cloned()
        .collect();
    assert!(
        reran.is_empty(),
        "steps committed in the copy ran again: {reran:?}"
    );
    // Every `b` ran on the copy (after the nap), once per instance.
    let b_runs = second
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, step)| step == "b")
        .count();
    assert_eq!(b_runs, held.len());
}
