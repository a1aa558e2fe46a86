//! SPEC §7 E11, E12, T1–T6 in their Rust form: byte vectors (`Vec<u8>`, `bytes::Bytes`,
//! byte arrays) in step outputs, params and event payloads are stored as their bytes
//! (`{"$bytes":"<base64>"}` in the journal), count their bytes against the payload limit,
//! round-trip exactly, and show in views as `[Bytes(N bytes)]`.

use super::support::{FnWorkflow, engine, records, run_to_end, wf};
use cairn::prelude::*;
use cairn::{Instance, LogKind, StepOutput, StepSelector};
use serde_json::{Value, json};

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// The JSON a step's output is stored as, or its bytes when it is one byte sequence.
async fn stored(instance: &Instance<Value>, step: &str) -> StepOutput {
    instance
        .step_output(&StepSelector::new(step))
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn e11_t1_t3_a_200_kb_byte_output_is_stored_as_its_bytes_and_the_next_step_gets_them() {
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
    // The whole output is the bytes themselves.
    match stored(&instance, "render").await {
        StepOutput::Bytes(bytes) => assert!(bytes == pattern(200_000)),
        other => panic!("expected bytes, got {other:?}"),
    }
    // Views show the size, never the bytes.
    let details = instance.details().await.unwrap();
    let render = &details.steps[0];
    assert_eq!(render.output, Some(json!("[Bytes(200000 bytes)]")));
    // The bytes and the 13 characters of the object around them.
    assert_eq!(render.output_bytes, Some(200_013));
    let logged = records(&instance, LogKind::StepSuccess).await;
    assert_eq!(logged[0].entry.meta["result"], "[Bytes(200000 bytes)]");
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn t2_a_200_kb_view_over_an_800_kb_buffer_stores_only_the_view() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let view: bytes::Bytes = step
                .run("slice", |_| async {
                    let buffer = bytes::Bytes::from(pattern(800_000));
                    Ok(buffer.slice(300_000..500_000))
                })
                .await?;
            let expected = pattern(800_000)[300_000..500_000].to_vec();
            Ok(json!({ "len": view.len(), "same": view.as_ref() == expected.as_slice() }))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.output, Some(json!({ "len": 200_000, "same": true })));
    match stored(&instance, "slice").await {
        StepOutput::Bytes(bytes) => assert_eq!(bytes.len(), 200_000),
        other => panic!("expected bytes, got {other:?}"),
    }
    engine.shutdown().await;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Attachment {
    name: String,
    data: Vec<u8>,
    digest: [u8; 32],
}

fn attachment(name: &str, n: usize) -> Attachment {
    Attachment {
        name: name.into(),
        data: pattern(n),
        digest: [7; 32],
    }
}

#[tokio::test(start_paused = true)]
async fn e12_t5_an_object_holding_200_kb_of_bytes_is_stored_compactly_and_replays_exactly() {
    let (_dir, path) = super::support::temp_db();
    let workflow = || {
        wf(|_, step| async move {
            let a: Attachment = step
                .run("attach", |_| async { Ok(attachment("scan.pdf", 200_000)) })
                .await?;
            // Hibernate, so the rest runs on a replay that reads `a` from the journal.
            step.sleep("nap", "1 hour").await?;
            Ok(json!({ "name": a.name, "ok": a == attachment("scan.pdf", 200_000) }))
        })
    };
    let (engine, instance) = finished_after_a_restart(&path, workflow, "e12").await;
    let status = instance.wait().await.unwrap();
    assert_eq!(status.output, Some(json!({ "name": "scan.pdf", "ok": true })));
    let StepOutput::Json(json) = stored(&instance, "attach").await else {
        panic!("expected JSON");
    };
    // 200,000 bytes as JSON numbers were about 700 KB; as base64 they are 267 KB.
    assert!(json.len() < 270_000, "{} bytes of JSON", json.len());
    let read: Attachment = serde_json::from_value(decoded(&json)).unwrap();
    assert_eq!(read, attachment("scan.pdf", 200_000));
    let details = instance.details().await.unwrap();
    assert_eq!(
        details.steps[0].output,
        Some(json!({
            "name": "scan.pdf",
            "data": "[Bytes(200000 bytes)]",
            // A fixed-size array is a tuple to serde: numbers, as before.
            "digest": vec![7; 32],
        }))
    );
    // The bytes, the digest and the rest of the JSON.
    let size = details.steps[0].output_bytes.unwrap();
    assert!((200_013 + 64..200_200).contains(&size), "{size}");
    engine.shutdown().await;
}

/// Stored JSON with each `{"$bytes": base64}` turned into the array serde reads.
fn decoded(json: &str) -> Value {
    fn expand(v: &mut Value) {
        match v {
            Value::Object(map) if map.len() == 1 && map.contains_key("$bytes") => {
                let text = map["$bytes"].as_str().unwrap().to_owned();
                *v = Value::from(base64_decode(&text));
            }
            Value::Object(map) => map.values_mut().for_each(expand),
            Value::Array(items) => items.iter_mut().for_each(expand),
            _ => {}
        }
    }
    let mut value = serde_json::from_str(json).unwrap();
    expand(&mut value);
    value
}

/// Standard base64 with padding, decoded by hand: the test checks the format, not a crate.
fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let digits: Vec<u32> = text
        .bytes()
        .filter(|&b| b != b'=')
        .map(|b| ALPHABET.iter().position(|&a| a == b).unwrap() as u32)
        .collect();
    let mut out = Vec::new();
    for group in digits.chunks(4) {
        let mut n = 0u32;
        for (i, d) in group.iter().enumerate() {
            n |= d << (18 - 6 * i);
        }
        out.extend_from_slice(&n.to_be_bytes()[1..group.len()]);
    }
    out
}

#[tokio::test(start_paused = true)]
async fn t6_byte_vectors_in_a_vector_of_objects_are_stored_compactly() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            // 800 KB of bytes: about 2.8 MB as JSON numbers, over the 1 MiB limit.
            let all: Vec<Attachment> = step
                .run("attach-all", |_| async {
                    Ok((0..4)
                        .map(|i| attachment(&format!("page-{i}"), 200_000))
                        .collect::<Vec<_>>())
                })
                .await?;
            let ok = all
                .iter()
                .enumerate()
                .all(|(i, a)| *a == attachment(&format!("page-{i}"), 200_000));
            Ok(json!({ "pages": all.len(), "ok": ok }))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Complete, "{:?}", status.error);
    assert_eq!(status.output, Some(json!({ "pages": 4, "ok": true })));
    let StepOutput::Json(json) = stored(&instance, "attach-all").await else {
        panic!("expected JSON");
    };
    assert!(json.len() < 1_080_000, "{} bytes of JSON", json.len());
    let details = instance.details().await.unwrap();
    assert_eq!(
        details.steps[0].output.as_ref().unwrap()[3]["data"],
        "[Bytes(200000 bytes)]"
    );
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_byte_output_counts_its_bytes_against_the_payload_limit() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|event, step| async move {
            let n = event.payload["n"].as_u64().unwrap() as usize;
            let bytes: Vec<u8> = step
                .run("big", |_| async move { Ok(pattern(n)) })
                .await?;
            Ok(json!(bytes.len()))
        }))
    })
    .await;
    // 1,000,000 bytes are 1.33 MB of base64, but under the 1 MiB limit.
    let fits = run_to_end(&engine, json!({ "n": 1_000_000 })).await;
    let status = fits.status().await.unwrap();
    assert_eq!(status.output, Some(json!(1_000_000)), "{:?}", status.error);
    let over = run_to_end(&engine, json!({ "n": 1_100_000 })).await;
    let status = over.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Errored);
    let message = status.error.unwrap().message;
    assert!(
        message.contains("Step big-1 output is too large: 1100013 bytes"),
        "{message}"
    );
    engine.shutdown().await;
}

/// A workflow whose params and event payload carry bytes.
struct Upload;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct UploadParams {
    file: Attachment,
    parts: Vec<bytes::Bytes>,
}

impl Workflow for Upload {
    const NAME: &'static str = "upload";
    type Params = UploadParams;
    type Output = (bool, bool, usize);

    async fn run(
        &self,
        event: WorkflowEvent<UploadParams>,
        step: WorkflowStep,
    ) -> Result<Self::Output, WorkflowError> {
        let signed = step
            .wait_for_event::<Attachment>("signature", "signed")
            .await?;
        Ok((
            event.payload == upload_params(),
            signed.payload == attachment("signature", 300_000),
            event.payload.parts.len(),
        ))
    }
}

fn upload_params() -> UploadParams {
    UploadParams {
        file: attachment("contract.pdf", 900_000),
        parts: vec![bytes::Bytes::from_static(b"one"), bytes::Bytes::new()],
    }
}

#[tokio::test(start_paused = true)]
async fn byte_params_and_event_payloads_are_stored_compactly_and_arrive_exactly() {
    let (engine, _dir) = engine(|b| b.register(Upload)).await;
    // 900 KB of params: 3 MB as JSON numbers, 1.2 MB as base64, 900 KB against the limit.
    let instance = engine
        .workflow::<Upload>()
        .create(CreateOptions::new(upload_params()))
        .await
        .unwrap();
    instance
        .wait_for(|s| s.status == InstanceStatus::Waiting)
        .await
        .unwrap();
    instance
        .send_event("signed", &attachment("signature", 300_000))
        .await
        .unwrap();
    let status = instance.wait().await.unwrap();
    assert_eq!(status.output, Some((true, true, 2)), "{:?}", status.error);
    let details = instance.details().await.unwrap();
    // The params are data: stored, and shown, as base64.
    assert_eq!(details.params["parts"][0], json!({ "$bytes": "b25l" }));
    assert_eq!(details.params["parts"][1], json!({ "$bytes": "" }));
    // Logs and step views show sizes.
    let queued = records(&instance, LogKind::WorkflowQueued).await;
    assert_eq!(
        queued[0].entry.meta["params"]["file"]["data"],
        "[Bytes(900000 bytes)]"
    );
    let waited = records(&instance, LogKind::WaitComplete).await;
    assert_eq!(
        waited[0].entry.meta["payload"]["data"],
        "[Bytes(300000 bytes)]"
    );
    assert_eq!(
        details.steps[0].output.as_ref().unwrap()["payload"]["data"],
        "[Bytes(300000 bytes)]"
    );
    // Over the limit by their bytes: refused, with the real size.
    let mut big = upload_params();
    big.file.data = pattern(1_100_000);
    let err = engine
        .workflow::<Upload>()
        .create(CreateOptions::new(big))
        .await
        .unwrap_err();
    let message = err.to_string();
    let size: usize = message
        .strip_prefix("params is ")
        .and_then(|m| m.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{message}"));
    // The 1,100,000 bytes themselves, not their 1.47 MB of base64.
    assert!((1_100_000..1_100_400).contains(&size), "{message}");
    engine.shutdown().await;
}

/// Issue 30 §3: a user's JSON that has a `$bytes` key is theirs, in params, a step's
/// output, an event's payload and the workflow's output: it comes back exactly as it went
/// in (typed, untyped, in the details and the status the HTTP API answers), never as bytes.
#[tokio::test(start_paused = true)]
async fn a_json_value_with_a_dollar_bytes_key_comes_back_exactly_as_it_went_in() {
    let (first, _dir) = engine(|b| {
        b.register(wf(|event, step| async move {
            let params = event.payload.clone();
            let out: Value = step
                .run("echo", move |_| {
                    let params = params.clone();
                    async move { Ok(params) }
                })
                .await?;
            let got = step.wait_for_event::<Value>("upload", "file").await?;
            Ok(json!({ "params": event.payload, "step": out, "event": got.payload }))
        }))
    })
    .await;
    let value = json!({ "$bytes": "aGk=", "$x": { "$bytes": "AQID" }, "$$y": 1 });
    let instance = first
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(value.clone()))
        .await
        .unwrap();
    instance.send_event("file", &value).await.unwrap();
    let status = instance.wait().await.unwrap();
    let expected = json!({ "params": value, "step": value, "event": value });
    assert_eq!(status.output, Some(expected.clone()), "{:?}", status.error);
    assert_eq!(instance.stored_status().await.unwrap().output, Some(expected));
    let details = instance.details().await.unwrap();
    assert_eq!(details.params, value);
    assert_eq!(details.steps[0].output, Some(value.clone()));
    // A `$bytes` map a client sends is not bytes to a typed reader either.
    let (engine2, _dir2) = engine(|b| {
        b.register(wf(|_, step| async move {
            let got = step.wait_for_event::<Vec<u8>>("upload", "file").await?;
            Ok(json!(got.payload))
        }))
    })
    .await;
    let instance = engine2
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(json!({})))
        .await
        .unwrap();
    instance
        .send_event("file", &json!({ "$bytes": "AQID" }))
        .await
        .unwrap();
    let status = instance.wait().await.unwrap();
    assert!(
        status
            .error
            .is_some_and(|e| e.message.contains("invalid type: map")),
        "a map, not bytes"
    );
    first.shutdown().await;
    engine2.shutdown().await;
}

/// A workflow whose output is bytes.
struct BytesOut;

impl cairn::Workflow for BytesOut {
    const NAME: &'static str = "test";
    type Params = Value;
    type Output = Vec<u8>;

    async fn run(
        &self,
        _: cairn::WorkflowEvent<Value>,
        step: cairn::WorkflowStep,
    ) -> Result<Vec<u8>, cairn::WorkflowError> {
        let data: Vec<u8> = step.run("data", |_| async { Ok(pattern(5_000)) }).await?;
        Ok(data)
    }
}

#[tokio::test(start_paused = true)]
async fn a_workflow_output_holding_bytes_is_logged_as_its_size() {
    let (engine, _dir) = engine(|b| b.register(BytesOut)).await;
    let instance = engine
        .workflow::<BytesOut>()
        .create(CreateOptions::new(json!({})))
        .await
        .unwrap();
    assert_eq!(instance.wait().await.unwrap().output, Some(pattern(5_000)));
    let logged = records(&instance, LogKind::WorkflowSuccess).await;
    assert_eq!(logged[0].entry.meta["result"], "[Bytes(5000 bytes)]");
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
    let (engine, instance) = finished_after_a_restart(&path, workflow, "t4").await;
    let status = instance.wait().await.unwrap();
    assert_eq!(
        status.output,
        Some(Value::from(vec![-32_768i64, -1, 0, 1, 32_767]))
    );
    engine.shutdown().await;
}

/// Creates instance `id` of `workflow` (which sleeps an hour once its steps have run),
/// stops the engine once it is asleep, and starts another on the same database: the rest
/// runs on a replay that reads the steps' outputs from the journal.
async fn finished_after_a_restart(
    path: &std::path::Path,
    workflow: impl Fn() -> FnWorkflow,
    id: &str,
) -> (cairn::Engine, Instance<Value>) {
    let engine = super::support::builder_at(path)
        .register(workflow())
        .start()
        .await
        .unwrap();
    engine
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(json!({})).id(id))
        .await
        .unwrap()
        .wait_for(|s| s.status == InstanceStatus::Waiting)
        .await
        .unwrap();
    engine.shutdown().await;
    let engine = super::support::builder_at(path)
        .register(workflow())
        .start()
        .await
        .unwrap();
    let instance = engine.workflow::<FnWorkflow>().get(id).await.unwrap();
    (engine, instance)
}

/// Issue 30 §3: params are stored once, in the instance's row: the `WORKFLOW_QUEUED`
/// record (created, and restarted) shows large ones cut, and the details and the workflow
/// get them whole.
#[tokio::test(start_paused = true)]
async fn large_params_are_stored_once_and_logged_cut() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|event, _step| async move {
            Ok(json!(event.payload["text"].as_str().map(str::len)))
        }))
    })
    .await;
    let params = json!({ "text": "x".repeat(900_000) });
    let instance = engine
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(params.clone()))
        .await
        .unwrap();
    let status = instance.wait().await.unwrap();
    assert_eq!(status.output, Some(json!(900_000)));
    assert_eq!(instance.details().await.unwrap().params, params);
    for _ in 0..2 {
        let queued = records(&instance, LogKind::WorkflowQueued).await;
        let shown = queued[0].entry.meta["params"].as_str().expect("cut").to_owned();
        assert!(shown.len() < 4_200, "the log holds {} bytes", shown.len());
        assert!(shown.ends_with("[truncated: 900011 bytes]"), "{shown}");
        instance.restart().await.unwrap();
        instance.wait().await.unwrap();
    }
    engine.shutdown().await;
}

/// Arrays `depth` deep around `1`.
fn nested(depth: usize) -> Value {
    (0..depth).fold(json!(1), |value, _| json!([value]))
}

/// Values nested as deep as a stored value may be (`cairn_core::binary::MAX_DEPTH`) come
/// back exactly through params, a step's output, an event and the workflow's output, also
/// in the log; one level deeper is refused where it enters, with an error that says why.
/// Before, such a value was stored, then did not read back (serde_json reads no JSON 128
/// deep): params deeper than that failed the instance as it started, and a step's output
/// failed it after the step had run, its success logged with a `null` result.
#[tokio::test(start_paused = true)]
async fn values_nested_to_the_limit_read_back_and_deeper_ones_are_refused_where_they_enter() {
    const LIMIT: usize = cairn_core::binary::MAX_DEPTH;
    let (engine, _dir) = engine(|b| {
        b.register(wf(|event, step| async move {
            let output: Value = step.run("deep", |_| async { Ok(nested(LIMIT)) }).await?;
            let deeper = step
                .run("deeper", |_| async { Ok(nested(LIMIT + 1)) })
                .retries(Retries::none())
                .await
                .map_err(|e| e.message().to_owned());
            let received = step.wait_for_event::<Value>("w", "go").await?;
            Ok(json!({
                "params": event.payload == nested(LIMIT),
                "output": output == nested(LIMIT),
                "deeper": deeper.err(),
                "event": received.payload == nested(LIMIT),
                "value": nested(LIMIT - 1),
            }))
        }))
    })
    .await;
    let workflow = engine.workflow::<FnWorkflow>();
    let refused = workflow
        .create(CreateOptions::new(nested(LIMIT + 1)))
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("deeper than 100 levels"),
        "{refused}"
    );
    let instance = workflow
        .create(CreateOptions::new(nested(LIMIT)))
        .await
        .unwrap();
    let refused = instance
        .send_event("go", &nested(LIMIT + 1))
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("deeper than 100 levels"),
        "{refused}"
    );
    instance.send_event("go", &nested(LIMIT)).await.unwrap();
    let status = instance.wait().await.unwrap();
    let output = status.output.clone().unwrap_or_else(|| panic!("{status:?}"));
    assert_eq!(output["params"], true);
    assert_eq!(output["output"], true);
    assert_eq!(output["event"], true);
    assert_eq!(output["value"], nested(LIMIT - 1));
    let deeper = output["deeper"].as_str().unwrap_or_default();
    assert!(deeper.contains("deeper than 100 levels"), "{output}");
    // The log reads back whole, each value in its record.
    let success = records(&instance, LogKind::StepSuccess).await;
    assert_eq!(success[0].entry.meta["result"], nested(LIMIT), "{success:?}");
    let received = records(&instance, LogKind::WaitComplete).await;
    assert_eq!(received[0].entry.meta["payload"], nested(LIMIT));
    engine.shutdown().await;
}
