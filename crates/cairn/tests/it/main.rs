//! Cairn's behaviour tests, one binary (one link) with a module per area. Each test's name
//! starts with the SPEC §7 items it covers where it covers one.

#![allow(clippy::unwrap_used, missing_docs)] // helpers outside #[test] fns unwrap too (clippy.toml covers only those)

mod support;

mod binding_instances;
mod context_retries;
mod control;
mod crash_kill;
mod crash_kill_rollback;
mod crash_kill_waits;
mod crash_nth_write;
mod engine_errors;
mod examples;
mod reliability;
mod retention;
mod rollback;
mod rollback_property;
mod time_events;
