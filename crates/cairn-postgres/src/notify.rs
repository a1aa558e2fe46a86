//! Wake-ups across engines: `LISTEN/NOTIFY` as a hint, polling as the fallback.
//!
//! Each writing transaction that changed something another engine may care about sends one
//! `pg_notify` (at most one per batch: PostgreSQL serialises the commits of notifying
//! transactions on one queue lock, so one per row would cost throughput). The payload
//! names the sending store (so an engine ignores its own), whether something may have
//! become claimable, and the instances written: `Written`, `Stopped` at an epoch
//! (terminate, restart, delete), or `Controlled` (pause, resume). A batch touching too many
//! instances to list sends `*`: any may have changed.
//!
//! A listener task per store holds one connection of its own with `LISTEN` and hands the
//! notices to the engine ([`cairn_store::Store::changes`]). It reconnects with back-off;
//! after a reconnect it reports "anything may have changed", since notices sent while it
//! was away are lost. Notices are hints: the engine's scheduler still polls.

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

/// Sends a batch's notice.
#[derive(Debug, Clone)]
pub(crate) struct Notifier {
    /// `None`: notices are off.
    channel: Option<String>,
    origin: u64,
}

impl Notifier {
    pub(crate) fn new(channel: Option<String>, origin: u64) -> Self {
        Notifier { channel, origin }
    }

    /// Queues the notice of what `b` changed; PostgreSQL delivers it at the commit.
    pub(crate) async fn send(&self, tx: &Transaction<'_>, b: &Batch<'_>) -> Result<(), Failure> {
        let Some(channel) = &self.channel else {
            return Ok(());
        };
        if b.changes.is_empty() && !b.claimable {
            return Ok(());
        }
        let payload = encode(self.origin, b.claimable, &b.changes);
        let st = tx.prepare_cached("SELECT pg_notify($1, $2)").await?;
        tx.execute(&st, &[channel, &payload]).await?;
        Ok(())
    }
}

fn encode(origin: u64, claimable: bool, changes: &[Changed]) -> String {
    let mut out = format!("{origin:x} {}", u8::from(claimable));
    for c in changes {
        let entry = match c.kind {
            ChangeKind::Written => format!(" {}", c.instance.0),
            ChangeKind::Stopped { epoch } => format!(" {}!{epoch}", c.instance.0),
            ChangeKind::Controlled => format!(" {}?", c.instance.0),
        };
        if out.len() + entry.len() > MAX_PAYLOAD {
            return format!("{origin:x} {} *", u8::from(claimable));
        }
        out.push_str(&entry);
    }
    out
}

/// The notice in `payload`, unless this store sent it (or it does not parse).
fn decode(own: u64, payload: &str) -> Option<Changes> {
    let mut parts = payload.split(' ');
    let origin = u64::from_str_radix(parts.next()?, 16).ok()?;
    if origin == own {
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
    channel: String,
    own: u64,
) -> (broadcast::Sender<Changes>, tokio::task::JoinHandle<()>) {
    let (tx, _) = broadcast::channel(1024);
    let sender = tx.clone();
    let task = tokio::spawn(async move {
        let mut backoff = Duration::from_millis(100);
        let mut first = true;
        loop {
            match listen_once(&config, &channel, own, &sender, first).await {
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
    channel: &str,
    own: u64,
    sender: &broadcast::Sender<Changes>,
    first: bool,
) -> Result<(), tokio_postgres::Error> {
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
        .batch_execute(&format!("LISTEN \"{channel}\""))
        .await?;
    if !first {
        // Notices sent while this was away are lost: anything may have changed.
        let _ = sender.send(Changes {
            claimable: true,
            instances: None,
        });
    }
    while let Some(message) = messages.next().await {
        if let AsyncMessage::Notification(n) = message
            && let Some(changes) = decode(own, n.payload())
        {
            let _ = sender.send(changes);
        }
    }
    driver.abort();
    drop(client);
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
        let payload = encode(0xabc, true, &changes);
        assert_eq!(decode(0xabc, &payload), None, "own notice");
        assert_eq!(
            decode(1, &payload),
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
        let payload = encode(5, false, &many);
        assert!(payload.len() <= MAX_PAYLOAD);
        assert_eq!(
            decode(1, &payload),
            Some(Changes {
                claimable: false,
                instances: None
            })
        );
        assert_eq!(decode(1, "zz 1 4"), None, "garbage is ignored");
    }
}
