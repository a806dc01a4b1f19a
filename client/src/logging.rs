//! The consumer app's default logging: what the client does (assignments, revocations,
//! fencing, dead letters) on stderr at `info`, unless the application installed its own
//! subscriber (GUIDE "Logs").

use tracing_subscriber::EnvFilter;

/// Installs a subscriber writing to stderr, filtered by `RUST_LOG` (else `RSC_LOG`, else
/// `info`; a filter that does not parse is `info`), unless the program installed one
/// (`tracing::dispatcher::has_been_set`): the program's choice stays.
pub(crate) fn install_default() {
    if tracing::dispatcher::has_been_set() {
        return;
    }
    let directive = ["RUST_LOG", "RSC_LOG"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()));
    let filter = (directive.and_then(|d| EnvFilter::try_new(d).ok()))
        .unwrap_or_else(|| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
