//! The engine's metrics, each named once here with what it counts and its labels, through
//! the [`metrics`] facade: an embedded user installs any recorder (Prometheus, StatsD,
//! OpenTelemetry…); with none installed every call is a no-op. `cairn serve` installs the
//! Prometheus one and serves it at `/metrics`. The table in `docs/operating.md` lists them.
//!
//! Labels stay bounded: never an instance id; a step's name only for the first
//! [`MAX_STEP_LABELS`] names of a workflow (a workflow that names steps after its data,
//! `item-{n}`, would otherwise make a series per item), later names count as `"(other)"`.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use cairn_core::{InstanceStatus, WorkflowName};
use metrics::{
    SharedString, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge,
    histogram,
};

/// Instances created (by `create`, `create_batch`, or the API), by workflow.
pub const INSTANCES_CREATED: &str = "cairn_instances_created_total";
/// Instances that started running: the first time, and again at each restart, by workflow.
pub const INSTANCES_STARTED: &str = "cairn_instances_started_total";
/// Instances that ended, by workflow and `status` (`complete`, `errored`, `terminated`).
pub const INSTANCES_FINISHED: &str = "cairn_instances_finished_total";
/// Step attempts, by workflow, step, `kind` (`step`, `rollback`) and `outcome` (`success`,
/// `error`, `timeout`, `interrupted`: a crash or lost lease cut it off, `cancelled`: the
/// workflow stopped awaiting it).
pub const STEP_ATTEMPTS: &str = "cairn_step_attempts_total";
/// How long step attempts ran, by workflow, step and kind (engine clock).
pub const STEP_ATTEMPT_DURATION: &str = "cairn_step_attempt_duration_seconds";
/// From an instance's first start to its end, by workflow and status (engine clock).
pub const INSTANCE_DURATION: &str = "cairn_instance_duration_seconds";
/// From an instance's creation to its first start, by workflow (engine clock).
pub const QUEUE_DELAY: &str = "cairn_instance_queue_delay_seconds";
/// Instances taken over from an engine that died (SQLite: at open) or whose lease ran out
/// (PostgreSQL: a crashed, stalled or cut-off engine), by workflow.
pub const LEASE_TAKEOVERS: &str = cairn_store::TAKEOVER_METRIC;
/// Lifetimes this engine stopped because their lease ran out or moved to another engine.
pub const LEASES_LOST: &str = "cairn_leases_lost_total";
/// How long the store took to commit one lifetime's writes (wall clock).
pub const COMMIT_DURATION: &str = "cairn_store_commit_duration_seconds";
/// Jobs per store transaction: the group commit's batch size.
pub const BATCH_SIZE: &str = cairn_store::BATCH_METRIC;
/// Instances by workflow and `status`, as the store counts them (every engine on a shared
/// database reports the same numbers: aggregate with `max`, not `sum`).
pub const INSTANCES: &str = "cairn_instances";
/// Instances of a workflow whose wake-up time has come and that no engine has claimed yet.
pub const BACKLOG: &str = "cairn_backlog_instances";
/// Hibernating instances of a workflow with a wake-up time still to come.
pub const TIMERS_PENDING: &str = "cairn_timers_pending";
/// Instances with a lifetime in this engine's memory.
pub const INSTANCES_IN_MEMORY: &str = "cairn_instances_in_memory";
/// Instances waiting for a slot of their concurrency key, by workflow and key (the
/// [`MAX_KEY_LABELS`] keys with the most; the rest as `"(other)"`).
pub const WAITING_FOR_SLOT: &str = "cairn_instances_waiting_for_slot";

/// The keys with the most waiting instances that a refresh reports by name; the rest add
/// up in `"(other)"`.
pub const MAX_KEY_LABELS: usize = 20;

/// The most distinct keys one workflow ever gets as label values in a process (a key
/// that drops out of the top reads 0, and its series stays): past it, new keys count in
/// `"(other)"` only, so the series of a workflow stay bounded.
pub const MAX_KEY_SERIES: usize = 100;

/// The most step names one workflow gets as label values; later ones are `"(other)"`.
pub const MAX_STEP_LABELS: usize = 200;

/// Registers every metric's description and unit with the installed recorder (a recorder
/// installed later misses them; the values are recorded regardless).
pub(crate) fn describe() {
    describe_counter!(INSTANCES_CREATED, "Instances created.");
    describe_counter!(
        INSTANCES_STARTED,
        "Instances that started running for the first time."
    );
    describe_counter!(INSTANCES_FINISHED, "Instances that ended, by status.");
    describe_counter!(STEP_ATTEMPTS, "Step attempts, by kind and outcome.");
    describe_histogram!(
        STEP_ATTEMPT_DURATION,
        Unit::Seconds,
        "How long step attempts ran."
    );
    describe_histogram!(
        INSTANCE_DURATION,
        Unit::Seconds,
        "From an instance's first start to its end."
    );
    describe_histogram!(
        QUEUE_DELAY,
        Unit::Seconds,
        "From an instance's creation to its first start."
    );
    describe_counter!(
        LEASE_TAKEOVERS,
        "Instances taken over from a lifetime that ended without recording why."
    );
    describe_counter!(
        LEASES_LOST,
        "Lifetimes stopped because their lease ran out or moved on."
    );
    describe_histogram!(
        COMMIT_DURATION,
        Unit::Seconds,
        "How long the store took to commit a lifetime's writes."
    );
    describe_histogram!(
        BATCH_SIZE,
        Unit::Count,
        "Jobs per store transaction (group commit)."
    );
    describe_gauge!(INSTANCES, "Instances by status, as the store counts them.");
    describe_gauge!(
        BACKLOG,
        "Instances due to run that no engine has claimed yet."
    );
    describe_gauge!(
        TIMERS_PENDING,
        "Hibernating instances with a wake-up time still to come."
    );
    describe_gauge!(
        INSTANCES_IN_MEMORY,
        "Instances with a lifetime in this engine's memory."
    );
    describe_gauge!(
        WAITING_FOR_SLOT,
        "Instances waiting for a slot of their concurrency key, by key (the keys with the most)."
    );
}

/// Sets the counters the documented alerts watch to zero for `workflows` (and those
/// without labels), so a series exists from the first scrape: `increase()` over a series
/// that appears at its first event misses that event.
pub(crate) fn zero(workflows: &[WorkflowName]) {
    counter!(LEASES_LOST).increment(0);
    for workflow in workflows {
        counter!(INSTANCES_CREATED, "workflow" => label(workflow)).increment(0);
        counter!(INSTANCES_STARTED, "workflow" => label(workflow)).increment(0);
        counter!(LEASE_TAKEOVERS, "workflow" => label(workflow)).increment(0);
        for status in [
            InstanceStatus::Complete,
            InstanceStatus::Errored,
            InstanceStatus::Terminated,
        ] {
            counter!(
                INSTANCES_FINISHED,
                "workflow" => label(workflow),
                "status" => status.as_str().to_owned()
            )
            .increment(0);
        }
    }
}

fn label(workflow: &WorkflowName) -> String {
    workflow.as_str().to_owned()
}

/// When it happened and where it is counted per minute: the first argument of every
/// counting function below that the dashboard charts.
pub(crate) type Seen<'a> = (&'a Activity, cairn_core::Timestamp);

/// `n` instances of `workflow` were created.
pub(crate) fn created(seen: Seen<'_>, workflow: &WorkflowName, n: usize) {
    counter!(INSTANCES_CREATED, "workflow" => label(workflow)).increment(n as u64);
    seen.0.add(seen.1, workflow, |c| c.created += n as u64);
}

/// An instance started for the first time, `queued` after it was created.
pub(crate) fn started(seen: Seen<'_>, workflow: &WorkflowName, queued: Duration) {
    counter!(INSTANCES_STARTED, "workflow" => label(workflow)).increment(1);
    histogram!(QUEUE_DELAY, "workflow" => label(workflow)).record(queued.as_secs_f64());
    seen.0.add(seen.1, workflow, |c| c.started += 1);
}

/// An instance was restarted: it starts again (its queue delay is not recorded again).
pub(crate) fn restarted(seen: Seen<'_>, workflow: &WorkflowName) {
    counter!(INSTANCES_STARTED, "workflow" => label(workflow)).increment(1);
    seen.0.add(seen.1, workflow, |c| c.started += 1);
}

/// An instance ended in `status`; `ran` is how long since its first start, when known.
pub(crate) fn finished(
    seen: Seen<'_>,
    workflow: &WorkflowName,
    status: InstanceStatus,
    ran: Option<Duration>,
) {
    seen.0.add(seen.1, workflow, |c| match status {
        InstanceStatus::Complete => c.completed += 1,
        InstanceStatus::Errored => c.errored += 1,
        _ => c.terminated += 1,
    });
    let labels = [
        ("workflow", label(workflow)),
        ("status", status.as_str().to_owned()),
    ];
    counter!(INSTANCES_FINISHED, &labels).increment(1);
    if let Some(ran) = ran {
        histogram!(INSTANCE_DURATION, &labels).record(ran.as_secs_f64());
    }
}

/// How a step attempt ended.
#[derive(Clone, Copy, Debug)]
pub(crate) enum AttemptOutcome {
    Success,
    Error,
    Timeout,
    Interrupted,
    Cancelled,
}

impl AttemptOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Success => "success",
            AttemptOutcome::Error => "error",
            AttemptOutcome::Timeout => "timeout",
            AttemptOutcome::Interrupted => "interrupted",
            AttemptOutcome::Cancelled => "cancelled",
        }
    }
}

/// A step attempt ended with `outcome` after running `ran` (unknown for an attempt a crash
/// interrupted). `rollback` tells a compensation's attempt from a step's.
pub(crate) fn attempt(
    seen: Seen<'_>,
    workflow: &WorkflowName,
    step: &str,
    rollback: bool,
    outcome: AttemptOutcome,
    ran: Option<Duration>,
) {
    seen.0.add(seen.1, workflow, |c| {
        c.attempts += 1;
        if matches!(outcome, AttemptOutcome::Error | AttemptOutcome::Timeout) {
            c.failed_attempts += 1;
        }
    });
    let kind = if rollback { "rollback" } else { "step" };
    let (workflow, step) = step_labels(workflow, step);
    counter!(
        STEP_ATTEMPTS,
        "workflow" => workflow.clone(),
        "step" => step.clone(),
        "kind" => kind,
        "outcome" => outcome.as_str()
    )
    .increment(1);
    if let Some(ran) = ran {
        histogram!(
            STEP_ATTEMPT_DURATION,
            "workflow" => workflow,
            "step" => step,
            "kind" => kind
        )
        .record(ran.as_secs_f64());
    }
}

/// An instance whose last lifetime ended without recording why was claimed again.
pub(crate) fn taken_over(workflow: &WorkflowName) {
    counter!(LEASE_TAKEOVERS, "workflow" => label(workflow)).increment(1);
}

/// `n` lifetimes were stopped because their lease was lost.
pub(crate) fn leases_lost(n: usize) {
    counter!(LEASES_LOST).increment(n as u64);
}

/// A commit of a lifetime's writes took `took`.
pub(crate) fn committed(took: Duration) {
    histogram!(COMMIT_DURATION).record(took.as_secs_f64());
}

/// The store's counts for one workflow, as gauges.
pub(crate) fn instance_gauges(workflow: &WorkflowName, status: InstanceStatus, n: u64) {
    gauge!(INSTANCES, "workflow" => label(workflow), "status" => status.as_str()).set(n as f64);
}

/// The due backlog and pending timers of one workflow, as gauges.
pub(crate) fn timer_gauges(workflow: &WorkflowName, due: u64, pending: u64) {
    gauge!(BACKLOG, "workflow" => label(workflow)).set(due as f64);
    gauge!(TIMERS_PENDING, "workflow" => label(workflow)).set(pending as f64);
}

/// The instances of `workflow` waiting for a slot, by key: the keys with the most by name
/// (the first [`MAX_KEY_SERIES`] keys ever named), the rest as `"(other)"`. A key named
/// before that is not among them now reads 0 (a gauge, once set, stays until set again).
pub(crate) fn slot_gauges(workflow: &WorkflowName, top: &[(String, u64)], all: u64) {
    static NAMED: std::sync::Mutex<
        Option<std::collections::HashMap<String, std::collections::HashSet<String>>>,
    > = std::sync::Mutex::new(None);
    let mut named = NAMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let keys = named
        .get_or_insert_with(Default::default)
        .entry(label(workflow))
        .or_default();
    let mut listed = 0;
    for (key, n) in top {
        if keys.contains(key) || keys.len() < MAX_KEY_SERIES {
            keys.insert(key.clone());
            listed += n;
        }
    }
    for key in keys.iter() {
        let n = top.iter().find(|(k, _)| k == key).map_or(0, |(_, n)| *n);
        gauge!(WAITING_FOR_SLOT, "workflow" => label(workflow), "key" => key.clone()).set(n as f64);
    }
    gauge!(WAITING_FOR_SLOT, "workflow" => label(workflow), "key" => "(other)")
        .set(all.saturating_sub(listed) as f64);
}

/// The lifetimes this engine holds in memory.
pub(crate) fn in_memory(n: usize) {
    gauge!(INSTANCES_IN_MEMORY).set(n as f64);
}

/// The label values of a step attempt: its workflow's, and `step` itself for the first
/// [`MAX_STEP_LABELS`] names of a workflow seen by this process, `"(other)"` after that.
/// Shared, not copied: an attempt's two metrics cost no allocation for their labels.
fn step_labels(workflow: &WorkflowName, step: &str) -> (SharedString, SharedString) {
    #[derive(Default)]
    struct Seen {
        workflow: Option<SharedString>,
        steps: HashMap<String, SharedString>,
    }
    static SEEN: OnceLock<Mutex<HashMap<String, Seen>>> = OnceLock::new();
    let mut seen = SEEN
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let shared = |text: &str| SharedString::from_shared(std::sync::Arc::<str>::from(text));
    if let Some(known) = seen.get(workflow.as_str())
        && let (Some(w), Some(s)) = (&known.workflow, known.steps.get(step))
    {
        return (w.clone(), s.clone());
    }
    let known = seen.entry(workflow.as_str().to_owned()).or_default();
    let w = known
        .workflow
        .get_or_insert_with(|| shared(workflow.as_str()))
        .clone();
    if known.steps.len() < MAX_STEP_LABELS {
        let s = shared(step);
        known.steps.insert(step.to_owned(), s.clone());
        return (w, s);
    }
    (w, SharedString::const_str("(other)"))
}

/// What one workflow did in one minute, as this engine saw it: the dashboard's charts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MinuteCounts {
    /// Instances created.
    pub created: u64,
    /// Instances that started (first start or restart).
    pub started: u64,
    /// Instances that completed.
    pub completed: u64,
    /// Instances that errored.
    pub errored: u64,
    /// Instances terminated.
    pub terminated: u64,
    /// Step and rollback attempts that ended.
    pub attempts: u64,
    /// Of those, the attempts that failed (error or timeout).
    pub failed_attempts: u64,
}

/// One minute of [`Activity`]: its start and each workflow's counts.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ActivityMinute {
    /// The minute's start.
    #[serde(serialize_with = "cairn_core::rfc3339::serialize")]
    pub minute: cairn_core::Timestamp,
    /// Counts by workflow (workflows with nothing in this minute are absent).
    pub workflows: HashMap<WorkflowName, MinuteCounts>,
}

/// The last [`ACTIVITY_MINUTES`] minutes of this engine's activity, counted in memory at
/// the same points as the counters above (after the commit that makes each true). Per
/// process and since its start: engines sharing a PostgreSQL database each count their own.
/// It costs one uncontended lock per counted event; nothing is read from the store.
#[derive(Debug, Default)]
pub struct Activity {
    minutes: Mutex<std::collections::VecDeque<ActivityMinute>>,
}

/// How many minutes [`Activity`] keeps.
pub const ACTIVITY_MINUTES: usize = 60;

impl Activity {
    fn add(
        &self,
        at: cairn_core::Timestamp,
        workflow: &WorkflowName,
        f: impl FnOnce(&mut MinuteCounts),
    ) {
        let minute = cairn_core::Timestamp::from_millis(at.as_millis().div_euclid(60_000) * 60_000);
        let mut minutes = self.minutes.lock().unwrap_or_else(PoisonError::into_inner);
        // A clock set back (after running ahead) would drop every event until it caught
        // up with the newest minute kept: start over instead.
        if minutes
            .back()
            .is_some_and(|newest| newest.minute.as_millis() - minute.as_millis() > 5 * 60_000)
        {
            minutes.clear();
        }
        // Events arrive in clock order but for a few in flight across a minute's end: an
        // event of an earlier minute still kept is counted in it.
        let slot = match minutes.iter().rposition(|m| m.minute <= minute) {
            Some(i) if minutes[i].minute == minute => i,
            Some(i) if i + 1 < minutes.len() => return, // a minute without events: dropped
            None if !minutes.is_empty() => return,      // older than everything kept
            _ => {
                minutes.push_back(ActivityMinute {
                    minute,
                    workflows: HashMap::new(),
                });
                while minutes.len() > ACTIVITY_MINUTES {
                    minutes.pop_front();
                }
                minutes.len() - 1
            }
        };
        let counts = match minutes[slot].workflows.get_mut(workflow) {
            Some(c) => c,
            None => minutes[slot].workflows.entry(workflow.clone()).or_default(),
        };
        f(counts);
    }

    /// The minutes kept that start at or after `since`, oldest first; minutes without
    /// activity are absent.
    pub fn since(&self, since: cairn_core::Timestamp) -> Vec<ActivityMinute> {
        let minutes = self.minutes.lock().unwrap_or_else(PoisonError::into_inner);
        minutes
            .iter()
            .filter(|m| m.minute >= since)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workflow's first [`MAX_STEP_LABELS`] step names label themselves, later ones
    /// `(other)`; a name seen before keeps its own, and each workflow counts its own.
    #[test]
    fn step_labels_are_the_names_up_to_the_cap_then_other() {
        let workflow = WorkflowName::new("telemetry-step-labels").unwrap();
        let other = WorkflowName::new("telemetry-step-labels-2").unwrap();
        for n in 0..MAX_STEP_LABELS {
            let (w, s) = step_labels(&workflow, &format!("s{n}"));
            assert_eq!((&*w, &*s), ("telemetry-step-labels", &*format!("s{n}")));
        }
        let (w, s) = step_labels(&workflow, "one too many");
        assert_eq!((&*w, &*s), ("telemetry-step-labels", "(other)"));
        assert_eq!(&*step_labels(&workflow, "s7").1, "s7", "seen before");
        let (w, s) = step_labels(&other, "one too many");
        assert_eq!((&*w, &*s), ("telemetry-step-labels-2", "one too many"));
    }
}
