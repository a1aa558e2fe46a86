//! What a new engine makes of what a dead one left.

use std::time::Duration;

use cairn_core::{
    InstanceId, InstanceStatus, LogEntry, LogKind, StepKey, StepKind, StepRecord, StepState,
    Timestamp, WorkflowName,
};
use cairn_sqlite::{Options, SqliteStore};
use cairn_store::conformance::new_instance;
use cairn_store::{ControlRequest, Store, Write};

const T0: Timestamp = Timestamp::from_millis(1_700_000_000_000);

fn at(secs: u64) -> Timestamp {
    T0.saturating_add(Duration::from_secs(secs))
}

fn entry(kind: LogKind, when: Timestamp) -> LogEntry {
    LogEntry {
        kind,
        at: when,
        step: None,
        meta: serde_json::json!({}),
    }
}

/// A store on a new database at `db` with one instance, `w`/`i`, claimed by an engine
/// that is about to die: the store, and the instance's lease.
async fn one_claimed_instance(db: &std::path::Path) -> (SqliteStore, cairn_store::Lease) {
    let w = WorkflowName::new("w").unwrap();
    let store = SqliteStore::open(db, Options::default()).unwrap();
    store.create(vec![new_instance("w", "i")]).await.unwrap();
    let lease = store
        .claim("dead", &[w], T0, Duration::MAX, 1)
        .await
        .unwrap()[0]
        .lease;
    (store, lease)
}

/// An engine dies in `waitingForPause`; the next one completes the pause at open. The
/// instance ran on after the pause was requested (here until 60 s), so on resume its timers
/// shift by the time since its last record, not since the request (10 s): before, they
/// shifted 50 s too far.
#[tokio::test]
async fn a_pause_completed_by_recovery_shifts_timers_from_the_last_record() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let (w, id) = (
        WorkflowName::new("w").unwrap(),
        InstanceId::new("i").unwrap(),
    );
    let (store, lease) = one_claimed_instance(&db).await;
    let key = StepKey {
        kind: StepKind::Sleep,
        name: "nap".into(),
        count: 1,
    };
    store
        .control(&w, &id, ControlRequest::Pause { at: at(10) })
        .await
        .unwrap();
    // The lifetime goes on until 60 s: it starts a sleep due at 200 s.
    store
        .commit(
            lease,
            vec![
                Write::Step(StepRecord {
                    key: key.clone(),
                    seq: 1,
                    state: StepState::Running,
                    config: serde_json::json!({}).into(),
                    attempts: 0,
                    in_flight: false,
                    wake_at: Some(at(200)),
                    output: None,
                    error: None,
                    started_at: at(60),
                    ended_at: None,
                    has_rollback: false,
                }),
                Write::Log(entry(LogKind::StepStart, at(60))),
            ],
        )
        .await
        .unwrap();
    drop(store); // the engine dies without completing the pause
    let store = SqliteStore::open(&db, Options::default()).unwrap();
    let rec = store.instance(&w, &id).await.unwrap().unwrap();
    assert_eq!(rec.status, InstanceStatus::Paused);
    let paused: Vec<_> = store
        .log(rec.instance, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|l| l.entry.kind == LogKind::WorkflowPaused)
        .collect();
    assert_eq!(paused.len(), 1, "the pause that took effect is logged");
    assert_eq!(paused[0].entry.at, at(60));
    store
        .control(&w, &id, ControlRequest::Resume { at: at(100) })
        .await
        .unwrap();
    let journal = store.journal(rec.instance).await.unwrap();
    assert_eq!(
        journal[0].wake_at,
        Some(at(240)),
        "paused from 60 s to 100 s: the 200 s wake-up moves 40 s"
    );
    store.close().await;
}

/// The take-over at open is one transaction: failing half-way (here the pause it completes
/// cannot be logged), it changes nothing, and the next open does it whole. Before, each of
/// its statements committed alone: the instance was left paused without its
/// `WORKFLOW_PAUSED` record (a keyed one holding its slot), and no later open looked at it
/// again, since it was no longer waiting for its pause.
#[tokio::test]
async fn a_take_over_that_fails_half_way_changes_nothing_and_the_next_open_does_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let (w, id) = (
        WorkflowName::new("w").unwrap(),
        InstanceId::new("i").unwrap(),
    );
    let (store, _) = one_claimed_instance(&db).await;
    store
        .control(&w, &id, ControlRequest::Pause { at: at(10) })
        .await
        .unwrap();
    drop(store); // the engine dies without completing the pause
    let status = |conn: &rusqlite::Connection| -> i64 {
        conn.query_row("SELECT status FROM instances", [], |r| r.get(0))
            .unwrap()
    };
    let conn = rusqlite::Connection::open(&db).unwrap();
    let waiting = status(&conn);
    assert_eq!(waiting, InstanceStatus::WaitingForPause.code());
    conn.execute_batch(&format!(
        "CREATE TRIGGER refuse_the_pause BEFORE INSERT ON log WHEN NEW.kind = {}
         BEGIN SELECT RAISE(ABORT, 'the disk is full'); END;",
        LogKind::WorkflowPaused.code()
    ))
    .unwrap();
    drop(conn);
    let refused = SqliteStore::open(&db, Options::default()).err().unwrap();
    assert!(
        refused.to_string().contains("the disk is full"),
        "{refused}"
    );
    let conn = rusqlite::Connection::open(&db).unwrap();
    assert_eq!(
        status(&conn),
        waiting,
        "the failed take-over changed the instance"
    );
    conn.execute_batch("DROP TRIGGER refuse_the_pause").unwrap();
    drop(conn);

    let store = SqliteStore::open(&db, Options::default()).unwrap();
    let rec = store.instance(&w, &id).await.unwrap().unwrap();
    assert_eq!(rec.status, InstanceStatus::Paused);
    let paused = store
        .log(rec.instance, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|l| l.entry.kind == LogKind::WorkflowPaused)
        .count();
    assert_eq!(paused, 1, "the pause that took effect is logged");
    store.close().await;
}

/// A writer the test can read back: what the log subscriber wrote.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Leaves at `db` what an engine that died leaves: two instances claimed, one of them with
/// an attempt in flight.
async fn left_by_a_dead_engine(db: &std::path::Path) {
    let store = SqliteStore::open(db, Options::default()).unwrap();
    let w = WorkflowName::new("w").unwrap();
    for id in ["a", "b"] {
        store.create(vec![new_instance("w", id)]).await.unwrap();
    }
    let claimed = store
        .claim("dead", std::slice::from_ref(&w), T0, Duration::MAX, 2)
        .await
        .unwrap();
    // One of them has an attempt in flight.
    store
        .commit(
            claimed[0].lease,
            vec![Write::Step(StepRecord {
                key: StepKey {
                    kind: StepKind::Run,
                    name: "s".into(),
                    count: 1,
                },
                seq: 1,
                state: StepState::Running,
                config: serde_json::json!({}).into(),
                attempts: 1,
                in_flight: true,
                wake_at: None,
                output: None,
                error: None,
                started_at: T0,
                ended_at: None,
                has_rollback: false,
            })],
        )
        .await
        .unwrap();
    store.close().await;
    drop(store);
}

/// Opening a database a dead engine held logs what it recovers: the instances it ran and
/// the attempts it left unrecorded (to be recorded as interrupted and retried). The log is
/// captured even when another thread, with no subscriber, reaches its callsite first (as
/// another test in this binary may): that switched the log off for good once, on CI.
#[tokio::test]
async fn opening_after_a_crash_logs_what_is_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let elsewhere = dir.path().join("elsewhere.db");
    left_by_a_dead_engine(&db).await;
    left_by_a_dead_engine(&elsewhere).await;
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // With a single registered dispatcher, tracing caches a callsite's interest from the
    // default of the first thread to reach it: here the thread below, with none ("never",
    // for good; one run in four on one core when it was another test's). A second live
    // dispatcher, registered first, makes the interest the union of all of them, decided
    // per thread at each event.
    let _union = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let guard = tracing::subscriber::set_default(subscriber);
    let other = std::thread::spawn(move || SqliteStore::open(&elsewhere, Options::default()))
        .join()
        .unwrap()
        .unwrap();
    let reopened = SqliteStore::open(&db, Options::default()).unwrap();
    drop(guard);
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("recovered the instances a previous engine was running")
            && text.contains("instances=2")
            && text.contains("interrupted_attempts=1"),
        "{text}"
    );
    // Only this thread's open was captured.
    assert_eq!(text.matches("recovered the instances").count(), 1, "{text}");
    other.close().await;
    reopened.close().await;
}

/// A store opened to look (the replay check) neither migrates a database of another schema
/// version (it refuses it, leaving it as it was) nor takes a dead engine's leases over.
#[test]
fn a_check_only_open_refuses_another_schema_version_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cairn.db");
    drop(SqliteStore::open(&path, Options::default()).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    let current: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    conn.pragma_update(None, "user_version", current - 1)
        .unwrap();
    drop(conn);
    let mut check = Options::default();
    check.check_only = true;
    let refused = SqliteStore::open(&path, check.clone()).err().unwrap();
    assert!(
        refused.to_string().contains("does not migrate"),
        "{refused}"
    );
    let conn = rusqlite::Connection::open(&path).unwrap();
    let after: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(after, current - 1, "not migrated");
    conn.pragma_update(None, "user_version", current).unwrap();
    drop(conn);
    assert!(SqliteStore::open(&path, check).is_ok());
}
