//! What a test (`cairn::testing`) may change in a run and what it may learn from it: mocked
//! step results and errors, forced timeouts, disabled sleeps and retry delays, mocked
//! events, looked up by the ops; and which step bodies ran, which the ops report.
//!
//! An engine without hooks (every engine outside a test) pays one `Option` check per op.
//! Hooks live in memory beside the engine, keyed by workflow and instance id, so they hold
//! across the instance's restarts and hibernations and across engines built with the same
//! hooks; what they make a step return is committed like any result and replayed from the
//! journal.

// Only `cairn::testing` sets what the ops look up.
#![cfg_attr(not(feature = "testing"), allow(dead_code))]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use cairn_core::{ErrorInfo, EventType, InstanceId, StepKey, WorkflowName};
use cairn_store::InstanceRef;

/// Which instances a set of modifiers applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Scope {
    /// Every instance of the workflow whose store reference is newer than `since` (every
    /// one when `None`): each workflow introspector has its own.
    Workflow {
        workflow: WorkflowName,
        since: Option<InstanceRef>,
    },
    /// One instance.
    Instance(WorkflowName, InstanceId),
}

/// The instance an op runs for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Who<'a> {
    pub(crate) workflow: &'a WorkflowName,
    pub(crate) id: &'a InstanceId,
    /// Its store reference: a workflow-wide scope covers only instances created after it.
    pub(crate) instance: InstanceRef,
}

/// A step as users name it: its name and, when the name repeats, which occurrence (1-based).
pub(crate) type StepRef = (String, u32);

/// What an attempt of a `run` step does instead of running its body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Forced {
    /// Succeeds with this output (JSON).
    Result(String),
    /// Fails with this error; retryable (like a thrown error) or not.
    Error(ErrorInfo, bool),
    /// Fails as if its timeout had elapsed.
    Timeout,
}

/// The modifiers of one scope.
#[derive(Debug, Default)]
pub(crate) struct Modifiers {
    pub(crate) all_sleeps_disabled: bool,
    pub(crate) sleeps_disabled: HashSet<StepRef>,
    pub(crate) all_retry_delays_disabled: bool,
    pub(crate) retry_delays_disabled: HashSet<StepRef>,
    pub(crate) results: HashMap<StepRef, String>,
    /// Per attempt: a mocked error or a forced timeout (`times` given).
    pub(crate) attempts: HashMap<StepRef, BTreeMap<u32, Forced>>,
    /// The next attempt a `times` mock starts at, per step: consecutive mocks queue up.
    pub(crate) next_attempt: HashMap<StepRef, u32>,
    /// For every attempt (no `times`).
    pub(crate) always: HashMap<StepRef, Forced>,
    /// Mocked events by type, in the order they were mocked: the Nth wait of the instance
    /// for a type receives the Nth.
    pub(crate) events: HashMap<EventType, Vec<String>>,
    pub(crate) event_timeouts: HashSet<StepRef>,
}

/// One attempt of a step body (or the mock that stood in for it), as the ops report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BodyRun {
    pub(crate) workflow: WorkflowName,
    pub(crate) instance: InstanceId,
    pub(crate) step: StepKey,
    pub(crate) attempt: u32,
    /// A rollback handler rather than a step body.
    pub(crate) rollback: bool,
    /// A mock answered instead of the body.
    pub(crate) mocked: bool,
}

/// The hooks an engine consults: the modifiers by scope, and the body runs reported.
#[derive(Debug, Default)]
pub(crate) struct Hooks {
    modifiers: Mutex<HashMap<Scope, Modifiers>>,
    /// Keeps the body runs reported (the simulator reads them); a test engine does not.
    recording: bool,
    runs: Mutex<Vec<BodyRun>>,
}

fn step_ref(key: &StepKey) -> StepRef {
    (key.name.clone(), key.count)
}

impl Hooks {
    /// Hooks that keep every body run reported.
    pub(crate) fn recording() -> Self {
        Hooks {
            recording: true,
            ..Hooks::default()
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Scope, Modifiers>> {
        // A panic while holding the lock leaves nothing half-updated worth protecting.
        self.modifiers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Changes the modifiers of `scope`.
    pub(crate) fn modify<R>(&self, scope: Scope, change: impl FnOnce(&mut Modifiers) -> R) -> R {
        change(self.lock().entry(scope).or_default())
    }

    /// The first answer `pick` gives from the instance's own modifiers, then from the
    /// workflow-wide scopes that cover it, newest first.
    fn find<R>(&self, who: Who<'_>, mut pick: impl FnMut(&Modifiers) -> Option<R>) -> Option<R> {
        let map = self.lock();
        if let Some(found) = map
            .get(&Scope::Instance(who.workflow.clone(), who.id.clone()))
            .and_then(&mut pick)
        {
            return Some(found);
        }
        let mut covering: Vec<(Option<InstanceRef>, &Modifiers)> = map
            .iter()
            .filter_map(|(scope, m)| match scope {
                Scope::Workflow { workflow, since }
                    if workflow == who.workflow
                        && since.is_none_or(|since| who.instance > since) =>
                {
                    Some((*since, m))
                }
                _ => None,
            })
            .collect();
        covering.sort_by_key(|(since, _)| std::cmp::Reverse(*since));
        covering.into_iter().find_map(|(_, m)| pick(m))
    }

    /// What attempt `attempt` of the `run` step `key` does instead of running its body.
    pub(crate) fn attempt(&self, who: Who<'_>, key: &StepKey, attempt: u32) -> Option<Forced> {
        let step = step_ref(key);
        self.find(who, |m| {
            m.attempts
                .get(&step)
                .and_then(|a| a.get(&attempt))
                .or_else(|| m.always.get(&step))
                .cloned()
                .or_else(|| m.results.get(&step).cloned().map(Forced::Result))
        })
    }

    /// Whether retries of `key` wait no delay.
    pub(crate) fn retry_delay_disabled(&self, who: Who<'_>, key: &StepKey) -> bool {
        let step = step_ref(key);
        self.find(who, |m| {
            (m.all_retry_delays_disabled || m.retry_delays_disabled.contains(&step)).then_some(())
        })
        .is_some()
    }

    /// Whether the sleep `key` returns at once.
    pub(crate) fn sleep_disabled(&self, who: Who<'_>, key: &StepKey) -> bool {
        let step = step_ref(key);
        self.find(who, |m| {
            (m.all_sleeps_disabled || m.sleeps_disabled.contains(&step)).then_some(())
        })
        .is_some()
    }

    /// Whether the wait `key` times out at once.
    pub(crate) fn event_timeout_forced(&self, who: Who<'_>, key: &StepKey) -> bool {
        let step = step_ref(key);
        self.find(who, |m| m.event_timeouts.contains(&step).then_some(()))
            .is_some()
    }

    /// The mocked payload (JSON) the `ordinal`-th wait (0-based) of the instance for
    /// `event_type` receives, if any.
    pub(crate) fn mocked_event(
        &self,
        who: Who<'_>,
        event_type: &EventType,
        ordinal: usize,
    ) -> Option<String> {
        self.find(who, |m| {
            m.events
                .get(event_type)
                .and_then(|e| e.get(ordinal))
                .cloned()
        })
    }

    /// Records that a step body (or rollback handler) was called.
    pub(crate) fn body_ran(&self, run: BodyRun) {
        if !self.recording {
            return;
        }
        self.runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(run);
    }

    /// Every body run reported so far.
    pub(crate) fn runs(&self) -> Vec<BodyRun> {
        self.runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}
