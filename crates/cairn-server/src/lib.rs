//! Cairn's HTTP API: routes shaped like Cloudflare's Workflows API under `/api`, over an
//! [`Engine`]. Embed it with [`router`] or run it with [`serve`].
//!
//! Every error is JSON `{"code": "instance.not_found", "message": "…"}` with a stable code
//! and the matching HTTP status.
//!
//! ```no_run
//! # async fn demo(engine: cairn::Engine) -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8787").await?;
//! cairn_server::serve(engine, listener, std::future::pending()).await
//! # }
//! ```

mod actions;
mod audit;
mod auth;
mod bulk;
mod cloudflare;
mod dashboard;
mod error;
mod openapi;
mod origin;
mod prometheus;
mod routes;
mod schedules;
mod serve;
mod stream;
mod tls;
mod workers;

use std::future::Future;

use cairn::Engine;

pub use auth::{Scope, Token, Tokens};
pub use error::ApiError;
pub use prometheus::Metrics;
pub use serve::{Limits, raise_fd_limit};
pub use tls::Tls;

/// The largest request body accepted: 1 MiB of payload, as base64 when it is bytes (which
/// count as their bytes against the payload limit), plus room for the envelope.
pub const MAX_BODY: usize = (1 << 20) * 4 / 3 + 64 * 1024;

/// The API's routes (and the dashboard) over `engine`, without a token: they answer only
/// requests that name a loopback host and, for changes, come from no other site (see
/// [`Options::any_host`] to serve behind an authenticating proxy).
pub fn router(engine: Engine) -> Router {
    router_with(engine, None)
}

/// The API's routes over `engine`; with a `token`, every request must carry
/// `Authorization: Bearer <token>` (401 `auth.unauthorized` otherwise).
pub fn router_with(engine: Engine, token: Option<String>) -> Router {
    router_with_limits(engine, token, &Limits::default())
}

/// [`router_with`], with the body timeout and the cap on live streams of `limits`.
pub fn router_with_limits(engine: Engine, token: Option<String>, limits: &Limits) -> Router {
    router_with_options(
        engine,
        Options {
            token,
            limits: limits.clone(),
            ..Options::default()
        },
    )
}

/// [`router_with_limits`], and `GET /metrics` in Prometheus' text format from `metrics`
/// (behind the token like every route).
pub fn router_with_metrics(
    engine: Engine,
    token: Option<String>,
    limits: &Limits,
    metrics: Metrics,
) -> Router {
    router_with_options(
        engine,
        Options {
            token,
            limits: limits.clone(),
            metrics: Some(metrics),
            ..Options::default()
        },
    )
}

/// How [`router_with_options`] serves.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Every request must carry `Authorization: Bearer <token>` (`/healthz` excepted): one
    /// token named `default` with the `admin` scope, added to [`Options::tokens`] at start
    /// (a later [`Tokens::replace`] must list it again to keep it).
    pub token: Option<String>,
    /// Named tokens, each with its scope, replaceable while the server runs. With neither
    /// these nor [`Options::token`] the server has no token (see [`Options::any_host`]).
    pub tokens: Option<Tokens>,
    /// Body timeout and the cap on live streams.
    pub limits: Limits,
    /// Serve `GET /metrics` from this recorder.
    pub metrics: Option<Metrics>,
    /// The only account id Cloudflare's routes accept (`/client/v4/accounts/{id}/…`);
    /// any when `None`.
    pub account_id: Option<String>,
    /// Without a token, answer requests that name any host, from any site. By default a
    /// server without a token answers only requests to a loopback host name that a browser
    /// does not mark as coming from another site, so that no web page can drive it (DNS
    /// rebinding, cross-site POSTs). Set this only when something in front of the server
    /// authenticates every request.
    pub any_host: bool,
    /// Let Cloudflare's destructive routes (a workflow's delete, the terminate of all its
    /// instances) answer without [`Options::account_id`]: by default they need it, so that
    /// a client pointed here by mistake, with any account id, cannot wipe this server.
    pub cloudflare_any_account: bool,
}

/// The API's routes (`/api` and Cloudflare's `/client/v4`) over `engine`, served as
/// `options` say.
pub fn router_with_options(engine: Engine, options: Options) -> Router {
    let Options {
        token,
        tokens,
        limits,
        metrics,
        account_id,
        any_host,
        cloudflare_any_account,
    } = options;
    let limits = &limits;
    // An empty or blank token is no token: it would let in anyone who sends nothing (and
    // log the dashboard in with an empty form), and the loopback-only rule would not apply.
    let default = token.and_then(|t| Token::new("default", &t, Scope::Admin));
    let tokens = match (tokens, default) {
        (Some(tokens), Some(default)) => {
            let mut all = tokens.list();
            all.push(default);
            tokens.replace(all);
            Some(tokens)
        }
        (Some(tokens), None) => Some(tokens),
        (None, Some(default)) => Some(Tokens::new(vec![default])),
        (None, None) => None,
    };
    let body_timeout = limits.body_timeout;
    let cloudflare = cloudflare::routes()
        .route_layer(axum::middleware::from_fn(cloudflare::check_account))
        .layer(axum::Extension(cloudflare::Config {
            account_id,
            any_account_destroys: cloudflare_any_account,
            started: engine.clock().now(),
            jobs: cloudflare::Jobs::default(),
        }));
    let routes = match metrics {
        Some(metrics) => routes::routes().route(
            "/metrics",
            axum::routing::get(
                move |axum::extract::State(engine): axum::extract::State<Engine>| {
                    let metrics = metrics.clone();
                    async move { prometheus::scrape(&engine, &metrics).await }
                },
            ),
        ),
        None => routes::routes(),
    };
    let guard = dashboard::Guard::new(tokens.clone());
    // The dashboard has its own gate (a login form and a session cookie, not a header);
    // the layers below cover it as they cover the API.
    let routes = routes
        .merge(cloudflare)
        .merge(dashboard::routes(guard.clone()))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(engine.clone());
    let gate = match tokens {
        Some(tokens) => Gate::Tokens(tokens, guard),
        // No token: loopback only, and only from this origin (see `auth::local_only`).
        None if any_host => Gate::Open,
        None => Gate::LocalOnly,
    };
    let admission = std::sync::Arc::new(Admission {
        gate,
        body_timeout,
        slots: serve::StreamSlots::new(limits.max_streams),
    });
    // Outermost: also axum's own answers (no route, wrong method) become JSON errors, and
    // every request is logged with its final status.
    routes
        .layer(axum::middleware::from_fn(move |req, next| {
            admit(std::sync::Arc::clone(&admission), req, next)
        }))
        .layer(axum::middleware::from_fn(answer))
}

/// What lets a request in ([`admit`]).
struct Admission {
    gate: Gate,
    /// How long its body may take to arrive.
    body_timeout: std::time::Duration,
    /// The live streams' and waits' slots, which the handlers find among the request's
    /// extensions.
    slots: serve::StreamSlots,
}

/// Who may come in.
enum Gate {
    /// A token whose scope covers the route, or a dashboard session that only reads
    /// ([`auth::check`]).
    Tokens(Tokens, std::sync::Arc<dashboard::Guard>),
    /// No token: loopback only, from no other site ([`auth::local_only`]).
    LocalOnly,
    /// No token, any host (`--any-host`): everyone.
    Open,
}

/// The gate, then the body read within its timeout ([`serve::read_body_within`]), in one
/// layer (each layer of its own costs every request a boxed future and a clone of the
/// service under it). A request the gate refuses has no body read (the dashboard's pages,
/// which this gate lets through to their own when there are tokens, are read first).
async fn admit(
    admission: std::sync::Arc<Admission>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    req.extensions_mut().insert(admission.slots.clone());
    let inner = |req| serve::read_body_within(admission.body_timeout, req, next);
    // Load balancers probe `/healthz` without credentials, under any host name; it reveals
    // nothing else.
    if req.uri().path() == "/healthz" {
        return inner(req).await;
    }
    match &admission.gate {
        // The dashboard's pages have their own gate (its login form and its sessions' scopes).
        Gate::Tokens(..) if dashboard::owns(req.uri().path()) => inner(req).await,
        Gate::Tokens(tokens, guard) => {
            auth::check(tokens.clone(), |h| guard.session_caller(h), req, inner).await
        }
        Gate::LocalOnly => auth::local_only(req, inner).await,
        Gate::Open => inner(req).await,
    }
}

/// What every answer goes through last, in one layer (each layer of its own costs every
/// request a boxed future and a clone of the service under it): an error that is not JSON
/// yet becomes `{code, message}` ([`error::json_errors`]), then Cloudflare's envelope under
/// its prefix ([`cloudflare::envelope`]); then one log line per request at info (target
/// `cairn::http`): method, route template, status and duration. Never the query, the body
/// or the headers (the token is in a header).
async fn answer(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let method = req.method().clone();
    // A `Uri`'s clone shares its bytes: no copy of the path for the answers without errors.
    let uri = req.uri().clone();
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "(no route)".to_owned(), |p| p.as_str().to_owned());
    let start = std::time::Instant::now();
    let response = next.run(req).await;
    let response = error::json_errors(&method, uri.path(), response).await;
    let response = cloudflare::envelope(uri.path(), response).await;
    prometheus::request(&method, &route, response.status().as_u16(), start.elapsed());
    tracing::info!(
        target: "cairn::http",
        method = %method,
        route = %route,
        status = response.status().as_u16(),
        ms = start.elapsed().as_secs_f64() * 1e3,
        "request"
    );
    response
}

pub use axum::Router;

/// Serves an already-built router (see [`router_with`]) on `listener` until `shutdown`;
/// then ends the live streams, stops accepting, and waits for the requests in progress.
///
/// # Errors
/// When the listener fails.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve::serve(listener, router, &Limits::default(), None, shutdown).await
}

/// [`serve_router`] with `limits`' header timeout.
///
/// # Errors
/// When the listener fails.
pub async fn serve_router_with(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve::serve(listener, router, &limits, None, shutdown).await
}

/// [`serve_router_with`] over TLS: HTTP/2 or HTTP/1.1 as the client's ALPN asks, the
/// handshake within the header timeout. `tls` may be watched ([`Tls::watch`]) for a
/// renewed certificate.
///
/// # Errors
/// When the listener fails.
pub async fn serve_router_tls(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: Limits,
    tls: Tls,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve::serve(listener, router, &limits, Some(tls), shutdown).await
}

/// Serves the API on `listener` until `shutdown` resolves.
///
/// # Errors
/// When the listener fails.
pub async fn serve(
    engine: Engine,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_router(listener, router(engine), shutdown).await
}
