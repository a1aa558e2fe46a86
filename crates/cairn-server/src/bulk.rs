//! Acting on many instances at once: `POST /api/instances/bulk` and the dashboard's bulk
//! actions. A selection is either the instances a filter matches (paged by a cursor, so a
//! large one is worked through in several requests, each bounded) or a list of instances.

use cairn::{Engine, InstanceStatus, ListOptions, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::ApiError;

/// The largest number of instances one request acts on.
pub(crate) const MAX_BULK: usize = 1_000;
/// How many instances one request acts on when it does not say.
pub(crate) const DEFAULT_BULK: usize = 100;

/// Which instances: the conditions of the dashboard's list and of `cairn instances list`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Filter {
    /// One workflow, or every workflow.
    pub(crate) workflow: Option<String>,
    /// Any of these statuses; any status when empty.
    #[serde(default, deserialize_with = "statuses")]
    pub(crate) status: Vec<InstanceStatus>,
    /// Created at or after.
    #[serde(default, with = "cairn::rfc3339::option")]
    pub(crate) created_from: Option<Timestamp>,
    /// Created before.
    #[serde(default, with = "cairn::rfc3339::option")]
    pub(crate) created_before: Option<Timestamp>,
    /// Id starts with.
    pub(crate) id_prefix: Option<String>,
}

fn statuses<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<InstanceStatus>, D::Error> {
    let names = Vec::<String>::deserialize(d)?;
    names
        .iter()
        .map(|n| n.parse().map_err(serde::de::Error::custom))
        .collect()
}

impl Filter {
    /// The listing options of this filter: a page of `limit` after `cursor`.
    pub(crate) fn options(&self, cursor: Option<String>, limit: usize) -> ListOptions {
        let mut options = ListOptions::default().limit(limit);
        for status in &self.status {
            options = options.status(*status);
        }
        options.created_from = self.created_from;
        options.created_before = self.created_before;
        options.id_prefix = self.id_prefix.clone().filter(|p| !p.is_empty());
        options.cursor = cursor;
        options
    }
}

/// What to do to each selected instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Action {
    Pause,
    Resume,
    Terminate,
    Restart,
    Delete,
}

impl Action {
    /// The action's name, as requests spell it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Terminate => "terminate",
            Action::Restart => "restart",
            Action::Delete => "delete",
        }
    }

    /// The action named `name`.
    pub(crate) fn parse(name: &str) -> Option<Action> {
        [
            Action::Pause,
            Action::Resume,
            Action::Terminate,
            Action::Restart,
            Action::Delete,
        ]
        .into_iter()
        .find(|a| a.as_str() == name)
    }
}

/// One instance, by workflow and id.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Target {
    pub(crate) workflow: String,
    pub(crate) id: String,
}

/// The body of `POST /api/instances/bulk`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Request {
    pub(crate) action: Action,
    /// Terminate with rollback.
    #[serde(default)]
    rollback: bool,
    filter: Option<Filter>,
    instances: Option<Vec<Target>>,
    cursor: Option<String>,
    limit: Option<usize>,
    /// Count what the filter matches; act on nothing.
    #[serde(default)]
    dry_run: bool,
}

/// What happened to one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) target: Target,
    pub(crate) result: Result<(), ApiError>,
}

impl Outcome {
    fn json(&self) -> Value {
        match &self.result {
            Ok(()) => json!({ "workflow": self.target.workflow, "id": self.target.id, "ok": true }),
            Err(e) => json!({
                "workflow": self.target.workflow,
                "id": self.target.id,
                "ok": false,
                "code": e.code,
                "message": e.message,
            }),
        }
    }
}

/// Does `action` to one instance, logged with the request's `origin` (see `audit`).
pub(crate) async fn act(
    engine: &Engine,
    action: Action,
    rollback: bool,
    target: &Target,
    origin: &str,
) -> Outcome {
    let result = async {
        let instance = engine
            .workflow_by_name(&target.workflow)?
            .get(&target.id)
            .await?;
        match action {
            Action::Pause => instance.pause().await,
            Action::Resume => instance.resume().await,
            Action::Terminate if rollback => instance.terminate_with_rollback().await,
            Action::Terminate => instance.terminate().await,
            Action::Restart => instance.restart().await,
            Action::Delete => instance.delete().await,
        }
    }
    .await
    .map_err(ApiError::from);
    crate::audit::control(
        origin,
        &format!(
            "bulk {}{}",
            action.as_str(),
            if rollback { " with rollback" } else { "" }
        ),
        &format!("{}/{}", target.workflow, target.id),
        &result,
    );
    Outcome {
        target: target.clone(),
        result,
    }
}

/// Does `action` to up to `limit` instances the filter matches after `cursor`, one after
/// another; returns what happened to each and the cursor of the rest (`None` when done).
pub(crate) async fn act_on_filter(
    engine: &Engine,
    action: Action,
    rollback: bool,
    filter: &Filter,
    cursor: Option<String>,
    limit: usize,
    origin: &str,
) -> Result<(Vec<Outcome>, Option<String>), ApiError> {
    let page = engine
        .list_instances(filter.workflow.as_deref(), &filter.options(cursor, limit))
        .await?;
    let mut outcomes = Vec::with_capacity(page.instances.len());
    for summary in &page.instances {
        let target = Target {
            workflow: summary.workflow.to_string(),
            id: summary.id.to_string(),
        };
        outcomes.push(act(engine, action, rollback, &target, origin).await);
    }
    Ok((outcomes, page.cursor))
}

/// The cursor that pins an action over `filter` to what matches now (it starts at the
/// newest instance matching, so one created later is not part of it; `None` when nothing
/// matches), and how many instances it goes through. The cursor is read first and the
/// count taken through it, so the two agree.
pub(crate) async fn pin(
    engine: &Engine,
    filter: &Filter,
) -> Result<(Option<String>, u64), ApiError> {
    let start = engine
        .list_instances(filter.workflow.as_deref(), &filter.options(None, 1))
        .await?
        .instances
        .first()
        .map(cairn::InstanceSummary::cursor_including);
    let matched = match &start {
        Some(start) => {
            engine
                .count_instances(
                    filter.workflow.as_deref(),
                    &filter.options(Some(start.clone()), 1),
                )
                .await?
        }
        None => 0,
    };
    Ok((start, matched))
}

/// `POST /api/instances/bulk`.
pub(crate) async fn handle(
    engine: &Engine,
    request: Request,
    origin: &str,
) -> Result<Value, ApiError> {
    if request.rollback && request.action != Action::Terminate {
        return Err(ApiError::bad_request(
            "'rollback' is only valid when terminating.",
        ));
    }
    let limit = match request.limit {
        None => DEFAULT_BULK,
        Some(n @ 1..=MAX_BULK) => n,
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "limit must be between 1 and {MAX_BULK}, not {n}"
            )));
        }
    };
    match (request.filter, request.instances) {
        (Some(filter), None) => {
            if request.dry_run {
                let (start, matched) = pin(engine, &filter).await?;
                return Ok(json!({ "matched": matched, "cursor": start }));
            }
            let (outcomes, cursor) = act_on_filter(
                engine,
                request.action,
                request.rollback,
                &filter,
                request.cursor,
                limit,
                origin,
            )
            .await?;
            Ok(json!({
                "results": outcomes.iter().map(Outcome::json).collect::<Vec<_>>(),
                "cursor": cursor,
            }))
        }
        (None, Some(targets)) => {
            if request.cursor.is_some() {
                return Err(ApiError::bad_request(
                    "'cursor' pages a filter; a list of instances has no pages.",
                ));
            }
            if targets.len() > limit.max(MAX_BULK) {
                return Err(ApiError::bad_request(format!(
                    "at most {MAX_BULK} instances per request, not {}",
                    targets.len()
                )));
            }
            if request.dry_run {
                return Ok(json!({ "matched": targets.len() }));
            }
            let mut outcomes: Vec<Outcome> = Vec::with_capacity(targets.len());
            for (i, target) in targets.iter().enumerate() {
                // An instance listed twice is acted on once, and reported at each place.
                let outcome = match targets[..i].iter().position(|t| t == target) {
                    Some(first) => outcomes[first].clone(),
                    None => act(engine, request.action, request.rollback, target, origin).await,
                };
                outcomes.push(outcome);
            }
            Ok(json!({
                "results": outcomes.iter().map(Outcome::json).collect::<Vec<_>>(),
                "cursor": null,
            }))
        }
        _ => Err(ApiError::bad_request(
            "give either 'filter' or 'instances', not both and not neither.",
        )),
    }
}
