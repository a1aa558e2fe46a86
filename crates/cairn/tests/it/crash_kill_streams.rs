//! Crash consistency of stream steps: a child process running 12 instances of "stream 600 KB
//! (six items, a few milliseconds apart), read it back" is SIGKILLed in the middle of a
//! stream write (three times: the child says when it is there, after a chunk was written,
//! and waits to be killed), then at seeded random moments (up to 17 times more), and
//! restarted on the same database. After the last run: every instance completed with the
//! full stream read back exactly, its storage holds that stream's bytes and nothing of an
//! interrupted attempt's, and no committed step body ran again.
//!
//! The child is this test binary, run again with `CAIRN_CRASH_CHILD` set (and
//! `CAIRN_CRASH_HOLD`, a file to create when it is inside a stream write, for the kills that
//! must land there: whatever the machine's load, they do).

use std::path::PathBuf;
use std::time::Duration;

use crate::support::{FnWorkflow, wf};
use cairn::InstanceStatus;
use cairn::prelude::*;
use serde_json::json;

const INSTANCES: usize = 12;
/// Kills inside a stream write, each at the child's signal.
const HELD_KILLS: usize = 3;
/// Kills at random moments after them.
const RANDOM_KILLS: usize = 17;
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
                            if i == HOLD_AT {
                                hold_if_asked();
                            }
                            // 12 instances × 6 items × 4 ms, serial on one thread, outlast 17
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

/// The item before which a child asked to hold does so: the first 256 KiB chunk (items 0 to
/// 2) has been cut and written by then, and the attempt has not ended.
const HOLD_AT: usize = 3;

/// In a child run with `CAIRN_CRASH_HOLD` set (the first time only): creates that file and
/// waits to be killed, inside the stream write.
fn hold_if_asked() {
    let Some(marker) = std::env::var_os("CAIRN_CRASH_HOLD").map(PathBuf::from) else {
        return;
    };
    if std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&marker)
        .is_err()
    {
        return; // held once already in this run
    }
    // The parent kills the process on seeing the file; it never gets past this.
    std::thread::sleep(Duration::from_secs(120));
    panic!("the parent never killed the child holding inside a stream write");
}

/// Runs the child on `dir` with `CAIRN_CRASH_HOLD` set and SIGKILLs it once it says it is
/// inside a stream write, `kills` times. Returns how many landed there (all, unless a run
/// finished every instance without writing a stream).
fn kill_inside_stream_writes(dir: &std::path::Path, kills: usize) -> usize {
    use std::process::{Command, Stdio};
    let mut landed = 0;
    for k in 0..kills {
        let marker = dir.join(format!("holding-{k}"));
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "crash_kill_streams::child_process_entry_streams",
                "--exact",
                "--test-threads=1",
            ])
            .env("CAIRN_CRASH_CHILD", dir)
            .env("CAIRN_CRASH_HOLD", &marker)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        // Waits for the child's signal (or its end), however slow the machine.
        let since = std::time::Instant::now();
        loop {
            if marker.exists() {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                landed += 1;
                break;
            }
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "child failed: {status}");
                break; // every stream was written already
            }
            assert!(
                since.elapsed() < Duration::from_secs(300),
                "the child neither held in a stream write nor finished"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    landed
}

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
    // The first run starts on an empty database: its kill lands in a stream write, so at
    // least one attempt is interrupted there, on any machine.
    let held = kill_inside_stream_writes(dir.path(), HELD_KILLS);
    assert!(held >= 1, "no kill landed in a stream write");
    let random = crate::support::kill_repeatedly(
        dir.path(),
        "crash_kill_streams::child_process_entry_streams",
        seed,
        RANDOM_KILLS,
        25,
    );
    eprintln!("{held} kills inside a stream write, {random} at random moments");

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
        assert!(
            interrupted >= held,
            "each kill inside a stream write interrupted an attempt: {interrupted} < {held}"
        );
        engine.shutdown().await;
    });
}
