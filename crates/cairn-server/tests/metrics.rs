//! `/metrics` over a real socket after a known workload: exact counter values, gauges that
//! go back to zero, and an exposition that Prometheus' own `promtool` accepts. Its own test
//! binary: the Prometheus recorder is global to the process, so no other test may share it.

#![allow(clippy::unwrap_used, missing_docs)] // tests may unwrap: a panic is the failure report

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cairn::prelude::*;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reserves, then charges: the charge fails on its first attempt and succeeds on the next.
struct Orders(Arc<AtomicU32>);

impl Workflow for Orders {
    const NAME: &'static str = "orders";
    type Params = Value;
    type Output = Value;

    async fn run(
        &self,
        _: WorkflowEvent<Value>,
        step: WorkflowStep,
    ) -> Result<Value, WorkflowError> {
        step.run("reserve", |_| async { Ok(1) }).await?;
        let charges = Arc::clone(&self.0);
        let retry = StepConfig {
            retries: Some(Retries::constant(3, Duration::from_millis(5))),
            ..StepConfig::default()
        };
        step.run("charge", move |ctx| {
            charges.fetch_add(1, Ordering::SeqCst);
            async move {
                if ctx.attempt == 1 {
                    Err::<u32, _>("card declined".into())
                } else {
                    Ok(2)
                }
            }
        })
        .config(&retry)
        .await?;
        Ok(json!("shipped"))
    }
}

/// One step that always times out, with no retries: the instance errors.
struct Doomed;

impl Workflow for Doomed {
    const NAME: &'static str = "doomed";
    type Params = Value;
    type Output = Value;

    async fn run(
        &self,
        _: WorkflowEvent<Value>,
        step: WorkflowStep,
    ) -> Result<Value, WorkflowError> {
        let once = StepConfig {
            retries: Some(Retries::none()),
            timeout: Some(Duration::from_millis(20)),
            ..StepConfig::default()
        };
        step.run("slow", |_| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(0)
        })
        .config(&once)
        .await?;
        Ok(Value::Null)
    }
}

/// Sleeps for an hour: hibernates.
struct Sleepy;

impl Workflow for Sleepy {
    const NAME: &'static str = "sleepy";
    type Params = Value;
    type Output = Value;

    async fn run(
        &self,
        _: WorkflowEvent<Value>,
        step: WorkflowStep,
    ) -> Result<Value, WorkflowError> {
        step.sleep("nap", Duration::from_secs(3600)).await?;
        Ok(Value::Null)
    }
}

/// One HTTP/1.1 request on its own connection; the status and the body.
async fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer secret\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// The samples of an exposition, by series (`name{labels}`, labels as printed).
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

async fn scrape(port: u16) -> (String, HashMap<String, f64>) {
    let (status, text) = http(port, "GET", "/metrics", "").await;
    assert_eq!(status, 200, "{text}");
    let parsed = samples(&text);
    (text, parsed)
}

fn value(samples: &HashMap<String, f64>, series: &str) -> f64 {
    *samples
        .get(series)
        .unwrap_or_else(|| panic!("no series {series} in the scrape"))
}

/// Scrapes until `settled` holds of the samples (at most 10 s; then the last scrape).
async fn scrape_until(
    port: u16,
    settled: impl Fn(&HashMap<String, f64>) -> bool,
) -> (String, HashMap<String, f64>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (text, m) = scrape(port).await;
        if settled(&m) || Instant::now() > deadline {
            return (text, m);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn attempts_of(m: &HashMap<String, f64>, workflow: &str, step: &str, outcome: &str) -> f64 {
    value(
        m,
        &format!(
            r#"cairn_step_attempts_total{{workflow="{workflow}",step="{step}",kind="step",outcome="{outcome}"}}"#
        ),
    )
}

async fn until_status(port: u16, workflow: &str, id: &str, status: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = http(
            port,
            "GET",
            &format!("/api/workflows/{workflow}/instances/{id}"),
            "",
        )
        .await;
        let details: Value = serde_json::from_str(&body).unwrap();
        if details["status"] == status {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{workflow}/{id} never reached {status}: {details}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_a_known_workload_exactly_and_gauges_return_to_zero() {
    let metrics = cairn_server::Metrics::install().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let charges = Arc::new(AtomicU32::new(0));
    let engine = cairn::Engine::builder()
        .sqlite(dir.path().join("cairn.db"))
        .hibernate_after(Duration::from_millis(50))
        .register(Orders(Arc::clone(&charges)))
        .register(Doomed)
        .register(Sleepy)
        // Keyed instances of `orders` would wait for slots: the gauge is reported.
        .concurrency("orders", cairn::Concurrency::limit(10))
        .start()
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let router = cairn_server::router_with_metrics(
        engine.clone(),
        Some("secret".into()),
        &cairn_server::Limits::default(),
        metrics,
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(cairn_server::serve_router(listener, router, async move {
        let _ = stopped.await;
    }));

    // The token guards /metrics like every route.
    let mut bare = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    bare.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    bare.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");

    let create = |workflow: &'static str, id: String| async move {
        let (status, body) = http(
            port,
            "POST",
            &format!("/api/workflows/{workflow}/instances"),
            &json!({ "instance_id": id }).to_string(),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    };
    for i in 0..5 {
        create("orders", format!("o{i}")).await;
    }
    for i in 0..2 {
        create("doomed", format!("d{i}")).await;
    }
    for i in 0..3 {
        create("sleepy", format!("s{i}")).await;
    }
    for i in 0..5 {
        until_status(port, "orders", &format!("o{i}"), "complete").await;
    }
    for i in 0..2 {
        until_status(port, "doomed", &format!("d{i}"), "errored").await;
    }
    for i in 0..3 {
        until_status(port, "sleepy", &format!("s{i}"), "waiting").await;
    }
    assert_eq!(
        charges.load(Ordering::SeqCst),
        10,
        "two charge attempts per order"
    );

    // A live stream open while the sleepers hibernate.
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream
        .write_all(b"GET /api/workflows/sleepy/instances/s0/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer secret\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");

    // The drivers leave memory just after the status is visible; the gauges are read at
    // most once a second: scrape until they settle.
    let (_, m) = scrape_until(port, |m| {
        m.get("cairn_instances_in_memory") == Some(&0.0)
            && m.get(r#"cairn_instances{workflow="sleepy",status="waiting"}"#) == Some(&3.0)
    })
    .await;
    let c = |series: &str| value(&m, series);
    assert_eq!(
        c(r#"cairn_instances_created_total{workflow="orders"}"#),
        5.0
    );
    assert_eq!(
        c(r#"cairn_instances_created_total{workflow="doomed"}"#),
        2.0
    );
    assert_eq!(
        c(r#"cairn_instances_created_total{workflow="sleepy"}"#),
        3.0
    );
    assert_eq!(
        c(r#"cairn_instances_started_total{workflow="orders"}"#),
        5.0
    );
    assert_eq!(
        c(r#"cairn_instances_started_total{workflow="sleepy"}"#),
        3.0
    );
    assert_eq!(
        c(r#"cairn_instances_finished_total{workflow="orders",status="complete"}"#),
        5.0
    );
    assert_eq!(
        c(r#"cairn_instances_finished_total{workflow="doomed",status="errored"}"#),
        2.0
    );
    let attempts = |wf: &str, step: &str, outcome: &str| {
        c(&format!(
            r#"cairn_step_attempts_total{{workflow="{wf}",step="{step}",kind="step",outcome="{outcome}"}}"#
        ))
    };
    assert_eq!(attempts("orders", "reserve", "success"), 5.0);
    assert_eq!(attempts("orders", "charge", "error"), 5.0);
    assert_eq!(attempts("orders", "charge", "success"), 5.0);
    assert_eq!(attempts("doomed", "slow", "timeout"), 2.0);
    assert_eq!(
        c(
            r#"cairn_step_attempt_duration_seconds_count{workflow="orders",step="charge",kind="step"}"#
        ),
        10.0
    );
    assert_eq!(
        c(r#"cairn_instance_duration_seconds_count{workflow="orders",status="complete"}"#),
        5.0
    );
    assert_eq!(
        c(r#"cairn_instance_queue_delay_seconds_count{workflow="orders"}"#),
        5.0
    );
    assert!(c("cairn_store_commit_duration_seconds_count") > 0.0);
    assert!(c("cairn_store_batch_jobs_count") > 0.0);
    assert_eq!(
        c(
            r#"cairn_http_requests_total{method="POST",route="/api/workflows/{name}/instances",status="201"}"#
        ),
        10.0
    );
    assert_eq!(
        c(r#"cairn_http_requests_total{method="GET",route="/metrics",status="401"}"#),
        1.0
    );
    // The sleepers hibernate: waiting, each with a timer to come; nothing else is live.
    assert_eq!(
        c(r#"cairn_instances{workflow="sleepy",status="waiting"}"#),
        3.0
    );
    assert_eq!(c(r#"cairn_timers_pending{workflow="sleepy"}"#), 3.0);
    assert_eq!(c(r#"cairn_backlog_instances{workflow="sleepy"}"#), 0.0);
    assert_eq!(
        c(r#"cairn_instances{workflow="orders",status="complete"}"#),
        5.0
    );
    assert_eq!(
        c(r#"cairn_instances{workflow="doomed",status="errored"}"#),
        2.0
    );
    assert_eq!(c("cairn_instances_in_memory"), 0.0);
    assert_eq!(c("cairn_http_streams_open"), 1.0);

    // Terminate the sleepers and close the stream: every gauge of live work is back to 0.
    for i in 0..3 {
        let (status, body) = http(
            port,
            "PATCH",
            &format!("/api/workflows/sleepy/instances/s{i}/status"),
            r#"{"status":"terminate"}"#,
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    drop(stream);
    // A restart starts the instance again: counted as a start, and as a second end.
    let (status, body) = http(
        port,
        "PATCH",
        "/api/workflows/orders/instances/o0/status",
        r#"{"status":"restart"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    until_status(port, "orders", "o0", "complete").await;
    let (text, m) = scrape_until(port, |m| {
        m.get("cairn_http_streams_open") == Some(&0.0)
            && m.get(r#"cairn_instances{workflow="sleepy",status="waiting"}"#) == Some(&0.0)
            && m.get("cairn_instances_in_memory") == Some(&0.0)
            && m.get(r#"cairn_instances_finished_total{workflow="orders",status="complete"}"#)
                == Some(&6.0)
    })
    .await;
    let c = |series: &str| value(&m, series);
    assert_eq!(
        c(r#"cairn_instances_started_total{workflow="orders"}"#),
        6.0
    );
    assert_eq!(attempts_of(&m, "orders", "charge", "error"), 6.0);
    // Nothing was taken over from a dead engine, and no lease was lost: the counters the
    // alerts watch are there, at zero, so the first event would show in increase().
    assert_eq!(c(r#"cairn_lease_takeovers_total{workflow="orders"}"#), 0.0);
    assert_eq!(c("cairn_leases_lost_total"), 0.0);
    assert_eq!(
        c(&format!(
            r#"cairn_build_info{{version="{}"}}"#,
            env!("CARGO_PKG_VERSION")
        )),
        1.0
    );
    assert!(c("process_resident_memory_bytes") > 1e6, "{text}");
    assert!(c("process_open_fds") > 3.0, "{text}");
    assert!(c("process_max_fds") >= c("process_open_fds"), "{text}");
    assert!(c("process_start_time_seconds") > 1.7e9, "{text}");
    assert_eq!(
        c(r#"cairn_instances_finished_total{workflow="sleepy",status="terminated"}"#),
        3.0
    );
    for workflow in ["orders", "doomed", "sleepy"] {
        for status in ["queued", "running", "paused", "waiting", "waitingForPause"] {
            assert_eq!(
                c(&format!(
                    r#"cairn_instances{{workflow="{workflow}",status="{status}"}}"#
                )),
                0.0,
                "{workflow} {status}"
            );
        }
        assert_eq!(
            c(&format!(r#"cairn_timers_pending{{workflow="{workflow}"}}"#)),
            0.0
        );
        assert_eq!(
            c(&format!(
                r#"cairn_backlog_instances{{workflow="{workflow}"}}"#
            )),
            0.0
        );
    }
    assert_eq!(c("cairn_instances_in_memory"), 0.0);
    assert_eq!(c("cairn_http_streams_open"), 0.0);
    // No series is labelled by instance id.
    for id in ["o0", "d0", "s0"] {
        assert!(
            !text.contains(&format!("\"{id}\"")),
            "an instance id is a label value"
        );
    }

    promtool_accepts(&text);
    docs_match(&text);
    let _ = stop.send(());
    served.await.unwrap().unwrap();
    engine.shutdown().await;
}

/// `promtool check metrics` (Debian package `prometheus`) lints the exposition.
fn promtool_accepts(text: &str) {
    use std::io::Write as _;
    let spawned = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            // CI sets CAIRN_REQUIRE_PROMTOOL: there a missing promtool is a failure.
            assert!(
                std::env::var_os("CAIRN_REQUIRE_PROMTOOL").is_none(),
                "promtool not found ({e}) though CAIRN_REQUIRE_PROMTOOL is set"
            );
            eprintln!(
                "\n*** SKIPPED the promtool check: promtool not found ({e}); install the Debian package `prometheus` (.ci/run does) ***\n"
            );
            return;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The metric names an exposition has (from its `# TYPE` lines).
fn exposed(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The `cairn_…` metric names a PromQL expression uses (a histogram's series by their
/// histogram's name).
fn used(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("cairn_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let name = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|n| n.ends_with("_seconds") || n.ends_with("_jobs"))
            })
            .unwrap_or(name);
        names.push(name.to_owned());
        rest = &tail[end..];
    }
    names
}

/// docs/operating.md's metric table and alert table, and the Grafana dashboard, hold to
/// what the server exposes: every exposed metric is documented, every documented one
/// exists, and every PromQL expression parses (`promtool check rules`) and names only
/// documented metrics.
fn docs_match(scraped: &str) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let doc = std::fs::read_to_string(root.join("docs/operating.md")).unwrap();
    let documented: std::collections::BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `cairn_"))
        .filter_map(|l| l.split('`').next())
        .map(|n| format!("cairn_{n}"))
        .collect();
    // Cairn's own (the process_* series have Prometheus' standard meanings).
    let exposed: std::collections::BTreeSet<String> = exposed(scraped)
        .into_iter()
        .filter(|n| n.starts_with("cairn_"))
        .collect();
    assert_eq!(documented, exposed, "docs/operating.md's metric table");

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("docs/grafana-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect();
    assert!(exprs.len() > 10, "the dashboard has its queries");
    // The alert table: the first code span of each row that has PromQL in it.
    exprs.extend(
        doc.lines()
            .filter(|l| l.starts_with('|') && l.contains("cairn_") && !l.starts_with("| `cairn_"))
            .filter_map(|l| l.split('`').nth(1))
            .filter(|e| e.contains('('))
            .map(str::to_owned),
    );
    let mut rules = String::from("groups:\n  - name: cairn-docs\n    rules:\n");
    for (i, expr) in exprs.iter().enumerate() {
        for name in used(expr) {
            assert!(
                documented.contains(&name),
                "{name} in `{expr}` is not a metric"
            );
        }
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$workflow", ".*")
            .replace('\'', "''");
        rules.push_str(&format!(
            "      - record: cairn:docs_{i}\n        expr: '{expr}'\n"
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yml");
    eprintln!(
        "checking {} documented PromQL expressions with promtool",
        exprs.len()
    );
    std::fs::write(&file, rules).unwrap();
    match std::process::Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&file)
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "a dashboard or alert query does not parse:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => {
            eprintln!("\n*** SKIPPED parsing the documented PromQL: promtool not found ({e}) ***\n")
        }
    }
}
