//! Cairn's PostgreSQL store: several engine processes, on several machines, share one
//! database with the semantics they have on SQLite.
//!
//! - **Leases expire.** A claim holds an instance until `now + ttl`; the engine renews all
//!   of its leases in one statement per tick. An instance whose owner died, stalled or lost
//!   its network becomes claimable once its lease runs out. Every write is fenced by the
//!   lease epoch, checked under the instance's row lock in the same transaction, so an
//!   owner that wakes up after losing its lease can never write again.
//! - **Claims** take ready rows with `FOR UPDATE SKIP LOCKED`: engines claiming at once
//!   never wait on or take each other's rows.
//! - **Batching.** One writer task per store runs every queued write in one transaction
//!   (see `writer.rs`), as the SQLite writer thread does.
//! - **Log ids in commit order**, so a reader resuming after an id never misses a record
//!   committed later with a smaller one (see `history.rs`).
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let store = cairn_postgres::PostgresStore::open(
//!     cairn_postgres::Options::new("postgres://cairn@localhost/cairn"),
//! )
//! .await?;
//! # Ok(()) }
//! ```

mod batch;
mod counts;
mod db;
mod history;
mod notify;
mod ops;
#[cfg(test)]
#[cfg(cairn_test_pg)]
mod plans;
mod raw;
mod reads;
mod schema;
mod slots;
mod writer;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_core::{EventType, InstanceId, InstanceStatus, StepKey, Timestamp, WorkflowName};
use cairn_store::{
    Claimed, ControlOutcome, ControlRequest, Created, Error, InstanceRecord, InstanceRef, Lease,
    ListQuery, NewEvent, NewInstance, Result, Sent, Store, StoreFuture, StoredEvent, Timers, Write,
};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::NoTls;

pub use raw::{RawBound, raw_step_writes};
pub use writer::BatchStats;
use writer::{Job, Op, Reply};

/// Options for [`PostgresStore::open`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// The connection URL (`postgres://user:password@host:port/database?options`).
    pub url: String,
    /// The schema to keep Cairn's tables in (created if missing); `None` uses the
    /// connection's `search_path` (normally `public`).
    pub schema: Option<String>,
    /// Connections at most: one for the writer, the rest for reads (the listener for
    /// other engines' changes has one more of its own).
    pub connections: usize,
    /// Tell other engines of this one's writes, and listen for theirs (`LISTEN/NOTIFY`),
    /// so they react within milliseconds instead of at their next poll.
    pub notify: bool,
    /// Opened to look (the replay check): neither the schema nor its tables are created or
    /// migrated; a database of another schema version is refused.
    pub check_only: bool,
    /// How full PostgreSQL's notification queue may be (0 to 1, default a half) before
    /// writes stop sending notices and stuck listeners are ended (see `notify.rs`).
    #[doc(hidden)]
    pub notify_queue_limit: f64,
    /// How long a listener of this deployment may be stuck writing to its client, while
    /// the queue is past its limit, before it is ended (default 30 s).
    #[doc(hidden)]
    pub stuck_listener_after: Duration,
}

impl Options {
    /// Options for a database URL, with defaults for the rest.
    pub fn new(url: impl Into<String>) -> Self {
        Options {
            url: url.into(),
            schema: None,
            connections: 8,
            notify: true,
            check_only: false,
            notify_queue_limit: 0.5,
            stuck_listener_after: Duration::from_secs(30),
        }
    }

    /// Keeps the tables in this schema (created if missing).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// Turns the notices to and from other engines on or off (on by default).
    pub fn notify(mut self, on: bool) -> Self {
        self.notify = on;
        self
    }

    /// Sets the most connections; at least 2.
    pub fn connections(mut self, n: usize) -> Self {
        self.connections = n.max(2);
        self
    }
}

/// Why a database could not be opened.
#[derive(Debug)]
pub struct OpenError {
    message: String,
}

impl OpenError {
    fn new(message: impl Into<String>) -> Self {
        OpenError {
            message: message.into(),
        }
    }
}

impl std::error::Error for OpenError {}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The PostgreSQL store. Cheap to share behind an `Arc`; see the crate docs.
pub struct PostgresStore {
    pool: Pool,
    writer: Mutex<Option<mpsc::UnboundedSender<Job>>>,
    writer_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    listener: Option<(
        tokio::sync::broadcast::Sender<cairn_store::Changes>,
        tokio::task::JoinHandle<()>,
    )>,
    stats: Arc<BatchStats>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore").finish_non_exhaustive()
    }
}

/// Why PostgreSQL would not take `name` as Cairn's schema, checked before anything is
/// written: it goes into SQL text (quoted, so reserved words such as `user` are fine),
/// lower-case letters, digits and `_` only (no quoting rule to get wrong), at most the 63
/// bytes of an identifier (PostgreSQL would cut a longer one, silently merging two
/// deployments), and not `pg_…`, which PostgreSQL keeps for itself.
fn check_schema(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the schema name is empty".into());
    }
    if name.len() > 63 {
        return Err(format!(
            "the schema name {name:?} is {} bytes long; PostgreSQL takes at most 63",
            name.len()
        ));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        || name.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(format!(
            "invalid schema name {name:?}: use lower-case letters, digits and _, not starting with a digit"
        ));
    }
    if name.starts_with("pg_") {
        return Err(format!(
            "invalid schema name {name:?}: PostgreSQL reserves names starting with pg_"
        ));
    }
    Ok(())
}

/// The deployment the connection's tables belong to: the schema they live in (named in
/// the options, or the first of the `search_path` that exists), resolved once at open so
/// that the notices of two deployments in one database never meet.
async fn deployment(
    client: &tokio_postgres::Client,
    queue_watch: (f64, Duration),
) -> Result<notify::Deployment, OpenError> {
    let row = client
        .query_one(
            "SELECT current_schema()::text,
                 (SELECT oid FROM pg_namespace WHERE nspname = current_schema())",
            &[],
        )
        .await
        .map_err(|e| OpenError::new(format!("read the schema in use: {}", db::describe(&e))))?;
    let (Some(schema), Some(oid)) = (
        row.get::<_, Option<String>>(0),
        row.get::<_, Option<u32>>(1),
    ) else {
        return Err(OpenError::new(
            "no schema to keep the tables in: the connection's search_path names none that exists",
        ));
    };
    let origin = {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    };
    Ok(notify::Deployment {
        channel: notify::channel_for(&schema),
        schema_oid: oid,
        origin,
        listener_name: format!("cairn-listen:{schema}"),
        queue: Arc::new(notify::QueueWatch::new(queue_watch.0, queue_watch.1)),
    })
}

impl PostgresStore {
    /// Connects, creates the schema if asked, and brings the tables up to date. Must be
    /// called inside a tokio runtime (the writer is a task on it).
    ///
    /// # Errors
    /// When the URL is invalid, the server cannot be reached, or the database was written
    /// by a newer build of Cairn.
    pub async fn open(options: Options) -> Result<Self, OpenError> {
        let mut config: tokio_postgres::Config = options
            .url
            .parse()
            .map_err(|e| OpenError::new(format!("invalid PostgreSQL URL: {e}")))?;
        if let Some(schema) = &options.schema {
            check_schema(schema).map_err(OpenError::new)?;
        }
        // A session that stalls (its process stopped, its network cut) must not hold row
        // locks, or the log clock, longer than a lease: the server ends an idle transaction
        // and gives up a lock wait after 10 s, and keepalives notice a dead peer in ~15 s
        // (instead of the system default of hours). A statement runs at most a minute.
        let mut server_options = String::from(
            "-c idle_in_transaction_session_timeout=10000 -c lock_timeout=10000 -c statement_timeout=60000",
        );
        if let Some(schema) = &options.schema {
            server_options.push_str(&format!(" -c search_path=\"{schema}\""));
        }
        // Options given in the URL come last, so they win.
        if let Some(given) = config.get_options() {
            server_options = format!("{server_options} {given}");
        }
        config.options(server_options);
        config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(5))
            .keepalives_interval(Duration::from_secs(2))
            .keepalives_retries(5);
        config.connect_timeout(Duration::from_secs(10));
        // Operators see which engines (and which schema) a connection serves.
        match &options.schema {
            Some(schema) => config.application_name(format!("cairn:{schema}")),
            None => config.application_name("cairn"),
        };
        if let Some(schema) = options.schema.as_ref().filter(|_| !options.check_only) {
            let (client, connection) = config
                .connect(NoTls)
                .await
                .map_err(|e| OpenError::new(format!("cannot connect: {}", db::describe(&e))))?;
            let task = tokio::spawn(connection);
            // `IF NOT EXISTS` alone races between engines starting together (one of them
            // fails on the catalog's unique index): serialise on an advisory lock.
            client
                .batch_execute(&format!(
                    "BEGIN;
                     SELECT pg_advisory_xact_lock(hashtext('cairn_create_schema.{schema}'));
                     CREATE SCHEMA IF NOT EXISTS \"{schema}\";
                     COMMIT;"
                ))
                .await
                .map_err(|e| {
                    OpenError::new(format!("create schema {schema}: {}", db::describe(&e)))
                })?;
            drop(client);
            let _ = task.await;
        }
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.connections.max(2))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .create_timeout(Some(Duration::from_secs(10)))
            .wait_timeout(Some(Duration::from_secs(30)))
            .build()
            .map_err(|e| OpenError::new(format!("connection pool: {e}")))?;
        let deployment = {
            let mut conn = pool
                .get()
                .await
                .map_err(|e| OpenError::new(format!("cannot connect: {e}")))?;
            let client: &mut tokio_postgres::Client = &mut conn;
            if options.check_only {
                let version = schema::version(client).await.map_err(|e| {
                    OpenError::new(format!("read the schema version: {}", db::describe(&e)))
                })?;
                if version != schema::current_version() {
                    return Err(OpenError::new(format!(
                        "the database has schema version {version}, this build's is {}: check it with the build that wrote it (checking does not migrate)",
                        schema::current_version()
                    )));
                }
            } else {
                schema::migrate(client).await.map_err(|e| match e {
                    schema::MigrateError::Db(e) => {
                        OpenError::new(format!("migrate: {}", db::describe(&e)))
                    }
                    schema::MigrateError::Busy(waited) => OpenError::new(format!(
                        "another engine has been migrating this schema for {} s and has not \
                         finished; is it stuck? (see pg_stat_activity for cairn connections)",
                        waited.as_secs()
                    )),
                    schema::MigrateError::Newer(v) => OpenError::new(format!(
                        "the database has schema version {v}, written by a newer build of Cairn \
                     (this one knows up to {}); refusing to open it",
                        schema::current_version()
                    )),
                })?;
            }
            deployment(
                client,
                (options.notify_queue_limit, options.stuck_listener_after),
            )
            .await?
        };
        let listener = options
            .notify
            .then(|| notify::listen(config, deployment.clone()));
        let notifier = notify::Notifier::new(options.notify.then_some(deployment));
        let stats = Arc::new(BatchStats::default());
        let (tx, task) = writer::spawn(pool.clone(), notifier, Arc::clone(&stats));
        Ok(PostgresStore {
            pool,
            writer: Mutex::new(Some(tx)),
            writer_task: Mutex::new(Some(task)),
            listener,
            stats,
        })
    }

    /// How the writer batched so far.
    pub fn batch_stats(&self) -> &BatchStats {
        &self.stats
    }

    fn write(&self, op: Op) -> StoreFuture<'_, Reply> {
        let (reply, rx) = oneshot::channel();
        let sent = self
            .writer
            .lock()
            .ok()
            .and_then(|w| w.as_ref().map(|w| w.send(Job { op, reply }).is_ok()))
            .unwrap_or(false);
        Box::pin(async move {
            if !sent {
                return Err(Error::Unavailable("store closed".into()));
            }
            rx.await
                .map_err(|_| Error::Unavailable("store closed".into()))?
        })
    }

    async fn reader(&self) -> Result<deadpool_postgres::Object> {
        self.pool
            .get()
            .await
            .map_err(|e| Error::Unavailable(format!("postgres: no connection: {e}")))
    }
}

fn unexpected() -> Error {
    Error::Corrupt("the writer answered another operation".into())
}

fn names(workflows: &[WorkflowName]) -> Vec<String> {
    workflows.iter().map(ToString::to_string).collect()
}

impl Store for PostgresStore {
    fn create(&self, batch: Vec<NewInstance>) -> StoreFuture<'_, Vec<Created>> {
        let reply = self.write(Op::Create(batch));
        Box::pin(async move {
            match reply.await? {
                Reply::Created(c) => Ok(c),
                _ => Err(unexpected()),
            }
        })
    }

    fn instance(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
    ) -> StoreFuture<'_, Option<InstanceRecord>> {
        let (workflow, id) = (workflow.to_string(), id.to_string());
        Box::pin(async move { reads::instance(&self.reader().await?, &workflow, &id).await })
    }

    fn list(&self, query: ListQuery) -> StoreFuture<'_, Vec<InstanceRecord>> {
        Box::pin(async move { reads::list(&self.reader().await?, &query).await })
    }

    fn count_matching(&self, query: ListQuery) -> StoreFuture<'_, u64> {
        Box::pin(async move { reads::count_matching(&self.reader().await?, &query).await })
    }

    fn count(&self, workflow: &WorkflowName, status: InstanceStatus) -> StoreFuture<'_, u64> {
        let workflow = workflow.to_string();
        Box::pin(async move { reads::count(&self.reader().await?, &workflow, status).await })
    }

    fn claim(
        &self,
        owner: &str,
        workflows: &[WorkflowName],
        now: Timestamp,
        ttl: Duration,
        limit: usize,
    ) -> StoreFuture<'_, Vec<Claimed>> {
        let reply = self.write(Op::Claim {
            owner: owner.to_owned(),
            workflows: names(workflows),
            now,
            ttl,
            limit,
        });
        Box::pin(async move {
            match reply.await? {
                Reply::Claimed(c) => Ok(c),
                _ => Err(unexpected()),
            }
        })
    }

    fn reclaim(
        &self,
        owner: &str,
        lease: Lease,
        now: Timestamp,
        ttl: Duration,
    ) -> StoreFuture<'_, Lease> {
        let reply = self.write(Op::Reclaim {
            owner: owner.to_owned(),
            lease,
            now,
            ttl,
        });
        Box::pin(async move {
            match reply.await? {
                Reply::Reclaimed(l) => Ok(l),
                _ => Err(unexpected()),
            }
        })
    }

    fn renew(
        &self,
        owner: &str,
        leases: Vec<Lease>,
        now: Timestamp,
        until: Timestamp,
    ) -> StoreFuture<'_, Vec<Lease>> {
        let reply = self.write(Op::Renew {
            owner: owner.to_owned(),
            leases,
            now,
            until,
        });
        Box::pin(async move {
            match reply.await? {
                Reply::Renewed(r) => Ok(r),
                _ => Err(unexpected()),
            }
        })
    }

    fn release_all(&self, owner: &str) -> StoreFuture<'_, ()> {
        let reply = self.write(Op::ReleaseAll {
            owner: owner.to_owned(),
        });
        Box::pin(async move {
            match reply.await? {
                Reply::Done => Ok(()),
                _ => Err(unexpected()),
            }
        })
    }

    fn journal(&self, instance: InstanceRef) -> StoreFuture<'_, Vec<cairn_core::StepRecord>> {
        Box::pin(async move { reads::journal(&self.reader().await?, instance).await })
    }

    fn stream_chunk(
        &self,
        instance: InstanceRef,
        step: cairn_core::StepKey,
        attempt: u32,
        epoch: u64,
        index: u32,
    ) -> StoreFuture<'_, Option<Vec<u8>>> {
        Box::pin(async move {
            reads::stream_chunk(
                &self.reader().await?,
                instance,
                &step,
                attempt,
                epoch,
                index,
            )
            .await
        })
    }

    fn stream_bytes(&self, instance: InstanceRef) -> StoreFuture<'_, u64> {
        Box::pin(async move { reads::stream_bytes(&self.reader().await?, instance).await })
    }

    fn children(&self, parent: InstanceRef) -> StoreFuture<'_, Vec<InstanceRecord>> {
        Box::pin(async move { reads::children(&self.reader().await?, parent).await })
    }

    fn slot_position(&self, instance: InstanceRef) -> StoreFuture<'_, Option<u64>> {
        Box::pin(async move { slots::position(&self.reader().await?, instance).await })
    }

    fn waiting_for_slots(
        &self,
        workflow: &WorkflowName,
        limit: usize,
    ) -> StoreFuture<'_, (Vec<(String, u64)>, u64)> {
        let workflow = workflow.to_string();
        Box::pin(async move { slots::waiting(&self.reader().await?, &workflow, limit).await })
    }

    fn commit(&self, lease: Lease, writes: Vec<Write>) -> StoreFuture<'_, InstanceStatus> {
        let reply = self.write(Op::Commit { lease, writes });
        Box::pin(async move {
            match reply.await? {
                Reply::Status(s) => Ok(s),
                _ => Err(unexpected()),
            }
        })
    }

    fn control(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
        request: ControlRequest,
    ) -> StoreFuture<'_, ControlOutcome> {
        let reply = self.write(Op::Control {
            workflow: workflow.to_string(),
            id: id.to_string(),
            request,
        });
        Box::pin(async move {
            match reply.await? {
                Reply::Control(c) => Ok(c),
                _ => Err(unexpected()),
            }
        })
    }

    fn log(
        &self,
        instance: InstanceRef,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, Vec<cairn_core::LogRecord>> {
        Box::pin(async move { history::log(&self.reader().await?, instance, after, limit).await })
    }

    fn workflow_log(
        &self,
        workflow: &WorkflowName,
        after: u64,
        limit: usize,
    ) -> StoreFuture<'_, cairn_store::WorkflowLogPage> {
        let workflow = workflow.to_string();
        Box::pin(async move {
            history::workflow_log(&self.reader().await?, &workflow, after, limit).await
        })
    }

    fn log_head(&self) -> StoreFuture<'_, u64> {
        Box::pin(async move { reads::log_head(&self.reader().await?).await })
    }

    fn next_ready(&self, workflows: &[WorkflowName]) -> StoreFuture<'_, Option<Timestamp>> {
        let workflows = names(workflows);
        Box::pin(async move { reads::next_ready(&self.reader().await?, &workflows).await })
    }

    fn timers(&self, workflow: &WorkflowName, now: Timestamp) -> StoreFuture<'_, Timers> {
        let workflow = workflow.to_string();
        Box::pin(async move { reads::timers(&self.reader().await?, &workflow, now).await })
    }

    fn send_event(
        &self,
        workflow: &WorkflowName,
        id: &InstanceId,
        event: NewEvent,
    ) -> StoreFuture<'_, Sent> {
        let reply = self.write(Op::SendEvent {
            workflow: workflow.to_string(),
            id: id.to_string(),
            event,
        });
        Box::pin(async move {
            match reply.await? {
                Reply::Sent(s) => Ok(s),
                _ => Err(unexpected()),
            }
        })
    }

    fn take_event(
        &self,
        lease: Lease,
        step: StepKey,
        event_type: EventType,
        at: Timestamp,
    ) -> StoreFuture<'_, Option<StoredEvent>> {
        let reply = self.write(Op::TakeEvent {
            lease,
            step,
            event_type,
            at,
        });
        Box::pin(async move {
            match reply.await? {
                Reply::Taken(t) => Ok(t),
                _ => Err(unexpected()),
            }
        })
    }

    fn purge(&self, now: Timestamp, limit: usize) -> StoreFuture<'_, usize> {
        let reply = self.write(Op::Purge { now, limit });
        Box::pin(async move {
            match reply.await? {
                Reply::Purged(n) => Ok(n),
                _ => Err(unexpected()),
            }
        })
    }

    fn next_purge(&self) -> StoreFuture<'_, Option<Timestamp>> {
        Box::pin(async move { reads::next_purge(&self.reader().await?).await })
    }

    fn create_schedule(&self, schedule: cairn_store::StoredSchedule) -> StoreFuture<'_, bool> {
        Box::pin(async move { reads::create_schedule(&self.reader().await?, &schedule).await })
    }

    fn set_schedule_state(
        &self,
        name: &str,
        state: cairn_store::ScheduleState,
    ) -> StoreFuture<'_, bool> {
        let name = name.to_owned();
        Box::pin(
            async move { reads::set_schedule_state(&self.reader().await?, &name, &state).await },
        )
    }

    fn schedules(&self) -> StoreFuture<'_, Vec<cairn_store::StoredSchedule>> {
        Box::pin(async move { reads::schedules(&self.reader().await?).await })
    }

    fn delete_schedule(&self, name: &str, declared: bool) -> StoreFuture<'_, bool> {
        let name = name.to_owned();
        Box::pin(
            async move { reads::delete_schedule(&self.reader().await?, &name, declared).await },
        )
    }

    fn fire_tick(
        &self,
        tick: cairn_store::ScheduleTick,
    ) -> StoreFuture<'_, cairn_store::TickFired> {
        let reply = self.write(Op::FireTick(Box::new(tick)));
        Box::pin(async move {
            match reply.await? {
                Reply::Fired(fired) => Ok(fired),
                _ => Err(unexpected()),
            }
        })
    }

    fn register_versions(
        &self,
        versions: Vec<cairn_store::WorkflowVersion>,
    ) -> StoreFuture<'_, ()> {
        Box::pin(async move { reads::register_versions(&self.reader().await?, &versions).await })
    }

    fn workflow_versions(&self) -> StoreFuture<'_, Vec<cairn_store::WorkflowVersion>> {
        Box::pin(async move { reads::workflow_versions(&self.reader().await?).await })
    }

    fn unfinished_versions(
        &self,
        workflow: &WorkflowName,
    ) -> StoreFuture<'_, Vec<(Option<String>, u64)>> {
        let workflow = workflow.to_string();
        Box::pin(async move { reads::unfinished_versions(&self.reader().await?, &workflow).await })
    }

    fn wake_awaiting(
        &self,
        workflow: &WorkflowName,
        version: &str,
        limit: u64,
    ) -> StoreFuture<'_, u64> {
        let reply = self.write(Op::WakeAwaiting {
            workflow: workflow.to_string(),
            version: version.to_owned(),
            limit,
        });
        Box::pin(async move {
            match reply.await? {
                Reply::Woken(n) => Ok(n),
                _ => Err(unexpected()),
            }
        })
    }

    fn changes(&self) -> Option<futures::stream::BoxStream<'static, cairn_store::Changes>> {
        let (sender, _) = self.listener.as_ref()?;
        let receiver = sender.subscribe();
        Some(Box::pin(futures::stream::unfold(
            receiver,
            |mut rx| async move {
                match rx.recv().await {
                    Ok(changes) => Some((changes, rx)),
                    // Notices were missed: anything may have changed.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Some((
                        cairn_store::Changes {
                            claimable: true,
                            instances: None,
                        },
                        rx,
                    )),
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => None,
                }
            },
        )))
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        let writer = self.writer.lock().ok().and_then(|mut w| w.take());
        let task = self.writer_task.lock().ok().and_then(|mut t| t.take());
        Box::pin(async move {
            // The writer finishes what was queued, then ends when the channel closes.
            drop(writer);
            if let Some(task) = task {
                let _ = task.await;
            }
            if let Some((_, listener)) = &self.listener {
                listener.abort();
            }
            self.pool.close();
            Ok(())
        })
    }
}

/// The test server's URL from `CAIRN_TEST_PG_URL` (`.ci/run` starts one and sets it).
/// Without it, tests that need PostgreSQL skip, and say so on the terminal (written past
/// the test harness's output capture, once per process): a skip must never pass silently.
#[doc(hidden)]
pub fn test_url() -> Option<String> {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let url = std::env::var("CAIRN_TEST_PG_URL")
        .ok()
        .filter(|u| !u.is_empty());
    if url.is_none() {
        WARNED.call_once(|| {
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "\n*** SKIPPED: PostgreSQL tests need CAIRN_TEST_PG_URL (a throw-away server; \
                 `.ci/postgres.sh start DIR` starts one and prints its URL) ***\n"
            );
        });
    }
    url
}

/// Shows in the summary, as ignored, that the store's tests did not run.
#[cfg(all(test, not(cairn_test_pg)))]
#[test]
#[ignore = "CAIRN_TEST_PG_URL was not set when the tests were built: the PostgreSQL store's conformance and own tests did not run (.ci/postgres.sh start DIR starts a server)"]
fn postgres_store_tests_were_not_built() {
    panic!("set CAIRN_TEST_PG_URL to a PostgreSQL server's URL and run the tests again");
}

#[cfg(test)]
#[cfg(cairn_test_pg)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A fresh store in a schema of its own, on the server `CAIRN_TEST_PG_URL` names.
    pub(crate) async fn factory() -> Option<Arc<dyn Store>> {
        static N: AtomicU32 = AtomicU32::new(0);
        let url = test_url()?;
        let schema = format!(
            "t_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let store = PostgresStore::open(Options::new(url).schema(&schema).connections(3))
            .await
            .expect("open");
        Some(Arc::new(store))
    }

    cairn_store::conformance_tests!(optional factory);

    /// A schema name unique to this test run.
    fn fresh(prefix: &str) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        format!(
            "{prefix}{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Creates an instance and claims it, then commits under the lease (which sends a
    /// notice): what every engine does first.
    async fn works(store: &PostgresStore) {
        use cairn_core::{InstanceId, LogEntry, LogKind, Timestamp, WorkflowName};
        let workflow = WorkflowName::new("w").unwrap();
        let at = Timestamp::from_millis(1_000);
        store
            .create(vec![cairn_store::NewInstance {
                workflow: workflow.clone(),
                id: InstanceId::new("i").unwrap(),
                params: "{}".into(),
                created_at: at,
                queued: LogEntry {
                    kind: LogKind::WorkflowQueued,
                    at,
                    step: None,
                    meta: serde_json::json!({}),
                },
                retention: cairn_store::Retention {
                    success: Duration::from_secs(60),
                    error: Duration::from_secs(60),
                },
                parent: None,
                priority: 0,
                concurrency: None,
                version: None,
            }])
            .await
            .unwrap();
        let claimed = store
            .claim("o", &[workflow], at, Duration::from_secs(30), 1)
            .await
            .unwrap();
        store
            .commit(
                claimed[0].lease,
                vec![cairn_store::Write::Log(LogEntry {
                    kind: LogKind::WorkflowStart,
                    at,
                    step: None,
                    meta: serde_json::json!({}),
                })],
            )
            .await
            .expect("a commit (and its notice) in this schema");
    }

    /// Issue 30 §1.4: every name that passes the check works (reserved words, 63 bytes,
    /// whose channel would be too long), and what PostgreSQL would refuse or cut is refused
    /// at open with a message that says why, before anything is written.
    #[tokio::test]
    async fn schema_names_postgres_would_refuse_are_refused_at_open_and_the_rest_work() {
        let Some(url) = test_url() else { return };
        let long = {
            let head = fresh("l");
            format!("{head}{}", "x".repeat(63 - head.len()))
        };
        assert_eq!(long.len(), 63);
        for schema in ["user".to_owned(), "order".to_owned(), long] {
            let store = PostgresStore::open(Options::new(&url).schema(&schema).connections(2))
                .await
                .unwrap_or_else(|e| panic!("{schema}: {e}"));
            works(&store).await;
            store.close().await.unwrap();
            let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
            tokio::spawn(connection);
            client
                .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
                .await
                .unwrap();
        }
        for (schema, says) in [
            ("a".repeat(64), "at most 63"),
            ("pg_mine".to_owned(), "reserves names starting with pg_"),
            ("Mixed".to_owned(), "lower-case letters"),
            ("1st".to_owned(), "not starting with a digit"),
            ("semi;colon".to_owned(), "lower-case letters"),
            (String::new(), "empty"),
        ] {
            let error = PostgresStore::open(Options::new(&url).schema(&schema))
                .await
                .expect_err(&schema)
                .to_string();
            assert!(error.contains(says), "{schema:?}: {error}");
        }
    }

    /// Issue 30 §5: a listener that stops reading (here a `psql` that is not read from; in
    /// life an engine SIGSTOPped) would hold PostgreSQL's notification queue until it is
    /// full and every write fails: past the limit, writes send no notices and the stuck
    /// listener is ended.
    #[tokio::test]
    async fn a_listener_that_stops_reading_is_ended_and_writes_go_on() {
        let Some(url) = test_url() else { return };
        let schema = fresh("q");
        let mut options = Options::new(&url).schema(&schema).connections(2);
        options.notify_queue_limit = 0.0;
        options.stuck_listener_after = Duration::from_millis(500);
        let store = PostgresStore::open(options).await.unwrap();
        let listener_name = format!("cairn-listen:{schema}");
        let sep = if url.contains('?') { '&' } else { '?' };
        let mut psql = std::process::Command::new("psql")
            .args([
                "-X",
                "-q",
                "-d",
                &format!("{url}{sep}application_name={listener_name}"),
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("psql (Debian's postgresql-client) runs");
        use std::io::Write as _;
        let mut stdin = psql.stdin.take().unwrap();
        writeln!(stdin, "LISTEN \"cairn_{schema}\";").unwrap();
        stdin.flush().unwrap();
        let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
        tokio::spawn(connection);
        let listeners = || async {
            client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                    &[&listener_name],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while listeners().await < 2 {
            assert!(std::time::Instant::now() < deadline, "psql never listened");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Enough notices to fill psql's socket: its backend then waits to write to it.
        client
            .execute(
                &format!(
                    "SELECT pg_notify('cairn_{schema}', g::text || repeat('x', 1000))
                     FROM generate_series(1, 20000) AS g"
                ),
                &[],
            )
            .await
            .unwrap();
        while listeners().await > 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "the stuck listener was not ended"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        works(&store).await;
        drop(stdin);
        let _ = psql.kill();
        let _ = psql.wait();
        store.close().await.unwrap();
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    }

    /// Issue 30 §5: an engine that opens while another migrates its schema waits for that
    /// migration (it used to give up after the session's 10 s lock timeout), then opens.
    #[tokio::test]
    async fn an_engine_opening_while_another_migrates_waits_for_it() {
        let Some(url) = test_url() else { return };
        let schema = fresh("m");
        let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
        client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock(hashtext('cairn_schema.{schema}'));"
            ))
            .await
            .unwrap();
        let opening = tokio::spawn({
            let url = url.clone();
            let schema = schema.clone();
            async move { PostgresStore::open(Options::new(url).schema(schema)).await }
        });
        // Longer than the hot path's lock timeout.
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert!(
            !opening.is_finished(),
            "it gave up (or did not wait): {:?}",
            opening.await.unwrap().map(|_| ())
        );
        client.batch_execute("COMMIT").await.unwrap();
        let store = tokio::time::timeout(Duration::from_secs(30), opening)
            .await
            .expect("it did not open once the migration was done")
            .unwrap()
            .expect("open");
        works(&store).await;
        store.close().await.unwrap();
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    }
}
