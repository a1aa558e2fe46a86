//! Cairn's behaviour tests, one binary (one link) with a module per area. Each test's name
//! starts with the SPEC §7 items it covers where it covers one.

#![allow(clippy::unwrap_used, missing_docs)] // helpers outside #[test] fns unwrap too (clippy.toml covers only those)
#![allow(clippy::duplicate_mod)] // the behaviour tests are compiled once per backend, on purpose

mod support;

/// The behaviour tests that hold on every backend, compiled once per backend (`sqlite.rs`,
/// `postgres.rs`): each module's `support` is the shared one with its engine builders
/// bound to that backend.
macro_rules! on_backend {
    ($backend:expr) => {
        #[allow(unreachable_pub, dead_code)]
        mod support {
            pub use crate::support::*;

            pub const BACKEND: Backend = $backend;

            /// A started engine on a fresh database of this backend.
            pub async fn engine(
                register: impl FnOnce(cairn::EngineBuilder) -> cairn::EngineBuilder,
            ) -> (cairn::Engine, tempfile::TempDir) {
                engine_on(BACKEND, register).await
            }

            /// A builder on the database `path` names, on this backend.
            pub fn builder_at(path: &std::path::Path) -> cairn::EngineBuilder {
                builder_on(BACKEND, path)
            }
        }

        #[path = "binary.rs"]
        mod binary;
        #[path = "binding_instances.rs"]
        mod binding_instances;
        #[path = "children.rs"]
        mod children;
        #[path = "commits.rs"]
        mod commits;
        #[path = "concurrency.rs"]
        mod concurrency;
        #[path = "context_retries.rs"]
        mod context_retries;
        #[path = "control.rs"]
        mod control;
        #[path = "engine_errors.rs"]
        mod engine_errors;
        #[path = "examples.rs"]
        mod examples;
        #[path = "leases.rs"]
        mod leases;
        #[path = "replay_check.rs"]
        mod replay_check;
        #[path = "retention.rs"]
        mod retention;
        #[path = "rollback.rs"]
        mod rollback;
        #[path = "rollback_property.rs"]
        mod rollback_property;
        #[path = "streams.rs"]
        mod streams;
        #[path = "time_events.rs"]
        mod time_events;
        #[path = "workers.rs"]
        mod workers;
    };
}

// Built only when CAIRN_TEST_PG_URL was set at build time (build.rs); otherwise the marker
// below shows in the summary as ignored, naming what did not run.
#[cfg(cairn_test_pg)]
mod postgres;
mod sqlite;

// SQLite only: crashes of a process that owns the database file, and hooked SQLite stores.
mod backup;
mod crash_kill;
mod crash_kill_children;
mod crash_kill_concurrency;
mod crash_kill_rollback;
mod crash_kill_schedule;
mod crash_kill_streams;
mod crash_kill_waits;
mod crash_nth_write;
mod examples_kit;
mod races;
mod reliability;
mod schedules;
mod simulate;
mod testing_kit;
mod traces;

// PostgreSQL only: several engines on one database, in one process and in several.
#[cfg(cairn_test_pg)]
mod crash_postgres;
#[cfg(cairn_test_pg)]
mod shared_store;

/// Shows in the summary, as ignored, what was not built without a PostgreSQL server.
#[cfg(not(cairn_test_pg))]
#[test]
#[ignore = "CAIRN_TEST_PG_URL was not set when the tests were built: the postgres:: copy of every behaviour test, crash_postgres:: and shared_store:: did not run (.ci/postgres.sh start DIR starts a server; set the URL it prints and run again)"]
fn postgres_tests_were_not_built() {
    panic!("set CAIRN_TEST_PG_URL to a PostgreSQL server's URL and run the tests again");
}
