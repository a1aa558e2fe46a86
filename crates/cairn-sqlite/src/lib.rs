//! Cairn's embedded store: SQLite in WAL mode behind one writer thread with group commit.
//!
//! [`SqliteStore::open`] creates or opens a database file, takes an exclusive lock on the
//! file itself (one engine per database, whatever path reaches it), migrates the schema, and takes over the leases of
//! the previous owner (which held the lock and so must be dead): their running instances
//! become claimable at once.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let store = cairn_sqlite::SqliteStore::open(dir.path().join("cairn.db"), Default::default())?;
//! store.close().await;
//! # Ok(()) }
//! ```

mod backup;
mod held;
mod history;
mod job;
#[cfg(test)]
mod plans;
mod raw;
mod rows;
mod schema;
mod slots;
mod streams;
mod syncer;
mod worker;

pub use backup::{Backup, backup};
pub use raw::{RawBound, raw_step_writes, replicate_instances};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use cairn_core::{EventType, InstanceId, InstanceStatus, StepKey, Timestamp, WorkflowName};
use cairn_store::{
    Claimed, ControlOutcome, ControlRequest, Created, Error, InstanceRecord, InstanceRef, Lease,
    ListQuery, NewEvent, NewInstance, Result, Sent, Store, StoreFuture, StoredEvent, Timers, Write,
};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use std::sync::mpsc::Sender;
use tokio::sync::oneshot;

use crate::held::Writer;
use crate::job::WriteJob;
use crate::worker::{ReadJob, Readers};

/// How durable a commit is (SQLite's `synchronous` pragma).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// `synchronous=FULL`: a committed write survives power loss. The default.
    #[default]
    Full,
    /// `synchronous=NORMAL`: a committed write survives a process crash but may be lost on
    /// power loss. Faster.
    Normal,
}

/// Options for [`SqliteStore::open`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// Commit durability.
    pub durability: Durability,
    /// Read connections (and threads).
    pub readers: usize,
    /// How long to wait for another engine to release the database.
    pub lock_timeout: Duration,
    /// The size the write-ahead log is cut back to whenever it restarts after a checkpoint
    /// (SQLite's `journal_size_limit`). Without it the WAL keeps the size of its largest
    /// burst forever. The WAL is also checkpointed and truncated to zero on a clean close.
    pub wal_size_limit: u64,
    /// Opened to look (the replay check): the schema is not migrated (a database of
    /// another schema version is refused) and a dead engine's leases are not taken over.
    pub check_only: bool,
}

/// The default [`Options::wal_size_limit`]: 64 MiB.
pub const DEFAULT_WAL_SIZE_LIMIT: u64 = 64 << 20;

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::Full,
            readers: 2,
            lock_timeout: Duration::from_secs(5),
            wal_size_limit: DEFAULT_WAL_SIZE_LIMIT,
            check_only: false,
        }
    }
}

impl Options {
    /// Sets the commit durability.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets the number of read connections (and threads); at least 1.
    pub fn readers(mut self, readers: usize) -> Self {
        self.readers = readers.max(1);
        self
    }

    /// Sets how long to wait for another engine to release the database.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// Sets the size the WAL is cut back to after a checkpoint.
    pub fn wal_size_limit(mut self, bytes: u64) -> Self {
        self.wal_size_limit = bytes;
        self
    }
}

/// Why a database could not be opened; the message names the file and the cause.
#[derive(Debug)]
pub struct OpenError {
    message: String,
    in_use: bool,
}

impl OpenError {
    pub(crate) fn other(message: String) -> Self {
        OpenError {
            message,
            in_use: false,
        }
    }

    /// Whether another engine holds the database (and kept it past the lock timeout).
    pub fn is_in_use(&self) -> bool {
        self.in_use
    }
}

impl std::error::Error for OpenError {}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The SQLite store. Cheap to share behind an `Arc`; see the crate docs.
pub struct SqliteStore {
    writer: Mutex<Option<Sender<WriteJob>>>,
    writer_thread: Mutex<Option<JoinHandle<()>>>,
    readers: Readers,
    path: PathBuf,
    counts: Arc<worker::Counts>,
    /// With `FULL`: which commits are synced, which reads wait for (`syncer.rs`).
    durable: Option<Arc<syncer::Durable>>,
}

/// What a store's writer has committed since it was opened ([`SqliteStore::writes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Writes {
    /// Transactions committed that changed the database: with the default durability,
    /// one fsync each (one may cover several, made while the one before was under way). A
    /// group commit of many jobs is one.
    pub commits: u64,
    /// Write calls (`Store::commit`, `create`, `claim`, …) in those transactions.
    pub jobs: u64,
    /// Time the writer thread spent in those transactions' `COMMIT`s (writing the WAL, the
    /// checkpoints the writer runs itself; not the sync of the default durability, which
    /// comes after the `COMMIT`): how much of the serial part is the log rather than the
    /// statements.
    pub commit_time: Duration,
    /// Checkpoints run beside the writer: runs, each copying into the database what of the
    /// WAL no reader still needs, possibly nothing. With [`Durability::Normal`] only: with
    /// `Full`, SQLite checkpoints in the writer's `COMMIT`.
    pub checkpoints: u64,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish()
    }
}

fn configure(conn: &Connection, options: &Options) -> rusqlite::Result<()> {
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    let limit = i64::try_from(options.wal_size_limit).unwrap_or(i64::MAX);
    // The pragma answers with the new value, so it is a query, not an update.
    conn.query_row(&format!("PRAGMA journal_size_limit = {limit}"), [], |_| {
        Ok(())
    })?;
    let sync = match options.durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.pragma_update(None, "cache_size", -16_000)?;
    stable_plans(conn)
}

/// A failure of SQLite itself (IO, a full disk, a busy or corrupt file) as the store's
/// callers see it: the store is unavailable, and the engine tries again later.
pub(crate) fn map_sqlite(e: rusqlite::Error) -> cairn_store::Error {
    cairn_store::Error::Unavailable(e.to_string())
}

/// One plan per statement, whatever values are bound (SQLite's query planner stability
/// guarantee). Without it, on a database with statistics (`PRAGMA optimize` gathers them),
/// SQLite compiles a cached statement again each time a new value is bound to a parameter
/// it compared with its statistics or with a partial index's condition: the claim query,
/// taking an event, reading the log, every time. The plans `plans.rs` checks are the ones
/// every binding gets.
pub(crate) fn stable_plans(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .map(drop)
}

/// The locks that make one engine per database: an exclusive `flock` on the database file
/// itself, which holds however the file is reached (a lock file named after the path was
/// bypassed by a symlink or a hard link), and the lock file beside it that earlier builds
/// take, so that an older and a newer engine exclude each other during an upgrade.
///
/// `flock` locks are independent of the POSIX record locks SQLite takes on the same file;
/// the handle is closed only after every connection is (see `worker.rs`), because closing
/// any handle of a file drops the process's record locks on it.
#[derive(Debug)]
pub(crate) struct Locks {
    _database: std::fs::File,
    _legacy: std::fs::File,
}

fn lock_file(
    path: &Path,
    db: &Path,
    deadline: std::time::Instant,
) -> std::result::Result<std::fs::File, OpenError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| OpenError::other(format!("open {}: {e}", path.display())))?;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                // Another engine (or one that is shutting down in this process) holds it.
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                if path == db {
                    // Closing a handle of the database file would drop the POSIX record
                    // locks this process's SQLite connections hold on it, should the other
                    // engine live in this process: keep it open (one descriptor per refused
                    // open) rather than risk that.
                    std::mem::forget(file);
                }
                return Err(OpenError {
                    message: format!(
                        "database {} is in use by another Cairn engine",
                        db.display()
                    ),
                    in_use: true,
                });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(OpenError::other(format!("lock {}: {e}", path.display())));
            }
        }
    }
}

fn acquire_lock(db: &Path, timeout: Duration) -> std::result::Result<Locks, OpenError> {
    let deadline = std::time::Instant::now() + timeout;
    let mut legacy = db.as_os_str().to_owned();
    legacy.push("-cairn.lock");
    let legacy = lock_file(Path::new(&legacy), db, deadline)?;
    let database = lock_file(db, db, deadline)?;
    Ok(Locks {
        _database: database,
        _legacy: legacy,
    })
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`.
    ///
    /// Blocks briefly (file IO, migrations): call it before serving, or from
    /// `spawn_blocking`.
    ///
    /// # Errors
    /// When the file cannot be opened or locked, or the schema is newer than this build.
    pub fn open(path: impl AsRef<Path>, options: Options) -> std::result::Result<Self, OpenError> {
        let path = path.as_ref().to_path_buf();
        let err = |what: &str, e: &dyn std::fmt::Display| {
            OpenError::other(format!("{what} {}: {e}", path.display()))
        };
        let lock = std::sync::Arc::new(acquire_lock(&path, options.lock_timeout)?);
        let mut conn = Connection::open(&path).map_err(|e| err("open", &e))?;
        configure(&conn, &options).map_err(|e| err("configure", &e))?;
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| err("read schema version of", &e))?;
        let version = usize::try_from(version).unwrap_or(usize::MAX);
        if version > schema::current_version() {
            return Err(OpenError::other(format!(
                "database {} has schema version {version}, newer than this build's {}",
                path.display(),
                schema::current_version()
            )));
        }
        if options.check_only {
            if version != schema::current_version() {
                return Err(OpenError::other(format!(
                    "database {} has schema version {version}, this build's is {}: check it with the build that wrote it (checking does not migrate)",
                    path.display(),
                    schema::current_version()
                )));
            }
        } else {
            schema::migrate(&mut conn).map_err(|e| err("migrate", &e))?;
            // Keep the planner's statistics current (bounded work; `PRAGMA optimize`).
            conn.execute_batch("PRAGMA analysis_limit = 1000; PRAGMA optimize;")
                .map_err(|e| err("analyze", &e))?;
            take_over(&conn).map_err(|e| err("recover leases in", &e))?;
        }

        let mut read_conns = Vec::new();
        for _ in 0..options.readers.max(1) {
            let rc = Connection::open_with_flags(
                &path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(|e| err("open reader for", &e))?;
            rc.busy_timeout(Duration::from_secs(5))
                .and_then(|()| stable_plans(&rc))
                .map_err(|e| err("configure reader for", &e))?;
            read_conns.push(rc);
        }
        let readers =
            Readers::spawn(read_conns, &lock).map_err(|e| err("spawn readers for", &e))?;
        // With `NORMAL`, checkpoints run beside the writer (`worker::spawn_writer`).
        let checkpoints = match options.durability {
            Durability::Normal => {
                let c = Connection::open(&path).map_err(|e| err("open checkpointer for", &e))?;
                configure(&c, &options).map_err(|e| err("configure checkpointer for", &e))?;
                Some(c)
            }
            Durability::Full => None,
        };
        // With `FULL`, the writer's commits are synced by the syncer thread (`syncer.rs`):
        // its connection no longer syncs in `COMMIT`. (Migrations and the take-over above
        // were synced there.)
        let syncer = match options.durability {
            Durability::Full => {
                // From SQLite's own name for the database (`path()`, unless it is not UTF-8).
                let db = conn.path().map_or(path.as_path(), Path::new);
                let wal = syncer::wal_of(db).map_err(|e| err("resolve the path of", &e))?;
                conn.pragma_update(None, "synchronous", "NORMAL")
                    .map_err(|e| err("configure writer for", &e))?;
                Some(syncer::spawn(&wal).map_err(|e| err("spawn syncer for", &e))?)
            }
            Durability::Normal => None,
        };
        let durable = syncer.as_ref().map(|(s, _)| Arc::clone(&s.durable));
        let counts = Arc::new(worker::Counts::default());
        let (writer, writer_thread) =
            worker::spawn_writer(conn, checkpoints, syncer, lock, Arc::clone(&counts))
                .map_err(|e| err("spawn writer for", &e))?;
        Ok(SqliteStore {
            writer: Mutex::new(Some(writer)),
            writer_thread: Mutex::new(Some(writer_thread)),
            readers,
            path,
            counts,
            durable,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the writer has committed so far: how many transactions, holding how many
    /// write calls (a benchmark's count of the commits an instance costs).
    pub fn writes(&self) -> Writes {
        self.counts.get()
    }

    /// Stops the threads after the queued work is done and releases the database's lock.
    pub async fn close(&self) {
        if let Ok(mut w) = self.writer.lock() {
            w.take();
        }
        let mut handles = self.readers.close();
        if let Some(h) = self.writer_thread.lock().ok().and_then(|mut t| t.take()) {
            handles.push(h);
        }
        // Joining is quick (the threads finish their queue) but blocking: a helper thread
        // joins them and reports back, so no async worker thread blocks.
        let (tx, rx) = oneshot::channel();
        std::thread::spawn(move || {
            for h in handles {
                let _ = h.join();
            }
            let _ = tx.send(());
        });
        let _ = rx.await;
    }

    /// The events buffered for `instance` (sent and not yet taken by a wait), oldest first.
    /// Not part of `Store`: the engine never reads them so; the test kit's simulator
    /// accounts with it for every event it sent.
    ///
    /// # Errors
    /// The store is closed or cannot read.
    pub async fn buffered_events(&self, instance: InstanceRef) -> Result<Vec<StoredEvent>> {
        self.read(move |conn| rows::buffered_events(conn, instance))
            .await
    }

    /// Runs `f` in the writer's next group commit, inside its own savepoint: a failure
    /// undoes its writes alone.
    fn write<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Writer<'_>) -> Result<R> + Send + 'static,
    ) -> StoreFuture<'_, R> {
        self.enqueue(f, false)
    }

    /// [`SqliteStore::write`] for work that fails only at its fence (a lease check), before
    /// it writes: no savepoint. Should it fail after writing all
    /// the same, its whole group fails (`worker`).
    fn write_fenced<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Writer<'_>) -> Result<R> + Send + 'static,
    ) -> StoreFuture<'_, R> {
        self.enqueue(f, true)
    }

    fn enqueue<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Writer<'_>) -> Result<R> + Send + 'static,
        fenced: bool,
    ) -> StoreFuture<'_, R> {
        let answer = self.send_write(f, fenced);
        Box::pin(answer.get())
    }

    /// Queues `f` for the writer's next group commit; its answer, to await.
    fn send_write<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Writer<'_>) -> Result<R> + Send + 'static,
        fenced: bool,
    ) -> WriteAnswer<R> {
        let (tx, rx) = oneshot::channel::<Result<R>>();
        let job = WriteJob {
            work: Box::new(Job {
                f: Some(f),
                result: None,
                tx,
            }),
            fenced,
        };
        let sent = self
            .writer
            .lock()
            .ok()
            .and_then(|w| w.as_ref().map(|w| w.send(job).is_ok()))
            .unwrap_or(false);
        WriteAnswer { sent, rx }
    }

    /// Runs `f` on a reader thread. With `FULL`, its answer waits until every commit it
    /// could have seen is synced (`syncer.rs`): nothing power loss could take back is read.
    fn read<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<R> + Send + 'static,
    ) -> StoreFuture<'_, R> {
        let (tx, rx) = oneshot::channel::<(Result<R>, u64)>();
        let durable = self.durable.clone();
        let job: ReadJob = Box::new(move |conn| {
            let read = f(conn);
            // After the query: at least the number of any commit it saw.
            let seen = durable.as_ref().map_or(0, |d| d.begun());
            let _ = tx.send((read, seen));
        });
        let sent = self.readers.send(job);
        Box::pin(async move {
            sent?;
            let (read, seen) = rx
                .await
                .map_err(|_| Error::Unavailable("the sqlite reader dropped the request".into()))?;
            if let Some(durable) = &self.durable {
                durable.wait(seen).await?;
            }
            read
        })
    }
}

/// A write job: its work until it runs, then its result until the commit's outcome is known.
struct Job<F, R> {
    f: Option<F>,
    result: Option<Result<R>>,
    tx: oneshot::Sender<Result<R>>,
}

impl<F, R> crate::job::Work for Job<F, R>
where
    F: FnOnce(&Writer<'_>) -> Result<R> + Send,
    R: Send,
{
    fn run(&mut self, conn: &Writer<'_>) -> std::result::Result<(), String> {
        let result = match self.f.take() {
            Some(f) => f(conn),
            None => Err(Error::Unavailable("a write job was run twice".into())),
        };
        let kept = match &result {
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        };
        self.result = Some(result);
        kept
    }

    fn complete(self: Box<Self>, commit: Result<()>) {
        let Job { result, tx, .. } = *self;
        let result =
            result.unwrap_or_else(|| Err(Error::Unavailable("a write job never ran".into())));
        let _ = tx.send(commit.and(result));
    }
}

/// The answer to a queued write job.
struct WriteAnswer<R> {
    sent: bool,
    rx: oneshot::Receiver<Result<R>>,
}

impl<R> WriteAnswer<R> {
    async fn get(self) -> Result<R> {
        if !self.sent {
            return Err(Error::Unavailable("the store is closed".into()));
        }
        self.rx
            .await
            .map_err(|_| Error::Unavailable("the sqlite writer dropped the request".into()))?
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        // Let the threads finish their queues and exit; the last one releases the lock.
        if let Ok(mut w) = self.writer.lock() {
            w.take();
        }
        drop(self.readers.close());
    }
}

/// The dead owner's leases, released: a range of `instances_lease`.
pub(crate) const TAKE_OVER_LEASES_SQL: &str =
    "UPDATE instances SET lease_owner = NULL, lease_until = NULL,
         ready_at = CASE WHEN status IN (0, 1, 7) THEN created_at ELSE ready_at END,
         ready_rank = CASE WHEN status IN (0, 1, 7) THEN 0 ELSE ready_rank END
     WHERE lease_owner IS NOT NULL";

/// Pauses the dead owner was waiting for: a range of `instances_pausing`.
pub(crate) const PENDING_PAUSES_SQL: &str = "SELECT iid FROM instances WHERE status = 6";

/// The previous owner held the lock and is gone: its leased instances are claimable
/// at once (ahead of new ones), and a pause it was waiting for takes effect (SPEC E26).
///
/// "At once" is `ready_at = created_at`, not the system time: the engine claims by its own
/// clock (possibly virtual), and the creation time came from that clock.
///
/// One transaction: a take-over that fails half-way (a full disk) changes nothing, and the
/// next open does it whole. Committed statement by statement, it could leave a pause taken
/// effect without its record and its concurrency slot, which no later open would look at.
fn take_over(conn: &Connection) -> Result<()> {
    let tx = conn.unchecked_transaction().map_err(map_sqlite)?;
    let conn = &*tx;
    // What the summary line tells an operator: how many instances the dead owner held, and
    // how many of their attempts it left unrecorded (each is recorded as interrupted and
    // retried when the instance runs again). Counted over the leased instances only.
    let held: Vec<(i64, String)> = conn
        .prepare("SELECT iid, workflow FROM instances WHERE lease_owner IS NOT NULL")
        .and_then(|mut st| st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .map_err(map_sqlite)?;
    let leased: Vec<i64> = held.iter().map(|(iid, _)| *iid).collect();
    let mut interrupted = 0i64;
    {
        let mut st = conn
            .prepare("SELECT COUNT(*) FROM steps WHERE iid = ?1 AND in_flight = 1")
            .map_err(map_sqlite)?;
        for iid in &leased {
            interrupted += st
                .query_row([iid], |r| r.get::<_, i64>(0))
                .map_err(map_sqlite)?;
        }
    }
    let pausing: Vec<i64> = conn
        .prepare(PENDING_PAUSES_SQL)
        .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect())
        .map_err(map_sqlite)?;
    conn.execute(TAKE_OVER_LEASES_SQL, []).map_err(map_sqlite)?;
    rows::complete_pauses(conn, &pausing)?;
    tx.commit().map_err(map_sqlite)?;
    for (_, workflow) in &held {
        metrics::counter!(cairn_store::TAKEOVER_METRIC, "workflow" => workflow.clone())
            .increment(1);
    }
    if !leased.is_empty() {
        tracing::info!(
            instances = leased.len(),
            interrupted_attempts = interrupted,
            "recovered the instances a previous engine was running; interrupted attempts are recorded and retried"
        );
    }
    Ok(())
}

impl Store for SqliteStore {
    fn create(&self, batch: Vec<NewInstance>) -> StoreFuture<'_, Vec<Created>> {
        self.write(move |conn| {
            let mut out = Vec::with_capacity(batch.len());
            for new in batch {
                out.push(rows::insert_instance(conn, &new)?);
            }
            Ok(out)
        })
    }

    fn instance(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
    ) -> StoreFuture<'_, Option<InstanceRecord>> {
        let (workflow, id) = (workflow.to_string(), id.to_string());
        self.read(move |conn| {
            conn.prepare_cached(&format!(
                "SELECT {} FROM instances WHERE workflow = ?1 AND id = ?2",
                rows::INSTANCE_COLUMNS
            ))
            .and_then(|mut st| {
                st.query_row(params![workflow, id], rows::instance)
                    .optional()
            })
            .map_err(map_sqlite)?
            .transpose()
        })
    }

    fn list(&self, query: ListQuery) -> StoreFuture<'_, Vec<InstanceRecord>> {
        self.read(move |conn| rows::list(conn, &query))
    }

    fn count_matching(&self, query: ListQuery) -> StoreFuture<'_, u64> {
        self.read(move |conn| rows::count_matching(conn, &query))
    }

    fn count(&self, workflow: &WorkflowName, status: InstanceStatus) -> StoreFuture<'_, u64> {
        let workflow = workflow.to_string();
        self.read(move |conn| {
            let n: i64 = conn
                .prepare_cached(rows::COUNT_SQL)
                .and_then(|mut st| {
                    st.query_row(params![workflow, status.code()], |r| r.get(0))
                        .optional()
                })
                .map_err(map_sqlite)?
                .unwrap_or(0);
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn claim(
        &self,
        owner: &str,
        workflows: &[WorkflowName],
        now: Timestamp,
        ttl: Duration,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Claimed>> {
        let owner = owner.to_owned();
        let workflows: Vec<String> = workflows.iter().map(ToString::to_string).collect();
        // Not fenced: a claimed row that does not read back (corrupt) fails the claim after
        // its first writes, and must not take the rest of its group down with it. Claims
        // are few (many instances each), so their savepoints cost little.
        self.write(move |conn| rows::claim(conn, &owner, &workflows, now, ttl, limit))
    }

    fn renew(
        &self,
        owner: &str,
        leases: Vec<Lease>,
        now: Timestamp,
        until: Timestamp,
    ) -> StoreFuture<'_, Vec<Lease>> {
        let owner = owner.to_owned();
        self.write(move |conn| {
            let mut st = conn
                .prepare_cached(
                    "UPDATE instances SET lease_until = ?1
                     WHERE iid = ?4 AND lease_epoch = ?5 AND lease_owner = ?2
                       AND lease_until >= ?3",
                )
                .map_err(map_sqlite)?;
            let mut kept = Vec::new();
            for lease in leases {
                let epoch = i64::try_from(lease.epoch).map_err(|_| {
                    Error::Corrupt(format!("lease epoch {} out of range", lease.epoch))
                })?;
                let renewed = st
                    .execute(params![
                        until.as_millis(),
                        owner,
                        now.as_millis(),
                        lease.instance.0,
                        epoch
                    ])
                    .map_err(map_sqlite)?;
                if renewed > 0 {
                    kept.push(lease);
                }
            }
            Ok(kept)
        })
    }

    fn reclaim(
        &self,
        owner: &str,
        lease: Lease,
        now: Timestamp,
        ttl: Duration,
    ) -> StoreFuture<'_, Lease> {
        let owner = owner.to_owned();
        self.write(move |conn| rows::reclaim(conn, &owner, lease, now, ttl))
    }

    fn release_all(&self, owner: &str) -> StoreFuture<'_, ()> {
        let owner = owner.to_owned();
        self.write(move |conn| rows::release_all(conn, &owner))
    }

    fn journal(&self, instance: InstanceRef) -> StoreFuture<'_, Vec<cairn_core::StepRecord>> {
        self.read(move |conn| rows::journal(conn, instance))
    }

    fn stream_chunk(
        &self,
        instance: InstanceRef,
        step: cairn_core::StepKey,
        attempt: u32,
        epoch: u64,
        index: u32,
    ) -> StoreFuture<'_, Option<Vec<u8>>> {
        self.read(move |conn| streams::chunk(conn, instance, &step, attempt, epoch, index))
    }

    fn stream_bytes(&self, instance: InstanceRef) -> StoreFuture<'_, u64> {
        self.read(move |conn| streams::bytes(conn, instance))
    }

    fn children(&self, parent: InstanceRef) -> StoreFuture<'_, Vec<InstanceRecord>> {
        self.read(move |conn| rows::children(conn, parent))
    }

    fn slot_position(&self, instance: InstanceRef) -> StoreFuture<'_, Option<u64>> {
        self.read(move |conn| slots::position(conn, instance))
    }

    fn waiting_for_slots(
        &self,
        workflow: &WorkflowName,
        limit: usize,
    ) -> StoreFuture<'_, (Vec<(String, u64)>, u64)> {
        let workflow = workflow.to_string();
        self.read(move |conn| slots::waiting(conn, &workflow, limit))
    }

    fn commit(&self, lease: Lease, writes: Vec<Write>) -> StoreFuture<'_, InstanceStatus> {
        // Steps and log records leave the instance's row alone (the hot path: a commit
        // per step): its status is the one read with the lease.
        let same = writes
            .iter()
            .all(|w| matches!(w, Write::Step(_) | Write::Log(_)));
        let writes = match rows::encode_all(writes) {
            Ok(writes) => writes,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        // The lease check is the fence: after it, only a store failure can stop the writes.
        let committed = self.send_write(
            move |conn| {
                let before = rows::leased_status(conn, lease)?;
                rows::apply_all(conn, lease.instance, &writes)?;
                let status = if same {
                    before
                } else {
                    rows::status_of(conn, lease.instance)?
                };
                // Handed back, to be freed by the committing task: the one writer thread is
                // the serial part, and freeing what other threads allocated cost it ~6 %.
                Ok((status, writes))
            },
            true,
        );
        // One box for the caller's future, not one around another.
        Box::pin(async move { committed.get().await.map(|(status, _written)| status) })
    }

    fn control(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
        request: ControlRequest,
    ) -> StoreFuture<'_, ControlOutcome> {
        let (workflow, id) = (workflow.to_string(), id.to_string());
        self.write(move |conn| rows::control(conn, &workflow, &id, &request))
    }

    fn log(
        &self,
        instance: InstanceRef,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<cairn_core::LogRecord>> {
        self.read(move |conn| history::log(conn, instance, after, limit))
    }

    fn workflow_log(
        &self,
        workflow: &WorkflowName,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, cairn_store::WorkflowLogPage> {
        let workflow = workflow.to_string();
        self.read(move |conn| history::workflow_log(conn, &workflow, after, limit))
    }

    fn log_head(&self) -> StoreFuture<'_, u64> {
        self.read(|conn| {
            let id: Option<i64> = conn
                .query_row("SELECT max(id) FROM log", [], |r| r.get(0))
                .map_err(map_sqlite)?;
            Ok(id.and_then(|id| u64::try_from(id).ok()).unwrap_or(0))
        })
    }

    fn next_ready(&self, workflows: &[WorkflowName]) -> StoreFuture<'_, Option<Timestamp>> {
        let workflows: Vec<String> = workflows.iter().map(ToString::to_string).collect();
        self.read(move |conn| rows::next_ready(conn, &workflows))
    }

    fn timers(&self, workflow: &WorkflowName, now: Timestamp) -> StoreFuture<'_, Timers> {
        let workflow = workflow.to_string();
        self.read(move |conn| rows::timers(conn, &workflow, now))
    }

    fn send_event(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
        event: NewEvent,
    ) -> StoreFuture<'_, Sent> {
        let (workflow, id) = (workflow.to_string(), id.to_string());
        self.write(move |conn| rows::send_event(conn, &workflow, &id, &event))
    }

    fn take_event(
        &self,
        lease: Lease,
        step: StepKey,
        event_type: EventType,
        at: Timestamp,
    ) -> StoreFuture<'_, Option<StoredEvent>> {
        // The lease check is the fence.
        self.write_fenced(move |conn| rows::take_event(conn, lease, &step, &event_type, at))
    }

    fn purge(&self, now: Timestamp, limit: usize) -> StoreFuture<'_, usize> {
        self.write(move |conn| rows::purge(conn, now, limit))
    }

    fn next_purge(&self) -> StoreFuture<'_, Option<Timestamp>> {
        self.read(rows::next_purge)
    }

    fn create_schedule(&self, schedule: cairn_store::StoredSchedule) -> StoreFuture<'_, bool> {
        self.write(move |conn| rows::create_schedule(conn, &schedule))
    }

    fn set_schedule_state(
        &self,
        name: &str,
        state: cairn_store::ScheduleState,
    ) -> StoreFuture<'_, bool> {
        let name = name.to_owned();
        self.write(move |conn| rows::set_schedule_state(conn, &name, &state))
    }

    fn schedules(&self) -> StoreFuture<'_, Vec<cairn_store::StoredSchedule>> {
        self.read(rows::schedules)
    }

    fn delete_schedule(&self, name: &str, declared: bool) -> StoreFuture<'_, bool> {
        let name = name.to_owned();
        self.write(move |conn| rows::delete_schedule(conn, &name, declared))
    }

    fn fire_tick(
        &self,
        tick: cairn_store::ScheduleTick,
    ) -> StoreFuture<'_, cairn_store::TickFired> {
        self.write(move |conn| rows::fire_tick(conn, &tick))
    }

    fn register_versions(
        &self,
        versions: Vec<cairn_store::WorkflowVersion>,
    ) -> StoreFuture<'_, ()> {
        self.write(move |conn| rows::register_versions(conn, &versions))
    }

    fn workflow_versions(&self) -> StoreFuture<'_, Vec<cairn_store::WorkflowVersion>> {
        self.read(rows::workflow_versions)
    }

    fn unfinished_versions(
        &self,
        workflow: &WorkflowName,
    ) -> StoreFuture<'_, Vec<(Option<String>, u64)>> {
        let workflow = workflow.to_string();
        self.read(move |conn| rows::unfinished_versions(conn, &workflow))
    }

    fn wake_awaiting(
        &self,
        workflow: &WorkflowName,
        version: &str,
        limit: u64,
    ) -> StoreFuture<'_, u64> {
        let (workflow, version) = (workflow.to_string(), version.to_owned());
        self.write(move |conn| rows::wake_awaiting(conn, &workflow, &version, limit))
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        Box::pin(async {
            SqliteStore::close(self).await;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    /// One directory for the whole test process (removed when it exits normally), one
    /// database file per case.
    async fn factory() -> std::sync::Arc<dyn cairn_store::Store> {
        static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = DIR.get_or_init(|| tempfile::tempdir().expect("tempdir"));
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = dir.path().join(format!("conformance-{n}.db"));
        let store = crate::SqliteStore::open(path, crate::Options::default()).expect("open");
        std::sync::Arc::new(store)
    }

    cairn_store::conformance_tests!(factory);

    /// The pages one of [`big_instance`]'s instances takes, about.
    const PAGES_PER_INSTANCE: usize = 10;

    /// Creates `n` instances of [`big_instance`] on `store`, one after the other.
    async fn fill(store: &crate::SqliteStore, n: usize, from: usize) {
        use cairn_store::Store;
        for i in from..from + n {
            store.create(vec![big_instance(i)]).await.expect("create");
        }
    }

    /// An instance with about 40 KiB of params: [`PAGES_PER_INSTANCE`] pages.
    fn big_instance(i: usize) -> cairn_store::NewInstance {
        cairn_store::NewInstance {
            params: format!("\"{}\"", "x".repeat(40 * 1024)),
            ..cairn_store::conformance::new_instance("w", &format!("i{i}"))
        }
    }

    /// The instances a copy of the database file alone holds, without its WAL: what
    /// checkpoints have copied into it. `None` while a checkpoint is writing into it (a copy
    /// then may be torn, which the WAL beside it makes whole).
    fn in_the_database_file(path: &std::path::Path, dir: &std::path::Path) -> Option<i64> {
        let copy = dir.join("copy.db");
        std::fs::copy(path, &copy).expect("copy");
        let n = rusqlite::Connection::open(&copy)
            .and_then(|c| c.query_row("SELECT COUNT(*) FROM instances", [], |r| r.get(0)))
            .ok();
        std::fs::remove_file(&copy).expect("remove");
        n
    }

    use super::Duration;

    /// With `NORMAL`, the WAL reaches the database file by the checkpointer thread's
    /// checkpoints: once more than `CHECKPOINT_PAGES` pages were written, one runs, and the
    /// database file alone holds all but the last of the rows. Writing goes on meanwhile,
    /// and later checkpoints copy the later rows too.
    #[tokio::test]
    async fn a_normal_store_checkpoints_beside_its_writer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("checkpointed.db");
        let store = crate::SqliteStore::open(
            &path,
            crate::Options::default().durability(crate::Durability::Normal),
        )
        .expect("open");
        let n = usize::try_from(crate::worker::CHECKPOINT_PAGES).unwrap() / PAGES_PER_INSTANCE;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut written = 0;
        for round in 1..=2 {
            fill(&store, 2 * n, written).await;
            written += 2 * n;
            // Waits for what it asserts: a checkpoint that copied every row written so far.
            // All but the last `CHECKPOINT_PAGES` at most (as with SQLite's own checkpoints:
            // what a commit leaves below that waits for the next).
            let copied = i64::try_from(written - n).unwrap();
            while store.writes().checkpoints < round
                || in_the_database_file(&path, dir.path()).is_none_or(|rows| rows < copied)
            {
                assert!(
                    std::time::Instant::now() < deadline,
                    "round {round}: {} checkpoints, {:?} of {written} instances in the database file (at least {copied} expected)",
                    store.writes().checkpoints,
                    in_the_database_file(&path, dir.path())
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        store.close().await;
    }

    /// Under a steady load at `NORMAL` the WAL stays bounded. The log starts over only at a
    /// transaction that finds all of it copied into the database, which a checkpoint beside
    /// a writer that never pauses never leaves it: the writer's own checkpoint past
    /// `WRITER_CHECKPOINT_PAGES` does. (The file keeps the largest size the log reached
    /// below `journal_size_limit`, so its size is how far the log went.)
    #[tokio::test]
    async fn a_normal_stores_wal_stays_bounded_under_a_steady_load() {
        use cairn_store::Store;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("steady.db");
        let store = crate::SqliteStore::open(
            &path,
            crate::Options::default().durability(crate::Durability::Normal),
        )
        .expect("open");
        // About 60 MiB written, 16 writes in flight: the writer always has the next job.
        let writes = 1_500;
        let mut next = 0;
        while next < writes {
            let batch: Vec<_> = (next..next + 16)
                .map(|i| store.create(vec![big_instance(i)]))
                .collect();
            for created in futures::future::join_all(batch).await {
                created.expect("create");
            }
            next += 16;
        }
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let size = std::fs::metadata(&wal).expect("wal").len();
        let bound =
            2 * u64::try_from(crate::worker::WRITER_CHECKPOINT_PAGES).unwrap() * (4096 + 24);
        assert!(
            size <= bound,
            "the WAL reached {size} bytes (bound {bound}) after {} checkpoints beside the writer",
            store.writes().checkpoints
        );
        store.close().await;
    }

    /// With `FULL`, SQLite checkpoints inside the writer's commits: no checkpointer.
    #[tokio::test]
    async fn a_full_store_checkpoints_in_its_writer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("full.db");
        let store = crate::SqliteStore::open(&path, crate::Options::default()).expect("open");
        let n = usize::try_from(crate::worker::CHECKPOINT_PAGES).unwrap() / PAGES_PER_INSTANCE;
        fill(&store, 2 * n, 0).await;
        assert_eq!(store.writes().checkpoints, 0);
        assert!(
            in_the_database_file(&path, dir.path()).is_some_and(|n| n > 0),
            "checkpointed in COMMIT"
        );
        store.close().await;
    }

    /// Waits (polling, yielding) until `condition` holds; fails the test after 30 s.
    async fn until(what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !condition() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(1));
            tokio::task::yield_now().await;
        }
    }

    /// With `FULL`, a write is answered only once the WAL holding its commit is synced, and
    /// a read that could see it answers only then too: held at the syncer thread, the
    /// commit is made (the writer goes on) but neither its writer nor its reader hears of
    /// it.
    #[tokio::test]
    async fn a_full_store_answers_writes_and_reads_only_once_the_wal_is_synced() {
        answers_only_once_synced(true).await;
    }

    /// The same when the writer syncs the group itself, having nothing queued behind it.
    #[tokio::test]
    async fn a_full_store_whose_writer_syncs_itself_answers_only_once_synced() {
        answers_only_once_synced(false).await;
    }

    #[expect(
        clippy::await_holding_lock,
        reason = "the lock holds the thread that syncs, not a task"
    )]
    async fn answers_only_once_synced(hand_over: bool) {
        use cairn_store::Store;
        use futures::FutureExt;
        use std::sync::atomic::Ordering::SeqCst;
        let dir = tempfile::tempdir().expect("tempdir");
        let store =
            crate::SqliteStore::open(dir.path().join("synced.db"), crate::Options::default())
                .expect("open");
        let durable = std::sync::Arc::clone(store.durable.as_ref().expect("a syncer at FULL"));
        // It syncs SQLite's WAL, not another file.
        let wal = std::fs::metadata(dir.path().join("synced.db-wal")).expect("the WAL");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            (durable.file.dev(), durable.file.ino()),
            (wal.dev(), wal.ino()),
            "the syncer's file is not the WAL"
        );
        durable.always_hand_over.store(hand_over, SeqCst);
        let held = durable.hold.lock().expect("hold");
        let commits = store.writes().commits;
        let mut create = store.create(vec![cairn_store::conformance::new_instance("w", "a")]);
        // Polled once, so the job is queued; then committed by the writer.
        assert!((&mut create).now_or_never().is_none());
        until("the create is committed", || {
            store.writes().commits > commits
        })
        .await;
        until("the sync is under way", || {
            durable.handed_over.load(SeqCst) == usize::from(hand_over)
        })
        .await;
        assert!(
            (&mut create).now_or_never().is_none(),
            "answered before its commit was synced"
        );
        let (workflow, id) = ("w".parse().expect("name"), "a".parse().expect("id"));
        let mut read = store.instance(&workflow, &id);
        // The reader sees the commit; its answer waits for the sync.
        until("the read waits for the sync", || {
            assert!(
                (&mut read).now_or_never().is_none(),
                "a read answered before the commit it could see was synced"
            );
            durable.gated.load(SeqCst) > 0
        })
        .await;
        drop(held);
        assert_eq!(create.await.expect("create").len(), 1);
        assert_eq!(
            durable.settled_by_writer.load(SeqCst) > 0,
            !hand_over,
            "synced on the wrong thread"
        );
        let record = read.await.expect("read").expect("the instance");
        assert_eq!(record.id.as_str(), "a");
        store.close().await;
    }

    /// Groups are answered in the order they committed: while one handed to the syncer
    /// thread is unanswered, the writer hands the next over too rather than syncing and
    /// answering it first, even with nothing queued behind it.
    #[tokio::test]
    #[expect(
        clippy::await_holding_lock,
        reason = "the lock holds the thread that syncs, not a task"
    )]
    async fn a_full_store_answers_its_groups_in_commit_order() {
        use cairn_store::Store;
        use futures::FutureExt;
        use std::sync::atomic::Ordering::SeqCst;
        let dir = tempfile::tempdir().expect("tempdir");
        let store =
            crate::SqliteStore::open(dir.path().join("order.db"), crate::Options::default())
                .expect("open");
        let durable = std::sync::Arc::clone(store.durable.as_ref().expect("a syncer at FULL"));
        let new = |id: &str| vec![cairn_store::conformance::new_instance("w", id)];
        durable.always_hand_over.store(true, SeqCst);
        let held = durable.hold.lock().expect("hold");
        let mut first = store.create(new("first"));
        assert!((&mut first).now_or_never().is_none());
        until("the first group is handed over", || {
            durable.handed_over.load(SeqCst) == 1
        })
        .await;
        durable.always_hand_over.store(false, SeqCst);
        let mut second = store.create(new("second"));
        assert!((&mut second).now_or_never().is_none());
        until("the second group is handed over too", || {
            durable.handed_over.load(SeqCst) == 2
        })
        .await;
        assert!(
            (&mut second).now_or_never().is_none(),
            "answered before the group committed before it"
        );
        drop(held);
        assert_eq!(first.await.expect("first").len(), 1);
        assert_eq!(second.await.expect("second").len(), 1);
        assert_eq!(durable.settled_by_writer.load(SeqCst), 0);
        store.close().await;
    }

    /// Should the syncer die (a panic), the commits it was handed are never synced: the
    /// store stops as after a failed sync, and neither a caller nor a reader waits for ever.
    #[tokio::test]
    async fn a_full_store_whose_syncer_dies_stops_and_leaves_no_one_waiting() {
        use cairn_store::Store;
        let dir = tempfile::tempdir().expect("tempdir");
        let store =
            crate::SqliteStore::open(dir.path().join("dead-syncer.db"), crate::Options::default())
                .expect("open");
        let new = |id: &str| vec![cairn_store::conformance::new_instance("w", id)];
        store.create(new("before")).await.expect("create");
        let durable = std::sync::Arc::clone(store.durable.as_ref().expect("a syncer at FULL"));
        // On the syncer thread: the writer, with nothing queued, would sync itself.
        durable
            .always_hand_over
            .store(true, std::sync::atomic::Ordering::SeqCst);
        durable
            .panic_next
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let (workflow, id) = ("w".parse().expect("name"), "dying".parse().expect("id"));
        let (created, read) = tokio::join!(store.create(new("dying")), async {
            // A read that may see the commit the syncer dies on.
            store.instance(&workflow, &id).await
        });
        assert!(created.is_err(), "answered by a dead syncer: {created:?}");
        assert!(
            matches!(&read, Ok(None) | Err(cairn_store::Error::Unavailable(_))),
            "a read of an unsynced commit: {read:?}"
        );
        let after = store.create(new("after")).await;
        assert!(
            matches!(&after, Err(cairn_store::Error::Unavailable(_))),
            "a write after the syncer died: {after:?}"
        );
        let before = "before".parse().expect("id");
        let read = store.instance(&workflow, &before).await;
        assert!(
            matches!(&read, Err(cairn_store::Error::Unavailable(_))),
            "a read after the syncer died: {read:?}"
        );
        store.close().await;
    }

    /// A failed sync of the WAL cannot be taken back (the commit is in the log, and Linux
    /// may call the next sync a success with the pages lost): the write is answered as
    /// failed, and so is every later write and read, until the store is opened again,
    /// where SQLite recovers what reached the file.
    #[tokio::test]
    async fn a_full_store_whose_wal_sync_fails_accepts_nothing_more_until_reopened() {
        fails_at_a_failed_sync(true).await;
    }

    /// The same when the writer syncs the group itself.
    #[tokio::test]
    async fn a_full_store_whose_writer_fails_to_sync_accepts_nothing_more_until_reopened() {
        fails_at_a_failed_sync(false).await;
    }

    async fn fails_at_a_failed_sync(hand_over: bool) {
        use cairn_store::Store;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("failed-sync.db");
        let store = crate::SqliteStore::open(&path, crate::Options::default()).expect("open");
        let new = |id: &str| vec![cairn_store::conformance::new_instance("w", id)];
        store.create(new("before")).await.expect("create");
        let durable = std::sync::Arc::clone(store.durable.as_ref().expect("a syncer at FULL"));
        durable
            .always_hand_over
            .store(hand_over, std::sync::atomic::Ordering::SeqCst);
        durable
            .fail_next
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let unavailable = |r: cairn_store::Result<Vec<cairn_store::Created>>, what: &str| {
            assert!(
                matches!(&r, Err(cairn_store::Error::Unavailable(m)) if m.contains("synced")),
                "{what}: {r:?}"
            );
        };
        unavailable(
            store.create(new("failed")).await,
            "the write whose sync failed",
        );
        unavailable(store.create(new("after")).await, "a later write");
        let (workflow, id) = ("w".parse().expect("name"), "before".parse().expect("id"));
        let read = store.instance(&workflow, &id).await;
        assert!(
            matches!(&read, Err(cairn_store::Error::Unavailable(_))),
            "a read after the failure: {read:?}"
        );
        store.close().await;
        // Closed without a checkpoint: the WAL is left whole, for the next open to recover.
        let wal = dir.path().join("failed-sync.db-wal");
        assert!(
            std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0),
            "the WAL was checkpointed at close after a failed sync"
        );
        let store = crate::SqliteStore::open(&path, crate::Options::default()).expect("reopen");
        assert!(
            store
                .instance(&workflow, &id)
                .await
                .expect("read")
                .is_some()
        );
        let after = "after".parse().expect("id");
        assert!(
            store
                .instance(&workflow, &after)
                .await
                .expect("read")
                .is_none(),
            "a write refused after the failure was not made"
        );
        store
            .create(new("again"))
            .await
            .expect("writes again once reopened");
        store.close().await;
    }
}
