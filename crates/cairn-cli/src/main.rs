//! `cairn`: run Cairn's engine with its HTTP API on embedded SQLite.
//!
//! `cairn serve [--db cairn.db] [--addr 127.0.0.1:8787] [--token T]` starts the engine with
//! the demo workflows registered (see `demo.rs`) and serves the API until Ctrl-C.

mod demo;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "Durable execution for Rust: the Cairn server"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the engine on SQLite with the demo workflows, and serve the HTTP API.
    Serve {
        /// The database file (created if missing).
        #[arg(long, default_value = "cairn.db")]
        db: PathBuf,
        /// Where to listen. A non-loopback address requires a token.
        #[arg(long, default_value = "127.0.0.1:8787")]
        addr: SocketAddr,
        /// Require `Authorization: Bearer <token>` on every request.
        #[arg(long, env = "CAIRN_TOKEN")]
        token: Option<String>,
    },
}

#[tokio::main]
async fn main() {
    if let Err(e) = run(Cli::parse()).await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Serve { db, addr, token } => {
            if !addr.ip().is_loopback() && token.is_none() {
                return Err(format!(
                    "refusing to serve on {addr} without a token: pass --token (or CAIRN_TOKEN), or bind a loopback address"
                )
                .into());
            }
            let engine = demo::register(cairn::Engine::builder().sqlite(&db))
                .start()
                .await
                .map_err(|e| format!("start the engine on {}: {e}", db.display()))?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("listen on {addr}: {e}"))?;
            let names: Vec<&str> = engine.workflow_names().iter().map(|n| n.as_str()).collect();
            println!(
                "cairn: serving http://{addr}/api on {} (workflows: {})",
                db.display(),
                names.join(", ")
            );
            let shutdown = async {
                let _ = tokio::signal::ctrl_c().await;
            };
            let router = cairn_server::router_with(engine.clone(), token);
            let served = axum_serve(listener, router, shutdown).await;
            engine.shutdown().await;
            served.map_err(|e| format!("serve: {e}").into())
        }
    }
}

async fn axum_serve(
    listener: tokio::net::TcpListener,
    router: cairn_server::Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    cairn_server::serve_router(listener, router, shutdown).await
}
