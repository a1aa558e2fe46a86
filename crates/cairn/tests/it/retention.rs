//! SPEC Part A.12: finished instances are purged after their retention; ids can be reused.

use std::time::Duration;

use super::support::{FnWorkflow, engine, wf};
use cairn::prelude::*;
use cairn::{InstanceStatus, Retention};
use serde_json::{Value, json};

fn succeed_or_fail() -> FnWorkflow {
    wf(|event, _| async move {
        if event.payload["fail"] == true {
            Err("failed".into())
        } else {
            Ok(Value::Null)
        }
    })
}

const DAY: Duration = Duration::from_secs(86_400);

#[tokio::test(start_paused = true)]
async fn finished_instances_are_kept_seven_days_by_default_then_purged() {
    let (engine, _dir) = engine(|b| b.register(succeed_or_fail())).await;
    let client = engine.workflow::<FnWorkflow>();
    let ok = client
        .create(CreateOptions::new(json!({})).id("ok"))
        .await
        .unwrap();
    let bad = client
        .create(CreateOptions::new(json!({"fail": true})).id("bad"))
        .await
        .unwrap();
    ok.wait().await.unwrap();
    bad.wait().await.unwrap();
    tokio::time::sleep(7 * DAY - Duration::from_secs(60)).await;
    assert_eq!(
        super::support::status_of(&ok).await,
        InstanceStatus::Complete,
        "still retained"
    );
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(
        client.get("ok").await.unwrap_err().code(),
        "instance.not_found"
    );
    assert_eq!(
        client.get("bad").await.unwrap_err().code(),
        "instance.not_found"
    );
    let again = client
        .create(CreateOptions::new(json!({})).id("ok"))
        .await
        .unwrap();
    assert_eq!(
        again.wait().await.unwrap().status,
        InstanceStatus::Complete,
        "the id is free again"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn retention_is_set_per_workflow_and_per_instance_for_success_and_error_apart() {
    let (engine, _dir) = engine(|b| {
        b.register(succeed_or_fail()).workflow_retention(
            "test",
            Retention {
                success: DAY,
                error: 3 * DAY,
            },
        )
    })
    .await;
    let client = engine.workflow::<FnWorkflow>();
    let ok = client
        .create(CreateOptions::new(json!({})).id("ok"))
        .await
        .unwrap();
    let bad = client
        .create(CreateOptions::new(json!({"fail": true})).id("bad"))
        .await
        .unwrap();
    let short = client
        .create(
            CreateOptions::new(json!({"fail": true}))
                .id("short")
                .error_retention(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    for i in [&ok, &bad, &short] {
        i.wait().await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2 * 3600)).await;
    assert_eq!(
        client.get("short").await.unwrap_err().code(),
        "instance.not_found",
        "per instance: 1 hour"
    );
    assert!(client.get("ok").await.is_ok());
    tokio::time::sleep(DAY).await;
    assert_eq!(
        client.get("ok").await.unwrap_err().code(),
        "instance.not_found",
        "per workflow success: 1 day"
    );
    assert!(
        client.get("bad").await.is_ok(),
        "per workflow error: 3 days"
    );
    tokio::time::sleep(2 * DAY).await;
    assert_eq!(
        client.get("bad").await.unwrap_err().code(),
        "instance.not_found"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn terminated_instances_use_the_error_retention_and_running_ones_are_never_purged() {
    let (engine, _dir) = engine(|b| {
        b.retention(Retention {
            success: DAY,
            error: DAY,
        })
        .register(wf(|_, step| async move {
            step.sleep("long", "300 days").await?;
            Ok(Value::Null)
        }))
    })
    .await;
    let client = engine.workflow::<FnWorkflow>();
    let stopped = client
        .create(CreateOptions::new(json!({})).id("stopped"))
        .await
        .unwrap();
    let sleeping = client
        .create(CreateOptions::new(json!({})).id("sleeping"))
        .await
        .unwrap();
    stopped
        .wait_for(|s| s.status == InstanceStatus::Waiting)
        .await
        .unwrap();
    sleeping
        .wait_for(|s| s.status == InstanceStatus::Waiting)
        .await
        .unwrap();
    stopped.terminate().await.unwrap();
    tokio::time::sleep(2 * DAY).await;
    assert_eq!(
        client.get("stopped").await.unwrap_err().code(),
        "instance.not_found"
    );
    assert_eq!(
        super::support::status_of(&sleeping).await,
        InstanceStatus::Waiting
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn retention_for_an_unregistered_workflow_is_a_configuration_error() {
    let (dir, path) = super::support::temp_db();
    let err = super::support::builder_at(&path)
        .register(succeed_or_fail())
        .workflow_retention(
            "other",
            Retention {
                success: DAY,
                error: DAY,
            },
        )
        .start()
        .await
        .unwrap_err();
    assert_eq!(err.code(), "engine.config");
    assert!(err.to_string().contains("\"other\""));
    drop(dir);
}
