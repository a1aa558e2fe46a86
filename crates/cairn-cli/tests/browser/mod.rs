//! A small WebDriver client (W3C WebDriver over HTTP, as `chromedriver` speaks it) for the
//! dashboard's browser tests: what they need and nothing more — navigate, find, click,
//! type, read, run a script, screenshots, cookies and the browser's console log (a
//! chromedriver extension the WebDriver crates do not expose, the reason this is not one
//! of them). It drives a real headless Chromium started by a real chromedriver.

#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The key of an element reference in WebDriver's JSON.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Where chromedriver is: `CAIRN_TEST_CHROMEDRIVER`, else `chromedriver` on the PATH. `None`
/// (after a loud message) when there is none and `CAIRN_REQUIRE_CHROMIUM` is unset; with
/// it set (CI), a missing browser fails the test.
pub(crate) fn chromedriver() -> Option<String> {
    let path = std::env::var("CAIRN_TEST_CHROMEDRIVER").ok().or_else(|| {
        let found = Command::new("sh")
            .args(["-c", "command -v chromedriver"])
            .output()
            .ok()?;
        let path = String::from_utf8_lossy(&found.stdout).trim().to_owned();
        (!path.is_empty()).then_some(path)
    });
    if path.is_none() {
        assert!(
            std::env::var_os("CAIRN_REQUIRE_CHROMIUM").is_none(),
            "CAIRN_REQUIRE_CHROMIUM is set but chromedriver is missing (Debian: chromium chromium-driver)"
        );
        eprintln!(
            "\n*** SKIPPED: no chromedriver (install the Debian packages chromium and chromium-driver, or set CAIRN_TEST_CHROMEDRIVER) ***\n"
        );
    }
    path
}

/// A browser session; the browser and its driver stop when it drops.
pub(crate) struct Browser {
    driver: Child,
    base: String,
    agent: ureq::Agent,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.agent.delete(&self.base).call();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// One element of the page.
#[derive(Clone, Debug)]
pub(crate) struct Element(String);

impl Browser {
    /// Starts chromedriver at `path` and a headless Chromium of `width`×`height`.
    pub(crate) fn start(path: &str, width: u32, height: u32) -> Browser {
        let port = super::common::free_port();
        let driver = Command::new(path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let root = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while agent.get(&format!("{root}/status")).call().is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile = tempfile::tempdir().unwrap();
        let binary =
            std::env::var("CAIRN_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            // Commands run once the document is parsed, not after every subresource (a
            // page's live stream never "finishes loading"); the tests wait for content.
            "pageLoadStrategy": "eager",
            "goog:loggingPrefs": { "browser": "ALL" },
            "goog:chromeOptions": {
                "binary": binary,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--disable-extensions", "--lang=en-US",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        } } });
        let answer = post(&agent, &format!("{root}/session"), &caps);
        let id = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_owned();
        Browser {
            driver,
            base: format!("{root}/session/{id}"),
            agent,
            _profile: profile,
        }
    }

    fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.base);
        match method {
            "GET" => read(self.agent.get(&url).call()),
            "DELETE" => read(self.agent.delete(&url).call()),
            _ => post(&self.agent, &url, &body.unwrap_or_else(|| json!({}))),
        }
    }

    /// A WebDriver command's value, or the WebDriver error it answered (its `error` code).
    fn try_ok(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let answer = self.cmd(method, path, body);
        match answer["value"]["error"].as_str() {
            Some(error) => Err(format!("{error}: {}", answer["value"]["message"])),
            None => Ok(answer["value"].clone()),
        }
    }

    fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let started = Instant::now();
        let shown = body
            .as_ref()
            .map(|b| b.to_string().chars().take(120).collect::<String>());
        let answer = self.cmd(method, path, body);
        if started.elapsed() > Duration::from_secs(2) {
            eprintln!(
                "slow WebDriver {method} {path} {shown:?}: {:?}",
                started.elapsed()
            );
        }
        if let Some(error) = answer["value"]["error"].as_str() {
            panic!(
                "WebDriver {method} {path}: {error}: {}",
                answer["value"]["message"]
            );
        }
        answer["value"].clone()
    }

    pub(crate) fn goto(&self, url: &str) {
        self.ok("POST", "/url", Some(json!({ "url": url })));
    }

    pub(crate) fn url(&self) -> String {
        self.ok("GET", "/url", None)
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    pub(crate) fn set_size(&self, width: u32, height: u32) {
        self.ok(
            "POST",
            "/window/rect",
            Some(json!({ "width": width, "height": height })),
        );
    }

    /// Every element matching `css`.
    pub(crate) fn all(&self, css: &str) -> Vec<Element> {
        let found = self.ok(
            "POST",
            "/elements",
            Some(json!({ "using": "css selector", "value": css })),
        );
        found
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT].as_str())
                    .map(|s| Element(s.to_owned()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The first element matching `css`, waited for up to 10 s.
    pub(crate) fn find(&self, css: &str) -> Element {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(e) = self.all(css).into_iter().next() {
                return e;
            }
            assert!(
                Instant::now() < deadline,
                "no element {css} on {}",
                self.url()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(crate) fn click(&self, e: &Element) {
        self.ok("POST", &format!("/element/{}/click", e.0), None);
    }

    /// Clicks the first element matching `css`, found again if a live update replaced the
    /// one found between the find and the click (a "stale element reference").
    pub(crate) fn click_on(&self, css: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let e = self.find(css);
            match self.try_ok("POST", &format!("/element/{}/click", e.0), None) {
                Ok(_) => return,
                Err(error) if error.starts_with("stale element reference") => {
                    assert!(Instant::now() < deadline, "{css} kept going stale");
                }
                Err(error) => panic!("WebDriver click on {css}: {error}"),
            }
        }
    }

    pub(crate) fn type_into(&self, e: &Element, text: &str) {
        self.ok("POST", &format!("/element/{}/clear", e.0), None);
        self.ok(
            "POST",
            &format!("/element/{}/value", e.0),
            Some(json!({ "text": text })),
        );
    }

    pub(crate) fn text(&self, e: &Element) -> String {
        self.ok("GET", &format!("/element/{}/text", e.0), None)
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    pub(crate) fn attr(&self, e: &Element, name: &str) -> Option<String> {
        self.ok("GET", &format!("/element/{}/attribute/{name}", e.0), None)
            .as_str()
            .map(str::to_owned)
    }

    /// Runs `script` (a function body; `arguments` are `args`) and answers its result.
    pub(crate) fn exec(&self, script: &str, args: Value) -> Value {
        self.ok(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
    }

    /// Waits up to `secs` for `check` to hold, saying `what` if it never does.
    pub(crate) fn wait(&self, secs: u64, what: &str, mut check: impl FnMut(&Browser) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !check(self) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} on {}",
                self.url()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The page's text.
    pub(crate) fn page_text(&self) -> String {
        self.exec("return document.body.innerText;", json!([]))
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    pub(crate) fn screenshot(&self, path: &std::path::Path) {
        use std::io::Write;
        let data = self.ok("GET", "/screenshot", None);
        use base64::Engine as _;
        let png = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().unwrap_or(""))
            .expect("a base64 screenshot");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::File::create(path)
            .unwrap()
            .write_all(&png)
            .unwrap();
    }

    pub(crate) fn cookies(&self) -> Vec<Value> {
        self.ok("GET", "/cookie", None)
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The browser console's entries since the last call (chromedriver's log endpoint).
    pub(crate) fn console(&self) -> Vec<Value> {
        self.ok("POST", "/se/log", Some(json!({ "type": "browser" })))
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Fails on any console error logged since the last look (a script error, a failed
    /// request, a CSP violation).
    pub(crate) fn assert_no_console_errors(&self, page: &str) {
        let errors: Vec<Value> = self
            .console()
            .into_iter()
            .filter(|e| e["level"] == "SEVERE")
            .collect();
        assert!(errors.is_empty(), "console errors on {page}: {errors:#?}");
    }
}

fn post(agent: &ureq::Agent, url: &str, body: &Value) -> Value {
    read(
        agent
            .post(url)
            .content_type("application/json")
            .send(body.to_string().as_str()),
    )
}

fn read(answer: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Value {
    let mut answer = answer.expect("chromedriver answers");
    let text = answer.body_mut().read_to_string().unwrap_or_default();
    serde_json::from_str(&text).unwrap_or(Value::Null)
}
