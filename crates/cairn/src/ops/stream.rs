//! `step.run_stream`: a step whose output is a byte stream, persisted in chunks of 256 KiB
//! as the body produces it and read back from the store, never held whole in memory.
//!
//! The chunks are attempt-scoped: an attempt writes its own (`Write::Chunk`, each under the
//! lease), and its success names it in the step's output (`StreamMeta`), in the same commit
//! that drops every other attempt's chunks. A failed, timed-out or interrupted attempt's
//! chunks are dropped with its failure (`ops/attempt.rs`); a crash mid-write is cleaned up
//! when the next lifetime records the attempt as interrupted.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use cairn_core::{StepKey, StepKind};
use cairn_store::{InstanceRef, Store};
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};

use crate::config::{Retries, StepConfig};
use crate::context::StepContext;
use crate::failure::{BoxError, INTERNAL, NonRetryableError, StepError, WorkflowError};
use crate::lifetime::Lifetime;
use crate::ops::WorkflowStep;
use crate::ops::attempt::Execution;
use crate::ops::run::RunOp;
use crate::ops::stream_meta::StreamMeta;

/// The size of a stored chunk: a stream's bytes are re-cut into chunks of this size.
pub const STREAM_CHUNK: usize = 256 * 1024;
/// The largest item a stream body may yield: a larger one fails the step for good.
pub const MAX_STREAM_ITEM: usize = 16 * 1024 * 1024;
/// The default storage limit of one instance's stream outputs: 1 GiB.
pub const DEFAULT_STREAM_STORAGE: u64 = 1 << 30;

impl WorkflowStep {
    /// Runs `body` as a durable step whose output is a byte stream: the stream it returns
    /// is read, persisted in chunks of 256 KiB (never held whole in memory) and handed back
    /// as a [`StepStream`] that reads the stored bytes — on this run and on every replay,
    /// never the body's own stream. Retries and timeouts cover reading the whole stream;
    /// a failed, timed-out or crashed attempt leaves no chunks behind.
    ///
    /// Exempt from the 1 MiB output limit; an instance's streams together may hold up to
    /// [`crate::EngineBuilder::stream_storage_limit`] (1 GiB by default). An item larger
    /// than 16 MiB, or a stream over the storage limit, fails the step for good.
    ///
    /// ```no_run
    /// # use cairn::prelude::*;
    /// # async fn w(step: WorkflowStep) -> Result<(), WorkflowError> {
    /// let export = step
    ///     .run_stream("export rows", |_| async {
    ///         let rows = (0..1_000).map(|i| Ok::<_, std::io::Error>(format!("{i},row\n")));
    ///         Ok(futures::stream::iter(rows))
    ///     })
    ///     .await?;
    /// println!("{} bytes", export.len());
    /// # Ok(()) }
    /// ```
    ///
    /// Items are bytes by type (SPEC S4: a non-binary chunk is a compile error, not a
    /// runtime one), and the body hands its stream over by value, so no one else can be
    /// reading it (S3: a locked stream cannot exist in Rust):
    ///
    /// ```compile_fail,E0277
    /// # use cairn::prelude::*;
    /// # async fn w(step: WorkflowStep) -> Result<(), WorkflowError> {
    /// let numbers = step
    ///     .run_stream("numbers", |_| async {
    ///         Ok(futures::stream::iter((0..10u32).map(Ok::<_, std::io::Error>)))
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn run_stream<'a, F, Fut, S, B, E>(&self, name: impl Into<String>, body: F) -> StreamOp<'a>
    where
        F: FnMut(StepContext) -> Fut + Send + 'a,
        Fut: Future<Output = Result<S, StepError>> + Send + 'a,
        S: Stream<Item = Result<B, E>> + Send + 'a,
        B: AsRef<[u8]> + Send + 'a,
        E: Into<BoxError> + Send + 'a,
    {
        let state = Arc::clone(&self.lifetime);
        let key = self.lifetime.claim(StepKind::Run, name.into());
        let reader = Arc::clone(&state);
        let found = key.clone();
        let mut body = body;
        let start = move |config: StepConfig,
                          _rollback|
              -> BoxFuture<'a, Result<StreamMeta, WorkflowError>> {
            let key = match found {
                Ok(key) => key,
                Err(e) => return Box::pin(async move { Err(e) }),
            };
            let mut run = Execution::new(Arc::clone(&state), config);
            run.stream = true;
            let writer = Arc::clone(&state);
            let step_key = key.clone();
            Box::pin(async move {
                run.execute(key, move |ctx: StepContext| {
                    let (attempt, sensitive) = (ctx.attempt, ctx.config.sensitive);
                    let (state, key) = (Arc::clone(&writer), step_key.clone());
                    // A test's mocked bytes stand in for the body (`cairn::testing`).
                    let mocked = mocked_bytes(&state, &key, attempt);
                    let produced = mocked.is_none().then(|| body(ctx));
                    async move {
                        match (mocked, produced) {
                            (Some(bytes), _) => {
                                let once = futures::stream::iter([Ok::<_, BoxError>(bytes?)]);
                                persist(&state, &key, attempt, sensitive, once).await
                            }
                            (None, Some(produced)) => {
                                let stream = produced.await?;
                                persist(&state, &key, attempt, sensitive, stream).await
                            }
                            (None, None) => Err(StepError::from("the stream step has no body")),
                        }
                    }
                })
                .await
            })
        };
        StreamOp {
            run: RunOp::from_start(Box::new(start)),
            read: Some((reader, key.ok())),
        }
    }
}

/// The bytes a test mocked as the stream of attempt `attempt` of `key`: a JSON string (its
/// UTF-8 bytes) or an array of bytes; anything else is a final error.
fn mocked_bytes(
    state: &Lifetime,
    key: &StepKey,
    attempt: u32,
) -> Option<Result<Vec<u8>, StepError>> {
    let forced = state
        .env
        .hooks
        .as_ref()?
        .attempt(state.who(), key, attempt)?;
    let crate::hooks::Forced::Result(json) = forced else {
        return None;
    };
    Some(match serde_json::from_str::<serde_json::Value>(&json) {
        Ok(serde_json::Value::String(text)) => Ok(text.into_bytes()),
        Ok(value) => cairn_core::binary::from_value::<Vec<u8>>(&value).map_err(|_| {
            NonRetryableError::new(format!(
                "the mocked result of stream step {} is not a string or an array of bytes",
                key.target()
            ))
            .into()
        }),
        Err(e) => Err(StepError::from(e.to_string())),
    })
}

/// Reads `stream` into chunk commits of attempt `attempt` of `key`; its meta once it ends.
async fn persist<S, B, E>(
    state: &Lifetime,
    key: &StepKey,
    attempt: u32,
    sensitive: bool,
    stream: S,
) -> Result<StreamMeta, StepError>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
    E: Into<BoxError>,
{
    let limit = state.env.limits.stream_storage;
    let mut stream = std::pin::pin!(stream);
    let mut buffer: Vec<u8> = Vec::with_capacity(STREAM_CHUNK);
    let mut index = 0u32;
    let mut total = 0u64;
    // A sensitive stream keeps no preview: its views are redacted.
    let mut preview = Preview {
        binary: sensitive,
        ..Preview::default()
    };
    while let Some(item) = stream.next().await {
        let item = item.map_err(|e| StepError::from(e.into()))?;
        let mut rest = item.as_ref();
        if rest.len() > MAX_STREAM_ITEM {
            return Err(NonRetryableError::new(format!(
                "step {} yielded a stream item of {} bytes; the largest allowed is {MAX_STREAM_ITEM} bytes (16 MiB)",
                key.target(),
                rest.len()
            ))
            .into());
        }
        total += rest.len() as u64;
        // Counted when taken in, not when its chunk is written: bytes still in a buffer
        // (this stream's or a parallel one's) count against the limit already.
        let used = state.stream_storage_used().await;
        if used.saturating_add(rest.len() as u64) > limit {
            return Err(NonRetryableError::new(format!(
                "step {} went over the instance's stream storage limit of {limit} bytes ({used} bytes already stored or taken in)",
                key.target()
            ))
            .into());
        }
        state.stream_taken(key, rest.len() as u64);
        preview.feed(rest);
        while !rest.is_empty() {
            let take = (STREAM_CHUNK - buffer.len()).min(rest.len());
            buffer.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if buffer.len() == STREAM_CHUNK {
                let full = std::mem::replace(&mut buffer, Vec::with_capacity(STREAM_CHUNK));
                write_chunk(state, key, attempt, index, full).await;
                index += 1;
            }
        }
    }
    if !buffer.is_empty() {
        write_chunk(state, key, attempt, index, buffer).await;
        index += 1;
    }
    Ok(StreamMeta {
        attempt,
        epoch: state.lease.epoch,
        chunks: index,
        bytes: total,
        preview: preview.finish(),
    })
}

async fn write_chunk(state: &Lifetime, key: &StepKey, attempt: u32, index: u32, data: Vec<u8>) {
    state
        .commit(vec![cairn_store::Write::Chunk {
            step: key.clone(),
            attempt,
            epoch: state.lease.epoch,
            index,
            data,
        }])
        .await;
}

/// The first characters of a stream that is UTF-8 throughout, checked as it passes.
#[derive(Default)]
struct Preview {
    text: String,
    /// Characters in `text`.
    chars: usize,
    /// More text followed the preview.
    more: bool,
    /// The bytes of a character split across items.
    carry: Vec<u8>,
    binary: bool,
}

impl Preview {
    fn feed(&mut self, bytes: &[u8]) {
        if self.binary {
            return;
        }
        let mut bytes = bytes;
        if !self.carry.is_empty() {
            // Complete the character cut at the end of the last item (at most 3 more bytes),
            // then go on with the rest of this one where it is.
            let need = utf8_len(self.carry[0]).saturating_sub(self.carry.len());
            let take = need.min(bytes.len());
            let mut joined = std::mem::take(&mut self.carry);
            joined.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            self.check(&joined);
            if self.binary || !self.carry.is_empty() {
                return;
            }
        }
        self.check(bytes);
    }

    fn check(&mut self, data: &[u8]) {
        let valid = match std::str::from_utf8(data) {
            Ok(s) => s,
            Err(e) if e.error_len().is_none() => {
                // Cut inside a character: its first bytes wait for the next item.
                self.carry = data[e.valid_up_to()..].to_vec();
                std::str::from_utf8(&data[..e.valid_up_to()]).unwrap_or_default()
            }
            Err(_) => {
                self.binary = true;
                return;
            }
        };
        if self.more {
            return;
        }
        for c in valid.chars() {
            if self.chars == crate::ops::stream_meta::PREVIEW_CHARS {
                self.more = true;
                break;
            }
            self.text.push(c);
            self.chars += 1;
        }
    }

    fn finish(self) -> Option<String> {
        if self.binary || !self.carry.is_empty() {
            return None;
        }
        Some(if self.more {
            format!("{}[truncated output]", self.text)
        } else {
            self.text
        })
    }
}

/// The length of the UTF-8 sequence `first` starts (1 for a byte that starts none: the
/// check then finds it invalid).
fn utf8_len(first: u8) -> usize {
    match first {
        0xf0..=0xf7 => 4,
        0xe0..=0xef => 3,
        0xc0..=0xdf => 2,
        _ => 1,
    }
}

/// A `step.run_stream` op; resolves to the [`StepStream`] of the stored bytes.
///
/// # Cancel safety
/// As [`RunOp`]: dropping it loses nothing durable. Dropped by a crash, the attempt is
/// recorded as interrupted on the next replay, its chunks dropped, and retried; dropped by
/// the workflow (it lost a `select!`), the step is recorded as cancelled with its chunks.
#[must_use = "a step does nothing unless awaited"]
pub struct StreamOp<'a> {
    run: RunOp<'a, StreamMeta>,
    read: Option<(Arc<Lifetime>, Option<StepKey>)>,
}

impl StreamOp<'_> {
    /// Sets the retry policy.
    pub fn retries(self, retries: Retries) -> Self {
        StreamOp {
            run: self.run.retries(retries),
            ..self
        }
    }

    /// Sets the per-attempt timeout: reading the whole stream must fit in it.
    pub fn timeout(self, timeout: Duration) -> Self {
        StreamOp {
            run: self.run.timeout(timeout),
            ..self
        }
    }

    /// Shows the output as `[REDACTED]` in every log and view (the full-output endpoint
    /// too); workflow code still reads the bytes.
    pub fn sensitive(self) -> Self {
        StreamOp {
            run: self.run.sensitive(),
            ..self
        }
    }

    /// Uses a shared config as the base (see [`RunOp::config`]).
    pub fn config(self, config: &StepConfig) -> Self {
        StreamOp {
            run: self.run.config(config),
            ..self
        }
    }
}

impl Future for StreamOp<'_> {
    type Output = Result<StepStream, WorkflowError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let meta = match Pin::new(&mut this.run).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(meta) => meta?,
        };
        let Some((state, Some(key))) = this.read.take() else {
            return Poll::Ready(Err(WorkflowError::new(
                INTERNAL,
                "stream step polled after completion",
            )));
        };
        let mut stream = StepStream::new(
            Arc::clone(&state.env.store),
            state.lease.instance,
            key,
            &meta,
        );
        stream.lifetime = Some(state);
        Poll::Ready(Ok(stream))
    }
}

/// The bytes a stream step stored, read back chunk by chunk (256 KiB at a time) from the
/// store: a `Stream` of `Vec<u8>` items. The same bytes on every run and replay.
///
/// In workflow code, a chunk the store cannot read stops the run (it is replayed, as after
/// any store failure) rather than handing the workflow an error a replay would not see.
pub struct StepStream {
    store: Arc<dyn Store>,
    instance: InstanceRef,
    key: StepKey,
    attempt: u32,
    epoch: u64,
    chunks: u32,
    bytes: u64,
    next: u32,
    read: u64,
    done: bool,
    /// The run reading it, in workflow code (`None` for a client's read).
    lifetime: Option<Arc<Lifetime>>,
    reading: Option<ChunkRead>,
}

/// A chunk being read from the store.
type ChunkRead = BoxFuture<'static, Result<Option<Vec<u8>>, cairn_store::Error>>;

impl std::fmt::Debug for StepStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepStream")
            .field("step", &self.key.target())
            .field("bytes", &self.bytes)
            .field("chunks", &self.chunks)
            .finish_non_exhaustive()
    }
}

/// The most [`StepStream::read_to_end`] reserves before it has read anything.
const READ_RESERVE: u64 = 8 << 20;

impl StepStream {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        instance: InstanceRef,
        key: StepKey,
        meta: &StreamMeta,
    ) -> Self {
        StepStream {
            store,
            instance,
            key,
            attempt: meta.attempt,
            epoch: meta.epoch,
            chunks: meta.chunks,
            bytes: meta.bytes,
            next: 0,
            read: 0,
            done: false,
            lifetime: None,
            reading: None,
        }
    }

    /// The stream's length in bytes.
    pub fn len(&self) -> u64 {
        self.bytes
    }

    /// Whether the stream is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Reads the rest of the stream into memory (for streams known to be small).
    ///
    /// # Errors
    /// A chunk the store cannot read (outside workflow code).
    pub async fn read_to_end(mut self) -> Result<Vec<u8>, WorkflowError> {
        let left = self.bytes.saturating_sub(self.read).min(READ_RESERVE);
        let mut all = Vec::with_capacity(usize::try_from(left).unwrap_or(0));
        while let Some(chunk) = self.next().await {
            all.extend_from_slice(&chunk?);
        }
        Ok(all)
    }

    /// Why chunk `index` is not what the journal says, if it is not.
    fn check(&self, index: u32, chunk: &[u8]) -> Option<String> {
        let last = index + 1 == self.chunks;
        let read = self.read + chunk.len() as u64;
        let fits = if last {
            read == self.bytes
        } else {
            chunk.len() == STREAM_CHUNK && read < self.bytes
        };
        (!fits).then(|| {
            format!(
                "chunk {index} of the stream of step {} has {} bytes, which does not add up to the {} bytes journaled",
                self.key.target(),
                chunk.len(),
                self.bytes
            )
        })
    }

    /// A read that failed: in workflow code, the run stops (and is replayed); a client
    /// gets the error, and the stream ends.
    fn fail(&mut self, error: cairn_store::Error) -> Poll<Option<Result<Vec<u8>, WorkflowError>>> {
        self.done = true;
        if let Some(state) = &self.lifetime {
            state.abort(crate::lifetime::Abort::Store(error));
            return Poll::Pending;
        }
        Poll::Ready(Some(Err(WorkflowError::new(INTERNAL, error.to_string()))))
    }
}

impl Stream for StepStream {
    type Item = Result<Vec<u8>, WorkflowError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done && this.lifetime.is_some() && this.next < this.chunks {
            // The run was stopped: it never resumes.
            return Poll::Pending;
        }
        if this.done || this.next >= this.chunks {
            return Poll::Ready(None);
        }
        if this.reading.is_none() {
            let store = Arc::clone(&this.store);
            let (instance, key, attempt, epoch, index) = (
                this.instance,
                this.key.clone(),
                this.attempt,
                this.epoch,
                this.next,
            );
            // Reading is work in progress: the instance does not hibernate meanwhile. The
            // read runs on its own, and lets go of the activity when the store answers: a
            // read the workflow stops awaiting (its `next()` lost a `select!`) must not
            // keep the instance from hibernating for as long as it is not polled.
            let activity = this.lifetime.as_ref().map(|state| {
                state.note_read();
                state.activity()
            });
            let read = tokio::spawn(async move {
                let chunk = store
                    .stream_chunk(instance, key, attempt, epoch, index)
                    .await;
                drop(activity);
                chunk
            });
            this.reading = Some(Box::pin(async move {
                read.await.unwrap_or_else(|e| {
                    Err(cairn_store::Error::Unavailable(format!(
                        "reading a stream chunk: {e}"
                    )))
                })
            }));
        }
        let Some(reading) = this.reading.as_mut() else {
            return Poll::Ready(None);
        };
        let read = match reading.as_mut().poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(read) => read,
        };
        this.reading = None;
        let index = this.next;
        match read {
            Ok(Some(chunk)) => match this.check(index, &chunk) {
                None => {
                    this.next += 1;
                    this.read += chunk.len() as u64;
                    Poll::Ready(Some(Ok(chunk)))
                }
                Some(wrong) => this.fail(cairn_store::Error::Corrupt(wrong)),
            },
            Ok(None) => {
                let missing = format!(
                    "chunk {index} of the stream of step {} is missing from the store",
                    this.key.target()
                );
                this.fail(cairn_store::Error::Corrupt(missing))
            }
            Err(e) => this.fail(e),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::try_from(self.chunks.saturating_sub(self.next)).unwrap_or(0);
        (left, Some(left))
    }
}
