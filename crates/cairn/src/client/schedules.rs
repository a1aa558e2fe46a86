//! Running the cron schedules ([`Schedule`]): each a task that sleeps on the engine's
//! clock until its next tick and creates the tick's instance through the client, from
//! [`EngineBuilder::start`] to [`Engine::shutdown`]; and what the API shows of them.

use std::sync::Arc;
use std::time::Duration;

use cairn_core::Timestamp;

use crate::client::Instance;
use crate::engine::schedules::{Overlap, Schedule, due_ticks, last_fired};
use crate::engine::{Engine, EngineBuilder};
use crate::error::Error;

impl EngineBuilder {
    /// Opens the store, recovers what the last engine left running, starts scheduling, and
    /// starts the cron schedules.
    ///
    /// # Errors
    /// [`Error::Config`] for a missing store, an invalid or duplicate workflow name, a
    /// schedule of a workflow not registered, or a store that cannot be opened.
    pub async fn start(self) -> Result<Engine, Error> {
        let engine = self.build().await?;
        let tasks: Vec<_> = engine
            .inner
            .schedules
            .iter()
            .map(|s| tokio::spawn(run(engine.clone(), Arc::clone(s))))
            .collect();
        if let Ok(mut slot) = engine.inner.schedule_tasks.lock() {
            *slot = tasks;
        }
        Ok(engine)
    }
}

impl Engine {
    /// The schedules declared with [`EngineBuilder::schedule`].
    pub fn schedules(&self) -> impl Iterator<Item = &Schedule> {
        self.inner.schedules.iter().map(AsRef::as_ref)
    }

    fn schedule_named(&self, name: &str) -> Result<&Schedule, Error> {
        self.schedules()
            .find(|s| s.name() == name)
            .ok_or_else(|| Error::ScheduleNotFound(name.to_owned()))
    }

    /// The newest tick `schedule` fired (read from the store), and its next one after now.
    ///
    /// # Errors
    /// [`Error::ScheduleNotFound`], or a store failure.
    pub async fn schedule_ticks(
        &self,
        schedule: &str,
    ) -> Result<(Option<Timestamp>, Option<Timestamp>), Error> {
        let s = self.schedule_named(schedule)?;
        let last = last_fired(&*self.inner.env.store, s).await?;
        Ok((last, s.next_after(self.clock().now())))
    }

    /// Starts a run of `schedule` now, outside its ticks (`{schedule}-manual-{time}`): it
    /// does not count as a tick fired and ignores the overlap policy.
    ///
    /// # Errors
    /// [`Error::ScheduleNotFound`], or the create's errors.
    pub async fn trigger_schedule(&self, schedule: &str) -> Result<Instance, Error> {
        let s = self.schedule_named(schedule)?;
        let id = s.manual_id(self.clock().now());
        self.workflow_by_name(s.workflow())?
            .create(crate::client::CreateOptions::new(s.params().clone()).id(id))
            .await
    }
}

/// Runs `schedule` until the engine shuts down.
async fn run(engine: Engine, schedule: Arc<Schedule>) {
    let runtime = Arc::clone(&engine.inner);
    let mut shutdown = runtime.shutdown.subscribe();
    let clock = runtime.env.clock.clone();
    let retry = Duration::from_secs(1);
    // The oldest tick whose instance, once created, the store still holds: purged ones are
    // gone (and their ids free), so the store cannot say whether older ticks fired.
    let retained = runtime
        .env
        .retention
        .iter()
        .find(|(w, _)| w.as_str() == schedule.workflow())
        .map_or(Duration::ZERO, |(_, r)| r.success.min(r.error));
    // Where the schedule stands: ticks after this are still to come.
    let last = loop {
        match last_fired(&*runtime.env.store, &schedule).await {
            Ok(last) => break last,
            Err(e) => {
                tracing::warn!(schedule = %schedule.name(), error = %e, "reading the schedule's last tick failed; retrying");
                tokio::select! {
                    () = clock.sleep(retry) => {}
                    _ = shutdown.wait_for(|s| *s) => return,
                }
            }
        }
    };
    let mut after = match last {
        // Never before `now - retained`: a tick older than that may have fired and been
        // purged since.
        Some(last) => last
            .max(clock.now().saturating_sub(retained))
            // A tick id from a clock ahead of this one does not hold the schedule back.
            .min(clock.now()),
        // Never fired: the schedule starts at its next tick. (A tick before now, even
        // within the grace, may be from before the schedule was declared: a server started
        // at 04:00:30 does not run the 04:00 tick of a schedule it has never run.)
        None => clock.now(),
    };
    // The run the overlap policy looks at: the last tick's, also after a restart.
    let mut previous: Option<String> = last.map(|t| schedule.tick_id(t));
    loop {
        let now = clock.now();
        let mut failed = false;
        for tick in due_ticks(&schedule, after, now) {
            if *shutdown.borrow() {
                return;
            }
            let go = wait_for_overlap(&engine, &schedule, previous.as_deref(), &mut shutdown).await;
            if go == Go::Retry {
                failed = true;
                break;
            }
            if *shutdown.borrow() {
                return;
            }
            if go != Go::Skip {
                match fire(&engine, &schedule, tick).await {
                    Ok(id) => previous = Some(id),
                    Err(e) => {
                        tracing::warn!(schedule = %schedule.name(), error = %e, "a tick failed to start; retrying");
                        failed = true;
                        break;
                    }
                }
            }
            after = tick;
            if go == Go::Waited {
                // The one buffered tick ran; those that passed while it waited are dropped.
                after = after.max(clock.now());
                break;
            }
        }
        if failed {
            tokio::select! {
                () = clock.sleep(retry) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            continue;
        }
        // Every tick up to now was fired or passed over.
        after = after.max(now);
        let Some(next) = schedule.next_after(after) else {
            tracing::info!(schedule = %schedule.name(), "the schedule has no more ticks");
            return;
        };
        tokio::select! {
            () = clock.sleep_until(next) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}

/// Whether a tick starts, as far as the previous run goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Go {
    /// At once.
    Now,
    /// After waiting for the previous run to finish ([`Overlap::BufferOne`]).
    Waited,
    /// Not at all.
    Skip,
    /// Not yet: the previous run could not be read (a store failure).
    Retry,
}

/// Whether the next tick may start as far as the previous run goes: waits for it with
/// [`Overlap::BufferOne`].
async fn wait_for_overlap(
    engine: &Engine,
    schedule: &Schedule,
    previous: Option<&str>,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) -> Go {
    if schedule.overlap_policy() == Overlap::Allow {
        return Go::Now;
    }
    let Some(previous) = previous else {
        return Go::Now;
    };
    let found = match engine.workflow_by_name(schedule.workflow()) {
        Ok(w) => w.get(previous).await,
        Err(e) => Err(e),
    };
    let instance = match found {
        Ok(i) => i,
        // Deleted or purged: it is not running.
        Err(Error::InstanceNotFound { .. }) => return Go::Now,
        Err(_) => return Go::Retry,
    };
    let unfinished = match instance.status().await {
        Ok(s) => !s.status.is_terminal(),
        Err(Error::InstanceNotFound { .. }) => false,
        Err(_) => return Go::Retry,
    };
    if !unfinished {
        return Go::Now;
    }
    match schedule.overlap_policy() {
        Overlap::Skip => {
            tracing::debug!(schedule = %schedule.name(), previous, "tick skipped: the previous run is unfinished");
            Go::Skip
        }
        _ => {
            tokio::select! {
                _ = instance.wait() => Go::Waited,
                _ = shutdown.wait_for(|s| *s) => Go::Skip,
            }
        }
    }
}

/// Creates the instance of `tick`; one that exists already (another engine, or this one
/// before a crash) is the same tick, fired.
async fn fire(engine: &Engine, schedule: &Schedule, tick: Timestamp) -> Result<String, Error> {
    let id = schedule.tick_id(tick);
    let workflow = engine.workflow_by_name(schedule.workflow())?;
    let options = crate::client::CreateOptions::new(schedule.params().clone()).id(id.clone());
    match workflow.create(options).await {
        Ok(_) => {
            tracing::debug!(schedule = %schedule.name(), instance = %id, "tick fired");
            Ok(id)
        }
        Err(Error::AlreadyExists { .. }) => Ok(id),
        Err(e) => Err(e),
    }
}
