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
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{Semaphore, watch};

use crate::error::ApiError;

/// How the server treats slow clients and live streams, and who its clients are behind a
/// proxy.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Limits {
    /// The addresses of reverse proxies in front of the server (none by default). A
    /// request from one names its client in `X-Forwarded-For` (the last address there that
    /// is not such a proxy), which the login's throttle and the cap on one client's live
    /// streams count by, and `X-Forwarded-Proto: https` says the client came over TLS (the
    /// session cookie is `Secure`). From any other address these headers are ignored: a
    /// client could write them.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// A client must send a request's headers within this time (default 10 s).
    pub header_timeout: Duration,
    /// And its body within this time after the headers (default 30 s): 408
    /// `request.timeout` otherwise.
    pub body_timeout: Duration,
    /// Live streams (SSE) and long polls open at once; one more gets 503 `stream.too_many`
    /// with `Retry-After` (default 1,000, and never more than half the connections). One
    /// client address (other than loopback, where a proxy on the same host sends
    /// everyone's) holds at most half of them.
    pub max_streams: usize,
    /// Connections open at once; past it a new connection is answered 503
    /// `server.too_many_connections` with `Retry-After` and closed, instead of waiting in
    /// the listen backlog. By default the file descriptors this process may open, less a
    /// reserve for the database and the log ([`raise_fd_limit`] first gives it more).
    pub max_connections: usize,
    /// At shutdown, how long requests in progress may take to finish before their
    /// connections are dropped (default 10 s): a client that stopped reading must not keep
    /// the server from stopping.
    pub shutdown_grace: Duration,
}

/// File descriptors kept for what is not a connection: the database and its WAL, the
/// PostgreSQL pool, the listener, the log.
const FD_RESERVE: u64 = 128;

impl Default for Limits {
    fn default() -> Self {
        let max_connections = fd_limit().map_or(10_000, |fds| {
            usize::try_from(fds.saturating_sub(FD_RESERVE).max(16)).unwrap_or(usize::MAX)
        });
        Limits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_streams: 1_000.min(max_connections / 2).max(1),
            max_connections,
            shutdown_grace: Duration::from_secs(10),
            trusted_proxies: Vec::new(),
        }
    }
}

/// The file descriptors this process may open now (its soft limit), where that is known.
fn fd_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        rlimit::getrlimit(rlimit::Resource::NOFILE)
            .ok()
            .map(|(soft, _)| soft)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Raises this process's limit of open file descriptors to the most it may have (the soft
/// limit to the hard one; the common soft limit of 1,024 would not hold 1,000 live
/// streams and the database). Returns the limit now, where that is known.
pub fn raise_fd_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        rlimit::increase_nofile_limit(u64::MAX).ok()
    }
    #[cfg(not(unix))]
    {
        None
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

    /// Sets [`Limits::max_connections`].
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Sets [`Limits::trusted_proxies`].
    pub fn trusted_proxies(mut self, proxies: Vec<std::net::IpAddr>) -> Self {
        self.trusted_proxies = proxies.into_iter().map(|ip| ip.to_canonical()).collect();
        self
    }

    /// Who sent a request that came from `peer`: the peer, or, from a trusted proxy, the
    /// client `X-Forwarded-For` names (the unspecified address when it names none); and
    /// whether the client's connection is TLS.
    fn client_of(
        &self,
        peer: std::net::SocketAddr,
        over_tls: bool,
        headers: &axum::http::HeaderMap,
    ) -> (std::net::SocketAddr, bool) {
        let trusted = |ip: &std::net::IpAddr| self.trusted_proxies.contains(&ip.to_canonical());
        if !trusted(&peer.ip()) {
            return (peer, over_tls);
        }
        // Each proxy appends the address it was reached from: the client is the last one
        // that is not a proxy of ours (those left of it, the client could have written,
        // bytes that are not text included: they do not hide the hops after them).
        let hops: Vec<&[u8]> = headers
            .get_all("x-forwarded-for")
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .collect();
        // A client the proxies do not name is no one in particular, never the proxy
        // itself (a proxy on this host would exempt it from the caps on one client).
        let unknown =
            std::net::SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), peer.port());
        let mut client = unknown;
        for hop in hops.iter().rev() {
            let Some(ip) = hop_address(hop) else {
                client = unknown;
                break;
            };
            client = std::net::SocketAddr::new(ip, peer.port());
            if !trusted(&ip) {
                break;
            }
        }
        // The scheme the client used is what the proxy it reached says: the first one.
        let https = headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next())
            .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"));
        (client, over_tls || https)
    }
}

/// The address of one `X-Forwarded-For` hop: an IP address, or one with a port
/// (`203.0.113.5:4711`, `[2001:db8::1]:4711`), as some proxies write it.
fn hop_address(hop: &[u8]) -> Option<std::net::IpAddr> {
    let hop = std::str::from_utf8(hop).ok()?.trim();
    let ip = hop
        .parse::<std::net::IpAddr>()
        .or_else(|_| hop.parse::<std::net::SocketAddr>().map(|a| a.ip()))
        .ok()?;
    Some(ip.to_canonical())
}

/// A warning that repeats: logged at most every 10 s, with how many times it happened.
#[derive(Default)]
struct Warnings {
    last: Option<std::time::Instant>,
    since: u64,
}

impl Warnings {
    fn warn(&mut self, log: impl FnOnce(u64)) {
        self.since += 1;
        if self
            .last
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(10))
        {
            log(self.since);
            self.last = Some(std::time::Instant::now());
            self.since = 0;
        }
    }
}

/// Answers a connection the server has no room for: 503 with `Retry-After`, then closes.
async fn refuse_connection(mut socket: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt as _;
    let body = r#"{"code":"server.too_many_connections","message":"this server has as many connections open as it may; retry in a moment"}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = socket.write_all(answer.as_bytes()).await;
        let _ = socket.shutdown().await;
    })
    .await;
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

/// Slots for live streams and long polls; each holds one for as long as it is open, and
/// one client address holds at most half of them (loopback excepted: a proxy on the same
/// host brings everyone's requests from it).
#[derive(Clone)]
pub(crate) struct StreamSlots {
    all: Arc<Semaphore>,
    per_client: usize,
    clients: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
}

/// A slot of [`StreamSlots`], given back when dropped.
pub(crate) struct Slot {
    _all: tokio::sync::OwnedSemaphorePermit,
    client: Option<(std::net::IpAddr, StreamSlots)>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((ip, slots)) = &self.client {
            let mut clients = slots
                .clients
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(n) = clients.get_mut(ip) {
                *n -= 1;
                if *n == 0 {
                    clients.remove(ip);
                }
            }
        }
    }
}

impl StreamSlots {
    pub(crate) fn new(max: usize) -> Self {
        StreamSlots {
            all: Arc::new(Semaphore::new(max)),
            per_client: (max / 2).max(1),
            clients: Arc::default(),
        }
    }

    /// A slot for `client`, or why there is none: every slot is taken, or this client holds
    /// its share.
    pub(crate) fn take(&self, client: Option<std::net::SocketAddr>) -> Result<Slot, &'static str> {
        let ip = client
            .map(|c| c.ip().to_canonical())
            .filter(|ip| !ip.is_loopback());
        let all = Arc::clone(&self.all)
            .try_acquire_owned()
            .map_err(|_| "too many live streams and waits are open; retry later")?;
        let Some(ip) = ip else {
            return Ok(Slot {
                _all: all,
                client: None,
            });
        };
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let held = clients.entry(ip).or_insert(0);
        if *held >= self.per_client {
            return Err(
                "this client has its share of the live streams and waits open; close one or retry later",
            );
        }
        *held += 1;
        Ok(Slot {
            _all: all,
            client: Some((ip, self.clone())),
        })
    }
}

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
        Ok(Err(e)) if too_large(&e) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload.too_large",
                format!("the request body is larger than {} bytes", crate::MAX_BODY),
            )
            .into_response();
        }
        Ok(Err(e)) => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                "request.malformed",
                format!("the request body could not be read: {e}"),
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

/// Whether reading a body failed for its size (not for a broken chunk or connection).
fn too_large(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        if error.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// Marks a request that came over TLS.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OverTls;

/// Serves `router` on `listener` until `shutdown` resolves, then ends the live streams,
/// stops accepting, and waits for the requests in progress.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: &Limits,
    tls: Option<crate::tls::Tls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (closing_tx, closing_rx) = watch::channel(false);
    // Each connection's task holds a sender: once all are dropped, every connection has
    // ended. (hyper-util's GracefulShutdown does not take a connection that may be
    // upgraded, which a worker's WebSocket is.)
    let (alive, mut all_ended) = tokio::sync::mpsc::channel::<()>(1);
    let mut shutdown = std::pin::pin!(shutdown);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let mut failed_accepts = Warnings::default();
    let mut refused = Warnings::default();
    loop {
        let (socket, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning,
                    // and say so once in a while, not every time.
                    failed_accepts.warn(|n| tracing::warn!(error = %e, failures = n, "accepting connections failed"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.as_mut() => break,
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            // Every connection is taken: answer at once (there is a descriptor in reserve
            // for it) rather than leave the client in the listen backlog.
            refused.warn(|n| {
                tracing::warn!(
                    refused = n,
                    max = limits.max_connections,
                    "too many connections; answering 503"
                )
            });
            tokio::spawn(refuse_connection(socket));
            continue;
        };
        let _ = socket.set_nodelay(true);
        // Handlers that care who is asking (the login's throttle) read the peer's address,
        // and the login whether the connection is TLS (its cookie is `Secure` then); waits
        // and streams end when the server begins to close. Set here, not by a layer of the
        // router, which would cost each request a boxed future. The flag says a request
        // has come (see the TLS branch).
        let over_tls = tls.is_some();
        let asked = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = Arc::clone(&asked);
        let closes = closing_rx.clone();
        let who = limits.clone();
        let service = TowerToHyperService::new(tower::ServiceExt::map_request(
            router.clone(),
            move |mut request: hyper::Request<hyper::body::Incoming>| {
                seen.store(true, std::sync::atomic::Ordering::Relaxed);
                let (client, over_tls) = who.client_of(peer, over_tls, request.headers());
                let extensions = request.extensions_mut();
                extensions.insert(axum::extract::ConnectInfo(client));
                extensions.insert(Closing(closes.clone()));
                if over_tls {
                    extensions.insert(OverTls);
                }
                request
            },
        ));
        let mut closing = closing_rx.clone();
        let alive = alive.clone();
        if let Some(tls) = &tls {
            let (acceptor, header_timeout) = (tls.acceptor.clone(), limits.header_timeout);
            tokio::spawn(async move {
                // The handshake within the header timeout: a client that opens a
                // connection and sends nothing does not keep it.
                let Ok(Ok(stream)) =
                    tokio::time::timeout(header_timeout, acceptor.accept(socket)).await
                else {
                    drop(permit);
                    return;
                };
                // The protocol is the one ALPN agreed on, never guessed from the first
                // bytes (a guess waits for them without a deadline). A connection that
                // has not asked anything within the header timeout is closed: HTTP/2 has
                // no header timeout of its own.
                let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
                let first_request = async {
                    tokio::time::sleep(header_timeout).await;
                    if asked.load(std::sync::atomic::Ordering::Relaxed) {
                        std::future::pending::<()>().await;
                    }
                };
                macro_rules! drive {
                    ($connection:expr) => {{
                        let mut connection = std::pin::pin!($connection);
                        tokio::select! {
                            _ = connection.as_mut() => {}
                            () = first_request => {}
                            () = async { let _ = closing.wait_for(|closing| *closing).await; } => {
                                connection.as_mut().graceful_shutdown();
                                let _ = connection.await;
                            }
                        }
                    }};
                }
                if h2 {
                    drive!(
                        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .timer(TokioTimer::new())
                            // A peer that stops answering pings is gone.
                            .keep_alive_interval(Some(Duration::from_secs(20)))
                            .keep_alive_timeout(Duration::from_secs(20))
                            .serve_connection(TokioIo::new(stream), service)
                    );
                } else {
                    drive!(
                        hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(header_timeout)
                            .serve_connection(TokioIo::new(JsonRejections::new(stream)), service)
                            .with_upgrades()
                    );
                }
                drop(permit);
                drop(alive);
            });
            continue;
        }
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .serve_connection(TokioIo::new(JsonRejections::new(socket)), service)
            // Workers' WebSockets (`/api/workers`) take the connection over.
            .with_upgrades();
        tokio::spawn(async move {
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = async { let _ = closing.wait_for(|closing| *closing).await; } => {
                    // Finish the request in progress, then close (an upgraded connection
                    // has left already: its WebSocket ends with the engine's sessions).
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(permit);
            drop(alive);
        });
    }
    drop(listener);
    drop(alive);
    closing_tx.send_replace(true);
    if tokio::time::timeout(limits.shutdown_grace, all_ended.recv())
        .await
        .is_err()
    {
        tracing::warn!("requests still in progress at the shutdown deadline were dropped");
    }
    Ok(())
}
