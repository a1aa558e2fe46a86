//! One engine per database, whatever path it is reached by.

use std::time::Duration;

use cairn_sqlite::{Options, SqliteStore};

fn quick() -> Options {
    Options::default().lock_timeout(Duration::from_millis(50))
}

#[tokio::test]
async fn the_engine_lock_holds_through_a_symlink_and_a_hard_link() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let first = SqliteStore::open(&db, quick()).unwrap();
    let symlink = dir.path().join("symlink.db");
    std::os::unix::fs::symlink(&db, &symlink).unwrap();
    let hard = dir.path().join("hard.db");
    std::fs::hard_link(&db, &hard).unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let elsewhere = other_dir.path().join("symlinked-dir");
    std::os::unix::fs::symlink(dir.path(), &elsewhere).unwrap();
    for alias in [
        symlink.clone(),
        hard.clone(),
        elsewhere.join("cairn.db"),
        db.clone(),
    ] {
        let err = SqliteStore::open(&alias, quick()).expect_err("a second engine on the same file");
        assert!(err.to_string().contains("in use"), "{alias:?}: {err}");
    }
    first.close().await;
    // Released at close: any alias opens now.
    let again = SqliteStore::open(&hard, quick()).unwrap();
    again.close().await;
}
