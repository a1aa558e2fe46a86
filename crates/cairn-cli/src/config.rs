//! `cairn serve --config cairn.toml`: one file for everything a flag or an environment
//! variable sets, and the server's named tokens with their scopes. A flag wins over its
//! environment variable, which wins over the file, which wins over the default. The file
//! is checked whole at start (`cairn config check FILE` checks it without starting), and
//! an error names the file, the line and the key. While the server runs, its tokens are
//! read again whenever the file changes: rotating a token is adding the new one and
//! removing the old one from the file, without a restart.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// The file's keys, named like `cairn serve`'s flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct File {
    pub(crate) addr: Option<SocketAddr>,
    pub(crate) db: Option<String>,
    #[serde(default, deserialize_with = "log_format")]
    pub(crate) log_format: Option<crate::logging::LogFormat>,
    pub(crate) otlp_endpoint: Option<String>,
    pub(crate) account_id: Option<String>,
    pub(crate) cloudflare_any_account: Option<bool>,
    pub(crate) no_schedules: Option<bool>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) lease_ttl: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    pub(crate) min_schedule_interval: Option<Duration>,
    pub(crate) tls_cert: Option<PathBuf>,
    pub(crate) tls_key: Option<PathBuf>,
    pub(crate) insecure_plain_http: Option<bool>,
    #[serde(default)]
    pub(crate) trusted_proxies: Vec<std::net::IpAddr>,
    #[serde(default)]
    tokens: Vec<TokenEntry>,
}

/// One `[[tokens]]` table (its Debug leaves the token out).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: toml::Spanned<String>,
    token: Option<String>,
    token_sha256: Option<String>,
    #[serde(deserialize_with = "scope")]
    scope: cairn_server::Scope,
}

impl std::fmt::Debug for TokenEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenEntry")
            .field("name", self.name.get_ref())
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// A configuration file that was read and checked.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub(crate) path: PathBuf,
    pub(crate) file: File,
    pub(crate) tokens: Vec<cairn_server::Token>,
    /// The bytes it was read from (what a later change is compared with).
    pub(crate) bytes: Vec<u8>,
}

/// Reads and checks the file at `path`.
///
/// # Errors
/// A message naming the file, and the line and key where one is at fault.
pub(crate) fn load(path: &Path) -> Result<Loaded, String> {
    let bytes = std::fs::read(path)
        .map_err(|e| format!("read the configuration {}: {e}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{}: the configuration is not UTF-8", path.display()))?;
    let mut loaded = parse(path, &text)?;
    loaded.bytes = text.into_bytes();
    Ok(loaded)
}

fn parse(path: &Path, text: &str) -> Result<Loaded, String> {
    let shown = path.display();
    let file: File = toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        match line {
            Some(line) => format!("{shown}:{line}: {}", e.message()),
            None => format!("{shown}: {}", e.message()),
        }
    })?;
    if file.tls_cert.is_some() != file.tls_key.is_some() {
        let key = if file.tls_cert.is_some() {
            "tls_cert"
        } else {
            "tls_key"
        };
        let line = text
            .lines()
            .position(|l| l.trim_start().starts_with(key))
            .map_or(1, |i| i + 1);
        return Err(format!(
            "{shown}:{line}: {key}: tls_cert and tls_key go together: give both or neither"
        ));
    }
    let mut tokens = Vec::with_capacity(file.tokens.len());
    for entry in &file.tokens {
        let line = line_of(text, entry.name.span().start);
        let name = entry.name.get_ref();
        let at = |message: String| format!("{shown}:{line}: tokens: {message}");
        if name.trim().is_empty() || name.chars().any(char::is_control) {
            return Err(at("name must be a non-empty word, e.g. \"ci\"".into()));
        }
        if tokens
            .iter()
            .any(|t: &cairn_server::Token| t.name() == name)
        {
            return Err(at(format!("name {name:?} is used twice")));
        }
        let token = match (&entry.token, &entry.token_sha256) {
            (Some(value), None) if value.trim().chars().any(char::is_control) => {
                return Err(at(format!(
                    "token of {name:?} has a control character inside (a newline?): no request could send it"
                )));
            }
            (Some(value), None) => cairn_server::Token::new(name.as_str(), value, entry.scope)
                .ok_or_else(|| at(format!("token of {name:?} is empty")))?,
            (None, Some(hex)) => cairn_server::Token::from_sha256(name.as_str(), hex, entry.scope)
                .map_err(|e| at(format!("{name:?}: {e}")))?,
            _ => {
                return Err(at(format!(
                    "{name:?} needs exactly one of token and token_sha256"
                )));
            }
        };
        tokens.push(token);
    }
    Ok(Loaded {
        path: path.to_owned(),
        file,
        tokens,
        bytes: Vec::new(),
    })
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(1, |before| before.matches('\n').count() + 1)
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    crate::parse_lease_ttl(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn log_format<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<crate::logging::LogFormat>, D::Error> {
    let text = String::deserialize(d)?;
    <crate::logging::LogFormat as clap::ValueEnum>::from_str(&text, false)
        .map(Some)
        .map_err(|_| serde::de::Error::custom(format!("{text:?} is not text or json")))
}

fn scope<'de, D: Deserializer<'de>>(d: D) -> Result<cairn_server::Scope, D::Error> {
    String::deserialize(d)?
        .parse()
        .map_err(serde::de::Error::custom)
}

/// Reads the file's tokens again whenever it changes (checked every `every`) and gives
/// them, with `fixed` (the `--token` flag's), to `tokens`. `started` is what the server
/// started from. A change counts once two looks in a row see the same bytes (an editor
/// that writes in place is not caught half way); a file that no longer checks keeps the
/// tokens in force and says why.
pub(crate) fn watch(
    path: PathBuf,
    started: Vec<u8>,
    tokens: cairn_server::Tokens,
    fixed: Vec<cairn_server::Token>,
    every: Duration,
) {
    tokio::spawn(async move {
        let mut last = Some(started);
        let mut pending = None;
        loop {
            tokio::time::sleep(every).await;
            let now = std::fs::read(&path).ok();
            if now == last {
                pending = None;
                continue;
            }
            if pending.as_ref() != Some(&now) {
                pending = Some(now);
                continue;
            }
            pending = None;
            last = now;
            match load(&path) {
                Ok(loaded) => {
                    let mut all = loaded.tokens;
                    all.extend(fixed.iter().cloned());
                    let names: Vec<String> = all
                        .iter()
                        .map(|t| format!("{} ({})", t.name(), t.scope()))
                        .collect();
                    tokens.replace(all);
                    tracing::info!(
                        file = %path.display(),
                        tokens = %names.join(", "),
                        "tokens read again: the file changed"
                    );
                }
                Err(e) => tracing::warn!(
                    file = %path.display(),
                    error = %e,
                    "the configuration changed but does not check; the tokens in force stay"
                ),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<Loaded, String> {
        parse(Path::new("cairn.toml"), text)
    }

    #[test]
    fn a_complete_file_sets_every_key() {
        let loaded = parsed(
            r#"
addr = "0.0.0.0:8787"
db = "data/cairn.db"
log_format = "json"
otlp_endpoint = "http://127.0.0.1:4318"
account_id = "acct"
cloudflare_any_account = false
no_schedules = true
lease_ttl = "45 seconds"
min_schedule_interval = "5 minutes"
tls_cert = "/etc/cairn/cert.pem"
tls_key = "/etc/cairn/key.pem"
insecure_plain_http = false
trusted_proxies = ["10.0.0.2"]

[[tokens]]
name = "ci"
token = "s3cret"
scope = "operate"

[[tokens]]
name = "ops"
token_sha256 = "f52fbd32b2b3b86ff88ef6c490628285f482af15ddcb29541f94bcf526a3f6c7"
scope = "admin"
"#,
        )
        .unwrap();
        let f = &loaded.file;
        assert_eq!(f.addr, Some("0.0.0.0:8787".parse().unwrap()));
        assert_eq!(f.db.as_deref(), Some("data/cairn.db"));
        assert!(matches!(
            f.log_format,
            Some(crate::logging::LogFormat::Json)
        ));
        assert_eq!(f.lease_ttl, Some(Duration::from_secs(45)));
        assert_eq!(f.min_schedule_interval, Some(Duration::from_secs(300)));
        assert_eq!(f.no_schedules, Some(true));
        assert_eq!(f.tls_key.as_deref(), Some(Path::new("/etc/cairn/key.pem")));
        assert_eq!(f.insecure_plain_http, Some(false));
        assert_eq!(
            f.trusted_proxies,
            ["10.0.0.2".parse::<std::net::IpAddr>().unwrap()]
        );
        let names: Vec<_> = loaded
            .tokens
            .iter()
            .map(|t| (t.name(), t.scope()))
            .collect();
        assert_eq!(
            names,
            [
                ("ci", cairn_server::Scope::Operate),
                ("ops", cairn_server::Scope::Admin)
            ]
        );
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_key() {
        let cases = [
            ("addr = \"x\"\n", "cairn.toml:1:", "socket address"),
            ("db = \"a.db\"\nadr = \"1\"\n", "cairn.toml:2:", "adr"),
            ("\n\nlease_ttl = \"soon\"\n", "cairn.toml:3:", "soon"),
            ("log_format = \"xml\"\n", "cairn.toml:1:", "xml"),
            (
                "[[tokens]]\nname = \"ci\"\ntoken = \"t\"\nscope = \"root\"\n",
                "cairn.toml:4:",
                "read, operate or admin",
            ),
            (
                "\n[[tokens]]\nname = \"ci\"\nscope = \"read\"\n",
                "cairn.toml:3:",
                "exactly one of token and token_sha256",
            ),
            (
                "[[tokens]]\nname = \"a\"\ntoken = \"x\"\nscope = \"read\"\n[[tokens]]\nname = \"a\"\ntoken = \"y\"\nscope = \"read\"\n",
                "cairn.toml:6:",
                "used twice",
            ),
            (
                "[[tokens]]\nname = \"a\"\ntoken = \"  \"\nscope = \"read\"\n",
                "cairn.toml:2:",
                "empty",
            ),
            (
                "[[tokens]]\nname = \"a\"\ntoken = \"ab\\ncd\"\nscope = \"read\"\n",
                "cairn.toml:2:",
                "control character",
            ),
            (
                "[[tokens]]\nname = \"a\"\ntoken_sha256 = \"abc\"\nscope = \"read\"\n",
                "cairn.toml:2:",
                "64 hex digits",
            ),
            ("x = [\n", "cairn.toml:", ""),
            (
                "db = \"x\"\ntls_cert = \"c.pem\"\n",
                "cairn.toml:2: tls_cert",
                "give both",
            ),
        ];
        for (text, at, says) in cases {
            let e = parsed(text).unwrap_err();
            assert!(e.starts_with(at), "{text:?}: {e}");
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }
}
