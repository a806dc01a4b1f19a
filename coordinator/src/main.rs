//! `rsc-coordinator`: the server (`serve`) and the operators' CLI (`group`, `stream`, `member`,
//! `dlq`).

use clap::{Parser, Subcommand};
use rsc_coordinator::cli::{self, OperatorCommand};
use rsc_coordinator::config::{LogFormat, ServeArgs};
use rsc_coordinator::server;
use std::io::IsTerminal;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main` (the environment's `_RJEM_MALLOC_CONF` overrides
/// them): background threads purge freed pages, within about a second, so the memory of
/// closed connections goes back to the system instead of staying in the process.
#[cfg(not(target_env = "msvc"))]
#[allow(unsafe_code)] // jemalloc finds this constant C string by its symbol name.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; 60] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

#[derive(Debug, Parser)]
#[command(
    name = "rsc-coordinator",
    version,
    about = "Redis Stream Coordinator: consumer groups for sharded Redis Streams"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at startup: the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the coordinator server.
    Serve(Box<ServeArgs>),
    /// Maintenance of the metadata store.
    #[command(subcommand)]
    Store(StoreCommand),
    #[command(flatten)]
    Operator(OperatorCommand),
}

#[derive(Debug, Subcommand)]
enum StoreCommand {
    /// Restore every stream and group document the metadata store lost from the recovery
    /// copy in the data Redis (PROTOCOL §2.3), whatever `--store-recovery` says. Takes the
    /// `serve` settings (`--store`, `--redis-url`, `--data-redis-url`, `--key-prefix`, …).
    Restore(Box<ServeArgs>),
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_env("RSC_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,tower_http=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            let cfg = (*args).resolve()?;
            init_logging(cfg.log_format);
            // Once logging is up, a fatal error is a log event too (one JSON object with
            // `--log-format json`), not a bare line on stderr.
            if let Err(e) = server::serve(cfg, server::shutdown_signal()).await {
                tracing::error!(error = format!("{e:#}"), "coordinator stopped on an error");
                std::process::exit(1);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Store(StoreCommand::Restore(args)) => {
            let cfg = (*args).resolve()?;
            init_logging(cfg.log_format);
            let restored = server::restore_store(&cfg).await?;
            for s in &restored.streams {
                println!("restored stream {s}");
            }
            for g in &restored.groups {
                println!("restored group {g}");
            }
            println!(
                "{} stream(s) and {} group(s) restored",
                restored.streams.len(),
                restored.groups.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Operator(cmd) => Ok(cli::run(cmd).await),
    }
}
