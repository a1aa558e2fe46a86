//! The live event stream: Server-Sent Events of an instance's lifecycle records. It first
//! replays the retained log after the cursor (`Last-Event-ID` or `?cursor=`), then follows
//! new records, and ends after the terminal record.

use std::convert::Infallible;
use std::time::Duration;

use axum::Extension;
use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use cairn::{Instance, LogKind, LogRecord};
use futures::Stream;
use tokio::sync::watch;

use crate::error::ApiError;

/// How often a stream that has read everything looks again when nothing woke it. The
/// engine's commits wake it at once; this catches writes by other processes.
const POLL: Duration = Duration::from_secs(1);

/// A workflow stream woken by a commit waits this long before it reads, so a burst of
/// commits (a busy workflow writes thousands a second) costs one read, not one per commit.
const WORKFLOW_COALESCE: Duration = Duration::from_millis(10);

/// What every open stream holds: its slot (see `Limits::max_streams`) and the server's
/// shutdown signal. Counted in the open-streams gauge while it lives.
pub(crate) struct Lease {
    _slot: Option<crate::serve::Slot>,
    closing: Option<watch::Receiver<bool>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        metrics::gauge!(crate::prometheus::STREAMS_OPEN).decrement(1);
    }
}

impl Lease {
    pub(crate) fn new(
        slot: Option<crate::serve::Slot>,
        closing: Option<watch::Receiver<bool>>,
    ) -> Self {
        metrics::gauge!(crate::prometheus::STREAMS_OPEN).increment(1);
        Lease {
            _slot: slot,
            closing,
        }
    }

    /// Whether the server is shutting down: the stream ends.
    fn closed(&self) -> bool {
        self.closing.as_ref().is_some_and(|c| *c.borrow())
    }
}

/// Waits for the engine's next commit, or [`POLL`] at most. `false` when the server began
/// to shut down meanwhile.
async fn next_commit(commits: &mut watch::Receiver<u64>, lease: &mut Lease) -> bool {
    let closing = async {
        match lease.closing.as_mut() {
            Some(c) => {
                let _ = c.wait_for(|closing| *closing).await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        changed = tokio::time::timeout(POLL, commits.changed()) => {
            if let Ok(Err(_)) = changed {
                // The engine is gone; `changed` would return at once forever.
                tokio::time::sleep(POLL).await;
            }
            true
        }
        () = closing => false,
    }
}

fn terminal(kind: LogKind) -> bool {
    matches!(
        kind,
        LogKind::WorkflowSuccess | LogKind::WorkflowFailure | LogKind::WorkflowTerminated
    )
}

fn event(record: &LogRecord) -> Event {
    Event::default()
        .id(record.id.to_string())
        .event(record.entry.kind.as_str())
        .data(serde_json::to_string(record).unwrap_or_default())
}

/// The stream of `instance`'s records with ids after `cursor`.
pub(crate) fn follow(
    instance: Instance,
    cursor: u64,
    commits: watch::Receiver<u64>,
    lease: Lease,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    struct State {
        instance: Instance,
        cursor: u64,
        commits: watch::Receiver<u64>,
        pending: std::collections::VecDeque<LogRecord>,
        done: bool,
        lease: Lease,
    }
    let start = State {
        instance,
        cursor,
        commits,
        pending: Default::default(),
        done: false,
        lease,
    };
    let stream = futures::stream::unfold(start, |mut st| async move {
        loop {
            if let Some(record) = st.pending.pop_front() {
                st.cursor = record.id;
                if terminal(record.entry.kind) {
                    st.done = true;
                    st.pending.clear();
                }
                return Some((Ok(event(&record)), st));
            }
            if st.done || st.lease.closed() {
                return None;
            }
            // Marked seen before the read, so a commit landing after it wakes the wait.
            st.commits.borrow_and_update();
            match st.instance.log(st.cursor).await {
                Ok(records) if !records.is_empty() => st.pending.extend(records),
                // Deleted, or the store failed: end the stream.
                Err(_) => return None,
                Ok(_) => {
                    if !next_commit(&mut st.commits, &mut st.lease).await {
                        return None;
                    }
                }
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// The stream of every record of `workflow`'s instances with ids after `cursor`. It does
/// not end by itself: instances come and go.
pub(crate) fn follow_workflow(
    workflow: cairn::UntypedWorkflow,
    cursor: u64,
    commits: watch::Receiver<u64>,
    lease: Lease,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    type Pending = std::collections::VecDeque<(cairn::InstanceId, LogRecord)>;
    let start = (workflow, cursor, commits, Pending::new(), lease);
    let stream = futures::stream::unfold(
        start,
        |(workflow, mut cursor, mut commits, mut pending, mut lease)| async move {
            loop {
                if let Some((id, record)) = pending.pop_front() {
                    cursor = record.id;
                    let mut value = serde_json::to_value(&record).unwrap_or_default();
                    if let Some(map) = value.as_object_mut() {
                        map.insert("instanceId".into(), serde_json::json!(id.as_str()));
                    }
                    let event = Event::default()
                        .id(record.id.to_string())
                        .event(record.entry.kind.as_str())
                        .data(value.to_string());
                    return Some((Ok(event), (workflow, cursor, commits, pending, lease)));
                }
                if lease.closed() {
                    return None;
                }
                commits.borrow_and_update();
                match workflow.log(cursor, 500).await {
                    Err(_) => return None,
                    Ok(page) if !page.records.is_empty() => pending.extend(page.records),
                    // Only other workflows' records were there: pass over them for good
                    // (the id of an event sent is always one of this workflow's records).
                    Ok(page) if page.scanned_to > cursor => cursor = page.scanned_to,
                    Ok(_) => {
                        if !next_commit(&mut commits, &mut lease).await {
                            return None;
                        }
                        tokio::time::sleep(WORKFLOW_COALESCE).await;
                    }
                }
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// A stream that says only "something changed": one `change` event (its id the newest
/// record's) whenever a record newer than `cursor` lands in any workflow, or this engine
/// commits a change without a record (a delete), at most one per [`CHANGE_COALESCE`]. What the dashboard's list of every workflow follows: one
/// connection rather than one per workflow (a browser opens at most six per server).
pub(crate) fn follow_changes(
    engine: cairn::Engine,
    cursor: u64,
    lease: Lease,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let commits: Vec<watch::Receiver<u64>> = engine
        .workflow_names()
        .iter()
        .filter_map(|w| engine.workflow_by_name(w.as_str()).ok())
        .map(|w| w.commits())
        .collect();
    // `nudged`: this engine committed something since the last look. A commit that adds
    // no record (a delete, a purge) does not move the head but changes the list too.
    let start = (engine, cursor, commits, lease, false);
    let stream = futures::stream::unfold(
        start,
        |(engine, mut cursor, mut commits, lease, mut nudged)| async move {
            loop {
                if lease.closed() {
                    return None;
                }
                for c in &mut commits {
                    c.borrow_and_update();
                }
                match engine.log_head().await {
                    Ok(head) if head > cursor || nudged => {
                        cursor = cursor.max(head);
                        let event = Event::default()
                            .id(head.to_string())
                            .event("change")
                            .data(head.to_string());
                        tokio::time::sleep(CHANGE_COALESCE).await;
                        return Some((Ok(event), (engine, cursor, commits, lease, false)));
                    }
                    Ok(_) => {}
                    Err(_) => return None,
                }
                // The next commit of this engine, or a look every POLL for other processes'.
                if commits.is_empty() {
                    tokio::time::sleep(POLL).await;
                } else {
                    let changed = futures::future::select_all(
                        commits.iter_mut().map(|c| Box::pin(c.changed())),
                    );
                    nudged = matches!(
                        tokio::time::timeout(POLL, changed).await,
                        Ok((Ok(()), _, _))
                    );
                }
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// The least time between two `change` events of [`follow_changes`].
const CHANGE_COALESCE: Duration = Duration::from_millis(250);

/// Extensions the server installs: the stream slots (router), the shutdown signal and the
/// peer's address (`serve`). A router used without `serve` has neither of the last two.
pub(crate) type StreamExtensions = (
    Option<Extension<crate::serve::StreamSlots>>,
    Option<Extension<crate::serve::Closing>>,
    Option<Extension<ConnectInfo<std::net::SocketAddr>>>,
);

/// A slot for one more wait: waits hold a connection and a task like a live stream, so
/// they share the streams' cap (`Limits::max_streams`); 503 `stream.too_many` past it.
pub(crate) fn wait_slot(
    slots: Option<Extension<crate::serve::StreamSlots>>,
    peer: Option<Extension<ConnectInfo<std::net::SocketAddr>>>,
) -> Result<Option<crate::serve::Slot>, ApiError> {
    match slots {
        Some(Extension(slots)) => slots
            .take(peer.map(|Extension(ConnectInfo(addr))| addr))
            .map(Some)
            .map_err(|why| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "stream.too_many", why)),
        None => Ok(None),
    }
}

/// A slot for one more live stream, or 503 `stream.too_many`.
pub(crate) fn lease((slots, closing, peer): StreamExtensions) -> Result<Lease, ApiError> {
    let slot = wait_slot(slots, peer)?;
    Ok(Lease::new(slot, closing.map(|Extension(c)| c.0)))
}
