//! `lists`: what a person waits for on the dashboard's instance list with many instances
//! stored. `instances` sleeping instances (nothing runs while it measures), then the
//! median server time of each page over HTTP on loopback, HTML rendering included: the
//! newest page of every workflow, one workflow with two statuses, a page deep in the
//! keyset, an id prefix that only the oldest instance has (the whole table is read), and
//! the count a bulk confirmation shows.

use std::path::Path;
use std::time::Instant;

use cairn::{InstanceStatus, ListOptions};

use crate::peers::Conn;
use crate::{BenchError, Nap, Row, Settings, create_all, engine_on, label, median};

/// Requests per page measured.
const SAMPLES: usize = 30;

/// Runs the workload on `instances` stored instances (see the module).
///
/// # Errors
/// A store or HTTP failure, or a page that does not answer 200.
pub async fn lists(dir: &Path, s: Settings, instances: usize) -> Result<Vec<Row>, BenchError> {
    let path = dir.join("lists.db");
    let engine = engine_on(&path, s, |b| b.register(Nap)).await?;
    create_all::<Nap>(&engine, |_| (), instances, "l").await?;
    crate::until_count(&engine, "nap", InstanceStatus::Waiting, instances).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(cairn_server::serve(engine.clone(), listener, async move {
        let _ = stopped.await;
    }));
    let middle = engine
        .list_instances(Some("nap"), &ListOptions::default().limit(instances / 2))
        .await?
        .cursor
        .unwrap_or_default();
    let pages = [
        ("newest 50, every workflow", "/instances".to_owned()),
        (
            "one workflow, two statuses",
            "/instances?workflow=nap&status=waiting&status=paused".to_owned(),
        ),
        (
            "a page in the middle (keyset)",
            format!("/instances?workflow=nap&cursor={middle}"),
        ),
        (
            "an id prefix only the oldest has (reads every row)",
            "/instances?workflow=nap&id=l0".to_owned(),
        ),
    ];
    let w = format!("lists ({instances} stored, {})", label(s));
    let mut rows = Vec::new();
    let mut conn = Conn::open(port).await?;
    for (name, page) in &pages {
        let mut samples = Vec::with_capacity(SAMPLES);
        for _ in 0..SAMPLES {
            let start = Instant::now();
            let (status, body) = conn.get(page).await?;
            if status != 200 || body.is_empty() {
                return Err(format!("GET {page}: {status}").into());
            }
            samples.push(start.elapsed().as_secs_f64() * 1e3);
        }
        rows.push(Row::new(
            &w,
            format!("list page: {name}, p50"),
            median(&samples),
            "ms",
        ));
    }
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let start = Instant::now();
        let n = engine
            .count_instances(
                Some("nap"),
                &ListOptions::default().status(InstanceStatus::Waiting),
            )
            .await?;
        if n != instances as u64 {
            return Err(format!("counted {n} of {instances}").into());
        }
        samples.push(start.elapsed().as_secs_f64() * 1e3);
    }
    rows.push(Row::new(
        &w,
        "bulk confirmation: count all matching, p50",
        median(&samples),
        "ms",
    ));
    let _ = stop.send(());
    let _ = server.await;
    engine.shutdown().await;
    Ok(rows)
}
