//! Crash consistency of child workflows: a child process running 20 parents, each of which
//! invokes a child (which works, sleeps a minute and works again) and then uses its output,
//! is SIGKILLed at seeded random moments (at least 20 times) and restarted on the same
//! database. After the last run: every parent completed with its own child's output, each
//! parent started exactly one child (one `CHILD_START`, one child instance linked to it),
//! received its outcome once (one `CHILD_COMPLETE`), and no committed step body of parent or
//! child ran again.
//!
//! The child process is this test binary, run again with `CAIRN_CRASH_CHILD` set.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::{FnWorkflow, named, wf};
use cairn::prelude::*;
use cairn::{InstanceStatus, LogKind};
use serde_json::{Value, json};

const PARENTS: usize = 20;
const KILLS: usize = 20;

type Parent = FnWorkflow<0>;
type Child = FnWorkflow<1>;

/// A step body that records `<instance> <step> <attempt>` outside the engine.
fn body(
    effects: &std::path::Path,
    id: &str,
    name: &'static str,
    value: i64,
) -> impl FnMut(StepContext) -> std::future::Ready<Result<i64, cairn::StepError>> + Send + 'static {
    let (effects, id) = (effects.to_path_buf(), id.to_owned());
    move |ctx: StepContext| {
        crate::support::append_line(&effects, &format!("{id} {name} {}", ctx.attempt));
        // 20 parents × 4 bodies × 6 ms, serial on one thread, outlast 20 kill intervals.
        std::thread::sleep(Duration::from_millis(6));
        std::future::ready(Ok(value))
    }
}

fn workflows(effects: PathBuf) -> (Parent, Child) {
    let parent_effects = effects.clone();
    let parent = wf(move |event, step| {
        let effects = parent_effects.clone();
        async move {
            let id = event.instance_id.to_string();
            let n = event.payload["n"].as_i64().unwrap();
            let before = step.run("before", body(&effects, &id, "before", n)).await?;
            let child: Value = step
                .invoke::<Child>("child", json!({ "n": before }))
                .await?;
            let after = step
                .run(
                    "after",
                    body(&effects, &id, "after", child["n"].as_i64().unwrap() + 1),
                )
                .await?;
            Ok(json!({ "after": after, "child": child }))
        }
    });
    let child = named::<1, _, _>(move |event, step| {
        let effects = effects.clone();
        async move {
            let id = event.instance_id.to_string();
            let n = event.payload["n"].as_i64().unwrap();
            let work = step
                .run("work", body(&effects, &id, "work", n * 10))
                .await?;
            step.sleep("rest", "1 minute").await?;
            let done = step
                .run("finish", body(&effects, &id, "finish", work))
                .await?;
            Ok(json!({ "n": done }))
        }
    });
    (parent, child)
}

#[test]
fn child_process_entry_children() {
    let Some(dir) = crate::support::crash_child_dir() else {
        return; // not a child: nothing to do in a normal test run
    };
    let rt = crate::support::paused_runtime();
    rt.block_on(async {
        let (parent, child) = workflows(dir.join("effects.txt"));
        let engine = crate::support::builder_at(&dir.join("cairn.db"))
            .register(parent)
            .register(child)
            .start()
            .await
            .unwrap();
        let client = engine.workflow::<Parent>();
        for i in 0..PARENTS {
            let options = CreateOptions::new(json!({ "n": i })).id(format!("p{i}"));
            // Created before a kill: "already exists" on the next run.
            let _ = client.create(options).await;
        }
        for i in 0..PARENTS {
            let instance = client.get(&format!("p{i}")).await.unwrap();
            instance.wait().await.unwrap();
        }
        engine.shutdown().await;
    });
}

#[test]
fn killed_while_parents_wait_for_children_each_child_runs_once() {
    let seed = crate::support::test_seed("crash_kill_children");
    let dir = tempfile::tempdir().unwrap();
    let kills = crate::support::kill_repeatedly(
        dir.path(),
        "crash_kill_children::child_process_entry_children",
        seed,
        KILLS,
        25,
    );
    assert!(kills >= KILLS, "only {kills} kills landed");

    let runs = crate::support::read_effects(&dir.path().join("effects.txt"));
    let rt = crate::support::paused_runtime();
    rt.block_on(async {
        let (parent, child) = workflows(dir.path().join("unused.txt"));
        let engine = crate::support::builder_at(&dir.path().join("cairn.db"))
            .register(parent)
            .register(child)
            .start()
            .await
            .unwrap();
        let children = engine
            .workflow::<Child>()
            .list(&cairn::ListOptions::default().limit(1000))
            .await
            .unwrap();
        assert_eq!(
            children.instances.len(),
            PARENTS,
            "one child per parent, no more"
        );
        for i in 0..PARENTS {
            let parent = engine
                .workflow::<Parent>()
                .get(&format!("p{i}"))
                .await
                .unwrap();
            let status = parent.status().await.unwrap();
            assert_eq!(status.status, InstanceStatus::Complete, "p{i}");
            let n = i64::try_from(i).unwrap();
            assert_eq!(
                status.output,
                Some(json!({ "after": n * 10 + 1, "child": { "n": n * 10 } })),
                "p{i} got its own child's output"
            );
            let kinds = crate::support::kinds(&parent).await;
            for kind in [LogKind::ChildStart, LogKind::ChildComplete] {
                assert_eq!(
                    kinds.iter().filter(|k| **k == kind).count(),
                    1,
                    "p{i}: {kind:?} once in {kinds:?}"
                );
            }
            let details = parent.details().await.unwrap();
            assert_eq!(details.children.len(), 1, "p{i}");
            let child = engine
                .workflow::<Child>()
                .get(&details.children[0].id)
                .await
                .unwrap();
            assert_eq!(
                child.status().await.unwrap().status,
                InstanceStatus::Complete
            );
            for instance in [
                parent.details().await.unwrap(),
                child.details().await.unwrap(),
            ] {
                crate::support::assert_no_body_reran(&runs, &instance);
            }
        }
        engine.shutdown().await;
    });
}
