//! The write-ahead log stays bounded: cut back after a burst, empty after a clean close.

use std::path::Path;

use cairn_core::WorkflowName;
use cairn_sqlite::{Options, SqliteStore};
use cairn_store::{NewInstance, Store};

fn wal_len(db: &Path) -> u64 {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0)
}

fn instance(n: usize, params_len: usize) -> NewInstance {
    NewInstance {
        params: format!("\"{}\"", "x".repeat(params_len)),
        ..cairn_store::conformance::new_instance("w", &format!("i{n}"))
    }
}

#[tokio::test]
async fn the_wal_is_bounded_and_truncated_at_shutdown() {
    const LIMIT: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("wal.db");
    let store = SqliteStore::open(&db, Options::default().wal_size_limit(LIMIT)).unwrap();
    // A burst: one transaction of 16 MiB grows the WAL far past the limit.
    let burst: Vec<NewInstance> = (0..16).map(|n| instance(n, 1 << 20)).collect();
    store.create(burst).await.unwrap();
    let peak = wal_len(&db);
    assert!(
        peak > 8 * LIMIT,
        "the burst should grow the WAL: {peak} bytes"
    );
    // Small writes after it: the automatic checkpoint runs, the WAL restarts and is cut
    // back to the limit instead of keeping its peak size.
    for n in 100..110 {
        store.create(vec![instance(n, 10)]).await.unwrap();
    }
    let after = wal_len(&db);
    assert!(
        after <= LIMIT + (64 << 10),
        "after the burst the WAL should be cut back to {LIMIT} bytes, is {after} (peak {peak})"
    );
    store.close().await;
    assert_eq!(wal_len(&db), 0, "a clean close leaves an empty WAL");
    // Nothing was lost by the checkpoint.
    let store = SqliteStore::open(&db, Options::default()).unwrap();
    let listed = store
        .list(cairn_store::ListQuery {
            workflow: Some(WorkflowName::new("w").unwrap()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.len(), 26);
    store.close().await;
}
