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
                    let burst = send_burst(&mut socket, frame, || connection.queued_frame());
                    match tokio::time::timeout(SILENT_FOR, burst).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => break,
                        Err(_) => {
                            tracing::info!(session = connection.session(), "a worker took no frames for 30 s; closing its connection");
                            break;
                        }
                    }
                }
                // The engine is stopping: the worker reconnects to the next.
                None => {
                    close_within(&mut socket, close_code::AWAY, "the server is stopping").await;
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
                let pinged = socket.send(Message::Ping(Vec::new().into()));
                if !matches!(tokio::time::timeout(SILENT_FOR, pinged).await, Ok(Ok(()))) {
                    break;
                }
            }
        }
    }
    // Dropping the connection is the worker going away: its runs run again elsewhere.
    drop(connection);
}

/// Sends `first` and every frame queued behind it (up to 64 more) in one write, one flush,
/// not a system call each: answers to many runs come in bursts. The caller bounds it in
/// time: a worker that stops reading (stopped, or its event loop blocked) fills the
/// socket's buffers, and this would wait for ever, never getting back to the silence
/// check, while the worker's runs hold their slots.
async fn send_burst<S>(
    socket: &mut S,
    first: String,
    mut queued: impl FnMut() -> Option<String>,
) -> Result<(), S::Error>
where
    S: futures::Sink<Message> + Unpin,
{
    socket.feed(Message::Text(first.into())).await?;
    for _ in 0..64 {
        let Some(frame) = queued() else { break };
        socket.feed(Message::Text(frame.into())).await?;
    }
    socket.flush().await
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
    // Bounded like every write: a stopped worker whose token was removed (a likely answer
    // to a hung worker) must still be let go.
    close_within(
        socket,
        close_code::POLICY,
        "its token is no longer accepted",
    )
    .await;
}

/// Sends a close frame with `code` and `reason`, giving up after the silence limit: a
/// worker that stopped reading would otherwise hold the connection for ever.
async fn close_within(socket: &mut WebSocket, code: u16, reason: &'static str) {
    let close = socket.send(Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    })));
    let _ = tokio::time::timeout(SILENT_FOR, close).await;
}

/// Sends `frame` (an `error`) and closes.
async fn refuse(mut socket: WebSocket, frame: String) {
    let sent = async {
        socket.send(Message::Text(frame.into())).await?;
        socket
            .send(Message::Close(Some(CloseFrame {
                code: close_code::POLICY,
                reason: "refused".into(),
            })))
            .await
    };
    let _ = tokio::time::timeout(SILENT_FOR, sent).await;
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;

    /// A socket whose peer never reads: once its buffer is full, nothing more goes out.
    struct Full;

    impl futures::Sink<Message> for Full {
        type Error = std::io::Error;
        fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Pending
        }
        fn start_send(self: Pin<&mut Self>, _: Message) -> Result<(), Self::Error> {
            Ok(())
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Pending
        }
        fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Pending
        }
    }

    /// The defect: a worker that stopped reading held its connection (and its runs' slots)
    /// for ever, the pump stuck in a write that never completed. Bounded as the session
    /// bounds it, the write gives up after `SILENT_FOR`.
    #[tokio::test(start_paused = true)]
    async fn a_worker_that_stops_reading_is_let_go_after_the_silence_limit() {
        let started = tokio::time::Instant::now();
        let mut socket = Full;
        let burst = send_burst(&mut socket, "frame".to_owned(), || None);
        assert!(tokio::time::timeout(SILENT_FOR, burst).await.is_err());
        assert_eq!(started.elapsed(), SILENT_FOR);
    }
}
