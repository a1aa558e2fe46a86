//! `GET /api/workers`: the WebSocket workers connect to (`docs/worker-protocol.md`). The
//! engine speaks the protocol ([`cairn::WorkerConnection`]); this pumps its frames between
//! the socket and the engine, checks the worker is alive, and closes what breaks.

use std::time::Duration;

use axum::extract::State;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use cairn::{Engine, MAX_WORKER_FRAME};
use futures::SinkExt;
use serde_json::json;

use crate::error::ApiError;

/// How long a worker has to say `hello`.
const HELLO_WITHIN: Duration = Duration::from_secs(10);

/// How often the server pings a worker.
const PING_EVERY: Duration = Duration::from_secs(10);

/// A worker that has sent nothing (not even a pong) for this long is gone.
const SILENT_FOR: Duration = Duration::from_secs(30);

pub(crate) fn routes() -> Router<Engine> {
    Router::new()
        .route("/api/workers", get(connect).fallback(list_only))
        .route("/api/workers/connected", get(connected))
}

/// Any other method: the code and `Allow` header of every wrong method, with a hint.
async fn list_only() -> Response {
    (
        [(axum::http::header::ALLOW, "GET")],
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method.not_allowed",
            "workers connect with a WebSocket: GET /api/workers with Upgrade: websocket",
        ),
    )
        .into_response()
}

/// The workers connected to this server now.
async fn connected(State(engine): State<Engine>) -> Json<serde_json::Value> {
    Json(json!({ "workers": engine.workers() }))
}

async fn connect(
    State(engine): State<Engine>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    // A web page may open a WebSocket to any host, with the user's cookies: a worker is a
    // program, never a page of another site.
    if crate::origin::cross_site(&headers) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "auth.cross_site",
            "a page of another site may not connect as a worker",
        )
        .into_response();
    }
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade,
        Err(rejection) => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                "request.not_websocket",
                format!("workers connect with a WebSocket: {rejection}"),
            )
            .into_response();
        }
    };
    // Room for a frame of the largest value and the JSON around it.
    let limit = MAX_WORKER_FRAME + 64 * 1024;
    // Read here, in the request's task: axum runs the upgrade's callback in a task of its
    // own, where the request's grant is not set.
    let grant = crate::auth::grant();
    upgrade
        .max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |socket| session(engine, socket, grant))
}

/// A worker's connection, let in by `grant` (none without tokens): it ends when the grant
/// does (its token removed from the set), checked at each ping.
async fn session(engine: Engine, mut socket: WebSocket, grant: Option<crate::auth::Grant>) {
    let hello = match tokio::time::timeout(HELLO_WITHIN, socket.recv()).await {
        Ok(Some(Ok(Message::Text(text)))) => text,
        Ok(Some(Ok(_))) => {
            refuse(
                socket,
                r#"{"type":"error","code":"protocol.malformed","message":"the first frame is a `hello`, as text"}"#.to_owned(),
            )
            .await;
            return;
        }
        Err(_) => {
            refuse(
                socket,
                r#"{"type":"error","code":"protocol.malformed","message":"no `hello` within 10 s"}"#
                    .to_owned(),
            )
            .await;
            return;
        }
        Ok(_) => return,
    };
    let mut connection = match engine.connect_worker(hello.as_str()).await {
        Ok(connection) => connection,
        Err(refused) => {
            tracing::info!(code = refused.code(), "refused a worker: {refused}");
            refuse(socket, refused.frame()).await;
            return;
        }
    };
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heard = tokio::time::Instant::now();
    loop {
        tokio::select! {
            frame = connection.next_frame() => match frame {
                Some(frame) => {
                    // Every frame queued by now goes out in one write (one flush), not a
                    // system call each: answers to many runs come in bursts.
                    let mut sent = socket.feed(Message::Text(frame.into())).await;
                    let mut more = 0;
                    while sent.is_ok() && more < 64 {
                        let Some(frame) = connection.queued_frame() else { break };
                        sent = socket.feed(Message::Text(frame.into())).await;
                        more += 1;
                    }
                    if sent.is_err() || socket.flush().await.is_err() {
                        break;
                    }
                }
                // The engine is stopping: the worker reconnects to the next.
                None => {
                    let _ = socket
                        .send(Message::Close(Some(CloseFrame {
                            code: close_code::AWAY,
                            reason: "the server is stopping".into(),
                        })))
                        .await;
                    break;
                }
            },
            message = socket.recv() => {
                heard = tokio::time::Instant::now();
                // A removed token's worker is cut at its next frame: nothing it sends
                // after the removal counts.
                if revoked(grant.as_ref()) {
                    close_revoked(&mut socket, connection.session()).await;
                    break;
                }
                match message {
                    Some(Ok(Message::Text(text))) => connection.receive(text.as_str()),
                    Some(Ok(Message::Binary(_))) => connection.receive("binary"),
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                    Some(Ok(Message::Close(_)) | Err(_)) | None => break,
                }
            }
            _ = ping.tick() => {
                if revoked(grant.as_ref()) {
                    close_revoked(&mut socket, connection.session()).await;
                    break;
                }
                if heard.elapsed() > SILENT_FOR {
                    tracing::info!(session = connection.session(), "a worker sent nothing for 30 s; closing its connection");
                    break;
                }
                if socket.send(Message::Ping(Vec::new().into())).await.is_err() {
                    break;
                }
            }
        }
    }
    // Dropping the connection is the worker going away: its runs run again elsewhere.
    drop(connection);
}

/// Whether the token that let a worker in has left the set since (never, without tokens).
fn revoked(grant: Option<&crate::auth::Grant>) -> bool {
    grant.is_some_and(|g| !g.in_force())
}

/// Closes the connection of `session`, a worker whose token was removed (1008, policy).
async fn close_revoked(socket: &mut WebSocket, session: u64) {
    tracing::info!(
        session,
        "a worker's token was removed; closing its connection"
    );
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code: close_code::POLICY,
            reason: "its token is no longer accepted".into(),
        })))
        .await;
}

/// Sends `frame` (an `error`) and closes.
async fn refuse(mut socket: WebSocket, frame: String) {
    let _ = socket.send(Message::Text(frame.into())).await;
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code: close_code::POLICY,
            reason: "refused".into(),
        })))
        .await;
}
