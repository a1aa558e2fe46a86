//! SPEC §7 E11, E12, T1, T3, T4 in their Rust form: byte vectors in step outputs. (T2, T5
//! and T6, stored compactly, are not built yet: a `Vec<u8>` is stored as JSON numbers.)

use super::support::{FnWorkflow, engine, run_to_end, wf};
use cairn::prelude::*;
use serde_json::{Value, json};

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

#[tokio::test(start_paused = true)]
async fn e11_t1_t3_a_200_kb_byte_output_completes_and_the_next_step_gets_the_same_bytes() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let bytes: Vec<u8> = step
                .run("render", |_| async { Ok(pattern(200_000)) })
                .await?;
            let same: bool = step
                .run("check", |_| {
                    let bytes = bytes.clone();
                    async move { Ok(bytes == pattern(200_000)) }
                })
                .await?;
            Ok(json!({ "len": bytes.len(), "same": same }))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Complete, "{:?}", status.error);
    assert_eq!(status.output, Some(json!({ "len": 200_000, "same": true })));
    // The views do not carry the whole output: it is cut, with its size.
    let details = instance.details().await.unwrap();
    let render = &details.steps[0];
    assert!(render.output_bytes.unwrap() > 200_000);
    assert!(render.output.as_ref().unwrap().as_str().unwrap().len() < 5_000);
    engine.shutdown().await;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Attachment {
    name: String,
    data: Vec<u8>,
}

#[tokio::test(start_paused = true)]
async fn e12_an_object_holding_200_kb_of_bytes_completes_and_round_trips() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let a: Attachment = step
                .run("attach", |_| async {
                    Ok(Attachment {
                        name: "scan.pdf".into(),
                        data: pattern(200_000),
                    })
                })
                .await?;
            Ok(json!({ "name": a.name, "ok": a.data == pattern(200_000) }))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.output, Some(json!({ "name": "scan.pdf", "ok": true })));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn t4_a_vector_of_i16_keeps_its_type_and_values_across_a_replay() {
    let (_dir, path) = super::support::temp_db();
    let workflow = || {
        wf(|_, step| async move {
            let samples: Vec<i16> = step
                .run("sample", |_| async { Ok(vec![-32_768i16, -1, 0, 1, 32_767]) })
                .await?;
            step.sleep("nap", "1 hour").await?;
            Ok(json!(samples))
        })
    };
    let engine = super::support::builder_at(&path)
        .register(workflow())
        .start()
        .await
        .unwrap();
    let instance = engine
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(json!({})).id("t4"))
        .await
        .unwrap();
    instance
        .wait_for(|s| s.status == InstanceStatus::Waiting)
        .await
        .unwrap();
    engine.shutdown().await;
    let engine = super::support::builder_at(&path)
        .register(workflow())
        .start()
        .await
        .unwrap();
    let status = engine
        .workflow::<FnWorkflow>()
        .get("t4")
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert_eq!(
        status.output,
        Some(Value::from(vec![-32_768i64, -1, 0, 1, 32_767]))
    );
    engine.shutdown().await;
}
