//! What the operations of one writing transaction share ([`Batch`]) and the helpers
//! they run statements with.

use cairn_store::{ChangeKind, Changed, InstanceRef};
use deadpool_postgres::Transaction;
use tokio_postgres::types::ToSql;

use crate::db::Failure;
use crate::history::{Configs, Pending};

pub(crate) type R<T> = Result<T, Failure>;

/// What the operations of one transaction share: the records they wrote (inserted at the
/// end, see `history.rs`), the configuration ids, and whether the current operation wrote.
pub(crate) struct Batch<'c> {
    pub(crate) log: Pending,
    pub(crate) configs: &'c Configs,
    pub(crate) wrote: bool,
    /// What other engines hear of at the commit (`notify.rs`).
    pub(crate) changes: Vec<Changed>,
    pub(crate) claimable: bool,
}

impl<'c> Batch<'c> {
    pub(crate) fn new(configs: &'c Configs) -> Self {
        Batch {
            log: Pending::default(),
            configs,
            wrote: false,
            changes: Vec::new(),
            claimable: false,
        }
    }

    pub(crate) fn changed(&mut self, instance: InstanceRef, kind: ChangeKind) {
        self.changes.push(Changed { instance, kind });
    }

    /// Takes in what another operation of the same transaction wrote, after this one's.
    pub(crate) fn absorb(&mut self, other: Batch<'_>) {
        self.log.extend(other.log);
        self.changes.extend(other.changes);
        self.claimable |= other.claimable;
    }
}

/// Runs a writing statement.
pub(crate) async fn exec(
    tx: &Transaction<'_>,
    b: &mut Batch<'_>,
    sql: &str,
    args: &[&(dyn ToSql + Sync)],
) -> R<u64> {
    b.wrote = true;
    let st = tx.prepare_cached(sql).await?;
    Ok(tx.execute(&st, args).await?)
}

pub(crate) async fn query(
    tx: &Transaction<'_>,
    sql: &str,
    args: &[&(dyn ToSql + Sync)],
) -> R<Vec<tokio_postgres::Row>> {
    let st = tx.prepare_cached(sql).await?;
    Ok(tx.query(&st, args).await?)
}

pub(crate) async fn query_opt(
    tx: &Transaction<'_>,
    sql: &str,
    args: &[&(dyn ToSql + Sync)],
) -> R<Option<tokio_postgres::Row>> {
    let st = tx.prepare_cached(sql).await?;
    Ok(tx.query_opt(&st, args).await?)
}
