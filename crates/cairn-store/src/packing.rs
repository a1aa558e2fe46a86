//! How backends lay log records out in rows, compactly, the same way in every backend.
//!
//! - A row holds up to two records of the same step with the same time, committed together
//!   (`STEP_START` + `ATTEMPT_START`, `ATTEMPT_SUCCESS` + `STEP_SUCCESS`): the first in the
//!   row's `kind`/`meta`, the second in `kind2`/`meta2` with the id after the row's. Rows
//!   take ids two apart, so the second id is never another row's. Records only pair within
//!   one step, so deleting a step's records deletes whole rows.
//! - A `STEP_START`'s configuration is kept apart from its `meta` (backends store it once
//!   per distinct text and refer to it), since the step's journal entry holds the same.
//!   Committed with its step's row, a `STEP_START` may leave the configuration out of its
//!   `meta` altogether: it is stored with the step's ([`pack_with`]). The engine does, for
//!   a copy of the configuration in every step's commit cost it ~7 % of its instructions.
//!
//! Readers start at the row with the cursor's id (its second record may be after the cursor)
//! and drop what is not after it.

use cairn_core::{
    InstanceId, LogEntry, LogKind, LogRecord, StepKey, StepKind, StepRecord, Timestamp,
};

use crate::{Error, Result, WorkflowLogPage};

/// How far apart the ids of consecutive log rows are.
pub const ROW_ID_STRIDE: u64 = 2;

/// One row to write: a record and, maybe, the next one of the same step.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedRow<'a> {
    /// The row's record, whose id is the row's.
    pub first: &'a LogEntry,
    /// `first`'s `meta` as stored: without a `STEP_START`'s configuration.
    pub meta: String,
    /// A `STEP_START`'s configuration, as JSON text.
    pub config: Option<String>,
    /// The record after it, with the id after the row's: same step, same time.
    pub second: Option<(LogKind, String)>,
}

/// Packs records, in order, into rows.
///
/// # Errors
/// When a `meta` cannot be encoded (it always can: it is a JSON value).
pub fn pack<'a>(records: &[&'a LogEntry]) -> Result<Vec<PackedRow<'a>>> {
    pack_with(records, &[])
}

/// [`pack`] for records committed together with step rows (`steps`, the commit's
/// `Write::Step`s): a `STEP_START` whose `meta` has no `config` is stored with the
/// configuration of its step's row.
///
/// # Errors
/// When a `meta` cannot be encoded (it always can: it is a JSON value).
pub fn pack_with<'a>(
    records: &[&'a LogEntry],
    steps: &[&StepRecord],
) -> Result<Vec<PackedRow<'a>>> {
    let mut out = Vec::with_capacity(records.len());
    let mut rest = records;
    while let Some((first, tail)) = rest.split_first() {
        let second = tail.first().copied().filter(|second| pairs(first, second));
        let (meta, config) = split_config(first, steps)?;
        out.push(PackedRow {
            first,
            meta,
            config,
            second: second
                .map(|s| Ok::<_, Error>((s.kind, encode(&s.meta)?)))
                .transpose()?,
        });
        rest = if second.is_some() { &tail[1..] } else { tail };
    }
    Ok(out)
}

/// The step records among a commit's writes: what [`pack_with`] takes a `STEP_START`'s
/// configuration from.
pub fn committed_steps(writes: &[crate::Write]) -> Vec<&StepRecord> {
    writes
        .iter()
        .filter_map(|w| match w {
            crate::Write::Step(step) => Some(step),
            _ => None,
        })
        .collect()
}

/// Two records share a row when they concern the same step at the same time. Records of
/// no step (the workflow's own, among them the terminal ones that restart-from-step
/// deletes by kind) never share a row.
fn pairs(first: &LogEntry, second: &LogEntry) -> bool {
    first.step.is_some() && first.step == second.step && first.at == second.at
}

fn encode(value: &(impl serde::Serialize + ?Sized)) -> Result<String> {
    serde_json::to_string(value).map_err(|e| Error::Corrupt(e.to_string()))
}

/// A record's `meta` as stored, and its configuration apart (a `STEP_START`'s or a
/// `ROLLBACK_STEP_START`'s; a `STEP_START` without one in its `meta` takes its step's row's
/// from `steps`).
fn split_config(e: &LogEntry, steps: &[&StepRecord]) -> Result<(String, Option<String>)> {
    if let Some(object) = e.meta.as_object()
        && let Some(config) = object.get("config")
    {
        return Ok((
            encode(&Without(object, "config"))?,
            Some(config_text(config)?),
        ));
    }
    let config = match (e.kind, &e.step) {
        (LogKind::StepStart, Some(key)) => steps
            .iter()
            .find(|step| step.key == *key)
            .map(|step| shared_config_text(&step.config))
            .transpose()?,
        _ => None,
    };
    Ok((encode(&e.meta)?, config))
}

/// An object as JSON without one of its keys (the rest in order), with no copy of it.
struct Without<'a>(&'a serde_json::Map<String, serde_json::Value>, &'static str);

impl serde::Serialize for Without<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        for (key, value) in self.0.iter().filter(|(key, _)| *key != self.1) {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// A step configuration's JSON text. Remembered for the last one on this thread: a
/// workflow's steps mostly share one, and each is encoded twice, for the step's row and its
/// `STEP_START` record.
///
/// # Errors
/// When it cannot be encoded (it always can: it is a JSON value).
pub fn config_text(config: &serde_json::Value) -> Result<String> {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(serde_json::Value, String)>> =
            const { std::cell::RefCell::new(None) };
    }
    let remembered = LAST.with(|last| match &*last.borrow() {
        Some((value, text)) if value == config => Some(text.clone()),
        _ => None,
    });
    if let Some(text) = remembered {
        return Ok(text);
    }
    let text = encode(config)?;
    LAST.with(|last| *last.borrow_mut() = Some((config.clone(), text.clone())));
    Ok(text)
}

/// [`config_text`] of a step record's configuration. Remembered by the value itself (held,
/// so no other value can take its address): a step's row and its `STEP_START` share one,
/// and a workflow's steps mostly share one, so most calls compare two pointers, not two
/// JSON values.
///
/// # Errors
/// When it cannot be encoded (it always can: it is a JSON value).
pub fn shared_config_text(config: &std::sync::Arc<serde_json::Value>) -> Result<String> {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(std::sync::Arc<serde_json::Value>, String)>> =
            const { std::cell::RefCell::new(None) };
    }
    let remembered = LAST.with(|last| match &*last.borrow() {
        Some((value, text)) if std::sync::Arc::ptr_eq(value, config) => Some(text.clone()),
        _ => None,
    });
    if let Some(text) = remembered {
        return Ok(text);
    }
    let text = config_text(config)?;
    LAST.with(|last| *last.borrow_mut() = Some((std::sync::Arc::clone(config), text.clone())));
    Ok(text)
}

/// Step configurations read back for a journal: consecutive steps mostly share one text,
/// parsed once and shared by their records (a journal of 10,000 steps is then one parse,
/// not 10,000).
#[derive(Debug, Default)]
pub struct JournalConfigs {
    last: Option<(String, std::sync::Arc<serde_json::Value>)>,
}

impl JournalConfigs {
    /// The configuration stored as `text` (`None`: missing, which is corrupt: a step left
    /// out of its journal would run again).
    ///
    /// # Errors
    /// [`Error::Corrupt`] when it is missing or is not JSON.
    pub fn read(&mut self, text: Option<String>) -> Result<std::sync::Arc<serde_json::Value>> {
        let text = text.ok_or_else(|| corrupt("a step's configuration is missing"))?;
        if let Some((last, value)) = &self.last
            && *last == text
        {
            return Ok(std::sync::Arc::clone(value));
        }
        let value = std::sync::Arc::new(serde_json::from_str(&text).map_err(corrupt)?);
        self.last = Some((text, std::sync::Arc::clone(&value)));
        Ok(value)
    }
}

/// A stored row, as read back.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRow {
    /// The row's id: its first record's.
    pub id: i64,
    /// When (both records).
    pub at: i64,
    /// The first record's kind code.
    pub kind: i64,
    /// The step's kind code, name and count, if the records concern a step.
    pub step: Option<(i64, String, u32)>,
    /// The first record's stored `meta`.
    pub meta: String,
    /// The first record's configuration, if it is a `STEP_START` written compactly.
    pub config: Option<String>,
    /// The second record's kind code and `meta`.
    pub second: Option<(i64, String)>,
}

impl PackedRow<'_> {
    /// The row as it is stored, under `id`.
    #[must_use]
    pub fn stored(self, id: i64) -> StoredRow {
        StoredRow {
            id,
            at: self.first.at.as_millis(),
            kind: self.first.kind.code(),
            step: self
                .first
                .step
                .as_ref()
                .map(|k| (k.kind.code(), k.name.clone(), k.count)),
            meta: self.meta,
            config: self.config,
            second: self.second.map(|(k, m)| (k.code(), m)),
        }
    }
}

impl StoredRow {
    /// The second record from its two columns, which are set together or not at all.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when only one of them is set.
    pub fn second(
        id: i64,
        kind: Option<i64>,
        meta: Option<String>,
    ) -> Result<Option<(i64, String)>> {
        match (kind, meta) {
            (Some(k), Some(m)) => Ok(Some((k, m))),
            (None, None) => Ok(None),
            _ => Err(corrupt(format!("log row {id}: kind2 and meta2 disagree"))),
        }
    }

    /// The configuration from the row's reference and the text it found: a reference to
    /// nothing is corrupt, never a record without its configuration.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the reference is set and the text missing.
    pub fn config(id: i64, reference: Option<i64>, text: Option<String>) -> Result<Option<String>> {
        match (reference, text) {
            (Some(r), None) => Err(corrupt(format!(
                "log row {id}: configuration {r} is missing"
            ))),
            (_, text) => Ok(text),
        }
    }
}

fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::Corrupt(what.to_string())
}

/// The records of a row, in id order.
///
/// # Errors
/// [`Error::Corrupt`] when the row does not decode.
pub fn unpack(row: StoredRow) -> Result<Vec<LogRecord>> {
    let id = u64::try_from(row.id).map_err(corrupt)?;
    let step = match row.step {
        Some((k, name, count)) => Some(StepKey {
            kind: StepKind::from_code(k)
                .ok_or_else(|| corrupt(format!("unknown step kind {k}")))?,
            name,
            count,
        }),
        None => None,
    };
    let at = Timestamp::from_millis(row.at);
    let mut meta: serde_json::Value = serde_json::from_str(&row.meta).map_err(corrupt)?;
    if let Some(config) = row.config {
        let config: serde_json::Value = serde_json::from_str(&config).map_err(corrupt)?;
        meta.as_object_mut()
            .ok_or_else(|| corrupt(format!("log record {id}: meta is not an object")))?
            .insert("config".into(), config);
    }
    let log_kind =
        |k: i64| LogKind::from_code(k).ok_or_else(|| corrupt(format!("unknown log kind {k}")));
    let mut out = vec![LogRecord {
        id,
        entry: LogEntry {
            kind: log_kind(row.kind)?,
            at,
            step: step.clone(),
            meta,
        },
    }];
    if let Some((kind, meta)) = row.second {
        out.push(LogRecord {
            id: id + 1,
            entry: LogEntry {
                kind: log_kind(kind)?,
                at,
                step,
                meta: serde_json::from_str(&meta).map_err(corrupt)?,
            },
        });
    }
    Ok(out)
}

/// How many log ids one workflow-log read looks at, at most (10,000 rows, two ids each): a
/// workflow that is quiet while others write passes over their records a window at a time.
pub const WORKFLOW_LOG_WINDOW: u64 = 20_000;

/// How many rows a page of `limit` records reads: one more, since the first row (the one
/// with the cursor's id) may hold only the cursor's record, and every later one holds at
/// least one record after it.
pub fn rows_for(limit: usize) -> usize {
    limit.saturating_add(1)
}

/// The ids a workflow-log read after `after` looks at: up to the returned bound, given
/// the newest id committed (a row's second record included). `None`: nothing to read.
pub fn workflow_window(after: u64, newest: u64) -> Option<u64> {
    let until = after.saturating_add(WORKFLOW_LOG_WINDOW).min(newest);
    (until > after).then_some(until)
}

/// An instance's page from rows read with `id >= after` (at most [`rows_for`] of them):
/// the records after the cursor, at most `limit`.
pub fn instance_page(rows: Vec<Vec<LogRecord>>, after: u64, limit: usize) -> Vec<LogRecord> {
    let mut out: Vec<LogRecord> = rows
        .into_iter()
        .flatten()
        .filter(|r| r.id > after)
        .collect();
    out.truncate(limit);
    out
}

/// A workflow's page from rows read with `after <= id <= until` (at most [`rows_for`] of
/// them), each with its instance: the records in `(after, until]`, at most `limit`, and how
/// far the read looked. More rows than `limit` means the window was not exhausted, so the
/// page ends at its last record; otherwise everything up to `until` was seen.
pub fn workflow_page(
    rows: Vec<(InstanceId, Vec<LogRecord>)>,
    after: u64,
    until: u64,
    limit: usize,
) -> WorkflowLogPage {
    let read = rows.len();
    let mut records: Vec<(InstanceId, LogRecord)> = rows
        .into_iter()
        .flat_map(|(id, records)| records.into_iter().map(move |r| (id.clone(), r)))
        .filter(|(_, r)| r.id > after && r.id <= until)
        .collect();
    let scanned_to = if read > limit || records.len() > limit {
        records.truncate(limit);
        records.last().map_or(after, |(_, r)| r.id)
    } else {
        until
    };
    WorkflowLogPage {
        records,
        scanned_to,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn entry(kind: LogKind, at: i64, step: Option<&str>, meta: serde_json::Value) -> LogEntry {
        LogEntry {
            kind,
            at: Timestamp::from_millis(at),
            step: step.map(|name| StepKey {
                kind: StepKind::Run,
                name: name.into(),
                count: 1,
            }),
            meta,
        }
    }

    #[test]
    fn packed_rows_unpack_to_the_records() {
        let records = [
            entry(LogKind::WorkflowStart, 1, None, serde_json::json!({})),
            entry(
                LogKind::StepStart,
                2,
                Some("a"),
                serde_json::json!({"config": {"retries": {"limit": 1}}, "hasRollback": false}),
            ),
            entry(
                LogKind::AttemptStart,
                2,
                Some("a"),
                serde_json::json!({"attempt": 1}),
            ),
            entry(
                LogKind::AttemptSuccess,
                2,
                Some("a"),
                serde_json::json!({"attempt": 1}),
            ),
            entry(
                LogKind::StepSuccess,
                3,
                Some("a"),
                serde_json::json!({"result": 1}),
            ),
            entry(
                LogKind::StepStart,
                3,
                Some("b"),
                serde_json::json!({"hasRollback": true}),
            ),
        ];
        let refs: Vec<&LogEntry> = records.iter().collect();
        let rows = pack(&refs).unwrap();
        assert_eq!(rows.len(), 5, "only START + ATTEMPT_START pair");
        assert_eq!(
            rows[1].config.as_deref(),
            Some(r#"{"retries":{"limit":1}}"#)
        );
        assert_eq!(
            rows[1].meta, r#"{"hasRollback":false}"#,
            "the rest, in order"
        );
        let mut next = 10;
        let mut back = Vec::new();
        for row in rows {
            back.extend(unpack(row.stored(next)).unwrap());
            next += 2;
        }
        let entries: Vec<LogEntry> = back.iter().map(|r| r.entry.clone()).collect();
        assert_eq!(entries, records);
        let ids: Vec<u64> = back.iter().map(|r| r.id).collect();
        assert_eq!(ids, [10, 12, 13, 14, 16, 18]);
    }

    /// A `STEP_START` without a `config` in its `meta` is stored with its own step's row's
    /// (found by its key among the commit's steps), exactly as one that carries it; one
    /// whose step is not in the commit keeps none, and a `config` in the `meta` wins.
    #[test]
    fn a_step_start_without_its_configuration_is_stored_with_its_steps() {
        let step = |name: &str, config: serde_json::Value| StepRecord {
            key: StepKey {
                kind: StepKind::Run,
                name: name.into(),
                count: 1,
            },
            seq: 1,
            state: cairn_core::StepState::Running,
            config: std::sync::Arc::new(config),
            attempts: 1,
            in_flight: true,
            wake_at: None,
            output: None,
            error: None,
            started_at: Timestamp::from_millis(2),
            ended_at: None,
            has_rollback: false,
        };
        let (a, b) = (
            step("a", serde_json::json!({"retries": {"limit": 1}})),
            step("b", serde_json::json!({"retries": {"limit": 2}})),
        );
        let carried = entry(
            LogKind::StepStart,
            2,
            Some("a"),
            serde_json::json!({"config": {"retries": {"limit": 1}}, "hasRollback": false}),
        );
        let left_out = entry(
            LogKind::StepStart,
            2,
            Some("a"),
            serde_json::json!({"hasRollback": false}),
        );
        let with = pack_with(&[&carried], &[&b, &a]).unwrap();
        let without = pack_with(&[&left_out], &[&b, &a]).unwrap();
        assert_eq!(without[0].meta, with[0].meta);
        assert_eq!(without[0].config, with[0].config);
        assert_eq!(
            without[0].config.as_deref(),
            Some(r#"{"retries":{"limit":1}}"#),
            "its own step's, not the other one's"
        );
        let back = unpack(without.into_iter().next().unwrap().stored(10)).unwrap();
        assert_eq!(back[0].entry, carried, "read back with its configuration");
        // No step of its key in the commit: nothing to take.
        assert_eq!(pack_with(&[&left_out], &[&b]).unwrap()[0].config, None);
        assert_eq!(pack(&[&left_out]).unwrap()[0].config, None);
        // The configuration in the record is the one stored.
        let other = pack_with(&[&carried], &[&step("a", serde_json::json!({}))]).unwrap();
        assert_eq!(other[0].config, with[0].config);
    }

    /// A shared configuration's remembered text is its own: another value, even an equal
    /// one or one at an address a dropped one had, gets its own text.
    #[test]
    fn a_shared_configuration_gets_its_own_text() {
        use std::sync::Arc;
        let one = Arc::new(serde_json::json!({"retries": {"limit": 1}}));
        let text = |c: &Arc<serde_json::Value>| shared_config_text(c).unwrap();
        assert_eq!(text(&one), r#"{"retries":{"limit":1}}"#);
        assert_eq!(text(&one), r#"{"retries":{"limit":1}}"#);
        assert_eq!(
            text(&Arc::new(serde_json::json!({"retries": {"limit": 1}}))),
            text(&one)
        );
        for n in 2..20 {
            // Each dropped at once: the next may be allocated where it was.
            let other = Arc::new(serde_json::json!({"retries": {"limit": n}}));
            assert_eq!(text(&other), format!(r#"{{"retries":{{"limit":{n}}}}}"#));
        }
        assert_eq!(text(&one), r#"{"retries":{"limit":1}}"#);
    }

    /// The remembered text is the one of the configuration asked for, never the last one's.
    #[test]
    fn each_configuration_gets_its_own_text_when_they_alternate() {
        let one = serde_json::json!({"retries": {"limit": 1}, "timeout": "1 minute"});
        let two = serde_json::json!({"retries": {"limit": 2}, "timeout": "1 minute"});
        for _ in 0..2 {
            assert_eq!(
                config_text(&one).unwrap(),
                r#"{"retries":{"limit":1},"timeout":"1 minute"}"#
            );
            assert_eq!(config_text(&one).unwrap(), config_text(&one).unwrap());
            assert_eq!(
                config_text(&two).unwrap(),
                r#"{"retries":{"limit":2},"timeout":"1 minute"}"#
            );
        }
    }

    /// Consecutive steps with one text share one parse; another text gets its own, each
    /// record its own value; a missing or broken one is corrupt, never a default.
    #[test]
    fn a_journal_parses_each_run_of_one_configuration_once() {
        let mut configs = JournalConfigs::default();
        let one = r#"{"retries":{"limit":2}}"#;
        let two = r#"{"timeout":"1 minute"}"#;
        let a = configs.read(Some(one.into())).unwrap();
        let b = configs.read(Some(one.into())).unwrap();
        assert!(std::sync::Arc::ptr_eq(&a, &b));
        let c = configs.read(Some(two.into())).unwrap();
        assert_eq!(*c, serde_json::json!({"timeout": "1 minute"}));
        let d = configs.read(Some(one.into())).unwrap();
        assert_eq!(d, a);
        assert!(matches!(configs.read(None), Err(Error::Corrupt(_))));
        assert!(matches!(
            configs.read(Some("{not json".into())),
            Err(Error::Corrupt(_))
        ));
    }
}
