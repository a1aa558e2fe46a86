//! A step's full output ([`Instance::step_output`]): what the details view cuts short.

use cairn_core::{REDACTED, StepKey, StepKind, StepState};
use serde::de::DeserializeOwned;

use std::sync::Arc;

use crate::client::instance::Instance;
use crate::error::Error;
use crate::ops::StepStream;
use crate::ops::stream_meta::StreamMeta;

/// Which step's output: its name, its occurrence (1 unless given), its kind (`step` unless
/// given) and, optionally, the attempt that must have produced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepSelector {
    /// The step name.
    pub name: String,
    /// Its occurrence among steps of that name and kind (1-based).
    pub count: u32,
    /// Its kind.
    pub kind: StepKind,
    /// The attempt whose output is asked for: the output is the successful attempt's, so
    /// another attempt has none.
    pub attempt: Option<u32>,
}

impl StepSelector {
    /// The first `run` step named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        StepSelector {
            name: name.into(),
            count: 1,
            kind: StepKind::Run,
            attempt: None,
        }
    }

    /// The `count`-th step of that name.
    #[must_use]
    pub fn count(mut self, count: u32) -> Self {
        self.count = count;
        self
    }

    /// A step of another kind (a wait's output is the event it received).
    #[must_use]
    pub fn kind(mut self, kind: StepKind) -> Self {
        self.kind = kind;
        self
    }

    /// Only the output of this attempt.
    #[must_use]
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = Some(attempt);
        self
    }
}

/// A step's full output.
#[derive(Debug)]
#[non_exhaustive]
pub enum StepOutput {
    /// Its JSON, exactly as stored.
    Json(String),
    /// The step is sensitive: its output is never shown.
    Redacted,
    /// A stream step's bytes, read from the store chunk by chunk.
    Stream(StepStream),
    /// The bytes of a step whose whole output is one byte sequence (a `Vec<u8>`,
    /// `bytes::Bytes`, `serde_bytes`).
    Bytes(Vec<u8>),
}

impl StepOutput {
    /// The output as JSON text (`"[REDACTED]"` for a sensitive step); `None` for a stream
    /// or bytes. Byte sequences nested in the JSON are `{"$bytes":"<base64>"}`.
    pub fn to_json(&self) -> Option<String> {
        match self {
            StepOutput::Json(json) => Some(json.clone()),
            StepOutput::Redacted => Some(serde_json::Value::from(REDACTED).to_string()),
            StepOutput::Stream(_) | StepOutput::Bytes(_) => None,
        }
    }
}

impl<O: DeserializeOwned> Instance<O> {
    /// The full output of one step, however large (the details view shows at most
    /// [`crate::DETAILS_OUTPUT_LIMIT`] bytes of it).
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`]; [`Error::NoStepOutput`] (`step.not_found`) when the
    /// step does not exist, has not succeeded, or succeeded at another attempt than the one
    /// asked for.
    pub async fn step_output(&self, step: &StepSelector) -> Result<StepOutput, Error> {
        let record = self.record().await?;
        let key = StepKey {
            kind: step.kind,
            name: step.name.clone(),
            count: step.count,
        };
        let journal = self.engine.inner.env.store.journal(record.instance).await?;
        let Some(found) = journal.into_iter().find(|s| s.key == key) else {
            return Err(Error::NoStepOutput(format!(
                "instance {:?} has no {} {:?}",
                self.id.as_str(),
                key.kind.as_str(),
                key.target()
            )));
        };
        if found.state != StepState::Succeeded {
            let state = match found.state {
                StepState::Running => "is still running",
                StepState::Failed => "failed",
                StepState::Cancelled => "was cancelled",
                StepState::Succeeded => "succeeded",
            };
            return Err(Error::NoStepOutput(format!(
                "step {} {state}: it has no output",
                key.target()
            )));
        }
        if let Some(attempt) = step.attempt
            && found.key.kind == StepKind::Run
            && attempt != found.attempts
        {
            return Err(Error::NoStepOutput(format!(
                "step {} succeeded at attempt {}: attempt {attempt} has no output",
                key.target(),
                found.attempts
            )));
        }
        if found.config.get("sensitive").is_some() {
            return Ok(StepOutput::Redacted);
        }
        let json = found.output.unwrap_or_else(|| "null".to_owned());
        if crate::ops::stream_meta::is_stream(&found.config) {
            let meta: StreamMeta = serde_json::from_str(&json).map_err(|e| {
                Error::Store(cairn_store::Error::Corrupt(format!(
                    "the stream output of step {} is unreadable: {e}",
                    key.target()
                )))
            })?;
            return Ok(StepOutput::Stream(StepStream::new(
                Arc::clone(&self.engine.inner.env.store),
                record.instance,
                key,
                &meta,
            )));
        }
        if let Some(bytes) = cairn_core::binary::whole_bytes(&json) {
            return Ok(StepOutput::Bytes(bytes));
        }
        Ok(StepOutput::Json(
            cairn_core::binary::external_text(&json).into_owned(),
        ))
    }

    /// The bytes this instance's stream steps hold in the store (against
    /// [`crate::EngineBuilder::stream_storage_limit`]).
    ///
    /// # Errors
    /// [`Error::InstanceNotFound`]; a store failure.
    pub async fn stream_storage(&self) -> Result<u64, Error> {
        let record = self.record().await?;
        Ok(self
            .engine
            .inner
            .env
            .store
            .stream_bytes(record.instance)
            .await?)
    }
}
