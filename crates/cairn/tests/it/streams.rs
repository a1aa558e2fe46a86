//! SPEC §3.12, §7 S: stream step outputs, persisted in chunks per attempt and read back from
//! the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::support::{FnWorkflow, engine, records, run_to_end, wf};
use cairn::prelude::*;
use cairn::{InstanceStatus, LogKind, StepSelector, StepOutput};
use futures::StreamExt;
use serde_json::{Value, json};

/// `n` bytes of a repeating pattern, in items of `item` bytes.
fn items(n: usize, item: usize) -> Vec<Result<Vec<u8>, std::io::Error>> {
    let all: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
    all.chunks(item.max(1)).map(|c| Ok(c.to_vec())).collect()
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| b'a' + (i % 26) as u8).collect()
}

/// Streams `bytes` bytes (in items of 100,000), naps an hour (with `nap`), then returns
/// their length and a checksum as read back, counting the body's runs.
fn streaming(runs: Arc<AtomicU32>) -> FnWorkflow {
    wf(move |event, step| {
        let runs = runs.clone();
        async move {
            let n = event.payload["bytes"].as_u64().unwrap_or(0) as usize;
            let stream = step
                .run_stream("export", |_| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    async move { Ok(futures::stream::iter(items(n, 100_000))) }
                })
                .await?;
            if event.payload["nap"] == true {
                step.sleep("nap", "1 hour").await?;
            }
            let declared = stream.len();
            let mut read = 0u64;
            let mut sum = 0u64;
            let mut chunks = 0;
            let mut stream = stream;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                chunks += 1;
                read += chunk.len() as u64;
                sum = chunk
                    .iter()
                    .fold(sum, |s, b| s.wrapping_mul(31).wrapping_add(u64::from(*b)));
            }
            Ok(json!({ "declared": declared, "read": read, "sum": sum, "chunks": chunks }))
        }
    })
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0u64, |s, b| s.wrapping_mul(31).wrapping_add(u64::from(*b)))
}

#[tokio::test(start_paused = true)]
async fn s1_a_stream_is_persisted_in_chunks_and_read_back_from_the_store_once_run() {
    let runs = Arc::new(AtomicU32::new(0));
    let (_dir, path) = super::support::temp_db();
    let r = runs.clone();
    let engine = super::support::builder_at(&path)
        .register(streaming(r))
        .start()
        .await
        .unwrap();
    let n = 600_000;
    let instance = engine
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(json!({ "bytes": n, "nap": true })).id("s1"))
        .await
        .unwrap();
    instance
        .wait_for(|s| s.status == InstanceStatus::Waiting)
        .await
        .unwrap();
    // A new engine replays the instance: the stream comes from the store, the body does not
    // run again.
    engine.shutdown().await;
    let r = runs.clone();
    let engine = super::support::builder_at(&path)
        .register(streaming(r))
        .start()
        .await
        .unwrap();
    let instance = engine.workflow::<FnWorkflow>().get("s1").await.unwrap();
    let output = instance.wait().await.unwrap().output.unwrap();
    assert_eq!(output["declared"], n);
    assert_eq!(output["read"], n);
    // 256 KiB chunks: 262,144 + 262,144 + 75,712.
    assert_eq!(output["chunks"], 3);
    assert_eq!(output["sum"], checksum(&pattern(n)));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(instance.stream_storage().await.unwrap(), n as u64);

    // The whole output, read back from the store.
    let StepOutput::Stream(stream) = instance
        .step_output(&StepSelector::new("export"))
        .await
        .unwrap()
    else {
        panic!("not a stream")
    };
    assert_eq!(stream.len(), n as u64);
    assert_eq!(stream.read_to_end().await.unwrap(), pattern(n));
    let details = instance.details().await.unwrap();
    assert_eq!(details.steps[0].config["stream"], true);
    assert_eq!(details.steps[0].output.as_ref().unwrap().as_str().unwrap().len(), 1_024 + 18);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn s2_an_empty_stream_is_persisted_and_reads_back_empty() {
    let (engine, _dir) = engine(|b| b.register(streaming(Arc::default()))).await;
    let instance = run_to_end(&engine, json!({ "bytes": 0 })).await;
    let output = instance.status().await.unwrap().output.unwrap();
    assert_eq!(output, json!({ "declared": 0, "read": 0, "sum": 0, "chunks": 0 }));
    assert_eq!(instance.stream_storage().await.unwrap(), 0);
    let details = instance.details().await.unwrap();
    assert_eq!(details.steps[0].output, Some(json!("")));
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn s5_an_item_over_16_mib_fails_the_step_for_good() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            step.run_stream("huge", |_| async {
                Ok(futures::stream::iter(vec![Ok::<_, std::io::Error>(vec![
                    0u8;
                    cairn::MAX_STREAM_ITEM + 1
                ])]))
            })
            .retries(Retries::constant(3, Duration::from_secs(1)))
            .await?;
            Ok(Value::Null)
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Errored);
    let error = status.error.unwrap();
    assert_eq!(error.name, "NonRetryableError");
    assert!(error.message.contains("16 MiB"), "{}", error.message);
    assert_eq!(records(&instance, LogKind::AttemptStart).await.len(), 1);
    assert_eq!(instance.stream_storage().await.unwrap(), 0);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn s6_a_full_restart_removes_the_persisted_chunks() {
    let (engine, _dir) = engine(|b| b.register(streaming(Arc::default()))).await;
    let instance = run_to_end(&engine, json!({ "bytes": 300_000 })).await;
    assert_eq!(instance.stream_storage().await.unwrap(), 300_000);
    instance.restart().await.unwrap();
    instance.wait().await.unwrap();
    // The rerun wrote the stream again; the first run's chunks are gone.
    assert_eq!(instance.stream_storage().await.unwrap(), 300_000);
    instance.delete().await.unwrap();
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_attempt_leaves_no_chunks_and_the_retry_is_the_output() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let stream = step
                .run_stream("flaky export", |ctx| async move {
                    let mut parts = items(400_000, 50_000);
                    if ctx.attempt == 1 {
                        // Half the bytes, then the source fails.
                        parts.truncate(4);
                        parts.push(Err(std::io::Error::other("connection reset")));
                    }
                    Ok(futures::stream::iter(parts))
                })
                .retries(Retries::constant(2, Duration::from_secs(1)))
                .await?;
            Ok(json!(checksum(&stream.read_to_end().await?)))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.output, Some(json!(checksum(&pattern(400_000)))));
    assert_eq!(instance.stream_storage().await.unwrap(), 400_000);
    let failure = &records(&instance, LogKind::AttemptFailure).await[0];
    assert_eq!(failure.entry.meta["error"]["message"], "connection reset");
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn s14_a_stream_slower_than_its_timeout_fails_with_a_timeout_and_leaves_no_chunks() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            step.run_stream("slow export", |_| async {
                Ok(futures::stream::iter(0..10).then(|_| async {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Ok::<_, std::io::Error>(vec![7u8; 200_000])
                }))
            })
            .timeout(Duration::from_secs(3))
            .retries(Retries::constant(0, Duration::from_secs(1)))
            .await?;
            Ok(Value::Null)
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Errored);
    assert_eq!(status.error.unwrap().name, "WorkflowTimeoutError");
    // Two chunks' worth was written before the timeout; none of it is left.
    assert_eq!(instance.stream_storage().await.unwrap(), 0);
    let details = instance.details().await.unwrap();
    assert_eq!(details.steps[0].output, None);
    engine.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_stream_over_the_instance_storage_limit_fails_the_step_for_good() {
    let (engine, _dir) = engine(|b| {
        b.register(streaming(Arc::default()))
            .stream_storage_limit(1 << 20)
    })
    .await;
    let instance = run_to_end(&engine, json!({ "bytes": 2 << 20 })).await;
    let error = instance.status().await.unwrap().error.unwrap();
    assert_eq!(error.name, "NonRetryableError");
    assert!(
        error.message.contains("stream storage limit of 1048576 bytes"),
        "{}",
        error.message
    );
    assert_eq!(instance.stream_storage().await.unwrap(), 0);
    engine.shutdown().await;
}

/// Review finding: a retry in the same lifetime counted the bytes of the failed attempt,
/// whose chunks the failure had dropped, against the limit, and failed the step for good:
/// two attempts of 768 KiB under a 1 MiB limit, which never stores more than one of them.
#[tokio::test(start_paused = true)]
async fn a_retry_is_not_charged_the_storage_of_the_attempt_it_replaces() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let stream = step
                .run_stream("export", |ctx| async move {
                    let mut parts = items(768 << 10, 64 << 10);
                    if ctx.attempt == 1 {
                        parts.push(Err(std::io::Error::other("connection reset")));
                    }
                    Ok(futures::stream::iter(parts))
                })
                .retries(Retries::constant(2, Duration::from_millis(100)))
                .await?;
            Ok(json!(stream.read_to_end().await?.len()))
        }))
        .stream_storage_limit(1 << 20)
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Complete, "{:?}", status.error);
    assert_eq!(status.output, Some(json!(768 << 10)));
    assert_eq!(instance.stream_storage().await.unwrap(), 768 << 10);
    engine.shutdown().await;
}

/// Issue 30 §3: the limit counts what a stream has taken in, buffered or written: two items
/// of 250 KiB under a 300 KiB limit (the second would fill a chunk and leave the rest
/// buffered) fail the step instead of storing 500 KiB.
#[tokio::test(start_paused = true)]
async fn a_stream_whose_buffered_bytes_would_pass_the_storage_limit_fails() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let stream = step
                .run_stream("produce", |_| async {
                    Ok(futures::stream::iter(vec![
                        Ok::<_, std::io::Error>(vec![1u8; 250 << 10]),
                        Ok(vec![2u8; 250 << 10]),
                    ]))
                })
                .await?;
            Ok(json!(stream.len()))
        }))
        .stream_storage_limit(300 << 10)
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    let error = status.error.expect("the step failed");
    assert!(
        error.message.contains("stream storage limit of 307200 bytes"),
        "{}",
        error.message
    );
    assert!(instance.stream_storage().await.unwrap() <= 300 << 10);
    engine.shutdown().await;
}

/// A stream of `text` (or bytes), to see what the views show of it.
fn shown(payload: Vec<u8>, sensitive: bool) -> FnWorkflow {
    wf(move |_, step| {
        let payload = payload.clone();
        async move {
            let op = step.run_stream("produce", move |_| {
                let payload = payload.clone();
                async move { Ok(futures::stream::iter(vec![Ok::<_, std::io::Error>(payload)])) }
            });
            let op = if sensitive { op.sensitive() } else { op };
            let stream = op.await?;
            Ok(json!(stream.len()))
        }
    })
}

async fn views(payload: Vec<u8>, sensitive: bool) -> (Value, Value) {
    let (engine, _dir) = engine(|b| b.register(shown(payload, sensitive))).await;
    let instance = run_to_end(&engine, json!({})).await;
    let details = instance.details().await.unwrap();
    let logged = records(&instance, LogKind::StepSuccess).await[0].entry.meta["result"].clone();
    engine.shutdown().await;
    (details.steps[0].output.clone().unwrap(), logged)
}

#[tokio::test(start_paused = true)]
async fn s11_s12_s13_x4_views_show_a_preview_a_binary_summary_or_redacted() {
    // S11: a text stream shows as its text.
    let (detail, logged) = views("héllo stream".as_bytes().to_vec(), false).await;
    assert_eq!(detail, json!("héllo stream"));
    assert_eq!(logged, json!("héllo stream"));
    // S12: past 1,024 characters it is cut and marked.
    let long = "é".repeat(1_500);
    let (detail, _) = views(long.as_bytes().to_vec(), false).await;
    let text = detail.as_str().unwrap();
    assert_eq!(text, format!("{}[truncated output]", "é".repeat(1_024)));
    // S13: bytes that are not UTF-8 show as a size.
    let (detail, logged) = views(vec![0xff, 0xfe, 0x00, 0x41], false).await;
    assert_eq!(detail, json!("[ReadableStream (binary): 4 bytes]"));
    assert_eq!(logged, detail);
    // X4: a sensitive stream is redacted everywhere.
    let (detail, logged) = views(b"secret".to_vec(), true).await;
    assert_eq!((detail, logged), (json!("[REDACTED]"), json!("[REDACTED]")));
}

/// Found by review: a store error while workflow code read a stream reached the workflow as
/// an error (a replay would have read the bytes fine). It now stops the run, which is
/// replayed.
#[tokio::test(start_paused = true)]
async fn a_store_error_while_reading_a_stream_stops_the_run_instead_of_failing_it() {
    let (_dir, path) = super::support::temp_db();
    let failures = Arc::new(AtomicU32::new(0));
    let f = failures.clone();
    let engine = super::support::hooked_builder(&path, move |method| {
        if method == "stream_chunk" && f.fetch_add(1, Ordering::SeqCst) < 2 {
            return Err(cairn::store::Error::Unavailable("injected".into()));
        }
        Ok(())
    })
    .clock(cairn::Clock::virtual_now())
    .register(streaming(Arc::default()))
    .start()
    .await
    .unwrap();
    let instance = run_to_end(&engine, json!({ "bytes": 300_000 })).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.status, InstanceStatus::Complete, "{:?}", status.error);
    assert_eq!(status.output.unwrap()["read"], 300_000);
    assert!(failures.load(Ordering::SeqCst) >= 2);
    engine.shutdown().await;
}

/// Found by review: a stream step that lost a `select!` kept its chunks for good.
#[tokio::test(start_paused = true)]
async fn a_cancelled_stream_step_leaves_no_chunks() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let slow = step.run_stream("slow export", |_| async {
                Ok(futures::stream::iter(0..10).then(|_| async {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Ok::<_, std::io::Error>(vec![1u8; 300_000])
                }))
            });
            let quick = step.sleep("deadline", Duration::from_millis(3_500));
            tokio::select! {
                _ = slow => Ok(json!("stream")),
                _ = quick => Ok(json!("deadline")),
            }
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    assert_eq!(instance.status().await.unwrap().output, Some(json!("deadline")));
    let details = instance.details().await.unwrap();
    assert!(details.steps.iter().any(|s| s.cancelled), "{:?}", details.steps);
    assert_eq!(instance.stream_storage().await.unwrap(), 0);
    engine.shutdown().await;
}

/// Found by review: after a restart a reader of the old run's output could get the new
/// run's chunks (attempts start at 1 again). Chunks are keyed by the lease epoch too.
#[tokio::test(start_paused = true)]
async fn a_reader_of_an_output_a_restart_replaced_gets_an_error_not_the_new_bytes() {
    let (engine, _dir) = engine(|b| b.register(streaming(Arc::default()))).await;
    let instance = run_to_end(&engine, json!({ "bytes": 600_000 })).await;
    let StepOutput::Stream(mut old) = instance
        .step_output(&StepSelector::new("export"))
        .await
        .unwrap()
    else {
        panic!("not a stream")
    };
    assert!(old.next().await.unwrap().is_ok());
    instance.restart().await.unwrap();
    instance.wait().await.unwrap();
    let next = old.next().await.unwrap();
    assert!(next.is_err(), "read the new run's bytes");
    assert!(old.next().await.is_none(), "the stream ends after its error");
    engine.shutdown().await;
}

/// SPEC S8 in its Rust form: items of any byte type, in any sizes, come back as the same
/// bytes, in 256 KiB chunks.
#[tokio::test(start_paused = true)]
async fn s8_items_of_any_byte_type_come_back_as_the_same_bytes() {
    /// Samples as little-endian bytes, in items that do not line up with chunks.
    fn samples() -> Vec<u8> {
        (0..150_000i32)
            .flat_map(|i| ((i * 7 - 500_000) as i16).to_le_bytes())
            .collect()
    }
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let text = step
                .run_stream("text", |_| async {
                    let lines = (0..10_000).map(|i| Ok::<_, std::io::Error>(format!("{i}\n")));
                    Ok(futures::stream::iter(lines))
                })
                .await?
                .read_to_end()
                .await?;
            let raw = step
                .run_stream("samples", |_| async {
                    let items: Vec<Result<bytes::Bytes, std::io::Error>> = samples()
                        .chunks(100_003)
                        .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
                        .collect();
                    Ok(futures::stream::iter(items))
                })
                .await?;
            let mut chunks = Vec::new();
            let mut raw = raw;
            let mut read = Vec::new();
            while let Some(chunk) = raw.next().await {
                let chunk = chunk?;
                chunks.push(chunk.len());
                read.extend_from_slice(&chunk);
            }
            let expected: String = (0..10_000).map(|i| format!("{i}\n")).collect();
            Ok(json!({
                "text": text == expected.into_bytes(),
                "samples": read == samples(),
                "chunks": chunks,
            }))
        }))
    })
    .await;
    let instance = run_to_end(&engine, json!({})).await;
    let status = instance.status().await.unwrap();
    assert_eq!(
        status.output,
        Some(json!({ "text": true, "samples": true, "chunks": [262_144, 37_856] })),
        "{:?}",
        status.error
    );
    engine.shutdown().await;
}

/// Review finding: a sleep that lost a race was cancelled with the chunks of its name and
/// count, which are a `run` step's when one has the same name: chunks are not kept by
/// kind. The stream step's output, succeeded and stored, was gone on the next replay.
#[tokio::test(start_paused = true)]
async fn a_cancelled_sleep_keeps_the_chunks_of_a_stream_step_of_the_same_name() {
    let (engine, _dir) = engine(|b| {
        b.register(wf(|_, step| async move {
            let stream = step
                .run_stream("report", |_| async move {
                    Ok(futures::stream::iter(items(300_000, 100_000)))
                })
                .await?;
            tokio::select! {
                biased;
                slept = step.sleep("report", "1 day") => { slept?; }
                event = step.wait_for_event::<Value>("ack", "ack").timeout("7 days") => { event?; }
            }
            step.wait_for_event::<Value>("go", "go")
                .timeout("30 days")
                .await?;
            let mut read = Vec::new();
            let mut stream = stream;
            while let Some(chunk) = stream.next().await {
                read.extend(chunk?);
            }
            Ok(json!(read == pattern(300_000)))
        }))
    })
    .await;
    let instance = engine
        .workflow::<FnWorkflow>()
        .create(CreateOptions::new(json!({})))
        .await
        .unwrap();
    super::support::until_logged(&instance, LogKind::WaitStart, 1).await;
    instance.send_event("ack", &json!({})).await.unwrap();
    super::support::until_logged(&instance, LogKind::WaitStart, 2).await;
    super::support::until_status(&instance, InstanceStatus::Waiting).await;
    // Woken by "go", the replay reads the stream back from its chunks.
    instance.send_event("go", &json!({})).await.unwrap();
    // Bounded: the replay of a stream whose chunks are gone waits for them.
    super::support::until_status_within_hours(&instance, InstanceStatus::Complete, 48).await;
    let status = instance.status().await.unwrap();
    assert_eq!(status.output, Some(json!(true)), "the stream read back whole");
    engine.shutdown().await;
}

/// Review finding: a chunk read the workflow stopped awaiting (its `next()` lost a
/// `select!`) held the instance's activity until polled again, so a long sleep after it
/// never hibernated: the lease and a running slot were held for the whole sleep.
#[tokio::test(start_paused = true)]
async fn an_abandoned_chunk_read_does_not_keep_the_instance_from_hibernating() {
    let (engine, _dir) = engine(|b| {
        b.hibernate_after(Duration::ZERO)
            .register(wf(|_, step| async move {
                let mut stream = step
                    .run_stream("export", |_| async {
                        Ok(futures::stream::iter(items(600_000, 100_000)))
                    })
                    .await?;
                let read_first = tokio::select! {
                    biased;
                    _ = stream.next() => true,
                    () = tokio::time::sleep(Duration::ZERO) => false,
                };
                step.sleep("long", Duration::from_secs(3600)).await?;
                Ok(json!([read_first, stream.read_to_end().await?.len()]))
            }))
    })
    .await;
    let instance = engine
        .workflow::<FnWorkflow<0>>()
        .create(CreateOptions::new(json!({})))
        .await
        .unwrap();
    // Hibernated (waiting), long before the sleep is over.
    tokio::time::timeout(
        Duration::from_secs(600),
        instance.wait_for(|s| s.status == InstanceStatus::Waiting),
    )
    .await
    .expect("hibernated for the sleep")
    .unwrap();
    let status = instance.wait().await.unwrap();
    assert_eq!(status.output, Some(json!([false, 600_000])), "the timer won");
    engine.shutdown().await;
}
