//! The statements every step's commit runs, prepared once by the writer thread and held
//! for its connection's life.
//!
//! rusqlite's `prepare_cached` hashes a statement's whole text at every use, compares it
//! with the cached one, and moves the statement out of its LRU list and back: for the
//! three statements a step's commit runs (its log rows, its step row, the lease check) that
//! was about a tenth of the engine's instructions per no-op step, all of it on the one
//! writer thread, the serial part (BENCHMARKS.md). Held here, a use costs a `RefCell`
//! borrow. Everything else still goes through rusqlite's cache.

use std::cell::RefCell;
use std::ops::Deref;

use rusqlite::{Connection, PrepFlags, Statement};

/// A statement the writer holds; each is run from one place, with its text.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Held {
    /// `history::insert`: a log row.
    LogRow,
    /// `rows::upsert_step`: a step's row.
    StepRow,
    /// `rows::leased_status`: the fence of every lifetime's commit.
    Lease,
}

/// How many [`Held`] statements there are.
const HELD: usize = 3;

/// Where a write gets its statements: any connection from rusqlite's cache, the writer's
/// connection ([`Writer`]) from those it holds.
pub(crate) trait Statements {
    /// The connection, for everything not held.
    fn connection(&self) -> &Connection;

    /// Runs `f` with the statement `held`, whose text is `sql` (always the same for one
    /// `held`). The statement comes back reset, as rusqlite leaves it after `execute` and
    /// after a query's rows are dropped; every use binds all its parameters again.
    fn with_held<R>(
        &self,
        held: Held,
        sql: &'static str,
        f: impl FnOnce(&mut Statement<'_>) -> rusqlite::Result<R>,
    ) -> rusqlite::Result<R>;
}

impl Statements for Connection {
    fn connection(&self) -> &Connection {
        self
    }

    fn with_held<R>(
        &self,
        _: Held,
        sql: &'static str,
        f: impl FnOnce(&mut Statement<'_>) -> rusqlite::Result<R>,
    ) -> rusqlite::Result<R> {
        self.prepare_cached(sql).and_then(|mut st| f(&mut st))
    }
}

/// The writer thread's connection with its held statements. It derefs to the connection,
/// so a write job uses it as one.
pub(crate) struct Writer<'c> {
    conn: &'c Connection,
    /// Each with the text it was prepared from.
    held: [RefCell<Option<(&'static str, Statement<'c>)>>; HELD],
}

impl<'c> Writer<'c> {
    pub(crate) fn new(conn: &'c Connection) -> Self {
        Writer {
            conn,
            held: Default::default(),
        }
    }
}

impl Deref for Writer<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Statements for Writer<'_> {
    fn connection(&self) -> &Connection {
        self.conn
    }

    fn with_held<R>(
        &self,
        held: Held,
        sql: &'static str,
        f: impl FnOnce(&mut Statement<'_>) -> rusqlite::Result<R>,
    ) -> rusqlite::Result<R> {
        let Ok(mut slot) = self.held[held as usize].try_borrow_mut() else {
            // In use further up the stack (no caller does that): the cached one.
            return self.conn.with_held(held, sql, f);
        };
        // Prepared at its first use (persistent: it lives as long as the connection); a
        // failed prepare is not kept, the next use tries again.
        let (text, st) = match slot.take() {
            Some(held) => held,
            None => (
                sql,
                self.conn
                    .prepare_with_flags(sql, PrepFlags::SQLITE_PREPARE_PERSISTENT)?,
            ),
        };
        // Two call sites naming one `Held` with different texts would run each other's
        // statement whenever their parameter counts agree.
        debug_assert_eq!(text, sql, "{held:?} is held for another statement");
        f(&mut slot.insert((text, st)).1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_statement_is_prepared_once_and_reused_across_transactions() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER)").unwrap();
        let writer = Writer::new(&conn);
        let insert = |x: i64| {
            writer.with_held(Held::LogRow, "INSERT INTO t (x) VALUES (?1)", |st| {
                st.execute([x])
            })
        };
        for x in 0..3 {
            writer.execute_batch("BEGIN").unwrap();
            assert_eq!(insert(x).unwrap(), 1);
            writer
                .execute_batch(if x == 1 { "ROLLBACK" } else { "COMMIT" })
                .unwrap();
        }
        let count = |sql| {
            writer
                .with_held(Held::Lease, sql, |st| {
                    st.query_row([], |r| r.get::<_, i64>(0))
                })
                .unwrap()
        };
        assert_eq!(count("SELECT COUNT(*) FROM t"), 2);
        assert_eq!(count("SELECT COUNT(*) FROM t"), 2, "held after a query");
        // A failed prepare is not held: the next use prepares again.
        let missing = writer.with_held(Held::StepRow, "INSERT INTO u VALUES (1)", |st| {
            st.execute([])
        });
        assert!(missing.is_err());
        conn.execute_batch("CREATE TABLE u (x)").unwrap();
        let inserted = writer.with_held(Held::StepRow, "INSERT INTO u VALUES (1)", |st| {
            st.execute([])
        });
        assert_eq!(inserted.unwrap(), 1);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "is held for another statement")]
    fn one_held_statement_named_for_two_texts_is_caught_in_debug_builds() {
        let conn = Connection::open_in_memory().unwrap();
        let writer = Writer::new(&conn);
        let one = |sql| {
            writer.with_held(Held::Lease, sql, |st| {
                st.query_row([], |r| r.get::<_, i64>(0))
            })
        };
        assert_eq!(one("SELECT 1").unwrap(), 1_i64);
        let _ = one("SELECT 2");
    }

    #[test]
    fn a_held_statement_used_from_inside_its_own_use_falls_back_to_the_cache() {
        let conn = Connection::open_in_memory().unwrap();
        let writer = Writer::new(&conn);
        let sum = writer
            .with_held(Held::Lease, "SELECT 1", |outer| {
                let inner = writer.with_held(Held::Lease, "SELECT 1", |st| {
                    st.query_row([], |r| r.get::<_, i64>(0))
                })?;
                Ok(inner + outer.query_row([], |r| r.get::<_, i64>(0))?)
            })
            .unwrap();
        assert_eq!(sum, 2);
    }
}
