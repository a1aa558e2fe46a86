//! What `cairn serve` reports about itself: log lines on stderr (level from `RUST_LOG`,
//! default `info`; text or JSON) and, with the `otel` feature, the engine's spans exported
//! over OTLP.

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// How `cairn serve` writes its log.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
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

/// The environment variable OpenTelemetry's exporters read for the collector's address.
const OTLP_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// Installs the subscriber: log lines in `format`, their level from `RUST_LOG` and, given
/// an endpoint (`--otlp-endpoint`, or `OTEL_EXPORTER_OTLP_ENDPOINT` in an `otel` build),
/// the engine's spans over OTLP at `info` whatever `RUST_LOG` says.
///
/// # Errors
/// When `--otlp-endpoint` is given to a build without the `otel` feature, or the exporter
/// cannot be built.
pub(crate) fn install(format: LogFormat, otlp_endpoint: Option<&str>) -> Result<Guard, String> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let lines: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Text => Box::new(lines.with_filter(filter)),
        LogFormat::Json => Box::new(lines.json().with_filter(filter)),
    };
    #[cfg(feature = "otel")]
    {
        let endpoint = otlp_endpoint
            .map(str::to_owned)
            .or_else(|| std::env::var(OTLP_ENV).ok().filter(|v| !v.is_empty()));
        let mut layers = vec![lines];
        let exporter = match endpoint {
            Some(endpoint) => {
                let (layer, exporter) = otel::layer(&endpoint)?;
                layers.push(layer);
                Some(exporter)
            }
            None => None,
        };
        let _ = tracing_subscriber::registry().with(layers).try_init();
        Ok(Guard { _traces: exporter })
    }
    #[cfg(not(feature = "otel"))]
    {
        check(otlp_endpoint)?;
        let _ = tracing_subscriber::registry().with(lines).try_init();
        // Often set for every process in a cluster: not a reason to refuse to start.
        if std::env::var_os(OTLP_ENV).is_some() {
            tracing::warn!(
                "{OTLP_ENV} is set, but this cairn was built without the `otel` feature: no traces are exported"
            );
        }
        Ok(Guard {})
    }
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::TracerProvider as _;
    use std::time::Duration;

    use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::{Layer, Registry};

    /// The exporter's HTTP client: a blocking ureq agent, called from the batch
    /// processor's own thread (as the exporter's blocking reqwest client was).
    #[derive(Debug)]
    struct Http(ureq::Agent);

    /// A response body the collector sends back: a status, at most, for a batch.
    const RESPONSE_LIMIT: u64 = 4 * 1024 * 1024;

    impl Http {
        /// Every request, the response's body included, ends within the exporter's
        /// timeout: `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` or `OTEL_EXPORTER_OTLP_TIMEOUT`
        /// (milliseconds), else 10 s, as the exporter's own clients are configured.
        fn new() -> Self {
            let timeout = [
                "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ]
            .iter()
            .find_map(|var| std::env::var(var).ok()?.trim().parse::<u64>().ok())
            .map_or(Duration::from_secs(10), Duration::from_millis);
            let agent = ureq::Agent::config_builder()
                .timeout_global(Some(timeout))
                // The exporter reads the status itself (a 4xx is not retried, a 5xx is).
                .http_status_as_error(false)
                .build()
                .new_agent();
            Self(agent)
        }
    }

    #[async_trait::async_trait]
    impl HttpClient for Http {
        async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
            let (parts, body) = request.into_parts();
            let response = self.0.run(Request::from_parts(parts, &body[..]))?;
            let (parts, mut body) = response.into_parts();
            let body = body.with_config().limit(RESPONSE_LIMIT).read_to_vec()?;
            Ok(Response::from_parts(parts, body.into()))
        }
    }

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
    ///
    /// Its own filter: spans at `info` and above whatever `RUST_LOG` says, and none of the
    /// exporter's own (its errors go to the log lines, not back into the exporter).
    pub(crate) fn layer(
        endpoint: &str,
    ) -> Result<(Box<dyn Layer<Registry> + Send + Sync>, Exporter), String> {
        if !endpoint.starts_with("http://") {
            return Err(format!(
                "--otlp-endpoint {endpoint}: only http:// is supported (this build has no TLS); run a collector next to the server"
            ));
        }
        let base = endpoint.trim_end_matches('/');
        let url = if base.ends_with("/v1/traces") {
            base.to_owned()
        } else {
            format!("{base}/v1/traces")
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(Http::new())
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
        let filter = tracing_subscriber::filter::Targets::new()
            .with_default(tracing::Level::INFO)
            .with_target(
                "opentelemetry",
                tracing_subscriber::filter::LevelFilter::OFF,
            )
            .with_target("ureq", tracing_subscriber::filter::LevelFilter::OFF)
            .with_target("ureq_proto", tracing_subscriber::filter::LevelFilter::OFF);
        Ok((
            Box::new(
                tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    .with_filter(filter),
            ),
            Exporter(provider),
        ))
    }
}

/// Whether this build can export traces to `otlp_endpoint` (when one is given).
///
/// # Errors
/// An endpoint given to a build without the `otel` feature.
pub(crate) fn check(otlp_endpoint: Option<&str>) -> Result<(), String> {
    if cfg!(feature = "otel") || otlp_endpoint.is_none() {
        return Ok(());
    }
    Err("this cairn was built without the `otel` feature, so it cannot export traces: build it with `cargo build -p cairn-cli --features otel`".into())
}
