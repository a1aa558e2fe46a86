//! The replay check (`Engine::replay_check`, `EngineBuilder::replay_check`): a workflow
//! changed in each breaking way between two engine runs on the same database is reported
//! in words, naming the step; unchanged code is reported compatible; nothing runs.

use std::time::Duration;

use super::support::{Counter, FnWorkflow, builder_at, until_status, wf};
use cairn::prelude::*;
use cairn::{InstanceStatus, ReplayReport};
use serde_json::{Value, json};

/// Version 1: two steps (the first with a compensation), a day's sleep, one more step.
fn v1(after: Counter) -> FnWorkflow {
    wf(move |_, step| {
        let after = after.clone();
        async move {
            let a: String = step
                .run("a", |_| async { Ok("A".to_owned()) })
                .rollback(|_: cairn::Rollback<String>| async { Ok(()) })
                .await?;
            let b: u32 = step.run("b", |_| async { Ok(2) }).await?;
            step.sleep("nap", "1 day").await?;
            step.run("after", move |_| {
                after.bump();
                async { Ok(()) }
            })
            .await?;
            Ok(json!([a, b]))
        }
    })
}

/// An instance of version 1 asleep in its `nap`, on a database at `path`.
async fn sleeping_instance(path: &std::path::Path) {
    let engine = builder_at(path)
        .register(v1(Counter::default()))
        .start()
        .await
        .unwrap();
    let instance = engine
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(json!({})).id("v1"))
        .await
        .unwrap();
    until_status(&instance, InstanceStatus::Waiting).await;
    engine.shutdown().await;
}

async fn check_with(path: &std::path::Path, code: FnWorkflow) -> ReplayReport {
    builder_at(path).register(code).replay_check().await.unwrap()
}

fn problems(report: &ReplayReport) -> Vec<String> {
    assert_eq!(report.checked, 1, "{report:?}");
    report
        .incompatible
        .iter()
        .flat_map(|f| f.problems.clone())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn unchanged_code_is_compatible_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cairn.db");
    sleeping_instance(&path).await;
    let after = Counter::default();
    let report = check_with(&path, v1(after.clone())).await;
    assert!(report.compatible(), "{report:?}");
    assert_eq!(report.checked, 1);
    // Nothing ran and nothing was written: a day later the instance still sleeps.
    tokio::time::sleep(Duration::from_secs(2 * 86_400)).await;
    assert_eq!(after.get(), 0);
    let engine = builder_at(&path)
        .register(v1(after.clone()))
        .start()
        .await
        .unwrap();
    let status = engine
        .workflow::<FnWorkflow>()
        .get("v1")
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert_eq!(status.output, Some(json!(["A", 2])));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_renamed_or_removed_step_is_reported_as_not_reached() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cairn.db");
    sleeping_instance(&path).await;
    let renamed = wf(|_, step| async move {
        let a: String = step
            .run("a", |_| async { Ok("A".to_owned()) })
            .rollback(|_: cairn::Rollback<String>| async { Ok(()) })
            .await?;
        let b: u32 = step.run("b renamed", |_| async { Ok(2) }).await?;
        step.sleep("nap", "1 day").await?;
        Ok(json!([a, b]))
    });
    let found = problems(&check_with(&path, renamed).await);
    assert!(
        found
            .iter()
            .any(|p| p.contains("step \"b\" is in the journal, but the code no longer reaches it")),
        "{found:?}"
    );
    // Where the replay stops, and what it could not reach behind it.
    assert!(
        found[0].contains("the replay stops at step \"b renamed\""),
        "{found:?}"
    );
    assert!(
        found.iter().any(|p| p.contains("sleep \"nap\" is in the journal")),
        "{found:?}"
    );
    let removed = wf(|_, step| async move {
        let a: String = step
            .run("a", |_| async { Ok("A".to_owned()) })
            .rollback(|_: cairn::Rollback<String>| async { Ok(()) })
            .await?;
        step.sleep("nap", "1 day").await?;
        Ok(json!([a]))
    });
    let found = problems(&check_with(&path, removed).await);
    assert!(
        found.iter().any(|p| p.contains("step \"b\" is in the journal")),
        "{found:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_output_of_another_type_is_reported_with_the_step_and_the_decode_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cairn.db");
    sleeping_instance(&path).await;
    let retyped = wf(|_, step| async move {
        let a: u64 = step
            .run("a", |_| async { Ok(1) })
            .rollback(|_: cairn::Rollback<u64>| async { Ok(()) })
            .await?;
        let b: u32 = step.run("b", |_| async { Ok(2) }).await?;
        step.sleep("nap", "1 day").await?;
        Ok(json!([a, b]))
    });
    let found = problems(&check_with(&path, retyped).await);
    assert!(
        found
            .iter()
            .any(|p| p.starts_with("step \"a\": ") && p.contains("does not decode")),
        "{found:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_step_of_another_kind_is_reported_as_a_kind_change() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cairn.db");
    sleeping_instance(&path).await;
    let rekinded = wf(|_, step| async move {
        let a: String = step
            .run("a", |_| async { Ok("A".to_owned()) })
            .rollback(|_: cairn::Rollback<String>| async { Ok(()) })
            .await?;
        step.sleep("b", "1 hour").await?;
        step.sleep("nap", "1 day").await?;
        Ok(json!([a]))
    });
    let found = problems(&check_with(&path, rekinded).await);
    assert!(
        found
            .iter()
            .any(|p| p.contains("\"b\" was a step and is now a sleep")),
        "{found:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_rollback_handler_that_disappeared_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cairn.db");
    sleeping_instance(&path).await;
    let uncompensated = wf(|_, step| async move {
        let a: String = step.run("a", |_| async { Ok("A".to_owned()) }).await?;
        let b: u32 = step.run("b", |_| async { Ok(2) }).await?;
        step.sleep("nap", "1 day").await?;
        Ok::<Value, WorkflowError>(json!([a, b]))
    });
    let found = problems(&check_with(&path, uncompensated).await);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("step \"a\" declared a rollback handler"),
        "{found:?}"
    );
}

/// Review findings: the loser of a `select!` (never polled when the winner answers from
/// the journal) is not "no longer reached"; an instance of a workflow the code no longer
/// has, and params the code no longer takes, are reported.
#[tokio::test(start_paused = true)]
async fn a_select_loser_is_reached_and_removed_workflows_or_params_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cairn.db");
    let racing = || {
        wf(|_, step| async move {
            tokio::select! {
                biased;
                fast = step.run("fast", |_| async { Ok(1) }) => { fast?; }
                slept = step.sleep("timeout", "1 hour") => { slept?; }
            }
            step.sleep("nap", "1 day").await?;
            Ok(Value::Null)
        })
    };
    let engine = builder_at(&path).register(racing()).start().await.unwrap();
    let instance = engine
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(json!({})).id("r"))
        .await
        .unwrap();
    until_status(&instance, InstanceStatus::Waiting).await;
    engine.shutdown().await;
    for _ in 0..3 {
        let report = check_with(&path, racing()).await;
        assert!(report.compatible(), "{report:?}");
    }

    // The workflow is gone from the code.
    let report = builder_at(&path)
        .register(super::support::named::<1, _, _>(|_, _| async { Ok(Value::Null) }))
        .replay_check()
        .await
        .unwrap();
    assert_eq!(report.checked, 1);
    assert!(
        report.incompatible[0].problems[0].contains("workflow test is not registered"),
        "{report:?}"
    );

    // The params type changed.
    struct Typed;
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Needs {
        n: u32,
    }
    impl Workflow for Typed {
        const NAME: &'static str = "test";
        type Params = Needs;
        type Output = ();
        async fn run(&self, _: WorkflowEvent<Needs>, _: WorkflowStep) -> Result<(), WorkflowError> {
            Ok(())
        }
    }
    let report = builder_at(&path).register(Typed).replay_check().await.unwrap();
    assert!(
        report.incompatible[0].problems[0].contains("params no longer decode"),
        "{report:?}"
    );
}
