//! Demo workflows `cairn serve` registers, each a scenario of the original documents.

use cairn::prelude::*;

/// Greets someone in two steps.
pub(crate) struct Greet;

impl Workflow for Greet {
    const NAME: &'static str = "greet";
    type Params = serde_json::Value;
    type Output = String;

    async fn run(
        &self,
        event: WorkflowEvent<serde_json::Value>,
        step: WorkflowStep,
    ) -> Result<String, WorkflowError> {
        let name = event.payload["name"].as_str().unwrap_or("world").to_owned();
        let greeting: String = step
            .run("compose greeting", |_| {
                let name = name.clone();
                async move { Ok(format!("Hello, {name}!")) }
            })
            .await?;
        step.run("deliver greeting", |_| {
            let g = greeting.clone();
            async move { Ok(g.len()) }
        })
        .await?;
        Ok(greeting)
    }
}

/// Waits (hibernated) for an `approved` event for up to a day.
pub(crate) struct Approval;

impl Workflow for Approval {
    const NAME: &'static str = "approval";
    type Params = serde_json::Value;
    type Output = serde_json::Value;

    async fn run(
        &self,
        event: WorkflowEvent<serde_json::Value>,
        step: WorkflowStep,
    ) -> Result<serde_json::Value, WorkflowError> {
        step.run("notify approver", |_| async { Ok(()) }).await?;
        let answer = step
            .wait_for_event::<serde_json::Value>("wait for approval", "approved")
            .timeout("1 day")
            .await?;
        Ok(serde_json::json!({ "request": event.payload, "approval": answer.payload }))
    }
}

/// Sleeps, then finishes: watch it go `waiting` and come back.
pub(crate) struct Nap;

impl Workflow for Nap {
    const NAME: &'static str = "nap";
    type Params = serde_json::Value;
    type Output = ();

    async fn run(
        &self,
        _: WorkflowEvent<serde_json::Value>,
        step: WorkflowStep,
    ) -> Result<(), WorkflowError> {
        step.sleep("nap", "30 seconds").await?;
        step.run("wake up", |_| async { Ok(()) }).await
    }
}

/// Builds a report, then signs it in a sensitive step (its output shows as `[REDACTED]`
/// and is never logged). The first attempt of the build takes `seconds` (default 5, at
/// most 60): stop the server meanwhile (Ctrl-C twice, or kill it) and watch the next start
/// recover the instance and retry the interrupted attempt.
pub(crate) struct Report;

impl Workflow for Report {
    const NAME: &'static str = "report";
    type Params = serde_json::Value;
    type Output = serde_json::Value;

    async fn run(
        &self,
        event: WorkflowEvent<serde_json::Value>,
        step: WorkflowStep,
    ) -> Result<serde_json::Value, WorkflowError> {
        let seconds = event.payload["seconds"].as_u64().unwrap_or(5).min(60);
        // An interrupted attempt is retried like a failed one: after a second here.
        let retries = StepConfig {
            retries: Some(Retries::constant(3, Duration::from_secs(1))),
            ..StepConfig::default()
        };
        let rows: u64 = step
            .run("build report", move |ctx| async move {
                if ctx.attempt == 1 {
                    tokio::time::sleep(Duration::from_secs(seconds)).await;
                }
                Ok(42)
            })
            .config(&retries)
            .await?;
        let key = event.payload["signing_key"]
            .as_str()
            .unwrap_or("demo")
            .to_owned();
        let sensitive = StepConfig {
            sensitive: true,
            ..StepConfig::default()
        };
        let signature: String = step
            .run("sign report", move |_| {
                let key = key.clone();
                async move { Ok(format!("signed-with-{key}-{rows}")) }
            })
            .config(&sensitive)
            .await?;
        Ok(serde_json::json!({ "rows": rows, "signed": !signature.is_empty() }))
    }
}

/// Reserves stock (undone by a rollback), then charges a card that times out on its first
/// `failures` attempts (default 2; retried after 1 s, then 2 s); `{"decline": true}` makes
/// the charge fail for good, and the reservation is rolled back. What the dashboard's
/// timeline shows: attempts, retry delays, the rollback phase.
pub(crate) struct Checkout;

impl Workflow for Checkout {
    const NAME: &'static str = "checkout";
    type Params = serde_json::Value;
    type Output = serde_json::Value;

    async fn run(
        &self,
        event: WorkflowEvent<serde_json::Value>,
        step: WorkflowStep,
    ) -> Result<serde_json::Value, WorkflowError> {
        let failures = event.payload["failures"].as_u64().unwrap_or(2).min(4);
        let decline = event.payload["decline"].as_bool().unwrap_or(false);
        let reservation: String = step
            .run("reserve stock", |ctx| async move {
                Ok(format!("rsv-{}", ctx.idempotency_key()))
            })
            .rollback(|_: Rollback<String>| async { Ok(()) })
            .await?;
        let retries = StepConfig {
            retries: Some(Retries::exponential(5, Duration::from_secs(1))),
            ..StepConfig::default()
        };
        let charge: String = step
            .run("charge card", move |ctx| async move {
                if decline {
                    return Err(NonRetryableError::new("card declined").into());
                }
                if u64::from(ctx.attempt) <= failures {
                    return Err(StepError::from("card network timed out"));
                }
                Ok(format!("ch-{}", ctx.attempt))
            })
            .config(&retries)
            .await?;
        Ok(serde_json::json!({ "reservation": reservation, "charge": charge }))
    }
}

/// A parent workflow: pays through `checkout`, run as a child workflow (`step.invoke`),
/// then ships. `cairn workflows trigger order '{"failures": 1}'`; the dashboard links the
/// order and its checkout.
pub(crate) struct Order;

impl Workflow for Order {
    const NAME: &'static str = "order";
    type Params = serde_json::Value;
    type Output = serde_json::Value;

    async fn run(
        &self,
        event: WorkflowEvent<serde_json::Value>,
        step: WorkflowStep,
    ) -> Result<serde_json::Value, WorkflowError> {
        let payment = step
            .invoke::<Checkout>("pay", event.payload.clone())
            .await?;
        let shipment: String = step
            .run("ship", |ctx| async move {
                Ok(format!("shp-{}", ctx.idempotency_key()))
            })
            .await?;
        Ok(serde_json::json!({ "payment": payment, "shipment": shipment }))
    }
}

/// A Rust workflow that runs any workflow as its child by name, a TypeScript one on a
/// worker included: `cairn workflows trigger relay '{"workflow": "hello", "params": {}}'`.
pub(crate) struct Relay;

impl Workflow for Relay {
    const NAME: &'static str = "relay";
    type Params = serde_json::Value;
    type Output = serde_json::Value;

    async fn run(
        &self,
        event: WorkflowEvent<serde_json::Value>,
        step: WorkflowStep,
    ) -> Result<serde_json::Value, WorkflowError> {
        let Some(workflow) = event.payload["workflow"].as_str() else {
            return Err(WorkflowError::new(
                "Error",
                "relay's params name the `workflow` to run",
            ));
        };
        let params = event.payload.get("params").cloned().unwrap_or_default();
        let output = step.invoke_by_name("relay", workflow, params).await?;
        Ok(serde_json::json!({ "workflow": workflow, "output": output }))
    }
}

/// The demo schedule: `greet` at the top of every hour (`cairn schedules list`).
fn greet_hourly() -> cairn::Schedule {
    cairn::Schedule::new::<Greet>(
        "greet-hourly",
        "0 * * * *",
        serde_json::json!({ "name": "cron" }),
    )
    .expect("a valid literal schedule")
}

pub(crate) fn register(builder: cairn::EngineBuilder, schedules: bool) -> cairn::EngineBuilder {
    let builder = builder
        .register(Greet)
        .register(Approval)
        .register(Nap)
        .register(Report)
        .register(Checkout)
        .register(Order)
        .register(Relay)
        // Two checkouts per customer at once: `cairn workflows trigger checkout --key ada`.
        .concurrency("checkout", cairn::Concurrency::limit(2));
    if schedules {
        builder.schedule(greet_hourly())
    } else {
        builder
    }
}
