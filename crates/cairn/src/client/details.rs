//! The instance details view (SPEC §6.2): what `describe` and the dashboard show, built
//! from the instance row, its journal and its event log.

use std::collections::HashMap;

use cairn_core::{
    ErrorInfo, InstanceStatus, LogKind, LogRecord, REDACTED, StepKey, StepKind, StepRecord,
    StepState, Timestamp,
};
use cairn_store::InstanceRecord;
use serde::Serialize;

use cairn_core::rfc3339::option::serialize as iso_opt;
use cairn_core::rfc3339::serialize as iso;

/// The most bytes of a step's output JSON the details view shows; a longer output is cut
/// (on a character boundary) and marked, and [`crate::Instance::step_output`] (over HTTP,
/// `GET …/instances/{id}/step?name=`) serves it whole.
pub const DETAILS_OUTPUT_LIMIT: usize = 4096;

/// Everything about one instance.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct InstanceDetails {
    /// The workflow.
    pub workflow: String,
    /// The instance id.
    pub id: String,
    /// Its status.
    pub status: InstanceStatus,
    /// The params it was created with.
    pub params: serde_json::Value,
    /// What created it: `{"source": "api"}`.
    pub trigger: serde_json::Value,
    /// When it was created.
    #[serde(serialize_with = "iso")]
    pub queued: Timestamp,
    /// When it first started.
    #[serde(serialize_with = "iso_opt")]
    pub start: Option<Timestamp>,
    /// When it finished.
    #[serde(serialize_with = "iso_opt")]
    pub end: Option<Timestamp>,
    /// `true` when complete, `false` when errored or terminated, `null` before.
    pub success: Option<bool>,
    /// The error, when errored.
    pub error: Option<ErrorInfo>,
    /// The output, when complete.
    pub output: Option<serde_json::Value>,
    /// Its steps in start order.
    pub steps: Vec<StepDetails>,
    /// The instance whose `invoke` step started it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<Relative>,
    /// The instances its `invoke` steps started, oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<Relative>,
    /// Its concurrency key, if it runs under one.
    #[serde(rename = "concurrencyKey", skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// Its priority among the instances waiting for a slot of its key.
    #[serde(skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// Why it has not started (or resumed): it waits for a slot of its key, at this place
    /// (1 = next).
    #[serde(rename = "waitingForSlot", skip_serializing_if = "Option::is_none")]
    pub waiting_for_slot: Option<SlotWait>,
    /// The version of its workflow's code it runs on, for a workflow run by workers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Why it does not run: no worker of its version is connected (the version it waits
    /// for).
    #[serde(rename = "waitingForWorker", skip_serializing_if = "Option::is_none")]
    pub waiting_for_worker: Option<String>,
}

/// An instance waiting for a slot of its concurrency key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SlotWait {
    /// The key.
    pub key: String,
    /// Its place in the key's queue (1 = next).
    pub position: u64,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// A parent or child of an instance (`step.invoke`).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Relative {
    /// Its workflow.
    pub workflow: String,
    /// Its id.
    pub id: String,
    /// The parent's `invoke` step that started the child: its name.
    pub step: String,
    /// And its count.
    pub count: u32,
    /// The child's status (for a parent, `null`: read it from the parent).
    pub status: Option<InstanceStatus>,
    /// The child outlives its parent.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub detached: bool,
}

/// One step of an instance.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct StepDetails {
    /// `step`, `sleep` or `waitForEvent`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The step name.
    pub name: String,
    /// Its occurrence count.
    pub count: u32,
    /// When it started.
    #[serde(serialize_with = "iso")]
    pub start: Timestamp,
    /// When it finished.
    #[serde(serialize_with = "iso_opt")]
    pub end: Option<Timestamp>,
    /// `true`/`false` once finished, `null` while running.
    pub success: Option<bool>,
    /// The workflow stopped awaiting it while an attempt ran (e.g. it lost a `select!`);
    /// `success` is then `false` and `error` says so.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cancelled: bool,
    /// The resolved config it ran with.
    pub config: serde_json::Value,
    /// Its output (`"[REDACTED]"` for a sensitive step), with each byte sequence shown as
    /// `"[Bytes(N bytes)]"`. Over [`DETAILS_OUTPUT_LIMIT`] bytes of JSON, a string: the
    /// first bytes of the JSON and `[truncated output: N bytes]`.
    pub output: Option<serde_json::Value>,
    /// The size of the whole output when `output` shows less of it: the JSON cut short or
    /// holding byte sequences (counted as their bytes), or a stream step's bytes.
    #[serde(rename = "outputBytes", skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    /// Its final error.
    pub error: Option<ErrorInfo>,
    /// When its next attempt is due, while a step (or rollback) waits for a retry.
    #[serde(serialize_with = "iso_opt", rename = "retriesAt")]
    pub retries_at: Option<Timestamp>,
    /// When it wakes (a sleep) or times out (a wait for an event), while it is in progress.
    #[serde(serialize_with = "iso_opt")]
    pub until: Option<Timestamp>,
    /// Its attempts, in order.
    pub attempts: Vec<AttemptDetails>,
}

/// One attempt of a step.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct AttemptDetails {
    /// 1-based attempt number.
    pub attempt: u32,
    /// When it started.
    #[serde(serialize_with = "iso")]
    pub start: Timestamp,
    /// When it ended.
    #[serde(serialize_with = "iso_opt")]
    pub end: Option<Timestamp>,
    /// `true`/`false` once ended, `null` while running.
    pub success: Option<bool>,
    /// Why it failed.
    pub error: Option<ErrorInfo>,
    /// The wait before the next attempt, when one was scheduled.
    #[serde(rename = "retryDelayMs")]
    pub retry_delay_ms: Option<u64>,
}

/// A step's output as details show it: byte sequences as their size, the JSON cut at
/// [`DETAILS_OUTPUT_LIMIT`] bytes.
fn output_view(json: &str) -> serde_json::Value {
    if cairn_core::binary::shown_differently(json) {
        let shown = cairn_core::binary::view(json);
        let text = shown.to_string();
        if text.len() > DETAILS_OUTPUT_LIMIT {
            serde_json::Value::from(truncated(&text))
        } else {
            shown
        }
    } else if json.len() > DETAILS_OUTPUT_LIMIT {
        serde_json::Value::from(truncated(json))
    } else {
        serde_json::from_str(json).unwrap_or(serde_json::Value::Null)
    }
}

/// The first [`DETAILS_OUTPUT_LIMIT`] bytes of `json` (cut on a character boundary) and
/// the marker that says how large it is.
fn truncated(json: &str) -> String {
    let mut end = DETAILS_OUTPUT_LIMIT.min(json.len());
    while !json.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [truncated output: {} bytes]", &json[..end], json.len())
}

fn kind_label(kind: StepKind) -> &'static str {
    kind.as_str()
}

impl InstanceDetails {
    pub(crate) fn build(
        record: &InstanceRecord,
        journal: &[StepRecord],
        log: &[LogRecord],
        children: &[InstanceRecord],
        slot_position: Option<u64>,
    ) -> Self {
        let mut attempts: HashMap<&StepKey, Vec<AttemptDetails>> = HashMap::new();
        for r in log {
            let Some(key) = r.entry.step.as_ref() else {
                continue;
            };
            let meta = &r.entry.meta;
            let number = meta
                .get("attempt")
                .and_then(serde_json::Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0);
            let list = attempts.entry(key).or_default();
            // A rollback handler's attempts are logged under its own (rollback) key.
            match r.entry.kind {
                LogKind::AttemptStart | LogKind::RollbackAttemptStart => {
                    list.push(AttemptDetails {
                        attempt: number,
                        start: r.entry.at,
                        end: None,
                        success: None,
                        error: None,
                        retry_delay_ms: None,
                    })
                }
                LogKind::AttemptSuccess
                | LogKind::AttemptFailure
                | LogKind::RollbackAttemptSuccess
                | LogKind::RollbackAttemptFailure => {
                    if let Some(a) = list.iter_mut().rev().find(|a| a.attempt == number) {
                        a.end = Some(r.entry.at);
                        a.success = Some(matches!(
                            r.entry.kind,
                            LogKind::AttemptSuccess | LogKind::RollbackAttemptSuccess
                        ));
                        a.error = meta
                            .get("error")
                            .and_then(|e| serde_json::from_value(e.clone()).ok());
                        a.retry_delay_ms =
                            meta.get("retryDelayMs").and_then(serde_json::Value::as_u64);
                    }
                }
                _ => {}
            }
        }
        let steps = journal
            .iter()
            .map(|s| {
                let sensitive = s.config.get("sensitive").is_some();
                let due = s
                    .wake_at
                    .filter(|_| s.state == StepState::Running && !s.in_flight);
                let waits = matches!(s.key.kind, StepKind::Sleep | StepKind::WaitForEvent);
                StepDetails {
                    kind: kind_label(s.key.kind),
                    name: s.key.name.clone(),
                    count: s.key.count,
                    start: s.started_at,
                    end: s.ended_at,
                    success: match s.state {
                        StepState::Running => None,
                        StepState::Succeeded => Some(true),
                        StepState::Failed | StepState::Cancelled => Some(false),
                    },
                    cancelled: s.state == StepState::Cancelled,
                    config: (*s.config).clone(),
                    output: s.output.as_deref().map(|json| {
                        if crate::ops::stream_meta::is_stream(&s.config) {
                            crate::ops::stream_meta::stream_view(json, sensitive)
                        } else if sensitive {
                            serde_json::Value::from(REDACTED)
                        } else {
                            output_view(json)
                        }
                    }),
                    output_bytes: s.output.as_deref().filter(|_| !sensitive).and_then(|json| {
                        if crate::ops::stream_meta::is_stream(&s.config) {
                            // A stream's views show its preview: its bytes are elsewhere.
                            crate::ops::stream_meta::stream_bytes(json)
                        } else {
                            (json.len() > DETAILS_OUTPUT_LIMIT
                                || cairn_core::binary::has_bytes(json))
                            .then(|| cairn_core::binary::size(json) as u64)
                        }
                    }),
                    error: s.error.clone(),
                    retries_at: due.filter(|_| !waits),
                    until: due.filter(|_| waits),
                    attempts: attempts.remove(&s.key).unwrap_or_default(),
                }
            })
            .collect();
        let success = match record.status {
            InstanceStatus::Complete => Some(true),
            InstanceStatus::Errored | InstanceStatus::Terminated => Some(false),
            _ => None,
        };
        InstanceDetails {
            workflow: record.workflow.to_string(),
            id: record.id.to_string(),
            status: record.status,
            params: cairn_core::binary::external_value(&record.params)
                .unwrap_or(serde_json::Value::Null),
            trigger: match &record.parent {
                Some(p) => serde_json::json!({
                    "source": "parent",
                    "workflow": p.workflow,
                    "id": p.id,
                    "step": p.step.name,
                    "count": p.step.count,
                }),
                None => serde_json::json!({ "source": "api" }),
            },
            queued: record.created_at,
            start: record.started_at,
            end: record.ended_at,
            success,
            error: record
                .error
                .clone()
                .filter(|_| record.status == InstanceStatus::Errored),
            output: record
                .output
                .as_deref()
                .filter(|_| record.status == InstanceStatus::Complete)
                .and_then(|json| cairn_core::binary::external_value(json).ok()),
            steps,
            parent: record.parent.as_ref().map(|p| Relative {
                workflow: p.workflow.to_string(),
                id: p.id.to_string(),
                step: p.step.name.clone(),
                count: p.step.count,
                status: None,
                detached: p.detached,
            }),
            children: children
                .iter()
                .filter_map(|c| {
                    let link = c.parent.as_ref()?;
                    Some(Relative {
                        workflow: c.workflow.to_string(),
                        id: c.id.to_string(),
                        step: link.step.name.clone(),
                        count: link.step.count,
                        status: Some(c.status),
                        detached: link.detached,
                    })
                })
                .collect(),
            concurrency_key: record.concurrency_key.clone(),
            priority: record.priority,
            waiting_for_slot: match (&record.concurrency_key, slot_position) {
                (Some(key), Some(position)) if record.waiting_for_slot => Some(SlotWait {
                    key: key.clone(),
                    position,
                }),
                _ => None,
            },
            version: record.version.clone(),
            waiting_for_worker: (record.ready_at == Some(cairn_store::AWAITING_WORKER))
                .then(|| record.version.clone().unwrap_or_default()),
        }
    }
}
