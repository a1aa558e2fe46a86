//! Cairn's values in Cloudflare's shapes: field names, date format (RFC 3339 with ms), the
//! ids Cloudflare has and Cairn does not (a workflow's, a version's: derived from the name,
//! so they are stable across restarts), and the camelCase keys where Cloudflare has them
//! (`versionId` in details, `instanceId` of an event).

use axum::http::StatusCode;
use cairn::{
    InstanceDetails, InstanceStatus, InstanceSummary, RollbackStatus, StepDetails, Timestamp,
    UntypedWorkflow,
};
use serde_json::{Value, json};

use super::{CfResult, Config};
use crate::error::ApiError;

/// An id in UUID form, the same for the same parts in every process: two FNV-1a hashes.
fn stable_uuid(parts: &[&str]) -> String {
    let hash = |seed: u64| {
        let mut h = seed;
        for part in parts {
            for byte in part.bytes().chain([0]) {
                h ^= u64::from(byte);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        h
    };
    let (a, b) = (hash(0xcbf2_9ce4_8422_2325), hash(0x8422_2325_cbf2_9ce4));
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

pub(super) fn workflow_id(name: &str) -> String {
    stable_uuid(&["workflow", name])
}

/// A version of a workflow: for one in Rust, the code this build registers (`None`); for
/// one run by workers, the version its workers registered.
pub(super) fn version_id(name: &str, version: Option<&str>) -> String {
    match version {
        None => stable_uuid(&["version", name, env!("CARGO_PKG_VERSION")]),
        Some(v) => stable_uuid(&["version", name, "worker", v]),
    }
}

fn time(t: Timestamp) -> Value {
    json!(t.to_rfc3339())
}

fn time_opt(t: Option<Timestamp>) -> Value {
    t.map_or(Value::Null, time)
}

/// A workflow, as listed and described: its instance counts by status, and when the
/// newest instance was created (`triggered_on`).
pub(super) async fn workflow(workflow: &UntypedWorkflow, config: &Config) -> CfResult<Value> {
    let name = workflow.name().as_str();
    let counts = crate::actions::counts(workflow).await?;
    let newest = workflow
        .list(&cairn::ListOptions::default().limit(1))
        .await?
        .instances
        .first()
        .map(|i| i.created);
    Ok(json!({
        "id": workflow_id(name),
        "name": name,
        "class_name": name,
        "script_name": "cairn",
        "created_on": time(config.started),
        "modified_on": time(config.started),
        "triggered_on": time_opt(newest),
        "instances": counts,
        "schedules": [],
        // Whether a terminate of all its instances still runs.
        "terminator_running": u8::from(config.jobs.running(&super::terminate_job(name))),
    }))
}

/// The version of a workflow in Rust. `language` is `rust`: Cloudflare's clients know only
/// `javascript` and `python`, and only a strict validator minds.
pub(super) fn version(workflow: &UntypedWorkflow, config: &Config) -> Value {
    let name = workflow.name().as_str();
    json!({
        "id": version_id(name, None),
        "workflow_id": workflow_id(name),
        "class_name": name,
        "created_on": time(config.started),
        "modified_on": time(config.started),
        "has_dag": false,
        "language": "rust",
    })
}

/// A version of a workflow run by workers (`language`: `javascript`, what a TypeScript
/// worker runs; Cairn's `version` name and unfinished instances alongside).
pub(super) fn worker_version(name: &str, v: &cairn::VersionInfo) -> Value {
    json!({
        "id": version_id(name, Some(&v.version)),
        "workflow_id": workflow_id(name),
        "class_name": name,
        "created_on": time(v.registered_at),
        "modified_on": time(v.registered_at),
        "has_dag": false,
        "language": "javascript",
        "version": v.version,
        "unfinished": v.unfinished,
        "workers": v.workers,
    })
}

/// The answer to a create.
pub(super) fn created(
    name: &str,
    id: &str,
    status: InstanceStatus,
    version: Option<&str>,
) -> Value {
    json!({
        "id": id,
        "status": status,
        "version_id": version_id(name, version),
        "workflow_id": workflow_id(name),
        "trigger_source": "api",
    })
}

/// A row of an instance listing.
pub(super) fn listed(name: &str, row: &InstanceSummary) -> Value {
    let modified = [Some(row.created), row.started, row.ended]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(row.created);
    json!({
        "id": row.id.as_str(),
        "status": row.status,
        "created_on": time(row.created),
        "started_on": time_opt(row.started),
        "ended_on": time_opt(row.ended),
        "modified_on": time(modified),
        "version_id": version_id(name, row.version.as_deref()),
        "workflow_id": workflow_id(name),
        "trigger_source": "api",
    })
}

/// An output in details: the value itself (`null` when there is none). Cloudflare's SDKs
/// type it as text or a number; wrangler prints it with `JSON.stringify`, so text holding
/// JSON would print escaped. The value reads right in both (a strict validator aside).
fn output(output: Option<&Value>) -> Value {
    output.cloned().unwrap_or(Value::Null)
}

fn step(step: &StepDetails) -> Value {
    match step.kind {
        "sleep" => json!({
            "type": "sleep",
            "name": step.name,
            // Which occurrence of the name (the step route takes `name-count`).
            "count": step.count,
            "start": time(step.start),
            // Cloudflare gives a sleep's end while it sleeps: when it wakes.
            "end": time_opt(step.end.or(step.until)),
            "finished": step.end.is_some(),
            "error": step.error,
        }),
        "waitForEvent" => json!({
            "type": "waitForEvent",
            "name": step.name,
            "count": step.count,
            "start": time(step.start),
            "end": time_opt(step.end.or(step.until)),
            "finished": step.end.is_some(),
            "error": step.error,
            "output": output(step.output.as_ref()),
        }),
        kind => json!({
            "type": if kind == "rollback" { "rollback" } else { "step" },
            "name": step.name,
            "count": step.count,
            "start": time(step.start),
            "end": time_opt(step.end),
            "success": step.success,
            "output": output(step.output.as_ref()),
            "config": step.config,
            "attempts": step.attempts.iter().map(|a| json!({
                "start": time(a.start),
                "end": time_opt(a.end),
                "success": a.success,
                "error": a.error,
            })).collect::<Vec<_>>(),
        }),
    }
}

/// An instance's details (`GET …/instances/{id}`).
pub(super) fn details(
    name: &str,
    d: &InstanceDetails,
    rollback: Option<&RollbackStatus>,
    descending: bool,
    simple: bool,
) -> Value {
    let mut steps: Vec<Value> = d.steps.iter().map(step).collect();
    let step_count = steps.len();
    if d.status == InstanceStatus::Terminated {
        steps.push(json!({ "type": "termination", "trigger": { "source": "api" } }));
    }
    if descending {
        steps.reverse();
    }
    if simple {
        steps.clear();
    }
    let rollback = rollback.map(|r| {
        json!({
            // Cloudflare says `complete`; Cairn's status says `completed`.
            "outcome": if r.outcome == "completed" { "complete" } else { r.outcome.as_str() },
            "error": r.error,
        })
    });
    json!({
        "status": d.status,
        "params": d.params,
        "trigger": d.trigger,
        "versionId": version_id(name, d.version.as_deref()),
        "queued": time(d.queued),
        "start": time_opt(d.start),
        "end": time_opt(d.end),
        "success": d.success,
        "error": d.error,
        "output": output(d.output.as_ref()),
        "rollback": rollback,
        "step_count": step_count,
        "steps": steps,
    })
}

/// The step route's answer: the step named `name` (with its count, `fetch-1`, or alone
/// for the first) of `kind`, or one of its attempts.
/// The step's `{status, error, output}` answer, and the step found (its name and count):
/// the output here is the details' (cut past 4 KiB), the caller puts the whole one in.
pub(super) fn step_output(
    d: &InstanceDetails,
    name: &str,
    kind: &str,
    attempt: Option<u32>,
) -> CfResult<(Value, Option<(String, u32)>)> {
    let found = d
        .steps
        .iter()
        .filter(|s| s.kind == kind)
        .find(|s| format!("{}-{}", s.name, s.count) == name)
        .or_else(|| {
            d.steps
                .iter()
                .find(|s| s.kind == kind && s.name == name && s.count == 1)
        })
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "step.not_found",
                format!(
                    "instance {} has no {kind} named {:?} (name it as in the details, e.g. fetch-1)",
                    d.id,
                    crate::error::clip(name)
                ),
            )
        })?;
    let status = |success: Option<bool>| match success {
        Some(true) => "complete",
        Some(false) => "errored",
        None if found.kind == "waitForEvent" => "waiting",
        None => "running",
    };
    let (success, error) = match attempt {
        None => (found.success, found.error.clone()),
        Some(n) => {
            let a = found
                .attempts
                .iter()
                .find(|a| a.attempt == n)
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::NOT_FOUND,
                        "step.not_found",
                        format!("step {name:?} has no attempt {n}"),
                    )
                })?;
            (a.success, a.error.clone())
        }
    };
    let succeeded = success == Some(true);
    let output = if succeeded {
        found.output.clone().unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    let mut answer = json!({ "status": status(success), "error": error, "output": output });
    if found.kind == "waitForEvent"
        && let (Some(map), Some(t)) = (
            answer.as_object_mut(),
            found.output.as_ref().and_then(|o| o.get("type")),
        )
    {
        map.insert("event_type".into(), t.clone());
    }
    Ok((answer, succeeded.then(|| (found.name.clone(), found.count))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_ids_look_like_uuids_and_differ_by_name() {
        let a = workflow_id("orders");
        assert_eq!(a, workflow_id("orders"));
        assert_ne!(a, workflow_id("orders2"));
        assert_ne!(a, version_id("orders", None));
        assert_ne!(version_id("orders", None), version_id("orders", Some("1")));
        assert_ne!(
            version_id("orders", Some("1")),
            version_id("orders", Some("2"))
        );
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{a}");
    }
}
