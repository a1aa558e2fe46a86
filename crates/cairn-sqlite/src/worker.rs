//! The threads that own the SQLite connections.
//!
//! One writer thread owns the only write connection. It takes every queued job, runs them
//! in one `BEGIN IMMEDIATE` transaction, each inside its own savepoint so a failing job is
//! undone alone, and commits once: many engine writes, one fsync (group commit). Replies are
//! sent only after the commit, so a caller never sees a write that is not durable.
//!
//! Reader threads each own a read connection and serve queries, so no tokio worker thread
//! ever blocks on SQLite.

use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use cairn_store::{Error, Result};
use rusqlite::Connection;

/// Called once with the outcome of the commit its job was part of.
pub(crate) type Completion = Box<dyn FnOnce(Result<()>) + Send>;
/// A write job: runs inside the group transaction; `Ok` keeps its writes.
pub(crate) type WriteJob = Box<dyn FnOnce(&Connection) -> (bool, Completion) + Send>;
/// A read job.
pub(crate) type ReadJob = Box<dyn FnOnce(&Connection) + Send>;

/// The most jobs one group commit takes.
const MAX_GROUP: usize = 4096;

pub(crate) fn map_sqlite(e: rusqlite::Error) -> Error {
    Error::Unavailable(e.to_string())
}

pub(crate) fn spawn_writer(
    mut conn: Connection,
    lock: std::fs::File,
) -> std::io::Result<(Sender<WriteJob>, JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::channel::<WriteJob>();
    let handle = std::thread::Builder::new()
        .name("cairn-sqlite-writer".into())
        .spawn(move || {
            // The lock file lives as long as the writer: one engine per database file.
            let _lock = lock;
            writer_loop(&mut conn, &rx);
        })?;
    Ok((tx, handle))
}

fn writer_loop(conn: &mut Connection, rx: &Receiver<WriteJob>) {
    let mut jobs: Vec<WriteJob> = Vec::new();
    while let Ok(first) = rx.recv() {
        jobs.push(first);
        while jobs.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        run_group(conn, jobs.drain(..));
    }
    // Closed cleanly: fold the WAL into the database and cut it to zero bytes, so a stopped
    // engine leaves no log behind however large a burst made it.
    match conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        r.get::<_, i64>(0)
    }) {
        Ok(0) => {}
        Ok(_) => tracing::warn!("sqlite WAL checkpoint at close was blocked by a reader"),
        Err(e) => tracing::warn!(error = %e, "sqlite could not checkpoint the WAL at close"),
    }
}

fn run_group(conn: &Connection, jobs: impl Iterator<Item = WriteJob>) {
    let mut completions: Vec<Completion> = Vec::new();
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        // Run nothing. Dropping a job drops its reply channel, which its caller sees as
        // `Error::Unavailable`.
        tracing::error!(error = %e, "sqlite could not begin a write transaction");
        jobs.for_each(drop);
        return;
    }
    for job in jobs {
        let savepoint = conn.execute_batch("SAVEPOINT job");
        let (keep, completion) = job(conn);
        if savepoint.is_ok() {
            let end = if keep {
                "RELEASE job"
            } else {
                "ROLLBACK TO job; RELEASE job"
            };
            if let Err(e) = conn.execute_batch(end) {
                tracing::error!(error = %e, "sqlite savepoint end failed");
            }
        }
        completions.push(completion);
    }
    let outcome = conn.execute_batch("COMMIT").map_err(map_sqlite);
    if outcome.is_err() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    for completion in completions {
        completion(outcome.clone());
    }
}

pub(crate) struct Readers {
    tx: Mutex<Option<Sender<ReadJob>>>,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl Readers {
    pub(crate) fn spawn(conns: Vec<Connection>) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<ReadJob>();
        let rx = Arc::new(Mutex::new(rx));
        let mut handles = Vec::new();
        for (i, conn) in conns.into_iter().enumerate() {
            let rx = Arc::clone(&rx);
            handles.push(
                std::thread::Builder::new()
                    .name(format!("cairn-sqlite-reader-{i}"))
                    .spawn(move || {
                        loop {
                            let job = {
                                let Ok(guard) = rx.lock() else { return };
                                match guard.recv() {
                                    Ok(job) => job,
                                    Err(_) => return,
                                }
                            };
                            job(&conn);
                        }
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
