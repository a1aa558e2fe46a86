//! What a wait's take of an event records, the same in every backend: the wait's output
//! (what the workflow receives) and its `WAIT_COMPLETE` meta; and the event read back from
//! that output, when a cancel puts it back (`Write::Cancel`).

use cairn_core::{EventType, Timestamp};
use serde_json::{Value, json};

use crate::{Error, Result, StoredEvent};

/// The output of a wait that took an event of `event_type` sent at `sent_at` with `payload`
/// (JSON text), as text, and the meta of its `WAIT_COMPLETE` record (byte sequences shown
/// as their size, as logs show them).
///
/// # Errors
/// `Corrupt` when the stored payload is not JSON.
pub fn wait_output(
    event_type: &EventType,
    payload: &str,
    sent_at: Timestamp,
) -> Result<(String, Value)> {
    let payload: Value = serde_json::from_str(payload).map_err(corrupt)?;
    let mut object = json!({
        "payload": payload,
        "timestamp": sent_at.as_millis(),
        "type": event_type.as_str(),
    });
    let output = object.to_string();
    cairn_core::binary::summarise(&mut object);
    Ok((output, object))
}

/// The event a wait's `output` (written by [`wait_output`]) holds, as it was buffered.
///
/// # Errors
/// `Corrupt` when the output is no such event.
pub fn taken_event(output: &str) -> Result<StoredEvent> {
    let taken: Value = serde_json::from_str(output).map_err(corrupt)?;
    let (Some(event_type), Some(at)) = (taken["type"].as_str(), taken["timestamp"].as_i64()) else {
        return Err(corrupt(format!("a wait's output is no event: {output}")));
    };
    Ok(StoredEvent {
        event_type: EventType::new(event_type).map_err(corrupt)?,
        payload: serde_json::to_string(&taken["payload"]).map_err(corrupt)?,
        at: Timestamp::from_millis(at),
    })
}

fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::Corrupt(what.to_string())
}
