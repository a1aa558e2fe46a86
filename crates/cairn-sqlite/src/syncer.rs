//! With [`crate::Durability::Full`], the sync of the WAL, on a thread of its own.
//!
//! SQLite's `synchronous = FULL` syncs the WAL inside every `COMMIT`: the writer thread
//! sleeps on the disk (a fifth of its time in `cairn-bench throughput`) while the jobs of
//! the next group wait. Instead, the writer commits with `synchronous = NORMAL` (SQLite
//! writes the WAL, and syncs it before any checkpoint copies it and at every restart of the
//! log, but not at a commit) and hands the group to this thread, which syncs the WAL file and
//! only then answers the group's callers. Meanwhile the writer runs the next group. A
//! caller is answered after its write is durable, exactly as with SQLite's own sync; one
//! sync covers every group committed before it began. When no job is queued behind the
//! group and none handed over is unanswered, the writer syncs and answers it itself
//! ([`Syncer::settle`]): there is nothing to overlap, and one instance's steps, committed
//! one after the other, would otherwise pay a thread's wake-up on every commit.
//!
//! What a reader may see in between is gated too ([`Durable::wait`]): a read answers only
//! once every commit it could have seen is synced, so nothing that power loss could still
//! take back leaves the store.
//!
//! A failed sync cannot be taken back: the commits are in the WAL, later groups may build
//! on them, and after a failed `fsync` Linux may report the next one as successful with the
//! pages lost. So the store stops there: the groups not yet answered, every later write and
//! every read waiting on them fail with [`Error::Unavailable`] (whether those commits stay
//! is unknown, as for a commit whose answer is lost), and the writer checkpoints no more,
//! not even at close: a checkpoint would copy into the database whatever the page cache
//! holds of frames whose write-back failed. (SQLite's own checkpoint, in a `COMMIT` the
//! writer made before it saw the failure, syncs the WAL first on its own descriptor, and
//! Linux reports the failed write-back to every descriptor open then: that sync fails
//! too, and so does the checkpoint.) The next open recovers the database from the WAL
//! as SQLite reads it then, frames checked by their checksums: after a reboot, what reached
//! the disk; without one, the page cache may still hold frames whose write-back failed, and
//! serve them. Either way the commits answered with an error may stay or not, as for a
//! commit whose answer is lost: a step whose success was among them runs again if it did
//! not stay. The same happens if this
//! thread dies, or the writer between numbering a commit and handing it over: readers
//! waiting on those commits would otherwise wait for ever.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::thread::JoinHandle;

use cairn_store::{Error, Result};

use crate::job::Work;

/// Which commits are durable, shared by the writer, the syncer and the readers.
pub(crate) struct Durable {
    /// The last commit begun: the writer numbers each `COMMIT` (from 1) before it runs it,
    /// so a reader that read this after its query knows every commit it could have seen.
    begun: AtomicU64,
    /// Every commit up to this one is synced (or has failed and was answered so).
    synced: tokio::sync::watch::Sender<u64>,
    /// A sync failed: see the module's doc.
    failed: AtomicBool,
    /// Groups handed over to the syncer thread and not yet answered.
    pub(crate) handed_over: AtomicUsize,
    /// Every group is handed over to the syncer thread (a test of that path).
    #[cfg(test)]
    pub(crate) always_hand_over: AtomicBool,
    /// Held by the syncer around each sync: a test holds it to keep commits unsynced.
    #[cfg(test)]
    pub(crate) hold: std::sync::Mutex<()>,
    /// The next sync fails (a test's disk error).
    #[cfg(test)]
    pub(crate) fail_next: AtomicBool,
    /// The next sync panics (a bug in this thread).
    #[cfg(test)]
    pub(crate) panic_next: AtomicBool,
    /// Groups the writer synced and answered itself.
    #[cfg(test)]
    pub(crate) settled_by_writer: AtomicU64,
    /// Reads that had to wait for a sync.
    #[cfg(test)]
    pub(crate) gated: AtomicU64,
    /// The file synced, to check it is SQLite's WAL.
    #[cfg(test)]
    pub(crate) file: std::fs::Metadata,
}

impl Durable {
    fn new(file: &std::fs::File) -> std::io::Result<Self> {
        #[cfg(not(test))]
        let _ = file;
        Ok(Durable {
            begun: AtomicU64::new(0),
            synced: tokio::sync::watch::Sender::new(0),
            failed: AtomicBool::new(false),
            handed_over: AtomicUsize::new(0),
            #[cfg(test)]
            always_hand_over: AtomicBool::new(false),
            #[cfg(test)]
            hold: std::sync::Mutex::new(()),
            #[cfg(test)]
            fail_next: AtomicBool::new(false),
            #[cfg(test)]
            panic_next: AtomicBool::new(false),
            #[cfg(test)]
            settled_by_writer: AtomicU64::new(0),
            #[cfg(test)]
            gated: AtomicU64::new(0),
            #[cfg(test)]
            file: file.metadata()?,
        })
    }

    /// Numbers the commit the writer is about to run.
    pub(crate) fn begin(&self) -> u64 {
        self.begun.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The last commit begun; read by a reader after its query.
    pub(crate) fn begun(&self) -> u64 {
        self.begun.load(Ordering::SeqCst)
    }

    /// Whether a sync has failed (or the syncer died): see the module's doc.
    pub(crate) fn has_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// The error every write and gated read gets once a sync has failed.
    pub(crate) fn failure(&self) -> Option<Error> {
        self.has_failed().then(|| {
            Error::Unavailable(
                "the SQLite WAL could not be synced to disk: the store accepts nothing more until the engine restarts".into(),
            )
        })
    }

    /// Returns once commit `seen` and every one before it is durable (at once if it is
    /// already); an error if a sync failed first.
    pub(crate) async fn wait(&self, seen: u64) -> Result<()> {
        if *self.synced.borrow() < seen {
            #[cfg(test)]
            self.gated.fetch_add(1, Ordering::SeqCst);
            let mut synced = self.synced.subscribe();
            // The sender lives as long as `self`: the wait ends by a sync or a failure.
            let _ = synced
                .wait_for(|&synced| synced >= seen || self.has_failed())
                .await;
        }
        match self.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// A committed (or failed) group, waiting for the sync that covers it.
pub(crate) struct Committed {
    /// Its commit's number ([`Durable::begin`]).
    pub(crate) seq: u64,
    /// Whether the commit wrote anything (a group of empty claims did not: no sync).
    pub(crate) changed: bool,
    /// The commit's outcome, as the writer saw it.
    pub(crate) outcome: Result<()>,
    /// Its jobs, to answer.
    pub(crate) jobs: Vec<Box<dyn Work>>,
}

/// The writer's end of the syncer.
pub(crate) struct Syncer {
    pub(crate) durable: Arc<Durable>,
    /// The WAL, synced here too when the writer settles a group itself.
    file: Arc<std::fs::File>,
    tx: Sender<Committed>,
}

impl Syncer {
    /// Settles a group the writer has committed: handed over to the syncer thread when the
    /// writer has more to run (`more`), so the sync overlaps the next group; else synced
    /// and answered on the calling thread, which has nothing better to do, and a lone
    /// caller (one instance's steps, one after the other) does not pay the hand-over's
    /// wake-up on every commit. Only when no group handed over is still unanswered, so
    /// groups are answered in the order they committed.
    pub(crate) fn settle(&self, group: Committed, more: bool) {
        #[cfg(test)]
        let more = more || self.durable.always_hand_over.load(Ordering::SeqCst);
        if !more && self.durable.handed_over.load(Ordering::SeqCst) == 0 {
            #[cfg(test)]
            self.durable
                .settled_by_writer
                .fetch_add(1, Ordering::SeqCst);
            settle(&self.file, &self.durable, &mut vec![group]);
            return;
        }
        self.durable.handed_over.fetch_add(1, Ordering::SeqCst);
        if let Err(std::sync::mpsc::SendError(group)) = self.tx.send(group) {
            self.durable.handed_over.fetch_sub(1, Ordering::SeqCst);
            let gone = Error::Unavailable("the SQLite syncer thread is gone".into());
            for job in group.jobs {
                job.complete(Err(gone.clone()));
            }
        }
    }
}

/// The WAL of the database at `db`, as SQLite names it: the database's full path, links
/// resolved, and `-wal`.
pub(crate) fn wal_of(db: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    let mut wal = std::fs::canonicalize(db)?.into_os_string();
    wal.push("-wal");
    Ok(wal.into())
}

/// Starts the syncer thread for the WAL file `wal`, which exists (the schema's migration
/// wrote it). Dropping the [`Syncer`] ends it once every group handed over is answered.
pub(crate) fn spawn(wal: &std::path::Path) -> std::io::Result<(Syncer, JoinHandle<()>)> {
    // Any descriptor of the file syncs its data: this one is only ever synced.
    let file = Arc::new(std::fs::File::open(wal)?);
    let durable = Arc::new(Durable::new(&file)?);
    let (tx, rx) = std::sync::mpsc::channel::<Committed>();
    let (shared, synced) = (Arc::clone(&durable), Arc::clone(&file));
    let handle = std::thread::Builder::new()
        .name("cairn-sqlite-syncer".into())
        .spawn(move || sync_loop(&synced, &rx, &shared))?;
    Ok((Syncer { durable, file, tx }, handle))
}

fn sync_loop(file: &std::fs::File, rx: &Receiver<Committed>, durable: &Durable) {
    let _ended = Ended(durable);
    let mut groups: Vec<Committed> = Vec::new();
    while let Ok(first) = rx.recv() {
        groups.push(first);
        groups.extend(rx.try_iter());
        let n = groups.len();
        settle(file, durable, &mut groups);
        // Only once they are answered: the writer settles a group itself only when none
        // is left here.
        durable.handed_over.fetch_sub(n, Ordering::SeqCst);
    }
}

/// Syncs the WAL once for `groups` (if any of them wrote), publishes them synced, and
/// answers their callers.
fn settle(file: &std::fs::File, durable: &Durable, groups: &mut Vec<Committed>) {
    // After a failure nothing more is synced: every group is answered with it.
    let synced = if groups.iter().any(|g| g.changed) && !durable.has_failed() {
        sync(file, durable)
    } else {
        Ok(())
    };
    let Some(last) = groups.last().map(|g| g.seq) else {
        return;
    };
    if let Err(e) = &synced {
        tracing::error!(error = %e, "sqlite could not sync the WAL: the store stops accepting writes");
        durable.failed.store(true, Ordering::SeqCst);
    }
    let failure = durable.failure();
    // Published before the callers are answered: a caller that reads next sees its own
    // write at once. Never backwards (the groups come in order, and the writer settles
    // one itself only when none is handed over; a sync covers every commit before it
    // anyway); always notified, so that a failure wakes every waiter.
    durable
        .synced
        .send_modify(|synced| *synced = (*synced).max(last));
    for group in groups.drain(..) {
        let outcome = match &failure {
            Some(e) => Err(e.clone()),
            None => group.outcome,
        };
        for job in group.jobs {
            job.complete(outcome.clone());
        }
    }
}

/// Dropped when the syncer ends. It ends cleanly once the writer is gone, having handed over
/// every commit it numbered, each answered; else (a panic here, or in the writer between
/// [`Durable::begin`] and the hand-over) commits are left that no sync will cover, and the
/// store stops as after a failed sync, waking the readers waiting on them.
struct Ended<'a>(&'a Durable);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        let durable = self.0;
        if std::thread::panicking() || durable.begun() > *durable.synced.borrow() {
            tracing::error!(
                "the sqlite syncer ended with commits not synced: the store stops accepting writes"
            );
            durable.failed.store(true, Ordering::SeqCst);
            // Wakes every waiter, to see the failure.
            durable.synced.send_modify(|_| {});
        }
    }
}

fn sync(file: &std::fs::File, durable: &Durable) -> std::io::Result<()> {
    #[cfg(test)]
    let _held = durable
        .hold
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    #[cfg(test)]
    if durable.fail_next.swap(false, Ordering::SeqCst) {
        return Err(std::io::Error::other("injected sync failure"));
    }
    #[cfg(test)]
    assert!(
        !durable.panic_next.swap(false, Ordering::SeqCst),
        "injected syncer panic"
    );
    let _ = durable;
    file.sync_data()
}
