//! The replay check as users call it: [`Engine::replay_check`] on a running engine, or
//! [`EngineBuilder::replay_check`] on a database no engine runs (a deploy gate).

use cairn_core::InstanceStatus;

use crate::client::ListOptions;
use crate::engine::check::{ReplayFindings, ReplayReport, check};
use crate::engine::{Engine, EngineBuilder};
use crate::error::Error;

/// The statuses of an instance that will replay again.
const UNFINISHED: [InstanceStatus; 5] = [
    InstanceStatus::Queued,
    InstanceStatus::Running,
    InstanceStatus::Waiting,
    InstanceStatus::Paused,
    InstanceStatus::WaitingForPause,
];

impl Engine {
    /// Replays every unfinished instance of the registered workflows against the code
    /// registered now, without running a step body and without writing, and reports where
    /// the code no longer fits an instance's journal: a journaled step the code no longer
    /// reaches (renamed, removed, moved), a stored output that no longer decodes as the
    /// step's type, a step whose kind changed (a `run` that is now a `sleep`), a rollback
    /// handler that disappeared from a step that declared one. Run it against the new code
    /// before the new code runs the instances (see [`EngineBuilder::replay_check`]).
    ///
    /// An await in workflow code that is not an op (a timer, a lock) is waited for at most
    /// briefly: code behind a long one counts as not reached.
    ///
    /// # Errors
    /// A store failure.
    pub async fn replay_check(&self) -> Result<ReplayReport, Error> {
        use futures::StreamExt as _;
        let mut report = ReplayReport::default();
        // Every workflow's: an unfinished instance of a workflow the code no longer has is
        // a problem too.
        let mut options = ListOptions::default().limit(500);
        for status in UNFINISHED {
            options = options.status(status);
        }
        loop {
            let page = self.list_instances(None, &options).await?;
            let checks = page.instances.iter().map(|summary| async move {
                let record = self
                    .inner
                    .env
                    .store
                    .instance(&summary.workflow, &summary.id)
                    .await?;
                match record {
                    Some(record) => check(&self.inner, &record)
                        .await
                        .map(|problems| Some((record, problems))),
                    None => Ok(None),
                }
            });
            let results: Vec<Result<_, cairn_store::Error>> = futures::stream::iter(checks)
                .buffer_unordered(CHECKS_AT_ONCE)
                .collect()
                .await;
            for result in results {
                let Some((record, problems)) = result? else {
                    continue;
                };
                report.checked += 1;
                if !problems.is_empty() {
                    report.incompatible.push(ReplayFindings {
                        workflow: record.workflow.to_string(),
                        id: record.id.to_string(),
                        problems,
                    });
                }
            }
            match page.cursor {
                Some(cursor) => options = options.cursor(cursor),
                None => break,
            }
        }
        report
            .incompatible
            .sort_by(|a, b| (&a.workflow, &a.id).cmp(&(&b.workflow, &b.id)));
        Ok(report)
    }
}

/// Instances replayed at once by a check.
const CHECKS_AT_ONCE: usize = 32;

impl EngineBuilder {
    /// Opens the store with the workflows registered here, runs [`Engine::replay_check`]
    /// and closes it again, without running any instance: the gate before a deploy
    /// (`cairn replay-check` does this for the demo workflows). On SQLite, no other engine
    /// may have the database open.
    ///
    /// # Errors
    /// The engine's configuration errors, or a store failure.
    pub async fn replay_check(self) -> Result<ReplayReport, Error> {
        let engine = self.check_only().build().await?;
        let report = engine.replay_check().await;
        engine.shutdown().await;
        report
    }
}
