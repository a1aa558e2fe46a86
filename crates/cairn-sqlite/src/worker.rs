//! The threads that own the SQLite connections.
//!
//! One writer thread owns the only write connection. It takes every queued job, runs them
//! in one `BEGIN IMMEDIATE` transaction and commits once: many engine writes, one fsync
//! (group commit). Replies are sent only once the commit is durable, so a caller never sees
//! a write that power loss could take back: with `NORMAL` after the `COMMIT` (durable up to
//! the last checkpoint, as that level promises), with `FULL` once the WAL is synced: by the
//! syncer thread while the writer already runs the next group, or by the writer itself when
//! no job waits (`syncer.rs`).
//!
//! A job that may fail after it has written runs inside its own savepoint, so its failure
//! is undone alone. A *fenced* job (a lifetime's commit, taking an event) fails
//! only at its fence, before it writes anything; it runs without one, because a savepoint
//! costs every page the job touches a copy into the sub-journal (about a fifth of the
//! writer thread's time). If a fenced job fails after writing all the same (a store error,
//! a corrupt row), nothing of the group can be trusted: the group is abandoned, every job
//! in it is told it failed, and nothing of it lands.
//!
//! Reader threads each own a read connection and serve queries, so no tokio worker thread
//! ever blocks on SQLite.

use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use cairn_store::{Error, Result};
use rusqlite::Connection;

use crate::held::Writer;
use crate::history::{ConfigIds, LogIds};
use crate::job::{Work, WriteJob};
use crate::map_sqlite;
use crate::syncer::{Committed, Durable, Syncer};

/// A read job.
pub(crate) type ReadJob = Box<dyn FnOnce(&Connection) + Send>;

/// The most jobs one group commit takes.
const MAX_GROUP: usize = 4096;

/// How long the writer looks for the next job, yielding, before it sleeps until one comes.
const LINGER: std::time::Duration = std::time::Duration::from_micros(50);

/// The next job; `None` once every sender is gone. A lifetime usually sends its next
/// commit within microseconds of its last reply: looking for it a little while first spares
/// the thread a sleep and a wake-up per commit.
fn next_job(rx: &Receiver<WriteJob>) -> Option<WriteJob> {
    let since = std::time::Instant::now();
    loop {
        match rx.try_recv() {
            Ok(job) => return Some(job),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if since.elapsed() < LINGER => std::thread::yield_now(),
            Err(TryRecvError::Empty) => return rx.recv().ok(),
        }
    }
}

/// The database file's lock, shared by every thread that owns a connection. Each thread
/// closes its connection before it lets go of the lock: closing the lock's handle first would
/// drop SQLite's record locks on the file while a connection still relies on them.
pub(crate) type DatabaseLock = Arc<crate::Locks>;

/// What the writer has committed so far (see [`crate::SqliteStore::writes`]).
#[derive(Default)]
pub(crate) struct Counts {
    commits: std::sync::atomic::AtomicU64,
    jobs: std::sync::atomic::AtomicU64,
    /// Nanoseconds in `COMMIT`.
    commit_nanos: std::sync::atomic::AtomicU64,
    /// Checkpoints the checkpointer ran.
    checkpoints: std::sync::atomic::AtomicU64,
}

impl Counts {
    pub(crate) fn get(&self) -> crate::Writes {
        use std::sync::atomic::Ordering::Relaxed;
        crate::Writes {
            commits: self.commits.load(Relaxed),
            jobs: self.jobs.load(Relaxed),
            commit_time: std::time::Duration::from_nanos(self.commit_nanos.load(Relaxed)),
            checkpoints: self.checkpoints.load(Relaxed),
        }
    }
}

/// The WAL pages a commit may leave before the checkpointer is asked to copy them into the
/// database (SQLite's own automatic checkpoint starts at the same size).
pub(crate) const CHECKPOINT_PAGES: i32 = 1000;

/// The WAL pages past which the writer checkpoints itself, as SQLite would. The log starts
/// over only at a transaction that finds all of it copied, and a checkpoint beside the
/// writer copies what was there when it began while the writer goes on adding: under a
/// steady load only the writer's own checkpoint, between two of its transactions, lets it
/// start over, and so bounds the WAL (also should the checkpointer be gone). What the
/// checkpointer has copied by then is not copied again.
pub(crate) const WRITER_CHECKPOINT_PAGES: i32 = 4 * CHECKPOINT_PAGES;

/// Starts the writer thread on `conn`; with `checkpoints` (a connection of its own that
/// can write), the checkpointer thread beside it.
///
/// Without a checkpointer, SQLite checkpoints by itself: inside the `COMMIT` that left the
/// WAL over its size, it copies the WAL into the database and syncs both files while every
/// job queued behind it waits. With `synchronous = NORMAL` that is most of the writer's time
/// in `COMMIT` (in `cairn-bench throughput`, about a quarter of all its time), so there a
/// commit that leaves [`CHECKPOINT_PAGES`] or more asks the checkpointer instead, which runs
/// a `PASSIVE` checkpoint beside the writer's next groups, and only past
/// [`WRITER_CHECKPOINT_PAGES`] does the writer checkpoint itself. SQLite runs either as it
/// would its own: frames are copied only once the WAL is synced, and the database is synced
/// before the log can start over, which the writer does at its next transaction once
/// everything was copied. A request made while one runs is one more run. (With `FULL`, the
/// syncer thread syncs the WAL after every group, and a checkpointer's syncs beside it only
/// slowed those down: measured, not kept; BENCHMARKS.md, round 3. SQLite's own checkpoint
/// in the writer's `COMMIT` stays.)
pub(crate) fn spawn_writer(
    mut conn: Connection,
    checkpoints: Option<Connection>,
    syncer: Option<(Syncer, JoinHandle<()>)>,
    lock: DatabaseLock,
    counts: Arc<Counts>,
) -> std::io::Result<(Sender<WriteJob>, JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::channel::<WriteJob>();
    let checkpointer = match checkpoints {
        Some(checkpoints) => Some(spawn_checkpointer(
            &mut conn,
            checkpoints,
            Arc::clone(&lock),
            Arc::clone(&counts),
        )?),
        None => None,
    };
    let handle = std::thread::Builder::new()
        .name("cairn-sqlite-writer".into())
        .spawn(move || {
            let (syncer, syncer_thread) = syncer.unzip();
            let durable = syncer.as_ref().map(|s| Arc::clone(&s.durable));
            writer_loop(&conn, &rx, &counts, syncer.as_ref());
            // The syncer answers what it was handed, then ends.
            drop(syncer);
            if let Some(syncer_thread) = syncer_thread {
                let _ = syncer_thread.join();
            }
            let failed = durable.is_some_and(|d| d.has_failed());
            if let Some(checkpointer) = checkpointer {
                // Dropping the hook drops the checkpointer's only sender: it ends. (Should
                // that fail, it would wait for ever: it is left to end with the process.)
                match conn.wal_hook(None::<WalHook>) {
                    Ok(()) => {
                        let _ = checkpointer.join();
                    }
                    Err(e) => tracing::warn!(error = %e, "sqlite WAL hook not removed at close"),
                }
            }
            if failed {
                stop_checkpoints(&conn);
            } else {
                close(&conn);
            }
            drop(conn);
            drop(lock);
        })?;
    Ok((tx, handle))
}

type WalHook = fn(&mut rusqlite::hooks::Wal, std::ffi::c_int) -> rusqlite::Result<()>;

/// The checkpointer thread on `checkpoints`, asked by a WAL hook on `writer` (which replaces
/// SQLite's automatic checkpoint, itself a WAL hook).
fn spawn_checkpointer(
    writer: &mut Connection,
    checkpoints: Connection,
    lock: DatabaseLock,
    counts: Arc<Counts>,
) -> std::io::Result<JoinHandle<()>> {
    let (ask, asked) = std::sync::mpsc::sync_channel::<()>(1);
    // Held by whoever checkpoints: SQLite refuses a second checkpoint while one runs, and
    // the writer's must not be refused (the checkpointer, asked again and again, would
    // otherwise be at it nearly whenever the writer tries). The writer waits for the run in
    // progress: the commit past the mark stalls for it and its own, about once per
    // `WRITER_CHECKPOINT_PAGES`, where SQLite's own checkpoint stalled one commit in four
    // as many pages; the wait is what bounds the WAL.
    let checkpointing = Arc::new(Mutex::new(()));
    let held = Arc::clone(&checkpointing);
    writer
        .wal_hook(Some(
            move |wal: &mut rusqlite::hooks::Wal, pages: std::ffi::c_int| {
                if pages >= WRITER_CHECKPOINT_PAGES {
                    let _turn = held
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if let Err(e) = wal.checkpoint_v2(rusqlite::wal::CheckpointMode::PASSIVE) {
                        tracing::warn!(error = %e, "sqlite could not checkpoint the WAL");
                    }
                } else if pages >= CHECKPOINT_PAGES {
                    // Full: one is asked for already, and covers these pages too.
                    let _ = ask.try_send(());
                }
                Ok(())
            },
        ))
        .map_err(|e| std::io::Error::other(format!("sqlite WAL hook: {e}")))?;
    std::thread::Builder::new()
        .name("cairn-sqlite-checkpointer".into())
        .spawn(move || {
            while asked.recv().is_ok() {
                let _turn = checkpointing
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                checkpoint(&checkpoints, &counts);
            }
            drop(checkpoints);
            drop(lock);
        })
}

/// One `PASSIVE` checkpoint: as much of the WAL as no reader still needs goes into the
/// database, without waiting for anyone.
fn checkpoint(conn: &Connection, counts: &Counts) {
    match conn.wal_checkpoint_v2(Some("main"), rusqlite::wal::CheckpointMode::PASSIVE) {
        Ok(_) => {
            counts
                .checkpoints
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Err(e) => tracing::warn!(error = %e, "sqlite could not checkpoint the WAL"),
    }
}

fn writer_loop(
    conn: &Connection,
    rx: &Receiver<WriteJob>,
    counts: &Counts,
    syncer: Option<&Syncer>,
) {
    crate::history::ConfigIds::keep_on_this_thread();
    let writer = Writer::new(conn);
    let durable = syncer.map(|s| &*s.durable);
    let mut jobs: Vec<WriteJob> = Vec::new();
    let mut stopped = false;
    // The next group's first job, when it was already queued as the last one committed.
    let mut queued: Option<WriteJob> = None;
    while let Some(first) = queued.take().or_else(|| next_job(rx)) {
        jobs.push(first);
        while jobs.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        if let Some(failure) = durable.and_then(Durable::failure) {
            // A sync failed: nothing more is written, nor checkpointed (`syncer`'s doc).
            if !stopped {
                stop_checkpoints(conn);
                stopped = true;
            }
            for job in jobs.drain(..) {
                job.work.complete(Err(failure.clone()));
            }
            continue;
        }
        let before = conn.total_changes();
        let n = jobs.len() as u64;
        let mut committing = std::time::Duration::ZERO;
        let group = run_group(&writer, jobs.drain(..), &mut committing, durable);
        let changed = conn.total_changes() != before;
        if group.outcome.is_ok() && changed {
            use std::sync::atomic::Ordering::Relaxed;
            counts.commits.fetch_add(1, Relaxed);
            counts.jobs.fetch_add(n, Relaxed);
            let nanos = u64::try_from(committing.as_nanos()).unwrap_or(u64::MAX);
            counts.commit_nanos.fetch_add(nanos, Relaxed);
        }
        match (syncer, group.seq) {
            (Some(syncer), Some(seq)) => {
                queued = rx.try_recv().ok();
                let group = Committed {
                    seq,
                    changed,
                    outcome: group.outcome,
                    jobs: group.jobs,
                };
                syncer.settle(group, queued.is_some());
            }
            _ => {
                for work in group.jobs {
                    work.complete(group.outcome.clone());
                }
            }
        }
    }
}

/// After a failed sync of the WAL: no checkpoint more, automatic or at close, copies into
/// the database frames whose write-back failed (`syncer`'s doc).
fn stop_checkpoints(conn: &Connection) {
    let stopped = conn
        .pragma_update(None, "wal_autocheckpoint", 0)
        .and_then(|()| {
            conn.set_db_config(
                rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
                true,
            )
        });
    if let Err(e) = stopped {
        tracing::error!(error = %e, "sqlite could not turn its checkpoints off after a failed sync");
    }
}

/// Closed cleanly: fold the WAL into the database and cut it to zero bytes, so a stopped
/// engine leaves no log behind however large a burst made it.
fn close(conn: &Connection) {
    match conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        r.get::<_, i64>(0)
    }) {
        Ok(0) => {}
        Ok(_) => tracing::warn!("sqlite WAL checkpoint at close was blocked by a reader"),
        Err(e) => tracing::warn!(error = %e, "sqlite could not checkpoint the WAL at close"),
    }
}

/// A group's jobs once run, to answer with the outcome of its transaction.
struct Group {
    /// The number [`Durable::begin`] gave its `COMMIT`, if it got that far with a syncer.
    seq: Option<u64>,
    outcome: Result<()>,
    jobs: Vec<Box<dyn Work>>,
}

/// Runs `jobs` in one transaction, numbering its `COMMIT` with `durable` if there is one.
/// Adds the time its `COMMIT` took to `committing`.
fn run_group(
    conn: &Writer<'_>,
    jobs: impl Iterator<Item = WriteJob>,
    committing: &mut std::time::Duration,
    durable: Option<&Durable>,
) -> Group {
    let mut completions: Vec<Box<dyn Work>> = Vec::new();
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        // Run nothing. Dropping a job drops its reply channel, which its caller sees as
        // `Error::Unavailable`.
        tracing::error!(error = %e, "sqlite could not begin a write transaction");
        jobs.for_each(drop);
        return Group {
            seq: None,
            outcome: Err(map_sqlite(e)),
            jobs: Vec::new(),
        };
    }
    LogIds::began();
    let mut jobs = jobs.into_iter();
    // Set when the group's transaction can no longer be trusted: a savepoint statement
    // failed, or SQLite rolled the whole transaction back by itself (after SQLITE_FULL,
    // IOERR or NOMEM it may), leaving the connection in autocommit mode where every later
    // statement would commit on its own while its caller is told the group failed.
    let mut broken: Option<String> = None;
    for job in jobs.by_ref() {
        if !job.fenced
            && let Err(e) = conn.execute_batch("SAVEPOINT job")
        {
            broken = Some(format!("savepoint failed: {e}"));
            drop(job);
            break;
        }
        let before = conn.total_changes();
        let mut work = job.work;
        let kept = work.run(conn);
        completions.push(work);
        if conn.is_autocommit() {
            broken = Some("sqlite rolled back the group's transaction".into());
            break;
        }
        if job.fenced {
            if let Err(why) = kept
                && conn.total_changes() != before
            {
                // Every job of the group is told, with the cause, so the one bad row or
                // broken store behind it can be found.
                broken = Some(format!("a fenced job failed after it had written: {why}"));
                break;
            }
            continue;
        }
        let end = if kept.is_ok() {
            "RELEASE job"
        } else {
            ConfigIds::rolled_back();
            LogIds::rolled_back_to_savepoint();
            "ROLLBACK TO job; RELEASE job"
        };
        if let Err(e) = conn.execute_batch(end) {
            broken = Some(format!("savepoint end failed: {e}"));
            break;
        }
    }
    let mut seq = None;
    let outcome = match broken {
        Some(reason) => {
            // Jobs not yet run are dropped unrun; every job that ran is undone with the
            // transaction and told so.
            tracing::error!(reason = %reason, "sqlite group commit abandoned");
            jobs.for_each(drop);
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            ConfigIds::rolled_back();
            Err(Error::Unavailable(reason))
        }
        None => {
            metrics::histogram!(cairn_store::BATCH_METRIC).record(completions.len() as f64);
            // Numbered before it runs: a reader that sees it reads its number after.
            seq = durable.map(Durable::begin);
            let began = std::time::Instant::now();
            let outcome = conn.execute_batch("COMMIT").map_err(map_sqlite);
            *committing += began.elapsed();
            if outcome.is_err() && !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            match outcome {
                Ok(()) => ConfigIds::committed(),
                Err(_) => ConfigIds::rolled_back(),
            }
            outcome
        }
    };
    LogIds::ended();
    Group {
        seq,
        outcome,
        jobs: completions,
    }
}

pub(crate) struct Readers {
    tx: Mutex<Option<Sender<ReadJob>>>,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl Readers {
    pub(crate) fn spawn(conns: Vec<Connection>, lock: &DatabaseLock) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<ReadJob>();
        let rx = Arc::new(Mutex::new(rx));
        let mut handles = Vec::new();
        for (i, conn) in conns.into_iter().enumerate() {
            let rx = Arc::clone(&rx);
            let lock = Arc::clone(lock);
            handles.push(
                std::thread::Builder::new()
                    .name(format!("cairn-sqlite-reader-{i}"))
                    .spawn(move || {
                        loop {
                            let job = {
                                let Ok(guard) = rx.lock() else { break };
                                match guard.recv() {
                                    Ok(job) => job,
                                    Err(_) => break,
                                }
                            };
                            job(&conn);
                        }
                        drop(conn);
                        drop(lock);
                    })?,
            );
        }
        Ok(Readers {
            tx: Mutex::new(Some(tx)),
            handles: Mutex::new(handles),
        })
    }

    pub(crate) fn send(&self, job: ReadJob) -> Result<()> {
        let guard = self
            .tx
            .lock()
            .map_err(|_| Error::Unavailable("reader pool poisoned".into()))?;
        match guard.as_ref() {
            Some(tx) => tx
                .send(job)
                .map_err(|_| Error::Unavailable("the store is closed".into())),
            None => Err(Error::Unavailable("the store is closed".into())),
        }
    }

    pub(crate) fn close(&self) -> Vec<JoinHandle<()>> {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        self.handles
            .lock()
            .map(|mut h| std::mem::take(&mut *h))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    type Outcomes = Arc<Mutex<Vec<(&'static str, Result<()>)>>>;

    /// [`super::run_group`], its `COMMIT`'s time left uncounted.
    fn run_group(conn: &Writer<'_>, jobs: impl Iterator<Item = WriteJob>) -> bool {
        let mut uncounted = std::time::Duration::ZERO;
        let group = super::run_group(conn, jobs, &mut uncounted, None);
        let committed = group.outcome.is_ok();
        for work in group.jobs {
            work.complete(group.outcome.clone());
        }
        committed
    }

    /// What a test job answers with, once its group's outcome is known.
    type Completion = Box<dyn FnOnce(Result<()>) + Send>;

    /// A test job from a closure returning whether it keeps its writes and what it answers.
    struct Closure<F>(Option<F>, Option<Completion>);

    impl<F> Work for Closure<F>
    where
        F: FnOnce(&Writer<'_>) -> (std::result::Result<(), String>, Completion) + Send,
    {
        fn run(&mut self, conn: &Writer<'_>) -> std::result::Result<(), String> {
            let (kept, completion) = (self.0.take().expect("a job runs once"))(conn);
            self.1 = Some(completion);
            kept
        }

        fn complete(self: Box<Self>, commit: Result<()>) {
            if let Some(completion) = self.1 {
                completion(commit);
            }
        }
    }

    fn work<F>(f: F) -> Box<dyn Work>
    where
        F: FnOnce(&Writer<'_>) -> (std::result::Result<(), String>, Completion) + Send + 'static,
    {
        Box::new(Closure(Some(f), None))
    }

    fn job(
        name: &'static str,
        sql: &'static str,
        outcomes: &Outcomes,
        ran: Option<Arc<AtomicBool>>,
    ) -> WriteJob {
        job_with(name, sql, outcomes, ran, false)
    }

    fn job_with(
        name: &'static str,
        sql: &'static str,
        outcomes: &Outcomes,
        ran: Option<Arc<AtomicBool>>,
        fenced: bool,
    ) -> WriteJob {
        let outcomes = Arc::clone(outcomes);
        WriteJob {
            work: work(move |conn| {
                if let Some(ran) = ran {
                    ran.store(true, Ordering::SeqCst);
                }
                let kept = conn.execute_batch(sql).map_err(|e| e.to_string());
                let completion: Completion = Box::new(move |result| {
                    outcomes.lock().unwrap().push((name, result));
                });
                (kept, completion)
            }),
            fenced,
        }
    }

    fn rows(conn: &Connection) -> i64 {
        conn.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    /// A job after which SQLite has rolled the whole transaction back (here the job does it
    /// itself, as SQLite may after SQLITE_FULL, IOERR or NOMEM): no job's writes survive,
    /// every job that ran is told it failed, and the jobs after it never run. Before, the
    /// later jobs ran in autocommit mode and their writes landed while their callers were
    /// told the group failed.
    #[test]
    fn a_group_whose_transaction_vanishes_fails_every_job_and_commits_nothing() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER)").unwrap();
        let outcomes = Outcomes::default();
        let third_ran = Arc::new(AtomicBool::new(false));
        let jobs = vec![
            job("first", "INSERT INTO t VALUES (1)", &outcomes, None),
            job(
                "vanishing",
                "INSERT INTO t VALUES (2); ROLLBACK",
                &outcomes,
                None,
            ),
            job(
                "third",
                "INSERT INTO t VALUES (3)",
                &outcomes,
                Some(Arc::clone(&third_ran)),
            ),
        ];
        run_group(&Writer::new(&conn), jobs.into_iter());
        assert_eq!(rows(&conn), 0, "nothing of the group may land");
        assert!(
            !third_ran.load(Ordering::SeqCst),
            "a job after the break must not run"
        );
        let outcomes = outcomes.lock().unwrap();
        assert_eq!(outcomes.len(), 2, "{outcomes:?}");
        assert!(outcomes.iter().all(|(_, r)| r.is_err()), "{outcomes:?}");
        // The connection is usable for the next group.
        let next = Outcomes::default();
        run_group(
            &Writer::new(&conn),
            vec![job("next", "INSERT INTO t VALUES (4)", &next, None)].into_iter(),
        );
        assert_eq!(rows(&conn), 1);
        assert!(next.lock().unwrap()[0].1.is_ok());
    }

    /// A real SQLITE_FULL in the middle of a group: SQLite rolls the whole transaction back
    /// (seen here with `max_page_count`), so the group fails as a whole and the job after
    /// the full one never runs. Before, that job ran in autocommit mode and its row landed
    /// although every caller was told the group failed.
    #[test]
    fn a_full_database_mid_group_fails_the_group_without_running_the_rest() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x)").unwrap();
        let pages: i64 = conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .unwrap();
        conn.query_row(
            &format!("PRAGMA max_page_count = {}", pages + 2),
            [],
            |_| Ok(()),
        )
        .unwrap();
        let outcomes = Outcomes::default();
        let after_ran = Arc::new(AtomicBool::new(false));
        let jobs = vec![
            job("small", "INSERT INTO t VALUES (1)", &outcomes, None),
            job(
                "huge",
                "INSERT INTO t VALUES (zeroblob(1000000))",
                &outcomes,
                None,
            ),
            job(
                "after",
                "INSERT INTO t VALUES (3)",
                &outcomes,
                Some(Arc::clone(&after_ran)),
            ),
        ];
        run_group(&Writer::new(&conn), jobs.into_iter());
        let outcomes = outcomes.lock().unwrap();
        // Whatever SQLite did with the transaction, the callers' view and the data agree.
        if conn
            .query_row("SELECT COUNT(*) FROM t WHERE x = 1", [], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap()
            == 0
        {
            assert!(outcomes.iter().all(|(_, r)| r.is_err()), "{outcomes:?}");
            assert!(
                !after_ran.load(Ordering::SeqCst),
                "no job runs after the group broke"
            );
            assert_eq!(rows(&conn), 0);
        } else {
            assert!(outcomes.iter().all(|(_, r)| r.is_ok()), "{outcomes:?}");
            assert_eq!(rows(&conn), 2);
        }
    }

    /// A job with a savepoint that fails after writing is undone alone; a fenced job that
    /// fails at its fence (before writing) costs nothing either; the others commit.
    #[test]
    fn a_failing_job_is_undone_alone_and_a_fenced_one_fails_before_writing() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER CHECK (x < 100))")
            .unwrap();
        let outcomes = Outcomes::default();
        let jobs = vec![
            job_with("fenced", "INSERT INTO t VALUES (1)", &outcomes, None, true),
            job(
                "half",
                "INSERT INTO t VALUES (2); INSERT INTO t VALUES (200)",
                &outcomes,
                None,
            ),
            job_with(
                "fence fails",
                "INSERT INTO t VALUES (300)",
                &outcomes,
                None,
                true,
            ),
            job_with("last", "INSERT INTO t VALUES (3)", &outcomes, None, true),
        ];
        run_group(&Writer::new(&conn), jobs.into_iter());
        let xs: Vec<i64> = conn
            .prepare("SELECT x FROM t ORDER BY x")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(xs, vec![1, 3], "the half-done job is undone alone");
        let outcomes = outcomes.lock().unwrap();
        assert_eq!(outcomes.len(), 4, "{outcomes:?}");
        assert!(
            outcomes.iter().all(|(_, r)| r.is_ok()),
            "the commit went through: {outcomes:?}"
        );
    }

    /// A job whose configuration id was learnt in memory and then undone: the writer
    /// thread's cache of configuration ids (`history::ConfigIds`) forgets it, whether its
    /// own savepoint or the whole group was rolled back, so the next use stores the
    /// configuration again instead of naming a row that is gone. Committed ids are kept.
    #[test]
    fn a_configuration_id_learnt_in_a_rolled_back_job_or_group_is_forgotten() {
        crate::history::ConfigIds::keep_on_this_thread();
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE configs (id INTEGER PRIMARY KEY, config TEXT NOT NULL UNIQUE);
             CREATE TABLE uses (config INTEGER NOT NULL)",
        )
        .unwrap();
        let using = |config: &'static str, fenced: bool, fail: bool| WriteJob {
            work: work(move |conn| {
                let kept = crate::history::config_id(conn, config)
                    .map_err(|e| e.to_string())
                    .and_then(|id| {
                        conn.execute("INSERT INTO uses VALUES (?1)", [id])
                            .map_err(|e| e.to_string())
                    })
                    .and_then(|_| {
                        if fail {
                            Err("fails".to_owned())
                        } else {
                            Ok(())
                        }
                    });
                (kept, Box::new(|_: Result<()>| {}))
            }),
            fenced,
        };
        let dangling = |conn: &Connection| -> i64 {
            conn.query_row(
                "SELECT COUNT(*) FROM uses WHERE config NOT IN (SELECT id FROM configs)",
                [],
                |r| r.get(0),
            )
            .unwrap()
        };
        // Learnt in a job undone by its savepoint, then used.
        assert!(run_group(
            &Writer::new(&conn),
            vec![using("a", false, true)].into_iter()
        ));
        assert!(run_group(
            &Writer::new(&conn),
            vec![using("a", false, false)].into_iter()
        ));
        assert_eq!(
            dangling(&conn),
            0,
            "the id of a job rolled back to its savepoint"
        );
        // Learnt in a group abandoned (a fenced job failed after writing), then used.
        assert!(!run_group(
            &Writer::new(&conn),
            vec![using("b", false, false), using("c", true, true)].into_iter()
        ));
        assert!(run_group(
            &Writer::new(&conn),
            vec![using("b", false, false), using("c", false, false)].into_iter()
        ));
        assert_eq!(dangling(&conn), 0, "the ids of an abandoned group");
        // Committed ones are kept: no new row for a configuration seen before.
        assert!(run_group(
            &Writer::new(&conn),
            vec![using("a", true, false)].into_iter()
        ));
        let rows: i64 = conn
            .query_row("SELECT COUNT(*) FROM configs", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 3);
        assert_eq!(dangling(&conn), 0);
    }

    /// The writer's held statements (`held.rs`) outlive its groups: used in a job rolled
    /// back to its savepoint, in a group abandoned and in groups committed, they write only
    /// what committed, and none keeps a read open that would stop the checkpoint at close.
    #[test]
    fn held_statements_outlive_rolled_back_jobs_and_abandoned_groups() {
        use crate::held::{Held, Statements};
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("held.db")).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER)").unwrap();
        let writer = Writer::new(&conn);
        let insert = |x: i64, fenced: bool, fail: bool| WriteJob {
            work: work(move |conn| {
                let kept = conn
                    .with_held(Held::LogRow, "INSERT INTO t (x) VALUES (?1)", |st| {
                        st.execute([x])
                    })
                    .and_then(|_| {
                        // A held query too, as the lease check is.
                        conn.with_held(Held::Lease, "SELECT COUNT(*) FROM t", |st| {
                            st.query_row([], |r| r.get::<_, i64>(0))
                        })
                    })
                    .map_err(|e| e.to_string())
                    .and_then(|_| if fail { Err("fails".into()) } else { Ok(()) });
                (kept, Box::new(|_: Result<()>| {}))
            }),
            fenced,
        };
        // 2 is undone by its savepoint; 1 and 3 commit.
        let group = vec![
            insert(1, false, false),
            insert(2, false, true),
            insert(3, false, false),
        ];
        assert!(run_group(&writer, group.into_iter()));
        // A fenced job fails after writing: its group is abandoned, 4 and 5 do not land.
        assert!(!run_group(
            &writer,
            vec![insert(4, false, false), insert(5, true, true)].into_iter()
        ));
        assert!(run_group(&writer, vec![insert(6, true, false)].into_iter()));
        let kept: Vec<i64> = conn
            .prepare("SELECT x FROM t ORDER BY x")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(kept, [1, 3, 6]);
        // Another connection's checkpoint finds no reader holding the log back.
        let other = Connection::open(dir.path().join("held.db")).unwrap();
        let busy: i64 = other
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .unwrap();
        assert_eq!(busy, 0, "a held statement keeps a read open");
    }

    /// A fenced job that fails after it has written cannot be undone alone: the group is
    /// abandoned, nothing of it lands, every job that ran is told, and later jobs never run.
    #[test]
    fn a_fenced_job_that_fails_after_writing_abandons_the_group() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER CHECK (x < 100))")
            .unwrap();
        let outcomes = Outcomes::default();
        let later_ran = Arc::new(AtomicBool::new(false));
        let jobs = vec![
            job("first", "INSERT INTO t VALUES (1)", &outcomes, None),
            job_with(
                "wrote then failed",
                "INSERT INTO t VALUES (2); INSERT INTO t VALUES (200)",
                &outcomes,
                None,
                true,
            ),
            job_with(
                "later",
                "INSERT INTO t VALUES (3)",
                &outcomes,
                Some(Arc::clone(&later_ran)),
                true,
            ),
        ];
        run_group(&Writer::new(&conn), jobs.into_iter());
        assert_eq!(rows(&conn), 0, "nothing of the group may land");
        assert!(!later_ran.load(Ordering::SeqCst));
        let outcomes = outcomes.lock().unwrap();
        assert_eq!(outcomes.len(), 2, "{outcomes:?}");
        assert!(outcomes.iter().all(|(_, r)| r.is_err()), "{outcomes:?}");
        // The cause travels with the error.
        let told = format!("{:?}", outcomes[0].1);
        assert!(told.contains("CHECK constraint failed"), "{told}");
    }
}
