//! A test's new database, copied from one migrated once per process.
//!
//! Migrating an empty SQLite database runs every migration's DDL in turn (table rebuilds
//! included): about 12 ms of CPU in a test build, a third of one simulated run, paid again
//! by every run of every seed. A copy of the migrated file costs a write. The copy is the
//! schema the migrations make, not a second description of it: the template is made by
//! opening a store, as any database is.

use std::path::Path;
use std::sync::OnceLock;

/// The bytes of an empty, migrated database (`None`: making it failed, and each test
/// migrates its own database as it would without a template).
static TEMPLATE: OnceLock<Option<Vec<u8>>> = OnceLock::new();

/// Puts an empty, migrated database at `path` unless a file is there already (a reopened
/// test keeps its database). Blocks (file IO; the first call migrates): call it from
/// `spawn_blocking`. When anything fails, nothing is left at `path` and the store's own
/// open migrates as usual.
pub(crate) fn create(path: &Path) {
    if path.exists() {
        return;
    }
    if let Some(bytes) = TEMPLATE.get_or_init(migrated)
        && std::fs::write(path, bytes).is_err()
    {
        let _ = std::fs::remove_file(path);
    }
}

/// A database migrated by a store's own open, copied consistently (the online backup,
/// which also checks the copy) while that store holds it.
fn migrated() -> Option<Vec<u8>> {
    let dir = tempfile::tempdir().ok()?;
    let (db, copy) = (dir.path().join("cairn.db"), dir.path().join("template.db"));
    let store = cairn_sqlite::SqliteStore::open(&db, cairn_sqlite::Options::default()).ok()?;
    let copied = cairn_sqlite::backup(&db, &copy);
    drop(store);
    copied.ok()?;
    std::fs::read(&copy).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The template is made (a failure would only slow every test down, unnoticed) and a
    /// new database is the schema this build writes: a store opens it without migrating
    /// (`check_only` refuses any other schema version). A file already there is kept.
    #[test]
    fn a_new_test_database_has_this_builds_schema_without_a_migration() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cairn.db");
        create(&path);
        assert!(
            TEMPLATE.get().is_some_and(Option::is_some),
            "no template was made: every test migrates its own database"
        );
        let mut options = cairn_sqlite::Options::default();
        options.check_only = true;
        let store = cairn_sqlite::SqliteStore::open(&path, options)
            .unwrap_or_else(|e| panic!("the copy is not this build's schema: {e}"));
        drop(store);

        let kept = dir.path().join("kept.db");
        std::fs::write(&kept, b"not replaced").unwrap();
        create(&kept);
        assert_eq!(std::fs::read(&kept).unwrap(), b"not replaced");
    }
}
