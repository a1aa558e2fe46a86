//! `cairn serve` as a real process on a loopback port: it serves the API, runs instances,
//! and refuses a non-loopback address without a token.

#![allow(clippy::unwrap_used, missing_docs)] // tests may unwrap: a panic is the failure report

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{free_port, http, http_as, wait_up};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(db: &std::path::Path, port: u16) -> Server {
    start_with(db, port, &["--no-schedules"])
}

/// [`start`] with `extra` arguments instead of `--no-schedules` (the demo schedule adds a
/// greeting at the top of an hour, which would change what tests count).
fn start_with(db: &std::path::Path, port: u16, extra: &[&str]) -> Server {
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("serve")
        .args(extra)
        .arg("--db")
        .arg(db)
        .args(["--addr", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let server = Server(child);
    wait_up(port);
    server
}

#[test]
fn serve_runs_the_demo_workflows_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = start(&dir.path().join("cairn.db"), port);
    let (status, body) = http(port, "GET", "/api/workflows", "").unwrap();
    assert_eq!(status, 200);
    for name in ["greet", "approval", "nap"] {
        assert!(body.contains(name), "{body}");
    }
    let (status, body) = http(
        port,
        "POST",
        "/api/workflows/greet/instances",
        r#"{"instance_id": "hi", "params": {"name": "Ada"}}"#,
    )
    .unwrap();
    assert_eq!(status, 201, "{body}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = http(port, "GET", "/api/workflows/greet/instances/hi", "").unwrap();
        let details: serde_json::Value = serde_json::from_str(&body).unwrap();
        if details["status"] == "complete" {
            assert_eq!(details["output"], "Hello, Ada!");
            break;
        }
        assert!(Instant::now() < deadline, "did not complete: {body}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serve_refuses_a_public_address_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["serve", "--addr", "0.0.0.0:0", "--db"])
        .arg(dir.path().join("cairn.db"))
        .env_remove("CAIRN_TOKEN")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("error: refusing to serve on 0.0.0.0:0 without a token"),
        "{stderr}"
    );
}

/// Issue 30 §4: an empty or blank token (flag or environment) is no token: a public address
/// is refused as without one.
#[test]
fn serve_refuses_a_public_address_with_an_empty_or_blank_token() {
    let dir = tempfile::tempdir().unwrap();
    let serve = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_cairn"));
        command
            .args(["serve", "--addr", "0.0.0.0:0", "--db"])
            .arg(dir.path().join("cairn.db"))
            .env_remove("CAIRN_TOKEN");
        command
    };
    let runs = [
        serve().args(["--token", ""]).output().unwrap(),
        serve().args(["--token", "  "]).output().unwrap(),
        serve().env("CAIRN_TOKEN", "").output().unwrap(),
        serve().env("CAIRN_TOKEN", "\t").output().unwrap(),
    ];
    for output in runs {
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("error: refusing to serve on 0.0.0.0:0 without a token"),
            "{stderr}"
        );
    }
}

/// Runs `cairn ARGS --url http://127.0.0.1:PORT`; returns (success, stdout, stderr).
fn cairn(port: u16, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .args(["--url", &format!("http://127.0.0.1:{port}")])
        .env_remove("CAIRN_TOKEN")
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn json_of(port: u16, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.push("--json");
    let (ok, out, err) = cairn(port, &all);
    assert!(ok, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

fn until(port: u16, id: &str, status: &str) {
    until_status(port, "approval", id, status);
}

fn until_status(port: u16, workflow: &str, id: &str, status: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while json_of(port, &["instances", "describe", workflow, id])["status"] != status {
        assert!(Instant::now() < deadline, "{id} never became {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_cli_drives_an_instance_through_its_life() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = start(&dir.path().join("cairn.db"), port);

    let (ok, out, _) = cairn(port, &["workflows", "list"]);
    assert!(
        ok && out.contains("approval") && out.starts_with("NAME"),
        "{out}"
    );
    let (ok, out, _) = cairn(
        port,
        &[
            "workflows",
            "trigger",
            "approval",
            r#"{"amount": 42}"#,
            "--id",
            "a1",
        ],
    );
    assert!(ok, "{out}");
    assert_eq!(
        out.trim(),
        "🚀 Workflow instance \"a1\" has been queued successfully"
    );
    until(port, "a1", "waiting");

    let (ok, out, _) = cairn(port, &["instances", "describe", "approval", "latest"]);
    assert!(ok, "{out}");
    assert!(out.contains("Status    waiting"), "{out}");
    assert!(
        out.contains("Steps:")
            && out.contains("notify approver#1")
            && out.contains("wait for approval#1"),
        "{out}"
    );

    assert_eq!(
        json_of(port, &["instances", "pause", "approval", "a1"])["status"],
        "paused"
    );
    assert_eq!(
        json_of(port, &["instances", "resume", "approval", "a1"])["status"],
        "queued"
    );
    until(port, "a1", "waiting");
    let (ok, _, err) = cairn(
        port,
        &[
            "instances",
            "send-event",
            "approval",
            "a1",
            "--type",
            "approved",
            "--payload",
            r#"{"by": "ada"}"#,
        ],
    );
    assert!(ok, "{err}");
    until(port, "a1", "complete");
    let details = json_of(port, &["instances", "describe", "approval", "a1"]);
    assert_eq!(
        details["output"]["approval"],
        serde_json::json!({"by": "ada"})
    );
    assert_eq!(
        details["output"]["request"],
        serde_json::json!({"amount": 42})
    );
    // One step's whole output, as stored, on stdout; a step without one says so.
    let (ok, out, err) = cairn(
        port,
        &[
            "instances",
            "output",
            "approval",
            "a1",
            "--step",
            "wait for approval",
            "--type",
            "waitForEvent",
        ],
    );
    assert!(ok, "{err}");
    let event: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(event["payload"], serde_json::json!({"by": "ada"}));
    let (ok, out, _) = cairn(
        port,
        &[
            "instances",
            "output",
            "approval",
            "a1",
            "--step",
            "notify approver",
        ],
    );
    assert!(ok && out == "null", "{out}");
    let (ok, _, err) = cairn(
        port,
        &["instances", "output", "approval", "a1", "--step", "nope"],
    );
    assert!(!ok && err.contains("step.not_found"), "{err}");

    cairn(port, &["workflows", "trigger", "approval", "--id", "a2"]);
    until(port, "a2", "waiting");
    assert_eq!(
        json_of(port, &["instances", "terminate", "approval", "a2"])["status"],
        "terminated"
    );
    let listed = json_of(
        port,
        &["instances", "list", "approval", "--status", "terminated"],
    );
    assert_eq!(listed["instances"][0]["id"], "a2");
    let counts = json_of(port, &["workflows", "describe", "approval"]);
    assert_eq!(
        (
            counts["instances"]["complete"].clone(),
            counts["instances"]["terminated"].clone()
        ),
        (serde_json::json!(1), serde_json::json!(1))
    );

    let (ok, out, _) = cairn(port, &["instances", "delete", "approval", "a1", "a2"]);
    assert!(
        ok && out.contains("Deleted instance a1") && out.contains("Deleted instance a2"),
        "{out}"
    );

    // Failures: non-zero exit with `error: …` naming the problem and its code.
    let (ok, _, err) = cairn(port, &["instances", "describe", "approval", "a1"]);
    assert!(!ok);
    assert!(
        err.starts_with("error: ") && err.contains("instance.not_found"),
        "{err}"
    );
    let (ok, _, err) = cairn(port, &["workflows", "trigger", "approval", "{not json"]);
    assert!(!ok && err.contains("PARAMS is not valid JSON"), "{err}");
    let (ok, _, err) = cairn(
        port,
        &[
            "instances",
            "restart",
            "approval",
            "a1",
            "--from-step-count",
            "2",
        ],
    );
    assert!(!ok && err.contains("--from-step-name is required"), "{err}");
    let (ok, _, err) = cairn(free_port(), &["workflows", "list"]);
    assert!(
        !ok && err.starts_with("error: cannot reach Cairn at"),
        "no server: {err}"
    );
}

#[test]
fn describe_watch_follows_the_live_stream_until_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = start(&dir.path().join("cairn.db"), port);
    cairn(port, &["workflows", "trigger", "approval", "--id", "w"]);
    until(port, "w", "waiting");
    let watcher = std::thread::spawn(move || {
        cairn(port, &["instances", "describe", "approval", "w", "--watch"])
    });
    std::thread::sleep(Duration::from_millis(500));
    cairn(
        port,
        &[
            "instances",
            "send-event",
            "approval",
            "w",
            "--type",
            "approved",
        ],
    );
    let (ok, out, err) = watcher.join().unwrap();
    assert!(ok, "{err}");
    assert!(
        out.contains("WORKFLOW_QUEUED") && out.contains("WAIT_COMPLETE \"wait for approval\""),
        "{out}"
    );
    assert!(
        out.trim_end().ends_with("WORKFLOW_SUCCESS"),
        "ends with the terminal record: {out}"
    );
    // Review finding: with --json the details came pretty-printed over many lines, then
    // one event per line: neither jq nor an NDJSON reader took the output.
    let (ok, out, err) = cairn(
        port,
        &[
            "instances",
            "describe",
            "approval",
            "w",
            "--watch",
            "--json",
        ],
    );
    assert!(ok, "{err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?} in {out}")))
        .collect();
    assert_eq!(lines[0]["status"], "complete", "{out}");
    assert_eq!(lines.last().unwrap()["event"], "WORKFLOW_SUCCESS", "{out}");
}

/// SIGTERM stops `cairn serve` like Ctrl-C, even while a client follows a live stream:
/// the stream ends and the process exits. Before, SIGTERM was ignored and one open
/// `--watch` kept the server alive forever after Ctrl-C.
#[test]
fn sigterm_stops_serve_even_with_an_open_stream() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = start(&dir.path().join("cairn.db"), port);
    cairn(port, &["workflows", "trigger", "approval", "--id", "s"]);
    until(port, "s", "waiting");
    // A raw SSE client on the waiting instance: its stream would stay open for a day.
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(
            b"GET /api/workflows/approval/instances/s/stream HTTP/1.1\r\nHost: localhost\r\n\r\n",
        )
        .unwrap();
    let mut first = [0u8; 64];
    assert!(stream.read(&mut first).unwrap() > 0, "the stream is open");
    let status = Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(exit) = server.0.try_wait().unwrap() {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "cairn serve did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.ends_with("0\r\n\r\n"),
        "the chunked stream ended cleanly: {rest:?}"
    );
}

/// Issue 30 §4: the shutdown's "up to 10 s" holds with a request stuck in progress and an
/// attempt that runs for a minute: one deadline for both, not one after the other.
#[test]
fn sigterm_stops_serve_within_one_deadline_for_requests_and_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = start(&dir.path().join("cairn.db"), port);
    cairn(
        port,
        &[
            "workflows",
            "trigger",
            "report",
            r#"{"seconds": 60}"#,
            "--id",
            "r",
        ],
    );
    until_status(port, "report", "r", "running");
    // A request whose body never arrives: in progress until the grace runs out.
    let mut stuck = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stuck
        .write_all(
            b"POST /api/workflows/greet/instances HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let signalled = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = loop {
        if let Some(exit) = server.0.try_wait().unwrap() {
            break exit;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(30),
            "cairn serve did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = signalled.elapsed();
    assert!(exit.success(), "{exit:?}");
    assert!(
        took < Duration::from_secs(15),
        "stopping took {took:?}; the announced deadline is 10 s"
    );
}

/// Issue 30 §4: `cairn serve` raises its file descriptor limit to the hard limit at start
/// (a soft limit of 1,024 would not hold 1,000 live streams) and sizes its caps from it.
#[cfg(target_os = "linux")]
#[test]
fn serve_raises_its_file_descriptor_limit() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let limits = |pid: u32| -> (String, String) {
        let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap()
            .to_owned();
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields[3].to_owned(), fields[4].to_owned())
    };
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -Sn 256 && exec {} serve --no-schedules --db {} --addr 127.0.0.1:{port}",
            env!("CARGO_BIN_EXE_cairn"),
            dir.path().join("cairn.db").display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server(child);
    wait_up(port);
    let (soft, hard) = limits(server.0.id());
    assert_eq!(soft, hard, "the soft limit was raised to the hard one");
    assert_ne!(soft, "256");
}

/// Ids and values with reserved characters reach the server as one id: `a/b` is refused by
/// the server's id check (not an empty 404), `x?y=1` is not `x`, and a status cannot
/// smuggle a parameter.
#[test]
fn ids_and_values_are_percent_encoded() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = start(&dir.path().join("cairn.db"), port);
    let (ok, _, _) = cairn(port, &["workflows", "trigger", "greet", "{}", "--id", "x"]);
    assert!(ok);
    let (ok, out, err) = cairn(port, &["instances", "describe", "greet", "a/b"]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("instance.invalid_id") || err.contains("instance.not_found"),
        "{err}"
    );
    assert!(!err.contains("route.not_found"), "{err}");
    let (ok, out, err) = cairn(port, &["instances", "describe", "greet", "x?y=1"]);
    assert!(!ok, "described {out}");
    assert!(!out.contains("Instance  x\n"), "{out}");
    assert!(err.contains("instance."), "{err}");
    let (ok, out, err) = cairn(
        port,
        &["instances", "list", "greet", "--status", "complete&limit=1"],
    );
    assert!(!ok, "listed {out}");
    assert!(
        err.contains("request.invalid") || err.contains("status"),
        "{err}"
    );
}

/// The CLI says what to do: a server that is not running, a missing token.
#[test]
fn errors_say_what_to_do() {
    let port = free_port();
    let (ok, _, err) = cairn(port, &["workflows", "list"]);
    assert!(!ok);
    assert!(err.contains("is 'cairn serve' running?"), "{err}");
    assert!(err.contains("CAIRN_URL"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["serve", "--token", "t0k", "--db"])
        .arg(dir.path().join("cairn.db"))
        .args(["--addr", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let _server = Server(child);
    wait_up(port);
    let (ok, _, err) = cairn(port, &["workflows", "list"]);
    assert!(!ok);
    assert!(
        err.contains("--token") && err.contains("CAIRN_TOKEN"),
        "{err}"
    );
}

/// A busy port fails `serve` before it creates (or opens) the database.
#[test]
fn serve_binds_before_it_opens_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _first = start(&dir.path().join("first.db"), port);
    let second = dir.path().join("second.db");
    let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["serve", "--db"])
        .arg(&second)
        .args(["--addr", &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("listen on"), "{stderr}");
    assert!(
        !second.exists(),
        "the database was created before the bind failed"
    );
}

/// `--watch` survives a server restart: it reconnects with back-off and resumes after the
/// last record it printed (no record twice, none missed).
#[test]
fn describe_watch_reconnects_across_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let port = free_port();
    let server = start(&db, port);
    cairn(port, &["workflows", "trigger", "approval", "--id", "r"]);
    until(port, "r", "waiting");
    let watcher = std::thread::spawn(move || {
        cairn(port, &["instances", "describe", "approval", "r", "--watch"])
    });
    std::thread::sleep(Duration::from_millis(500));
    drop(server); // killed: the stream breaks mid-way
    std::thread::sleep(Duration::from_millis(700));
    let _server = start(&db, port);
    cairn(
        port,
        &[
            "instances",
            "send-event",
            "approval",
            "r",
            "--type",
            "approved",
        ],
    );
    let (ok, out, err) = watcher.join().unwrap();
    assert!(ok, "{err}");
    assert!(out.trim_end().ends_with("WORKFLOW_SUCCESS"), "{out}");
    let ids: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.chars().all(|c| c.is_ascii_digit()))
        .collect();
    let unique: std::collections::BTreeSet<&&str> = ids.iter().collect();
    assert_eq!(ids.len(), unique.len(), "a record printed twice: {out}");
    assert!(out.contains("WORKFLOW_QUEUED"), "{out}");
    assert!(err.contains("reconnecting"), "{err}");
}

/// `cairn serve` logs startup, one line per request (method, route, status, duration) and
/// shutdown on stderr, as JSON with `--log-format json`; never the token.
#[test]
fn serve_logs_requests_and_never_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = dir.path().join("serve.log");
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "serve",
            "--log-format",
            "json",
            "--token",
            "t0k3n-secret",
            "--db",
        ])
        .arg(dir.path().join("cairn.db"))
        .args(["--addr", &format!("127.0.0.1:{port}")])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let server = Server(child);
    wait_up(port);
    let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "workflows",
            "list",
            "--url",
            &format!("http://127.0.0.1:{port}"),
        ])
        .args(["--token", "t0k3n-secret"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let _ = http(port, "GET", "/api/nope", "");
    let stopped = Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let mut server = server;
    let _ = server.0.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("t0k3n-secret"),
        "the token was logged: {text}"
    );
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let requests: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["target"] == "cairn::http")
        .collect();
    assert!(
        requests
            .iter()
            .any(|r| r["fields"]["route"] == "/api/workflows"
                && r["fields"]["status"] == 200
                && r["fields"]["method"] == "GET"),
        "{text}"
    );
    assert!(
        requests.iter().any(|r| r["fields"]["status"] == 401),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "serving" && l["fields"]["token_required"] == true),
        "{text}"
    );
    assert!(
        lines.iter().any(|l| l["fields"]["message"] == "stopped"),
        "{text}"
    );
}

/// Starts `cairn serve` on `db` with `RUST_LOG=debug` and JSON logs written to `log`.
fn start_logging(db: &std::path::Path, port: u16, log: &std::path::Path) -> Server {
    start_logging_at(db, port, log, "debug")
}

/// `cairn serve` logging JSON at `level` (RUST_LOG) to the file `log`.
fn start_logging_at(db: &std::path::Path, port: u16, log: &std::path::Path, level: &str) -> Server {
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["serve", "--log-format", "json", "--db"])
        .arg(db)
        .args(["--addr", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", level)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let server = Server(child);
    wait_up(port);
    server
}

fn json_lines(path: &std::path::Path) -> (String, Vec<serde_json::Value>) {
    let text = std::fs::read_to_string(path).unwrap();
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    (text, lines)
}

/// A SIGKILL in the middle of an attempt, then a restart: the second process logs what it
/// recovers (one instance, one interrupted attempt), the instance's lifecycle at debug with
/// its workflow and id, and never a param or a sensitive step's output.
#[test]
fn serve_logs_the_recovery_after_a_kill_and_never_params_or_sensitive_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let port = free_port();
    let first_log = dir.path().join("first.log");
    let mut first = start_logging(&db, port, &first_log);
    let (status, body) = http(
        port,
        "POST",
        "/api/workflows/report/instances",
        r#"{"instance_id": "r1", "params": {"seconds": 60, "signing_key": "k3y-never-logged"}}"#,
    )
    .unwrap();
    assert_eq!(status, 201, "{body}");
    // The first attempt of "build report" is in flight: kill the process under it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = http(port, "GET", "/api/workflows/report/instances/r1", "").unwrap();
        let details: serde_json::Value = serde_json::from_str(&body).unwrap();
        if details["steps"][0]["attempts"][0]["start"].is_string() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the attempt never started: {body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    first.0.kill().unwrap();
    first.0.wait().unwrap();

    let second_log = dir.path().join("second.log");
    let _second = start_logging(&db, port, &second_log);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = http(port, "GET", "/api/workflows/report/instances/r1", "").unwrap();
        let details: serde_json::Value = serde_json::from_str(&body).unwrap();
        if details["status"] == "complete" {
            assert_eq!(details["steps"][1]["output"], "[REDACTED]", "{details}");
            break;
        }
        assert!(Instant::now() < deadline, "did not complete: {body}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The lines are written as they happen; give the last ones a moment.
    std::thread::sleep(Duration::from_millis(200));

    let (first_text, first_lines) = json_lines(&first_log);
    let (second_text, second_lines) = json_lines(&second_log);
    let recovered = second_lines
        .iter()
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("recovered"))
        })
        .unwrap_or_else(|| panic!("no recovery summary:\n{second_text}"));
    assert_eq!(recovered["level"], "INFO");
    assert_eq!(recovered["fields"]["instances"], 1, "{recovered}");
    assert_eq!(
        recovered["fields"]["interrupted_attempts"], 1,
        "{recovered}"
    );
    let lifecycle = |lines: &[serde_json::Value], message: &str| {
        lines.iter().any(|l| {
            l["level"] == "DEBUG"
                && l["fields"]["message"] == message
                && l["fields"]["workflow"] == "report"
                && l["fields"]["instance"] == "r1"
        })
    };
    assert!(lifecycle(&first_lines, "claimed"), "{first_text}");
    assert!(lifecycle(&second_lines, "claimed"), "{second_text}");
    assert!(lifecycle(&second_lines, "finished"), "{second_text}");
    assert!(
        first_lines.iter().any(|l| l["target"] == "cairn::http"
            && l["fields"]["route"] == "/api/workflows/{name}/instances"
            && l["fields"]["status"] == 201),
        "{first_text}"
    );
    for (text, name) in [(&first_text, "first"), (&second_text, "second")] {
        assert!(
            !text.contains("k3y-never-logged"),
            "the {name} log holds a param or the sensitive output:\n{text}"
        );
    }
}

/// A default build (no `otel` feature) refuses `--otlp-endpoint` with what to do, and
/// starts anyway when OTEL_EXPORTER_OTLP_ENDPOINT is merely set in its environment (as a
/// cluster may set it for every process).
#[cfg(not(feature = "otel"))]
#[test]
fn serve_without_the_otel_feature_refuses_the_flag_but_not_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let refused = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["serve", "--otlp-endpoint", "http://127.0.0.1:4318", "--db"])
        .arg(dir.path().join("cairn.db"))
        .args(["--addr", &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--features otel"), "{stderr}");

    let log = dir.path().join("serve.log");
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["serve", "--db"])
        .arg(dir.path().join("cairn.db"))
        .args(["--addr", &format!("127.0.0.1:{port}")])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _server = Server(child);
    wait_up(port);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("OTEL_EXPORTER_OTLP_ENDPOINT is set"),
        "{text}"
    );
}

/// `trigger --wait` prints the output of a finished instance and exits 0; with a wait that
/// runs out first it says so and exits 1 (a script can tell).
#[test]
fn trigger_wait_prints_the_output_or_says_it_is_still_running() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = start(&dir.path().join("cairn.db"), port);
    let (ok, out, err) = cairn(
        port,
        &[
            "workflows",
            "trigger",
            "greet",
            r#"{"name": "Ada"}"#,
            "--wait",
        ],
    );
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("completed") && out.contains("\"Hello, Ada!\""),
        "{out}"
    );
    let (ok, out, err) = cairn(
        port,
        &[
            "workflows",
            "trigger",
            "approval",
            "--id",
            "slow",
            "--wait=300ms",
        ],
    );
    assert!(!ok, "{out}{err}");
    let code = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["workflows", "trigger", "approval", "--wait=100ms"])
        .args(["--url", &format!("http://127.0.0.1:{port}")])
        .status()
        .unwrap()
        .code();
    assert_eq!(code, Some(2), "still running: exit code 2");
    assert!(out.contains("is still") && out.contains("slow"), "{out}");
    let v = json_of(port, &["workflows", "trigger", "greet", "--wait"]);
    assert_eq!(v["status"], "complete", "{v}");
    assert_eq!(v["output"], "Hello, world!", "{v}");
}

#[test]
fn bulk_counts_then_terminates_what_a_filter_matches() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = start(&dir.path().join("cairn.db"), port);
    for id in ["nap-1", "nap-2", "nap-3", "other-1"] {
        let (ok, _, err) = cairn(port, &["workflows", "trigger", "nap", "{}", "--id", id]);
        assert!(ok, "{err}");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while json_of(port, &["instances", "list", "nap", "--status", "waiting"])["instances"]
        .as_array()
        .map_or(0, Vec::len)
        < 4
    {
        assert!(Instant::now() < deadline, "the naps never slept");
        std::thread::sleep(Duration::from_millis(50));
    }
    let filter = [
        "--workflow",
        "nap",
        "--status",
        "waiting,paused",
        "--id-prefix",
        "nap-",
    ];
    // Without --yes it only counts.
    let (ok, out, err) = cairn(
        port,
        &[&["instances", "bulk", "terminate"][..], &filter].concat(),
    );
    assert!(ok, "{err}");
    assert!(out.contains("3 instances match; pass --yes"), "{out}");
    let done = json_of(
        port,
        &[&["instances", "bulk", "terminate", "--yes"][..], &filter].concat(),
    );
    assert_eq!(done["matched"], 3);
    let results = done["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(|r| r["ok"] == true), "{done}");
    for id in ["nap-1", "nap-2", "nap-3"] {
        let v = json_of(port, &["instances", "describe", "nap", id]);
        assert_eq!(v["status"], "terminated", "{id}");
    }
    let v = json_of(port, &["instances", "describe", "nap", "other-1"]);
    assert_eq!(v["status"], "waiting", "outside the prefix");
    // A second run finds nothing; a bad status is refused with the server's words.
    let again = json_of(
        port,
        &[&["instances", "bulk", "terminate", "--yes"][..], &filter].concat(),
    );
    assert_eq!(again["matched"], 0);
    let (ok, _, err) = cairn(
        port,
        &["instances", "bulk", "pause", "--status", "sleepy", "--yes"],
    );
    assert!(!ok);
    assert!(err.contains("sleepy"), "{err}");
}

#[test]
fn schedules_are_listed_and_triggered() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = start_with(&dir.path().join("cairn.db"), port, &[]);
    let listed = json_of(port, &["schedules", "list"]);
    let s = &listed["schedules"][0];
    assert_eq!(s["name"], "greet-hourly");
    assert_eq!(s["workflow"], "greet");
    assert_eq!(s["cron"], "0 * * * *");
    assert_eq!(s["timeZone"], "UTC");
    assert!(
        s["nextTick"].as_str().unwrap().ends_with(":00:00.000Z"),
        "{s}"
    );
    let (ok, out, err) = cairn(port, &["schedules", "trigger", "greet-hourly"]);
    assert!(ok, "{err}");
    assert!(out.contains("greet-hourly-manual-"), "{out}");
    let (ok, _, err) = cairn(port, &["schedules", "trigger", "nope"]);
    assert!(!ok);
    assert!(err.contains("schedule.not_found"), "{err}");

    // Created, paused, resumed and deleted from the CLI.
    let (ok, out, err) = cairn(
        port,
        &[
            "schedules",
            "create",
            "ping",
            "--cron",
            "*/5 * * * *",
            "--workflow",
            "greet",
            "--params",
            r#"{"name": "ops"}"#,
            "--overlap",
            "allow",
            "--catch-up",
            "runAll:2",
        ],
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("Created schedule ping"), "{out}");
    let (ok, out, _) = cairn(port, &["schedules", "list"]);
    assert!(ok && out.contains("ping") && out.contains("api"), "{out}");
    let (ok, out, err) = cairn(port, &["schedules", "pause", "greet-hourly"]);
    assert!(ok && out.contains("greet-hourly is paused"), "{out}{err}");
    let listed = json_of(port, &["schedules", "list"]);
    assert_eq!(listed["schedules"][0]["paused"], true, "{listed}");
    assert_eq!(
        listed["schedules"][1]["catchUp"],
        serde_json::json!({ "runAll": 2 })
    );
    let (ok, out, _) = cairn(port, &["schedules", "resume", "greet-hourly"]);
    assert!(ok && out.contains("ticking"), "{out}");
    let (ok, _, err) = cairn(port, &["schedules", "delete", "greet-hourly"]);
    assert!(!ok && err.contains("schedule.declared_in_code"), "{err}");
    let (ok, out, err) = cairn(port, &["schedules", "delete", "ping"]);
    assert!(ok && out.contains("Deleted schedule ping"), "{out}{err}");
    let (ok, _, err) = cairn(
        port,
        &[
            "schedules",
            "create",
            "bad",
            "--cron",
            "nope",
            "--workflow",
            "greet",
        ],
    );
    assert!(!ok && err.contains("schedule.invalid"), "{err}");
}

#[test]
fn instances_list_filters_by_statuses_and_id_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = start(&dir.path().join("cairn.db"), port);
    for id in ["order-1", "order-2", "other-1"] {
        let (ok, _, err) = cairn(
            port,
            &["workflows", "trigger", "approval", "{}", "--id", id],
        );
        assert!(ok, "{err}");
    }
    for id in ["order-1", "order-2", "other-1"] {
        until(port, id, "waiting");
    }
    let listed = json_of(
        port,
        &[
            "instances",
            "list",
            "approval",
            "--status",
            "waiting,paused",
            "--id-prefix",
            "order-",
        ],
    );
    let ids: Vec<&str> = listed["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["order-2", "order-1"]);
    let (ok, _, err) = cairn(port, &["instances", "list", "nope"]);
    assert!(!ok);
    assert!(err.contains("workflow.not_found"), "{err}");
    let (ok, _, err) = cairn(
        port,
        &[
            "instances",
            "list",
            "approval",
            "--created-from",
            "yesterday",
        ],
    );
    assert!(!ok);
    assert!(err.contains("createdFrom"), "{err}");
}

/// A parent and the child it invoked, as the CLI shows them: the parent's describe lists
/// its children, the child's names its parent.
#[test]
fn describe_shows_a_parent_and_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = start(&dir.path().join("cairn.db"), port);
    let (ok, out, err) = cairn(
        port,
        &[
            "workflows",
            "trigger",
            "order",
            r#"{"failures": 0}"#,
            "--id",
            "o1",
            "--wait",
        ],
    );
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cairn(port, &["instances", "describe", "order", "o1"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("Children:") && out.contains("pay#1") && out.contains("checkout"),
        "{out}"
    );
    let details = json_of(port, &["instances", "describe", "order", "o1"]);
    let child = details["children"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(details["children"][0]["status"], "complete", "{details}");
    assert_eq!(details["steps"][0]["type"], "invoke", "{details}");
    let (ok, out, err) = cairn(port, &["instances", "describe", "checkout", &child]);
    assert!(ok, "{err}");
    assert!(out.contains("Parent    order o1 (step pay#1)"), "{out}");
}

/// `cairn replay-check`: the demo code against a database of its instances is compatible
/// (exit 0); a journal whose step the code no longer has is reported with the step's name
/// (exit 1). Nothing runs meanwhile.
#[test]
fn replay_check_gates_a_deploy() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let port = free_port();
    {
        let _server = start(&db, port);
        cairn(port, &["workflows", "trigger", "approval", "--id", "a1"]);
        until(port, "a1", "waiting");
    }
    let check = || {
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["replay-check", "--db", db.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let out = check();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("1 unfinished instance replayed; 0 incompatible"),
        "{text}"
    );
    // As the journal looks to code that renamed the step.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute(
        "UPDATE steps SET name = 'notify the approver' WHERE name = 'notify approver'",
        [],
    )
    .unwrap();
    drop(conn);
    let out = check();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("✗ approval/a1")
            && text.contains("step \"notify the approver\" is in the journal"),
        "{text}"
    );
}

/// A concurrency key from the CLI: the demo `checkout` runs two per key at once; the key
/// shows in describe; a workflow without a limit refuses a key with a code.
#[test]
fn trigger_takes_a_concurrency_key_and_a_priority() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = start(&dir.path().join("cairn.db"), port);
    let (ok, out, err) = cairn(
        port,
        &[
            "workflows",
            "trigger",
            "checkout",
            r#"{"failures": 0}"#,
            "--id",
            "c1",
            "--key",
            "ada",
            "--priority",
            "-3",
            "--wait",
        ],
    );
    assert!(ok, "{out}{err}");
    let details = json_of(port, &["instances", "describe", "checkout", "c1"]);
    assert_eq!(details["concurrencyKey"], "ada", "{details}");
    assert_eq!(details["priority"], -3, "{details}");
    let (ok, out, _) = cairn(port, &["instances", "describe", "checkout", "c1"]);
    assert!(ok && out.contains("Key       ada"), "{out}");
    let (ok, _, err) = cairn(port, &["workflows", "trigger", "greet", "--key", "ada"]);
    assert!(!ok && err.contains("concurrency.not_configured"), "{err}");
}

/// Issue 32: `describe` shows each failed attempt's error, not only a count (the demo
/// `checkout` fails its charge once, then succeeds).
#[test]
fn describe_shows_each_failed_attempts_error() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = start(&dir.path().join("cairn.db"), port);
    let (ok, out, err) = cairn(
        port,
        &[
            "workflows",
            "trigger",
            "checkout",
            r#"{"failures": 1}"#,
            "--id",
            "retried",
            "--wait",
        ],
    );
    assert!(ok, "{out}{err}");
    let (ok, out, _) = cairn(port, &["instances", "describe", "checkout", "retried"]);
    assert!(ok, "{out}");
    let failed = out
        .split("Failed attempts:")
        .nth(1)
        .unwrap_or_else(|| panic!("no failed attempts in {out}"));
    let row = failed
        .lines()
        .find(|l| l.contains("charge card#1"))
        .unwrap_or_else(|| panic!("no row of the charge in {out}"));
    assert!(row.contains("card network timed out"), "{row}");
    assert!(row.contains("1000 ms"), "the retry delay: {row}");
}

/// Issue 32: `--wait 5s`, with a space, waits (clap used to read 5s as the params and the
/// trigger failed with "PARAMS is not valid JSON").
#[test]
fn trigger_reads_wait_with_a_space_as_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = start(&dir.path().join("cairn.db"), port);
    let (ok, out, err) = cairn(
        port,
        &[
            "workflows",
            "trigger",
            "greet",
            "--id",
            "spaced",
            "--wait",
            "30s",
        ],
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("complete"), "{out}");
}

/// Issue 32: `cairn instances list` across workflows, page after page (`--all`), or one
/// page at a time with the cursor it prints.
#[test]
fn instances_list_spans_workflows_and_pages() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = start(&dir.path().join("cairn.db"), port);
    for (workflow, id) in [
        ("greet", "g1"),
        ("greet", "g2"),
        ("greet", "g3"),
        ("approval", "a1"),
        ("approval", "a2"),
    ] {
        let (ok, out, err) = cairn(port, &["workflows", "trigger", workflow, "--id", id]);
        assert!(ok, "{out}{err}");
    }
    let every = json_of(port, &["instances", "list", "--limit", "2", "--all"]);
    let mut listed: Vec<String> = every["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{}/{}",
                i["workflow"].as_str().unwrap(),
                i["id"].as_str().unwrap()
            )
        })
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            "approval/a1",
            "approval/a2",
            "greet/g1",
            "greet/g2",
            "greet/g3"
        ]
    );
    assert!(every["cursor"].is_null(), "{every}");
    let (ok, out, _) = cairn(port, &["instances", "list", "--limit", "2"]);
    assert!(ok && out.contains("WORKFLOW"), "{out}");
    let next = out
        .split("--cursor ")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .map(|line| line.trim_end().trim_end_matches(')'))
        .unwrap_or_else(|| panic!("no cursor printed: {out}"))
        .to_owned();
    let second = json_of(
        port,
        &["instances", "list", "--limit", "2", "--cursor", &next],
    );
    assert_eq!(second["instances"].as_array().unwrap().len(), 2, "{second}");
}

/// Issue 32: at the default level an operator sees a retried attempt's error, an instance
/// that failed for good (warn), and every control action with its origin (here the CLI).
#[test]
fn serve_logs_retries_failures_and_who_did_each_control_action() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let port = free_port();
    let log = dir.path().join("serve.log");
    let _server = start_logging_at(&db, port, &log, "info");
    for (params, id) in [
        (r#"{"failures": 1}"#, "retried"),
        (r#"{"decline": true}"#, "declined"),
    ] {
        let (ok, out, err) = cairn(
            port,
            &[
                "workflows",
                "trigger",
                "checkout",
                params,
                "--id",
                id,
                "--wait",
            ],
        );
        // A declined checkout ends errored: exit code 3.
        assert!(ok || id == "declined", "{out}{err}");
    }
    let (ok, out, err) = cairn(
        port,
        &["workflows", "trigger", "approval", "--id", "a-term"],
    );
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cairn(port, &["instances", "terminate", "approval", "a-term"]);
    assert!(ok, "{out}{err}");
    let find = |what: &dyn Fn(&serde_json::Value) -> bool| -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // The last line may be half written: lines that do not parse yet are skipped.
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(line) = text
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|l| what(l))
            {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no such line in {}",
                std::fs::read_to_string(&log).unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let retry = find(&|l| l["fields"]["message"] == "attempt failed; retrying");
    assert_eq!(retry["level"], "INFO", "{retry}");
    assert_eq!(retry["fields"]["instance"], "retried", "{retry}");
    assert_eq!(retry["fields"]["step"], "charge card", "{retry}");
    assert_eq!(
        retry["fields"]["error.message"], "card network timed out",
        "{retry}"
    );
    let failed = find(&|l| l["fields"]["message"] == "instance failed");
    assert_eq!(failed["level"], "WARN", "{failed}");
    assert_eq!(failed["fields"]["instance"], "declined", "{failed}");
    assert_eq!(
        failed["fields"]["error.message"], "card declined",
        "{failed}"
    );
    let audit = find(&|l| l["target"] == "cairn::audit");
    assert_eq!(audit["fields"]["origin"], "cli", "{audit}");
    assert_eq!(audit["fields"]["action"], "terminate", "{audit}");
    assert_eq!(audit["fields"]["on"], "approval/a-term", "{audit}");
}

/// Issue 33 §1–2: `cairn serve --config cairn.toml` takes its address, database, log
/// format and named tokens from the file; each token acts within its scope; the audit log
/// names the token (never its value); a token rotated in the file works without a restart
/// and the old one stops; a flag wins over the file.
#[test]
fn a_config_file_sets_the_server_and_its_scoped_tokens_which_rotate_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("cairn.toml");
    let log = dir.path().join("serve.log");
    let write = |ci_token: &str| {
        // Written whole and renamed into place: the server never reads half a file.
        let text = format!(
            r#"addr = "127.0.0.1:{port}"
db = "{db}"
log_format = "json"
no_schedules = true

[[tokens]]
name = "viewer"
token = "r-secret"
scope = "read"

[[tokens]]
name = "ci"
token = "{ci_token}"
scope = "operate"

[[tokens]]
name = "ops"
# sha256 of "a-secret"
token_sha256 = "{admin}"
scope = "admin"
"#,
            db = dir.path().join("cairn.db").display(),
            admin = "b4d87524393b45e7793e23f192e6a85a10bae6fb2679e996a7acb8ca60b4c88d",
        );
        let next = dir.path().join("cairn.toml.next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &config).unwrap();
    };
    write("o-secret");
    let (ok, out, err) = {
        let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["config", "check"])
            .arg(&config)
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("viewer (read), ci (operate), ops (admin)"),
        "{out}"
    );
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "info")
        .env_remove("CAIRN_TOKEN")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _server = Server(child);
    wait_up(port);
    assert_eq!(http(port, "GET", "/api/workflows", "").unwrap().0, 401);
    assert_eq!(
        http_as(port, Some("r-secret"), "GET", "/api/workflows", "")
            .unwrap()
            .0,
        200
    );
    let create = "/api/workflows/approval/instances";
    let (s, body) = http_as(
        port,
        Some("r-secret"),
        "POST",
        create,
        r#"{"instance_id": "a1"}"#,
    )
    .unwrap();
    assert_eq!(s, 403, "{body}");
    assert!(body.contains("operate scope"), "{body}");
    let (s, body) = http_as(
        port,
        Some("o-secret"),
        "POST",
        create,
        r#"{"instance_id": "a1"}"#,
    )
    .unwrap();
    assert_eq!(s, 201, "{body}");
    let one = "/api/workflows/approval/instances/a1";
    let (s, body) = http_as(port, Some("o-secret"), "DELETE", one, "").unwrap();
    assert_eq!(s, 403, "{body}");
    let (s, body) = http_as(port, Some("a-secret"), "DELETE", one, "").unwrap();
    assert!((200..300).contains(&s), "{s} {body}");

    // Rotation: the file now has another token for `ci`.
    write("o-secret-2");
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_as(port, Some("o-secret-2"), "GET", "/api/workflows", "")
        .unwrap()
        .0
        != 200
    {
        assert!(Instant::now() < deadline, "the new token never worked");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        http_as(port, Some("o-secret"), "GET", "/api/workflows", "")
            .unwrap()
            .0,
        401
    );
    let (s, body) = http_as(
        port,
        Some("o-secret-2"),
        "POST",
        create,
        r#"{"instance_id": "a2"}"#,
    )
    .unwrap();
    assert_eq!(s, 201, "{body}");

    // The audit line names the token; no line has a token's value.
    let deadline = Instant::now() + Duration::from_secs(10);
    let audit = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(line) = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| l["target"] == "cairn::audit" && l["fields"]["action"] == "delete")
        {
            break line;
        }
        assert!(Instant::now() < deadline, "no audit line in {text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(audit["fields"]["token"], "ops", "{audit}");
    let text = std::fs::read_to_string(&log).unwrap();
    for secret in ["r-secret", "o-secret", "a-secret"] {
        assert!(!text.contains(secret), "{secret} logged: {text}");
    }
    assert!(text.contains("tokens read again"), "{text}");

    // A flag wins over the file.
    let port_2 = free_port();
    let db_2 = dir.path().join("other.db");
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .args(["--addr", &format!("127.0.0.1:{port_2}"), "--db"])
        .arg(&db_2)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _second = Server(child);
    wait_up(port_2);
    assert!(db_2.exists(), "--db wins over the file's db");
}

/// A certificate authority named `name` and a certificate for `localhost` and `127.0.0.1`
/// signed by it: `(ca.pem, cert.pem, key.pem)`.
fn certificates(name: &str) -> (String, String, String) {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, name);
    let ca = rcgen::CertifiedIssuer::self_signed(ca, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    (ca.pem(), cert.pem(), key.serialize_pem())
}

/// A TLS client of `127.0.0.1:PORT` trusting `CA` that agrees on `ALPN`, then sends
/// nothing: prints how many seconds the server kept the connection.
const IDLE_TLS_CLIENT: &str = r#"
import socket, ssl, sys, time
port, ca, alpn = int(sys.argv[1]), sys.argv[2], sys.argv[3]
context = ssl.create_default_context(cafile=ca)
context.set_alpn_protocols([alpn])
sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost")
assert sock.selected_alpn_protocol() == alpn, sock.selected_alpn_protocol()
start = time.monotonic()
sock.settimeout(60)
try:
    while sock.recv(4096):
        pass
except (ConnectionError, ssl.SSLError):
    pass
print(time.monotonic() - start)
"#;

/// `curl` over TLS trusting `ca`: `(HTTP version, status)`, or `None` when the request
/// failed (a certificate it does not trust).
fn curl(ca: &std::path::Path, http: &str, url: &str) -> Option<(String, String)> {
    let output = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_version} %{http_code}",
            http,
        ])
        .arg("--cacert")
        .arg(ca)
        .arg(url)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (version, status) = text.split_once(' ')?;
    (output.status.success() && status != "000").then(|| (version.to_owned(), status.to_owned()))
}

/// Issue 33 §1: `cairn serve --tls-cert --tls-key` serves HTTPS with rustls, HTTP/2 and
/// HTTP/1.1 as the client asks (curl and the CLI verify the certificate against the
/// test's CA); a renewed certificate in the same files is served without a restart; a
/// non-loopback address without TLS is refused unless `--insecure-plain-http` says so.
#[test]
fn serve_speaks_tls_over_http2_and_http1_and_serves_a_renewed_certificate_without_a_restart() {
    if Command::new("curl").arg("--version").output().is_err() {
        panic!("curl is needed (Debian package curl)");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name);
    let (ca, cert, key) = certificates("Cairn test CA one");
    std::fs::write(path("ca1.pem"), ca).unwrap();
    std::fs::write(path("cert.pem"), cert).unwrap();
    std::fs::write(path("key.pem"), key).unwrap();
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["serve", "--no-schedules", "--token", "t0ken", "--db"])
        .arg(path("cairn.db"))
        .args(["--addr", &format!("127.0.0.1:{port}"), "--tls-cert"])
        .arg(path("cert.pem"))
        .arg("--tls-key")
        .arg(path("key.pem"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let _server = Server(child);
    let healthz = format!("https://localhost:{port}/healthz");
    let deadline = Instant::now() + Duration::from_secs(20);
    while curl(&path("ca1.pem"), "--http1.1", &healthz).is_none() {
        assert!(Instant::now() < deadline, "the TLS server did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Clients that finish the handshake and then send nothing, one per protocol: each
    // is closed once the header timeout (10 s) passes without a request. They run while
    // the rest of the test goes on.
    let idle: Vec<std::process::Child> = ["h2", "http/1.1"]
        .iter()
        .map(|alpn| {
            Command::new("python3")
                .args([
                    "-c",
                    IDLE_TLS_CLIENT,
                    &port.to_string(),
                    path("ca1.pem").to_str().unwrap(),
                    alpn,
                ])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    assert_eq!(
        curl(&path("ca1.pem"), "--http2", &healthz),
        Some(("2".to_owned(), "200".to_owned())),
        "HTTP/2 by ALPN"
    );
    assert_eq!(
        curl(&path("ca1.pem"), "--http1.1", &healthz),
        Some(("1.1".to_owned(), "200".to_owned()))
    );
    assert_ne!(
        http(port, "GET", "/healthz", "").map(|r| r.0),
        Some(200),
        "no plain HTTP on the TLS port"
    );
    // The CLI verifies the certificate: with the CA it works, without it it refuses.
    let url = format!("https://localhost:{port}");
    let cli = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["workflows", "list", "--url", &url, "--token", "t0ken"])
            .args(extra)
            .output()
            .unwrap()
    };
    let trusted = cli(&["--ca-cert", path("ca1.pem").to_str().unwrap()]);
    assert!(
        trusted.status.success() && String::from_utf8_lossy(&trusted.stdout).contains("greet"),
        "{trusted:?}"
    );
    let untrusted = cli(&[]);
    assert!(!untrusted.status.success(), "{untrusted:?}");

    // Renewal: another CA's certificate written over the same files.
    let (ca, cert, key) = certificates("Cairn test CA two");
    std::fs::write(path("ca2.pem"), ca).unwrap();
    for (name, text) in [("key.pem", key), ("cert.pem", cert)] {
        std::fs::write(path(&format!("{name}.next")), text).unwrap();
        std::fs::rename(path(&format!("{name}.next")), path(name)).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while curl(&path("ca2.pem"), "--http2", &healthz).is_none() {
        assert!(
            Instant::now() < deadline,
            "the renewed certificate was never served"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        curl(&path("ca1.pem"), "--http2", &healthz),
        None,
        "the old one is gone"
    );
    // The dashboard's session cookie, set over TLS, is `Secure`.
    let login = Command::new("curl")
        .args(["-s", "-D", "-", "-o", "/dev/null", "--cacert"])
        .arg(path("ca2.pem"))
        .args(["-d", "token=t0ken&next=%2F"])
        .arg(format!("https://localhost:{port}/login"))
        .output()
        .unwrap();
    let headers = String::from_utf8_lossy(&login.stdout).to_lowercase();
    let cookie = headers
        .lines()
        .find(|l| l.starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("no cookie: {headers}"));
    assert!(
        cookie.contains("; secure") && cookie.contains("httponly"),
        "{cookie}"
    );

    for client in idle {
        let output = client.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&output.stdout).into_owned();
        let seconds: f64 = said.trim().parse().unwrap_or_else(|_| panic!("{said}"));
        assert!(
            (8.0..20.0).contains(&seconds),
            "an idle TLS connection was closed after {seconds} s, not at the header timeout"
        );
    }

    // Plain HTTP on a public address is refused before anything is bound.
    let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["serve", "--addr", "0.0.0.0:0", "--token", "t", "--db"])
        .arg(path("other.db"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("refusing to serve plain HTTP on 0.0.0.0:0")
            && stderr.contains("--insecure-plain-http"),
        "{stderr}"
    );
    assert!(
        !path("other.db").exists(),
        "refused before opening the database"
    );
}

/// The schema version of the SQLite database at `db`.
fn user_version(db: &std::path::Path) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

/// The details of one instance over HTTP.
fn details(port: u16, workflow: &str, id: &str) -> serde_json::Value {
    let (status, body) = http(
        port,
        "GET",
        &format!("/api/workflows/{workflow}/instances/{id}"),
        "",
    )
    .unwrap();
    assert_eq!(status, 200, "{workflow}/{id}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// Issue 33 §3: a SQLite database written by each earlier schema version — fixtures made
/// by the build that wrote them (`tools/fixtures/make-sqlite.sh`: a finished greeting, a
/// nap in its sleep, a report killed in the middle of its first attempt) — opens with
/// today's build, is migrated, and its instances finish: nothing finished runs again, the
/// sleep ends, the interrupted attempt is retried once.
#[test]
fn an_sqlite_database_of_every_earlier_schema_version_opens_and_its_instances_finish() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut found: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir(&fixtures)
        .unwrap_or_else(|e| panic!("the upgrade fixtures in {}: {e}", fixtures.display()))
        .filter_map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name()?.to_str()?.to_owned();
            let version = name.strip_prefix("sqlite-schema-")?.strip_suffix(".db")?;
            Some((version.parse().ok()?, path))
        })
        .collect();
    found.sort();
    let versions: Vec<u32> = found.iter().map(|(v, _)| *v).collect();
    assert!(
        versions.len() >= 6 && versions.last() == Some(&14),
        "fixtures of the earlier schema versions: {versions:?}"
    );
    for (version, fixture) in found {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("cairn.db");
        std::fs::copy(&fixture, &db).unwrap();
        let port = free_port();
        let server = start(&db, port);
        let greet = details(port, "greet", "g-done");
        assert_eq!(greet["status"], "complete", "v{version}: {greet}");
        assert_eq!(greet["output"], "Hello, Fixture!", "v{version}: {greet}");
        for s in greet["steps"].as_array().unwrap() {
            assert_eq!(
                s["attempts"].as_array().unwrap().len(),
                1,
                "v{version}: ran again: {s}"
            );
        }
        until_status(port, "nap", "n-sleeping", "complete");
        until_status(port, "report", "r-running", "complete");
        let report = details(port, "report", "r-running");
        assert_eq!(report["output"]["rows"], 42, "v{version}: {report}");
        let build = &report["steps"][0];
        assert_eq!(build["name"], "build report", "v{version}: {report}");
        let attempts = build["attempts"].as_array().unwrap();
        assert_eq!(
            attempts.len(),
            2,
            "v{version}: interrupted, then retried once: {build}"
        );
        drop(server);
        let now = user_version(&db);
        assert!(
            now > i64::from(version),
            "v{version} was migrated (now {now})"
        );
    }
}

/// Issue 33 §3: a database written by a newer build is refused, the message naming both
/// schema versions, and left as it was.
#[test]
fn an_sqlite_database_of_a_newer_schema_version_is_refused_naming_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cairn.db");
    let port = free_port();
    drop(start(&db, port));
    let current = user_version(&db);
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.pragma_update(None, "user_version", current + 1)
        .unwrap();
    drop(conn);
    let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "serve",
            "--no-schedules",
            "--addr",
            &format!("127.0.0.1:{}", free_port()),
            "--db",
        ])
        .arg(&db)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("schema version {}", current + 1))
            && stderr.contains(&format!("this build's {current}")),
        "{stderr}"
    );
    assert_eq!(user_version(&db), current + 1, "left as it was");
}

/// Review finding: `config check` said `ok` for files `serve --config` refuses (an OTLP
/// endpoint in a build without tracing, a public address without a token, without TLS,
/// or with certificate files that are not there), though its help promises it agrees with
/// `serve`.
#[test]
fn config_check_refuses_what_serve_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let check_with = |text: &str, env: &[(&str, &str)]| {
        let file = dir.path().join("cairn.toml");
        std::fs::write(&file, text).unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["config", "check"])
            .arg(&file)
            .env_remove("CAIRN_TOKEN")
            .env_remove("CAIRN_INSECURE_PLAIN_HTTP")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let check = |text: &str| check_with(text, &[]);
    let token = "[[tokens]]\nname = \"ci\"\ntoken = \"s3cret\"\nscope = \"admin\"\n";
    let refused = [
        (
            "addr = \"0.0.0.0:8787\"\ninsecure_plain_http = true\n".to_owned(),
            "without a token",
        ),
        (format!("addr = \"0.0.0.0:8787\"\n{token}"), "plain HTTP"),
        (
            format!(
                "addr = \"0.0.0.0:8787\"\ntls_cert = \"missing.pem\"\ntls_key = \"missing.key\"\n{token}"
            ),
            "missing.pem",
        ),
    ];
    for (text, says) in refused {
        let (ok, err) = check(&text);
        assert!(!ok && err.contains(says), "{text}: {err}");
    }
    if !cfg!(feature = "otel") {
        let (ok, err) = check("otlp_endpoint = \"http://127.0.0.1:4318\"\n");
        assert!(!ok && err.contains("otel"), "{err}");
    }
    let (ok, err) = check(&format!(
        "addr = \"0.0.0.0:8787\"\ninsecure_plain_http = true\ntrusted_proxies = [\"10.0.0.2\"]\n{token}"
    ));
    assert!(ok, "{err}");
    // The token and the plain-HTTP switch may come from the environment, as for serve.
    let (ok, err) = check_with(
        "addr = \"0.0.0.0:8787\"\n",
        &[
            ("CAIRN_TOKEN", "s3cret"),
            ("CAIRN_INSECURE_PLAIN_HTTP", "true"),
        ],
    );
    assert!(ok, "{err}");
}
