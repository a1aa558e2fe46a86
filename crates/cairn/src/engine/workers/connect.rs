//! The public face of workers: [`Engine::connect_worker`] turns a worker's `hello` into a
//! [`WorkerConnection`] that a transport (the server's WebSocket, a test) pumps frames
//! through, and the engine says which workers and versions it knows.

use std::sync::Arc;

use cairn_core::{Timestamp, WorkflowName};
use tokio::sync::mpsc;

use crate::engine::Engine;
use crate::engine::workers::Workers;
use crate::engine::workers::protocol::{Incoming, Refusal, parse_hello};
use crate::engine::workers::session::Session;
use crate::error::Error;

pub use crate::engine::workers::protocol::MAX_FRAME;

/// A worker's session with the engine: frames in ([`WorkerConnection::receive`]) and out
/// ([`WorkerConnection::next_frame`]), in the protocol of `docs/worker-protocol.md`.
/// Dropping it is the worker going away: its runs stop and run again elsewhere.
pub struct WorkerConnection {
    session: Arc<Session>,
    frames: mpsc::UnboundedReceiver<String>,
    workers: Arc<Workers>,
}

impl std::fmt::Debug for WorkerConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConnection")
            .field("session", &self.session.id)
            .field("worker", &self.session.worker)
            .finish()
    }
}

impl WorkerConnection {
    /// The next frame to send to the worker (the first is its `welcome`); `None` once the
    /// engine has nothing more to say.
    pub async fn next_frame(&mut self) -> Option<String> {
        self.frames.recv().await
    }

    /// A frame queued already, without waiting: the transport sends those it finds after
    /// [`next_frame`](Self::next_frame) in one write.
    pub fn queued_frame(&mut self) -> Option<String> {
        self.frames.try_recv().ok()
    }

    /// A frame the worker sent. One the protocol does not allow changes nothing durable:
    /// an `error` frame with its code is queued for the worker instead.
    pub fn receive(&self, frame: &str) {
        if let Err(refusal) = Incoming::parse(frame).and_then(|m| self.session.receive(m)) {
            tracing::debug!(session = self.session.id, code = refusal.code, message = %refusal.message, "refused a worker's frame");
            self.session.send(refusal.frame());
        }
    }

    /// The session's number, unique within this engine.
    pub fn session(&self) -> u64 {
        self.session.id
    }
}

impl Drop for WorkerConnection {
    fn drop(&mut self) {
        self.workers.disconnect(&self.session);
    }
}

/// Why a worker's `hello` was refused: the `error` frame to send before closing.
#[derive(Debug, Clone)]
pub struct WorkerRefused {
    code: &'static str,
    message: String,
}

impl WorkerRefused {
    /// The stable code (`protocol.version`, `protocol.workflow`, …).
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The `error` frame.
    pub fn frame(&self) -> String {
        Refusal::new(self.code, self.message.clone()).frame()
    }
}

impl std::fmt::Display for WorkerRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for WorkerRefused {}

impl From<Refusal> for WorkerRefused {
    fn from(r: Refusal) -> Self {
        WorkerRefused {
            code: r.code,
            message: r.message,
        }
    }
}

/// A connected worker, as [`Engine::workers`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorkerInfo {
    /// Its session's number.
    pub session: u64,
    /// The name it gave.
    pub worker: String,
    /// The workflows it runs, each at one version.
    pub workflows: Vec<(WorkflowName, String)>,
    /// How many runs it takes at once.
    pub concurrency: usize,
    /// How many it holds now.
    pub running: usize,
}

/// A version of a workflow run by workers, as [`Engine::workflow_versions`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VersionInfo {
    /// The version.
    pub version: String,
    /// When a worker first registered it.
    #[serde(serialize_with = "cairn_core::rfc3339::serialize")]
    pub registered_at: Timestamp,
    /// Whether new instances are created on it (it was registered last).
    pub newest: bool,
    /// Unfinished instances pinned to it: while there are any, keep a worker of it.
    pub unfinished: u64,
    /// Workers of it connected to this engine now.
    pub workers: usize,
}

impl Engine {
    /// Starts a worker's session from its first frame, its `hello`
    /// (`docs/worker-protocol.md`).
    ///
    /// # Errors
    /// [`WorkerRefused`] with the `error` frame to send: a bad `hello`, another protocol
    /// version, a workflow that cannot be registered (one registered in Rust, an invalid
    /// name or version), an engine that runs nothing (opened for a check, shutting down),
    /// or a store that cannot record the workflows.
    pub async fn connect_worker(&self, hello: &str) -> Result<WorkerConnection, WorkerRefused> {
        let hello = parse_hello(hello)?;
        if !self.inner.claims || *self.inner.shutdown.borrow() {
            return Err(Refusal::new(
                "server.unavailable",
                "this engine runs no workflows now (it is shutting down, or only checking)",
            )
            .into());
        }
        let workers = Arc::clone(&self.inner.workers);
        let (session, frames) = workers.connect(hello).await?;
        Ok(WorkerConnection {
            session,
            frames,
            workers,
        })
    }

    /// The workers connected to this engine now.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        self.inner
            .workers
            .connected()
            .iter()
            .map(|s| WorkerInfo {
                session: s.id,
                worker: s.worker.clone(),
                workflows: s.offered.clone(),
                concurrency: s.concurrency,
                running: s.running(),
            })
            .collect()
    }

    /// The version new instances of `workflow` are created on, for a workflow run by
    /// workers (`None` for one registered in Rust, or unknown).
    pub fn newest_version(&self, workflow: &WorkflowName) -> Option<String> {
        if self.inner.workflows.contains_key(workflow) {
            return None;
        }
        self.inner.env.remote.newest(workflow)
    }

    /// The versions of a workflow run by workers, oldest first, with their unfinished
    /// instances: an old version's worker can go once it has none.
    ///
    /// None for a workflow registered in Rust (its code is this process's).
    ///
    /// # Errors
    /// An unknown workflow, or a store failure.
    pub async fn workflow_versions(&self, workflow: &str) -> Result<Vec<VersionInfo>, Error> {
        let name = WorkflowName::new(workflow)?;
        if self.inner.workflows.contains_key(&name) {
            // Its code is this process's: one version, no workers.
            return Ok(Vec::new());
        }
        if !self.inner.env.remote.knows(&name) {
            return Err(Error::UnknownWorkflow(name.to_string()));
        }
        let store = &self.inner.env.store;
        let registered: Vec<cairn_store::WorkflowVersion> = store
            .workflow_versions()
            .await?
            .into_iter()
            .filter(|v| v.workflow == name)
            .collect();
        let unfinished = store.unfinished_versions(&name).await?;
        let connected = self.inner.workers.connected();
        let newest = registered.last().map(|v| v.version.clone());
        Ok(registered
            .into_iter()
            .map(|v| VersionInfo {
                newest: newest.as_deref() == Some(v.version.as_str()),
                unfinished: unfinished
                    .iter()
                    .find(|(version, _)| version.as_deref() == Some(v.version.as_str()))
                    .map_or(0, |(_, n)| *n),
                workers: connected
                    .iter()
                    .filter(|s| s.serves(&name, &v.version))
                    .count(),
                registered_at: v.registered_at,
                version: v.version,
            })
            .collect())
    }
}
