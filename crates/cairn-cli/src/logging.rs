//! What `cairn serve` reports about itself: log lines on stderr (level from `RUST_LOG`,
//! default `info`; text or JSON) and, with the `otel` feature, the engine's spans exported
//! over OTLP.

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// How `cairn serve` writes its log.
#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Keeps the trace exporter running; dropping it flushes the spans still buffered.
pub(crate) struct Guard {
    #[cfg(feature = "otel")]
    _traces: Option<otel::Exporter>,
}

type Filtered = tracing_subscriber::layer::Layered<EnvFilter, Registry>;

/// Installs the subscriber: log lines in `format` and, given an endpoint, OTLP traces.
///
/// # Errors
/// When an OTLP endpoint is given to a build without the `otel` feature, or the exporter
/// cannot be built.
pub(crate) fn install(format: LogFormat, otlp_endpoint: Option<&str>) -> Result<Guard, String> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let lines: Box<dyn Layer<Filtered> + Send + Sync> = match format {
        LogFormat::Text => Box::new(lines),
        LogFormat::Json => Box::new(lines.json()),
    };
    let registry = tracing_subscriber::registry().with(filter).with(lines);
    #[cfg(feature = "otel")]
    {
        let (layer, exporter) = match otlp_endpoint {
            Some(endpoint) => {
                let (layer, exporter) = otel::layer(endpoint)?;
                (Some(layer), Some(exporter))
            }
            None => (None, None),
        };
        let _ = registry.with(layer).try_init();
        Ok(Guard { _traces: exporter })
    }
    #[cfg(not(feature = "otel"))]
    {
        if otlp_endpoint.is_some() {
            return Err(
                "this cairn was built without the `otel` feature, so it cannot export traces: build it with `cargo build -p cairn-cli --features otel`".into(),
            );
        }
        let _ = registry.try_init();
        Ok(Guard {})
    }
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;

    /// The tracer provider; shut down (flushing its batch) when dropped.
    pub(crate) struct Exporter(SdkTracerProvider);

    impl Drop for Exporter {
        fn drop(&mut self) {
            if let Err(e) = self.0.shutdown() {
                eprintln!("cairn: flushing the last traces failed: {e}");
            }
        }
    }

    /// A layer that turns spans into OpenTelemetry spans, batched to `endpoint` over OTLP
    /// (HTTP, protobuf). `endpoint` is the collector's base URL (as in
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`, e.g. `http://127.0.0.1:4318`); `/v1/traces` is added.
    pub(crate) fn layer<S>(
        endpoint: &str,
    ) -> Result<
        (
            tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>,
            Exporter,
        ),
        String,
    >
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let base = endpoint.trim_end_matches('/');
        let url = if base.ends_with("/v1/traces") {
            base.to_owned()
        } else {
            format!("{base}/v1/traces")
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(url)
            .build()
            .map_err(|e| format!("build the OTLP exporter for {endpoint}: {e}"))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name("cairn")
                    .build(),
            )
            .build();
        let tracer = provider.tracer("cairn");
        Ok((
            tracing_opentelemetry::layer().with_tracer(tracer),
            Exporter(provider),
        ))
    }
}
