//! One connected worker: its [`Session`] (what it runs, how many runs it takes at once, the
//! frames queued for it), the [`Slot`] a run holds on it, and the [`RunChannel`] through
//! which the frames about one run reach that run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cairn_core::WorkflowName;
use tokio::sync::{Notify, mpsc, oneshot};

use crate::engine::workers::protocol::{Incoming, Op, Outcome, Refusal, TaskKind};
use crate::env::Env;
use crate::lifetime::{Abort, Lifetime};

/// A connected worker.
pub(crate) struct Session {
    pub(crate) id: u64,
    /// The worker's name, for logs.
    pub(crate) worker: String,
    /// The workflows it runs, each at one version.
    pub(crate) offered: Vec<(WorkflowName, String)>,
    /// How many runs it takes at once.
    pub(crate) concurrency: usize,
    /// The frames for the worker; gone once the session is closed.
    out: Mutex<Option<mpsc::UnboundedSender<String>>>,
    runs: Mutex<HashMap<String, Arc<RunChannel>>>,
    /// Slots held by runs.
    running: AtomicUsize,
    closed: AtomicBool,
    /// Names runs and tasks.
    counter: AtomicU64,
    env: Arc<Env>,
    /// Notified when a slot frees up or the session closes.
    changed: Arc<Notify>,
}

impl Session {
    pub(crate) fn new(
        id: u64,
        worker: String,
        offered: Vec<(WorkflowName, String)>,
        concurrency: usize,
        out: mpsc::UnboundedSender<String>,
        env: Arc<Env>,
        changed: Arc<Notify>,
    ) -> Self {
        Session {
            id,
            worker,
            offered,
            concurrency,
            out: Mutex::new(Some(out)),
            runs: Mutex::default(),
            running: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            counter: AtomicU64::new(0),
            env,
            changed,
        }
    }

    /// Queues a frame for the worker (dropped once it has gone).
    pub(crate) fn send(&self, frame: String) {
        if let Some(out) = self
            .out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
        {
            let _ = out.send(frame);
        }
    }

    /// A new name for a run or a task, unique within the session.
    pub(crate) fn name(&self, prefix: char) -> String {
        format!(
            "{prefix}{}",
            self.counter.fetch_add(1, Ordering::Relaxed) + 1
        )
    }

    /// Whether this worker runs `workflow` at `version`, and is still connected.
    pub(crate) fn serves(&self, workflow: &WorkflowName, version: &str) -> bool {
        !self.is_closed()
            && self
                .offered
                .iter()
                .any(|(w, v)| w == workflow && v == version)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// How many more runs it takes now.
    pub(crate) fn free(&self) -> usize {
        self.concurrency
            .saturating_sub(self.running.load(Ordering::SeqCst))
    }

    /// Runs it holds now.
    pub(crate) fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Takes a slot if one is free.
    pub(crate) fn try_take(self: &Arc<Self>) -> Option<Slot> {
        if self.is_closed() {
            return None;
        }
        self.running
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.concurrency).then_some(n + 1)
            })
            .ok()?;
        Some(Slot {
            session: Arc::clone(self),
        })
    }

    /// The worker has gone (or the engine is stopping): every run on it stops (its
    /// lifetime ends once what the worker's answers settled before it went is committed,
    /// starting no attempt; the instance runs again on another worker of its version, its
    /// attempts in flight recorded as interrupted), no run starts on it again, and once
    /// the frames queued are sent, the connection ends.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let runs: Vec<Arc<RunChannel>> = self.runs().values().cloned().collect();
        for run in runs {
            run.lifetime.abort(Abort::WorkerLost);
            run.tasks().clear();
        }
        self.changed.notify_waiters();
        self.env.wake.notify_one();
    }

    fn runs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<RunChannel>>> {
        self.runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens the channel of a new run on this session.
    pub(crate) fn open_run(
        self: &Arc<Self>,
        lifetime: Arc<Lifetime>,
    ) -> (Arc<RunChannel>, mpsc::UnboundedReceiver<RunEvent>) {
        let (inbox, events) = mpsc::unbounded_channel();
        let run = Arc::new(RunChannel {
            id: self.name('r'),
            session: Arc::clone(self),
            lifetime,
            inbox,
            tasks: Mutex::default(),
        });
        self.runs().insert(run.id.clone(), Arc::clone(&run));
        if self.is_closed() {
            // Closed while the run was opening: it is lost like the others.
            run.lifetime.abort(Abort::WorkerLost);
        }
        (run, events)
    }

    /// Forgets a run: later frames about it are stale.
    pub(crate) fn close_run(&self, run: &str) {
        self.runs().remove(run);
    }

    /// Hands a frame the worker sent to the run it is about.
    pub(crate) fn receive(&self, incoming: Incoming) -> Result<(), Refusal> {
        let (run_id, event) = match incoming {
            Incoming::Op { run, op } => (run, RunEvent::Op(op)),
            Incoming::Idle { run, ops, answers } => (run, RunEvent::Idle { ops, answers }),
            Incoming::RunResult { run, outcome } => (run, RunEvent::Returned(outcome)),
            Incoming::TaskResult {
                run,
                task,
                kind,
                outcome,
            } => {
                let channel = self.runs().get(&run).cloned();
                let waiting = channel.and_then(|c| {
                    let mut tasks = c.tasks();
                    // An answer of another kind (a delayResult for an attempt) is refused
                    // and leaves the task waiting for its real answer.
                    match tasks.get(&task) {
                        Some((asked, _)) if *asked != kind => Some(Err(*asked)),
                        Some(_) => tasks.remove(&task).map(|(_, answer)| Ok(answer)),
                        None => None,
                    }
                });
                return match waiting {
                    Some(Ok(answer)) => {
                        let _ = answer.send(outcome);
                        Ok(())
                    }
                    Some(Err(asked)) => Err(Refusal::new(
                        "protocol.malformed",
                        format!(
                            "task {task} of run {run} is answered by `{}`",
                            asked.answer_type()
                        ),
                    )
                    .about(&run)),
                    None => Err(Refusal::new(
                        "protocol.stale",
                        format!("task {task} of run {run} is not asked for"),
                    )
                    .about(&run)),
                };
            }
        };
        let channel = self.runs().get(&run_id).cloned();
        match channel.map(|c| c.inbox.send(event)) {
            Some(Ok(())) => Ok(()),
            _ => Err(Refusal::new(
                "protocol.stale",
                format!("run {run_id} is not running on this session"),
            )
            .about(&run_id)),
        }
    }
}

/// A run's hold on one of its worker's slots, given back when dropped.
pub(crate) struct Slot {
    pub(crate) session: Arc<Session>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.session.running.fetch_sub(1, Ordering::SeqCst);
        self.session.changed.notify_waiters();
        self.session.env.wake.notify_one();
    }
}

/// What the worker said about a run, in the order it said it.
#[derive(Debug)]
pub(crate) enum RunEvent {
    Op(Box<Op>),
    /// The run's code waits on ops only, having made `ops` ops and received `answers` of
    /// their results.
    Idle {
        ops: u64,
        answers: Option<u64>,
    },
    Returned(Outcome),
}

/// A run on a worker: its name, the lifetime it runs for, and the tasks (attempts, delay
/// functions, rollback handlers) whose answers it waits for.
pub(crate) struct RunChannel {
    pub(crate) id: String,
    pub(crate) session: Arc<Session>,
    pub(crate) lifetime: Arc<Lifetime>,
    inbox: mpsc::UnboundedSender<RunEvent>,
    tasks: Mutex<HashMap<String, (TaskKind, oneshot::Sender<Outcome>)>>,
}

impl RunChannel {
    fn tasks(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (TaskKind, oneshot::Sender<Outcome>)>> {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks the worker for a task: `frame` is built with the task's name. Resolves with
    /// its answer; never, if the worker goes first (its lifetime is aborted then).
    pub(crate) async fn ask(&self, kind: TaskKind, frame: impl FnOnce(&str) -> String) -> Outcome {
        let task = self.session.name('t');
        let (answer, answered) = oneshot::channel();
        self.tasks().insert(task.clone(), (kind, answer));
        // Given up (a timeout, the run dropped): the worker may stop the work, and its late
        // answer is stale.
        let mut cancel = Cancel {
            run: self,
            task: Some(task.clone()),
        };
        if self.session.is_closed() {
            return std::future::pending().await;
        }
        self.session.send(frame(&task));
        match answered.await {
            Ok(outcome) => {
                cancel.task = None;
                outcome
            }
            Err(_) => {
                cancel.task = None;
                std::future::pending().await
            }
        }
    }

    pub(crate) fn send(&self, frame: String) {
        self.session.send(frame);
    }
}

/// Cancels a task whose answer is no longer wanted.
struct Cancel<'a> {
    run: &'a RunChannel,
    task: Option<String>,
}

impl Drop for Cancel<'_> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take()
            && self.run.tasks().remove(&task).is_some()
        {
            self.run.send(crate::engine::workers::protocol::cancel(
                &self.run.id,
                &task,
            ));
        }
    }
}
