//! Sample pods of Redis Stream Coordinator (SPEC §8) and a minimal listener to copy.
//!
//! - `sample-consumer`: a consumer pod with flags for tests and demos (handling time, failure
//!   rate, a record stream of every successful handling).
//! - `sample-producer`: publishes `N` keyed messages, optionally at a rate.
//! - `quickstart`: the smallest real listener program; start from this one.
#![deny(missing_docs)]

pub mod health;

/// Sets up logging to stderr: `RSC_LOG` (default `info`), as text.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RSC_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
