//! The SQLite store's own tests beyond the conformance suite, one binary.

#![allow(clippy::unwrap_used, missing_docs)] // helpers outside #[test] fns unwrap too (clippy.toml covers only those)

mod lock;
mod recovery;
mod wal;
