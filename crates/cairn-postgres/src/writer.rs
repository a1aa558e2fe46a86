//! The writer: one task per store owning one connection, batching concurrent writes into
//! few transactions, as the SQLite store's writer thread does.
//!
//! It takes every queued job and runs the batchable ones in one transaction, then inserts
//! their records (one statement, ids in commit order, see `history.rs`) and commits once;
//! replies go out only after the commit, so a caller never sees a write that is not
//! durable. An operation's own answer before it wrote (lease lost, not found) leaves the
//! others be. A refused statement aborts the transaction: its jobs then run again one per
//! transaction, so only the failing one fails (a deadlock with another engine, where
//! PostgreSQL picked this transaction to give way, is retried a few times). Management
//! requests and purges, which delete records, run in transactions of their own.
//!
//! A lost connection fails the jobs of its transaction with `Unavailable` (a commit whose
//! answer was lost may have landed: the engine replays from the store, which has the
//! truth) and the next batch takes a new connection from the pool.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cairn_core::{EventType, InstanceStatus, StepKey, Timestamp};
use cairn_store::{
    Claimed, ControlOutcome, ControlRequest, Created, Error, Lease, NewEvent, NewInstance, Result,
    Sent, StoredEvent, Write,
};
use deadpool_postgres::{Object, Pool, Transaction};
use tokio::sync::{mpsc, oneshot};

use crate::batch::Batch;
use crate::db::{Failure, describe};
use crate::history::Configs;
use crate::notify::Notifier;
use crate::ops;

/// The most jobs one transaction takes.
const MAX_GROUP: usize = 1024;

/// How often a transaction that lost a deadlock to another engine is run again.
const CONFLICT_RETRIES: u32 = 5;

/// A write operation.
pub(crate) enum Op {
    Create(Vec<NewInstance>),
    Claim {
        owner: String,
        workflows: Vec<String>,
        now: Timestamp,
        ttl: Duration,
        limit: usize,
    },
    Renew {
        owner: String,
        leases: Vec<Lease>,
        now: Timestamp,
        until: Timestamp,
    },
    Reclaim {
        owner: String,
        lease: Lease,
        now: Timestamp,
        ttl: Duration,
    },
    ReleaseAll {
        owner: String,
    },
    Commit {
        lease: Lease,
        writes: Vec<Write>,
    },
    SendEvent {
        workflow: String,
        id: String,
        event: NewEvent,
    },
    TakeEvent {
        lease: Lease,
        step: StepKey,
        event_type: EventType,
        at: Timestamp,
    },
    Control {
        workflow: String,
        id: String,
        request: ControlRequest,
    },
    Purge {
        now: Timestamp,
        limit: usize,
    },
    FireTick(Box<cairn_store::ScheduleTick>),
    WakeAwaiting {
        workflow: String,
        version: String,
        limit: u64,
    },
}

impl Op {
    /// Runs in a transaction of its own: it deletes records, which must not race records
    /// of the same transaction that are only inserted at its end.
    fn alone(&self) -> bool {
        matches!(
            self,
            Op::Control { .. } | Op::Purge { .. } | Op::FireTick(_) | Op::WakeAwaiting { .. }
        )
    }
}

fn reads_children(writes: &[Write]) -> bool {
    writes
        .iter()
        .any(|w| matches!(w, Write::Hibernate { children, .. } if !children.is_empty()))
}

/// What an operation answers.
pub(crate) enum Reply {
    Created(Vec<Created>),
    Claimed(Vec<Claimed>),
    Renewed(Vec<Lease>),
    Reclaimed(Lease),
    Done,
    Status(InstanceStatus),
    Sent(Sent),
    Taken(Option<StoredEvent>),
    Control(ControlOutcome),
    Purged(usize),
    Fired(cairn_store::TickFired),
    Woken(u64),
}

pub(crate) struct Job {
    pub(crate) op: Op,
    pub(crate) reply: oneshot::Sender<Result<Reply>>,
}

async fn run(tx: &Transaction<'_>, b: &mut Batch<'_>, op: &Op) -> Result<Reply, Failure> {
    Ok(match op {
        Op::Create(batch) => Reply::Created(ops::create(tx, b, batch).await?),
        Op::Claim {
            owner,
            workflows,
            now,
            ttl,
            limit,
        } => Reply::Claimed(ops::claim(tx, b, owner, workflows, *now, *ttl, *limit).await?),
        Op::Renew {
            owner,
            leases,
            now,
            until,
        } => Reply::Renewed(ops::renew(tx, b, owner, leases, *now, *until).await?),
        Op::Reclaim {
            owner,
            lease,
            now,
            ttl,
        } => Reply::Reclaimed(ops::reclaim(tx, b, owner, *lease, *now, *ttl).await?),
        Op::ReleaseAll { owner } => {
            ops::release_all(tx, b, owner).await?;
            Reply::Done
        }
        Op::Commit { lease, writes } => Reply::Status(ops::commit(tx, b, *lease, writes).await?),
        Op::SendEvent {
            workflow,
            id,
            event,
        } => Reply::Sent(ops::send_event(tx, b, workflow, id, event).await?),
        Op::TakeEvent {
            lease,
            step,
            event_type,
            at,
        } => Reply::Taken(ops::take_event(tx, b, *lease, step, event_type, *at).await?),
        Op::Control {
            workflow,
            id,
            request,
        } => Reply::Control(ops::control(tx, b, workflow, id, request).await?),
        Op::Purge { now, limit } => Reply::Purged(ops::purge(tx, b, *now, *limit).await?),
        Op::FireTick(tick) => Reply::Fired(ops::fire_tick(tx, b, tick).await?),
        Op::WakeAwaiting {
            workflow,
            version,
            limit,
        } => Reply::Woken(ops::wake_awaiting(tx, b, workflow, version, *limit).await?),
    })
}

pub(crate) fn spawn(
    pool: Pool,
    notify: Notifier,
    stats: Arc<BatchStats>,
) -> (mpsc::UnboundedSender<Job>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let handle = tokio::spawn(writer_loop(pool, notify, stats, rx));
    (tx, handle)
}

struct Writer {
    pool: Pool,
    notify: Notifier,
    conn: Option<Object>,
    configs: Arc<Configs>,
    folding: crate::counts::Folding,
    stats: Arc<BatchStats>,
}

async fn writer_loop(
    pool: Pool,
    notify: Notifier,
    stats: Arc<BatchStats>,
    mut rx: mpsc::UnboundedReceiver<Job>,
) {
    let mut w = Writer {
        pool,
        notify,
        conn: None,
        configs: Arc::default(),
        folding: crate::counts::Folding::default(),
        stats,
    };
    let mut jobs = Vec::new();
    while let Some(first) = rx.recv().await {
        jobs.push(first);
        while jobs.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let (alone, batched): (Vec<Job>, Vec<Job>) = jobs.drain(..).partition(|j| j.op.alone());
        if !batched.is_empty() {
            w.batch(batched).await;
        }
        for job in alone {
            w.single(job).await;
        }
        if w.folding.due() {
            w.fold_counts().await;
        }
    }
}

impl Writer {
    /// The writer's connection, a new one if it has none or lost it.
    async fn conn(&mut self) -> Result<&mut Object> {
        if self.conn.as_ref().is_some_and(|c| c.is_closed()) {
            self.conn = None;
        }
        if self.conn.is_none() {
            let c = self
                .pool
                .get()
                .await
                .map_err(|e| Error::Unavailable(format!("postgres: no connection: {e}")))?;
            self.conn = Some(c);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| Error::Unavailable("postgres: no connection".into()))
    }

    /// Folds the count deltas (see `counts.rs`); a failure only delays it.
    async fn fold_counts(&mut self) {
        let Ok(conn) = self.conn().await else { return };
        if let Err(e) = crate::counts::fold(conn).await {
            tracing::debug!(error = %e, "folding the instance counts failed; trying again later");
            if conn.is_closed() {
                self.conn = None;
            }
        }
    }

    async fn batch(&mut self, jobs: Vec<Job>) {
        self.stats.record(jobs.len());
        match self.try_batch(&jobs).await {
            Ok(replies) => {
                self.configs.committed();
                for (job, reply) in jobs.into_iter().zip(replies) {
                    let _ = job.reply.send(reply);
                }
            }
            Err(BatchFailed::Unknown(e)) => {
                // The commit's answer was lost: it may have landed. The callers hear of a
                // failure and read the truth from the store.
                self.configs.rolled_back();
                self.conn = None;
                for job in jobs {
                    let _ = job.reply.send(Err(e.clone()));
                }
            }
            Err(BatchFailed::RolledBack) => {
                self.configs.rolled_back();
                for job in jobs {
                    self.single(job).await;
                }
            }
        }
    }

    /// Runs the jobs in one transaction; their answers, if it committed.
    ///
    /// The engine's own writes (commits, event takes, creates) run concurrently, pipelined
    /// on the connection: each is one instance's, and a lifetime has one write in flight at
    /// a time, so none depends on another's statements. A second write to the same instance
    /// in the batch, and every other kind (sends, claims, renewals: several statements
    /// whose interleaving with a write to the same instance could differ from any serial
    /// order), run after them, one at a time.
    async fn try_batch(&mut self, jobs: &[Job]) -> Result<Vec<Result<Reply>>, BatchFailed> {
        let configs = Arc::clone(&self.configs);
        let notify = self.notify.clone();
        let conn = self.conn().await.map_err(BatchFailed::Unknown)?;
        let tx = conn
            .transaction()
            .await
            .map_err(|_| BatchFailed::RolledBack)?;
        let mut seen = std::collections::HashSet::new();
        let (concurrent, serial): (Vec<usize>, Vec<usize>) =
            (0..jobs.len()).partition(|&i| match &jobs[i].op {
                // A hibernation that checks on children reads other instances' rows:
                // after the pipelined writes, so a child's end in this batch is seen.
                Op::Commit { lease, writes } if !reads_children(writes) => {
                    seen.insert(lease.instance)
                }
                Op::TakeEvent { lease, .. } => seen.insert(lease.instance),
                Op::Create(_) => true,
                _ => false,
            });
        let mut replies: Vec<Option<Result<Reply>>> = jobs.iter().map(|_| None).collect();
        let mut all = Batch::new(&configs);
        let outcomes = futures::future::join_all(concurrent.iter().map(|&i| {
            let (tx, configs) = (&tx, &configs);
            async move {
                let mut b = Batch::new(configs);
                let out = run(tx, &mut b, &jobs[i].op).await;
                (i, out, b)
            }
        }))
        .await;
        for (i, out, b) in outcomes {
            replies[i] = Some(settle(out, b, &mut all)?);
        }
        for i in serial {
            let mut b = Batch::new(&configs);
            let out = run(&tx, &mut b, &jobs[i].op).await;
            replies[i] = Some(settle(out, b, &mut all)?);
        }
        notify
            .send(&tx, &all)
            .await
            .map_err(|_| BatchFailed::RolledBack)?;
        all.log
            .flush(&tx, &configs)
            .await
            .map_err(|_| BatchFailed::RolledBack)?;
        tx.commit()
            .await
            .map_err(|e| BatchFailed::Unknown(Error::Unavailable(describe(&e))))?;
        Ok(replies
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::Unavailable("no answer".into()))))
            .collect())
    }

    /// Runs one job in a transaction of its own, again after a deadlock.
    async fn single(&mut self, job: Job) {
        let mut attempt = 0;
        let reply = loop {
            attempt += 1;
            match self.try_single(&job.op).await {
                Ok(reply) => {
                    self.configs.committed();
                    break Ok(reply);
                }
                Err((f, committed_unknown)) => {
                    self.configs.rolled_back();
                    if committed_unknown {
                        self.conn = None;
                        break Err(f.into_store());
                    }
                    if f.is_conflict() && attempt < CONFLICT_RETRIES {
                        continue;
                    }
                    if matches!(f, Failure::Db(_))
                        && self.conn.as_ref().is_some_and(|c| c.is_closed())
                    {
                        self.conn = None;
                    }
                    break Err(f.into_store());
                }
            }
        };
        let _ = job.reply.send(reply);
    }

    async fn try_single(&mut self, op: &Op) -> Result<Reply, (Failure, bool)> {
        let configs = Arc::clone(&self.configs);
        let notify = self.notify.clone();
        let conn = self.conn().await.map_err(|e| (Failure::Store(e), false))?;
        let tx = conn
            .transaction()
            .await
            .map_err(|e| (Failure::Db(e), false))?;
        let mut b = Batch::new(&configs);
        let reply = run(&tx, &mut b, op).await.map_err(|f| (f, false))?;
        notify.send(&tx, &b).await.map_err(|f| (f, false))?;
        b.log.flush(&tx, &configs).await.map_err(|f| (f, false))?;
        tx.commit().await.map_err(|e| (Failure::Db(e), true))?;
        Ok(reply)
    }
}

/// An operation's answer inside a batch: kept with what it wrote, or its own refusal (it
/// wrote nothing, so the others go on); any other failure aborts the transaction.
fn settle<'c>(
    out: Result<Reply, Failure>,
    b: Batch<'c>,
    all: &mut Batch<'c>,
) -> Result<Result<Reply>, BatchFailed> {
    match out {
        Ok(reply) => {
            all.absorb(b);
            Ok(Ok(reply))
        }
        Err(Failure::Store(e)) if !b.wrote => Ok(Err(e)),
        Err(_) => Err(BatchFailed::RolledBack),
    }
}

enum BatchFailed {
    /// Rolled back: nothing was written; the jobs may run again.
    RolledBack,
    /// The outcome is unknown (the connection was lost, maybe during the commit).
    Unknown(Error),
}

/// How many jobs the writer's transactions carried: what batching achieved.
#[derive(Debug, Default)]
pub struct BatchStats {
    transactions: AtomicU64,
    jobs: AtomicU64,
    largest: AtomicU64,
}

impl BatchStats {
    fn record(&self, jobs: usize) {
        metrics::histogram!(cairn_store::BATCH_METRIC).record(jobs as f64);
        let jobs = u64::try_from(jobs).unwrap_or(u64::MAX);
        self.transactions.fetch_add(1, Ordering::Relaxed);
        self.jobs.fetch_add(jobs, Ordering::Relaxed);
        self.largest.fetch_max(jobs, Ordering::Relaxed);
    }

    /// Batched transactions so far.
    pub fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::Relaxed)
    }

    /// Jobs they carried.
    pub fn jobs(&self) -> u64 {
        self.jobs.load(Ordering::Relaxed)
    }

    /// The most jobs one carried.
    pub fn largest(&self) -> u64 {
        self.largest.load(Ordering::Relaxed)
    }
}
