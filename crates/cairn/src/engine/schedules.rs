//! Cron schedules: a workflow started on a cron expression in a time zone, declared in
//! code ([`EngineBuilder::schedule`](crate::EngineBuilder::schedule)).
//!
//! **Exactly once.** A tick creates the instance `{schedule}-{YYYYMMDDhhmmss}` (the tick
//! in UTC). Ids are unique per workflow, so a tick fires once however many engines run the
//! schedule (PostgreSQL) and however often one crashes around it: a second create of the
//! same tick is refused by the store and changes nothing. The last tick fired is that id,
//! read back from the store at start: nothing else is kept. (Deleting a schedule's newest
//! instance makes its tick look unfired: a catch-up policy that runs missed ticks may run
//! it again.)
//!
//! **Time.** Ticks follow the engine's clock, so tests run them on the virtual clock. A
//! tick is on time when it is taken up within [`GRACE`]; older ones were missed (the engine
//! was down) and [`CatchUp`] decides. Daylight saving time, in a zone that has it: a local
//! time in the hour skipped in spring does not exist and does not fire that day; a local
//! time in the hour repeated in autumn fires once, at its first occurrence, unless the
//! expression names every hour (`*/5 * * * *` fires through both, as real time passes).

use std::str::FromStr as _;
use std::time::Duration;

use cairn_core::{Timestamp, WorkflowName};
use chrono::{DateTime, LocalResult, TimeZone as _, Utc};
use chrono_tz::Tz;

use crate::workflow::Workflow;

/// How late a tick may be taken up and still be on time rather than missed.
pub const GRACE: Duration = Duration::from_secs(60);

/// What a tick does while the previous run of its schedule has not finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// Start it anyway: runs overlap.
    Allow,
    /// Do not start it (the default).
    Skip,
    /// Start it once the previous run has finished (one such tick is kept; later ones
    /// while it waits are dropped).
    BufferOne,
}

/// What happens to ticks missed while no engine ran the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// They are not run.
    Skip,
    /// The latest of them runs, once (the default).
    RunOnce,
    /// The latest `n` of them run, oldest first.
    RunAll(u32),
}

/// Why a schedule is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The name is not 1–80 characters of a-z, A-Z, 0-9, `_` and `-`.
    #[error(
        "invalid schedule name {0:?} (1-80 characters of a-z, A-Z, 0-9, '_' and '-', not starting with '-')"
    )]
    Name(String),
    /// The cron expression does not parse.
    #[error(
        "invalid cron expression {expression:?}: {reason} (5 fields: minute hour day month weekday; or 6-7 with seconds first and a year last)"
    )]
    Cron {
        /// The expression.
        expression: String,
        /// What the parser said.
        reason: String,
    },
    /// The time zone is not an IANA name.
    #[error("unknown time zone {0:?} (an IANA name such as Europe/Berlin or UTC)")]
    TimeZone(String),
    /// The params do not serialise to JSON.
    #[error("the schedule's params are not JSON: {0}")]
    Params(String),
}

/// A workflow started on a cron schedule: see the [module](self) for its guarantees.
///
/// ```
/// # use cairn::prelude::*;
/// # struct Report;
/// # impl Workflow for Report {
/// #     const NAME: &'static str = "report";
/// #     type Params = serde_json::Value;
/// #     type Output = ();
/// #     async fn run(&self, _: WorkflowEvent<serde_json::Value>, _: WorkflowStep) -> Result<(), WorkflowError> { Ok(()) }
/// # }
/// use cairn::{CatchUp, Overlap, Schedule};
/// let nightly = Schedule::new::<Report>("nightly-report", "30 2 * * *", serde_json::json!({}))?
///     .time_zone("Europe/Berlin")?
///     .overlap(Overlap::Skip)
///     .catch_up(CatchUp::RunOnce);
/// # let _ = nightly;
/// # Ok::<(), cairn::ScheduleError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Schedule {
    name: String,
    source: String,
    expression: cron::Schedule,
    zone: Tz,
    workflow: String,
    params: serde_json::Value,
    overlap: Overlap,
    catch_up: CatchUp,
}

/// How far before a point the cron iterator starts (see `Schedule::ticks_from`): more
/// than any daylight-saving shift.
const REWIND: Duration = Duration::from_secs(3 * 3600);

/// The longest schedule name: its tick ids (`{name}-` and 14 digits) stay within the 100
/// characters of an instance id.
const MAX_NAME: usize = 80;

impl Schedule {
    /// Starts workflow `W` with `params` on `cron`: 5 fields (minute hour day-of-month
    /// month day-of-week, as crontab), or 6–7 with seconds first and an optional year last.
    /// In UTC unless [`Schedule::time_zone`] says otherwise.
    ///
    /// # Errors
    /// An invalid name or expression, or params that are not JSON.
    pub fn new<W: Workflow>(
        name: &str,
        cron: &str,
        params: W::Params,
    ) -> Result<Schedule, ScheduleError> {
        let valid = !name.is_empty()
            && name.len() <= MAX_NAME
            && !name.starts_with('-')
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(ScheduleError::Name(name.to_owned()));
        }
        let fields = cron.split_whitespace().count();
        let full = if fields == 5 {
            format!("0 {cron}")
        } else {
            cron.to_owned()
        };
        let expression = cron::Schedule::from_str(&full).map_err(|e| ScheduleError::Cron {
            expression: cron.to_owned(),
            reason: e.to_string(),
        })?;
        let params =
            serde_json::to_value(params).map_err(|e| ScheduleError::Params(e.to_string()))?;
        Ok(Schedule {
            name: name.to_owned(),
            source: cron.to_owned(),
            expression,
            zone: Tz::UTC,
            workflow: W::NAME.to_owned(),
            params,
            overlap: Overlap::Skip,
            catch_up: CatchUp::RunOnce,
        })
    }

    /// Reads the expression in time zone `zone` (an IANA name; default UTC).
    ///
    /// # Errors
    /// An unknown zone.
    pub fn time_zone(mut self, zone: &str) -> Result<Schedule, ScheduleError> {
        self.zone = zone
            .parse()
            .map_err(|_| ScheduleError::TimeZone(zone.to_owned()))?;
        Ok(self)
    }

    /// What a tick does while the previous run is unfinished (default [`Overlap::Skip`]).
    pub fn overlap(mut self, overlap: Overlap) -> Schedule {
        self.overlap = overlap;
        self
    }

    /// What happens to ticks missed while no engine ran (default [`CatchUp::RunOnce`]).
    pub fn catch_up(mut self, catch_up: CatchUp) -> Schedule {
        self.catch_up = catch_up;
        self
    }

    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The workflow it starts.
    pub fn workflow(&self) -> &str {
        &self.workflow
    }

    /// The cron expression as given.
    pub fn expression(&self) -> &str {
        &self.source
    }

    /// The time zone's name.
    pub fn zone(&self) -> &str {
        self.zone.name()
    }

    /// The id of the instance that `tick` creates.
    pub fn tick_id(&self, tick: Timestamp) -> String {
        let at = utc(tick);
        format!("{}-{}", self.name, at.format("%Y%m%d%H%M%S"))
    }

    /// The id of a run started by hand at `at` (never a tick's).
    pub(crate) fn manual_id(&self, at: Timestamp) -> String {
        format!("{}-manual-{}", self.name, utc(at).format("%Y%m%d%H%M%S%3f"))
    }

    /// The params each run gets.
    pub fn params(&self) -> &serde_json::Value {
        &self.params
    }

    /// Its overlap policy.
    pub fn overlap_policy(&self) -> Overlap {
        self.overlap
    }

    /// Its catch-up policy.
    pub fn catch_up_policy(&self) -> CatchUp {
        self.catch_up
    }

    /// The tick an id of [`Schedule::tick_id`] names.
    fn tick_of(&self, id: &str) -> Option<Timestamp> {
        let digits = id.strip_prefix(&self.name)?.strip_prefix('-')?;
        let naive = chrono::NaiveDateTime::parse_from_str(digits, "%Y%m%d%H%M%S").ok()?;
        Some(Timestamp::from_millis(naive.and_utc().timestamp_millis()))
    }

    /// The ticks in `(after, until]`, in order. The cron iterator walks local time: started
    /// inside an hour that repeats, it never sees that hour's second occurrence, and through
    /// one it yields each time's two occurrences together (02:00 CEST, 02:00 CET, 02:30
    /// CEST, …), out of order by up to an hour. So the walk starts [`REWIND`] early, goes
    /// on [`REWIND`] past `until`, and sorts.
    fn ticks_in(&self, after: Timestamp, until: Timestamp) -> Vec<Timestamp> {
        let from = utc(after.saturating_sub(REWIND)).with_timezone(&self.zone);
        let stop = until.saturating_add(REWIND);
        let mut ticks: Vec<Timestamp> = self
            .expression
            .after_owned(from)
            .filter(|tick| !self.repeated(tick))
            .map(|tick| Timestamp::from_millis(tick.timestamp_millis()))
            .take_while(|t| *t <= stop)
            .filter(|t| *t > after && *t <= until)
            .collect();
        ticks.sort_unstable();
        ticks.dedup();
        ticks
    }

    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        // Look a day ahead first (every common schedule has a tick there), then further.
        for ahead in [86_400u64, 400 * 86_400, 5 * 366 * 86_400] {
            let until = t.saturating_add(Duration::from_secs(ahead));
            if let Some(first) = self.ticks_in(t, until).first() {
                return Some(*first);
            }
        }
        None
    }

    /// The ticks in `(after, until]`, at most the latest `max` of them, oldest first.
    fn between(&self, after: Timestamp, until: Timestamp, max: usize) -> Vec<Timestamp> {
        // Where to start walking forward: `max` ticks back from `until` (not from `after`,
        // which may be months ago for a schedule of every second), or `after`.
        let end = utc(until.saturating_add(Duration::from_millis(1))).with_timezone(&self.zone);
        let mut back = self.expression.after(&end);
        let mut start = after;
        for _ in 0..max.saturating_add(1) {
            match back.next_back() {
                Some(tick) => {
                    let at = Timestamp::from_millis(tick.timestamp_millis());
                    if at <= after {
                        break;
                    }
                    start = at.saturating_sub(Duration::from_millis(1));
                }
                None => break,
            }
        }
        let mut ticks = self.ticks_in(start.max(after), until);
        let excess = ticks.len().saturating_sub(max);
        ticks.drain(..excess);
        ticks
    }

    /// Whether `tick` is the second occurrence of a local time repeated when clocks go
    /// back, for an expression that names particular hours.
    fn repeated(&self, tick: &DateTime<Tz>) -> bool {
        if cron::TimeUnitSpec::is_all(self.expression.hours()) {
            return false;
        }
        match self.zone.from_local_datetime(&tick.naive_local()) {
            LocalResult::Ambiguous(first, _) => first != *tick,
            _ => false,
        }
    }
}

fn utc(t: Timestamp) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(t.as_millis()).unwrap_or_default()
}

/// The newest tick `schedule` fired, read back from the store (`None` before the first).
pub(crate) async fn last_fired(
    store: &dyn cairn_store::Store,
    schedule: &Schedule,
) -> Result<Option<Timestamp>, crate::Error> {
    let workflow = WorkflowName::new(&schedule.workflow)?;
    let rows = store
        .list(cairn_store::ListQuery {
            workflow: Some(workflow),
            id_prefix: Some(format!("{}-", schedule.name)),
            limit: 50,
            ..Default::default()
        })
        .await?;
    Ok(rows
        .iter()
        .filter_map(|r| schedule.tick_of(r.id.as_str()))
        .max())
}

/// The ticks in `(after, now]` to fire now: those on time (within [`GRACE`]), and the
/// missed ones the catch-up policy keeps.
pub(crate) fn due_ticks(schedule: &Schedule, after: Timestamp, now: Timestamp) -> Vec<Timestamp> {
    let keep = match schedule.catch_up {
        CatchUp::Skip => 1,
        CatchUp::RunOnce => 1,
        CatchUp::RunAll(n) => usize::try_from(n).unwrap_or(usize::MAX).max(1),
    };
    let ticks = schedule.between(after, now, keep);
    match schedule.catch_up {
        CatchUp::Skip => ticks
            .into_iter()
            .filter(|t| now.since(*t) <= GRACE)
            .collect(),
        _ => ticks,
    }
}
