//! What a stream step journals as its output, and what views show of it: kept apart from
//! the op (`ops/stream.rs`), which the attempt loop below it does not know.

use cairn_core::REDACTED;
use serde::{Deserialize, Serialize};

/// How many characters of a text stream its views show.
pub(crate) const PREVIEW_CHARS: usize = 1024;

/// A stream step's output as journaled: which attempt's chunks hold the bytes, how many,
/// and what the views show of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StreamMeta {
    pub(crate) attempt: u32,
    /// The lease epoch the attempt wrote under: a restart starts attempts at 1 again, and a
    /// reader of the old run's output must not get the new run's chunks.
    pub(crate) epoch: u64,
    pub(crate) chunks: u32,
    pub(crate) bytes: u64,
    /// The first 1,024 characters (and `[truncated output]` past them) of a stream that is
    /// UTF-8 text; `None` for binary.
    pub(crate) preview: Option<String>,
}

impl StreamMeta {
    /// What logs and views show: the text preview, or `[ReadableStream (binary): N bytes]`.
    pub(crate) fn view(&self) -> String {
        match &self.preview {
            Some(text) => text.clone(),
            None => format!("[ReadableStream (binary): {} bytes]", self.bytes),
        }
    }
}

/// What the views show of a stream step's stored output (`json`, its `StreamMeta`).
pub(crate) fn stream_view(json: &str, sensitive: bool) -> serde_json::Value {
    if sensitive {
        return serde_json::Value::from(REDACTED);
    }
    match serde_json::from_str::<StreamMeta>(json) {
        Ok(meta) => serde_json::Value::from(meta.view()),
        Err(_) => serde_json::Value::Null,
    }
}

/// The byte length of a stream step's output (`json`, its `StreamMeta`).
pub(crate) fn stream_bytes(json: &str) -> Option<u64> {
    serde_json::from_str::<StreamMeta>(json)
        .ok()
        .map(|m| m.bytes)
}

/// Whether a step's persisted config marks it as a stream step.
pub(crate) fn is_stream(config: &serde_json::Value) -> bool {
    config.get("stream").is_some()
}
