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
        "post",
        "/api/workflows/{name}/instances",
        "Create an instance {instance_id?, params?}",
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
        "/api/workflows/{name}/instances/{id}/stream",
        "Server-Sent Events: the event log, then live records (Last-Event-ID or cursor)",
    ),
    (
        "get",
        "/api/workflows/{name}/stream",
        "Server-Sent Events of every instance of the workflow (Last-Event-ID or cursor); does not end",
    ),
];

pub(crate) fn document() -> Value {
    let mut paths = Map::new();
    for (method, path, summary) in ROUTES {
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        if let Some(map) = entry.as_object_mut() {
            map.insert(
                method.to_string(),
                json!({
                    "summary": summary,
                    "responses": {
                        "default": {
                            "description": "JSON; errors are {code, message}",
                        }
                    }
                }),
            );
        }
    }
    json!({
        "openapi": "3.0.3",
        "info": { "title": "Cairn", "version": env!("CARGO_PKG_VERSION") },
        "paths": paths,
    })
}
