//! The client commands: talk to a running `cairn serve` over HTTP, mirroring
//! `wrangler workflows …`. Tables for people, `--json` for scripts.

use serde_json::{Value, json};

/// Where the server is and how to authenticate.
pub(crate) struct Client {
    pub(crate) url: String,
    pub(crate) token: Option<String>,
    agent: ureq::Agent,
}

type Result<T> = std::result::Result<T, String>;

/// Everything but the unreserved characters of RFC 3986 is escaped in a path segment or a
/// query value: an id like `a/b` or `x?y=1` must reach the server as one id.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `text` as one path segment or query value.
pub(crate) fn seg(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, SEGMENT).to_string()
}

/// `text` percent-encoded for a query value (`&`, `=`, `+` and spaces included).
pub(crate) fn query_value(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// The records that end an instance's stream.
const TERMINAL: &[&str] = &[
    "WORKFLOW_SUCCESS",
    "WORKFLOW_FAILURE",
    "WORKFLOW_TERMINATED",
];

/// How long `--watch` keeps trying to reach a server that went away.
const RECONNECT_FOR: std::time::Duration = std::time::Duration::from_secs(120);

/// How long the client waits to connect, and for an answer's head (a live stream's body is
/// read as it comes, without a deadline).
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

impl Client {
    /// A client of the server at `url`, trusting the certificate authority in the PEM file
    /// `ca_cert` besides the public roots.
    pub(crate) fn new(
        url: String,
        token: Option<String>,
        ca_cert: Option<&std::path::Path>,
    ) -> std::result::Result<Self, String> {
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(path) = ca_cert {
            let pem = std::fs::read(path)
                .map_err(|e| format!("read the CA certificate {}: {e}", path.display()))?;
            let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            if certs.is_empty() {
                return Err(format!("{} holds no PEM certificate", path.display()));
            }
            tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&certs));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(tls.build())
            .http_status_as_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_recv_response(Some(ANSWER_TIMEOUT))
            // The server's audit log names the CLI as the origin of what it does.
            .user_agent(concat!("cairn-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(Client {
            url: base_url(&url),
            token,
            agent,
        })
    }

    /// One request; a non-2xx answer becomes the server's `message (code)`.
    pub(crate) fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let url = format!("{}{path}", self.url);
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let response = match (method, body) {
            ("GET" | "DELETE", _) => {
                let mut req = if method == "GET" {
                    self.agent.get(&url)
                } else {
                    self.agent.delete(&url)
                };
                if let Some(a) = &auth {
                    req = req.header("Authorization", a);
                }
                req.call()
            }
            (_, body) => {
                let text = body.map_or_else(|| "{}".to_owned(), Value::to_string);
                let mut req = match method {
                    "PATCH" => self.agent.patch(&url),
                    _ => self.agent.post(&url),
                };
                if let Some(a) = &auth {
                    req = req.header("Authorization", a);
                }
                req.content_type("application/json").send(text.as_str())
            }
        };
        let mut response = response.map_err(|e| self.unreachable(&e))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| format!("read the answer of {method} {url}: {e}"))?;
        let value: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text)
                .map_err(|e| format!("the server sent something that is not JSON ({e}): {text}"))?
        };
        if (200..300).contains(&status) {
            Ok(value)
        } else {
            let message = value["message"].as_str().unwrap_or(&text).to_owned();
            let code = value["code"].as_str().unwrap_or("http.error");
            let hint = if status == 401 {
                " — pass the server's token with --token or CAIRN_TOKEN"
            } else {
                ""
            };
            Err(format!("{message} ({code}, HTTP {status}){hint}"))
        }
    }

    /// A `GET` whose answer is copied to `out` as it arrives (not held in memory, not
    /// parsed); a non-2xx answer becomes the server's `message (code)`.
    pub(crate) fn download(&self, path: &str, out: &mut impl std::io::Write) -> Result<u64> {
        let url = format!("{}{path}", self.url);
        let mut req = self.agent.get(&url);
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let mut response = req.call().map_err(|e| self.unreachable(&e))?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            let text = response.body_mut().read_to_string().unwrap_or_default();
            let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            let message = value["message"].as_str().unwrap_or(&text).to_owned();
            let code = value["code"].as_str().unwrap_or("http.error");
            return Err(format!("{message} ({code}, HTTP {status})"));
        }
        let mut body = response.body_mut().as_reader();
        std::io::copy(&mut body, out).map_err(|e| format!("read the answer of GET {url}: {e}"))
    }

    /// What to say when the request did not get an answer.
    fn unreachable(&self, e: &ureq::Error) -> String {
        match e {
            ureq::Error::Io(_) | ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => {
                format!(
                    "cannot reach Cairn at {} — is 'cairn serve' running? (set --url or CAIRN_URL) [{e}]",
                    self.url
                )
            }
            ureq::Error::Timeout(_) => format!(
                "Cairn at {} did not answer in time — is it overloaded or stopped? [{e}]",
                self.url
            ),
            _ => format!("request to {}: {e}", self.url),
        }
    }

    /// Follows an SSE stream at `path`, calling `each(id, event, data)` per record, until
    /// the server ends it. Reconnects once a dropped connection with the last id seen.
    pub(crate) fn follow(&self, path: &str, mut each: impl FnMut(u64, &str, &Value)) -> Result<()> {
        use std::io::BufRead as _;
        let url = format!("{}{path}", self.url);
        let mut last: Option<u64> = None;
        let mut finished = false;
        // Across a server restart (or a dropped connection) the stream is picked up again
        // after the last record seen, waiting 100 ms, doubling, up to 5 s between tries, for
        // at most RECONNECT_FOR.
        let mut pause = std::time::Duration::from_millis(100);
        let mut down_since: Option<std::time::Instant> = None;
        loop {
            let mut req = self.agent.get(&url);
            if let Some(t) = &self.token {
                req = req.header("Authorization", &format!("Bearer {t}"));
            }
            if let Some(id) = last {
                req = req.header("Last-Event-ID", &id.to_string());
            }
            let mut response = match req.call() {
                Ok(r) => r,
                Err(e) => {
                    let since = *down_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() > RECONNECT_FOR {
                        return Err(self.unreachable(&e));
                    }
                    eprintln!("cairn: stream interrupted ({e}); reconnecting in {pause:?}");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_secs(5));
                    continue;
                }
            };
            let status = response.status().as_u16();
            if status != 200 {
                let text = response.body_mut().read_to_string().unwrap_or_default();
                let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                let message = value["message"].as_str().unwrap_or(&text).to_owned();
                let code = value["code"].as_str().unwrap_or("http.error");
                // Busy or briefly without its store (503): try again, as after a restart.
                let since = *down_since.get_or_insert_with(std::time::Instant::now);
                if status == 503 && since.elapsed() <= RECONNECT_FOR {
                    eprintln!("cairn: {message} ({code}); reconnecting in {pause:?}");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_secs(5));
                    continue;
                }
                return Err(format!("{message} ({code}, HTTP {status})"));
            }
            let mut received = false;
            let reader = std::io::BufReader::new(response.body_mut().as_reader());
            let (mut id, mut event, mut data) = (None, String::new(), String::new());
            for line in reader.lines() {
                let Ok(line) = line else { break };
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.parse().ok();
                } else if let Some(v) = line.strip_prefix("event: ") {
                    event = v.to_owned();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                } else if line.is_empty() {
                    if let Some(n) = id.take() {
                        let value = serde_json::from_str(&data).unwrap_or(Value::Null);
                        each(n, &event, &value);
                        last = Some(n);
                        received = true;
                        finished = TERMINAL.contains(&event.as_str());
                    }
                    event.clear();
                    data.clear();
                }
            }
            // The stream of a finished instance ends after its last record; any other end
            // (a server stopping, a connection dropped) is picked up again.
            if finished {
                return Ok(());
            }
            // A connection that carried records resets the back-off; one that ended with
            // none counts toward giving up, so a stream that keeps ending at once (the
            // server cannot read the log) is never retried in a tight loop.
            if received {
                down_since = None;
                pause = std::time::Duration::from_millis(100);
            }
            let since = *down_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() > RECONNECT_FOR {
                return Err(format!(
                    "the stream of {url} keeps ending without new records; giving up"
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_secs(5));
        }
    }

    /// `latest` means the most recently created instance.
    pub(crate) fn resolve(&self, workflow: &str, id: &str) -> Result<String> {
        if id != "latest" {
            return Ok(id.to_owned());
        }
        let page = self.call(
            "GET",
            &format!("/api/workflows/{}/instances?limit=1", seg(workflow)),
            None,
        )?;
        page["instances"][0]["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("workflow {workflow:?} has no instances"))
    }
}

/// The server's base URL as given, without a trailing `/` or `/api`: `cairn serve` prints
/// its API's address (`http://127.0.0.1:8787/api`), which users pass as `--url`.
fn base_url(url: &str) -> String {
    let url = url.trim_end_matches('/');
    url.strip_suffix("/api").unwrap_or(url).to_owned()
}

/// Prints rows as an aligned table.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    out!(
        "{}",
        line(headers.iter().map(|h| (*h).to_owned()).collect())
    );
    for row in rows {
        out!("{}", line(row.clone()));
    }
}

pub(crate) fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The time between two RFC 3339 timestamps, in ms.
fn millis_between(start: &Value, end: &Value) -> String {
    let parse = |v: &Value| v.as_str().and_then(|s| humantime::parse_rfc3339(s).ok());
    match (parse(start), parse(end)) {
        (Some(a), Some(b)) => b
            .duration_since(a)
            .map_or_else(|_| "-".into(), |d| format!("{} ms", d.as_millis())),
        _ => "-".into(),
    }
}

/// `instances describe`: a header, then the step timeline.
pub(crate) fn describe(details: &Value, full_output: bool) {
    let rollback = details
        .get("rollback")
        .map(|r| text(&r["outcome"]))
        .unwrap_or_else(|| "-".into());
    for (k, v) in [
        ("Workflow", text(&details["workflow"])),
        ("Instance", text(&details["id"])),
        ("Status", text(&details["status"])),
        ("Trigger", text(&details["trigger"]["source"])),
        ("Queued", text(&details["queued"])),
        ("Start", text(&details["start"])),
        ("End", text(&details["end"])),
        (
            "Duration",
            millis_between(&details["start"], &details["end"]),
        ),
        ("Success", text(&details["success"])),
        (
            "Error",
            details["error"].as_object().map_or("-".into(), |e| {
                format!("{}: {}", text(&e["name"]), text(&e["message"]))
            }),
        ),
        ("Rollback", rollback),
        ("Output", clip(&text(&details["output"]), full_output)),
    ] {
        out!("{k:<9} {v}");
    }
    if let Some(key) = details["concurrencyKey"].as_str() {
        let waiting = details["waitingForSlot"]
            .get("position")
            .map_or(String::new(), |p| {
                format!(" (waiting for a slot: #{} in line)", text(p))
            });
        out!("{:<9} {key}{waiting}", "Key");
    }
    if let Some(parent) = details["parent"].as_object() {
        out!(
            "{:<9} {} {} (step {}#{})",
            "Parent",
            text(&parent["workflow"]),
            text(&parent["id"]),
            text(&parent["step"]),
            text(&parent["count"])
        );
    }
    if let Some(children) = details["children"].as_array().filter(|c| !c.is_empty()) {
        out!("\nChildren:");
        let rows: Vec<Vec<String>> = children
            .iter()
            .map(|c| {
                vec![
                    format!("{}#{}", text(&c["step"]), text(&c["count"])),
                    text(&c["workflow"]),
                    text(&c["id"]),
                    text(&c["status"]),
                    if c["detached"] == true { "yes" } else { "no" }.to_owned(),
                ]
            })
            .collect();
        table(
            &["STEP", "WORKFLOW", "INSTANCE", "STATUS", "DETACHED"],
            &rows,
        );
    }
    out!("\nSteps:");
    let rows: Vec<Vec<String>> = details["steps"]
        .as_array()
        .map(|steps| {
            steps
                .iter()
                .map(|s| {
                    let attempts = s["attempts"].as_array().map_or(0, Vec::len);
                    let outcome = match s["success"].as_bool() {
                        Some(true) => "ok".to_owned(),
                        Some(false) => format!("failed: {}", text(&s["error"]["message"])),
                        None if s["until"].is_string() => {
                            let verb = if s["type"] == "sleep" {
                                "sleeping"
                            } else {
                                "waiting"
                            };
                            format!("{verb} until {}", text(&s["until"]))
                        }
                        None => "running".to_owned(),
                    };
                    vec![
                        text(&s["type"]),
                        format!("{}#{}", text(&s["name"]), text(&s["count"])),
                        text(&s["start"]),
                        millis_between(&s["start"], &s["end"]),
                        attempts.to_string(),
                        outcome,
                        text(&s["retriesAt"]),
                        clip(&text(&s["output"]), full_output),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    table(
        &[
            "KIND",
            "STEP",
            "START",
            "DURATION",
            "ATTEMPTS",
            "OUTCOME",
            "RETRIES AT",
            "OUTPUT",
        ],
        &rows,
    );
    // Why each retried attempt failed: the steps table shows the last error only.
    let failures: Vec<Vec<String>> = details["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| {
            let step = format!("{}#{}", text(&s["name"]), text(&s["count"]));
            s["attempts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|a| a["error"].is_object())
                .map(move |a| {
                    vec![
                        step.clone(),
                        text(&a["attempt"]),
                        text(&a["end"]),
                        format!(
                            "{}: {}",
                            text(&a["error"]["name"]),
                            text(&a["error"]["message"])
                        ),
                        a["retryDelayMs"]
                            .as_u64()
                            .map(|ms| format!("{ms} ms"))
                            .unwrap_or_default(),
                    ]
                })
        })
        .collect();
    if !failures.is_empty() {
        out!("\nFailed attempts:");
        table(
            &["STEP", "ATTEMPT", "AT", "ERROR", "RETRIED AFTER"],
            &failures,
        );
    }
}

/// Output longer than 60 characters is cut unless `full` (then it is whole).
fn clip(s: &str, full: bool) -> String {
    if full || s.chars().count() <= 60 {
        s.to_owned()
    } else {
        format!(
            "{}… (--full-output to see all)",
            s.chars().take(60).collect::<String>()
        )
    }
}

pub(crate) fn parse_json(what: &str, s: &str) -> Result<Value> {
    serde_json::from_str(s).map_err(|e| format!("{what} is not valid JSON ({e}): {s}"))
}

pub(crate) fn empty_object() -> Value {
    json!({})
}

#[cfg(test)]
mod tests {
    /// Review finding: the URL `cairn serve` printed, given as `--url`, made every request
    /// go to `/api/api/…`.
    #[test]
    fn the_api_address_is_taken_for_the_servers() {
        for given in [
            "http://h:1",
            "http://h:1/",
            "http://h:1/api",
            "http://h:1/api/",
        ] {
            assert_eq!(super::base_url(given), "http://h:1", "{given}");
        }
        assert_eq!(super::base_url("https://h/cairn/"), "https://h/cairn");
    }
}
