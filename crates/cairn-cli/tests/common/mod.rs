//! What the `cairn serve` test binaries share: a free port, one plain HTTP request, and
//! waiting for a server to come up. (Each binary uses its own part of it.)

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A loopback port nobody listens on now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 request; returns the status code and the body.
pub(crate) fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    http_as(port, None, method, path, body)
}

/// [`http`] with `Authorization: Bearer <token>` when a token is given.
pub(crate) fn http_as(
    port: u16,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: &str,
) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((status, body))
}

/// Waits until a server on `port` answers `/healthz` (open without the token).
pub(crate) fn wait_up(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while http(port, "GET", "/healthz", "").map(|r| r.0) != Some(200) {
        assert!(Instant::now() < deadline, "the server did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
}
