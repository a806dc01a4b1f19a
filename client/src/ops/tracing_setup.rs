//! The default tracing subscriber: `RSC_LOG` and `RSC_LOG_FORMAT`.

use crate::ConfigError;
use tracing_subscriber::EnvFilter;

/// The variable of the log filter (an `EnvFilter` directive, e.g. `info,rsc_client=debug`).
const FILTER_ENV: &str = "RSC_LOG";
/// The variable of the log format.
const FORMAT_ENV: &str = "RSC_LOG_FORMAT";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LogFormat {
    /// Human-readable lines (colored on a terminal). The default.
    #[default]
    Text,
    /// One JSON object per line, with the span fields (`group`, `member`, `shard`, …).
    Json,
}

impl LogFormat {
    /// Parses `text` or `json` (any case; `None` for anything else).
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "text" => Some(LogFormat::Text),
            "json" => Some(LogFormat::Json),
            _ => None,
        }
    }
}

/// The filter and format the environment `get` names (defaults: `info`, text).
fn settings(get: impl Fn(&str) -> Option<String>) -> Result<(EnvFilter, LogFormat), ConfigError> {
    let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
    let filter = match get(FILTER_ENV) {
        None => EnvFilter::new("info"),
        Some(v) => EnvFilter::try_new(&v).map_err(|_| ConfigError::InvalidEnv {
            name: FILTER_ENV,
            value: v,
            expected: "a tracing filter such as info or warn,rsc_client=debug",
        })?,
    };
    let format = match get(FORMAT_ENV) {
        None => LogFormat::Text,
        Some(v) => LogFormat::parse(&v).ok_or(ConfigError::InvalidEnv {
            name: FORMAT_ENV,
            value: v,
            expected: "text or json",
        })?,
    };
    Ok((filter, format))
}

/// Logs to stderr: filtered by `RSC_LOG` (default `info`), as text or JSON lines
/// (`RSC_LOG_FORMAT=text|json`, default `text`). A bad value of either is an error naming
/// the variable. Does nothing when the program already installed a subscriber.
pub fn init_tracing() -> Result<(), ConfigError> {
    let (filter, format) = settings(|k| std::env::var(k).ok())?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // An already installed subscriber stays: the program chose it.
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variables_are_read_and_a_bad_value_names_its_variable() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let (_, format) = settings(env(&[])).expect("defaults");
        assert_eq!(format, LogFormat::Text);
        let (filter, format) = settings(env(&[
            ("RSC_LOG", "warn,rsc_client=debug"),
            ("RSC_LOG_FORMAT", "JSON"),
        ]))
        .expect("valid");
        assert_eq!(format, LogFormat::Json);
        assert!(filter.to_string().contains("rsc_client=debug"));
        let bad = settings(env(&[("RSC_LOG_FORMAT", "yaml")])).unwrap_err();
        assert!(
            matches!(
                bad,
                ConfigError::InvalidEnv {
                    name: "RSC_LOG_FORMAT",
                    ..
                }
            ),
            "{bad}"
        );
        let bad = settings(env(&[("RSC_LOG", "info,[")])).unwrap_err();
        assert!(
            matches!(
                bad,
                ConfigError::InvalidEnv {
                    name: "RSC_LOG",
                    ..
                }
            ),
            "{bad}"
        );
    }
}
