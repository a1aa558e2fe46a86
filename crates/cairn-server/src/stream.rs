//! The live event stream: Server-Sent Events of an instance's lifecycle records. It first
//! replays the retained log after the cursor (`Last-Event-ID` or `?cursor=`), then follows
//! new records, and ends after the terminal record.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use cairn::{Instance, LogKind, LogRecord};
use futures::Stream;

const POLL: Duration = Duration::from_millis(100);

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
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    struct State {
        instance: Instance,
        cursor: u64,
        pending: std::collections::VecDeque<LogRecord>,
        done: bool,
    }
    let start = State {
        instance,
        cursor,
        pending: Default::default(),
        done: false,
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
            if st.done {
                return None;
            }
            match st.instance.log(st.cursor).await {
                Ok(records) if !records.is_empty() => st.pending.extend(records),
                // Deleted, or the store failed: end the stream.
                Err(_) => return None,
                Ok(_) => tokio::time::sleep(POLL).await,
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
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    type Pending = std::collections::VecDeque<(cairn::InstanceId, LogRecord)>;
    let start = (workflow, cursor, Pending::new());
    let stream = futures::stream::unfold(start, |(workflow, mut cursor, mut pending)| async move {
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
                return Some((Ok(event), (workflow, cursor, pending)));
            }
            match workflow.log(cursor, 500).await {
                Ok(records) if !records.is_empty() => pending.extend(records),
                Err(_) => return None,
                Ok(_) => tokio::time::sleep(POLL).await,
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}
