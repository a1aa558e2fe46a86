//! Running the cron schedules ([`Schedule`]): each a task that sleeps on the engine's
//! clock until its next tick and creates the tick's instance through the client, from
//! [`EngineBuilder::start`] to [`Engine::shutdown`]; and what the API shows of them.

use std::sync::Arc;
use std::time::Duration;

use cairn_core::Timestamp;

use cairn_store::{StoredSchedule, TickFired};

use crate::client::Instance;
use crate::engine::runtime::Ticking;
use crate::engine::schedules::{Overlap, Schedule, due_ticks, last_fired};
use crate::engine::{Engine, EngineBuilder};
use crate::error::Error;

impl EngineBuilder {
    /// Opens the store, recovers what the last engine left running, starts scheduling, and
    /// starts the cron schedules (those declared in code and those stored).
    ///
    /// # Errors
    /// [`Error::Config`] for a missing store, an invalid or duplicate workflow name, a
    /// schedule of a workflow not registered, or a store that cannot be opened.
    pub async fn start(self) -> Result<Engine, Error> {
        let engine = self.build().await?;
        let shared = syncs_always(&engine);
        if let Err(e) = engine.sync_schedules().await {
            // Unread, the stored state could hold a pause: nothing ticks until a sync has
            // read it, which is tried again every few seconds.
            tracing::warn!(error = %e, "reading the stored schedules failed; retrying");
            tokio::spawn(keep_in_sync(engine.clone(), shared));
        } else if shared {
            // Other engines create, pause and delete schedules too: look every few seconds.
            tokio::spawn(keep_in_sync(engine.clone(), true));
        }
        Ok(engine)
    }
}

/// How often an engine on a shared store looks for schedules other engines changed.
const SYNC_EVERY: Duration = Duration::from_secs(5);

/// How far past an engine's now a stored last tick must be to have come from a clock ahead
/// (`ScheduleTick::ahead_after`), not from an engine a little ahead of this one: such a
/// tick holds back no tick up to now. Within it, an engine's clock that was ahead and set
/// back holds its ticks back as long as it was ahead.
pub(crate) const CLOCK_AHEAD: Duration = Duration::from_secs(5 * 60);

/// Syncs the schedules every [`SYNC_EVERY`]: for good (`always`, a shared store), or until
/// one sync succeeds.
async fn keep_in_sync(engine: Engine, always: bool) {
    let mut shutdown = engine.inner.shutdown.subscribe();
    let clock = engine.inner.env.clock.clone();
    loop {
        tokio::select! {
            () = clock.sleep(SYNC_EVERY) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        match engine.sync_schedules().await {
            Ok(()) if !always => return,
            Ok(()) => {}
            Err(e) => tracing::warn!(error = %e, "reading the stored schedules failed"),
        }
    }
}

/// Whether the schedules are synced every few seconds for good: a shared store, where
/// other engines change them too.
fn syncs_always(engine: &Engine) -> bool {
    engine.inner.env.leases.expire() && !engine.inner.env.clock.is_virtual()
}

/// After a change is stored, the runners follow it; a failure here is not the change's,
/// so it is logged, not returned, and the sync tried again every few seconds until it
/// reads (on a shared store that happens anyway; on SQLite no other sync would come
/// before the next change, and the change's runner would not tick).
async fn follow(engine: &Engine) {
    if let Err(e) = engine.sync_schedules().await {
        tracing::warn!(error = %e, "the schedules changed, but reading them back failed; retrying");
        if !syncs_always(engine) {
            tokio::spawn(keep_in_sync(engine.clone(), false));
        }
    }
}

/// A schedule as [`Engine::list_schedules`] shows it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ScheduleEntry {
    /// Its definition.
    pub schedule: Schedule,
    /// Declared in the engine's code ([`EngineBuilder::schedule`]), rather than created
    /// over the API ([`Engine::create_schedule`]).
    pub in_code: bool,
    /// Paused: it fires no ticks until resumed.
    pub paused: bool,
}

/// What ticks: a schedule, whether it is paused, since when it runs again, and which
/// generation of its name it is (1 for a schedule in code that has no stored state yet).
struct Wanted {
    schedule: Arc<Schedule>,
    paused: bool,
    resumed_at: Option<Timestamp>,
    generation: u64,
}

impl Engine {
    /// The schedules declared in code with [`EngineBuilder::schedule`] (
    /// [`Engine::list_schedules`] has those created over the API too).
    pub fn schedules(&self) -> impl Iterator<Item = &Schedule> {
        self.inner.schedules.iter().map(AsRef::as_ref)
    }

    /// Every schedule: declared in code, and stored (created over the API, by any engine on
    /// the store), by name. A stored schedule of a workflow this engine does not run is
    /// listed; it ticks on the engines that run it.
    ///
    /// # Errors
    /// A store failure.
    pub async fn list_schedules(&self) -> Result<Vec<ScheduleEntry>, Error> {
        let mut all: Vec<ScheduleEntry> = self
            .wanted(false)
            .await?
            .into_iter()
            .map(|(_, w)| ScheduleEntry {
                in_code: self.declared(w.schedule.name()).is_some(),
                schedule: (*w.schedule).clone(),
                paused: w.paused,
            })
            .collect();
        all.sort_by(|a, b| a.schedule.name().cmp(b.schedule.name()));
        Ok(all)
    }

    fn declared(&self, name: &str) -> Option<&Arc<Schedule>> {
        self.inner.schedules.iter().find(|s| s.name() == name)
    }

    /// Every schedule by name with its state; with `runnable`, only those this engine can
    /// run (its workflow is registered here).
    async fn wanted(&self, runnable: bool) -> Result<Vec<(String, Wanted)>, Error> {
        let stored = self.inner.env.store.schedules().await?;
        Ok(self.wanted_in(stored, runnable))
    }

    /// `wanted`, of the stored schedules read already.
    fn wanted_in(&self, stored: Vec<StoredSchedule>, runnable: bool) -> Vec<(String, Wanted)> {
        let mut all: Vec<(String, Wanted)> = self
            .inner
            .schedules
            .iter()
            .map(|s| {
                let state = stored.iter().find(|r| r.name == s.name());
                let wanted = Wanted {
                    schedule: Arc::clone(s),
                    paused: state.is_some_and(|r| r.paused),
                    resumed_at: state.and_then(|r| r.resumed_at),
                    generation: state.map_or(1, |r| r.generation),
                };
                (s.name().to_owned(), wanted)
            })
            .collect();
        for row in stored {
            let Some(definition) = &row.definition else {
                continue;
            };
            if self.declared(&row.name).is_some() {
                // Declared in code since it was created: the code's definition wins.
                continue;
            }
            match Schedule::from_definition(&row.name, definition) {
                Ok(schedule) => {
                    if runnable && self.workflow_by_name(schedule.workflow()).is_err() {
                        continue;
                    }
                    let wanted = Wanted {
                        schedule: Arc::new(schedule),
                        paused: row.paused,
                        resumed_at: row.resumed_at,
                        generation: row.generation,
                    };
                    all.push((row.name.clone(), wanted));
                }
                Err(e) => {
                    tracing::warn!(schedule = %row.name, error = %e, "a stored schedule does not read; it does not tick");
                }
            }
        }
        all
    }

    /// Makes a live state row for each schedule declared in code that has none: a new one,
    /// or one in place of an API schedule of that name deleted before (whose row stays,
    /// hidden: a runner's ticks found it deleted and gave up, so the declared schedule never
    /// fired). Its runner then starts with the row's generation. A live row, paused or
    /// not, is left as it is, also one another engine makes meanwhile.
    /// Answers whether it wrote any.
    async fn adopt_declared(&self, stored: &[StoredSchedule]) -> Result<bool, Error> {
        let mut wrote = false;
        for schedule in &self.inner.schedules {
            if stored.iter().any(|r| r.name == schedule.name()) {
                continue;
            }
            let state = cairn_store::ScheduleState {
                paused: false,
                resumed_at: None,
                at: self.clock().now(),
                declared: true,
                only_if_not_live: true,
            };
            self.inner
                .env
                .store
                .set_schedule_state(schedule.name(), state)
                .await?;
            wrote = true;
        }
        Ok(wrote)
    }

    /// Brings the schedules ticking in line with the code and the store: starts the new and
    /// the resumed, stops the paused and the deleted, restarts the changed.
    async fn sync_schedules(&self) -> Result<(), Error> {
        let _one_at_a_time = self.inner.schedules_sync.lock().await;
        let mut stored = self.inner.env.store.schedules().await?;
        if self.adopt_declared(&stored).await? {
            stored = self.inner.env.store.schedules().await?;
        }
        let wanted = self.wanted_in(stored, true);
        let Ok(mut tasks) = self.inner.schedule_tasks.lock() else {
            return Ok(());
        };
        if *self.inner.shutdown.borrow() {
            return Ok(());
        }
        let mut keep = std::collections::HashSet::new();
        for (name, w) in wanted {
            if w.paused {
                continue;
            }
            let version = format!(
                "{}|{:?}|{}",
                w.schedule.definition(),
                w.resumed_at.map(Timestamp::as_millis),
                w.generation
            );
            keep.insert(name.clone());
            if tasks.get(&name).is_some_and(|t| t.version == version) {
                continue;
            }
            if let Some(old) = tasks.remove(&name) {
                old.task.abort();
            }
            let task = tokio::spawn(run(self.clone(), w.schedule, w.resumed_at, w.generation));
            tasks.insert(name, Ticking { version, task });
        }
        tasks.retain(|name, t| {
            let kept = keep.contains(name);
            if !kept {
                t.task.abort();
            }
            kept
        });
        Ok(())
    }

    /// Creates a schedule for every engine on the store (kept in the store, ticking on
    /// each engine that runs its workflow; each tick still fires once). Its workflow must
    /// be registered here.
    ///
    /// # Errors
    /// [`Error::ScheduleExists`] when the name is taken (in code or in the store),
    /// [`Error::UnknownWorkflow`], or a store failure.
    pub async fn create_schedule(&self, schedule: Schedule) -> Result<(), Error> {
        // What every tick would refuse is refused now, not once per tick.
        self.workflow_by_name(schedule.workflow())?
            .check_params(schedule.stored_params())?;
        if self.declared(schedule.name()).is_some() {
            return Err(Error::ScheduleExists(schedule.name().to_owned()));
        }
        schedule
            .check(self.clock().now(), self.inner.min_schedule_interval)
            .map_err(|e| Error::InvalidSchedule(e.to_string()))?;
        let definition = schedule.definition();
        // Stored only if it reads back (a policy the API refuses, set in Rust, would not).
        Schedule::from_definition(schedule.name(), &definition)
            .map_err(|e| Error::InvalidSchedule(e.to_string()))?;
        let now = self.clock().now();
        let row = cairn_store::StoredSchedule {
            name: schedule.name().to_owned(),
            definition: Some(definition),
            paused: false,
            // A start: ticks before it are not caught up, also those an earlier schedule of
            // the same name left behind.
            resumed_at: Some(now),
            updated_at: now,
            // Set by the store: a new generation if the name was used before.
            generation: 0,
            last_tick: None,
            last_run: None,
            legacy: false,
        };
        if !self.inner.env.store.create_schedule(row).await? {
            return Err(Error::ScheduleExists(schedule.name().to_owned()));
        }
        follow(self).await;
        Ok(())
    }

    /// Pauses a schedule (declared in code or stored): it fires no tick until resumed, on
    /// any engine. Pausing a paused schedule does nothing.
    ///
    /// # Errors
    /// [`Error::ScheduleNotFound`], or a store failure.
    pub async fn pause_schedule(&self, name: &str) -> Result<(), Error> {
        self.set_paused(name, true).await
    }

    /// Resumes a paused schedule from now on: the ticks it missed while paused are not
    /// caught up. Resuming a schedule that is not paused does nothing.
    ///
    /// # Errors
    /// [`Error::ScheduleNotFound`], or a store failure.
    pub async fn resume_schedule(&self, name: &str) -> Result<(), Error> {
        self.set_paused(name, false).await
    }

    async fn set_paused(&self, name: &str, paused: bool) -> Result<(), Error> {
        let declared = self.declared(name).is_some();
        let stored = self.inner.env.store.schedules().await?;
        let row = stored.iter().find(|r| r.name == name);
        if row.is_some_and(|r| r.paused == paused) || (!paused && row.is_none() && declared) {
            // Already so (a schedule in code with no state row is not paused).
            return Ok(());
        }
        let now = self.clock().now();
        let state = cairn_store::ScheduleState {
            paused,
            resumed_at: (!paused).then_some(now),
            at: now,
            declared,
            only_if_not_live: false,
        };
        // Only the state is written: a definition changed or deleted meanwhile (by another
        // engine) is neither overwritten nor brought back.
        if !self.inner.env.store.set_schedule_state(name, state).await? {
            return Err(Error::ScheduleNotFound(name.to_owned()));
        }
        follow(self).await;
        Ok(())
    }

    /// Deletes a schedule created over the API, on every engine. The instances it started
    /// are kept.
    ///
    /// # Errors
    /// [`Error::ScheduleInCode`] for one declared in code, [`Error::ScheduleNotFound`], or a
    /// store failure.
    pub async fn delete_schedule(&self, name: &str) -> Result<(), Error> {
        if self.declared(name).is_some() {
            return Err(Error::ScheduleInCode(name.to_owned()));
        }
        if !self.inner.env.store.delete_schedule(name, false).await? {
            // Declared in code by another engine on the store (one without it, or started
            // with no schedules): its state row is what keeps it paused. (Or by none any
            // more: `forget_schedule`.)
            let stored = self.inner.env.store.schedules().await?;
            if stored
                .iter()
                .any(|r| r.name == name && r.definition.is_none())
            {
                return Err(Error::ScheduleInCode(name.to_owned()));
            }
            return Err(Error::ScheduleNotFound(name.to_owned()));
        }
        follow(self).await;
        Ok(())
    }

    /// Deletes the stored state (paused, last tick) of a schedule once declared in code
    /// that no engine declares any more: its name is free again (a delete refuses it as
    /// declared in code). An engine that still declares it starts it afresh at its next
    /// sync, not paused and with no tick fired.
    ///
    /// # Errors
    /// [`Error::ScheduleInCode`] for one this engine declares, [`Error::ScheduleNotFound`]
    /// when nothing is stored under the name, or a store failure.
    pub async fn forget_schedule(&self, name: &str) -> Result<(), Error> {
        if self.declared(name).is_some() {
            return Err(Error::ScheduleInCode(name.to_owned()));
        }
        if !self.inner.env.store.delete_schedule(name, true).await? {
            return Err(Error::ScheduleNotFound(name.to_owned()));
        }
        follow(self).await;
        Ok(())
    }

    async fn schedule_named(&self, name: &str) -> Result<Arc<Schedule>, Error> {
        if let Some(s) = self.declared(name) {
            return Ok(Arc::clone(s));
        }
        self.wanted(false)
            .await?
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, w)| w.schedule)
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
        let s = self.schedule_named(schedule).await?;
        self.ticks_of(&s).await
    }

    /// What `schedule` (one at hand) has fired, in one read: its newest tick, and the id of
    /// the instance its newest tick that started one started (the newest tick may have
    /// been passed over by its overlap policy and started none). `None`s before any tick.
    ///
    /// # Errors
    /// A store failure.
    pub async fn last_fired_of(
        &self,
        schedule: &Schedule,
    ) -> Result<(Option<Timestamp>, Option<String>), Error> {
        let fired = fired_so_far(self, schedule).await?;
        Ok((fired.last_tick, fired.last_run))
    }

    /// [`Engine::schedule_ticks`] of a schedule at hand (one of [`Engine::list_schedules`]),
    /// without looking it up again.
    ///
    /// # Errors
    /// A store failure.
    pub async fn ticks_of(
        &self,
        schedule: &Schedule,
    ) -> Result<(Option<Timestamp>, Option<Timestamp>), Error> {
        let (last, _) = self.last_fired_of(schedule).await?;
        Ok((last, schedule.next_after(self.clock().now())))
    }

    /// Starts a run of `schedule` now, outside its ticks (`{schedule}-manual-{time}`): it
    /// does not count as a tick fired and ignores the overlap policy and a pause.
    ///
    /// # Errors
    /// [`Error::ScheduleNotFound`], or the create's errors.
    pub async fn trigger_schedule(&self, schedule: &str) -> Result<Instance, Error> {
        let s = self.schedule_named(schedule).await?;
        let id = s.manual_id(self.clock().now());
        self.workflow_by_name(s.workflow())?
            .create_stored(crate::client::CreateOptions::new(s.stored_params().clone()).id(id))
            .await
    }
}

/// What a schedule has fired, as stored with its ticks.
struct Fired {
    /// Its generation now (`None`: the schedule is gone from the store).
    generation: Option<u64>,
    /// The newest tick fired.
    last_tick: Option<Timestamp>,
    /// That tick's instance.
    last_run: Option<String>,
    /// Inferred from the instances (a schedule whose ticks were not stored yet).
    inferred: bool,
}

/// What `schedule` has fired: its stored state, or, for a schedule stored before ticks
/// were (or declared in code and never stored), the newest tick among its instances, once.
async fn fired_so_far(engine: &Engine, schedule: &Schedule) -> Result<Fired, Error> {
    let stored = engine.inner.env.store.schedules().await?;
    let row = stored.into_iter().find(|r| r.name == schedule.name());
    let declared = engine.declared(schedule.name()).is_some();
    match row {
        Some(row) if !(row.legacy && row.last_tick.is_none()) => Ok(Fired {
            generation: Some(row.generation),
            last_tick: row.last_tick,
            last_run: row.last_run,
            inferred: false,
        }),
        row if row.is_some() || declared => {
            let last = last_fired(&*engine.inner.env.store, schedule).await?;
            Ok(Fired {
                generation: Some(row.map_or(1, |r| r.generation)),
                last_tick: last,
                last_run: last.map(|t| schedule.tick_id(t)),
                inferred: true,
            })
        }
        _ => Ok(Fired {
            generation: None,
            last_tick: None,
            last_run: None,
            inferred: false,
        }),
    }
}

/// Runs `schedule` (of `generation`) until the engine shuts down (or it is paused, changed
/// or deleted: then the task is aborted). Ticks before `resumed_at` are not caught up.
async fn run(
    engine: Engine,
    schedule: Arc<Schedule>,
    resumed_at: Option<Timestamp>,
    generation: u64,
) {
    let runtime = Arc::clone(&engine.inner);
    let mut shutdown = runtime.shutdown.subscribe();
    let clock = runtime.env.clock.clone();
    let retry = Duration::from_secs(1);
    let declared = engine.declared(schedule.name()).is_some();
    // Where the schedule stands, as stored: ticks after its last are still to come.
    let fired = loop {
        match fired_so_far(&engine, &schedule).await {
            Ok(fired) => break fired,
            Err(e) => {
                tracing::warn!(schedule = %schedule.name(), error = %e, "reading the schedule's last tick failed; retrying");
                tokio::select! {
                    () = clock.sleep(retry) => {}
                    _ = shutdown.wait_for(|s| *s) => return,
                }
            }
        }
    };
    if fired.generation.is_some_and(|g| g != generation) || fired.generation.is_none() && !declared
    {
        // Deleted, or created again since this runner was started: the next sync runs the
        // schedule as it is now.
        return;
    }
    // Inferred from instances, the last tick can be no older than what retention keeps:
    // older runs are gone, so the store cannot say whether older ticks fired.
    let retained = runtime
        .env
        .retention
        .iter()
        .find(|(w, _)| w.as_str() == schedule.workflow())
        .map_or(Duration::ZERO, |(_, r)| r.success.min(r.error));
    let after = match fired.last_tick {
        Some(last) if fired.inferred => last
            .max(clock.now().saturating_sub(retained))
            .min(clock.now()),
        // A tick stored by an engine whose clock is ahead does not hold the schedule back.
        Some(last) => last.min(clock.now()),
        // Never fired: the schedule starts at its next tick. (A tick before now, even
        // within the grace, may be from before the schedule was declared: a server started
        // at 04:00:30 does not run the 04:00 tick of a schedule it has never run.)
        None => clock.now(),
    };
    // Resumed since: the ticks it missed while paused are not caught up.
    let mut after = match resumed_at {
        Some(resumed) => after.max(resumed.min(clock.now())),
        None => after,
    };
    // The run the overlap policy looks at: the last tick's, also after a restart.
    let mut previous: Option<String> = fired.last_run;
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
            // A tick passed over is recorded too: it is not a missed one to catch up later.
            match fire(
                &engine,
                &schedule,
                generation,
                declared,
                tick,
                go == Go::Skip,
            )
            .await
            {
                Ok(TickFired::Fired(_)) => previous = Some(schedule.tick_id(tick)),
                Ok(TickFired::PassedOver) => {}
                Ok(TickFired::Taken) => {
                    tracing::warn!(schedule = %schedule.name(), instance = %schedule.tick_id(tick), "a tick's instance id is taken by another instance (one made by hand, or the tick's own run fired by an engine whose clock is ahead); the tick counts as fired, nothing was started");
                }
                Ok(TickFired::AlreadyFired {
                    last_tick,
                    last_run,
                }) => {
                    // Another engine fired it (or a later one): go on from there.
                    previous = last_run;
                    after = after.max(last_tick.min(now));
                    continue;
                }
                Ok(TickFired::Stale) => {
                    tracing::debug!(schedule = %schedule.name(), "the schedule was paused, deleted or created again; its next sync runs it as it is now");
                    return;
                }
                Err(e) => {
                    tracing::warn!(schedule = %schedule.name(), error = %e, "a tick failed to start; retrying");
                    failed = true;
                    break;
                }
            }
            after = tick;
            if go == Go::Waited {
                // The one buffered tick ran; those that passed while it waited are dropped,
                // recorded as passed over (the last of them stands for all).
                let now = clock.now();
                if let Some(&dropped) = schedule.between(tick, now, usize::MAX).last() {
                    match fire(&engine, &schedule, generation, declared, dropped, true).await {
                        Ok(TickFired::Stale) => return,
                        Ok(_) => {}
                        Err(e) => {
                            // Not recorded: a restart may take them for missed ones.
                            tracing::warn!(schedule = %schedule.name(), error = %e, "the ticks passed over while a run was buffered could not be recorded");
                        }
                    }
                }
                after = after.max(now);
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

/// Fires `tick`: its instance is created in the transaction that records the tick as the
/// schedule's last, so each tick fires once across engines and crashes, whatever happens to
/// the instances afterwards.
async fn fire(
    engine: &Engine,
    schedule: &Schedule,
    generation: u64,
    declared: bool,
    tick: Timestamp,
    passed_over: bool,
) -> Result<TickFired, Error> {
    let id = schedule.tick_id(tick);
    let workflow = engine.workflow_by_name(schedule.workflow())?;
    let options =
        crate::client::CreateOptions::new(schedule.stored_params().clone()).id(id.clone());
    let fired = workflow
        .fire_tick(
            schedule.name(),
            generation,
            declared,
            tick,
            options,
            passed_over,
        )
        .await?;
    if matches!(fired, TickFired::Fired(_)) {
        tracing::debug!(schedule = %schedule.name(), instance = %id, "tick fired");
    }
    Ok(fired)
}
