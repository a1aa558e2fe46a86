//! Crash consistency of stream steps: a child process running 12 instances of "stream 600 KB
//! (six items, a few milliseconds apart), read it back" is SIGKILLed at seeded random
//! moments (at least 20 times), mostly in the middle of the chunk writes, and restarted on
//! the same database. After the last run: every instance completed with the full stream
//! read back exactly, its storage holds that stream's bytes and nothing of an interrupted
//! attempt's, and no committed step body ran again.
//!
//! The child is this test binary, run again with `CAIRN_CRASH_CHILD` set.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::{FnWorkflow, wf};
use cairn::InstanceStatus;
use cairn::prelude::*;
use serde_json::json;

const INSTANCES: usize = 12;
const KILLS: usize = 20;
const ITEMS: usize = 6;
const ITEM: usize = 100_000;

fn item(i: usize) -> Vec<u8> {
    (0..ITEM).map(|j| ((i * 31 + j) % 253) as u8).collect()
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0u64, |s, b| s.wrapping_mul(31).wrapping_add(u64::from(*b)))
}

fn expected() -> u64 {
    checksum(&(0..ITEMS).flat_map(item).collect::<Vec<u8>>())
}

fn workflow(effects: PathBuf) -> FnWorkflow {
    wf(move |event, step| {
        let effects = effects.clone();
        async move {
            let id = event.instance_id.to_string();
            let stream = step
                .run_stream("export", |ctx: StepContext| {
                    crate::support::append_line(&effects, &format!("{id} export {}", ctx.attempt));
                    async move {
                        Ok(futures::stream::iter(0..ITEMS).map(|i| {
                            // 12 instances × 6 items × 4 ms, serial on one thread, outlast 20
                            // kill intervals of at most 25 ms.
                            std::thread::sleep(Duration::from_millis(4));
                            Ok::<_, std::io::Error>(item(i))
                        }))
                    }
                })
                .retries(Retries::constant(30, Duration::from_secs(1)))
                .await?;
            let bytes = stream.read_to_end().await?;
            Ok(json!({ "len": bytes.len(), "sum": checksum(&bytes) }))
        }
    })
}

use futures::StreamExt as _;

#[test]
fn child_process_entry_streams() {
    let Some(dir) = crate::support::crash_child_dir() else {
        return; // not a child: nothing to do in a normal test run
    };
    let rt = crate::support::paused_runtime();
    rt.block_on(async {
        let engine = crate::support::builder_at(&dir.join("cairn.db"))
            .register(workflow(dir.join("effects.txt")))
            .start()
            .await
            .unwrap();
        let client = engine.workflow::<FnWorkflow>();
        crate::support::create_numbered(&client, INSTANCES).await;
        crate::support::wait_numbered(&client, INSTANCES).await;
        engine.shutdown().await;
    });
}

#[test]
fn killed_while_writing_streams_every_stream_is_whole_once_and_no_chunk_is_left_over() {
    let seed = crate::support::test_seed("crash_kill_streams");
    let dir = tempfile::tempdir().unwrap();
    let kills = crate::support::kill_repeatedly(
        dir.path(),
        "crash_kill_streams::child_process_entry_streams",
        seed,
        KILLS,
        25,
    );
    assert!(kills >= KILLS, "only {kills} kills landed");

    let runs = crate::support::read_effects(&dir.path().join("effects.txt"));
    let rt = crate::support::paused_runtime();
    rt.block_on(async {
        let engine = crate::support::builder_at(&dir.path().join("cairn.db"))
            .register(workflow(dir.path().join("unused.txt")))
            .start()
            .await
            .unwrap();
        let client = engine.workflow::<FnWorkflow>();
        let mut interrupted = 0;
        for i in 0..INSTANCES {
            let instance = client.get(&format!("i{i}")).await.unwrap();
            let status = instance.status().await.unwrap();
            assert_eq!(status.status, InstanceStatus::Complete, "i{i}");
            assert_eq!(
                status.output,
                Some(json!({ "len": ITEMS * ITEM, "sum": expected() })),
                "i{i} read its whole stream"
            );
            assert_eq!(
                instance.stream_storage().await.unwrap(),
                (ITEMS * ITEM) as u64,
                "i{i}: chunks of an interrupted attempt were left over"
            );
            let details = instance.details().await.unwrap();
            interrupted += details.steps[0].attempts.len() - 1;
            crate::support::assert_no_body_reran(&runs, &details);
        }
        eprintln!("{interrupted} stream attempts were interrupted and cleaned up");
        assert!(interrupted > 0, "no kill landed in a stream write");
        engine.shutdown().await;
    });
}
