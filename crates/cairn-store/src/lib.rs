//! The storage contract Cairn's engine runs on.
//!
//! A backend implements [`Store`]; the engine never sees SQL. Durable state changes only in
//! [`Store::commit`] (and the other writing methods), each of which is atomic: all of its
//! writes land or none do.
//!
//! # Leases and fencing
//!
//! An engine executes an instance only while it holds the instance's lease, taken by
//! [`Store::claim`]. Every claim increments the instance's lease *epoch*; every
//! [`Store::commit`] carries the [`Lease`] it was made under and fails with
//! [`Error::LeaseLost`] if the epoch moved on, so an engine that lost an instance (its lease
//! expired and another engine claimed it, or a user terminated it) can never write to it
//! again. SQLite implements the same contract as PostgreSQL, with one engine per file.
//!
//! # Conformance
//!
//! The feature `conformance` exports the `conformance` module, the suite every backend must pass:
//! `cairn_store::conformance_tests!(factory)` expands one `#[tokio::test]` per case.
//!
//! A backend lays log records out with [`packing`], as both of ours do. One rule it must
//! keep if it does not: the engine commits a step's `STEP_START` without the step's
//! configuration in its `meta`, next to the step's [`Write::Step`], and the record is
//! stored (and read back) with that step's configuration ([`packing::pack_with`]). A
//! backend that stores the record as it comes loses the configuration from the log for
//! good; the conformance case `a_step_start_reads_back_with_its_steps_configuration`
//! fails on it.
//!
//! ```
//! use cairn_store::{Write, Lease, InstanceRef};
//! let lease = Lease { instance: InstanceRef(1), epoch: 3 };
//! let writes: Vec<Write> = Vec::new();
//! assert_eq!(lease.epoch, 3);
//! # let _ = writes;
//! ```

use std::time::Duration;

use cairn_core::{
    ErrorInfo, EventType, InstanceId, InstanceStatus, LogEntry, LogRecord, RollbackStatus,
    RollbackTrigger, StepKey, StepRecord, Timestamp, WorkflowName,
};
use futures::future::BoxFuture;
use futures::stream::BoxStream;

#[cfg(feature = "conformance")]
pub mod conformance;
mod filter;
pub mod packing;
pub mod taken;

pub use filter::{SqlArg, SqlFilter};

/// What a store operation can fail with. The engine decides what to do from the variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The write was fenced off: the caller's lease epoch is no longer the instance's.
    #[error("lease lost on instance {0:?}: another owner holds it or it was stopped")]
    LeaseLost(InstanceRef),
    /// The instance does not exist (any more).
    #[error("instance {0:?} not found")]
    NotFound(InstanceRef),
    /// The store cannot be reached or failed to commit. Retry later. Nothing was written,
    /// unless the failure came after the commit (its answer lost; a SQLite store whose sync
    /// of the log failed): then the outcome is unknown, as after a crash, and a retry meets
    /// the fences and idempotency keys that make it safe.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Stored data could not be decoded.
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

/// Result of a store operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The future every store method returns.
pub type StoreFuture<'a, T> = BoxFuture<'a, Result<T>>;

/// A store's internal, stable reference to one instance (a row id). Never given to another
/// instance, also after a delete or purge frees the instance's id: a lease or a list cursor
/// built on it can never match a different instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceRef(pub i64);

/// The right to write to one instance, obtained from [`Store::claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The instance.
    pub instance: InstanceRef,
    /// The epoch the claim set; every write is checked against it.
    pub epoch: u64,
}

/// A new instance to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewInstance {
    /// Its workflow.
    pub workflow: WorkflowName,
    /// Its id, unique per workflow.
    pub id: InstanceId,
    /// The params as JSON text.
    pub params: String,
    /// Creation time: the event timestamp.
    pub created_at: Timestamp,
    /// The `WORKFLOW_QUEUED` record written with it.
    pub queued: LogEntry,
    /// How long it is kept once finished.
    pub retention: Retention,
    /// The instance whose step started it (`step.invoke`), if any.
    pub parent: Option<ParentLink>,
    /// Among the instances waiting for a slot of its concurrency key, those of higher
    /// priority take one first (then the older).
    pub priority: i32,
    /// The concurrency key it runs under, with the key's limits.
    pub concurrency: Option<Concurrency>,
    /// The version of its workflow's code it runs on, for a workflow run by workers
    /// (`None` for one registered in Rust, which has the code running now).
    pub version: Option<String>,
}

/// A workflow version a worker registered ([`Store::register_versions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowVersion {
    /// The workflow.
    pub workflow: WorkflowName,
    /// The version of its code.
    pub version: String,
    /// When a worker first registered it: the newest version is the one registered last.
    pub registered_at: Timestamp,
}

/// The wake time of an instance that waits for a worker of its version
/// ([`Write::Hibernate`] with this time): no timer ever comes, and
/// [`Store::wake_awaiting`] makes it claimable when such a worker connects.
pub const AWAITING_WORKER: Timestamp = Timestamp::from_millis(i64::MAX);

/// A concurrency key and its limits (per workflow and key): at most `limit` instances hold
/// a slot at once, and (with `rate`) at most `rate.0` take one per `rate.1`. An instance
/// takes a slot when it is claimed to start or to resume, and gives it back when it ends,
/// is paused, or hibernates (unless `hold_while_waiting`). An instance that cannot get one
/// stays unclaimed (`queued`), out of the claim order, until a slot frees: the best of the
/// key's waiting instances (priority, then age) is then made claimable. The latest limits
/// written for a key (by a create) are the key's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Concurrency {
    /// The key, 1–100 characters.
    pub key: String,
    /// Instances holding a slot at once, at least 1.
    pub limit: u32,
    /// At most this many slot takings per period.
    pub rate: Option<(u32, Duration)>,
    /// A hibernated (sleeping or waiting) instance keeps its slot.
    pub hold_while_waiting: bool,
}

/// The step of a parent instance that started a child instance (`step.invoke`): where the
/// store sends the child's end. When the child reaches a terminal status or is deleted,
/// the same transaction makes the parent claimable if it is hibernating, so its wait sees
/// the outcome (see [`Write::Hibernate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentLink {
    /// The parent (a reference is never reused, so a parent purged and an instance created
    /// with its id later is never taken for it).
    pub instance: InstanceRef,
    /// The parent's workflow.
    pub workflow: WorkflowName,
    /// The parent's id.
    pub id: InstanceId,
    /// The parent's `invoke` step.
    pub step: StepKey,
    /// The child keeps running when its parent ends (otherwise it is terminated with it).
    pub detached: bool,
    /// Which run of the parent's step the child belongs to: the parent's lease epoch when
    /// that run journaled the step (a restart of the parent moves the epoch on, a replay of
    /// the same run does not). `None` in links stored before runs were recorded.
    pub run: Option<u64>,
}

impl ParentLink {
    /// The stored form of the link without the parent's reference, which both backends keep
    /// in an indexed column of its own (to find a parent's children and to wake a parent).
    pub fn encode(&self) -> String {
        serde_json::json!({
            "workflow": self.workflow,
            "id": self.id,
            "step": self.step,
            "detached": self.detached,
            "run": self.run,
        })
        .to_string()
    }

    /// What a [`ControlRequest::Restart`] of the child makes of this link, given the
    /// parent's status and lease epoch as stored now (`None`: the parent is gone): adopted by
    /// the parent's new run, detached when the parent has ended, or unchanged (`None`).
    /// Both backends decide it here, in the restart's transaction.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when `adopt` names a lease that is not the parent's now (or
    /// another parent).
    pub fn restarted(
        &self,
        parent: Option<(InstanceStatus, u64)>,
        adopt: Option<&Adopt>,
    ) -> Result<Option<ParentLink>> {
        match adopt {
            Some(adopt) => {
                let current = parent.map(|(_, epoch)| epoch);
                if adopt.parent.instance != self.instance || current != Some(adopt.parent.epoch) {
                    return Err(Error::LeaseLost(adopt.parent.instance));
                }
                Ok(Some(ParentLink {
                    run: Some(adopt.run),
                    detached: adopt.detached,
                    ..self.clone()
                }))
            }
            None => {
                let ended = parent.is_none_or(|(status, _)| status.is_terminal());
                Ok((ended && !self.detached).then(|| ParentLink {
                    detached: true,
                    ..self.clone()
                }))
            }
        }
    }

    /// The link stored as [`ParentLink::encode`] for the parent `instance`.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when `text` is not such a link.
    pub fn decode(instance: InstanceRef, text: &str) -> Result<Self> {
        #[derive(serde::Deserialize)]
        struct Stored {
            workflow: WorkflowName,
            id: InstanceId,
            step: StepKey,
            detached: bool,
            #[serde(default)]
            run: Option<u64>,
        }
        let stored: Stored = serde_json::from_str(text)
            .map_err(|e| Error::Corrupt(format!("parent link {text:?}: {e}")))?;
        Ok(ParentLink {
            instance,
            workflow: stored.workflow,
            id: stored.id,
            step: stored.step,
            detached: stored.detached,
            run: stored.run,
        })
    }
}

/// How long a finished instance is kept before it is purged (and its id freed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// After completing.
    pub success: Duration,
    /// After erroring or being terminated.
    pub error: Duration,
}

/// The outcome of creating one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// Created with this reference.
    New(InstanceRef),
    /// An instance of the same workflow with the same id exists; nothing was written.
    AlreadyExists,
}

/// An instance row.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceRecord {
    /// Store reference.
    pub instance: InstanceRef,
    /// Its workflow.
    pub workflow: WorkflowName,
    /// Its id.
    pub id: InstanceId,
    /// Current status.
    pub status: InstanceStatus,
    /// Params as JSON text.
    pub params: String,
    /// Creation time.
    pub created_at: Timestamp,
    /// First start time.
    pub started_at: Option<Timestamp>,
    /// When it reached a terminal status.
    pub ended_at: Option<Timestamp>,
    /// The output as JSON text, when complete.
    pub output: Option<String>,
    /// The error, when errored.
    pub error: Option<ErrorInfo>,
    /// When it next becomes claimable by itself (queued, or a due timer).
    pub ready_at: Option<Timestamp>,
    /// Set once a rollback has begun (or a terminate with rollback was asked): what
    /// triggered it. A lifetime that finds it set finishes the rollback.
    pub rollback_trigger: Option<RollbackTrigger>,
    /// The outcome of the rollback, once it ended.
    pub rollback_outcome: Option<RollbackStatus>,
    /// The instance whose step started it, if any.
    pub parent: Option<ParentLink>,
    /// Its priority among the instances waiting for a slot of its key.
    pub priority: i32,
    /// Its concurrency key.
    pub concurrency_key: Option<String>,
    /// Waiting for a slot of its key (see [`Concurrency`]).
    pub waiting_for_slot: bool,
    /// The version of its workflow's code it runs on ([`NewInstance::version`]).
    pub version: Option<String>,
}

/// A claimed instance: its row and the lease to write under.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    /// The row as claimed.
    pub record: InstanceRecord,
    /// The lease.
    pub lease: Lease,
    /// The claim took the instance over from an owner whose lease ran out (it stopped, or
    /// lost its lease): what [`TAKEOVER_METRIC`] counts. A store that takes a dead owner's
    /// leases over when it opens (SQLite) counts those there instead.
    pub taken_over: bool,
}

/// A status change of the leased instance.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusChange {
    /// New status.
    pub status: InstanceStatus,
    /// Set `started_at` if it is not set yet.
    pub started_at: Option<Timestamp>,
    /// Set `ended_at`.
    pub ended_at: Option<Timestamp>,
    /// Set the output (JSON text).
    pub output: Option<String>,
    /// Set the error.
    pub error: Option<ErrorInfo>,
    /// When the instance becomes claimable again; `None` keeps it unclaimable.
    pub ready_at: Option<Timestamp>,
    /// Give the lease up with this change.
    pub release: bool,
    /// Record the rollback's outcome.
    pub rollback_outcome: Option<RollbackStatus>,
}

impl StatusChange {
    /// A change to `status` that touches nothing else.
    pub fn to(status: InstanceStatus) -> Self {
        StatusChange {
            status,
            started_at: None,
            ended_at: None,
            output: None,
            error: None,
            ready_at: None,
            release: false,
            rollback_outcome: None,
        }
    }
}

/// One write in an atomic [`Store::commit`].
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Insert or replace the journal entry with this step's key.
    Step(StepRecord),
    /// Append a lifecycle record. A `STEP_START` committed with its step's
    /// [`Write::Step`] may leave `config` out of its `meta`: it is stored, and read back,
    /// with the step's (`packing::pack_with`).
    Log(LogEntry),
    /// Change the instance's status.
    Status(StatusChange),
    /// Hibernate: status `waiting`, lease released, claimable again at `wake_at`, or at
    /// once if an event of one of `event_types` is already buffered or one of `children`
    /// has ended (reached a terminal status, or is gone). Deciding that in the same
    /// transaction as [`Store::send_event`]'s wake-up (and a child's end) is what makes a
    /// concurrent send (or end) never lost. If a pause is pending, the instance becomes
    /// `paused` instead.
    Hibernate {
        /// The earliest timer of the instance.
        wake_at: Timestamp,
        /// The event types its waits are blocked on.
        event_types: Vec<EventType>,
        /// The child instances its `invoke` steps wait for.
        children: Vec<InstanceRef>,
    },
    /// Create a child instance (with its `WORKFLOW_QUEUED` record) unless an instance of
    /// its workflow with its id exists, in which case nothing is written: the `invoke` step
    /// that starts it then reads the existing one and checks that it is its own child.
    /// Boxed: it is twice the size of any other write, and a commit of a step's writes
    /// would otherwise move and allocate room for it in every one of them.
    Create(Box<NewInstance>),
    /// Record that a rollback has begun and what triggered it (JSON), so that a crash in
    /// the middle of it resumes the rollback.
    RollbackTrigger(RollbackTrigger),
    /// Complete a pending pause: if the instance is `waitingForPause`, make it `paused` at
    /// `at`, release the lease and append `record` (its `WORKFLOW_PAUSED`); otherwise (the
    /// pause was cancelled) change nothing and log nothing.
    Pause {
        /// When.
        at: Timestamp,
        /// Logged only if the pause takes effect.
        record: LogEntry,
    },
    /// Cancel a step the workflow stopped awaiting: if its journal entry is still running,
    /// replace it with `step` (state `cancelled`), drop any stream chunks it wrote and append
    /// `records`; if it has reached an outcome meanwhile (its outcome commit landed first),
    /// change nothing. Except an event wait finished by a take: the workflow never saw the
    /// event (it was dropping the wait as the take landed), so it is buffered again, first
    /// of its type, and the wait cancelled.
    Cancel {
        /// The cancelled entry.
        step: StepRecord,
        /// Its lifecycle records, logged only if the cancel takes effect.
        records: Vec<LogEntry>,
    },
    /// Store chunk `index` of the byte stream attempt `attempt` of the `run` step `step`
    /// returns. Chunks are pending until the step's success names their attempt; the other
    /// attempts' chunks are garbage, dropped with [`Write::DropChunks`].
    /// Stored only while the step's journal entry is running that attempt (in flight): a
    /// late write of an attempt already ended is dropped.
    Chunk {
        /// The stream step.
        step: StepKey,
        /// The attempt writing.
        attempt: u32,
        /// The lease epoch it writes under (attempts start at 1 again after a restart).
        epoch: u64,
        /// 0-based.
        index: u32,
        /// At most 256 KiB.
        data: Vec<u8>,
    },
    /// Drop the stream chunks of `step`, but for those of attempt `keep`.
    DropChunks {
        /// The stream step.
        step: StepKey,
        /// The attempt whose chunks stay (the one that succeeded), if any.
        keep: Option<u32>,
    },
}

/// A management request (SPEC §3.8–3.10, Part A.11).
#[derive(Debug, Clone, PartialEq)]
pub enum ControlRequest {
    /// `queued`/`waiting` (unleased) → `paused`; `running` (or leased) → `waitingForPause`.
    /// Already paused or pausing: no-op. Terminal: rejected.
    Pause {
        /// When.
        at: Timestamp,
    },
    /// `waitingForPause` → `running`; `paused` → `queued` with every timer shifted by the
    /// time spent paused. Queued, running or waiting: no-op. Terminal: rejected.
    Resume {
        /// When.
        at: Timestamp,
    },
    /// Any non-terminal status → `terminated` (with its `WORKFLOW_TERMINATED` record).
    /// With `rollback` (JSON of the trigger), the instance is instead made runnable with
    /// its rollback trigger set: an engine compensates it and then terminates it.
    /// Terminal: rejected.
    Terminate {
        /// When.
        at: Timestamp,
        /// Run the rollback handlers first, with this trigger.
        rollback: Option<RollbackTrigger>,
    },
    /// From any status: wipe the journal, log, events and timers (or, with `from`, only the
    /// step found and every step started after it, plus the terminal records) and run again.
    /// A child restarted while its parent has ended (or is gone) is detached from it: it was
    /// restarted on purpose and runs on (decided by the parent's status in the same
    /// transaction, never by comparing times).
    Restart {
        /// When.
        at: Timestamp,
        /// Restart from this step: the `count`-th (1-based) step of `kind` named `name`, in
        /// start order.
        from: Option<StepKey>,
        /// A parent's new run of its `invoke` step takes over the child an earlier run of
        /// that step started (see [`Adopt`]).
        adopt: Option<Adopt>,
    },
    /// Remove the instance and everything it owns.
    Delete,
}

/// A full restart of a child on behalf of its parent's new run of the `invoke` step that
/// started it: the child's link records `run` and `detached` (that run's), so every
/// lifetime of that run finds the child its own. Fenced by the parent's lease: the store
/// refuses it with [`Error::LeaseLost`] unless `parent` is the parent's lease now (a stale
/// lifetime of the parent never restarts a child its newer run has taken over).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adopt {
    /// The parent's lease, checked.
    pub parent: Lease,
    /// The run of the parent's step ([`ParentLink::run`]).
    pub run: u64,
    /// Whether that run started the child detached.
    pub detached: bool,
}

/// What [`Store::control`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlOutcome {
    /// The transition happened.
    Done {
        /// The instance.
        instance: InstanceRef,
        /// Its status before.
        from: InstanceStatus,
        /// Its status after (for delete: the status it had).
        to: InstanceStatus,
        /// The lease epoch before the transition: the lifetimes it concerns (the ones a
        /// terminate, restart or delete fences off) hold a lease of this epoch or older. A
        /// lifetime claimed after the transition holds a newer one and must be left alone.
        epoch: u64,
    },
    /// The requested state already holds: nothing was written.
    NoOp(InstanceStatus),
    /// Not possible from this status: nothing was written.
    Rejected(InstanceStatus),
    /// No such instance.
    NotFound,
    /// A restart `from` a step the journal does not have.
    StepNotFound,
    /// A restart `from` a step that started after one the rollback compensated (named by
    /// its target, `name-count`, the first such): the run would go on over an undone
    /// effect, and compensate it twice if it failed again. Nothing was written.
    Compensated(String),
}

/// The timers of one workflow at a moment (see [`Store::timers`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timers {
    /// Instances due to run that no engine has claimed yet.
    pub due: u64,
    /// Instances waiting for a wake-up time still to come.
    pub pending: u64,
}

/// An event sent to an instance.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// Its type.
    pub event_type: EventType,
    /// Its payload as JSON text.
    pub payload: String,
    /// When it was sent.
    pub at: Timestamp,
    /// With a key, a second send with the same key to the same instance is a retry:
    /// [`Sent::Duplicate`], nothing buffered, even after the first was consumed.
    pub idempotency_key: Option<String>,
}

/// A buffered event handed to a wait.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// Its type.
    pub event_type: EventType,
    /// Its payload as JSON text.
    pub payload: String,
    /// When it was sent.
    pub at: Timestamp,
}

/// What [`Store::send_event`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Buffered for the instance; a hibernated instance was made ready.
    Buffered(InstanceRef),
    /// A retry: an event with the same idempotency key was sent to the instance before.
    /// Nothing was written.
    Duplicate(InstanceRef),
    /// No such instance.
    NotFound,
    /// The instance has finished; nothing was written.
    Finished(InstanceStatus),
}

/// One read of [`Store::workflow_log`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WorkflowLogPage {
    /// The workflow's records, oldest first, each with its instance id.
    pub records: Vec<(InstanceId, LogRecord)>,
    /// Every record with an id up to this one has been looked at: resume after it. At
    /// least the last returned record's id; never past a record not yet committed.
    pub scanned_to: u64,
}

/// Writes another process made to a shared store, from [`Store::changes`]: a hint that
/// arrives soon after their commit (or never: polling stays the fallback).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changes {
    /// Something may have become claimable: created, woken, released, resumed.
    pub claimable: bool,
    /// The instances written; `None` when not known (then any may have changed).
    pub instances: Option<Vec<Changed>>,
}

/// One instance in [`Changes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changed {
    /// The instance.
    pub instance: InstanceRef,
    /// What happened to it.
    pub kind: ChangeKind,
}

/// What happened to a [`Changed`] instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Its lifetime committed, or an event was sent to it.
    Written,
    /// Terminated, restarted or deleted: a lifetime holding a lease of this epoch or older
    /// must stop.
    Stopped {
        /// The epoch the transition fenced.
        epoch: u64,
    },
    /// Paused or resumed: its lifetime should read its status.
    Controlled,
}

/// Which instances [`Store::list`] returns, newest first unless `oldest_first`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ListQuery {
    /// Only this workflow's instances.
    pub workflow: Option<WorkflowName>,
    /// Only instances in one of these statuses (any status when empty).
    pub statuses: Vec<InstanceStatus>,
    /// Only instances created at or after this time.
    pub created_from: Option<Timestamp>,
    /// Only instances created before this time.
    pub created_before: Option<Timestamp>,
    /// Only instances whose id starts with this.
    pub id_prefix: Option<String>,
    /// Only instances after this one in the listing's order: older than it newest
    /// first, newer than it oldest first (cursor pagination).
    pub after: Option<InstanceRef>,
    /// Oldest first (Cloudflare's `direction=asc`) instead of newest first.
    pub oldest_first: bool,
    /// At most this many.
    pub limit: usize,
}

/// A cron schedule kept in the store, for every engine on it: one created over the API
/// (with its definition), or the state of one declared in code (no definition: the code
/// holds it; only whether it is paused is kept here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSchedule {
    /// Its name, unique per store.
    pub name: String,
    /// Its definition as JSON text; `None` for a schedule declared in code.
    pub definition: Option<String>,
    /// Paused: it fires no ticks.
    pub paused: bool,
    /// When it was last resumed: ticks before that are not caught up.
    pub resumed_at: Option<Timestamp>,
    /// When this row was last written.
    pub updated_at: Timestamp,
    /// Which schedule of this name it is: a schedule deleted and created again is a new
    /// one (1 for the first; set by the store, whatever a create passes).
    pub generation: u64,
    /// The newest tick fired ([`Store::fire_tick`]): what has fired is stored, not inferred
    /// from instances (which retention and deletes remove).
    pub last_tick: Option<Timestamp>,
    /// The id of the instance that tick started (what the overlap policy looks at).
    pub last_run: Option<String>,
    /// Written before ticks were stored, or made for a schedule in code before its first
    /// tick (`ScheduleState::only_if_not_live`; an older engine may have fired it without a
    /// row): its last tick is to be inferred from its instances once.
    pub legacy: bool,
}

/// A tick to fire ([`Store::fire_tick`]).
#[derive(Debug, Clone)]
pub struct ScheduleTick {
    /// The schedule's name.
    pub schedule: String,
    /// Its generation ([`StoredSchedule::generation`]) as the firing engine knows it.
    pub generation: u64,
    /// The tick.
    pub tick: Timestamp,
    /// The schedule is declared in code: its state row is created (generation 1) if missing.
    pub declared: bool,
    /// The instance the tick starts.
    pub instance: NewInstance,
    /// The overlap policy passes the tick over: it is recorded as the last tick (so that
    /// no engine takes it for a missed one later), and nothing is created.
    pub passed_over: bool,
    /// A last tick after this was stored by a clock ahead of the firing engine's (the
    /// engine's now plus a margin for the skew between engines): it does not refuse this
    /// tick, which takes its place as the last one (the tick's instance id still keeps a
    /// tick from starting twice).
    pub ahead_after: Timestamp,
}

/// What [`Store::fire_tick`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TickFired {
    /// Created the tick's instance and recorded the tick.
    Fired(InstanceRef),
    /// Recorded the tick, but its instance's id is taken by another instance (a run of
    /// another schedule's generation, or one created by hand): nothing was created.
    Taken,
    /// This tick or a later one (up to the firing engine's now) has fired already
    /// (another engine): its state.
    AlreadyFired {
        /// The newest tick fired.
        last_tick: Timestamp,
        /// Its instance.
        last_run: Option<String>,
    },
    /// The schedule is gone, paused, or is another generation now: nothing was written.
    /// (A runner that has not yet heard of a pause made on another engine fires nothing.)
    Stale,
    /// Recorded a tick passed over ([`ScheduleTick::passed_over`]): nothing was created.
    PassedOver,
}

/// A change of a schedule's state ([`Store::set_schedule_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleState {
    /// Paused or not.
    pub paused: bool,
    /// When it was resumed (`None` keeps the stored value).
    pub resumed_at: Option<Timestamp>,
    /// When the change was made.
    pub at: Timestamp,
    /// The schedule is declared in code: its state row is created if missing (or brought
    /// back, new, if deleted: the name is the code's now).
    pub declared: bool,
    /// With `declared`: only make the row live if it is not (missing or deleted), leaving a
    /// live one as it is. An engine does this for each declared schedule as it starts
    /// running it, so that its runner knows the row's generation from its first tick.
    pub only_if_not_live: bool,
}

/// The histogram of jobs per write transaction (the group commit's batch size) that both
/// backends record through the `metrics` facade; listed with the engine's metrics.
pub const BATCH_METRIC: &str = "cairn_store_batch_jobs";

/// The counter of instances taken over from an owner whose lease ran out or who died
/// (label `workflow`); listed with the engine's metrics.
pub const TAKEOVER_METRIC: &str = "cairn_lease_takeovers_total";

/// The storage contract. Every method is atomic and cancel-safe in this sense: dropping the
/// returned future may or may not let the operation happen, but never half of it.
pub trait Store: Send + Sync + 'static {
    /// Creates instances, each with its `WORKFLOW_QUEUED` record, in one transaction.
    /// Returns one outcome per input, in input order; an existing id is not an error here.
    fn create(&self, batch: Vec<NewInstance>) -> StoreFuture<'_, Vec<Created>>;

    /// Reads one instance by workflow and id.
    fn instance(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
    ) -> StoreFuture<'_, Option<InstanceRecord>>;

    /// Lists instances, newest first. A listed record carries no params (`params` is
    /// `"null"`): they can be a megabyte each and no listing shows them; read the instance
    /// for them.
    fn list(&self, query: ListQuery) -> StoreFuture<'_, Vec<InstanceRecord>>;

    /// How many instances of `workflow` are in `status`.
    fn count(&self, workflow: &WorkflowName, status: InstanceStatus) -> StoreFuture<'_, u64>;

    /// How many instances [`Store::list`] would return for `query` without its `limit`
    /// (`before` applies: the count of a pinned listing; a scan of the matching rows, for a
    /// confirmation, not for a hot path).
    fn count_matching(&self, query: ListQuery) -> StoreFuture<'_, u64>;

    /// Claims up to `limit` runnable instances of `workflows` for `owner`: those whose
    /// `ready_at` has come (instances resuming from a wait before newly queued ones, then
    /// oldest first) and those whose lease expired. Each claim increments the epoch, sets
    /// the lease until `now + ttl` and clears `ready_at`.
    fn claim(
        &self,
        owner: &str,
        workflows: &[WorkflowName],
        now: Timestamp,
        ttl: Duration,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Claimed>>;

    /// Extends each of `leases` that `owner` still holds at its epoch and that has not run
    /// out by `now` to `until`. A lease that ran out is lost even if no one claimed the
    /// instance since: its owner stopped that lifetime (it could not know whether another
    /// engine took over), so renewing it would keep the instance from everyone.
    /// Returns the leases renewed: a lifetime whose lease is not among them lost it.
    ///
    /// Only `leases` (the lifetimes the owner runs now) are renewed, each at its own epoch:
    /// a lease the owner holds but no longer runs (a claim whose answer was lost) runs out
    /// and is claimed again, and a renewal that lands after its lease moved on (reclaimed,
    /// taken over, restarted) extends nothing.
    fn renew(
        &self,
        owner: &str,
        leases: Vec<Lease>,
        now: Timestamp,
        until: Timestamp,
    ) -> StoreFuture<'_, Vec<Lease>>;

    /// Moves a lease `owner` holds to a new epoch and extends it to `now + ttl`: before a
    /// lifetime is replayed after an outage, so that every write of the last one still on
    /// its way lands before (it was queued first) or is fenced off (it comes later).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the lease is no longer `owner`'s at `lease.epoch`.
    fn reclaim(
        &self,
        owner: &str,
        lease: Lease,
        now: Timestamp,
        ttl: Duration,
    ) -> StoreFuture<'_, Lease>;

    /// Gives up every lease `owner` holds: an engine shutting down, after its drain. Its
    /// runnable instances become claimable at once (ahead of new ones) by any engine, and a
    /// pause it was waiting to complete takes effect (paused from the instance's last
    /// record, logged as recovered), as when an engine takes over a dead one's instances.
    fn release_all(&self, owner: &str) -> StoreFuture<'_, ()>;

    /// An instance's place among the instances waiting for a slot of its key (1 = next):
    /// `None` when it does not wait for one.
    fn slot_position(&self, instance: InstanceRef) -> StoreFuture<'_, Option<u64>>;

    /// How many instances of `workflow` wait for a slot, by key: the `limit` keys with the
    /// most, most first, and the number of all of them.
    fn waiting_for_slots(
        &self,
        workflow: &WorkflowName,
        limit: usize,
    ) -> StoreFuture<'_, (Vec<(String, u64)>, u64)>;

    /// The instances `parent`'s `invoke` steps started, oldest first.
    fn children(&self, parent: InstanceRef) -> StoreFuture<'_, Vec<InstanceRecord>>;

    /// The journal of an instance, in step start order.
    fn journal(&self, instance: InstanceRef) -> StoreFuture<'_, Vec<StepRecord>>;

    /// Chunk `index` of the stream attempt `attempt` of `step` wrote under lease epoch
    /// `epoch` ([`Write::Chunk`]).
    fn stream_chunk(
        &self,
        instance: InstanceRef,
        step: StepKey,
        attempt: u32,
        epoch: u64,
        index: u32,
    ) -> StoreFuture<'_, Option<Vec<u8>>>;

    /// The bytes of every stream chunk an instance holds (its storage, against its limit).
    fn stream_bytes(&self, instance: InstanceRef) -> StoreFuture<'_, u64>;

    /// Applies `writes` atomically if `lease` is still current, and returns the instance's
    /// status after them: how the lease holder learns that a pause was requested.
    ///
    /// A driver's status writes never override a pending or completed pause: a write of
    /// `running` or [`Write::Hibernate`] to an instance in `waitingForPause` keeps it there
    /// (respectively makes it `paused`).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] (nothing written) when the epoch moved on; [`Error::NotFound`]
    /// when the instance is gone; [`Error::Unavailable`] when the commit failed.
    fn commit(&self, lease: Lease, writes: Vec<Write>) -> StoreFuture<'_, InstanceStatus>;

    /// Applies a management request to an instance, atomically, whoever holds its lease.
    /// Terminate, restart and delete move the lease epoch on, fencing off a running
    /// lifetime. See [`ControlRequest`] for each transition.
    fn control(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
        request: ControlRequest,
    ) -> StoreFuture<'_, ControlOutcome>;

    /// An instance's lifecycle records with id greater than `after`, oldest first.
    fn log(
        &self,
        instance: InstanceRef,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<LogRecord>>;

    /// Lifecycle records of every instance of `workflow` with id greater than `after`,
    /// oldest first, each with its instance id, and how far the store looked: a reader
    /// resumes after `scanned_to`, so records of other workflows are passed over once, not
    /// on every poll. A store may look at a bounded window of ids per call.
    fn workflow_log(
        &self,
        workflow: &WorkflowName,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, WorkflowLogPage>;

    /// The id of the newest lifecycle record (0 when there is none): where a reader that
    /// wants only what happens from now on starts (the dashboard's live list).
    fn log_head(&self) -> StoreFuture<'_, u64>;

    /// The earliest `ready_at` among instances of `workflows` that are not leased: when the
    /// scheduler should look again.
    fn next_ready(&self, workflows: &[WorkflowName]) -> StoreFuture<'_, Option<Timestamp>>;

    /// The timers of `workflow` at `now`: how many instances are due (their wake-up time
    /// has come, or their lease ran out) and no engine has claimed yet, and how many wait
    /// for a wake-up still to come. What the engine's backlog gauges report.
    fn timers(&self, workflow: &WorkflowName, now: Timestamp) -> StoreFuture<'_, Timers>;

    /// Buffers an event for an instance (per type, first in first out) and, if it is
    /// hibernating, makes it claimable at once.
    fn send_event(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
        event: NewEvent,
    ) -> StoreFuture<'_, Sent>;

    /// Under `lease`, in one transaction: takes the oldest buffered event of `event_type`,
    /// records it as the output of the wait `step` (state succeeded, ended at `at`) and
    /// appends its `WAIT_COMPLETE` record. `None` (and nothing written) when no event of that
    /// type is buffered, or when the wait is no longer running (cancelled while this call
    /// was on its way). An event is thereby delivered exactly once.
    fn take_event(
        &self,
        lease: Lease,
        step: StepKey,
        event_type: EventType,
        at: Timestamp,
    ) -> StoreFuture<'_, Option<StoredEvent>>;

    /// Deletes up to `limit` finished instances whose retention ended at or before `now`,
    /// with everything they own. Returns how many were purged.
    fn purge(&self, now: Timestamp, limit: usize) -> StoreFuture<'_, usize>;

    /// When the next finished instance is due to be purged.
    fn next_purge(&self) -> StoreFuture<'_, Option<Timestamp>>;

    /// Stores a schedule if no schedule has its name; `false` (nothing written) otherwise.
    fn create_schedule(&self, schedule: StoredSchedule) -> StoreFuture<'_, bool>;

    /// Sets whether the schedule `name` is paused, and (`Some`) when it was last resumed,
    /// leaving its definition alone. A schedule `declared` in code gets a row for its state
    /// if it has none; for any other, `false` when no stored schedule has the name.
    fn set_schedule_state(&self, name: &str, state: ScheduleState) -> StoreFuture<'_, bool>;

    /// Every stored schedule, by name.
    fn schedules(&self) -> StoreFuture<'_, Vec<StoredSchedule>>;

    /// Deletes the schedule `name` created over the API; whether there was one. The state
    /// row of a schedule declared in code (no definition) is deleted only when `declared`
    /// says so (no engine declares it any more). (Its name is remembered, so that a
    /// schedule created under it later is a new generation.)
    fn delete_schedule(&self, name: &str, declared: bool) -> StoreFuture<'_, bool>;

    /// Records that workers run these workflow versions (once each; the first registration
    /// keeps its time).
    fn register_versions(&self, versions: Vec<WorkflowVersion>) -> StoreFuture<'_, ()>;

    /// Every workflow version workers registered, oldest registration first.
    fn workflow_versions(&self) -> StoreFuture<'_, Vec<WorkflowVersion>>;

    /// How many unfinished instances of `workflow` run on each version (a scan of the
    /// workflow's unfinished instances: for an operator, not a hot path).
    fn unfinished_versions(
        &self,
        workflow: &WorkflowName,
    ) -> StoreFuture<'_, Vec<(Option<String>, u64)>>;

    /// Makes the instances of `workflow` at `version` that wait for a worker
    /// ([`AWAITING_WORKER`]) claimable, at most `limit` of them (oldest first); how many.
    fn wake_awaiting(
        &self,
        workflow: &WorkflowName,
        version: &str,
        limit: u64,
    ) -> StoreFuture<'_, u64>;

    /// Fires a tick, in one transaction: unless the schedule's stored generation differs
    /// or a tick as late has fired, creates the tick's instance and records the tick as
    /// the schedule's last. So each tick fires once across engines and crashes, and what
    /// has fired does not depend on which instances are kept.
    fn fire_tick(&self, tick: ScheduleTick) -> StoreFuture<'_, TickFired>;

    /// Writes other processes make to this store, as they commit (a hint: see
    /// [`Changes`]). `None` when no other process can write to it (SQLite).
    fn changes(&self) -> Option<BoxStream<'static, Changes>> {
        None
    }

    /// Finishes queued work and releases the store's resources (threads, locks,
    /// connections). Later calls fail with [`Error::Unavailable`].
    fn close(&self) -> StoreFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}
