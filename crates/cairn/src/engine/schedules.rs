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
    /// The name is not 1–68 characters of a-z, A-Z, 0-9, `_` and `-`.
    #[error(
        "invalid schedule name {0:?} (1-68 characters of a-z, A-Z, 0-9, '_' and '-', not starting with '-')"
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
    /// The workflow name is not valid.
    #[error("invalid workflow name {0:?}")]
    Workflow(String),
    /// An overlap or catch-up policy that is not one of the known ones.
    #[error("invalid {what} {given:?} (one of {known})")]
    Policy {
        /// `overlap` or `catch-up`.
        what: &'static str,
        /// What was given.
        given: String,
        /// What is known.
        known: &'static str,
    },
    /// The expression has no tick after now: a date that never comes (`0 0 31 2 *`), or
    /// only years gone by.
    #[error("the cron expression {expression:?} never fires: it has no tick after now")]
    NeverFires {
        /// The expression.
        expression: String,
    },
    /// Two ticks would come closer together than the engine allows
    /// ([`crate::EngineBuilder::min_schedule_interval`], a minute by default).
    #[error(
        "the cron expression {expression:?} fires every {every:?} at times; the shortest interval allowed is {min:?} (the engine's min_schedule_interval, `cairn serve --min-schedule-interval`)"
    )]
    TooFrequent {
        /// The expression.
        expression: String,
        /// The shortest time between two of its ticks.
        every: Duration,
        /// The shortest allowed.
        min: Duration,
    },
    /// A stored definition that does not read back (written by a newer build?).
    #[error("the stored definition of schedule {name:?} does not read: {reason}")]
    Stored {
        /// The schedule.
        name: String,
        /// Why.
        reason: String,
    },
}

impl Overlap {
    /// The policy named `name`: `allow`, `skip`, `bufferOne` (or `buffer-one`).
    ///
    /// # Errors
    /// [`ScheduleError::Policy`] for any other name.
    pub fn parse(name: &str) -> Result<Overlap, ScheduleError> {
        match name {
            "allow" => Ok(Overlap::Allow),
            "skip" => Ok(Overlap::Skip),
            "bufferOne" | "buffer-one" => Ok(Overlap::BufferOne),
            _ => Err(ScheduleError::Policy {
                what: "overlap",
                given: name.to_owned(),
                known: "allow, skip, bufferOne",
            }),
        }
    }

    /// Its name, as [`Overlap::parse`] reads it.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Allow => "allow",
            Overlap::Skip => "skip",
            Overlap::BufferOne => "bufferOne",
        }
    }
}

impl CatchUp {
    /// The policy named `name`: `skip`, `runOnce` (or `run-once`), `runAll:N` (or
    /// `run-all:N`, N from 1 to 1000).
    ///
    /// # Errors
    /// [`ScheduleError::Policy`] for any other name.
    pub fn parse(name: &str) -> Result<CatchUp, ScheduleError> {
        let bad = || ScheduleError::Policy {
            what: "catch-up",
            given: name.to_owned(),
            known: "skip, runOnce, runAll:N (N from 1 to 1000)",
        };
        match name {
            "skip" => Ok(CatchUp::Skip),
            "runOnce" | "run-once" => Ok(CatchUp::RunOnce),
            _ => {
                let n = name
                    .strip_prefix("runAll:")
                    .or_else(|| name.strip_prefix("run-all:"))
                    .ok_or_else(bad)?;
                match n.parse::<u32>() {
                    Ok(n) if (1..=1000).contains(&n) => Ok(CatchUp::RunAll(n)),
                    _ => Err(bad()),
                }
            }
        }
    }

    /// Its name, as [`CatchUp::parse`] reads it.
    pub fn to_name(self) -> String {
        match self {
            CatchUp::Skip => "skip".to_owned(),
            CatchUp::RunOnce => "runOnce".to_owned(),
            CatchUp::RunAll(n) => format!("runAll:{n}"),
        }
    }
}

/// A workflow started on a cron schedule (`docs/schedules.md` has its guarantees).
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

/// The longest schedule name: its ids (`{name}-` and 14 digits for a tick,
/// `{name}-manual-` and 23 characters for a run started by hand) stay within the 100
/// characters of an instance id.
const MAX_NAME: usize = 68;

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
        let params = cairn_core::binary::to_value(&params)
            .map_err(|e| ScheduleError::Params(e.to_string()))?;
        Schedule::with_stored_params(name, cron, W::NAME, params)
    }

    /// [`Schedule::new`] for a workflow named `workflow` and params given as JSON (what the
    /// API and the CLI create).
    ///
    /// # Errors
    /// An invalid name, expression or workflow name.
    pub fn untyped(
        name: &str,
        cron: &str,
        workflow: &str,
        params: serde_json::Value,
    ) -> Result<Schedule, ScheduleError> {
        // Stored so that they read back exactly as given, whatever their keys.
        let params = cairn_core::binary::to_value(&params)
            .map_err(|e| ScheduleError::Params(e.to_string()))?;
        Schedule::with_stored_params(name, cron, workflow, params)
    }

    /// A schedule whose params are already in their stored form (`cairn_core::binary`).
    fn with_stored_params(
        name: &str,
        cron: &str,
        workflow: &str,
        params: serde_json::Value,
    ) -> Result<Schedule, ScheduleError> {
        let workflow = WorkflowName::new(workflow)
            .map_err(|_| ScheduleError::Workflow(workflow.to_owned()))?;
        let valid = !name.is_empty()
            && name.len() <= MAX_NAME
            && !name.starts_with('-')
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(ScheduleError::Name(name.to_owned()));
        }
        let mut fields: Vec<String> = cron.split_whitespace().map(str::to_owned).collect();
        if fields.len() == 5 {
            fields.insert(0, "0".to_owned());
        }
        if let Some(weekdays) = fields.get_mut(5) {
            *weekdays = crontab_weekdays(weekdays);
        }
        let full = fields.join(" ");
        let expression = cron::Schedule::from_str(&full).map_err(|e| ScheduleError::Cron {
            expression: cron.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Schedule {
            name: name.to_owned(),
            source: cron.to_owned(),
            expression,
            zone: Tz::UTC,
            workflow: workflow.to_string(),
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
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        format!(
            "{}-manual-{}-{}",
            self.name,
            utc(at).format("%Y%m%d%H%M%S%3f"),
            &nonce[..5]
        )
    }

    /// Whether the engine can run it from `now`: it has a tick after `now`, and no two of
    /// its ticks (among the next 500) are closer than `min`.
    ///
    /// # Errors
    /// [`ScheduleError::NeverFires`], [`ScheduleError::TooFrequent`].
    pub(crate) fn check(&self, now: Timestamp, min: Duration) -> Result<(), ScheduleError> {
        let Some(mut tick) = self.next_after(now) else {
            return Err(ScheduleError::NeverFires {
                expression: self.source.clone(),
            });
        };
        let mut shortest: Option<Duration> = None;
        for _ in 0..500 {
            let Some(next) = self.next_after(tick) else {
                break;
            };
            let gap = next.since(tick);
            shortest = Some(shortest.map_or(gap, |s| s.min(gap)));
            tick = next;
        }
        match shortest {
            Some(every) if every < min => Err(ScheduleError::TooFrequent {
                expression: self.source.clone(),
                every,
                min,
            }),
            _ => Ok(()),
        }
    }

    /// The params each run gets, as they were given.
    pub fn params(&self) -> serde_json::Value {
        let mut params = self.params.clone();
        cairn_core::binary::external(&mut params);
        params
    }

    /// The params in their stored form, what each run's create takes.
    pub(crate) fn stored_params(&self) -> &serde_json::Value {
        &self.params
    }

    /// The definition kept in the store for a schedule created over the API.
    pub(crate) fn definition(&self) -> String {
        serde_json::json!({
            "cron": self.source,
            "timeZone": self.zone.name(),
            "workflow": self.workflow,
            "params": self.params,
            "overlap": self.overlap.as_str(),
            "catchUp": self.catch_up.to_name(),
        })
        .to_string()
    }

    /// The schedule `name` from its stored [`Schedule::definition`].
    pub(crate) fn from_definition(name: &str, text: &str) -> Result<Schedule, ScheduleError> {
        let stored = |reason: String| ScheduleError::Stored {
            name: name.to_owned(),
            reason,
        };
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| stored(e.to_string()))?;
        let field = |key: &str| {
            v.get(key)
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| stored(format!("no {key}")))
        };
        let params = v.get("params").cloned().unwrap_or_default();
        Ok(
            Schedule::with_stored_params(name, field("cron")?, field("workflow")?, params)?
                .time_zone(field("timeZone")?)?
                .overlap(Overlap::parse(field("overlap")?)?)
                .catch_up(CatchUp::parse(field("catchUp")?)?),
        )
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
        if digits.len() != 14 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let naive = chrono::NaiveDateTime::parse_from_str(digits, "%Y%m%d%H%M%S").ok()?;
        Some(Timestamp::from_millis(naive.and_utc().timestamp_millis()))
    }

    /// Whether the zone's offset from UTC changes around `(after, until]` (a daylight
    /// saving transition within [`REWIND`] of it). A window of more than a month may hold
    /// two transitions with the same offset at both ends, so it counts as changing.
    fn shifts(&self, after: Timestamp, until: Timestamp) -> bool {
        let offset = |t: Timestamp| {
            use chrono::Offset as _;
            utc(t).with_timezone(&self.zone).offset().fix()
        };
        until.since(after) > Duration::from_secs(31 * 86_400)
            || offset(after.saturating_sub(REWIND)) != offset(until.saturating_add(REWIND))
    }

    /// The ticks in `(after, until]`, in order. The cron iterator walks local time: started
    /// inside an hour that repeats, it never sees that hour's second occurrence, and through
    /// one it yields each time's two occurrences together (02:00 CEST, 02:00 CET, 02:30
    /// CEST, …), out of order by up to an hour. Near a transition the walk starts
    /// [`REWIND`] early, goes on [`REWIND`] past `until`, and sorts; elsewhere it is the
    /// plain walk.
    fn ticks_in(&self, after: Timestamp, until: Timestamp) -> Vec<Timestamp> {
        let shifts = self.shifts(after, until);
        let (from, stop) = if shifts {
            (after.saturating_sub(REWIND), until.saturating_add(REWIND))
        } else {
            (after, until)
        };
        let mut ticks: Vec<Timestamp> = self
            .expression
            .after_owned(utc(from).with_timezone(&self.zone))
            .filter(|tick| !self.repeated(tick))
            .map(|tick| Timestamp::from_millis(tick.timestamp_millis()))
            .take_while(|t| *t <= stop)
            .filter(|t| *t > after && *t <= until)
            .collect();
        if shifts {
            ticks.sort_unstable();
            ticks.dedup();
        }
        ticks
    }

    /// The first tick strictly after `t`, `None` when the expression has no more (the
    /// cron walk ends in 2100).
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        // The local walk's first tick; one earlier can only come from a repeated hour
        // between `t` and it, which `ticks_in` over that stretch finds.
        let first = self
            .expression
            .after_owned(utc(t).with_timezone(&self.zone))
            .filter(|tick| !self.repeated(tick))
            .map(|tick| Timestamp::from_millis(tick.timestamp_millis()))
            .find(|tick| *tick > t)?;
        Some(self.ticks_in(t, first).first().copied().unwrap_or(first))
    }

    /// The ticks in `(after, until]`, at most the latest `max` of them, oldest first. The
    /// stretch looked at grows from two minutes back from `until` until it holds `max`
    /// ticks or reaches `after`: a schedule of every second after a month down costs
    /// `max` ticks, not a month of them.
    pub(crate) fn between(&self, after: Timestamp, until: Timestamp, max: usize) -> Vec<Timestamp> {
        let mut span = 2 * GRACE;
        loop {
            let from = until.saturating_sub(span).max(after);
            let mut ticks = self.ticks_in(from, until);
            if ticks.len() >= max || from == after {
                let excess = ticks.len().saturating_sub(max);
                ticks.drain(..excess);
                return ticks;
            }
            span = span.saturating_mul(4);
        }
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

/// A day-of-week field with crontab's numbers (0 or 7 Sunday, 1 Monday … 6 Saturday) in
/// names, which the `cron` crate reads unambiguously (its numbers start at 1 for Sunday).
/// A range ending at 7 (`5-7`) ends at Saturday and adds Sunday.
fn crontab_weekdays(field: &str) -> String {
    const NAMES: [&str; 8] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"];
    let name = |n: &str| -> Option<&'static str> { NAMES.get(n.parse::<usize>().ok()?).copied() };
    field
        .split(',')
        .map(|part| {
            let (base, step) = match part.split_once('/') {
                Some((b, s)) => (b, Some(s)),
                None => (part, None),
            };
            let base = match base.split_once('-') {
                Some((a, "7")) if step.is_none() && name(a).is_some() => {
                    format!("{}-SAT,SUN", name(a).unwrap_or("SUN"))
                }
                Some((a, b)) => match (name(a), name(b)) {
                    (Some(a), Some(b)) => format!("{a}-{b}"),
                    _ => base.to_owned(),
                },
                None => name(base).map_or_else(|| base.to_owned(), str::to_owned),
            };
            match step {
                Some(s) => format!("{base}/{s}"),
                None => base,
            }
        })
        .collect::<Vec<_>>()
        .join(",")
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
    // Newest first; runs started by hand, and schedules whose names extend this one's
    // (`sync-fast` after `sync`), share the prefix: page past them to the first tick.
    let mut before = None;
    loop {
        let rows = store
            .list(cairn_store::ListQuery {
                workflow: Some(workflow.clone()),
                id_prefix: Some(format!("{}-", schedule.name)),
                after: before,
                limit: 200,
                ..Default::default()
            })
            .await?;
        let newest = rows
            .iter()
            .filter_map(|r| schedule.tick_of(r.id.as_str()))
            .max();
        if newest.is_some() || rows.len() < 200 {
            return Ok(newest);
        }
        before = rows.last().map(|r| r.instance);
    }
}

/// The default shortest time between two ticks of a schedule: a minute.
pub(crate) const DEFAULT_MIN_INTERVAL: Duration = Duration::from_secs(60);

/// The ticks in `(after, now]` to fire now: every one on time (within [`GRACE`]), and of
/// the missed ones, those the catch-up policy keeps.
pub(crate) fn due_ticks(schedule: &Schedule, after: Timestamp, now: Timestamp) -> Vec<Timestamp> {
    let on_time_from = now.saturating_sub(GRACE).max(after);
    let on_time = schedule.between(on_time_from, now, usize::MAX);
    let missed = match schedule.catch_up {
        CatchUp::Skip => Vec::new(),
        CatchUp::RunOnce => schedule.between(after, on_time_from, 1),
        CatchUp::RunAll(n) => schedule.between(
            after,
            on_time_from,
            usize::try_from(n).unwrap_or(usize::MAX),
        ),
    };
    let mut due = missed;
    due.extend(on_time);
    due
}

#[cfg(test)]
mod tests {
    use super::*;

    struct W;
    impl Workflow for W {
        const NAME: &'static str = "w";
        type Params = serde_json::Value;
        type Output = ();
        async fn run(
            &self,
            _: crate::WorkflowEvent<serde_json::Value>,
            _: crate::WorkflowStep,
        ) -> Result<(), crate::WorkflowError> {
            Ok(())
        }
    }

    fn at(rfc3339: &str) -> Timestamp {
        Timestamp::from_millis(
            chrono::DateTime::parse_from_rfc3339(rfc3339)
                .unwrap()
                .timestamp_millis(),
        )
    }

    fn schedule(cron: &str, zone: &str) -> Schedule {
        Schedule::new::<W>("s", cron, serde_json::json!({}))
            .unwrap()
            .time_zone(zone)
            .unwrap()
    }

    fn shown(ticks: &[Timestamp]) -> Vec<String> {
        ticks.iter().map(|t| t.to_rfc3339()).collect()
    }

    #[test]
    fn every_tick_of_a_repeated_hour_is_found_going_back_as_forward() {
        // Europe/Berlin falls back from 03:00 CEST to 02:00 CET on 2026-10-25.
        let s = schedule("*/30 * * * *", "Europe/Berlin");
        let all = s.between(at("2026-10-24T23:45:00Z"), at("2026-10-25T01:45:00Z"), 100);
        assert_eq!(
            shown(&all),
            [
                "2026-10-25T00:00:00.000Z",
                "2026-10-25T00:30:00.000Z",
                "2026-10-25T01:00:00.000Z",
                "2026-10-25T01:30:00.000Z"
            ]
        );
        // The latest two, as RunAll(2) asks, while the walk back meets them out of order.
        let two = s.between(at("2026-10-25T00:00:00Z"), at("2026-10-25T00:30:00Z"), 2);
        assert_eq!(shown(&two), ["2026-10-25T00:30:00.000Z"]);
        let two = s.between(at("2026-10-24T23:00:00Z"), at("2026-10-25T01:30:00Z"), 2);
        assert_eq!(
            shown(&two),
            ["2026-10-25T01:00:00.000Z", "2026-10-25T01:30:00.000Z"]
        );
        let due = due_ticks(
            &s.clone().catch_up(CatchUp::RunAll(10)),
            at("2026-10-24T23:30:00Z"),
            at("2026-10-25T01:30:30Z"),
        );
        assert_eq!(due.len(), 4, "{:?}", shown(&due));
    }

    #[test]
    fn weekday_numbers_are_crontab_s() {
        // 2026-03-02 is a Monday.
        let weekdays = schedule("0 9 * * 1-5", "UTC");
        let mut t = at("2026-03-01T00:00:00Z");
        let mut days = Vec::new();
        for _ in 0..6 {
            t = weekdays.next_after(t).unwrap();
            days.push(t.to_rfc3339()[..10].to_owned());
        }
        assert_eq!(
            days,
            [
                "2026-03-02",
                "2026-03-03",
                "2026-03-04",
                "2026-03-05",
                "2026-03-06",
                "2026-03-09"
            ]
        );
        let sundays = schedule("0 9 * * 0", "UTC");
        assert_eq!(
            sundays
                .next_after(at("2026-03-02T00:00:00Z"))
                .unwrap()
                .to_rfc3339(),
            "2026-03-08T09:00:00.000Z"
        );
        let weekend = schedule("0 9 * * 6-7", "UTC");
        let sat = weekend.next_after(at("2026-03-02T00:00:00Z")).unwrap();
        assert_eq!(sat.to_rfc3339(), "2026-03-07T09:00:00.000Z");
        assert_eq!(
            weekend.next_after(sat).unwrap().to_rfc3339(),
            "2026-03-08T09:00:00.000Z"
        );
        assert_eq!(crontab_weekdays("1-5"), "MON-FRI");
        assert_eq!(crontab_weekdays("0,6"), "SUN,SAT");
        assert_eq!(crontab_weekdays("5-7"), "FRI-SAT,SUN");
        assert_eq!(crontab_weekdays("*/2"), "*/2");
        assert_eq!(crontab_weekdays("MON-FRI"), "MON-FRI");
    }

    #[test]
    fn rare_and_dense_schedules_find_their_next_tick() {
        let leap = schedule("0 0 29 2 *", "UTC");
        assert_eq!(
            leap.next_after(at("2026-03-01T00:00:00Z"))
                .unwrap()
                .to_rfc3339(),
            "2028-02-29T00:00:00.000Z"
        );
        let never = schedule("0 0 30 2 *", "UTC");
        assert_eq!(never.next_after(at("2026-03-01T00:00:00Z")), None);
        // Every second after a month down: the latest three, without a month of them.
        let dense = schedule("* * * * * *", "UTC");
        let started = std::time::Instant::now();
        let latest = dense.between(at("2026-02-01T00:00:00Z"), at("2026-03-01T00:00:00Z"), 3);
        assert_eq!(
            shown(&latest),
            [
                "2026-02-28T23:59:58.000Z",
                "2026-02-28T23:59:59.000Z",
                "2026-03-01T00:00:00.000Z"
            ]
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn only_tick_ids_count_as_ticks() {
        let s = schedule("*/5 * * * *", "UTC");
        let tick = at("2026-03-01T00:05:00Z");
        assert_eq!(s.tick_of(&s.tick_id(tick)), Some(tick));
        assert_eq!(s.tick_of(&s.manual_id(tick)), None);
        assert_eq!(s.tick_of("s-fast-20260301000500"), None);
        assert!(
            s.manual_id(tick) != s.manual_id(tick),
            "two runs by hand in one millisecond"
        );
        let long = Schedule::new::<W>(&"n".repeat(68), "* * * * *", serde_json::json!({})).unwrap();
        assert!(long.manual_id(tick).len() <= 100);
        assert!(crate::InstanceId::new(long.manual_id(tick)).is_ok());
    }
}
