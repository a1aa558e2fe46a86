//! `cairn-bench`: run a workload and print a markdown table.

use std::path::PathBuf;

use cairn::sqlite::Durability;
use cairn_bench::{BenchError, Settings, print_table};
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(about = "Cairn's benchmark harness: prints a markdown table")]
struct Cli {
    /// SQLite synchronous mode.
    #[arg(long, value_enum, default_value_t = Sync::Full, global = true)]
    durability: Sync,
    #[command(subcommand)]
    workload: Workload,
}

#[derive(Clone, Copy, ValueEnum)]
enum Sync {
    /// `synchronous=FULL`: nothing lost on power loss.
    #[value(name = "FULL", alias = "full")]
    Full,
    /// `synchronous=NORMAL`.
    #[value(name = "NORMAL", alias = "normal")]
    Normal,
}

#[derive(Subcommand)]
enum Workload {
    /// The raw storage bound on its own.
    Raw {
        #[arg(long, default_value_t = 20_000)]
        units: usize,
    },
    /// Many concurrent instances of no-op steps.
    Throughput {
        #[arg(long, default_value_t = 1_000)]
        instances: usize,
        #[arg(long, default_value_t = 10)]
        steps: u32,
    },
    /// Instances with concurrency keys (limit never reached; 20 per key) next to none.
    Keyed {
        #[arg(long, default_value_t = 1_000)]
        instances: usize,
        #[arg(long, default_value_t = 10)]
        steps: u32,
    },
    /// Parents each invoking a child workflow, next to the children created directly.
    Children {
        #[arg(long, default_value_t = 1_000)]
        instances: usize,
        #[arg(long, default_value_t = 10)]
        steps: u32,
    },
    /// One instance streaming a large output through a stream step, then replayed and
    /// read back: throughput and peak resident memory.
    Streams {
        /// The stream's size in MiB.
        #[arg(long, default_value_t = 500)]
        mib: u64,
    },
    /// Throughput with the engine's metrics recorded (Prometheus) and not, alternated.
    Overhead {
        #[arg(long, default_value_t = 1_000)]
        instances: usize,
        #[arg(long, default_value_t = 10)]
        steps: u32,
        #[arg(long, default_value_t = 5)]
        rounds: usize,
    },
    /// The peers' shapes (single, 200@50, 1000@200), embedded and over HTTP.
    Peers {
        /// Single instances per round.
        #[arg(long, default_value_t = 100)]
        runs: usize,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// The dashboard's instance list and the bulk confirmation's count on a database of
    /// this many stored instances, served over HTTP.
    Lists {
        #[arg(long, default_value_t = 100_000)]
        instances: usize,
    },
    /// One instance at a time, end to end.
    Latency {
        #[arg(long, default_value_t = 200)]
        runs: usize,
        #[arg(long, default_value_t = 10)]
        steps: u32,
    },
    /// Many sleeping instances, then their wake-ups.
    Hibernation {
        #[arg(long, default_value_t = 100_000)]
        instances: usize,
    },
    /// Many instances waiting for an event, then one event each.
    Events {
        #[arg(long, default_value_t = 10_000)]
        instances: usize,
    },
    /// Resuming one instance with a long journal.
    Replay {
        #[arg(long, default_value_t = 10_000)]
        steps: u32,
    },
    /// SIGKILL with instances in flight, then restart.
    Recovery {
        #[arg(long, default_value_t = 10_000)]
        instances: usize,
    },
    /// Cost against stored history: hot paths on databases of these sizes.
    Scale {
        #[arg(long, value_delimiter = ',', default_value = "1000,100000,1000000")]
        sizes: Vec<usize>,
    },
    /// The workloads on PostgreSQL (throughput with several engine processes, latency,
    /// takeover) next to the bare-PostgreSQL bound.
    Postgres {
        /// The database (`postgres://…`); each measurement uses a schema of its own.
        #[arg(long, env = "CAIRN_BENCH_PG_URL")]
        url: String,
        #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
        engines: Vec<usize>,
        #[arg(long, default_value_t = 1_000)]
        instances: usize,
        #[arg(long, default_value_t = 10)]
        steps: u32,
    },
    /// A child engine of `postgres` (not for direct use).
    #[command(hide = true)]
    PgEngine {
        #[arg(long)]
        url: String,
        #[arg(long)]
        schema: String,
        #[arg(long)]
        role: String,
        #[arg(long)]
        instances: usize,
    },
    /// The child side of `recovery` (not for direct use).
    #[command(hide = true)]
    RecoveryChild {
        #[arg(long)]
        db: PathBuf,
        #[arg(long)]
        instances: usize,
    },
}

/// The allocator `cairn serve` uses, when built with `--features mimalloc`; the system's
/// otherwise (the engine embedded in an application that keeps its own).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<(), BenchError> {
    let cli = Cli::parse();
    let settings = Settings {
        durability: match cli.durability {
            Sync::Full => Durability::Full,
            Sync::Normal => Durability::Normal,
        },
    };
    // `CAIRN_BENCH_DIR` keeps the databases for a look afterwards; a temporary one otherwise.
    let dir = tempfile::tempdir()?;
    let kept = std::env::var_os("CAIRN_BENCH_DIR").map(PathBuf::from);
    let path = kept.as_deref().unwrap_or(dir.path());
    let rows = match cli.workload {
        Workload::Raw { units } => cairn_bench::raw(path, settings, units)?,
        Workload::Throughput { instances, steps } => {
            cairn_bench::throughput(path, settings, instances, steps).await?
        }
        Workload::Keyed { instances, steps } => {
            cairn_bench::keyed(path, settings, instances, steps).await?
        }
        Workload::Streams { mib } => cairn_bench::streams(path, settings, mib).await?,
        Workload::Children { instances, steps } => {
            cairn_bench::children(path, settings, instances, steps).await?
        }
        Workload::Overhead {
            instances,
            steps,
            rounds,
        } => cairn_bench::overhead(path, settings, instances, steps, rounds).await?,
        Workload::Peers { runs, rounds } => {
            cairn_bench::peers(path, settings, runs, rounds, cairn_bench::PEER_SHAPES).await?
        }
        Workload::Lists { instances } => cairn_bench::lists(path, settings, instances).await?,
        Workload::Latency { runs, steps } => {
            cairn_bench::latency(path, settings, runs, steps).await?
        }
        Workload::Hibernation { instances } => {
            cairn_bench::hibernation(path, settings, instances).await?
        }
        Workload::Events { instances } => cairn_bench::events(path, settings, instances).await?,
        Workload::Replay { steps } => cairn_bench::replay(path, settings, steps).await?,
        Workload::Recovery { instances } => {
            let exe = std::env::current_exe()?;
            cairn_bench::recovery(path, settings, instances, &exe).await?
        }
        Workload::Scale { sizes } => cairn_bench::scale(path, settings, &sizes).await?,
        Workload::Postgres {
            url,
            engines,
            instances,
            steps,
        } => {
            let exe = std::env::current_exe()?;
            cairn_bench::postgres(&url, &engines, instances, steps, &exe).await?
        }
        Workload::PgEngine {
            url,
            schema,
            role,
            instances,
        } => {
            cairn_bench::postgres_engine_child(&url, &schema, &role, instances).await?;
            return Ok(());
        }
        Workload::RecoveryChild { db, instances } => {
            cairn_bench::recovery_child(&db, settings, instances).await?;
            return Ok(());
        }
    };
    print_table(&rows);
    Ok(())
}
