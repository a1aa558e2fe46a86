//! The worker protocol's messages (`docs/worker-protocol.md`, its JSON schema in
//! `docs/worker-protocol.schema.json`): what a worker sends, read strictly enough that a
//! bad frame is answered with a stable code and never reaches the engine, and what the
//! engine sends, written in one place.

use cairn_core::{ErrorInfo, Timestamp};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};

/// The protocol version this engine speaks.
pub(crate) const PROTOCOL: u64 = 1;

/// The most a frame may hold, either way.
pub const MAX_FRAME: usize = 2 * 1024 * 1024;

/// The most runs one worker may take at once.
pub(crate) const MAX_CONCURRENCY: usize = 10_000;

/// The longest version a worker may name.
pub(crate) const MAX_VERSION_LEN: usize = 100;

/// Why a frame was refused: the `code` and `message` of the `error` frame answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) code: &'static str,
    pub(crate) message: String,
    /// The run the frame named, if any.
    pub(crate) run: Option<String>,
}

impl Refusal {
    pub(crate) fn new(code: &'static str, message: impl Into<String>) -> Self {
        Refusal {
            code,
            message: message.into(),
            run: None,
        }
    }

    pub(crate) fn about(mut self, run: &str) -> Self {
        self.run = Some(run.to_owned());
        self
    }

    /// The `error` frame.
    pub(crate) fn frame(&self) -> String {
        let mut frame = json!({ "type": "error", "code": self.code, "message": self.message });
        if let Some(run) = &self.run {
            frame["run"] = Value::from(run.as_str());
        }
        frame.to_string()
    }
}

/// A worker's `hello`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Hello {
    #[serde(default)]
    pub(crate) worker: String,
    pub(crate) workflows: Vec<Offered>,
    pub(crate) concurrency: usize,
}

/// A workflow and version a worker runs.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Offered {
    pub(crate) name: String,
    pub(crate) version: String,
}

/// An error as a worker reports it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WorkerError {
    #[serde(default = "default_error_name")]
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) message: String,
    #[serde(default)]
    pub(crate) non_retryable: bool,
}

fn default_error_name() -> String {
    crate::failure::ERROR.to_owned()
}

impl WorkerError {
    pub(crate) fn info(&self) -> ErrorInfo {
        let name = if self.name.is_empty() {
            crate::failure::ERROR
        } else {
            &self.name
        };
        ErrorInfo::new(name, cairn_core::cap_message(&self.message))
    }
}

/// A value or an error: `ok` present (`null` too) or `error`.
pub(crate) type Outcome = Result<Value, WorkerError>;

/// `ok` read as present whatever it holds (`null` included), absent as `None`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default, deserialize_with = "present")]
    ok: Option<Value>,
    #[serde(default)]
    error: Option<WorkerError>,
}

impl Answer {
    fn outcome(self) -> Result<Outcome, String> {
        match (self.ok, self.error) {
            (Some(_), Some(_)) => Err("both `ok` and `error`".into()),
            (Some(ok), None) => Ok(Ok(ok)),
            (None, Some(error)) => Ok(Err(error)),
            (None, None) => Err("neither `ok` nor `error`".into()),
        }
    }
}

/// A durable call the workflow's code made.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Op {
    pub(crate) seq: u64,
    pub(crate) op: OpKind,
    pub(crate) name: String,
    /// `do`: the step's config (Cloudflare's `WorkflowStepConfig`).
    #[serde(default)]
    pub(crate) config: Option<Value>,
    /// `do`: the retry delay is a function the worker evaluates.
    #[serde(default)]
    pub(crate) delay_function: bool,
    /// `do`: the step has a rollback handler, with its config.
    #[serde(default)]
    pub(crate) rollback: Option<RollbackSpec>,
    /// `sleep`: how long.
    #[serde(default)]
    pub(crate) duration: Option<cairn_core::DurationSpec>,
    /// `sleepUntil`: when.
    #[serde(default, deserialize_with = "until")]
    pub(crate) until: Option<Timestamp>,
    /// `waitForEvent`: the type and the timeout.
    #[serde(default)]
    pub(crate) event_type: Option<String>,
    #[serde(default)]
    pub(crate) timeout: Option<cairn_core::DurationSpec>,
    /// `invoke`: the child's workflow, params and whether it outlives this instance.
    #[serde(default)]
    pub(crate) workflow: Option<String>,
    #[serde(default)]
    pub(crate) params: Value,
    #[serde(default)]
    pub(crate) detached: bool,
}

/// RFC 3339 or epoch milliseconds; a number past what an i64 holds (JavaScript's numbers
/// reach 1.8e308) is taken at the end of the range, where the op refuses it as too far away,
/// instead of refusing the frame: a frame refused leaves its run waiting for that op.
fn until<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
    match Value::deserialize(d)? {
        Value::Number(n) if n.as_i64().is_none() => {
            // Saturating: `as` takes a float to the nearest end of the i64 range.
            #[allow(clippy::cast_possible_truncation)]
            let ms = n.as_f64().unwrap_or(f64::MAX) as i64;
            Ok(Some(Timestamp::from_millis(ms)))
        }
        other => cairn_core::rfc3339::deserialize(other)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

/// The kinds of op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum OpKind {
    Do,
    Sleep,
    SleepUntil,
    WaitForEvent,
    Invoke,
}

/// A step's rollback handler, declared with the step.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RollbackSpec {
    #[serde(default)]
    pub(crate) config: Option<Value>,
}

/// What a worker sends once its session has started.
#[derive(Debug)]
pub(crate) enum Incoming {
    Op {
        run: String,
        op: Box<Op>,
    },
    Idle {
        run: String,
        ops: u64,
        /// The op results the worker had received (absent from workers before it was
        /// added).
        answers: Option<u64>,
    },
    RunResult {
        run: String,
        outcome: Outcome,
    },
    /// An answer to a task (`attempt`, `delay`, `rollback`).
    TaskResult {
        run: String,
        task: String,
        kind: TaskKind,
        outcome: Outcome,
    },
}

/// What a task asks of the worker; its answer must be of the same kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskKind {
    Attempt,
    Delay,
    Rollback,
}

impl TaskKind {
    /// The type of the frame that answers a task of this kind.
    pub(crate) fn answer_type(self) -> &'static str {
        match self {
            TaskKind::Attempt => "attemptResult",
            TaskKind::Delay => "delayResult",
            TaskKind::Rollback => "rollbackResult",
        }
    }
}

impl Incoming {
    /// Reads a frame.
    pub(crate) fn parse(frame: &str) -> Result<Incoming, Refusal> {
        if frame.len() > MAX_FRAME {
            return Err(Refusal::new(
                "protocol.too_large",
                format!("a frame holds at most {MAX_FRAME} bytes"),
            ));
        }
        let value: Value = serde_json::from_str(frame)
            .map_err(|e| Refusal::new("protocol.malformed", format!("not JSON: {e}")))?;
        let Value::Object(mut map) = value else {
            return Err(Refusal::new(
                "protocol.malformed",
                "a frame is a JSON object",
            ));
        };
        let kind = match map.get("type") {
            Some(Value::String(kind)) => kind.clone(),
            _ => {
                return Err(Refusal::new(
                    "protocol.malformed",
                    "a frame names its `type`",
                ));
            }
        };
        let run = match map.remove("run") {
            Some(Value::String(run)) => run,
            _ if matches!(
                kind.as_str(),
                "op" | "idle" | "runResult" | "attemptResult" | "delayResult" | "rollbackResult"
            ) =>
            {
                return Err(Refusal::new(
                    "protocol.malformed",
                    format!("a `{kind}` frame names its `run`"),
                ));
            }
            _ => String::new(),
        };
        let bad = |e: serde_json::Error| {
            Refusal::new("protocol.malformed", format!("a bad `{kind}` frame: {e}")).about(&run)
        };
        let value = Value::Object(map);
        match kind.as_str() {
            "op" => {
                let op: Op = serde_json::from_value(value).map_err(bad)?;
                Ok(Incoming::Op {
                    run,
                    op: Box::new(op),
                })
            }
            "idle" => {
                #[derive(Deserialize)]
                struct Idle {
                    ops: u64,
                    #[serde(default)]
                    answers: Option<u64>,
                }
                let idle: Idle = serde_json::from_value(value).map_err(bad)?;
                Ok(Incoming::Idle {
                    run,
                    ops: idle.ops,
                    answers: idle.answers,
                })
            }
            "runResult" => {
                let answer: Answer = serde_json::from_value(value).map_err(bad)?;
                let outcome = answer.outcome().map_err(|e| {
                    Refusal::new("protocol.malformed", format!("a `runResult` with {e}"))
                        .about(&run)
                })?;
                Ok(Incoming::RunResult { run, outcome })
            }
            "attemptResult" | "delayResult" | "rollbackResult" => {
                #[derive(Deserialize)]
                struct Task {
                    task: String,
                }
                let task: Task = serde_json::from_value(value.clone()).map_err(bad)?;
                let answer: Answer = serde_json::from_value(value).map_err(bad)?;
                let outcome = answer.outcome().map_err(|e| {
                    Refusal::new("protocol.malformed", format!("a `{kind}` with {e}")).about(&run)
                })?;
                let kind = match kind.as_str() {
                    "attemptResult" => TaskKind::Attempt,
                    "delayResult" => TaskKind::Delay,
                    _ => TaskKind::Rollback,
                };
                Ok(Incoming::TaskResult {
                    run,
                    task: task.task,
                    kind,
                    outcome,
                })
            }
            "hello" => Err(Refusal::new(
                "protocol.malformed",
                "`hello` comes once, first",
            )),
            other => Err(Refusal::new(
                "protocol.unknown_type",
                format!("unknown message type {other:?}"),
            )),
        }
    }
}

/// Reads a worker's first frame.
pub(crate) fn parse_hello(frame: &str) -> Result<Hello, Refusal> {
    if frame.len() > MAX_FRAME {
        return Err(Refusal::new(
            "protocol.too_large",
            format!("a frame holds at most {MAX_FRAME} bytes"),
        ));
    }
    let value: Value = serde_json::from_str(frame)
        .map_err(|e| Refusal::new("protocol.malformed", format!("not JSON: {e}")))?;
    if value.get("type").and_then(Value::as_str) != Some("hello") {
        return Err(Refusal::new(
            "protocol.malformed",
            "the first frame is a `hello`",
        ));
    }
    match value.get("protocol").and_then(Value::as_u64) {
        Some(PROTOCOL) => {}
        Some(p) => {
            return Err(Refusal::new(
                "protocol.version",
                format!("this server speaks protocol {PROTOCOL}, the worker {p}"),
            ));
        }
        None => {
            return Err(Refusal::new(
                "protocol.malformed",
                "a `hello` names the `protocol` it speaks",
            ));
        }
    }
    let hello: Hello = serde_json::from_value(value)
        .map_err(|e| Refusal::new("protocol.malformed", format!("a bad `hello`: {e}")))?;
    if hello.concurrency == 0 || hello.concurrency > MAX_CONCURRENCY {
        return Err(Refusal::new(
            "protocol.malformed",
            format!("`concurrency` is 1 to {MAX_CONCURRENCY}"),
        ));
    }
    if hello.workflows.is_empty() {
        return Err(Refusal::new(
            "protocol.workflow",
            "a worker runs at least one workflow",
        ));
    }
    Ok(hello)
}

/// The `welcome` frame.
pub(crate) fn welcome(session: &str) -> String {
    json!({ "type": "welcome", "protocol": PROTOCOL, "session": session }).to_string()
}

/// The `start` frame of a run.
pub(crate) fn start(
    run: &str,
    workflow: &str,
    version: &str,
    id: &str,
    params: &Value,
    created_at: Timestamp,
    check: bool,
) -> String {
    let mut frame = json!({
        "type": "start",
        "run": run,
        "workflow": workflow,
        "version": version,
        "instance": { "id": id, "params": params, "timestamp": created_at.to_rfc3339() },
    });
    if check {
        frame["check"] = Value::Bool(true);
    }
    frame.to_string()
}

/// An error as the worker throws it: `{name, message}`.
#[derive(Serialize)]
struct ErrorOut<'a> {
    name: &'a str,
    message: &'a str,
}

fn outcome_fields(frame: &mut Value, outcome: Result<&Value, &ErrorInfo>) {
    match outcome {
        Ok(value) => frame["ok"] = value.clone(),
        Err(e) => {
            frame["error"] = json!(ErrorOut {
                name: &e.name,
                message: &e.message,
            });
        }
    }
}

/// The `opResult` frame.
pub(crate) fn op_result(run: &str, seq: u64, outcome: Result<&Value, &ErrorInfo>) -> String {
    let mut frame = json!({ "type": "opResult", "run": run, "seq": seq });
    outcome_fields(&mut frame, outcome);
    frame.to_string()
}

/// The `attempt` frame: run op `seq`'s callback with this context.
pub(crate) fn attempt(
    run: &str,
    task: &str,
    seq: u64,
    ctx: &crate::context::StepContext,
) -> String {
    json!({
        "type": "attempt", "run": run, "task": task, "seq": seq, "attempt": ctx.attempt,
        "step": { "name": ctx.step.name, "count": ctx.step.count },
        "config": config_view(&ctx.config),
    })
    .to_string()
}

/// A resolved config as Cloudflare's step context shows it (a delay function omitted).
fn config_view(config: &cairn_core::ResolvedConfig) -> Value {
    config.to_context_json()
}

/// The `delay` frame: evaluate op `seq`'s delay function after failed attempt `attempt`.
pub(crate) fn delay(
    run: &str,
    task: &str,
    seq: u64,
    ctx: &crate::context::StepContext,
    error: &ErrorInfo,
) -> String {
    json!({
        "type": "delay", "run": run, "task": task, "seq": seq, "attempt": ctx.attempt,
        "step": { "name": ctx.step.name, "count": ctx.step.count },
        "error": ErrorOut { name: &error.name, message: &error.message },
    })
    .to_string()
}

/// The `rollback` frame: run op `seq`'s rollback handler.
pub(crate) fn rollback(
    run: &str,
    task: &str,
    seq: u64,
    ctx: &crate::context::StepContext,
    output: Option<&Value>,
    error: &ErrorInfo,
) -> String {
    let mut frame = json!({
        "type": "rollback", "run": run, "task": task, "seq": seq, "attempt": ctx.attempt,
        "step": { "name": ctx.step.name, "count": ctx.step.count },
        "error": ErrorOut { name: &error.name, message: &error.message },
    });
    if let Some(output) = output {
        frame["output"] = output.clone();
    }
    frame.to_string()
}

/// The `cancel` frame: a task's answer is no longer wanted.
pub(crate) fn cancel(run: &str, task: &str) -> String {
    json!({ "type": "cancel", "run": run, "task": task }).to_string()
}

/// Why a run stopped (the `stop` frame's `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    Done,
    Hibernated,
    Paused,
    Stopped,
    Lost,
}

/// The `stop` frame.
pub(crate) fn stop(run: &str, reason: StopReason) -> String {
    let reason = match reason {
        StopReason::Done => "done",
        StopReason::Hibernated => "hibernated",
        StopReason::Paused => "paused",
        StopReason::Stopped => "stopped",
        StopReason::Lost => "lost",
    };
    json!({ "type": "stop", "run": run, "reason": reason }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ok_null_is_an_answer_and_absent_is_not() {
        let r = Incoming::parse(r#"{"type":"attemptResult","run":"r1","task":"t1","ok":null}"#);
        assert!(matches!(
            r,
            Ok(Incoming::TaskResult {
                outcome: Ok(Value::Null),
                ..
            })
        ));
        let r = Incoming::parse(r#"{"type":"attemptResult","run":"r1","task":"t1"}"#);
        assert_eq!(r.unwrap_err().code, "protocol.malformed");
        let r = Incoming::parse(
            r#"{"type":"runResult","run":"r1","ok":1,"error":{"name":"E","message":"m"}}"#,
        );
        assert_eq!(r.unwrap_err().code, "protocol.malformed");
    }

    #[test]
    fn bad_frames_get_stable_codes() {
        assert_eq!(
            Incoming::parse("nope").unwrap_err().code,
            "protocol.malformed"
        );
        assert_eq!(
            Incoming::parse("[1]").unwrap_err().code,
            "protocol.malformed"
        );
        assert_eq!(
            Incoming::parse(r#"{"type":"dance","run":"r"}"#)
                .unwrap_err()
                .code,
            "protocol.unknown_type"
        );
        assert_eq!(
            Incoming::parse(r#"{"type":"op","seq":0,"op":"do","name":"x"}"#)
                .unwrap_err()
                .code,
            "protocol.malformed"
        );
        assert_eq!(
            Incoming::parse(r#"{"type":"op","run":"r","seq":0,"op":"fly","name":"x"}"#)
                .unwrap_err()
                .code,
            "protocol.malformed"
        );
        let big = format!(
            r#"{{"type":"idle","run":"r","ops":0,"pad":"{}"}}"#,
            "x".repeat(MAX_FRAME)
        );
        assert_eq!(
            Incoming::parse(&big).unwrap_err().code,
            "protocol.too_large"
        );
        assert_eq!(
            parse_hello(r#"{"type":"hello","protocol":2,"workflows":[],"concurrency":1}"#)
                .unwrap_err()
                .code,
            "protocol.version"
        );
        assert_eq!(
            parse_hello(r#"{"type":"hello","protocol":1,"workflows":[{"name":"a","version":"1"}],"concurrency":0}"#)
                .unwrap_err()
                .code,
            "protocol.malformed"
        );
    }

    #[test]
    fn an_op_reads_every_kind_and_ignores_unknown_fields() {
        let r = Incoming::parse(
            r#"{"type":"op","run":"r","seq":2,"op":"sleepUntil","name":"s","until":"2026-12-01T10:00:00Z","later":1}"#,
        )
        .unwrap();
        let Incoming::Op { op, .. } = r else {
            panic!("an op")
        };
        assert_eq!(op.op, OpKind::SleepUntil);
        assert_eq!(op.until, Some(Timestamp::from_millis(1_796_119_200_000)));
    }
}
