//! `cairn`: run Cairn's engine with its HTTP API on embedded SQLite (or PostgreSQL), and talk to it.
//!
//! `cairn serve [--db cairn.db | --db postgres://…] [--addr 127.0.0.1:8787] [--token T]` starts the engine with
//! the demo workflows registered (see `demo.rs`) and serves the API until Ctrl-C or SIGTERM
//! (a second one exits at once). The `workflows …` and `instances …` commands mirror
//! `wrangler workflows …`.

/// `println!` that ends the process quietly when stdout is closed (`cairn … | head`)
/// instead of panicking on the broken pipe.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            std::process::exit(0);
        }
    }};
}

mod client;
mod config;
mod demo;
mod logging;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use logging::LogFormat;
use serde_json::{Value, json};

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "Durable execution for Rust: the Cairn server and its client"
)]
struct Cli {
    /// Bearer token: required by `serve` for every request, sent by the client commands.
    #[arg(long, global = true, env = "CAIRN_TOKEN")]
    token: Option<String>,
    /// `--url` before the command group, as earlier versions took it (hidden).
    #[arg(long = "url", id = "top_url", hide = true)]
    top_url: Option<String>,
    /// `--json` before the command group, as earlier versions took it (hidden).
    #[arg(long = "json", id = "top_json", hide = true)]
    top_json: bool,
    #[command(subcommand)]
    command: Command,
}

/// Where `cairn serve` listens when neither `--addr` nor its configuration file says.
const DEFAULT_ADDR: &str = "127.0.0.1:8787";

/// Where the client commands go when neither `--url` nor `CAIRN_URL` says.
const DEFAULT_URL: &str = "http://127.0.0.1:8787";

/// The options of the client commands (not of `serve`, whose help lists only its own).
#[derive(clap::Args)]
struct ClientArgs {
    /// The server to talk to [default: http://127.0.0.1:8787].
    #[arg(long, global = true, env = "CAIRN_URL")]
    url: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Trust the certificate authority in this PEM file for an `https://` server (one
    /// whose certificate a private CA signed); the public roots are trusted without it.
    #[arg(long, global = true, env = "CAIRN_CA_CERT", value_name = "FILE")]
    ca_cert: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the engine with the demo workflows, and serve the HTTP API.
    Serve {
        /// The database: a SQLite file (created if missing), or a PostgreSQL URL
        /// (`postgres://user:password@host:port/database`), which several `cairn serve`
        /// processes may share.
        #[arg(long, default_value = "cairn.db")]
        db: String,
        /// Where to listen. A non-loopback address requires a token.
        #[arg(long, default_value = DEFAULT_ADDR)]
        addr: SocketAddr,
        /// The log lines on stderr: `text` or `json` (one object per line). Their level
        /// comes from RUST_LOG (default `info`; e.g. `RUST_LOG=cairn=debug`).
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
        /// Export the engine's spans (`workflow.run`, `step.do`, …) to this OpenTelemetry
        /// collector over OTLP/HTTP, e.g. `http://127.0.0.1:4318` (`/v1/traces` is added).
        /// Needs a build with the `otel` feature, which also reads
        /// OTEL_EXPORTER_OTLP_ENDPOINT when the flag is not given.
        #[arg(long)]
        otlp_endpoint: Option<String>,
        /// The account id Cloudflare's routes (`/client/v4/accounts/ID/workflows`, for
        /// wrangler and Cloudflare's SDKs) accept; any when not set.
        #[arg(long, env = "CAIRN_ACCOUNT_ID")]
        account_id: Option<String>,
        /// Without --account-id, let Cloudflare's destructive routes (`wrangler workflows
        /// delete`, `instances terminate-all`) act for any account id. By default they need
        /// the account id configured, so a client pointed here by mistake cannot wipe it.
        #[arg(long, env = "CAIRN_CLOUDFLARE_ANY_ACCOUNT")]
        cloudflare_any_account: bool,
        /// Do not run the demo schedule (`greet-hourly`); the workflows stay registered.
        /// For tests that count instances, and quiet demos.
        #[arg(long)]
        no_schedules: bool,
        /// How long a claim holds an instance without renewal on PostgreSQL (default
        /// `30 seconds`; renewed every third of it): an engine that dies or stalls gives its
        /// instances up this long after its last renewal. SQLite's leases never expire.
        #[arg(long, env = "CAIRN_LEASE_TTL", value_name = "DURATION", value_parser = parse_lease_ttl)]
        lease_ttl: Option<std::time::Duration>,
        /// The shortest time between two ticks a schedule may have (default `1 minute`):
        /// schedules created over the API that would fire more often are refused.
        #[arg(long, env = "CAIRN_MIN_SCHEDULE_INTERVAL", value_name = "DURATION", value_parser = parse_interval)]
        min_schedule_interval: Option<std::time::Duration>,
        /// Serve HTTPS (HTTP/2 and HTTP/1.1) with this certificate chain (PEM), read again
        /// when the file changes. Needs --tls-key.
        #[arg(
            long,
            env = "CAIRN_TLS_CERT",
            value_name = "FILE",
            requires = "tls_key"
        )]
        tls_cert: Option<PathBuf>,
        /// The private key of --tls-cert (PEM).
        #[arg(
            long,
            env = "CAIRN_TLS_KEY",
            value_name = "FILE",
            requires = "tls_cert"
        )]
        tls_key: Option<PathBuf>,
        /// Serve plain HTTP on a non-loopback address (behind a proxy that terminates
        /// TLS). Without it, such an address needs --tls-cert and --tls-key.
        #[arg(long, env = "CAIRN_INSECURE_PLAIN_HTTP")]
        insecure_plain_http: bool,
        /// The address of a reverse proxy in front of the server (repeat for several):
        /// from it, `X-Forwarded-For` names the client (whom the login's throttle and the
        /// cap on a client's live streams count) and `X-Forwarded-Proto: https` makes the
        /// session cookie `Secure`.
        #[arg(long = "trusted-proxy", value_name = "IP")]
        trusted_proxies: Vec<std::net::IpAddr>,
        /// A configuration file (TOML): keys named like these flags (`addr`, `db`,
        /// `log_format`, …) and the server's tokens as `[[tokens]]` tables (`name`, `token`
        /// or `token_sha256`, `scope` = read, operate or admin). A flag or its environment
        /// variable wins over the file. The tokens are read again when the file changes.
        #[arg(long, env = "CAIRN_CONFIG", value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Check a configuration file for `cairn serve --config` without starting anything.
    #[command(after_help = "Example:\n  cairn config check cairn.toml")]
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Copy a SQLite database while `cairn serve` runs on it: a consistent copy as of one
    /// commit (SQLite's online backup API), checked before it is kept. Restore by
    /// starting `cairn serve --db` on the copy (docs/operating.md).
    #[command(after_help = "Example:\n  cairn backup --db cairn.db backups/cairn-2026-12-01.db")]
    Backup {
        /// The live database (a SQLite file; for PostgreSQL use pg_dump or PITR).
        #[arg(long, default_value = "cairn.db")]
        db: PathBuf,
        /// The new file to write (never overwritten).
        out: PathBuf,
    },
    /// Replay every unfinished instance against the code of this build (the demo
    /// workflows) without running or writing anything, and report where the code no longer
    /// fits an instance's journal. Exit 1 on any incompatibility, 2 when the check cannot
    /// run: a gate before a deploy. It neither migrates nor recovers the database (one of
    /// another schema version is refused); no server may have the SQLite file open.
    #[command(after_help = "Example:\n  cairn replay-check --db cairn.db")]
    ReplayCheck {
        /// The database: a SQLite file, or a PostgreSQL URL.
        #[arg(long, default_value = "cairn.db")]
        db: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Workflows: list, describe, trigger.
    Workflows {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: WorkflowsCommand,
    },
    /// Instances: list, describe, send-event, pause, resume, terminate, restart, delete.
    Instances {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: InstancesCommand,
    },
    /// Cron schedules: list, create, pause, resume, trigger, delete.
    Schedules {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: SchedulesCommand,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Read and check FILE: exit 0 and a summary when `cairn serve --config FILE` would
    /// accept it, 1 and the line at fault otherwise.
    Check {
        /// The file to check.
        file: PathBuf,
        /// As `serve --insecure-plain-http` (or its environment variable), which the
        /// check takes into account with the file.
        #[arg(long, env = "CAIRN_INSECURE_PLAIN_HTTP")]
        insecure_plain_http: bool,
    },
}

#[derive(Subcommand)]
enum SchedulesCommand {
    /// Every schedule (declared in code or created here), with its last tick fired and its
    /// next one.
    List,
    /// Create a schedule for every engine on the store.
    #[command(
        after_help = "Examples:\n  cairn schedules create nightly --cron '30 2 * * *' --workflow report --time-zone Europe/Berlin\n  cairn schedules create ping --cron '*/5 * * * *' --workflow greet --params '{\"name\": \"ops\"}' --overlap allow"
    )]
    Create {
        /// Its name: 1-68 characters of a-z, A-Z, 0-9, '_' and '-'.
        name: String,
        /// The cron expression: 5 fields (minute hour day month weekday), or 6-7 with
        /// seconds first and a year last.
        #[arg(long)]
        cron: String,
        /// The workflow each tick starts.
        #[arg(long)]
        workflow: String,
        /// Each run's params, a JSON object (default {}).
        #[arg(long)]
        params: Option<String>,
        /// An IANA time zone (default UTC).
        #[arg(long)]
        time_zone: Option<String>,
        /// While the previous run is unfinished: allow, skip (default) or bufferOne.
        #[arg(long)]
        overlap: Option<String>,
        /// Ticks missed while no engine ran: skip, runOnce (default) or runAll:N.
        #[arg(long)]
        catch_up: Option<String>,
    },
    /// Pause a schedule: no tick fires until it is resumed (other engines on a shared
    /// store follow within 5 s).
    Pause {
        /// The schedule's name.
        name: String,
    },
    /// Resume a paused schedule from now on (the ticks it missed are not caught up).
    Resume {
        /// The schedule's name.
        name: String,
    },
    /// Delete a schedule created over the API (its runs are kept).
    Delete {
        /// The schedule's name.
        name: String,
        /// Forget the stored state (paused, last tick) of a schedule once declared in code
        /// that no server declares any more, which a delete refuses as declared in code.
        #[arg(long)]
        forget: bool,
    },
    /// Start a run of a schedule now, outside its ticks.
    #[command(after_help = "Example:\n  cairn schedules trigger greet-hourly")]
    Trigger {
        /// The schedule's name (`cairn schedules list` shows them).
        name: String,
    },
}

#[derive(Subcommand)]
enum WorkflowsCommand {
    /// The registered workflows.
    List,
    /// A workflow's instance counts by status.
    Describe {
        /// The workflow's name (`cairn workflows list` shows them).
        name: String,
    },
    /// Create an instance.
    #[command(
        after_help = "Examples:\n  cairn workflows trigger approval '{\"amount\": 42}' --id req-1\n  cairn workflows trigger greet"
    )]
    Trigger {
        /// The workflow's name (`cairn workflows list` shows them).
        name: String,
        /// Params as JSON (default `{}`).
        params: Option<String>,
        /// The instance id (generated when omitted).
        #[arg(long)]
        id: Option<String>,
        /// Run it under this concurrency key (the workflow must have a limit).
        #[arg(long)]
        key: Option<String>,
        /// Its priority among the instances waiting for a slot of the key (default 0).
        #[arg(long, allow_negative_numbers = true)]
        priority: Option<i32>,
        /// Wait until the instance has finished and print its status and output; with a
        /// duration (`--wait=5m`), for at most that long. Exit code: 0 complete, 2 still
        /// running when the wait ran out, 3 errored or terminated.
        #[arg(
            long,
            value_name = "DURATION",
            num_args = 0..=1,
            require_equals = true,
            default_missing_value = BARE_WAIT
        )]
        wait: Option<String>,
    },
    /// `cairn instances`, under wrangler's path (`wrangler workflows instances list …`).
    #[command(hide = true)]
    Instances {
        #[command(subcommand)]
        command: InstancesCommand,
    },
}

#[derive(Subcommand)]
enum InstancesCommand {
    /// A workflow's instances, newest first.
    #[command(
        after_help = "Examples:\n  cairn instances list approval\n  cairn instances list --status errored --all\n  cairn instances list approval --status waiting --limit 5 --json\n  cairn instances list checkout --status errored,terminated --id-prefix order- --created-from 2026-12-01T00:00:00Z"
    )]
    List {
        /// The workflow's name (`cairn workflows list` shows them); every workflow's when
        /// omitted.
        name: Option<String>,
        /// Only instances in these statuses (comma-separated): queued, running, paused,
        /// errored, terminated, complete, waitingForPause or waiting.
        #[arg(long, value_delimiter = ',')]
        status: Vec<String>,
        /// Only instances whose id starts with this.
        #[arg(long)]
        id_prefix: Option<String>,
        /// Only instances created at or after this time (RFC 3339).
        #[arg(long)]
        created_from: Option<String>,
        /// Only instances created before this time (RFC 3339).
        #[arg(long)]
        created_before: Option<String>,
        /// How many instances, at most (1 to 1000); with --all, per page. (Also
        /// --per-page, as wrangler names it.)
        #[arg(long, alias = "per-page", default_value_t = 20)]
        limit: usize,
        /// Go on after this cursor (a listing with more prints the next one).
        #[arg(long)]
        cursor: Option<String>,
        /// Every matching instance, page after page.
        #[arg(long)]
        all: bool,
    },
    /// An instance's status and step timeline.
    #[command(
        after_help = "Examples:\n  cairn instances describe approval req-1\n  cairn instances describe approval latest --watch"
    )]
    Describe {
        /// The workflow's name (`cairn workflows list` shows them).
        name: String,
        /// The instance id (`latest`: the newest instance of the workflow).
        #[arg(default_value = "latest")]
        id: String,
        /// Show outputs whole instead of cut at 60 characters.
        #[arg(long)]
        full_output: bool,
        /// Follow the instance's event log live until it finishes. With --json, one JSON
        /// document per line (NDJSON): the details, then each event.
        #[arg(long)]
        watch: bool,
    },
    /// One step's whole output on stdout (`describe` cuts long ones): the JSON it is stored
    /// as, or a stream step's bytes. Redirect it to a file.
    #[command(
        after_help = "Examples:\n  cairn instances output export job-7 --step \"build report\" > report.json\n  cairn instances output crawl latest --step fetch --count 3"
    )]
    Output {
        /// The workflow's name (`cairn workflows list` shows them).
        name: String,
        /// The instance id (`latest`: the newest instance of the workflow).
        id: String,
        /// The step's name.
        #[arg(long)]
        step: String,
        /// Which occurrence of the name (default 1).
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// Its kind: step, sleep, waitForEvent or invoke (default step).
        #[arg(long = "type", default_value = "step")]
        kind: String,
        /// Only the output of this attempt.
        #[arg(long)]
        attempt: Option<u32>,
    },
    /// Send an event to an instance.
    #[command(
        after_help = "Example:\n  cairn instances send-event approval req-1 --type approved --payload '{\"by\": \"ada\"}'"
    )]
    SendEvent {
        /// The workflow's name (`cairn workflows list` shows them).
        name: String,
        /// The instance id (`latest`: the newest instance of the workflow).
        id: String,
        /// The event type, as the workflow's `wait_for_event` names it.
        #[arg(long = "type")]
        event_type: String,
        /// The payload as JSON (default `{}`).
        #[arg(long)]
        payload: Option<String>,
    },
    /// Pause an instance.
    Pause {
        /// The workflow's name (`cairn workflows list` shows them).
        name: String,
        /// The instance id (`latest`: the newest instance of the workflow).
        id: String,
    },
    /// Resume an instance.
    Resume {
        /// The workflow's name (`cairn workflows list` shows them).
        name: String,
        /// The instance id (`latest`: the newest instance of the workflow).
        id: String,
    },
    /// Terminate an instance.
    Terminate {
        /// The workflow's name (`cairn workflows list` shows them).
        name: String,
        /// The instance id (`latest`: the newest instance of the workflow).
        id: String,
        /// Run the rollback handlers first.
        #[arg(long)]
        rollback: bool,
    },
    /// Restart an instance, from scratch or from a step.
    #[command(
        after_help = "Examples:\n  cairn instances restart approval req-1\n  cairn instances restart approval req-1 --from-step-name charge --from-step-count 2"
    )]
    Restart {
        /// The workflow's name (`cairn workflows list` shows them).
        name: String,
        /// The instance id (`latest`: the newest instance of the workflow).
        id: String,
        /// Restart from the step with this name (and every step started after it).
        #[arg(long)]
        from_step_name: Option<String>,
        /// Which of the steps with that name: 1 for the first (default 1).
        #[arg(long)]
        from_step_count: Option<u32>,
        /// The step's type: step, sleep or waitForEvent (also do, run, wait_for_event).
        #[arg(long)]
        from_step_type: Option<String>,
    },
    /// Pause, resume, terminate, restart or delete every instance a filter matches (what
    /// the dashboard's bulk actions do), a thousand per request until done.
    #[command(
        after_help = "Examples:\n  cairn instances bulk terminate --workflow nap --status waiting --dry-run\n  cairn instances bulk terminate --workflow nap --status waiting,paused --yes\n  cairn instances bulk delete --id-prefix test- --created-before 2026-01-31T00:00:00Z --yes"
    )]
    Bulk {
        /// pause, resume, terminate, restart or delete.
        action: String,
        /// Only this workflow's instances (every workflow's without it).
        #[arg(long)]
        workflow: Option<String>,
        /// Only instances in these statuses (comma-separated, or the option repeated).
        #[arg(long, value_delimiter = ',')]
        status: Vec<String>,
        /// Only instances created at or after this time (RFC 3339, e.g. 2026-01-31T12:00:00Z).
        #[arg(long)]
        created_from: Option<String>,
        /// Only instances created before this time (RFC 3339).
        #[arg(long)]
        created_before: Option<String>,
        /// Only instances whose id starts with this.
        #[arg(long)]
        id_prefix: Option<String>,
        /// With terminate: run the rollback handlers first.
        #[arg(long)]
        rollback: bool,
        /// Only say how many instances match.
        #[arg(long)]
        dry_run: bool,
        /// Act without asking: without it (or --dry-run) the command only counts.
        #[arg(long)]
        yes: bool,
    },
    /// Delete instances.
    Delete {
        /// The workflow's name (`cairn workflows list` shows them).
        name: String,
        /// The ids of the instances to delete (up to 100).
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli =
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(e) = run(cli, &matches).await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// `--wait` given without a value (for ever): told apart from an explicit `--wait=forever`,
/// which leaves PARAMS alone.
const BARE_WAIT: &str = "";

/// `trigger`'s PARAMS and `--wait`, as meant. `--wait 5s` (a space, not `=`): clap reads
/// 5s as PARAMS; a duration that is not JSON after a bare `--wait` is the wait.
///
/// # Errors
/// `--wait 30`: a bare number after a bare `--wait` is a wait without its unit as likely
/// as params, and taken as params it would wait for ever.
fn params_and_wait(
    params: Option<String>,
    wait: Option<String>,
) -> Result<(Option<String>, Option<String>), String> {
    match (params, wait) {
        (Some(p), Some(w)) if w == BARE_WAIT => {
            match serde_json::from_str::<serde_json::Value>(&p) {
                Ok(serde_json::Value::Number(_)) => Err(format!(
                    "`--wait {p}` is ambiguous: a wait takes its unit after `=` (--wait={p}s); params that are a bare number take --wait=forever"
                )),
                Err(_) if humantime::parse_duration(&p).is_ok() => Ok((None, Some(p))),
                _ => Ok((Some(p), Some(w))),
            }
        }
        other => Ok(other),
    }
}

/// The client of a command's server (its `--url`, else the top-level one, else the
/// default), and whether to print JSON.
fn connect(
    args: ClientArgs,
    top_url: Option<String>,
    token: Option<String>,
    top_json: bool,
) -> Result<(client::Client, bool), String> {
    let url = args.url.or(top_url).unwrap_or_else(|| DEFAULT_URL.into());
    let client = client::Client::new(url, token, args.ca_cert.as_deref())?;
    Ok((client, args.json || top_json))
}

async fn run(cli: Cli, matches: &clap::ArgMatches) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Serve {
            db,
            addr,
            log_format,
            otlp_endpoint,
            account_id,
            cloudflare_any_account,
            no_schedules,
            lease_ttl,
            min_schedule_interval,
            tls_cert,
            tls_key,
            insecure_plain_http,
            trusted_proxies,
            config,
        } => {
            let loaded = config.as_deref().map(config::load).transpose()?;
            let file = loaded.as_ref().map(|l| &l.file);
            // A flag or its environment variable wins over the file; the file over the
            // default. (An optional flag not given is `None`, so `or` is that order.)
            let serve_matches = matches.subcommand_matches("serve");
            let given = |id: &str| {
                serve_matches
                    .and_then(|m| m.value_source(id))
                    .is_some_and(|s| s != clap::parser::ValueSource::DefaultValue)
            };
            let db = match file.and_then(|f| f.db.clone()) {
                Some(from_file) if !given("db") => from_file,
                _ => db,
            };
            let addr = match file.and_then(|f| f.addr) {
                Some(from_file) if !given("addr") => from_file,
                _ => addr,
            };
            let log_format = match file.and_then(|f| f.log_format) {
                Some(from_file) if !given("log_format") => from_file,
                _ => log_format,
            };
            let flag = |id: &str, value: bool, from_file: Option<bool>| match from_file {
                Some(from_file) if !given(id) => from_file,
                _ => value,
            };
            let cloudflare_any_account = flag(
                "cloudflare_any_account",
                cloudflare_any_account,
                file.and_then(|f| f.cloudflare_any_account),
            );
            let no_schedules = flag(
                "no_schedules",
                no_schedules,
                file.and_then(|f| f.no_schedules),
            );
            // The flag, then OTEL_EXPORTER_OTLP_ENDPOINT (read by `logging::install`), then
            // the file.
            let otlp_endpoint = otlp_endpoint.or_else(|| {
                std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT")
                    .is_none()
                    .then(|| file.and_then(|f| f.otlp_endpoint.clone()))
                    .flatten()
            });
            let account_id = account_id.or_else(|| file.and_then(|f| f.account_id.clone()));
            let insecure_plain_http = flag(
                "insecure_plain_http",
                insecure_plain_http,
                file.and_then(|f| f.insecure_plain_http),
            );
            // The pair comes from one place: both flags, or both keys of the file.
            let tls = match (tls_cert, tls_key) {
                (Some(cert), Some(key)) => Some((cert, key)),
                _ => file.and_then(|f| f.tls_cert.clone().zip(f.tls_key.clone())),
            };
            let _traces = logging::install(log_format, otlp_endpoint.as_deref())?;
            let settings = ServeSettings {
                tls,
                insecure_plain_http,
                lease_ttl: lease_ttl.or_else(|| file.and_then(|f| f.lease_ttl)),
                min_schedule_interval: min_schedule_interval
                    .or_else(|| file.and_then(|f| f.min_schedule_interval)),
                cloudflare_any_account,
                trusted_proxies: if trusted_proxies.is_empty() {
                    file.map(|f| f.trusted_proxies.clone()).unwrap_or_default()
                } else {
                    trusted_proxies
                },
            };
            serve(
                db,
                addr,
                Access {
                    token: token(cli.token)?,
                    config: loaded,
                },
                account_id,
                !no_schedules,
                settings,
            )
            .await
        }
        Command::Config {
            command:
                ConfigCommand::Check {
                    file,
                    insecure_plain_http,
                },
        } => {
            let loaded = config::load(&file)?;
            // What `serve --config FILE` would refuse, with the token and the plain-HTTP
            // switch the environment may give it (secrets are often kept out of files).
            let f = &loaded.file;
            let at = |e: String| format!("{}: {e}", file.display());
            logging::check(f.otlp_endpoint.as_deref()).map_err(at)?;
            let addr = match f.addr {
                Some(addr) => addr,
                None => DEFAULT_ADDR.parse()?,
            };
            let token = token(cli.token)?;
            check_serving(
                addr,
                token.is_some() || !loaded.tokens.is_empty(),
                f.tls_cert.clone().zip(f.tls_key.clone()).as_ref(),
                insecure_plain_http || f.insecure_plain_http.unwrap_or(false),
            )
            .map_err(at)?;
            let tokens: Vec<String> = loaded
                .tokens
                .iter()
                .map(|t| format!("{} ({})", t.name(), t.scope()))
                .collect();
            out!(
                "{}: ok; tokens: {}",
                file.display(),
                if tokens.is_empty() {
                    "none".to_owned()
                } else {
                    tokens.join(", ")
                }
            );
            Ok(())
        }
        Command::ReplayCheck { db, json } => replay_check(db, json).await,
        Command::Backup { db, out } => {
            let done = tokio::task::spawn_blocking(move || {
                cairn::sqlite::backup(&db, &out).map(|b| (b, out))
            })
            .await??;
            let (copied, out) = done;
            out!(
                "cairn: backed up {} pages ({} bytes) to {}; it passed SQLite's integrity check",
                copied.pages,
                copied.bytes,
                out.display()
            );
            Ok(())
        }
        Command::Workflows {
            client: args,
            command,
        } => {
            let (client, json) = connect(args, cli.top_url, token(cli.token)?, cli.top_json)?;
            tokio::task::spawn_blocking(move || workflows(&client, command, json)).await??;
            Ok(())
        }
        Command::Instances {
            client: args,
            command,
        } => {
            let (client, json) = connect(args, cli.top_url, token(cli.token)?, cli.top_json)?;
            tokio::task::spawn_blocking(move || instances(&client, command, json)).await??;
            Ok(())
        }
        Command::Schedules {
            client: args,
            command,
        } => {
            let (client, json) = connect(args, cli.top_url, token(cli.token)?, cli.top_json)?;
            tokio::task::spawn_blocking(move || schedules(&client, command, json)).await??;
            Ok(())
        }
    }
}

fn schedules(c: &client::Client, command: SchedulesCommand, json: bool) -> Result<(), String> {
    match command {
        SchedulesCommand::List => {
            let v = c.call("GET", "/api/schedules", None)?;
            print(json, &v, || {
                let table = rows(&v["schedules"], |s| {
                    vec![
                        client::text(&s["name"]),
                        client::text(&s["workflow"]),
                        format!(
                            "{} ({})",
                            client::text(&s["cron"]),
                            client::text(&s["timeZone"])
                        ),
                        client::text(&s["source"]),
                        if s["paused"] == true { "yes" } else { "no" }.to_owned(),
                        client::text(&s["lastTick"]),
                        client::text(&s["nextTick"]),
                    ]
                });
                client::table(
                    &[
                        "SCHEDULE",
                        "WORKFLOW",
                        "CRON",
                        "SOURCE",
                        "PAUSED",
                        "LAST TICK",
                        "NEXT TICK",
                    ],
                    &table,
                );
            });
        }
        SchedulesCommand::Create {
            name,
            cron,
            workflow,
            params,
            time_zone,
            overlap,
            catch_up,
        } => {
            let params = match params {
                Some(p) => client::parse_json("--params", &p)?,
                None => serde_json::json!({}),
            };
            let mut request = serde_json::json!({
                "name": name, "cron": cron, "workflow": workflow, "params": params,
            });
            for (key, value) in [
                ("timeZone", time_zone),
                ("overlap", overlap),
                ("catchUp", catch_up),
            ] {
                if let Some(value) = value {
                    request[key] = serde_json::json!(value);
                }
            }
            let v = c.call("POST", "/api/schedules", Some(&request))?;
            print(json, &v, || {
                out!(
                    "✅ Created schedule {} ({} {}), next tick {}",
                    client::text(&v["name"]),
                    client::text(&v["cron"]),
                    client::text(&v["timeZone"]),
                    client::text(&v["nextTick"])
                );
            });
        }
        SchedulesCommand::Pause { name } => pause_or_resume(c, &name, "pause", json)?,
        SchedulesCommand::Resume { name } => pause_or_resume(c, &name, "resume", json)?,
        SchedulesCommand::Delete { name, forget } => {
            let v = c.call(
                "DELETE",
                &format!(
                    "/api/schedules/{}{}",
                    client::seg(&name),
                    if forget { "?forget=true" } else { "" }
                ),
                None,
            )?;
            print(json, &v, || {
                out!("🗑️ Deleted schedule {}", client::text(&v["deleted"]));
            });
        }
        SchedulesCommand::Trigger { name } => {
            let v = c.call(
                "POST",
                &format!("/api/schedules/{}/trigger", client::seg(&name)),
                None,
            )?;
            print(json, &v, || {
                out!(
                    "🚀 Started {} instance {} (status: {})",
                    client::text(&v["workflow"]),
                    client::text(&v["id"]),
                    client::text(&v["status"])
                );
            });
        }
    }
    Ok(())
}

fn pause_or_resume(c: &client::Client, name: &str, verb: &str, json: bool) -> Result<(), String> {
    let v = c.call(
        "POST",
        &format!("/api/schedules/{}/{verb}", client::seg(name)),
        None,
    )?;
    print(json, &v, || {
        let state = if v["paused"] == true {
            "paused"
        } else {
            "ticking"
        };
        out!("Schedule {} is {state}", client::text(&v["name"]));
    });
    Ok(())
}

/// `cairn replay-check`: exit 0 when every unfinished instance fits the code, 1 when one
/// does not, 2 when the check could not run (so a script can tell a "no" from a failure;
/// decided before anything is printed, so a closed pipe cannot turn a "no" into a "yes").
async fn replay_check(db: String, json: bool) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::Write as _;
    let checked = async {
        if !is_postgres(&db) && !std::path::Path::new(&db).exists() {
            return Err(format!("no database at {db}").into());
        }
        let builder = builder_on(&db)?;
        demo::register(builder, false)
            .replay_check()
            .await
            .map_err(Box::<dyn std::error::Error>::from)
    };
    let report = match checked.await {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let code = i32::from(!report.compatible());
    let mut stdout = std::io::stdout().lock();
    if json {
        let _ = writeln!(stdout, "{}", serde_json::to_string_pretty(&report)?);
    } else {
        for found in &report.incompatible {
            let _ = writeln!(stdout, "✗ {}/{}", found.workflow, found.id);
            for problem in &found.problems {
                let _ = writeln!(stdout, "    {problem}");
            }
        }
        let _ = writeln!(
            stdout,
            "{} unfinished instance{} replayed; {} incompatible with this code",
            report.checked,
            if report.checked == 1 { "" } else { "s" },
            report.incompatible.len()
        );
    }
    let _ = stdout.flush();
    std::process::exit(code);
}

/// The database as the banner shows it: a path, or a URL without its password.
fn describe_db(db: &str) -> String {
    match db.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((user, host)) => {
                let user = user.split(':').next().unwrap_or(user);
                format!("{scheme}://{user}@{host}")
            }
            None => db.to_owned(),
        },
        None => db.to_owned(),
    }
}

/// Whether `--db` names a PostgreSQL database rather than a SQLite file.
/// An engine builder on `db`: a SQLite file, or a PostgreSQL URL (with the `postgres`
/// feature; without it a URL is refused with how to build one that takes it).
fn builder_on(db: &str) -> Result<cairn::EngineBuilder, String> {
    if is_postgres(db) {
        #[cfg(feature = "postgres")]
        return Ok(cairn::Engine::builder().postgres(db.to_owned()));
        #[cfg(not(feature = "postgres"))]
        return Err(format!(
            "{} is a PostgreSQL database, and this cairn was built without PostgreSQL: build it with `--features postgres` (cargo install --path crates/cairn-cli --features postgres)",
            describe_db(db)
        ));
    }
    Ok(cairn::Engine::builder().sqlite(PathBuf::from(db)))
}

fn is_postgres(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

/// The token given (`--token`, `CAIRN_TOKEN`), unless it is empty or blank: such a token
/// is no token (it would open everything to anyone who sends nothing).
///
/// Surrounding whitespace is dropped (a token written with `echo` ends in a newline), as an
/// HTTP header drops it: the server's token and the one a client sends stay the same.
///
/// # Errors
/// A token with a control character inside: no HTTP header can carry it, so no request
/// could ever match it.
fn token(given: Option<String>) -> Result<Option<String>, String> {
    match given.as_deref().map(str::trim) {
        Some("") => {
            eprintln!("cairn: ignoring an empty token (--token or CAIRN_TOKEN): no token is set");
            Ok(None)
        }
        Some(t) if t.chars().any(char::is_control) => Err(
            "the token (--token or CAIRN_TOKEN) has a control character inside (a newline?): no request could send it".into(),
        ),
        Some(t) => Ok(Some(t.to_owned())),
        None => Ok(None),
    }
}

/// The engine's settings `cairn serve` passes on, when given, and how it serves.
struct ServeSettings {
    /// The certificate chain and key to serve HTTPS with.
    tls: Option<(PathBuf, PathBuf)>,
    /// Plain HTTP on a non-loopback address.
    insecure_plain_http: bool,
    lease_ttl: Option<std::time::Duration>,
    min_schedule_interval: Option<std::time::Duration>,
    cloudflare_any_account: bool,
    /// The reverse proxies in front of the server (`Limits::trusted_proxies`).
    trusted_proxies: Vec<std::net::IpAddr>,
}

/// What `cairn serve` refuses before it opens anything (`config check` too): a public
/// address without a token or, unless a proxy does TLS, without TLS; a certificate and key
/// that do not load (read here, before the address and the database: a wrong path fails
/// at once).
fn check_serving(
    addr: SocketAddr,
    tokens: bool,
    tls: Option<&(PathBuf, PathBuf)>,
    insecure_plain_http: bool,
) -> Result<Option<cairn_server::Tls>, String> {
    if !addr.ip().is_loopback() && !tokens {
        return Err(format!(
            "refusing to serve on {addr} without a token: pass --token (or CAIRN_TOKEN), give [[tokens]] in --config, or bind a loopback address"
        ));
    }
    if !addr.ip().is_loopback() && tls.is_none() && !insecure_plain_http {
        return Err(format!(
            "refusing to serve plain HTTP on {addr}: tokens would cross the network in clear. Pass --tls-cert and --tls-key, or --insecure-plain-http behind a proxy that terminates TLS"
        ));
    }
    match tls {
        Some((cert, key)) => cairn_server::Tls::from_files(cert, key)
            .map(Some)
            .map_err(|e| e.to_string()),
        None => Ok(None),
    }
}

impl ServeSettings {
    fn apply(&self, builder: cairn::EngineBuilder, postgres: bool) -> cairn::EngineBuilder {
        let builder = match self.lease_ttl {
            Some(ttl) if postgres => builder.lease_ttl(ttl),
            _ => builder,
        };
        match self.min_schedule_interval {
            Some(interval) => builder.min_schedule_interval(interval),
            None => builder,
        }
    }
}

/// A schedule interval: a duration in Cloudflare's grammar, at least a second.
fn parse_interval(text: &str) -> Result<std::time::Duration, String> {
    parse_lease_ttl(text)
}

/// A lease TTL: a duration in Cloudflare's grammar (`30 seconds`, `2 minutes`) or in
/// milliseconds, at least a second.
fn parse_lease_ttl(text: &str) -> Result<std::time::Duration, String> {
    let ttl = cairn::parse_duration(text).map_err(|e| e.to_string())?;
    if ttl < std::time::Duration::from_secs(1) {
        return Err(format!("{text:?} is shorter than a second"));
    }
    Ok(ttl)
}

/// Who may use the server: the `--token` flag's token (named `default`, scope `admin`) and
/// the configuration file's tokens, with the file to read them again from.
struct Access {
    token: Option<String>,
    config: Option<config::Loaded>,
}

/// The configuration file to watch for changes of the tokens: its path, the bytes the
/// server started from, and the tokens that do not come from it (the flag's).
type Watch = (PathBuf, Vec<u8>, Vec<cairn_server::Token>);

impl Access {
    /// Every token, and the file to watch for changes of them.
    ///
    /// # Errors
    /// A token in the file named `default` while `--token` gives one (whose name that is).
    fn tokens(self) -> Result<(Option<cairn_server::Tokens>, Option<Watch>), String> {
        let fixed: Vec<cairn_server::Token> = self
            .token
            .as_deref()
            .and_then(|t| cairn_server::Token::new("default", t, cairn_server::Scope::Admin))
            .into_iter()
            .collect();
        let mut all = fixed.clone();
        let mut watch = None;
        if let Some(loaded) = self.config {
            if !fixed.is_empty() && loaded.tokens.iter().any(|t| t.name() == "default") {
                return Err(format!(
                    "{}: a token is named \"default\", the name of the one --token (or CAIRN_TOKEN) gives: rename it",
                    loaded.path.display()
                ));
            }
            all.splice(0..0, loaded.tokens);
            watch = Some((loaded.path, loaded.bytes, fixed));
        }
        if all.is_empty() {
            return Ok((None, None));
        }
        Ok((Some(cairn_server::Tokens::new(all)), watch))
    }
}

async fn serve(
    db: String,
    addr: SocketAddr,
    access: Access,
    account_id: Option<String>,
    schedules: bool,
    settings: ServeSettings,
) -> Result<(), Box<dyn std::error::Error>> {
    let (tokens, watch) = access.tokens()?;
    let tls = check_serving(
        addr,
        tokens.is_some(),
        settings.tls.as_ref(),
        settings.insecure_plain_http,
    )?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    // The address first: a busy port must not create or open the database (and take over
    // its leases) only to fail afterwards.
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("listen on {addr}: {e}"))?;
    // As many descriptors as the system allows (the common soft limit of 1,024 would not
    // hold 1,000 live streams), and the caps on connections and streams sized from them.
    let fds = cairn_server::raise_fd_limit();
    let limits = cairn_server::Limits::default().trusted_proxies(settings.trusted_proxies.clone());
    tracing::info!(
        file_descriptors = fds,
        max_connections = limits.max_connections,
        max_streams = limits.max_streams,
        "connection limits"
    );
    // Before the engine starts, so the engine's metric descriptions reach the recorder.
    let metrics = cairn_server::Metrics::install()?;
    let builder = builder_on(&db)?;
    let builder = settings.apply(builder, is_postgres(&db));
    let shown = describe_db(&db);
    let engine = demo::register(builder, schedules)
        .start()
        .await
        .map_err(|e| format!("start the engine on {shown}: {e}"))?;
    let known = engine.workflow_names();
    let names: Vec<&str> = known.iter().map(|n| n.as_str()).collect();
    tracing::info!(
        backend = if is_postgres(&db) { "postgres" } else { "sqlite" },
        database = %shown,
        address = %addr,
        token_required = tokens.is_some(),
        tokens = %tokens.as_ref().map(|t| t.list().iter().map(|t| format!("{} ({})", t.name(), t.scope())).collect::<Vec<_>>().join(", ")).unwrap_or_default(),
        workflows = %names.join(","),
        "serving"
    );
    out!(
        "cairn: serving {scheme}://{addr} on {shown} (workflows: {})",
        names.join(", ")
    );
    out!("cairn: open the dashboard: {scheme}://{addr}/");
    out!(
        "cairn: API index {scheme}://{addr}/api, OpenAPI {scheme}://{addr}/api/openapi.json; {}",
        if tokens.is_some() {
            "every request needs a token (Authorization: Bearer …; the CLI takes --token or CAIRN_TOKEN)"
        } else {
            "no token required (loopback only)"
        }
    );
    // The first Ctrl-C or SIGTERM stops gracefully; a second one exits at once.
    let (stop, stopping) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        if next_signal().await.is_err() {
            return;
        }
        out!(
            "cairn: shutting down: ending live streams, finishing requests and the attempts in flight (up to {} s); press Ctrl-C again to exit at once",
            cairn::DEFAULT_DRAIN_TIMEOUT.as_secs()
        );
        stop.send_replace(true);
        if next_signal().await.is_ok() {
            eprintln!("cairn: exiting at once; interrupted attempts are retried at the next start");
            std::process::exit(130);
        }
    });
    let stopped = |mut stopping: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopping.wait_for(|stop| *stop).await;
    };
    let shutdown = stopped(stopping.clone());
    if let (Some(tokens), Some((path, started, fixed))) = (&tokens, watch) {
        config::watch(
            path,
            started,
            tokens.clone(),
            fixed,
            std::time::Duration::from_secs(2),
        );
    }
    let router = cairn_server::router_with_options(
        engine.clone(),
        cairn_server::Options {
            tokens,
            limits: limits.clone(),
            metrics: Some(metrics),
            account_id,
            cloudflare_any_account: settings.cloudflare_any_account,
            ..cairn_server::Options::default()
        },
    );
    // One deadline for both: the requests in progress finish while the engine drains its
    // attempts in flight (each within the same 10 s), not one after the other.
    let drain = async {
        stopped(stopping).await;
        engine.shutdown().await;
        tracing::info!("engine drained");
    };
    let serving = async {
        match tls {
            Some(tls) => {
                tls.watch(std::time::Duration::from_secs(2));
                cairn_server::serve_router_tls(listener, router, limits, tls, shutdown).await
            }
            None => cairn_server::serve_router_with(listener, router, limits, shutdown).await,
        }
    };
    let (served, ()) = tokio::join!(serving, drain);
    tracing::info!("stopped");
    out!("cairn: stopped");
    served.map_err(|e| format!("serve: {e}").into())
}

/// Resolves at the next Ctrl-C (SIGINT) or SIGTERM.
async fn next_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}

fn print(json: bool, value: &Value, human: impl FnOnce()) {
    if json {
        out!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_default()
        );
    } else {
        human();
    }
}

fn rows(value: &Value, cells: impl Fn(&Value) -> Vec<String>) -> Vec<Vec<String>> {
    value
        .as_array()
        .map(|a| a.iter().map(cells).collect())
        .unwrap_or_default()
}

fn workflows(c: &client::Client, command: WorkflowsCommand, json: bool) -> Result<(), String> {
    match command {
        WorkflowsCommand::Instances { command } => instances(c, command, json)?,
        WorkflowsCommand::List => {
            let v = c.call("GET", "/api/workflows", None)?;
            print(json, &v, || {
                client::table(
                    &["NAME"],
                    &rows(&v["workflows"], |w| vec![client::text(&w["name"])]),
                );
            });
        }
        WorkflowsCommand::Describe { name } => {
            let v = c.call(
                "GET",
                &format!("/api/workflows/{}", client::seg(&name)),
                None,
            )?;
            print(json, &v, || {
                out!("Workflow: {name}");
                let counts: Vec<Vec<String>> = v["instances"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, n)| vec![k.clone(), client::text(n)])
                            .collect()
                    })
                    .unwrap_or_default();
                client::table(&["STATUS", "INSTANCES"], &counts);
            });
        }
        WorkflowsCommand::Trigger {
            name,
            params,
            id,
            key,
            priority,
            wait,
        } => {
            let (params, wait) = params_and_wait(params, wait)?;
            let params = match params {
                Some(p) => client::parse_json("PARAMS", &p)?,
                None => client::empty_object(),
            };
            let deadline = match wait.as_deref() {
                None => None,
                Some(BARE_WAIT | "forever") => Some(None),
                Some(d) => {
                    let wait = humantime::parse_duration(d).map_err(|_| {
                        format!("--wait={d} is not a duration (e.g. --wait=30s, --wait=5m)")
                    })?;
                    // Too far to represent: as good as no deadline.
                    Some(std::time::Instant::now().checked_add(wait))
                }
            };
            // Each request waits at most this long (the server's limit is 60 s); past it,
            // the CLI asks again until the instance has finished or the deadline passes.
            let step = std::time::Duration::from_secs(50);
            let round = |deadline: Option<std::time::Instant>| {
                let left = deadline.map_or(step, |d| {
                    d.saturating_duration_since(std::time::Instant::now())
                        .min(step)
                });
                format!("{}ms", left.as_millis().max(1))
            };
            let path = format!("/api/workflows/{}/instances", client::seg(&name));
            let mut body = json!({ "instance_id": id, "params": params });
            if let Some(key) = key {
                body["concurrency_key"] = json!(key);
            }
            if let Some(priority) = priority {
                body["priority"] = json!(priority);
            }
            let mut v = match deadline {
                None => c.call("POST", &path, Some(&body))?,
                Some(d) => c.call("POST", &format!("{path}?wait={}", round(d)), Some(&body))?,
            };
            if let Some(d) = deadline {
                let id = client::text(&v["id"]);
                while !finished(&v) && d.is_none_or(|d| std::time::Instant::now() < d) {
                    v = c.call(
                        "GET",
                        &format!("{path}/{}/wait?timeout={}", client::seg(&id), round(d)),
                        None,
                    )?;
                }
            }
            print(json, &v, || {
                let id = client::text(&v["id"]);
                match (deadline, v["status"].as_str()) {
                    (None, _) => out!("🚀 Workflow instance {id:?} has been queued successfully"),
                    (Some(_), Some("complete")) => {
                        out!("✅ Workflow instance {id:?} completed");
                        out!(
                            "{}",
                            serde_json::to_string_pretty(&v["output"]).unwrap_or_default()
                        );
                    }
                    (Some(_), Some(status)) if finished(&v) => {
                        out!("❌ Workflow instance {id:?} is {status}");
                        if !v["error"].is_null() {
                            out!(
                                "{}: {}",
                                client::text(&v["error"]["name"]),
                                client::text(&v["error"]["message"])
                            );
                        }
                    }
                    (Some(_), status) => out!(
                        "⏳ Workflow instance {id:?} is still {} (the wait is over)",
                        status.unwrap_or("unknown")
                    ),
                }
            });
            // A script can tell: 0 complete, 2 still running, 3 errored or terminated
            // (1 is any other failure, such as a refused request).
            if deadline.is_some() && v["status"] != "complete" {
                std::process::exit(if finished(&v) { 3 } else { 2 });
            }
        }
    }
    Ok(())
}

/// Whether a status answer is a finished instance's.
fn finished(v: &Value) -> bool {
    matches!(
        v["status"].as_str(),
        Some("complete" | "errored" | "terminated")
    )
}

fn change_status(
    c: &client::Client,
    json: bool,
    name: &str,
    id: &str,
    body: Value,
    done: &str,
) -> Result<(), String> {
    let id = c.resolve(name, id)?;
    let v = c.call(
        "PATCH",
        &format!(
            "/api/workflows/{}/instances/{}/status",
            client::seg(name),
            client::seg(&id)
        ),
        Some(&body),
    )?;
    print(json, &v, || {
        out!(
            "{done} instance {id:?} (status: {})",
            client::text(&v["status"])
        )
    });
    Ok(())
}

fn instances(c: &client::Client, command: InstancesCommand, json: bool) -> Result<(), String> {
    match command {
        InstancesCommand::List {
            name,
            status,
            id_prefix,
            created_from,
            created_before,
            limit,
            mut cursor,
            all,
        } => {
            // `/api/instances` takes every filter (an unknown workflow is its 404).
            let mut query = format!("/api/instances?limit={limit}");
            if let Some(name) = &name {
                query.push_str(&format!("&workflow={}", client::seg(name)));
            }
            if !status.is_empty() {
                query.push_str(&format!("&status={}", client::seg(&status.join(","))));
            }
            for (key, value) in [
                ("idPrefix", &id_prefix),
                ("createdFrom", &created_from),
                ("createdBefore", &created_before),
            ] {
                if let Some(v) = value {
                    query.push_str(&format!("&{key}={}", client::seg(v)));
                }
            }
            let mut instances = Vec::new();
            loop {
                let path = match &cursor {
                    Some(at) => format!("{query}&cursor={}", client::seg(at)),
                    None => query.clone(),
                };
                let page = c.call("GET", &path, None)?;
                instances.extend(page["instances"].as_array().cloned().unwrap_or_default());
                cursor = page["cursor"].as_str().map(str::to_owned);
                if !all || cursor.is_none() {
                    break;
                }
            }
            let v = serde_json::json!({ "instances": instances, "cursor": cursor });
            print(json, &v, || {
                let table = rows(&v["instances"], |i| {
                    vec![
                        client::text(&i["workflow"]),
                        client::text(&i["id"]),
                        client::text(&i["status"]),
                        client::text(&i["created"]),
                        client::text(&i["ended"]),
                    ]
                });
                client::table(
                    &["WORKFLOW", "INSTANCE ID", "STATUS", "CREATED", "ENDED"],
                    &table,
                );
                if let Some(next) = &cursor {
                    out!("(more: --all for every page, or the next one with --cursor {next})");
                }
            });
        }
        InstancesCommand::Describe {
            name,
            id,
            full_output,
            watch,
        } => {
            let id = c.resolve(&name, &id)?;
            let v = c.call(
                "GET",
                &format!(
                    "/api/workflows/{}/instances/{}",
                    client::seg(&name),
                    client::seg(&id)
                ),
                None,
            )?;
            if json && watch {
                // One JSON document per line throughout (NDJSON): the details first.
                out!("{v}");
            } else {
                print(json, &v, || client::describe(&v, full_output));
            }
            if watch {
                let path = format!(
                    "/api/workflows/{}/instances/{}/stream",
                    client::seg(&name),
                    client::seg(&id)
                );
                c.follow(&path, |n, event, record| {
                    if json {
                        out!("{}", json!({ "id": n, "event": event, "record": record }));
                    } else {
                        let step = record["step"]["name"]
                            .as_str()
                            .map(|s| format!(" {s:?}"))
                            .unwrap_or_default();
                        let at = record["at"]
                            .as_u64()
                            .map(|ms| {
                                let t =
                                    std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
                                humantime::format_rfc3339_millis(t).to_string()
                            })
                            .unwrap_or_else(|| client::text(&record["at"]));
                        out!("{n:>6}  {at}  {event}{step}");
                    }
                })?;
            }
        }
        InstancesCommand::Output {
            name,
            id,
            step,
            count,
            kind,
            attempt,
        } => {
            let id = c.resolve(&name, &id)?;
            let mut path = format!(
                "/api/workflows/{}/instances/{}/step?name={}&count={count}&type={}",
                client::seg(&name),
                client::seg(&id),
                client::query_value(&step),
                client::query_value(&kind),
            );
            if let Some(a) = attempt {
                path.push_str(&format!("&attempt={a}"));
            }
            let mut stdout = std::io::stdout().lock();
            c.download(&path, &mut stdout)?;
            use std::io::Write as _;
            let _ = stdout.flush();
        }
        InstancesCommand::SendEvent {
            name,
            id,
            event_type,
            payload,
        } => {
            let id = c.resolve(&name, &id)?;
            let payload = match payload {
                Some(p) => client::parse_json("--payload", &p)?,
                None => client::empty_object(),
            };
            let path = format!(
                "/api/workflows/{}/instances/{}/events/{}",
                client::seg(&name),
                client::seg(&id),
                client::seg(&event_type)
            );
            let v = c.call("POST", &path, Some(&payload))?;
            print(json, &v, || {
                out!("📤 Event {event_type:?} sent to instance {id:?}")
            });
        }
        InstancesCommand::Pause { name, id } => {
            change_status(c, json, &name, &id, json!({"status": "pause"}), "⏸️ Paused")?
        }
        InstancesCommand::Resume { name, id } => change_status(
            c,
            json,
            &name,
            &id,
            json!({"status": "resume"}),
            "▶️ Resumed",
        )?,
        InstancesCommand::Terminate { name, id, rollback } => {
            let body = if rollback {
                json!({"status": "terminate", "rollback": true})
            } else {
                json!({"status": "terminate"})
            };
            change_status(c, json, &name, &id, body, "🥷 Terminated")?;
        }
        InstancesCommand::Restart {
            name,
            id,
            from_step_name,
            from_step_count,
            from_step_type,
        } => {
            let body = match from_step_name {
                None if from_step_count.is_some() || from_step_type.is_some() => {
                    return Err("--from-step-name is required when using --from-step-count or --from-step-type".into());
                }
                None => json!({"status": "restart"}),
                Some(step) => {
                    // `do` for a run step: the name every server version takes.
                    let kind = match from_step_type.as_deref() {
                        None => cairn::StepKind::Run,
                        Some(name) => cairn::StepKind::parse(name).ok_or_else(|| {
                            format!(
                                "--from-step-type {name:?}: expected {}",
                                cairn::StepKind::NAMES
                            )
                        })?,
                    };
                    let kind = match kind {
                        cairn::StepKind::Run => "do",
                        other => other.as_str(),
                    };
                    json!({"status": "restart", "from": {"name": step, "count": from_step_count.unwrap_or(1), "type": kind}})
                }
            };
            change_status(c, json, &name, &id, body, "🔄 Restarted")?;
        }
        InstancesCommand::Bulk {
            action,
            workflow,
            status,
            created_from,
            created_before,
            id_prefix,
            rollback,
            dry_run,
            yes,
        } => {
            let mut filter = serde_json::Map::new();
            if let Some(w) = workflow {
                filter.insert("workflow".into(), json!(w));
            }
            if !status.is_empty() {
                filter.insert("status".into(), json!(status));
            }
            if let Some(t) = created_from {
                filter.insert("createdFrom".into(), json!(t));
            }
            if let Some(t) = created_before {
                filter.insert("createdBefore".into(), json!(t));
            }
            if let Some(p) = id_prefix {
                filter.insert("idPrefix".into(), json!(p));
            }
            bulk(
                c,
                json,
                &action,
                rollback,
                &Value::Object(filter),
                dry_run || !yes,
            )?;
        }
        InstancesCommand::Delete { name, ids } => {
            let ids = ids
                .iter()
                .map(|id| c.resolve(&name, id))
                .collect::<Result<Vec<_>, _>>()?;
            let path = format!(
                "/api/workflows/{}/instances/batch/delete",
                client::seg(&name)
            );
            let v = c.call("POST", &path, Some(&json!({ "instances": ids })))?;
            print(json, &v, || {
                for id in v["deleted"].as_array().into_iter().flatten() {
                    out!("🗑️ Deleted instance {}", client::text(id));
                }
            });
            if let Some(first) = v["errors"].as_array().and_then(|e| e.first()) {
                return Err(format!(
                    "{} ({})",
                    client::text(&first["message"]),
                    client::text(&first["code"])
                ));
            }
        }
    }
    Ok(())
}

/// `cairn instances bulk`: counts what the filter matches, then (unless `count_only`)
/// works through it a page at a time, printing each failure; fails if any instance did.
fn bulk(
    c: &client::Client,
    json: bool,
    action: &str,
    rollback: bool,
    filter: &Value,
    count_only: bool,
) -> Result<(), String> {
    let request = |cursor: Option<&str>, dry_run: bool| {
        let mut body = json!({ "action": action, "filter": filter, "limit": 1000 });
        if rollback {
            body["rollback"] = json!(true);
        }
        if dry_run {
            body["dryRun"] = json!(true);
        }
        if let Some(cursor) = cursor {
            body["cursor"] = json!(cursor);
        }
        c.call("POST", "/api/instances/bulk", Some(&body))
    };
    let counted = request(None, true)?;
    let matched = counted["matched"].as_u64().unwrap_or(0);
    if count_only {
        let v = json!({ "matched": matched });
        print(json, &v, || {
            out!("{matched} instances match; pass --yes to {action} them");
        });
        return Ok(());
    }
    let mut results: Vec<Value> = Vec::new();
    // Start where the count did: instances created since are not acted on.
    let Some(mut cursor) = counted["cursor"].as_str().map(|c| Some(c.to_owned())) else {
        let v = json!({ "matched": 0, "results": [] });
        print(json, &v, || out!("{action}: no instance matches"));
        return Ok(());
    };
    loop {
        let page = request(cursor.as_deref(), false)?;
        let rows = page["results"].as_array().cloned().unwrap_or_default();
        if !json {
            for r in rows.iter().filter(|r| r["ok"] != true) {
                out!(
                    "✗ {}/{}: {} ({})",
                    client::text(&r["workflow"]),
                    client::text(&r["id"]),
                    client::text(&r["message"]),
                    client::text(&r["code"])
                );
            }
        }
        results.extend(rows);
        match page["cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let failed = results.iter().filter(|r| r["ok"] != true).count();
    let v = json!({ "matched": matched, "results": results });
    print(json, &v, || {
        out!(
            "{action}: done for {} of {} instances",
            results.len() - failed,
            results.len()
        );
    });
    if failed > 0 {
        return Err(format!("{failed} of {} instances failed", results.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    /// `serve --help` lists only what `serve` takes.
    #[test]
    fn serve_help_lists_only_serve_options() {
        let mut command = super::Cli::command();
        command.build();
        let serve = command.find_subcommand("serve").expect("serve");
        let ids: Vec<&str> = serve.get_arguments().map(|a| a.get_id().as_str()).collect();
        assert!(!ids.contains(&"url") && !ids.contains(&"json"), "{ids:?}");
        assert!(ids.contains(&"db") && ids.contains(&"token"), "{ids:?}");
    }

    /// Review finding: `CAIRN_TOKEN=$'abc\n'` (a token written with `echo`) started a server
    /// no request could open, and a client failed with "failed to parse header value".
    #[test]
    fn a_token_is_trimmed_and_one_with_a_control_character_inside_is_refused() {
        assert_eq!(super::token(Some("abc\n".into())), Ok(Some("abc".into())));
        assert_eq!(super::token(Some(" \t\n".into())), Ok(None));
        assert_eq!(super::token(None), Ok(None));
        let refused = super::token(Some("ab\ncd".into())).unwrap_err();
        assert!(refused.contains("control character"), "{refused}");
    }

    /// Review finding: docs/operating.md gave `cairn --url … --ca-cert ca.pem workflows
    /// list`, which the CLI refuses. Every `cairn` command in the README and docs/ (inline
    /// or a line of a code block) names only commands and options that exist; a mention
    /// without its arguments (`cairn instances describe`) is fine.
    #[test]
    fn every_command_in_the_docs_parses() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut files = vec![root.join("README.md")];
        for entry in std::fs::read_dir(root.join("docs")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
        let mut commands = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            for (i, line) in text.lines().enumerate() {
                let at = format!("{}:{}", file.display(), i + 1);
                let trimmed = line.trim_start().trim_start_matches("$ ");
                if trimmed.starts_with("cairn ") && !trimmed.contains(" = {") {
                    commands.push((at.clone(), trimmed.to_owned()));
                }
                for span in line.split('`').skip(1).step_by(2) {
                    if span.starts_with("cairn ") {
                        commands.push((at.clone(), span.to_owned()));
                    }
                }
            }
        }
        assert!(commands.len() > 20, "{commands:?}");
        let mut wrong = Vec::new();
        for (at, command) in commands {
            // The shell's part: a comment, a pipe, a redirection, a continued line.
            let command = command.split(" #").next().unwrap_or_default();
            let command = command
                .split(['|', '>', '&', '\\'])
                .next()
                .unwrap_or_default();
            let Some(words) = shell_words(command) else {
                continue;
            };
            if words.iter().any(|w| w.contains('|')) {
                continue;
            }
            if let Err(e) = <super::Cli as clap::Parser>::try_parse_from(&words) {
                use clap::error::ErrorKind;
                if matches!(
                    e.kind(),
                    ErrorKind::UnknownArgument
                        | ErrorKind::InvalidSubcommand
                        | ErrorKind::ArgumentConflict
                ) {
                    wrong.push(format!("{at}: {command}: {}", e.kind()));
                }
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    /// `text` split as a shell splits words (quotes, no expansions); `None` when a quote
    /// is left open.
    fn shell_words(text: &str) -> Option<Vec<String>> {
        let mut words = Vec::new();
        let mut word: Option<String> = None;
        let mut quote = None;
        for c in text.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), c) => word.get_or_insert_with(String::new).push(c),
                (None, '\'' | '"') => {
                    quote = Some(c);
                    word.get_or_insert_with(String::new);
                }
                (None, c) if c.is_whitespace() => words.extend(word.take()),
                (None, c) => word.get_or_insert_with(String::new).push(c),
            }
        }
        words.extend(word);
        quote.is_none().then_some(words)
    }

    /// Review finding: wrangler's paths and flags were refused (`workflows instances list
    /// NAME --per-page 5`), so commands copied from Cloudflare's docs did not run.
    #[test]
    fn wranglers_instance_commands_parse() {
        for argv in [
            "cairn workflows instances list approval --per-page 5",
            "cairn workflows instances describe approval latest",
            "cairn workflows instances terminate approval req-1",
            "cairn workflows instances pause approval req-1",
            "cairn workflows instances resume approval req-1",
            "cairn workflows instances send-event approval req-1 --type approved",
        ] {
            let words: Vec<&str> = argv.split(' ').collect();
            if let Err(e) = <super::Cli as clap::Parser>::try_parse_from(&words) {
                panic!("{argv}: {e}");
            }
        }
    }

    /// Review finding: `trigger NAME --wait 30` created the instance with params `30` and
    /// waited for ever.
    #[test]
    fn trigger_refuses_a_bare_number_after_a_bare_wait() {
        let given = |p: &str, w: &str| super::params_and_wait(Some(p.into()), Some(w.into()));
        let refused = given("30", super::BARE_WAIT).unwrap_err();
        assert!(refused.contains("--wait=30s"), "{refused}");
        assert_eq!(given("5s", super::BARE_WAIT), Ok((None, Some("5s".into()))));
        assert_eq!(
            given("{\"a\":1}", super::BARE_WAIT),
            Ok((Some("{\"a\":1}".into()), Some(super::BARE_WAIT.into())))
        );
        // An explicit --wait=forever leaves params of 30 alone.
        assert_eq!(
            given("30", "forever"),
            Ok((Some("30".into()), Some("forever".into())))
        );
        // Params of 30 with a wait given after `=` are params.
        assert_eq!(
            given("30", "5s"),
            Ok((Some("30".into()), Some("5s".into())))
        );
        assert_eq!(
            super::params_and_wait(Some("30".into()), None),
            Ok((Some("30".into()), None))
        );
    }

    /// Every argument and option of every command says what it is.
    #[test]
    fn no_argument_lacks_help() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in command.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "cairn", &mut missing);
        assert!(missing.is_empty(), "arguments without help: {missing:?}");
    }
}
