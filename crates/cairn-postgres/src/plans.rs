//! The plan test on PostgreSQL: every query on a hot or user-facing path is an index scan
//! or a bounded range, never a sequential scan of the instances, log, steps or events
//! tables, nor a sort. `EXPLAIN` runs each query with its parameters bound, on a schema
//! holding 60,000 instances and 180,000 log rows, analysed.

use tokio_postgres::types::ToSql;

use crate::{Options, PostgresStore, history, ops, reads};

/// Plan lines that mean the cost grows with the history kept.
fn grows_with_history(line: &str) -> bool {
    let scans = [
        "instances",
        "log",
        "steps",
        "events",
        "instance_count_deltas",
    ]
    .iter()
    .any(|t| {
        line.contains(&format!("Seq Scan on {t} ")) || line.ends_with(&format!("Seq Scan on {t}"))
    });
    let node = line.trim_start().trim_start_matches("->").trim_start();
    scans || node.starts_with("Sort ") || node.starts_with("Incremental Sort ")
}

#[tokio::test]
async fn hot_queries_never_scan_or_sort_history() {
    let Some(url) = crate::test_url() else { return };
    let schema = format!("plans_{}", std::process::id());
    let store = PostgresStore::open(Options::new(&url).schema(&schema).connections(2))
        .await
        .expect("open");
    let client = store.pool.get().await.expect("connection");
    client
        .batch_execute(
            "INSERT INTO instances (workflow, id, status, params, created_at, ready_rank, ready_at,
                 purge_at, lease_owner, lease_until, retain_success_ms, retain_error_ms)
             SELECT 'w' || (i % 3), 'i' || i,
                 CASE WHEN i % 10 = 0 THEN 7 WHEN i % 50 = 1 THEN 0 WHEN i % 97 = 0 THEN 1 ELSE 5 END,
                 '{}', i,
                 CASE WHEN i % 10 = 0 THEN 0 ELSE 1 END,
                 CASE WHEN i % 10 = 0 THEN i + 1000000 WHEN i % 50 = 1 THEN i ELSE NULL END,
                 CASE WHEN i % 10 > 1 AND i % 97 <> 0 THEN i + 600000 ELSE NULL END,
                 CASE WHEN i % 97 = 0 THEN 'engine' ELSE NULL END,
                 CASE WHEN i % 97 = 0 THEN 9000000000 ELSE NULL END,
                 0, 0
             FROM generate_series(1, 60000) AS i;
             INSERT INTO log (id, iid, at, kind, meta)
             SELECT 2 * (3 * (iid - 1) + k), iid, created_at, k, '{}'
             FROM instances, generate_series(1, 3) AS k;
             UPDATE log_clock SET last = (SELECT MAX(id) FROM log);
             INSERT INTO events (iid, type, payload, at)
             SELECT iid, 'go', '{}', created_at FROM instances WHERE status = 7;
             INSERT INTO steps (iid, kind, name, count, seq, state, config, attempts, in_flight,
                 started_at, has_rollback)
             SELECT iid, 0, 's', 1, 1, 1, 1, 1, false, 0, false FROM instances;
             ANALYZE instances;
             ANALYZE log;
             ANALYZE events;
             ANALYZE steps;
             ANALYZE instance_count_deltas;",
        )
        .await
        .expect("populate");
    let wfs: Vec<String> = vec!["w1".into()];
    let (w, id, s5, s0, n) = ("w1".to_owned(), "i4".to_owned(), 5i64, 0i64, 50i64);
    let (t, big, iid, after) = (500_000i64, i64::MAX / 4, 4i64, 100i64);
    let until = after + 20_000;
    let owner = "engine".to_owned();
    let go = "go".to_owned();
    let queries: Vec<(&str, String, Vec<&(dyn ToSql + Sync)>)> = vec![
        (
            "claim: ready",
            ops::CLAIM_READY_SQL.into(),
            vec![&s0, &t, &wfs, &n],
        ),
        (
            "claim: expired leases",
            ops::CLAIM_EXPIRED_SQL.into(),
            vec![&big, &wfs, &n],
        ),
        (
            "claim: lost pauses",
            ops::RECOVER_PAUSES_SQL.into(),
            vec![&big],
        ),
        ("next wake-up", reads::NEXT_READY_SQL.into(), vec![&w]),
        (
            "slots: wake the waiting",
            crate::slots::WAKE_SQL.into(),
            vec![&w, &go, &n],
        ),
        (
            "slots: place in line",
            crate::slots::POSITION_SQL.into(),
            vec![&iid],
        ),
        ("count by status", reads::COUNT_SQL.into(), vec![&w, &s5]),
        ("timers", reads::TIMERS_SQL.into(), vec![&w, &t]),
        (
            "instance by key",
            format!(
                "SELECT {} FROM instances WHERE workflow = $1 AND id = $2",
                reads::INSTANCE_COLUMNS
            ),
            vec![&w, &id],
        ),
        (
            "instance log tail",
            history::LOG_SQL.into(),
            vec![&iid, &after, &n],
        ),
        (
            "workflow log tail",
            history::WORKFLOW_LOG_SQL.into(),
            vec![&w, &after, &n, &until],
        ),
        (
            "take an event",
            "SELECT id, payload, at FROM events WHERE iid = $1 AND type = $2 ORDER BY id LIMIT 1"
                .into(),
            vec![&iid, &go],
        ),
        ("due purges", ops::DUE_PURGES_SQL.into(), vec![&t, &n]),
        ("next purge", reads::NEXT_PURGE_SQL.into(), vec![]),
        ("children of a parent", reads::children_sql(), vec![&iid]),
        (
            "renew",
            "UPDATE instances SET lease_until = $1 WHERE lease_owner = $2 AND lease_until >= $3"
                .into(),
            vec![&big, &owner, &t],
        ),
    ];
    let mut bad = Vec::new();
    let mut check = |name: &str, sql: &str, lines: Vec<String>| {
        if lines.iter().any(|l| grows_with_history(l)) {
            bad.push(format!("{name}:\n  {}\n  {sql}", lines.join("\n  ")));
        }
    };
    for (name, sql, args) in &queries {
        let rows = client
            .query(&format!("EXPLAIN {sql}"), args)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        check(
            name,
            sql,
            rows.iter().map(|r| r.get::<_, String>(0)).collect(),
        );
    }
    let mut lists = Vec::new();
    for statuses in [vec![], vec![cairn_core::InstanceStatus::Running]] {
        for after in [None, Some(cairn_store::InstanceRef(5))] {
            for oldest_first in [false, true] {
                lists.push(cairn_store::ListQuery {
                    workflow: Some(cairn_core::WorkflowName::new("w1").unwrap()),
                    statuses: statuses.clone(),
                    after,
                    oldest_first,
                    limit: 50,
                    ..Default::default()
                });
            }
        }
    }
    for list in &lists {
        let (sql, args) = reads::list_sql(list);
        let rows = client
            .query(&format!("EXPLAIN {sql}"), &reads::bound(&args))
            .await
            .expect("list");
        check(
            "list",
            &sql,
            rows.iter().map(|r| r.get::<_, String>(0)).collect(),
        );
    }
    // One instance's journal, sorted by start order: a sort of that instance's steps only,
    // so only a scan is wrong there.
    let journal = "SELECT * FROM steps s LEFT JOIN configs c ON c.id = s.config WHERE s.iid = $1 ORDER BY s.seq";
    let rows = client
        .query(&format!("EXPLAIN {journal}"), &[&iid])
        .await
        .expect("journal");
    let lines: Vec<String> = rows.iter().map(|r| r.get::<_, String>(0)).collect();
    if lines.iter().any(|l| l.contains("Seq Scan on steps")) {
        bad.push(format!("journal:\n  {}", lines.join("\n  ")));
    }
    drop(client);
    let _ = cairn_store::Store::close(&store).await;
    assert!(
        bad.is_empty(),
        "queries whose cost grows with history:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checker_sees_a_full_scan_and_a_sort() {
    assert!(grows_with_history(
        "Seq Scan on instances  (cost=0.00..1.00 rows=1 width=8)"
    ));
    assert!(grows_with_history(
        "  ->  Sort  (cost=1.00..2.00 rows=1 width=8)"
    ));
    assert!(!grows_with_history(
        "Index Scan using instances_ready on instances"
    ));
}
