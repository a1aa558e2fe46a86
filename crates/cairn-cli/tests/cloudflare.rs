//! The real `wrangler workflows …` and Cloudflare's Python SDK against a real `cairn serve`,
//! through Cloudflare's routes (`/client/v4`). Each result is checked through Cairn's own
//! API. `.ci/run` installs both and sets CAIRN_TEST_WRANGLER (a wrangler launcher) and
//! CAIRN_TEST_CF_PYTHON (a python with the `cloudflare` package); without them the tests
//! say so and skip.

#![allow(clippy::unwrap_used, missing_docs)] // tests may unwrap: a panic is the failure report

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "cf-t0ken";
const ACCOUNT: &str = "acc-123";

struct Server {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "serve",
            "--no-schedules",
            "--token",
            TOKEN,
            "--account-id",
            ACCOUNT,
            "--db",
        ])
        .arg(dir.path().join("cairn.db"))
        .args(["--addr", &format!("127.0.0.1:{port}")])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server { child, port, dir };
    common::wait_up(server.port);
    server
}

/// A request to Cairn's own API, with the token.
fn api(port: u16, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, serde_json::Value::Null);
    };
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (
        status,
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    )
}

fn status_of(port: u16, workflow: &str, id: &str) -> String {
    let (_, details) = api(
        port,
        "GET",
        &format!("/api/workflows/{workflow}/instances/{id}"),
        "",
    );
    details["status"].as_str().unwrap_or("").to_owned()
}

fn until_status(port: u16, workflow: &str, id: &str, status: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while status_of(port, workflow, id) != status {
        assert!(
            Instant::now() < deadline,
            "{workflow}/{id} never reached {status} (is {})",
            status_of(port, workflow, id)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn tool(var: &str, what: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(path) => Some(PathBuf::from(path)),
        None => {
            eprintln!(
                "\n*** SKIPPED: {var} is not set; it names {what} (.ci/run installs it) ***\n"
            );
            None
        }
    }
}

/// Runs wrangler against the server: its output (stdout and stderr) and whether it
/// succeeded. No config file, no banner, no telemetry, no update check.
fn wrangler(wrangler: &Path, server: &Server, args: &[&str]) -> (bool, String) {
    let home = server.dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let out = Command::new(wrangler)
        .args(args)
        .current_dir(&home)
        .env(
            "CLOUDFLARE_API_BASE_URL",
            format!("http://127.0.0.1:{}/client/v4", server.port),
        )
        .env("CLOUDFLARE_ACCOUNT_ID", ACCOUNT)
        .env("CLOUDFLARE_API_TOKEN", TOKEN)
        .env("WRANGLER_SEND_METRICS", "false")
        .env("WRANGLER_HIDE_BANNER", "true")
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("NO_COLOR", "1")
        .env("FORCE_COLOR", "0")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
#[cfg_attr(
    not(cairn_test_wrangler),
    ignore = "CAIRN_TEST_WRANGLER was not set at build time (.ci/cloudflare-tools.sh installs wrangler and prints it)"
)]
fn wrangler_drives_cairn_through_cloudflares_routes() {
    let Some(bin) = tool("CAIRN_TEST_WRANGLER", "a wrangler launcher") else {
        return;
    };
    let server = start();
    let port = server.port;
    let run = |args: &[&str]| {
        let (ok, out) = wrangler(&bin, &server, args);
        assert!(ok, "wrangler {args:?} failed:\n{out}");
        assert!(
            !out.contains("undefined"),
            "wrangler {args:?} printed undefined:\n{out}"
        );
        out
    };

    let out = run(&["workflows", "list"]);
    for name in [
        "greet", "approval", "nap", "report", "checkout", "order", "relay",
    ] {
        assert!(out.contains(name), "{out}");
    }
    assert!(out.contains("Showing 7 workflows from page 1"), "{out}");

    let out = run(&["workflows", "describe", "approval"]);
    assert!(out.contains("Name:         approval"), "{out}");
    assert!(out.contains("Latest Version:"), "{out}");

    // Trigger with params and an id, and without either.
    let out = run(&[
        "workflows",
        "trigger",
        "greet",
        r#"{"name": "Ada"}"#,
        "--id",
        "g1",
    ]);
    assert!(
        out.contains(r#"Workflow instance "g1" has been queued successfully"#),
        "{out}"
    );
    let out = run(&["workflows", "trigger", "greet"]);
    let generated = out
        .split('"')
        .nth(1)
        .unwrap_or_else(|| panic!("no id in: {out}"))
        .to_owned();
    until_status(port, "greet", "g1", "complete");
    until_status(port, "greet", &generated, "complete");
    let (_, g1) = api(port, "GET", "/api/workflows/greet/instances/g1", "");
    assert_eq!(g1["output"], "Hello, Ada!", "{g1}");
    assert_eq!(g1["params"]["name"], "Ada");

    let out = run(&["workflows", "instances", "list", "greet"]);
    assert!(out.contains("Showing 2 instances from page 1"), "{out}");
    assert!(out.contains("g1") && out.contains(&generated), "{out}");
    assert!(out.contains("Completed"), "{out}");
    // Paging follows the cursor: one instance per page, the older one on page 2.
    let out = run(&[
        "workflows",
        "instances",
        "list",
        "greet",
        "--per-page",
        "1",
        "--page",
        "2",
    ]);
    assert!(out.contains("g1") && !out.contains(&generated), "{out}");
    let out = run(&[
        "workflows",
        "instances",
        "list",
        "greet",
        "--status",
        "running",
    ]);
    assert!(out.contains("matched the provided filters"), "{out}");
    let out = run(&[
        "workflows",
        "instances",
        "list",
        "greet",
        "--date-start",
        "2999-01-01",
    ]);
    assert!(out.contains("matched the provided filters"), "{out}");
    let out = run(&[
        "workflows",
        "instances",
        "list",
        "greet",
        "--per-page",
        "2",
        "--page",
        "2",
    ]);
    assert!(out.contains("No instances found on page 2"), "{out}");

    // `latest` is the newest instance; its steps are shown.
    let out = run(&["workflows", "instances", "describe", "greet", "latest"]);
    assert!(
        out.contains(&format!("Instance Id:           {generated}")),
        "{out}"
    );
    assert!(
        out.contains("compose greeting") && out.contains("deliver greeting"),
        "{out}"
    );
    assert!(out.contains("Success:               ✅ Yes"), "{out}");
    let out = run(&["workflows", "instances", "describe", "greet", "g1"]);
    assert!(out.contains(r#"Output:    "Hello, Ada!""#), "{out}");

    // Pause, resume, an event: each checked through Cairn's own API.
    run(&[
        "workflows",
        "trigger",
        "approval",
        r#"{"amount": 42}"#,
        "--id",
        "a1",
    ]);
    until_status(port, "approval", "a1", "waiting");
    let out = run(&["workflows", "instances", "pause", "approval", "a1"]);
    assert!(out.contains("was paused successfully"), "{out}");
    assert_eq!(status_of(port, "approval", "a1"), "paused");
    let out = run(&["workflows", "instances", "resume", "approval", "a1"]);
    assert!(out.contains("was resumed successfully"), "{out}");
    let out = run(&[
        "workflows",
        "instances",
        "send-event",
        "approval",
        "a1",
        "--type",
        "approved",
        "--payload",
        r#"{"by": "ada"}"#,
    ]);
    assert!(out.contains(r#"The event with type "approved""#), "{out}");
    until_status(port, "approval", "a1", "complete");
    let (_, a1) = api(port, "GET", "/api/workflows/approval/instances/a1", "");
    assert_eq!(a1["output"]["approval"]["by"], "ada", "{a1}");

    // Terminate, then restart.
    run(&["workflows", "trigger", "approval", "--id", "a2"]);
    until_status(port, "approval", "a2", "waiting");
    let out = run(&["workflows", "instances", "terminate", "approval", "a2"]);
    assert!(out.contains("was terminated successfully"), "{out}");
    assert_eq!(status_of(port, "approval", "a2"), "terminated");
    let out = run(&["workflows", "instances", "describe", "approval", "a2"]);
    assert!(out.contains("Terminated"), "{out}");
    let out = run(&["workflows", "instances", "restart", "approval", "a2"]);
    assert!(out.contains("was restarted successfully"), "{out}");
    until_status(port, "approval", "a2", "waiting");

    // Delete by id, and terminate everything unfinished.
    let out = run(&["workflows", "instances", "delete", "greet", "g1"]);
    assert!(
        out.contains(r#"Deleted workflow instances from "greet": "g1""#),
        "{out}"
    );
    assert_eq!(
        api(port, "GET", "/api/workflows/greet/instances/g1", "").0,
        404
    );
    let out = run(&["workflows", "instances", "terminate-all", "approval"]);
    assert!(out.contains("has been started"), "{out}");
    until_status(port, "approval", "a2", "terminated");
    let (ok, out) = wrangler(
        &bin,
        &server,
        &["workflows", "instances", "delete", "greet", "gone"],
    );
    assert!(!ok, "{out}");
    assert!(out.contains("gone: instance.not_found"), "{out}");

    // Errors read as Cloudflare's, with its codes.
    let (ok, out) = wrangler(&bin, &server, &["workflows", "describe", "nope"]);
    assert!(!ok);
    assert!(
        out.contains("[code: 10200]") && out.contains("nope"),
        "{out}"
    );
    let (ok, out) = wrangler(
        &bin,
        &server,
        &["workflows", "instances", "describe", "greet", "missing"],
    );
    assert!(!ok);
    assert!(out.contains("[code: 10400]"), "{out}");
}

#[test]
#[cfg_attr(
    not(cairn_test_cf_python),
    ignore = "CAIRN_TEST_CF_PYTHON was not set at build time (.ci/cloudflare-tools.sh installs Cloudflare's Python SDK and prints it)"
)]
fn cloudflares_python_sdk_drives_cairn() {
    let Some(python) = tool(
        "CAIRN_TEST_CF_PYTHON",
        "a python with the cloudflare package",
    ) else {
        return;
    };
    let server = start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cloudflare_sdk.py");
    let out = Command::new(python)
        .arg(&script)
        .env(
            "CAIRN_URL",
            format!("http://127.0.0.1:{}/client/v4", server.port),
        )
        .env("CAIRN_API", format!("http://127.0.0.1:{}/api", server.port))
        .env("CAIRN_TOKEN", TOKEN)
        .env("CAIRN_ACCOUNT", ACCOUNT)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the SDK script failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 32: with exactly the README's variables, Cloudflare's Python SDK (`Cloudflare()`
/// with no arguments) sends its calls, and the token, to Cairn, never to Cloudflare's API.
#[test]
#[cfg_attr(
    not(cairn_test_cf_python),
    ignore = "CAIRN_TEST_CF_PYTHON was not set at build time (.ci/cloudflare-tools.sh installs Cloudflare's Python SDK and prints it)"
)]
fn cloudflares_python_sdk_reaches_cairn_with_the_readmes_variables() {
    let Some(python) = tool(
        "CAIRN_TEST_CF_PYTHON",
        "a python with the cloudflare package",
    ) else {
        return;
    };
    let server = start();
    let base = format!("http://127.0.0.1:{}/client/v4", server.port);
    let script = r#"
import cloudflare, os
client = cloudflare.Cloudflare()
made = client.workflows.instances.create("greet", account_id=os.environ["CLOUDFLARE_ACCOUNT_ID"], instance_id="readme-py")
print(made.id)
"#;
    let mut command = Command::new(python);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CLOUDFLARE_") {
            command.env_remove(key);
        }
    }
    // The README's block, as written there.
    let out = command
        .args(["-c", script])
        .env("CLOUDFLARE_API_BASE_URL", &base)
        .env("CLOUDFLARE_BASE_URL", &base)
        .env("CLOUDFLARE_ACCOUNT_ID", ACCOUNT)
        .env("CLOUDFLARE_API_TOKEN", TOKEN)
        .output()
        .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("readme-py"), "{printed}");
    let (code, body) = api(
        server.port,
        "GET",
        "/api/workflows/greet/instances/readme-py",
        "",
    );
    assert_eq!(code, 200, "the instance was created on Cairn: {body}");
}
