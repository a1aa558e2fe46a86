//! A consistent copy of a live database, taken without stopping the engine that writes it
//! (`cairn backup`): SQLite's online backup API, in one step, under one read transaction,
//! so the copy is the database as of one commit. In WAL mode writers go on meanwhile; a
//! backup taken page by page across several steps would restart at every write of another
//! connection and might never finish under load.
//!
//! An engine at `Durability::Full` answers a commit once its syncer thread has synced the
//! WAL, a moment after the commit is visible: the copy may hold commits not yet synced. So
//! once copied, the live WAL is synced here too, and the copy holds nothing that power loss
//! could still take from the live database. One case this sync cannot see: after the
//! engine's own sync failed (its store then stops, and says so in its log), Linux may
//! report this later sync as successful for pages whose write-back failed, and the copy
//! may hold commits the engine answered with an error. Take backups from an engine
//! whose store has not stopped.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

/// What a backup copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backup {
    /// Pages copied.
    pub pages: u64,
    /// The copy's size in bytes.
    pub bytes: u64,
}

/// Copies the database at `from` into the new file `to` (never over an existing one),
/// then checks the copy (`PRAGMA integrity_check`) and that it holds Cairn's schema.
///
/// # Errors
/// When `to` exists, `from` cannot be read, or the copy does not check out (the partial
/// copy is removed).
pub fn backup(from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<Backup, String> {
    let (from, to) = (from.as_ref(), to.as_ref());
    if to.exists() {
        return Err(format!(
            "{} exists: a backup never overwrites a file",
            to.display()
        ));
    }
    if !from.exists() {
        return Err(format!("no database at {}", from.display()));
    }
    let copied = copy(from, to).and_then(|pages| check(to).map(|()| pages));
    match copied {
        Ok(pages) => Ok(Backup {
            pages,
            bytes: std::fs::metadata(to).map(|m| m.len()).unwrap_or(0),
        }),
        Err(e) => {
            let _ = std::fs::remove_file(to);
            Err(e)
        }
    }
}

fn copy(from: &Path, to: &Path) -> Result<u64, String> {
    let source = Connection::open_with_flags(
        from,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("open {}: {e}", from.display()))?;
    // The engine's writer holds the database only for a commit at a time.
    source
        .busy_timeout(std::time::Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    let mut target = Connection::open(to).map_err(|e| format!("create {}: {e}", to.display()))?;
    let backup = rusqlite::backup::Backup::new(&source, &mut target)
        .map_err(|e| format!("start the backup: {e}"))?;
    // Every page in one step: one read transaction, one moment.
    match backup.step(-1).map_err(|e| format!("copy: {e}"))? {
        rusqlite::backup::StepResult::Done => {}
        other => return Err(format!("the copy did not finish ({other:?}); try again")),
    }
    let pages = backup.progress().pagecount;
    sync_wal(from)?;
    Ok(u64::try_from(pages).unwrap_or(0))
}

/// Syncs the live database's WAL, if there is one (the module's doc).
fn sync_wal(db: &Path) -> Result<(), String> {
    let wal = crate::syncer::wal_of(db).map_err(|e| format!("resolve {}: {e}", db.display()))?;
    match std::fs::File::open(&wal) {
        Ok(file) => file
            .sync_data()
            .map_err(|e| format!("sync the live database's log: {e}")),
        // No connection has the database open (the last one to close deletes the WAL).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("open the live database's log: {e}")),
    }
}

fn check(path: &Path) -> Result<(), String> {
    let copy = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| format!("open the copy: {e}"))?;
    let verdict: String = copy
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(|e| format!("check the copy: {e}"))?;
    if verdict != "ok" {
        return Err(format!(
            "the copy fails SQLite's integrity check: {verdict}"
        ));
    }
    let instances: i64 = copy
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'instances'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| format!("read the copy: {e}"))?;
    if instances != 1 {
        return Err(format!("{} holds no Cairn database", path.display()));
    }
    Ok(())
}
