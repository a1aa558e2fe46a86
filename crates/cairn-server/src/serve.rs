//! Serving the router: connections with read timeouts, live streams that end at shutdown,
//! and a graceful stop.
//!
//! `axum::serve` has no header-read timeout, so a client that sends half a request holds
//! its connection forever. This accept loop is axum's own (hyper's HTTP/1 connection per
//! socket), with hyper's header-read timeout, `TCP_NODELAY` (small SSE frames and JSON
//! answers go out at once instead of waiting for Nagle's algorithm), and graceful shutdown
//! that first tells the live streams to end: an open stream would otherwise keep the
//! process alive forever.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::{Semaphore, watch};

use crate::error::ApiError;

/// How the server treats slow clients and live streams.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Limits {
    /// A client must send a request's headers within this time (default 10 s).
    pub header_timeout: Duration,
    /// And its body within this time after the headers (default 30 s): 408
    /// `request.timeout` otherwise.
    pub body_timeout: Duration,
    /// Live streams (SSE) open at once; one more gets 503 `stream.too_many` (default 1,000).
    pub max_streams: usize,
    /// At shutdown, how long requests in progress may take to finish before their
    /// connections are dropped (default 10 s): a client that stopped reading must not keep
    /// the server from stopping.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_streams: 1_000,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

impl Limits {
    /// Sets [`Limits::header_timeout`].
    pub fn header_timeout(mut self, timeout: Duration) -> Self {
        self.header_timeout = timeout;
        self
    }

    /// Sets [`Limits::body_timeout`].
    pub fn body_timeout(mut self, timeout: Duration) -> Self {
        self.body_timeout = timeout;
        self
    }

    /// Sets [`Limits::shutdown_grace`].
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Sets [`Limits::max_streams`].
    pub fn max_streams(mut self, n: usize) -> Self {
        self.max_streams = n;
        self
    }
}

/// A connection whose HTTP-layer rejections are JSON like every other error. hyper answers
/// a request it cannot parse (headers too large, a NUL in the path, a bad Content-Length)
/// itself, before any handler runs, with an empty body; this writes such an answer with
/// the `{code, message}` body instead. Every answer of the routes to a 4xx or 5xx has a JSON
/// body, so an empty error answer can only be hyper's own.
struct JsonRejections<T> {
    io: T,
    /// The rewritten answer, still to be written, and how much of it was.
    pending: Option<(Vec<u8>, usize)>,
}

impl<T> JsonRejections<T> {
    fn new(io: T) -> Self {
        JsonRejections { io, pending: None }
    }
}

/// hyper's own error answer in `buf` as JSON, if `buf` is one: a whole 4xx/5xx head with an
/// empty body.
fn rewritten(buf: &[u8]) -> Option<Vec<u8>> {
    // Cheap checks first: this runs on every write (bodies of megabytes included).
    if buf.len() > 1024 || !buf.starts_with(b"HTTP/1.") || !buf.ends_with(b"\r\n\r\n") {
        return None;
    }
    let head = std::str::from_utf8(buf).ok()?;
    let head = head.strip_suffix("\r\n\r\n")?;
    let status_line = head.lines().next()?;
    let mut parts = status_line.splitn(3, ' ');
    let (version, status) = (parts.next()?, parts.next()?);
    if !version.starts_with("HTTP/1.") || !matches!(status.as_bytes().first(), Some(b'4' | b'5')) {
        return None;
    }
    let empty = head
        .lines()
        .skip(1)
        .any(|l| l.eq_ignore_ascii_case("content-length: 0"));
    if !empty || head.contains("\r\n\r\n") {
        return None;
    }
    let (code, message) = match status {
        "431" => (
            "request.headers_too_large",
            "the request's headers are too large or too many",
        ),
        "413" => ("payload.too_large", "the request is too large"),
        "414" => ("request.uri_too_long", "the request's path is too long"),
        "408" => (
            "request.timeout",
            "the request's headers did not arrive in time",
        ),
        "505" => (
            "request.version",
            "this server speaks HTTP/1.1 (and HTTP/1.0)",
        ),
        _ => (
            "request.malformed",
            "the request is not valid HTTP: a malformed request line, path (a NUL or space), header or Content-Length",
        ),
    };
    let body = serde_json::json!({ "code": code, "message": message }).to_string();
    let mut out = format!("{status_line}\r\n");
    for line in head.lines().skip(1) {
        if !line.to_ascii_lowercase().starts_with("content-length:") {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str(&format!(
        "content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ));
    Some(out.into_bytes())
}

impl<T: tokio::io::AsyncWrite + Unpin> JsonRejections<T> {
    /// Writes what is pending; ready once nothing is.
    fn poll_pending(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        while let Some((bytes, written)) = &mut self.pending {
            let n = std::task::ready!(
                std::pin::Pin::new(&mut self.io).poll_write(cx, &bytes[*written..])
            )?;
            if n == 0 {
                return std::task::Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            *written += n;
            if *written == bytes.len() {
                self.pending = None;
            }
        }
        std::task::Poll::Ready(Ok(()))
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for JsonRejections<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for JsonRejections<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_pending(cx))?;
        if let Some(json) = rewritten(buf) {
            this.pending = Some((json, 0));
            // Taken whole: it goes out as JSON, before anything written after it.
            return std::task::Poll::Ready(Ok(buf.len()));
        }
        std::pin::Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_pending(cx))?;
        let mut filled = bufs.iter().filter(|b| !b.is_empty());
        if let (Some(only), None) = (filled.next(), filled.next())
            && let Some(json) = rewritten(only)
        {
            this.pending = Some((json, 0));
            return std::task::Poll::Ready(Ok(only.len()));
        }
        std::pin::Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_pending(cx))?;
        std::pin::Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_pending(cx))?;
        std::pin::Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

/// Slots for live streams; a stream holds one for as long as it is open.
#[derive(Clone)]
pub(crate) struct StreamSlots(pub(crate) Arc<Semaphore>);

/// Flips to `true` when the server begins to shut down: live streams end.
#[derive(Clone)]
pub(crate) struct Closing(pub(crate) watch::Receiver<bool>);

/// Reads the whole body within `timeout` (bodies are small JSON documents, buffered by the
/// extractors anyway), so a client that stops sending in the middle is answered with 408
/// and its connection freed.
pub(crate) async fn read_body_within(timeout: Duration, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    // One byte over the limit is enough for the extractors to answer 413 as they do.
    let limit = crate::MAX_BODY + 1;
    let bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload.too_large",
                format!("the request body is larger than {} bytes", crate::MAX_BODY),
            )
            .into_response();
        }
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request.timeout",
                format!(
                    "the request body did not arrive within {} s",
                    timeout.as_secs_f64()
                ),
            )
            .into_response();
        }
    };
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

/// Serves `router` on `listener` until `shutdown` resolves, then ends the live streams,
/// stops accepting, and waits for the requests in progress.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: &Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (closing_tx, closing_rx) = watch::channel(false);
    let router = router.layer(axum::Extension(Closing(closing_rx)));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (socket, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.as_mut() => break,
        };
        let _ = socket.set_nodelay(true);
        // Handlers that care who is asking (the login's throttle) read the peer's address.
        let service = TowerToHyperService::new(tower::ServiceExt::map_request(
            router.clone(),
            move |mut request: hyper::Request<hyper::body::Incoming>| {
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                request
            },
        ));
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .serve_connection(TokioIo::new(JsonRejections::new(socket)), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
    drop(listener);
    closing_tx.send_replace(true);
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("requests still in progress at the shutdown deadline were dropped");
    }
    Ok(())
}
