//! The server under slow and greedy clients, on a real socket: read timeouts, the cap on
//! live streams, and streams that end when the server shuts down.

use std::time::{Duration, Instant};

use cairn::prelude::*;
use cairn_server::Limits;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Wait;

impl Workflow for Wait {
    const NAME: &'static str = "wait";
    type Params = Value;
    type Output = Value;

    async fn run(
        &self,
        _: WorkflowEvent<Value>,
        step: WorkflowStep,
    ) -> Result<Value, WorkflowError> {
        let e: StepEvent<Value> = step.wait_for_event("go", "go").await?;
        Ok(e.payload)
    }
}

struct Server {
    port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    engine: cairn::Engine,
    _dir: tempfile::TempDir,
}

async fn start(limits: Limits) -> Server {
    start_with(cairn_server::Options {
        limits,
        ..Default::default()
    })
    .await
}

/// [`start`] with every option of the router (tokens, …).
async fn start_with(options: cairn_server::Options) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let engine = cairn::Engine::builder()
        .sqlite(dir.path().join("cairn.db"))
        .register(Wait)
        .start()
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let limits = options.limits.clone();
    let router = cairn_server::router_with_options(engine.clone(), options);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(cairn_server::serve_router_with(
        listener,
        router,
        limits,
        async move {
            let _ = stopped.await;
        },
    ));
    Server {
        port,
        stop: Some(stop),
        served,
        engine,
        _dir: dir,
    }
}

/// Reads until the peer closes or `limit` passes; returns what arrived and whether it closed.
async fn read_until_closed(socket: &mut TcpStream, limit: Duration) -> (String, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, socket.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into(), true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into(), false),
        }
    }
}

async fn request(port: u16, raw: &str) -> String {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    socket.write_all(raw.as_bytes()).await.unwrap();
    read_until_closed(&mut socket, Duration::from_secs(5))
        .await
        .0
}

/// A client that sends half its headers, or half its body, loses its connection after
/// the timeout instead of holding it for minutes (before the token check, too).
#[tokio::test]
async fn slow_clients_are_timed_out_reading_headers_and_bodies() {
    let limits = Limits::default()
        .header_timeout(Duration::from_millis(300))
        .body_timeout(Duration::from_millis(300));
    let server = start(limits).await;
    let started = Instant::now();
    let mut headers = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    headers
        .write_all(b"POST /api/workflows/wait/instances HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let (_, closed) = read_until_closed(&mut headers, Duration::from_secs(5)).await;
    assert!(closed, "half-sent headers must not hold the connection");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    let mut body = TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    body.write_all(
        b"POST /api/workflows/wait/instances HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"params\":",
    )
    .await
    .unwrap();
    let (answer, _) = read_until_closed(&mut body, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"request.timeout\""), "{answer}");
    // Nothing was created by the half request.
    let list = request(
        server.port,
        "GET /api/workflows/wait/instances HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(list.contains("\"instances\":[]"), "{list}");
    stop(server).await;
}

/// Review finding: a body that breaks off (a malformed chunk, a connection closed before
/// its Content-Length) was answered 413 `payload.too_large`, "larger than 1463637 bytes":
/// clients and metrics saw a size problem that was not there. It is a 400 now.
#[tokio::test]
async fn a_malformed_body_is_a_bad_request_not_one_too_large() {
    let server = start(Limits::default()).await;
    let answer = request(
        server.port,
        "POST /api/workflows/wait/instances HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("\"code\":\"request.malformed\""),
        "{answer}"
    );
    // One over the limit is still 413.
    let big = format!(
        "POST /api/workflows/wait/instances HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{}\r\n0\r\n\r\n",
        cairn_server::MAX_BODY + 1,
        " ".repeat(cairn_server::MAX_BODY + 1)
    );
    let answer = request(server.port, &big).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains("\"code\":\"payload.too_large\""),
        "{answer}"
    );
    stop(server).await;
}

/// A dashboard login over the socket, as sent through a proxy that says `forwarded`.
async fn login_via(port: u16, forwarded: &str, token: &str) -> String {
    let body = format!("token={token}&next=%2F");
    request(
        port,
        &format!(
            "POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/x-www-form-urlencoded\r\nX-Forwarded-For: {forwarded}\r\nX-Forwarded-Proto: https\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await
}

/// Review finding: behind a proxy every login came from the proxy's address, so one wrong
/// token a minute from anyone kept everyone's right token out (429), and the session
/// cookie was never `Secure`. From a trusted proxy, `X-Forwarded-For` names the client
/// and `X-Forwarded-Proto` its scheme; from anyone else they are ignored.
#[tokio::test]
async fn behind_a_trusted_proxy_a_wrong_login_throttles_only_its_own_client() {
    let options = |trusted: Vec<std::net::IpAddr>| cairn_server::Options {
        token: Some("s3cret".into()),
        limits: Limits::default().trusted_proxies(trusted),
        ..Default::default()
    };
    let server = start_with(options(vec!["127.0.0.1".parse().unwrap()])).await;
    let wrong = login_via(server.port, "203.0.113.5", "guess").await;
    assert!(wrong.starts_with("HTTP/1.1 303"), "{wrong}");
    // Another client, behind the same proxy: let in, with a Secure cookie.
    let right = login_via(server.port, "198.51.100.7, 203.0.113.6", "s3cret").await;
    assert!(right.starts_with("HTTP/1.1 303"), "{right}");
    let cookie = right
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_default();
    assert!(cookie.contains("; Secure"), "{right}");
    // The client that sent the wrong token waits, however it writes its own hops (bytes
    // that are not text, a port).
    let again = login_via(server.port, "203.0.113.5", "s3cret").await;
    assert!(again.starts_with("HTTP/1.1 429"), "{again}");
    let again = login_via(server.port, "\u{ff}, 203.0.113.5:4711", "s3cret").await;
    assert!(again.starts_with("HTTP/1.1 429"), "{again}");
    stop(server).await;
    // Not from a trusted proxy: the headers are the client's own words, and ignored.
    let server = start_with(options(Vec::new())).await;
    login_via(server.port, "203.0.113.5", "guess").await;
    let spoofed = login_via(server.port, "203.0.113.6", "s3cret").await;
    assert!(spoofed.starts_with("HTTP/1.1 429"), "{spoofed}");
    stop(server).await;
}

async fn open_stream(port: u16, id: &str) -> (TcpStream, String) {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    socket
        .write_all(
            format!(
                "GET /api/workflows/wait/instances/{id}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = socket.read(&mut buf).await.unwrap();
    let head = String::from_utf8_lossy(&buf[..n]).into_owned();
    (socket, head)
}

/// Live streams are capped: one over the cap gets 503 `stream.too_many`; a closed stream
/// gives its slot back. At shutdown every open stream ends and the server returns.
#[tokio::test]
async fn live_streams_are_capped_and_end_at_shutdown() {
    let server = start(Limits::default().max_streams(2)).await;
    server
        .engine
        .workflow::<Wait>()
        .create(cairn::CreateOptions::new(json!({})).id("a"))
        .await
        .unwrap();
    let (first, head) = open_stream(server.port, "a").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (mut second, _) = open_stream(server.port, "a").await;
    let (_, refused) = open_stream(server.port, "a").await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("stream.too_many"), "{refused}");
    drop(first);
    let mut reopened = None;
    for _ in 0..100 {
        let (socket, head) = open_stream(server.port, "a").await;
        if head.starts_with("HTTP/1.1 200") {
            reopened = Some(socket);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut reopened = reopened.expect("a closed stream gives its slot back");
    let started = Instant::now();
    let Server {
        stop,
        served,
        engine,
        ..
    } = server;
    stop.unwrap().send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the server returns with streams open")
        .unwrap()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    for socket in [&mut second, &mut reopened] {
        let (_, closed) = read_until_closed(socket, Duration::from_secs(5)).await;
        assert!(closed, "the stream ended at shutdown");
    }
    engine.shutdown().await;
}

async fn stop(server: Server) {
    let Server {
        stop,
        served,
        engine,
        ..
    } = server;
    stop.unwrap().send(()).unwrap();
    served.await.unwrap().unwrap();
    engine.shutdown().await;
}

fn post_json(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
}

fn json_of(answer: &str) -> serde_json::Value {
    serde_json::from_str(answer.split_once("\r\n\r\n").map_or("", |(_, b)| b)).unwrap()
}

/// Create-and-wait in one request (`?wait=`), and the long poll (`…/wait?timeout=`): the
/// answer comes when the instance finishes (here: when its event arrives), not at the
/// timeout; a timeout answers the status then; at shutdown a wait answers at once.
#[tokio::test]
async fn waits_answer_when_the_instance_finishes_or_at_the_timeout() {
    let server = start(Limits::default()).await;
    let port = server.port;
    // Not finished within the wait: the answer is its status then.
    let started = Instant::now();
    let answer = request(
        port,
        &post_json(
            "/api/workflows/wait/instances?wait=300ms",
            r#"{"instance_id": "w1"}"#,
        ),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    let settled = json_of(&answer);
    assert_eq!(settled["id"], "w1");
    assert!(
        ["queued", "running", "waiting"].contains(&settled["status"].as_str().unwrap()),
        "{settled}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );

    // A long poll answers as soon as the event completes the instance.
    let raw = get("/api/workflows/wait/instances/w1/wait?timeout=20s");
    let poll = tokio::spawn(async move { request(port, &raw).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sent = Instant::now();
    let answer = request(
        port,
        &post_json("/api/workflows/wait/instances/w1/events/go", r#"{"n": 7}"#),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let answer = poll.await.unwrap();
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "{:?}",
        sent.elapsed()
    );
    let settled = json_of(&answer);
    assert_eq!(settled["status"], "complete", "{settled}");
    assert_eq!(settled["output"]["n"], 7);

    // More than the limit is refused, with the way to wait longer.
    let answer = request(
        port,
        &get("/api/workflows/wait/instances/w1/wait?timeout=2m"),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("ask again"), "{answer}");

    // At shutdown, a wait in progress answers at once.
    let raw = post_json(
        "/api/workflows/wait/instances?wait=50s",
        r#"{"instance_id": "w2"}"#,
    );
    let poll = tokio::spawn(async move { request(port, &raw).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopping = Instant::now();
    stop(server).await;
    let answer = poll.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "{:?}",
        stopping.elapsed()
    );
}

/// Waits share the live streams' cap: past it, a wait is refused (503) and nothing is
/// created.
#[tokio::test]
async fn waits_count_against_the_cap_on_live_streams() {
    let server = start(Limits::default().max_streams(1)).await;
    let port = server.port;
    let raw = post_json(
        "/api/workflows/wait/instances?wait=5s",
        r#"{"instance_id": "held"}"#,
    );
    let held = tokio::spawn(async move { request(port, &raw).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let answer = request(
        port,
        &post_json(
            "/api/workflows/wait/instances?wait=5s",
            r#"{"instance_id": "refused"}"#,
        ),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("stream.too_many"), "{answer}");
    let answer = request(port, &get("/api/workflows/wait/instances/refused")).await;
    assert!(
        answer.starts_with("HTTP/1.1 404"),
        "nothing was created: {answer}"
    );
    let answer = request(
        port,
        &get("/api/workflows/wait/instances/held/wait?timeout=1s"),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    stop(server).await;
    let answer = held.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
}

/// The dashboard's `/live` stream says "change" for a new record, and for a delete, which
/// adds none: a list open in a browser drops the deleted row without a reload.
#[tokio::test]
async fn the_live_stream_reports_new_records_and_deletes() {
    let server = start(Limits::default()).await;
    let port = server.port;
    let answer = request(
        port,
        &post_json("/api/workflows/wait/instances", r#"{"instance_id": "d1"}"#),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    let head = server.engine.log_head().await.unwrap();
    // Let the instance reach its wait, so that nothing else is written.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let details = json_of(&request(port, &get("/api/workflows/wait/instances/d1")).await);
        if details["status"] == "waiting" {
            break;
        }
        assert!(Instant::now() < deadline, "{details}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let quiet = server.engine.log_head().await.unwrap();
    assert!(quiet > head);
    let mut live = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    live.write_all(get(&format!("/live?cursor={quiet}")).as_bytes())
        .await
        .unwrap();
    let (seen, _) = read_until_closed(&mut live, Duration::from_millis(1_500)).await;
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    assert!(
        !seen.contains("event: change"),
        "nothing changed yet: {seen}"
    );
    let deleted = request(
        port,
        "DELETE /api/workflows/wait/instances/d1 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(deleted.starts_with("HTTP/1.1 200"), "{deleted}");
    let (after, _) = read_until_closed(&mut live, Duration::from_secs(3)).await;
    assert!(
        after.contains("event: change"),
        "the delete was not reported: {after:?}"
    );
    drop(live);
    let Server {
        stop,
        served,
        engine,
        ..
    } = server;
    stop.unwrap().send(()).unwrap();
    served.await.unwrap().unwrap();
    engine.shutdown().await;
}

/// Issue 30 §4: what the HTTP layer refuses before any handler runs (headers too large, a
/// NUL in the path, a Content-Length that is not a number, two of them that disagree) is
/// answered like every other error: JSON with a stable code.
#[tokio::test]
async fn http_layer_rejections_answer_json_errors() {
    let server = start(Limits::default()).await;
    let many_headers: String = (0..200).map(|i| format!("X-H{i}: {i}\r\n")).collect();
    let huge = format!(
        "GET /api/workflows HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    for (raw, status, code) in [
        (
            format!("GET /api/workflows HTTP/1.1\r\nHost: 127.0.0.1\r\n{many_headers}\r\n"),
            431,
            "request.headers_too_large",
        ),
        (huge, 431, "request.headers_too_large"),
        (
            "GET /api/work\0flows HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".to_owned(),
            400,
            "request.malformed",
        ),
        (
            "POST /api/workflows/wait/instances HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: ten\r\n\r\n"
                .to_owned(),
            400,
            "request.malformed",
        ),
        (
            "POST /api/workflows/wait/instances HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"
                .to_owned(),
            400,
            "request.malformed",
        ),
    ] {
        let answer = request(server.port, &raw).await;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status} ")),
            "{}: {head}",
            &raw[..raw.len().min(60)]
        );
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{head}"
        );
        let error: Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("{e}: {body:?} for {}", &raw[..raw.len().min(60)]));
        assert_eq!(error["code"], code, "{error}");
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    server.engine.shutdown().await;
}

/// Issue 30 §4: past the cap on connections (sized from the file descriptors), a new
/// connection is answered 503 with `Retry-After` at once, instead of waiting in the listen
/// backlog; once one closes, connections are served again.
#[tokio::test]
async fn a_connection_past_the_cap_is_answered_503_at_once() {
    let server = start(Limits::default().max_connections(2)).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut socket = TcpStream::connect(("127.0.0.1", server.port))
            .await
            .unwrap();
        // A whole request on a kept-alive connection: it holds its place.
        socket
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 512];
        let n = socket.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        held.push(socket);
    }
    let answer = request(
        server.port,
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    )
    .await;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    let error: Value = serde_json::from_str(body).unwrap();
    assert_eq!(error["code"], "server.too_many_connections");
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = request(
            server.port,
            "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        )
        .await;
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "no room again: {answer}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.engine.shutdown().await;
}

/// A worker's WebSocket closes (1008, policy) once its token leaves the set: at the next
/// frame it sends or the next ping, whichever comes first. The defect: the handler read
/// the request's grant inside axum's upgrade task, where the request's task-local is not
/// set, so every worker connection ran with no grant and a removed token's worker stayed
/// connected, running the workflows it had been let in for.
#[tokio::test]
async fn a_workers_connection_closes_once_its_token_is_removed() {
    use cairn_server::{Scope, Token, Tokens};
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};

    let tokens = Tokens::new(vec![
        Token::new("worker", "w-1", Scope::Operate).unwrap(),
        Token::new("ops", "a-1", Scope::Admin).unwrap(),
    ]);
    let server = start_with(cairn_server::Options {
        tokens: Some(tokens.clone()),
        ..Default::default()
    })
    .await;
    let port = server.port;

    let mut request = format!("ws://127.0.0.1:{port}/api/workers")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("authorization", "Bearer w-1".parse().unwrap());
    let socket = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(request, socket)
        .await
        .unwrap();
    let hello = json!({
        "type": "hello", "protocol": 1, "worker": "test",
        "workflows": [{ "name": "remote", "version": "v1" }], "concurrency": 1,
    });
    ws.send(Message::text(hello.to_string())).await.unwrap();
    // The next frame that is not a ping or a pong, within `limit`.
    async fn next_frame(
        ws: &mut (
                 impl futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>>
                 + Unpin
             ),
        limit: Duration,
    ) -> Message {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match tokio::time::timeout_at(deadline, ws.next()).await {
                Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => {}
                Ok(Some(Ok(frame))) => return frame,
                other => panic!("no frame within {limit:?}: {other:?}"),
            }
        }
    }
    let welcome = next_frame(&mut ws, Duration::from_secs(5)).await;
    let welcome: Value = serde_json::from_str(welcome.to_text().unwrap()).unwrap();
    assert_eq!(welcome["type"], "welcome", "{welcome}");

    // While the token is in the set, a frame is just a frame: the ping is answered.
    ws.send(Message::Ping(b"in force".to_vec().into()))
        .await
        .unwrap();
    let pong = loop {
        match tokio::time::timeout(Duration::from_secs(5), ws.next()).await {
            Ok(Some(Ok(Message::Pong(data)))) => break data,
            Ok(Some(Ok(Message::Ping(_)))) => {}
            other => panic!("no pong while the token is in force: {other:?}"),
        }
    };
    assert_eq!(&pong[..], b"in force");

    // The token leaves the set (only the admin's stays); the worker's next frame closes it.
    tokens.replace(vec![Token::new("ops", "a-1", Scope::Admin).unwrap()]);
    ws.send(Message::Ping(b"removed".to_vec().into()))
        .await
        .unwrap();
    let Message::Close(Some(close)) = next_frame(&mut ws, Duration::from_secs(5)).await else {
        panic!("not a close frame with a code");
    };
    assert_eq!(u16::from(close.code), 1008, "{close:?}");
    assert!(close.reason.contains("no longer accepted"), "{close:?}");
    stop(server).await;
}
