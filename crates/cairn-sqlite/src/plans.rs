//! The plan test: every query on a hot or user-facing path is an index seek or a bounded
//! range, never a full scan or a sort of the instances or log tables. Run against a
//! database with statistics, so the plans are the ones a real database gets.

use cairn_core::InstanceStatus;
use rusqlite::Connection;

use crate::rows;

/// A database of 3 workflows × 3,000 instances (mostly completed and due for purge some
/// day, some waiting with a timer, some queued), 3 log records each, and statistics.
fn populated() -> Connection {
    let mut conn = Connection::open_in_memory().expect("open");
    crate::stable_plans(&conn).expect("stable plans");
    crate::schema::migrate(&mut conn).expect("migrate");
    conn.execute_batch(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 9000)
         INSERT INTO instances (workflow, id, status, params, created_at, ready_rank, ready_at,
                                purge_at, lease_owner, lease_until)
         SELECT 'w' || (i % 3), 'i' || i,
                CASE WHEN i % 10 = 0 THEN 7 WHEN i % 50 = 1 THEN 0 WHEN i % 97 = 0 THEN 1 ELSE 5 END,
                '{}', i,
                CASE WHEN i % 10 = 0 THEN 0 ELSE 1 END,
                CASE WHEN i % 10 = 0 THEN i + 1000000 WHEN i % 50 = 1 THEN i ELSE NULL END,
                CASE WHEN i % 10 > 1 AND i % 97 <> 0 THEN i + 600000 ELSE NULL END,
                CASE WHEN i % 97 = 0 THEN 'engine' ELSE NULL END,
                CASE WHEN i % 97 = 0 THEN 9000000000 ELSE NULL END
         FROM n;
         INSERT INTO log (iid, at, kind, meta)
         SELECT iid, created_at, k, '{}' FROM instances, (SELECT 1 AS k UNION ALL SELECT 2 UNION ALL SELECT 3);
         INSERT INTO events (iid, type, payload, at)
         SELECT iid, 'go', '{}', created_at FROM instances WHERE status = 7;
         ANALYZE;",
    )
    .expect("populate");
    conn
}

fn plan(conn: &Connection, sql: &str) -> Vec<String> {
    let mut st = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let nulls = vec![rusqlite::types::Value::Null; st.parameter_count()];
    let rows = st
        .query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))
        .expect("plan");
    rows.map(|r| r.expect("plan row")).collect()
}

/// Partial indexes whose rows are live work, not history: leased, pausing, or ready
/// instances. Walking one of them costs what is in flight, however much is stored.
const LIVE_INDEXES: &[&str] = &["instances_lease", "instances_pausing", "instances_ready"];

/// A full scan of a big table (also of a whole index) or a sort in a temporary B-tree.
fn grows_with_history(line: &str) -> bool {
    if LIVE_INDEXES
        .iter()
        .any(|i| line.ends_with(&format!("USING INDEX {i}")))
    {
        return false;
    }
    let scans = [
        "SCAN instances",
        "SCAN log",
        "SCAN l ",
        "SCAN i ",
        "SCAN events",
        "SCAN steps",
    ];
    scans
        .iter()
        .any(|s| line.starts_with(s) || line == s.trim_end())
        || line.contains("USE TEMP B-TREE")
}

#[test]
fn hot_queries_never_scan_or_sort_history() {
    let conn = populated();
    let mut queries: Vec<(&str, String)> = vec![
        ("claim: ready by rank", rows::CLAIM_READY_SQL.into()),
        ("claim: expired leases", rows::CLAIM_EXPIRED_SQL.into()),
        ("next wake-up", rows::NEXT_READY_SQL.into()),
        ("count by status", rows::COUNT_SQL.into()),
        ("timers", rows::TIMERS_SQL.into()),
        ("instance by key", rows::INSTANCE_KEY_SQL.into()),
        ("instance log tail", crate::history::LOG_SQL.into()),
        ("workflow log tail", crate::history::WORKFLOW_LOG_SQL.into()),
        ("take an event", rows::TAKE_EVENT_SQL.into()),
        ("due purges", rows::DUE_PURGES_SQL.into()),
        ("next purge", rows::NEXT_PURGE_SQL.into()),
        ("start-up: leases", crate::TAKE_OVER_LEASES_SQL.into()),
        ("start-up: pending pauses", crate::PENDING_PAUSES_SQL.into()),
        ("children of a parent", rows::children_sql()),
        ("slots: an instance's key", crate::slots::KEY_SQL.into()),
        ("slots: a key's limits", crate::slots::LIMITS_SQL.into()),
        ("slots: wake the waiting", crate::slots::WAKE_SQL.into()),
        ("slots: place in line", crate::slots::POSITION_SQL.into()),
    ];
    let workflow = Some(cairn_core::WorkflowName::new("wf").unwrap());
    for statuses in [vec![], vec![InstanceStatus::Running]] {
        for after in [None, Some(cairn_store::InstanceRef(5))] {
            for oldest_first in [false, true] {
                let query = cairn_store::ListQuery {
                    workflow: workflow.clone(),
                    statuses: statuses.clone(),
                    after,
                    oldest_first,
                    limit: 50,
                    ..Default::default()
                };
                queries.push(("list", rows::list_sql(&query).0));
            }
        }
    }
    // The dashboard's filters: several statuses, a creation range and an id prefix read
    // the listing's order and filter; they never sort.
    let filtered = cairn_store::ListQuery {
        workflow,
        statuses: vec![InstanceStatus::Running, InstanceStatus::Errored],
        created_from: Some(cairn_core::Timestamp::from_millis(1)),
        created_before: Some(cairn_core::Timestamp::from_millis(2)),
        id_prefix: Some("a".into()),
        after: Some(cairn_store::InstanceRef(5)),
        oldest_first: false,
        limit: 50,
    };
    queries.push(("list with every filter", rows::list_sql(&filtered).0));
    let mut bad = Vec::new();
    for (name, sql) in &queries {
        let lines = plan(&conn, sql);
        if lines.iter().any(|l| grows_with_history(l)) {
            bad.push(format!("{name}: {lines:?}\n  {sql}"));
        }
    }
    assert!(
        bad.is_empty(),
        "queries whose cost grows with history:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checker_sees_a_full_scan() {
    let conn = populated();
    let lines = plan(
        &conn,
        "SELECT * FROM instances WHERE params = '{}' ORDER BY created_at",
    );
    assert!(lines.iter().any(|l| grows_with_history(l)), "{lines:?}");
}

/// Runs each statement with five different bindings and says which were compiled again.
fn compiled_again(conn: &Connection, statements: &[&str]) -> Vec<String> {
    conn.execute_batch("BEGIN").expect("begin");
    let mut again = Vec::new();
    for sql in statements {
        let mut st = conn.prepare(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        let count = st.parameter_count();
        for i in 1..6i64 {
            let values: Vec<rusqlite::types::Value> = (0..count)
                .map(|p| match p % 2 {
                    0 => rusqlite::types::Value::Integer(i * 97 + p as i64),
                    _ => rusqlite::types::Value::Text(format!("w{}", i % 3)),
                })
                .collect();
            let mut rows = st
                .query(rusqlite::params_from_iter(values))
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            while rows
                .next()
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .is_some()
            {}
        }
        if st.get_status(rusqlite::StatementStatus::RePrepare) > 0 {
            again.push((*sql).to_owned());
        }
    }
    conn.execute_batch("ROLLBACK").expect("rollback");
    again
}

/// Statements run per claim, per event, per log read and per slot, with parameters
/// SQLite's statistics or partial indexes look at.
const HOT: &[&str] = &[
    rows::CLAIM_READY_SQL,
    rows::CLAIM_EXPIRED_SQL,
    rows::TAKE_EVENT_SQL,
    rows::NEXT_READY_SQL,
    rows::COUNT_SQL,
    crate::history::LOG_SQL,
    crate::slots::KEY_SQL,
    crate::slots::LIMITS_SQL,
];

/// With stable plans a cached statement is compiled once, whatever is bound to it. Without
/// them, on a database with statistics, the claim query, taking an event and reading the
/// log were compiled again at every call.
#[test]
fn hot_statements_are_compiled_once_whatever_is_bound() {
    assert_eq!(compiled_again(&populated(), HOT), Vec::<String>::new());
    // The check sees it when plans are not stable.
    let unstable = populated();
    unstable
        .set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            false,
        )
        .expect("config");
    let again = compiled_again(&unstable, HOT);
    assert!(
        again.contains(&rows::TAKE_EVENT_SQL.to_owned()),
        "{again:?}"
    );
    assert!(
        again.contains(&rows::CLAIM_READY_SQL.to_owned()),
        "{again:?}"
    );
}

/// The store's own connections run with stable plans (the test above sets them itself).
#[test]
fn the_stores_connections_have_stable_plans() {
    let dir = tempfile::tempdir().expect("dir");
    let conn = Connection::open(dir.path().join("plans.db")).expect("open");
    assert!(
        !conn
            .db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG)
            .expect("config"),
        "off by default"
    );
    crate::configure(&conn, &crate::Options::default()).expect("configure");
    assert!(
        conn.db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG)
            .expect("config")
    );
}
