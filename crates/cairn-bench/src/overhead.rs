//! `overhead`: the throughput workload with the engine's metrics recorded (the Prometheus
//! recorder `cairn serve` installs) and without (no recorder: every call a no-op),
//! alternated in one process so both see the same machine, and the median of each.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

use crate::{BenchError, NoOp, Row, Settings, create_all, engine_on, label, median};

/// The Prometheus recorder behind a switch: off, it hands out no-op handles, which is what
/// the facade does with no recorder installed.
struct Switch {
    on: Arc<AtomicBool>,
    inner: PrometheusRecorder,
}

impl Recorder for Switch {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }
    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_counter(key, metadata)
        } else {
            Counter::noop()
        }
    }
    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_gauge(key, metadata)
        } else {
            Gauge::noop()
        }
    }
    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_histogram(key, metadata)
        } else {
            Histogram::noop()
        }
    }
}

/// `rounds` rounds, each one throughput run with metrics off and one with them on (the
/// order alternating), of `instances` instances of `steps` no-op steps.
///
/// # Errors
/// When the engine or the database fails, or a recorder is installed already.
pub async fn overhead(
    dir: &Path,
    s: Settings,
    instances: usize,
    steps: u32,
    rounds: usize,
) -> Result<Vec<Row>, BenchError> {
    let on = Arc::new(AtomicBool::new(false));
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(Switch {
        on: Arc::clone(&on),
        inner: recorder,
    })?;
    let (mut off_rates, mut on_rates) = (Vec::new(), Vec::new());
    for round in 0..rounds.max(1) {
        for metrics_on in [round % 2 == 1, round % 2 == 0] {
            on.store(metrics_on, Ordering::Relaxed);
            let db = dir.join(format!("overhead-{round}-{metrics_on}.db"));
            let engine = engine_on(&db, s, |b| b.register(NoOp)).await?;
            let start = Instant::now();
            let all = create_all::<NoOp>(&engine, |_| steps, instances, "o").await?;
            for i in &all {
                i.wait().await?;
            }
            let rate = (instances * steps as usize) as f64 / start.elapsed().as_secs_f64();
            engine.shutdown().await;
            if metrics_on {
                on_rates.push(rate);
            } else {
                off_rates.push(rate);
            }
        }
    }
    // The "on" runs recorded for real: every step attempt is in the exposition.
    let rendered = handle.render();
    let attempts: f64 = rendered
        .lines()
        .filter(|l| l.starts_with("cairn_step_attempts_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    let expected = (rounds.max(1) * instances * steps as usize) as f64;
    if (attempts - expected).abs() > 0.5 {
        return Err(
            format!("the recorder saw {attempts} step attempts, expected {expected}").into(),
        );
    }
    let (off, on) = (median(&off_rates), median(&on_rates));
    let w = format!(
        "metrics overhead ({instances} × {steps} steps, {rounds} rounds, {})",
        label(s)
    );
    Ok(vec![
        Row::new(
            &w,
            "durable no-op steps/s, metrics off (median)",
            off,
            "1/s",
        ),
        Row::new(&w, "durable no-op steps/s, metrics on (median)", on, "1/s"),
        Row::new(&w, "cost of metrics", (off - on) / off * 100.0, "%"),
    ])
}
