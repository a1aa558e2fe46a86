//! The behaviour tests on PostgreSQL (`CAIRN_TEST_PG_URL`; without it they run on SQLite,
//! after a loud notice).

on_backend!(crate::support::Backend::Postgres);
