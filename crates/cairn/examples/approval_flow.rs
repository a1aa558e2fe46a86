//! Waiting for a person: an expense workflow asks for approval and waits for an `approval`
//! event for at most a day. One request is approved; the other is never answered, times out,
//! and is escalated instead. While waiting, each instance hibernates.
//!
//! Run: `cargo run --example approval_flow` (virtual clock: the day passes at once).

use cairn::prelude::*;

/// An expense to approve.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Expense {
    /// Who spent.
    pub employee: String,
    /// How much, in cents.
    pub amount: u64,
}

/// The approver's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Approval {
    /// Who answered.
    pub approver: String,
    /// Yes or no.
    pub approved: bool,
}

/// Asks for approval and acts on the answer, or escalates after a day.
pub struct ExpenseApproval;

impl Workflow for ExpenseApproval {
    const NAME: &'static str = "expense-approval";
    type Params = Expense;
    type Output = String;

    async fn run(
        &self,
        event: WorkflowEvent<Expense>,
        step: WorkflowStep,
    ) -> Result<String, WorkflowError> {
        let expense = event.payload;
        step.run("notify approver", |_| {
            let who = expense.employee.clone();
            async move { Ok(format!("asked to approve {who}'s expense")) }
        })
        .await?;
        let answer = step
            .wait_for_event::<Approval>("wait for approval", "approval")
            .timeout("1 day")
            .await;
        match answer {
            Ok(approval) if approval.payload.approved => {
                step.run("reimburse", |_| {
                    let amount = expense.amount;
                    async move { Ok(format!("reimbursed {amount} cents")) }
                })
                .await?;
                Ok(format!("approved by {}", approval.payload.approver))
            }
            Ok(approval) => Ok(format!("rejected by {}", approval.payload.approver)),
            // The timeout is an error like any other: catch it and carry on.
            Err(e) if e.name() == "WorkflowTimeoutError" => {
                step.run("escalate to finance", |_| async { Ok(()) })
                    .await?;
                Ok(format!("escalated: {}", e.message()))
            }
            Err(e) => Err(e),
        }
    }
}

/// Runs the example; returns both outputs.
pub async fn demo(
    builder: cairn::EngineBuilder,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let engine = builder.register(ExpenseApproval).start().await?;
    let client = engine.workflow::<ExpenseApproval>();
    let answered = client
        .create(
            CreateOptions::new(Expense {
                employee: "ada".into(),
                amount: 4_200,
            })
            .id("expense-1"),
        )
        .await?;
    let ignored = client
        .create(
            CreateOptions::new(Expense {
                employee: "bob".into(),
                amount: 990,
            })
            .id("expense-2"),
        )
        .await?;
    for instance in [&answered, &ignored] {
        instance
            .wait_for(|s| s.status == InstanceStatus::Waiting)
            .await?;
    }
    println!(
        "both requests wait (hibernated, {} in memory)",
        engine.live_instances()
    );
    answered
        .send_event(
            "approval",
            &Approval {
                approver: "carol".into(),
                approved: true,
            },
        )
        .await?;
    let mut outputs = Vec::new();
    for instance in [&answered, &ignored] {
        let output = instance.wait().await?.output.unwrap_or_default();
        println!("{}: {output}", instance.id());
        outputs.push(output);
    }
    engine.shutdown().await;
    Ok(outputs)
}

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    demo(
        Engine::builder()
            .temporary()
            .clock(cairn::Clock::virtual_now()),
    )
    .await?;
    Ok(())
}
