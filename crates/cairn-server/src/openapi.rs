//! The OpenAPI document served at `/api/openapi.json`, built from the same route table the
//! router uses, so the two cannot drift apart.

use serde_json::{Map, Value, json};

/// Every route: method, path, summary.
pub(crate) const ROUTES: &[(&str, &str, &str)] = &[
    ("get", "/healthz", "Liveness check (open without the token)"),
    ("get", "/api", "The API's index: version and links"),
    ("get", "/api/openapi.json", "This document"),
    ("get", "/api/workflows", "List the registered workflows"),
    (
        "get",
        "/api/workflows/{name}",
        "Describe a workflow, with instance counts by status",
    ),
    (
        "get",
        "/api/workflows/{name}/versions",
        "The versions of a workflow that workers run: when each was registered, which is newest (new instances start on it), its unfinished instances and its connected workers",
    ),
    (
        "get",
        "/api/instances",
        "List the instances of every workflow (or one) by a filter: status list, creation range, id prefix; newest first, paged by cursor",
    ),
    (
        "post",
        "/api/instances/bulk",
        "Pause, resume, terminate, restart or delete the instances a filter matches (a page at a time, by cursor) or a list of instances; per-instance results",
    ),
    (
        "get",
        "/api/schedules",
        "The cron schedules, declared in code or created over the API: expression, time zone, policies, paused, last tick fired, next tick",
    ),
    (
        "post",
        "/api/schedules",
        "Create a schedule for every engine on the store {name, cron, workflow, params?, timeZone?, overlap?, catchUp?}",
    ),
    ("get", "/api/schedules/{schedule}", "One schedule"),
    (
        "delete",
        "/api/schedules/{schedule}",
        "Delete a schedule created over the API (its runs are kept)",
    ),
    (
        "post",
        "/api/schedules/{schedule}/pause",
        "Pause a schedule: no tick fires until it is resumed (other engines on the store follow within 5 s)",
    ),
    (
        "post",
        "/api/schedules/{schedule}/resume",
        "Resume a schedule from now on (ticks missed while paused are not caught up)",
    ),
    (
        "post",
        "/api/schedules/{schedule}/trigger",
        "Start a run of a schedule now, outside its ticks ({name}-manual-{time})",
    ),
    (
        "post",
        "/api/workflows/{name}/instances",
        "Create an instance {instance_id?, params?, concurrency_key?, priority?, retention?}; with ?wait=30s, answer once it has finished (create and wait in one request)",
    ),
    (
        "get",
        "/api/workflows/{name}/instances",
        "List instances, newest first (status, limit, cursor)",
    ),
    (
        "post",
        "/api/workflows/{name}/instances/batch",
        "Create up to 100 instances; existing ids are reported in errors",
    ),
    (
        "post",
        "/api/workflows/{name}/instances/batch/delete",
        "Delete up to 100 instances {instances: [id]}",
    ),
    (
        "get",
        "/api/workflows/{name}/instances/{id}",
        "Instance details: status, params, output, error, steps with attempts",
    ),
    (
        "delete",
        "/api/workflows/{name}/instances/{id}",
        "Delete an instance",
    ),
    (
        "patch",
        "/api/workflows/{name}/instances/{id}/status",
        "{status: pause|resume|terminate|restart, from?, rollback?}",
    ),
    (
        "post",
        "/api/workflows/{name}/instances/{id}/events/{type}",
        "Send an event; the body is its payload",
    ),
    (
        "get",
        "/api/workflows/{name}/instances/{id}/step",
        "One step's whole output, as stored (the details view cuts outputs over 4 KiB); \"[REDACTED]\" for a sensitive step",
    ),
    (
        "get",
        "/api/workflows/{name}/instances/{id}/wait",
        "Long poll: answers when the instance has finished, or at the timeout, with its status and output",
    ),
    (
        "get",
        "/api/workflows/{name}/instances/{id}/stream",
        "Server-Sent Events: the event log, then live records (Last-Event-ID or cursor)",
    ),
    (
        "get",
        "/api/workflows/{name}/stream",
        "Server-Sent Events of every instance of the workflow (Last-Event-ID or cursor); does not end",
    ),
];

/// The query parameters, request body and success answer of a route.
fn operation(method: &str, path: &str) -> (Vec<Value>, Option<Value>, (&'static str, Value)) {
    let query = |name: &str, description: &str, schema: Value| json!({ "name": name, "in": "query", "required": false, "description": description, "schema": schema });
    let schema = |name: &str| json!({ "$ref": format!("#/components/schemas/{name}") });
    let body = |s: Value| {
        Some(json!({ "required": true, "content": { "application/json": { "schema": s } } }))
    };
    let sse = json!({ "text/event-stream": { "schema": { "type": "string" } } });
    match (method, path) {
        ("get", "/healthz") => (vec![], None, ("200", schema("Health"))),
        ("get", "/api") => (vec![], None, ("200", schema("Index"))),
        ("get", "/api/openapi.json") => (vec![], None, ("200", json!({ "type": "object" }))),
        ("get", "/api/workflows") => (vec![], None, ("200", schema("WorkflowList"))),
        ("get", "/api/workflows/{name}") => (vec![], None, ("200", schema("Workflow"))),
        ("get", "/api/workflows/{name}/versions") => {
            (vec![], None, ("200", schema("WorkflowVersions")))
        }
        ("post", "/api/workflows/{name}/instances") => (
            vec![query(
                "wait",
                "Wait up to this long (30s, 2m, 500ms; at most 60 s) for the instance to finish; the answer then has its output or error",
                json!({ "type": "string" }),
            )],
            body(schema("CreateInstance")),
            ("201", schema("Settled")),
        ),
        ("get", "/api/workflows/{name}/instances/{id}/step") => (
            vec![
                json!({ "name": "name", "in": "query", "required": true, "description": "The step's name", "schema": { "type": "string" } }),
                query(
                    "count",
                    "Its occurrence among steps of that name (default 1)",
                    json!({ "type": "integer", "minimum": 1 }),
                ),
                query(
                    "type",
                    "step (default), sleep, waitForEvent or invoke",
                    json!({ "type": "string" }),
                ),
                query(
                    "attempt",
                    "Only if this attempt produced it",
                    json!({ "type": "integer", "minimum": 1 }),
                ),
            ],
            None,
            (
                "200",
                json!({ "description": "the output's JSON as stored (byte sequences in it as {\"$bytes\": \"<base64>\"}); the bytes themselves as application/octet-stream, with Content-Length, for a stream step or an output that is one byte sequence; \"[REDACTED]\" for a sensitive step" }),
            ),
        ),
        ("get", "/api/workflows/{name}/instances/{id}/wait") => (
            vec![query(
                "timeout",
                "How long to wait (30s, 2m, 500ms; default 30 s, at most 60 s)",
                json!({ "type": "string" }),
            )],
            None,
            ("200", schema("Settled")),
        ),
        ("get", "/api/workflows/{name}/instances") => (
            vec![
                query("status", "Only instances in this status", schema("Status")),
                query(
                    "limit",
                    "Page size, 1 to 1000 (default 50)",
                    json!({ "type": "integer", "minimum": 1, "maximum": 1000 }),
                ),
                query(
                    "cursor",
                    "The `cursor` of the previous page",
                    json!({ "type": "string" }),
                ),
            ],
            None,
            ("200", schema("InstanceList")),
        ),
        ("get", "/api/instances") => (
            vec![
                query(
                    "workflow",
                    "Only this workflow's instances",
                    json!({ "type": "string" }),
                ),
                query(
                    "status",
                    "Only instances in one of these statuses (comma-separated)",
                    json!({ "type": "string", "example": "running,waiting" }),
                ),
                query(
                    "createdFrom",
                    "Created at or after (RFC 3339 or epoch ms)",
                    json!({ "type": "string" }),
                ),
                query(
                    "createdBefore",
                    "Created before (RFC 3339 or epoch ms)",
                    json!({ "type": "string" }),
                ),
                query("idPrefix", "Id starts with", json!({ "type": "string" })),
                query(
                    "limit",
                    "Page size, 1 to 1000 (default 50)",
                    json!({ "type": "integer", "minimum": 1, "maximum": 1000 }),
                ),
                query(
                    "cursor",
                    "The `cursor` of the previous page",
                    json!({ "type": "string" }),
                ),
            ],
            None,
            ("200", schema("InstanceList")),
        ),
        ("get", "/api/schedules") => (vec![], None, ("200", schema("ScheduleList"))),
        ("post", "/api/schedules") => (
            vec![],
            body(schema("NewSchedule")),
            ("201", schema("Schedule")),
        ),
        (
            "get" | "post",
            "/api/schedules/{schedule}"
            | "/api/schedules/{schedule}/pause"
            | "/api/schedules/{schedule}/resume",
        ) => (vec![], None, ("200", schema("Schedule"))),
        ("delete", "/api/schedules/{schedule}") => (
            vec![query(
                "forget",
                "true: forget the stored state (paused, last tick) of a schedule once declared in code that no engine declares any more",
                json!({ "type": "boolean" }),
            )],
            None,
            (
                "200",
                json!({ "type": "object", "properties": { "deleted": { "type": "string" } } }),
            ),
        ),
        ("post", "/api/schedules/{schedule}/trigger") => (
            vec![],
            None,
            (
                "201",
                json!({ "type": "object", "properties": { "workflow": { "type": "string" }, "id": { "type": "string" }, "status": { "$ref": "#/components/schemas/Status" } } }),
            ),
        ),
        ("post", "/api/instances/bulk") => (
            vec![],
            body(schema("BulkRequest")),
            ("200", schema("BulkResult")),
        ),
        ("post", "/api/workflows/{name}/instances/batch") => (
            vec![],
            body(json!({ "type": "array", "maxItems": 100, "items": schema("CreateInstance") })),
            ("201", schema("BatchCreated")),
        ),
        ("post", "/api/workflows/{name}/instances/batch/delete") => (
            vec![],
            body(
                json!({ "type": "object", "required": ["instances"], "properties": { "instances": { "type": "array", "maxItems": 100, "items": { "type": "string" } } } }),
            ),
            ("200", schema("BatchDeleted")),
        ),
        ("get", "/api/workflows/{name}/instances/{id}") => {
            (vec![], None, ("200", schema("InstanceDetails")))
        }
        ("delete", "/api/workflows/{name}/instances/{id}") => {
            (vec![], None, ("200", json!({ "type": "object" })))
        }
        ("patch", "/api/workflows/{name}/instances/{id}/status") => (
            vec![],
            body(schema("StatusChange")),
            ("200", schema("StatusOnly")),
        ),
        ("post", "/api/workflows/{name}/instances/{id}/events/{type}") => (
            vec![],
            Some(
                json!({ "required": false, "description": "The payload (none: null)", "content": { "application/json": { "schema": {} } } }),
            ),
            (
                "200",
                json!({ "type": "object", "properties": { "duplicate": { "type": "boolean" } } }),
            ),
        ),
        (_, p) if p.ends_with("/stream") => (
            vec![query(
                "cursor",
                "Resume after this record id (or send Last-Event-ID)",
                json!({ "type": "integer", "minimum": 0 }),
            )],
            None,
            ("200", sse),
        ),
        _ => (vec![], None, ("200", json!({ "type": "object" }))),
    }
}

/// The shapes the API answers and takes.
fn schemas() -> Value {
    // Built apart: one json! of every schema would pass the macro's recursion limit.
    let version = json!({
        "type": "object",
        "properties": {
            "version": { "type": "string" },
            "registered_at": { "type": "string", "format": "date-time" },
            "newest": { "type": "boolean" },
            "unfinished": { "type": "integer", "description": "Unfinished instances pinned to it: keep a worker of it while there are any" },
            "workers": { "type": "integer", "description": "Workers of it connected now" },
        },
    });
    let time = json!({ "type": "string", "format": "date-time", "description": "RFC 3339, UTC, milliseconds" });
    let nullable_time = json!({ "type": "string", "format": "date-time", "nullable": true });
    let mut all = json!({
        "Error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": { "type": "string", "example": "instance.not_found" },
                "message": { "type": "string" },
            },
        },
        "Status": {
            "type": "string",
            "enum": ["queued", "running", "paused", "errored", "terminated", "complete", "waitingForPause", "waiting"],
        },
        "Health": { "type": "object", "properties": { "ok": { "type": "boolean" } } },
        "Index": {
            "type": "object",
            "properties": {
                "name": { "type": "string" },
                "version": { "type": "string" },
                "links": { "type": "object", "additionalProperties": { "type": "string" } },
            },
        },
        "WorkflowList": {
            "type": "object",
            "properties": { "workflows": { "type": "array", "items": { "type": "object", "properties": { "name": { "type": "string" } } } } },
        },
        "Workflow": {
            "type": "object",
            "properties": {
                "name": { "type": "string" },
                "instances": { "type": "object", "additionalProperties": { "type": "integer" }, "description": "Counts by status" },
            },
        },
        "CreateInstance": {
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "instance_id": { "type": "string", "description": "Generated when omitted; `latest` is reserved" },
                "id": { "type": "string", "description": "The same as instance_id (Cloudflare's binding calls it id); not both" },
                "params": { "description": "Any JSON (default {})" },
                "concurrency_key": { "type": "string", "description": "Run under this concurrency key (the workflow needs a limit)" },
                "priority": { "type": "integer", "description": "Among the instances waiting for a slot of the key, higher first (default 0)" },
                "retention": {
                    "type": "object",
                    "description": "How long the finished instance is kept, by outcome, over the workflow's retention: milliseconds or a duration (\"30 days\"); successRetention and errorRetention are accepted too, as Cloudflare's binding spells them; any other key is refused",
                    "properties": {
                        "success_retention": { "oneOf": [{ "type": "integer" }, { "type": "string" }] },
                        "error_retention": { "oneOf": [{ "type": "integer" }, { "type": "string" }] },
                    },
                },
            },
        },
        "Settled": {
            "type": "object",
            "description": "An instance's status after a wait: finished (complete, errored, terminated) or not yet",
            "properties": {
                "id": { "type": "string" },
                "status": { "$ref": "#/components/schemas/Status" },
                "output": { "description": "When complete" },
                "error": { "type": "object", "nullable": true, "properties": { "name": { "type": "string" }, "message": { "type": "string" } } },
                "rollback": { "type": "object", "nullable": true },
            },
        },
        "Created": {
            "type": "object",
            "properties": { "id": { "type": "string" }, "status": { "$ref": "#/components/schemas/Status" } },
        },
        "BatchCreated": {
            "type": "object",
            "properties": {
                "created": { "type": "array", "items": { "type": "string" } },
                "errors": { "type": "array", "items": { "type": "object" } },
            },
        },
        "BatchDeleted": {
            "type": "object",
            "properties": {
                "deleted": { "type": "array", "items": { "type": "string" } },
                "errors": { "type": "array", "items": { "type": "object" } },
            },
        },
        "InstanceSummary": {
            "type": "object",
            "properties": {
                "workflow": { "type": "string", "description": "in /api/instances only" },
                "id": { "type": "string" },
                "status": { "$ref": "#/components/schemas/Status" },
                "created": time.clone(),
                "started": nullable_time,
                "ended": nullable_time,
            },
        },
        "Filter": {
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "workflow": { "type": "string" },
                "status": { "type": "array", "items": { "$ref": "#/components/schemas/Status" } },
                "createdFrom": time.clone(),
                "createdBefore": time.clone(),
                "idPrefix": { "type": "string" },
            },
        },
        "ScheduleList": {
            "type": "object",
            "properties": { "schedules": { "type": "array", "items": { "$ref": "#/components/schemas/Schedule" } } },
        },
        "BulkRequest": {
            "type": "object",
            "required": ["action"],
            "additionalProperties": false,
            "description": "Exactly one of filter and instances. A filter is worked through a page (limit) per request: pass back the answer's cursor until it is null.",
            "properties": {
                "action": { "type": "string", "enum": ["pause", "resume", "terminate", "restart", "delete"] },
                "rollback": { "type": "boolean", "description": "terminate with rollback" },
                "filter": { "$ref": "#/components/schemas/Filter" },
                "instances": { "type": "array", "maxItems": 1000, "items": { "type": "object", "required": ["workflow", "id"], "properties": { "workflow": { "type": "string" }, "id": { "type": "string" } } } },
                "cursor": { "type": "string" },
                "limit": { "type": "integer", "minimum": 1, "maximum": 1000, "description": "default 100" },
                "dryRun": { "type": "boolean", "description": "answer {matched} and act on nothing" },
            },
        },
        "BulkResult": {
            "type": "object",
            "properties": {
                "matched": { "type": "integer", "description": "with dryRun only" },
                "results": { "type": "array", "items": { "type": "object", "required": ["workflow", "id", "ok"], "properties": {
                    "workflow": { "type": "string" }, "id": { "type": "string" }, "ok": { "type": "boolean" },
                    "code": { "type": "string" }, "message": { "type": "string" } } } },
                "cursor": { "type": "string", "nullable": true, "description": "the next page's; with dryRun, the cursor that starts at what was counted (pass it to act on exactly that)" },
            },
        },
        "InstanceList": {
            "type": "object",
            "properties": {
                "instances": { "type": "array", "items": { "$ref": "#/components/schemas/InstanceSummary" } },
                "cursor": { "type": "string", "nullable": true, "description": "Pass as `cursor` for the next page" },
            },
        },
        "InstanceDetails": {
            "type": "object",
            "description": "SPEC §6.2: status, params, trigger, times, output, error, and the steps with their attempts",
            "properties": {
                "status": { "$ref": "#/components/schemas/Status" },
                "params": {},
                "output": {},
                "error": { "type": "object", "nullable": true, "properties": { "name": { "type": "string" }, "message": { "type": "string" } } },
                "parent": { "$ref": "#/components/schemas/Relative" },
                "children": { "type": "array", "items": { "$ref": "#/components/schemas/Relative" } },
                "steps": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": { "type": "string" },
                            "type": { "type": "string", "enum": ["step", "sleep", "waitForEvent", "rollback", "invoke"] },
                            "start": time,
                            "end": nullable_time,
                        },
                    },
                },
            },
        },
        "Relative": {
            "type": "object",
            "description": "A parent or child instance (`step.invoke`): the child was started by the parent's step `step`#`count`",
            "properties": {
                "workflow": { "type": "string" },
                "id": { "type": "string" },
                "step": { "type": "string" },
                "count": { "type": "integer" },
                "status": { "allOf": [{ "$ref": "#/components/schemas/Status" }], "nullable": true, "description": "the child's status (null for a parent)" },
                "detached": { "type": "boolean", "description": "the child outlives its parent" },
            },
        },
        "StatusChange": {
            "type": "object",
            "additionalProperties": false,
            "required": ["status"],
            "properties": {
                "status": { "type": "string", "enum": ["pause", "resume", "terminate", "restart"] },
                "rollback": { "type": "boolean", "description": "terminate: run the rollback handlers first" },
                "from": {
                    "type": "object",
                    "description": "restart from this step",
                    "required": ["name"],
                    "properties": {
                        "name": { "type": "string" },
                        "count": { "type": "integer", "minimum": 1 },
                        "type": { "type": "string", "enum": ["step", "sleep", "waitForEvent", "invoke", "do", "run", "wait_for_event"] },
                    },
                },
            },
        },
        "StatusOnly": {
            "type": "object",
            "properties": { "status": { "$ref": "#/components/schemas/Status" } },
        },
    });
    // In a second literal: one would exceed the macro's recursion limit.
    let schedules = json!({
        "Schedule": {
            "type": "object",
            "properties": {
                "name": { "type": "string" },
                "workflow": { "type": "string" },
                "cron": { "type": "string" },
                "timeZone": { "type": "string" },
                "params": {},
                "overlap": { "type": "string", "enum": ["allow", "skip", "bufferOne"] },
                "catchUp": { "description": "\"skip\", \"runOnce\" or {\"runAll\": n}" },
                "source": { "type": "string", "enum": ["code", "api"] },
                "paused": { "type": "boolean" },
                "lastTick": { "type": "string", "format": "date-time", "nullable": true },
                "nextTick": { "type": "string", "format": "date-time", "nullable": true },
                "lastInstanceId": { "type": "string", "nullable": true, "description": "The instance the newest tick fired started (a tick the overlap policy passed over starts none)." },
            },
        },
        "NewSchedule": {
            "type": "object",
            "additionalProperties": false,
            "required": ["name", "cron", "workflow"],
            "properties": {
                "name": { "type": "string", "description": "1-68 characters of a-z, A-Z, 0-9, _ and -" },
                "cron": { "type": "string", "example": "*/15 * * * *", "description": "5 fields (minute hour day month weekday), or 6-7 with seconds first and a year last" },
                "workflow": { "type": "string" },
                "params": { "description": "each run's params (default {})" },
                "timeZone": { "type": "string", "example": "Europe/Berlin", "description": "IANA name (default UTC)" },
                "overlap": { "type": "string", "enum": ["allow", "skip", "bufferOne"] },
                "catchUp": { "description": "\"skip\", \"runOnce\", \"runAll:N\" or {\"runAll\": N}" },
            },
        },
    });
    if let (Value::Object(all), Value::Object(more)) = (&mut all, schedules) {
        all.extend(more);
    }
    all["WorkflowVersions"] = json!({
        "type": "object",
        "properties": {
            "workflow": { "type": "string" },
            "versions": { "type": "array", "items": version },
        },
    });
    all
}

pub(crate) fn document() -> Value {
    let mut paths = Map::new();
    for (method, path, summary) in ROUTES {
        let mut parameters: Vec<Value> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string" } }))
            .collect();
        let (query, body, (status, answer)) = operation(method, path);
        parameters.extend(query);
        let content = if answer.get("text/event-stream").is_some() {
            answer
        } else {
            json!({ "application/json": { "schema": answer } })
        };
        let mut op = json!({
            "summary": summary,
            "operationId": format!("{method}{}", path.replace(['/', '{', '}', '.'], "_")),
            "parameters": parameters,
            "responses": {
                status: { "description": "Success", "content": content },
                "default": {
                    "description": "An error: {code, message}",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } },
                },
            },
        });
        if let (Some(body), Some(map)) = (body, op.as_object_mut()) {
            map.insert("requestBody".into(), body);
        }
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        if let Some(map) = entry.as_object_mut() {
            map.insert(method.to_string(), op);
        }
    }
    json!({
        "openapi": "3.0.3",
        "info": { "title": "Cairn", "version": env!("CARGO_PKG_VERSION") },
        "paths": paths,
        "components": { "schemas": schemas() },
    })
}
