//! Every workload at a small size: the harness works end to end (a smoke run, not a timing).

#![allow(clippy::unwrap_used, missing_docs)] // tests may unwrap: a panic is the failure report

use cairn::sqlite::Durability;
use cairn_bench::{Row, Settings};

fn normal() -> Settings {
    Settings {
        durability: Durability::Normal,
    }
}

fn value(rows: &[Row], metric: &str) -> f64 {
    rows.iter()
        .find(|r| r.metric.starts_with(metric))
        .unwrap_or_else(|| panic!("no {metric} in {rows:?}"))
        .value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_workload_runs_at_a_small_size() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    let raw = cairn_bench::raw(p, normal(), 400).unwrap();
    assert!(value(&raw, "commits/s") > 0.0);

    let rows = cairn_bench::throughput(p, normal(), 20, 3).await.unwrap();
    assert!(value(&rows, "durable no-op steps/s") > 0.0);
    assert!(rows[0].ratio.unwrap() > 0.0);
    assert!(value(&rows, "raw bound, steps/s (before the engine's run") > 0.0);

    let rows = cairn_bench::keyed(p, normal(), 30, 3).await.unwrap();
    assert!(value(&rows, "durable no-op steps/s, keyed, 20 per key at once") > 0.0);

    let rows = cairn_bench::children(p, normal(), 20, 3).await.unwrap();
    assert!(value(&rows, "parents, each invoking one child") > 0.0);

    // Installs the process's metrics recorder: it checks that every attempt was recorded.
    let rows = cairn_bench::overhead(p, normal(), 20, 3, 1).await.unwrap();
    assert!(value(&rows, "durable no-op steps/s, metrics on") > 0.0);

    let rows = cairn_bench::peers(p, normal(), 3, 1, &[(10, 3)])
        .await
        .unwrap();
    assert!(value(&rows, "single p50, HTTP") > 0.0);
    assert!(value(&rows, "10@3, HTTP") > 0.0);

    let rows = cairn_bench::latency(p, normal(), 5, 3).await.unwrap();
    assert!(value(&rows, "end to end p50") > 0.0);

    let rows = cairn_bench::hibernation(p, normal(), 30).await.unwrap();
    assert_eq!(value(&rows, "instances in memory while asleep"), 0.0);
    assert!(value(&rows, "timer wake-ups/s") > 0.0);

    let rows = cairn_bench::events(p, normal(), 20).await.unwrap();
    assert!(value(&rows, "deliveries/s") > 0.0);

    let rows = cairn_bench::scale(p, normal(), &[200]).await.unwrap();
    assert!(value(&rows, "new 10-step instances/s") > 0.0);
    assert!(value(&rows, "bytes per stored instance") > 0.0);

    let rows = cairn_bench::replay(p, normal(), 100).await.unwrap();
    assert!(value(&rows, "event sent to complete") > 0.0);

    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_cairn-bench"));
    let rows = cairn_bench::recovery(p, normal(), 20, &exe).await.unwrap();
    assert!(value(&rows, "restart to all complete") > 0.0);
    cairn_bench::print_table(&rows);
}
