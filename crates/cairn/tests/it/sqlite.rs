//! The behaviour tests on SQLite.

on_backend!(crate::support::Backend::Sqlite);
