//! Workflows whose code runs in workers (`docs/worker-protocol.md`): processes in any
//! language that connect to the server and run a workflow's `run()` while the engine keeps
//! every durable semantic. [`Workers`] holds the connected sessions and their capacity; the
//! scheduler claims a worker's workflow only up to what its workers take, and the driver
//! places each claimed instance on a worker of its version ([`Workers::place`]) or parks it
//! until one connects.

pub(crate) mod connect;
pub(crate) mod protocol;
pub(crate) mod run;
pub(crate) mod session;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cairn_core::WorkflowName;
use tokio::sync::{Notify, mpsc};

use crate::engine::workers::protocol::{Hello, MAX_VERSION_LEN, Refusal};
use crate::engine::workers::session::{Session, Slot};
use crate::env::Env;

/// The connected workers.
pub(crate) struct Workers {
    env: Arc<Env>,
    sessions: Mutex<Vec<Arc<Session>>>,
    next_session: AtomicU64,
    /// Instances claimed for each workflow and not yet placed on a worker: they count
    /// against the workers' free slots, so the scheduler claims no more than fit.
    placing: Mutex<HashMap<WorkflowName, usize>>,
    /// Notified when a slot frees up or a session comes or goes.
    changed: Arc<Notify>,
    /// Held by a reload from its read to its load: a load replaces what is known, so one
    /// whose read came before another worker registered must not land after that worker's.
    reloading: tokio::sync::Mutex<()>,
}

impl Workers {
    pub(crate) fn new(env: Arc<Env>) -> Self {
        Workers {
            env,
            sessions: Mutex::default(),
            next_session: AtomicU64::new(0),
            placing: Mutex::default(),
            changed: Arc::new(Notify::new()),
            reloading: tokio::sync::Mutex::new(()),
        }
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Session>>> {
        self.sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn placing(&self) -> std::sync::MutexGuard<'_, HashMap<WorkflowName, usize>> {
        self.placing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The connected sessions.
    pub(crate) fn connected(&self) -> Vec<Arc<Session>> {
        self.sessions().clone()
    }

    /// The workflows workers run now with slots to spare, and how many: what the
    /// scheduler may claim.
    pub(crate) fn free(&self) -> Vec<(WorkflowName, usize)> {
        let mut free: HashMap<WorkflowName, usize> = HashMap::new();
        for session in self.sessions().iter().filter(|s| !s.is_closed()) {
            let n = session.free();
            for (workflow, _) in &session.offered {
                *free.entry(workflow.clone()).or_default() += n;
            }
        }
        let placing = self.placing();
        let mut free: Vec<(WorkflowName, usize)> = free
            .into_iter()
            .map(|(w, n)| {
                let n = n.saturating_sub(placing.get(&w).copied().unwrap_or(0));
                (w, n)
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        free.sort();
        free
    }

    /// Holds a place for an instance of `workflow` just claimed, until it is placed.
    pub(crate) fn reserve(self: &Arc<Self>, workflow: &WorkflowName) -> Reservation {
        *self.placing().entry(workflow.clone()).or_default() += 1;
        Reservation {
            workers: Arc::clone(self),
            workflow: workflow.clone(),
        }
    }

    /// Whether a connected worker runs `workflow` at `version`.
    pub(crate) fn serves(&self, workflow: &WorkflowName, version: &str) -> bool {
        self.sessions().iter().any(|s| s.serves(workflow, version))
    }

    /// A slot on a worker of `version` of `workflow` (any version when the instance has
    /// none), waiting while every such worker is busy; `None` when none is connected.
    pub(crate) async fn place(
        &self,
        workflow: &WorkflowName,
        version: Option<&str>,
    ) -> Option<(Slot, String)> {
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            {
                let sessions = self.sessions();
                let mut fitting: Vec<(&Arc<Session>, &str)> = sessions
                    .iter()
                    .filter(|s| !s.is_closed())
                    .filter_map(|s| {
                        s.offered
                            .iter()
                            .find(|(w, v)| w == workflow && version.is_none_or(|want| want == v))
                            .map(|(_, v)| (s, v.as_str()))
                    })
                    .collect();
                if fitting.is_empty() {
                    return None;
                }
                // The least busy first: runs spread over the workers of a version.
                fitting.sort_by_key(|(s, _)| std::cmp::Reverse(s.free()));
                for (session, v) in fitting {
                    if let Some(slot) = session.try_take() {
                        return Some((slot, v.to_owned()));
                    }
                }
            }
            changed.await;
        }
    }

    /// Starts a session for a worker that said `hello`: its workflows are registered (the
    /// store keeps every version), instances waiting for them are woken, and the frames
    /// for the worker come out of the receiver.
    pub(crate) async fn connect(
        &self,
        hello: Hello,
    ) -> Result<(Arc<Session>, mpsc::UnboundedReceiver<String>), Refusal> {
        let mut offered = Vec::new();
        let mut names = HashSet::new();
        for o in hello.workflows {
            let name = WorkflowName::new(o.name.clone()).map_err(|e| {
                Refusal::new("protocol.workflow", format!("workflow {:?}: {e}", o.name))
            })?;
            if self.env.retention.contains_key(&name) {
                return Err(Refusal::new(
                    "protocol.workflow",
                    format!("workflow {name} is registered in Rust on this server"),
                ));
            }
            if o.version.is_empty()
                || o.version.len() > MAX_VERSION_LEN
                || o.version.chars().any(char::is_control)
            {
                return Err(Refusal::new(
                    "protocol.workflow",
                    format!(
                        "workflow {name}: a version is 1 to {MAX_VERSION_LEN} bytes of printable text"
                    ),
                ));
            }
            if !names.insert(name.clone()) {
                return Err(Refusal::new(
                    "protocol.workflow",
                    format!("workflow {name} is offered twice"),
                ));
            }
            offered.push((name, o.version));
        }
        let store = &self.env.store;
        let now = self.env.clock.now();
        let versions = offered
            .iter()
            .map(|(workflow, version)| cairn_store::WorkflowVersion {
                workflow: workflow.clone(),
                version: version.clone(),
                registered_at: now,
            })
            .collect();
        let unavailable =
            |e: cairn_store::Error| Refusal::new("server.unavailable", format!("the store: {e}"));
        store
            .register_versions(versions)
            .await
            .map_err(unavailable)?;
        self.reload().await.map_err(unavailable)?;
        let (out, frames) = mpsc::unbounded_channel();
        let id = self.next_session.fetch_add(1, Ordering::Relaxed) + 1;
        let session = Arc::new(Session::new(
            id,
            hello.worker,
            offered,
            hello.concurrency,
            out,
            Arc::clone(&self.env),
            Arc::clone(&self.changed),
        ));
        // The worker's first frame, before any run can be started on it.
        session.send(protocol::welcome(&id.to_string()));
        self.sessions().push(Arc::clone(&session));
        self.changed.notify_waiters();
        // After the session is listed: an instance parked from now on finds it (the
        // driver looks again after it parks), and one parked before is woken here.
        if let Err(e) = self.wake_awaiting(&session, u64::MAX).await {
            // Refused, as when its versions could not be registered: the worker connects
            // again, and its next connection wakes them. Let in, it could run for hours
            // while instances parked for it waited (nothing else wakes them on one engine).
            self.disconnect(&session);
            return Err(unavailable(e));
        }
        // Its slots are free: the scheduler claims what is queued for its workflows.
        self.env.wake.notify_one();
        tracing::info!(worker = %session.worker, session = id, workflows = ?session.offered, concurrency = session.concurrency, "a worker connected");
        Ok((session, frames))
    }

    /// Makes the instances waiting for a worker of a version `session` runs claimable, at
    /// most `limit` of each; how many.
    async fn wake_awaiting(&self, session: &Session, limit: u64) -> cairn_store::Result<u64> {
        let mut woken = 0;
        for (workflow, version) in &session.offered {
            woken += self
                .env
                .store
                .wake_awaiting(workflow, version, limit)
                .await?;
        }
        Ok(woken)
    }

    /// The worker of `session` has gone.
    pub(crate) fn disconnect(&self, session: &Arc<Session>) {
        self.sessions().retain(|s| !Arc::ptr_eq(s, session));
        session.close();
        self.changed.notify_waiters();
        tracing::info!(worker = %session.worker, session = session.id, "a worker disconnected");
    }

    /// The engine has stopped: every session ends (its worker reconnects to the next).
    pub(crate) fn close_all(&self) {
        let sessions = std::mem::take(&mut *self.sessions());
        for session in sessions {
            session.close();
        }
        self.changed.notify_waiters();
    }

    /// Reads the workflows and versions workers registered from the store.
    pub(crate) async fn reload(&self) -> cairn_store::Result<()> {
        let _turn = self.reloading.lock().await;
        let registered = self.env.store.workflow_versions().await?;
        self.env.remote.load(
            registered
                .into_iter()
                .filter(|v| !self.env.retention.contains_key(&v.workflow))
                .collect(),
        );
        Ok(())
    }
}

/// Where engines share the store, every 10 s: reads what workers of the other engines
/// registered (a create on this engine pins the newest version, wherever it registered),
/// and wakes the instances parked for the versions this engine's workers run.
pub(crate) async fn follow(
    workers: Arc<Workers>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            () = workers.env.clock.sleep(std::time::Duration::from_secs(10)) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        if let Err(e) = workers.reload().await {
            tracing::debug!(error = %e, "reading the workers' workflows failed");
        }
        // Another engine, with no worker of an instance's version, may have claimed it and
        // parked it after this engine's worker of that version connected (its claim counts
        // workers by workflow, not version): nothing else would wake it while that worker
        // stays. Wake what waits for the versions this engine's workers run and have room
        // for, no more than that room: those it cannot run another engine may claim and park
        // again (a commit and a record each).
        let mut woken = 0;
        for session in workers.connected() {
            let room = session.free() as u64;
            if session.is_closed() || room == 0 {
                continue;
            }
            match workers.wake_awaiting(&session, room).await {
                Ok(n) => woken += n,
                Err(e) => {
                    tracing::debug!(error = %e, "waking the instances waiting for a worker failed");
                }
            }
        }
        if woken > 0 {
            workers.env.wake.notify_one();
        }
    }
}

/// A claimed instance's place among its workflow's free slots, until the driver has
/// placed it on a worker (or let it go).
pub(crate) struct Reservation {
    workers: Arc<Workers>,
    workflow: WorkflowName,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut placing = self.workers.placing();
        if let Some(n) = placing.get_mut(&self.workflow) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                placing.remove(&self.workflow);
            }
        }
    }
}
