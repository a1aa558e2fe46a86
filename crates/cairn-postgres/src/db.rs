//! Errors and the statement helpers every module uses.

use cairn_store::Error;
use tokio_postgres::error::SqlState;

pub(crate) fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::Corrupt(what.to_string())
}

/// A database error: the store is unavailable for now (connection lost, server restarting,
/// a conflict with another engine); nothing of the failed transaction was written.
pub(crate) fn map_pg(e: tokio_postgres::Error) -> Error {
    Error::Unavailable(describe(&e))
}

/// The error with the server's message and code when there is one.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("postgres: {} ({})", db.message(), db.code().code()),
        None => format!("postgres: {e}"),
    }
}

/// Whether running the same transaction again may succeed: a deadlock between engines or a
/// serialization failure, where PostgreSQL chose this transaction to give way.
pub(crate) fn is_conflict(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
    )
}

/// Why an operation inside a transaction failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The database refused a statement: the transaction is aborted.
    Db(tokio_postgres::Error),
    /// The operation's own answer (lease lost, not found, corrupt data).
    Store(Error),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Db(e)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Store(e)
    }
}

impl Failure {
    /// The error the caller sees.
    pub(crate) fn into_store(self) -> Error {
        match self {
            Failure::Db(e) => map_pg(e),
            Failure::Store(e) => e,
        }
    }

    /// See [`is_conflict`].
    pub(crate) fn is_conflict(&self) -> bool {
        matches!(self, Failure::Db(e) if is_conflict(e))
    }
}
