//! `GET /metrics`: the engine's and the server's metrics in Prometheus' text format, from
//! the `metrics` facade's Prometheus recorder. The server adds its own: requests by route
//! and status, their duration, and the live streams open.

use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// HTTP requests answered, by method, route template and status.
pub(crate) const HTTP_REQUESTS: &str = "cairn_http_requests_total";
/// How long HTTP requests took to answer (until the response head; a stream's life is not
/// counted), by method and route template.
pub(crate) const HTTP_DURATION: &str = "cairn_http_request_duration_seconds";
/// Live event streams (SSE) open now.
pub(crate) const STREAMS_OPEN: &str = "cairn_http_streams_open";

/// Histogram buckets for durations: from half a millisecond (a commit) to a day (an
/// instance that sleeps).
const SECONDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0, 1800.0, 3600.0, 86400.0,
];

/// Histogram buckets for the group commit's jobs per transaction.
const JOBS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// The Prometheus recorder, installed for the whole process: what `/metrics` renders.
#[derive(Clone, Debug)]
pub struct Metrics {
    handle: PrometheusHandle,
}

impl Metrics {
    /// Installs the Prometheus recorder as the process's `metrics` recorder (once per
    /// process) and starts its upkeep (histograms are drained every 5 s).
    ///
    /// # Errors
    /// When a recorder is installed already.
    pub fn install() -> Result<Metrics, String> {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS)
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(cairn::telemetry::BATCH_SIZE.into()), JOBS)
            })
            .map_err(|e| e.to_string())?
            .install_recorder()
            .map_err(|e| format!("install the metrics recorder: {e}"))?;
        let upkeep = handle.clone();
        std::thread::Builder::new()
            .name("cairn-metrics-upkeep".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(Duration::from_secs(5));
                    upkeep.run_upkeep();
                }
            })
            .map_err(|e| format!("start the metrics upkeep thread: {e}"))?;
        describe_counter!(
            HTTP_REQUESTS,
            "HTTP requests answered, by route and status."
        );
        describe_histogram!(
            HTTP_DURATION,
            Unit::Seconds,
            "How long HTTP requests took to answer."
        );
        describe_gauge!(STREAMS_OPEN, "Live event streams (SSE) open now.");
        describe_gauge!(
            BUILD_INFO,
            "Always 1; the labels say which build is running."
        );
        metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
        describe_counter!(
            "process_cpu_seconds_total",
            Unit::Seconds,
            "CPU time (user and system) this process has used."
        );
        describe_gauge!(
            "process_resident_memory_bytes",
            Unit::Bytes,
            "Resident memory of this process."
        );
        describe_gauge!(
            "process_open_fds",
            "File descriptors this process has open."
        );
        describe_gauge!(
            "process_max_fds",
            "This process's limit of open file descriptors."
        );
        describe_gauge!(
            "process_start_time_seconds",
            Unit::Seconds,
            "When this process started, in seconds since the Unix epoch."
        );
        process::record();
        // Zero from the start, so a scrape before the first stream shows it.
        metrics::gauge!(STREAMS_OPEN).set(0.0);
        Ok(Metrics { handle })
    }

    /// The current values, in Prometheus' text exposition format.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

/// `cairn_build_info{version}`: 1, so dashboards and alerts can tell builds apart.
pub(crate) const BUILD_INFO: &str = "cairn_build_info";

/// The process's own figures under Prometheus' standard names (CPU, memory, descriptors),
/// read from `/proc` at each scrape; on systems without it they are absent.
mod process {
    use std::sync::OnceLock;

    /// Clock ticks per second of `/proc/self/stat`'s times: 100 on every Linux platform
    /// Cairn runs on (USER_HZ).
    const TICKS: f64 = 100.0;

    pub(super) fn record() {
        let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
            return;
        };
        // The fields after the command's closing parenthesis (the command may hold spaces).
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let field = |n: usize| fields.get(n).and_then(|f| f.parse::<f64>().ok());
        // utime and stime are fields 14 and 15 of stat(5); rss (pages) is 24; starttime 22.
        if let (Some(user), Some(system)) = (field(11), field(12)) {
            metrics::counter!("process_cpu_seconds_total")
                .absolute(((user + system) / TICKS) as u64);
        }
        if let Some(pages) = field(21) {
            metrics::gauge!("process_resident_memory_bytes").set(pages * page_size());
        }
        if let Some(started) = field(19) {
            metrics::gauge!("process_start_time_seconds").set(boot_time() + started / TICKS);
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            metrics::gauge!("process_open_fds").set(fds.count() as f64);
        }
        if let Ok(limits) = std::fs::read_to_string("/proc/self/limits")
            && let Some(soft) = limits
                .lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|n| n.parse::<f64>().ok())
        {
            metrics::gauge!("process_max_fds").set(soft);
        }
    }

    fn page_size() -> f64 {
        // Every Linux platform Cairn is built for uses 4 KiB pages for RSS accounting.
        4096.0
    }

    /// When the machine booted, in seconds since the epoch (`btime` of `/proc/stat`).
    fn boot_time() -> f64 {
        static BOOT: OnceLock<f64> = OnceLock::new();
        *BOOT.get_or_init(|| {
            std::fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("btime "))
                        .and_then(|t| t.trim().parse().ok())
                })
                .unwrap_or(0.0)
        })
    }
}

/// `GET /metrics`: refreshes the engine's gauges from the store, then renders everything.
pub(crate) async fn scrape(engine: &cairn::Engine, metrics: &Metrics) -> Response {
    process::record();
    if let Err(e) = engine.refresh_gauges().await {
        // Still answer: the counters are right; the gauges are as of the last refresh.
        tracing::warn!(error = %e, "refreshing the gauges for a scrape failed");
    }
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics.render(),
    )
        .into_response()
}

/// Counts one answered request. The method is one of HTTP's own or `OTHER`: any token is
/// a method to hyper, and each would be a new series, also before authentication.
pub(crate) fn request(method: &axum::http::Method, route: &str, status: u16, took: Duration) {
    use axum::http::Method;
    // The label as a `&'static str`: no copy per request.
    let method = match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "OTHER",
    };
    metrics::counter!(
        HTTP_REQUESTS,
        "method" => method,
        "route" => route.to_owned(),
        "status" => status.to_string()
    )
    .increment(1);
    metrics::histogram!(HTTP_DURATION, "method" => method, "route" => route.to_owned())
        .record(took.as_secs_f64());
}
