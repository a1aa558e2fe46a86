//! `cairn serve --otlp-endpoint` (the `otel` feature) exports the engine's spans to an
//! OTLP/HTTP collector: here an in-process receiver that decodes the protobuf requests.
//! Run with `cargo test -p cairn-cli --features otel --test otel` (`.ci/run` does).

#![cfg(feature = "otel")]
#![allow(clippy::unwrap_used, missing_docs)] // tests may unwrap: a panic is the failure report

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{free_port, http, wait_up};

/// One protobuf field: its number and its value (a varint, or the bytes of a
/// length-delimited field; fixed-width fields are skipped).
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(buf: &[u8], at: &mut usize) -> u64 {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = buf[*at];
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return value;
        }
        shift += 7;
    }
}

/// The fields of a protobuf message, in order.
fn fields(buf: &[u8]) -> Vec<(u64, Value<'_>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let tag = varint(buf, &mut at);
        let (number, wire) = (tag >> 3, tag & 7);
        match wire {
            0 => out.push((number, Value::Varint(varint(buf, &mut at)))),
            1 => at += 8,
            2 => {
                let len = usize::try_from(varint(buf, &mut at)).unwrap();
                out.push((number, Value::Bytes(&buf[at..at + len])));
                at += len;
            }
            5 => at += 4,
            other => panic!("unexpected wire type {other}"),
        }
    }
    out
}

fn messages(buf: &[u8], number: u64) -> Vec<&[u8]> {
    fields(buf)
        .into_iter()
        .filter_map(|(n, v)| match v {
            Value::Bytes(b) if n == number => Some(b),
            _ => None,
        })
        .collect()
}

#[derive(Debug, Clone)]
struct Span {
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    name: String,
    attributes: BTreeMap<String, String>,
}

/// The spans of an `ExportTraceServiceRequest` (resource spans → scope spans → spans).
fn spans(request: &[u8]) -> Vec<Span> {
    let mut out = Vec::new();
    for resource in messages(request, 1) {
        for scope in messages(resource, 2) {
            for span in messages(scope, 2) {
                let bytes = |n| {
                    messages(span, n)
                        .first()
                        .map(|b| b.to_vec())
                        .unwrap_or_default()
                };
                let mut attributes = BTreeMap::new();
                for kv in messages(span, 9) {
                    let key = String::from_utf8(messages(kv, 1)[0].to_vec()).unwrap();
                    let value = messages(kv, 2)
                        .first()
                        .and_then(|any| fields(any).into_iter().next())
                        .map(|(n, v)| match (n, v) {
                            (1, Value::Bytes(s)) => String::from_utf8_lossy(s).into_owned(),
                            (2, Value::Varint(b)) => (b != 0).to_string(),
                            (3, Value::Varint(i)) => i.to_string(),
                            _ => "?".into(),
                        })
                        .unwrap_or_default();
                    attributes.insert(key, value);
                }
                out.push(Span {
                    trace: bytes(1),
                    id: bytes(2),
                    parent: bytes(4),
                    name: String::from_utf8(bytes(5)).unwrap(),
                    attributes,
                });
            }
        }
    }
    out
}

/// An OTLP/HTTP receiver: answers every request 200 and keeps the bodies posted to
/// `/v1/traces`.
fn receiver() -> (u16, Arc<Mutex<Vec<Vec<u8>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&bodies);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let kept = Arc::clone(&kept);
            std::thread::spawn(move || serve_otlp(conn, &kept));
        }
    });
    (port, bodies)
}

fn serve_otlp(conn: TcpStream, kept: &Mutex<Vec<Vec<u8>>>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut conn = conn;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).unwrap();
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        if request_line.starts_with("POST /v1/traces") {
            kept.lock().unwrap().push(body);
        }
        conn.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
        )
        .unwrap();
    }
}

#[test]
fn serve_exports_an_instances_spans_over_otlp() {
    let (collector, bodies) = receiver();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["serve", "--db"])
        .arg(dir.path().join("cairn.db"))
        .args(["--addr", &format!("127.0.0.1:{port}")])
        .args(["--otlp-endpoint", &format!("http://127.0.0.1:{collector}")])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_up(port);
    let deadline = Instant::now() + Duration::from_secs(20);
    let (status, body) = http(
        port,
        "POST",
        "/api/workflows/greet/instances",
        r#"{"instance_id": "traced", "params": {"name": "Ada"}}"#,
    )
    .unwrap();
    assert_eq!(status, 201, "{body}");
    loop {
        let (_, body) = http(port, "GET", "/api/workflows/greet/instances/traced", "").unwrap();
        if body.contains(r#""status":"complete""#) {
            break;
        }
        assert!(Instant::now() < deadline, "did not complete: {body}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A graceful stop flushes the batch of spans still buffered.
    let stopped = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    assert!(server.wait().unwrap().success());

    let all: Vec<Span> = bodies
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| spans(b))
        .collect();
    eprintln!("the collector received {} spans", all.len());
    let runs: Vec<&Span> = all
        .iter()
        .filter(|s| {
            s.name == "workflow.run"
                && s.attributes.get("workflow.id").map(String::as_str) == Some("traced")
        })
        .collect();
    assert_eq!(runs.len(), 1, "{all:#?}");
    let run = runs[0];
    assert_eq!(run.attributes["workflow.name"], "greet");
    assert_eq!(run.parent, Vec::<u8>::new(), "workflow.run is a root span");
    let steps: Vec<&Span> = all
        .iter()
        .filter(|s| s.name == "step.do" && s.parent == run.id)
        .collect();
    let names: Vec<&str> = steps
        .iter()
        .map(|s| s.attributes["step.name"].as_str())
        .collect();
    assert_eq!(names, ["compose greeting", "deliver greeting"], "{all:#?}");
    for step in &steps {
        assert_eq!(step.trace, run.trace);
        assert_eq!(step.attributes["outcome"], "success");
        let attempts: Vec<&Span> = all
            .iter()
            .filter(|s| s.name == "step.attempt" && s.parent == step.id)
            .collect();
        assert_eq!(attempts.len(), 1, "{all:#?}");
        assert_eq!(attempts[0].attributes["attempt"], "1");
        assert_eq!(attempts[0].attributes["outcome"], "success");
    }
}
