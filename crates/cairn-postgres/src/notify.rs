//! Wake-ups across engines: `LISTEN/NOTIFY` as a hint, polling as the fallback.
//!
//! Each writing transaction that changed something another engine may care about sends one
//! `pg_notify` (at most one per batch: PostgreSQL serialises the commits of notifying
//! transactions on one queue lock, so one per row would cost throughput). The payload
//! names the deployment (the oid of the schema the tables live in) and the sending store
//! (so an engine ignores its own), whether something may have become claimable, and the
//! instances written: `Written`, `Stopped` at an epoch (terminate, restart, delete), or
//! `Controlled` (pause, resume). A batch touching too many instances to list sends `*`:
//! any may have changed.
//!
//! A deployment is the schema its tables live in, resolved at open (`current_schema()`,
//! also when the schema comes from the connection's `search_path`): its name gives the
//! channel ([`channel_for`]) and its oid tags every notice, since instances are named by
//! number and another deployment in the same database numbers its own from 1 too.
//!
//! A listener task per store holds one connection of its own with `LISTEN` and hands the
//! notices to the engine ([`cairn_store::Store::changes`]). It reconnects with back-off;
//! after a reconnect it reports "anything may have changed", since notices sent while it
//! was away are lost. Notices are hints: the engine's scheduler still polls.

use std::sync::Arc;
use std::time::Duration;

use cairn_store::{ChangeKind, Changed, Changes, InstanceRef};
use deadpool_postgres::Transaction;
use futures::StreamExt;
use tokio::sync::broadcast;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::batch::Batch;
use crate::db::Failure;

/// PostgreSQL refuses payloads of 8000 bytes or more.
const MAX_PAYLOAD: usize = 7_900;

/// PostgreSQL's longest identifier, which a channel name is.
const MAX_CHANNEL: usize = 63;

/// Whose notices these are: the deployment's channel and schema oid, and this store.
#[derive(Debug, Clone)]
pub(crate) struct Deployment {
    pub(crate) channel: String,
    pub(crate) schema_oid: u32,
    /// This store, so that it ignores its own notices.
    pub(crate) origin: u64,
    /// The `application_name` of the deployment's listeners (`cairn-listen:<schema>`).
    pub(crate) listener_name: String,
    /// How full PostgreSQL's notification queue is, as the listener last looked.
    pub(crate) queue: Arc<QueueWatch>,
}

/// PostgreSQL's notification queue, watched: a listener that stops reading (its engine was
/// SIGSTOPped, say) holds the queue's tail, and once the queue is full every transaction
/// that notifies fails, which would fail every write of every engine. So the listener
/// looks every few seconds: past [`QueueWatch::limit`] full, writes stop notifying (notices
/// are hints; engines poll) and the deployment's listeners stuck writing to their client
/// for longer than [`QueueWatch::stuck_after`] are ended (their engines reconnect, and
/// catch up by looking at everything).
#[derive(Debug)]
pub(crate) struct QueueWatch {
    full: std::sync::atomic::AtomicBool,
    /// A write skipped its notice since the queue was last seen below the limit: once it
    /// is, one notice naming no instance makes up for all of them.
    skipped: std::sync::atomic::AtomicBool,
    limit: f64,
    stuck_after: Duration,
}

impl QueueWatch {
    pub(crate) fn new(limit: f64, stuck_after: Duration) -> Self {
        QueueWatch {
            full: std::sync::atomic::AtomicBool::new(false),
            skipped: std::sync::atomic::AtomicBool::new(false),
            limit,
            stuck_after,
        }
    }

    /// Whether writes should skip their notices for now.
    fn full(&self) -> bool {
        self.full.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// How often a listener looks at the notification queue.
const QUEUE_LOOK: Duration = Duration::from_secs(5);

/// The channel of the deployment in `schema`: `cairn_<schema>`, or, where that would be
/// longer than an identifier may be, the schema's first 40 characters and a hash of the
/// whole name (the notices' schema oid tells deployments apart even then).
pub(crate) fn channel_for(schema: &str) -> String {
    let plain = format!("cairn_{schema}");
    if plain.len() <= MAX_CHANNEL {
        return plain;
    }
    // FNV-1a: stable across builds, so engines of different versions share the channel.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in schema.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let head: String = schema.chars().take(40).collect();
    format!("cairn_{head}_{hash:016x}")
}

/// Sends a batch's notice.
#[derive(Debug, Clone)]
pub(crate) struct Notifier {
    /// `None`: notices are off.
    deployment: Option<Deployment>,
}

impl Notifier {
    pub(crate) fn new(deployment: Option<Deployment>) -> Self {
        Notifier { deployment }
    }

    /// Queues the notice of what `b` changed; PostgreSQL delivers it at the commit.
    pub(crate) async fn send(&self, tx: &Transaction<'_>, b: &Batch<'_>) -> Result<(), Failure> {
        let Some(deployment) = &self.deployment else {
            return Ok(());
        };
        if b.changes.is_empty() && !b.claimable {
            return Ok(());
        }
        if deployment.queue.full() {
            // A notify into a full queue would fail this write. Made up for once the queue
            // drains (`watch_queue`); other engines poll meanwhile.
            deployment
                .queue
                .skipped
                .store(true, std::sync::atomic::Ordering::Relaxed);
            return Ok(());
        }
        let payload = encode(deployment, b.claimable, &b.changes);
        let st = tx.prepare_cached("SELECT pg_notify($1, $2)").await?;
        tx.execute(&st, &[&deployment.channel, &payload]).await?;
        Ok(())
    }
}

fn encode(deployment: &Deployment, claimable: bool, changes: &[Changed]) -> String {
    let head = format!("{:x}.{:x}", deployment.schema_oid, deployment.origin);
    let mut out = format!("{head} {}", u8::from(claimable));
    for c in changes {
        let entry = match c.kind {
            ChangeKind::Written => format!(" {}", c.instance.0),
            ChangeKind::Stopped { epoch } => format!(" {}!{epoch}", c.instance.0),
            ChangeKind::Controlled => format!(" {}?", c.instance.0),
        };
        if out.len() + entry.len() > MAX_PAYLOAD {
            return format!("{head} {} *", u8::from(claimable));
        }
        out.push_str(&entry);
    }
    out
}

/// The notice in `payload`, unless this store sent it, another deployment did (or an
/// engine of a build that did not name its deployment), or it does not parse.
fn decode(deployment: &Deployment, payload: &str) -> Option<Changes> {
    let mut parts = payload.split(' ');
    let (schema, origin) = parts.next()?.split_once('.')?;
    if u32::from_str_radix(schema, 16).ok()? != deployment.schema_oid {
        return None;
    }
    if u64::from_str_radix(origin, 16).ok()? == deployment.origin {
        return None;
    }
    let claimable = parts.next()? == "1";
    let mut instances = Vec::new();
    for entry in parts {
        if entry == "*" {
            return Some(Changes {
                claimable,
                instances: None,
            });
        }
        let (iid, kind) = if let Some(iid) = entry.strip_suffix('?') {
            (iid, ChangeKind::Controlled)
        } else if let Some((iid, epoch)) = entry.split_once('!') {
            (
                iid,
                ChangeKind::Stopped {
                    epoch: epoch.parse().ok()?,
                },
            )
        } else {
            (entry, ChangeKind::Written)
        };
        instances.push(Changed {
            instance: InstanceRef(iid.parse().ok()?),
            kind,
        });
    }
    Some(Changes {
        claimable,
        instances: Some(instances),
    })
}

/// Starts the listener (until its task is aborted, at the store's close); notices go to the
/// returned sender's subscribers.
pub(crate) fn listen(
    config: tokio_postgres::Config,
    deployment: Deployment,
) -> (broadcast::Sender<Changes>, tokio::task::JoinHandle<()>) {
    let (tx, _) = broadcast::channel(1024);
    let sender = tx.clone();
    let task = tokio::spawn(async move {
        let mut backoff = Duration::from_millis(100);
        let mut first = true;
        loop {
            match listen_once(&config, &deployment, &sender, first).await {
                Ok(()) => backoff = Duration::from_millis(100),
                Err(e) => {
                    tracing::warn!(error = %e, "listening for other engines' changes failed; reconnecting");
                }
            }
            first = false;
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    });
    (tx, task)
}

async fn listen_once(
    config: &tokio_postgres::Config,
    deployment: &Deployment,
    sender: &broadcast::Sender<Changes>,
    first: bool,
) -> Result<(), tokio_postgres::Error> {
    let mut config = config.clone();
    config.application_name(&deployment.listener_name);
    let (client, mut connection) = config.connect(NoTls).await?;
    let (messages_tx, mut messages) = futures::channel::mpsc::unbounded();
    let driver = tokio::spawn(async move {
        let mut stream = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = stream.next().await {
            match message {
                Ok(m) => {
                    if messages_tx.unbounded_send(m).is_err() {
                        break;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "listener connection ended");
                    break;
                }
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN \"{}\"", deployment.channel))
        .await?;
    if !first {
        // Notices sent while this was away are lost: anything may have changed.
        let _ = sender.send(Changes {
            claimable: true,
            instances: None,
        });
    }
    let mut look = tokio::time::interval(QUEUE_LOOK);
    loop {
        tokio::select! {
            message = messages.next() => {
                let Some(message) = message else { break };
                if let AsyncMessage::Notification(n) = message
                    && let Some(changes) = decode(deployment, n.payload())
                {
                    let _ = sender.send(changes);
                }
            }
            _ = look.tick() => {
                let was_full = deployment.queue.full();
                if let Err(e) = watch_queue(&client, deployment).await {
                    tracing::debug!(error = %e, "looking at the notification queue failed");
                }
                // While the queue is full no engine sends notices (`Notifier::send`), and
                // the ones skipped are never sent: so each look of a full queue, and the
                // first after it drained, tells this engine that anything may have
                // changed, as a reconnect does. Its lifetimes read their statuses (and
                // renew their leases early), and waits in memory look for their events
                // and children, instead of learning nothing until they hibernate.
                if was_full || deployment.queue.full() {
                    let _ = sender.send(Changes {
                        claimable: true,
                        instances: None,
                    });
                }
            }
        }
    }
    driver.abort();
    drop(client);
    Ok(())
}

/// Looks at how full the notification queue is (see [`QueueWatch`]); past the limit, ends
/// the deployment's listeners stuck writing to their client.
async fn watch_queue(
    client: &tokio_postgres::Client,
    deployment: &Deployment,
) -> Result<(), tokio_postgres::Error> {
    let usage: f64 = client
        .query_one("SELECT pg_notification_queue_usage()", &[])
        .await?
        .get(0);
    let watch = &deployment.queue;
    let full = usage >= watch.limit;
    let was = watch.full.swap(full, std::sync::atomic::Ordering::Relaxed);
    if full {
        let stuck_ms = i64::try_from(watch.stuck_after.as_millis()).unwrap_or(i64::MAX);
        let ended = client
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE application_name = $1 AND pid <> pg_backend_pid()
                   AND wait_event = 'ClientWrite'
                   AND state_change < now() - make_interval(secs => $2::bigint / 1000.0)",
                &[&deployment.listener_name, &stuck_ms],
            )
            .await?
            .len();
        tracing::warn!(
            usage,
            stuck_listeners_ended = ended,
            "PostgreSQL's notification queue is filling up (a listener stopped reading); writes send no notices until it drains"
        );
    } else if was {
        tracing::info!(usage, "the notification queue drained; notices resume");
    }
    if !full
        && watch
            .skipped
            .swap(false, std::sync::atomic::Ordering::Relaxed)
    {
        // The notices this engine's writes skipped while the queue was full, as one that
        // names no instance: the other engines look at everything (`Changes`). Each
        // engine judges the queue on its own clock, so another may still think it full.
        let payload = format!("{} *", encode(deployment, true, &[]));
        if let Err(e) = client
            .execute("SELECT pg_notify($1, $2)", &[&deployment.channel, &payload])
            .await
        {
            // Sent at the next look instead.
            watch
                .skipped
                .store(true, std::sync::atomic::Ordering::Relaxed);
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn notices_round_trip_and_own_ones_are_ignored() {
        let changes = vec![
            Changed {
                instance: InstanceRef(7),
                kind: ChangeKind::Written,
            },
            Changed {
                instance: InstanceRef(8),
                kind: ChangeKind::Stopped { epoch: 3 },
            },
            Changed {
                instance: InstanceRef(9),
                kind: ChangeKind::Controlled,
            },
        ];
        let ours = |origin| Deployment {
            channel: "cairn_public".into(),
            schema_oid: 2200,
            origin,
            listener_name: "cairn-listen:public".into(),
            queue: Arc::new(QueueWatch::new(0.5, Duration::from_secs(30))),
        };
        let payload = encode(&ours(0xabc), true, &changes);
        assert_eq!(decode(&ours(0xabc), &payload), None, "own notice");
        let elsewhere = Deployment {
            schema_oid: 16_384,
            ..ours(1)
        };
        assert_eq!(
            decode(&elsewhere, &payload),
            None,
            "another deployment's notice (its instances number from 1 too)"
        );
        assert_eq!(
            decode(&ours(1), &payload),
            Some(Changes {
                claimable: true,
                instances: Some(changes)
            })
        );
        let many: Vec<Changed> = (0..5_000)
            .map(|i| Changed {
                instance: InstanceRef(i),
                kind: ChangeKind::Written,
            })
            .collect();
        let payload = encode(&ours(5), false, &many);
        assert!(payload.len() <= MAX_PAYLOAD);
        assert_eq!(
            decode(&ours(1), &payload),
            Some(Changes {
                claimable: false,
                instances: None
            })
        );
        assert_eq!(decode(&ours(1), "zz 1 4"), None, "garbage is ignored");
        assert_eq!(
            decode(&ours(1), "abc 1 4"),
            None,
            "an untagged notice (an older build's) is ignored"
        );
    }

    #[test]
    fn channels_fit_an_identifier_and_stay_apart() {
        assert_eq!(channel_for("public"), "cairn_public");
        let long = "a".repeat(63);
        let longer = format!("{}b", "a".repeat(62));
        for schema in [&long, &longer] {
            assert!(channel_for(schema).len() <= MAX_CHANNEL, "{schema}");
        }
        assert_ne!(channel_for(&long), channel_for(&longer));
    }
}
