//! The HTTP API's tests, one binary: the routes through the router, and real sockets.

#![allow(clippy::unwrap_used, missing_docs)] // helpers outside #[test] fns unwrap too (clippy.toml covers only those)

mod api;
mod connections;
