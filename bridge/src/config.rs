//! The bridge's listeners and settings, from the TOML file, the environment and the flags,
//! with `ConsumerApp`'s names (GUIDE "Configuration outside the code"): a listener is a
//! `[listeners.<name>]` section of the file `RSC_CONFIG_FILE` (`--config`), overridden by
//! the section `[profiles.<profile>.listeners.<name>]` of the profile `RSC_PROFILE`
//! (`--profile`) names, overridden by variables `RSC_LISTENER_<NAME>_<SETTING>`. A listener
//! no file declares is named in `RSC_BRIDGE_LISTENERS` (`--listeners`, comma-separated) and
//! set by variables alone. The bridge's own settings are the file's `[bridge]` section,
//! under `RSC_BRIDGE_*` variables and flags.
//!
//! The layering and its refusals are `rsc-client`'s own ([`ListenerOverrides`]), with the
//! bridge's settings added: nothing is ignored silently; an unknown setting, section or
//! variable, or a value of the wrong kind, is an error naming where it was read.

use rsc_client::{ListenerOverrides, ListenerSettings, OverrideSources, SettingKind};
use std::path::PathBuf;
use std::time::Duration;

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ConfigError {
    /// A value of the wrong kind, a key that names nothing, or a file that cannot be read:
    /// `ConsumerApp`'s error, naming where it was read.
    #[error(transparent)]
    Setting(#[from] rsc_client::ConfigError),
    /// No listener at all.
    #[error(
        "no listener: declare one as a [listeners.<name>] section of RSC_CONFIG_FILE, or name it in RSC_BRIDGE_LISTENERS"
    )]
    NoListeners,
    /// A setting every listener needs is missing.
    #[error("listener {listener}: {setting} is required")]
    Missing {
        /// The listener.
        listener: String,
        /// The setting (as the file spells it).
        setting: &'static str,
    },
}

/// The bridge's listener settings beyond `ConsumerApp`'s.
const SETTINGS: &[(&str, SettingKind)] = &[
    ("deliver_to", SettingKind::Text),
    ("deliver_path", SettingKind::Text),
    ("delivery_timeout_ms", SettingKind::Millis),
    ("mode", SettingKind::Text),
    ("event_type", SettingKind::Text),
];

/// How an entry is written into the HTTP request (CloudEvents 1.0 HTTP binding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Attributes as `ce-*` headers, the payload as the body with its content type.
    Binary,
    /// The whole event as one JSON document (`application/cloudevents+json`).
    Structured,
}

/// Where the application listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeliverTo {
    /// An `http://` URL on a loopback address.
    Http(String),
    /// A Unix socket, and the request path on it.
    Unix {
        /// The socket file.
        socket: PathBuf,
        /// The request path (`deliver_path`, default `/`).
        path: String,
    },
}

impl std::fmt::Display for DeliverTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeliverTo::Http(url) => f.write_str(url),
            DeliverTo::Unix { socket, path } => write!(f, "unix:{}{path}", socket.display()),
        }
    }
}

/// One listener of the bridge: a `ConsumerApp` listener whose handler is a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Route {
    /// The listener's name (in member ids and metrics).
    pub(crate) name: String,
    /// The consumer group (default: the name).
    pub(crate) group: String,
    /// The stream.
    pub(crate) stream: String,
    /// Where entries go.
    pub(crate) deliver_to: DeliverTo,
    /// Members of the group in this process.
    pub(crate) concurrency: u32,
    /// Deliveries of one shard in flight at once, never two of one key.
    pub(crate) key_concurrency: usize,
    /// A batch listener: at most this many entries per request (a JSON array).
    pub(crate) max_batch: Option<usize>,
    /// Failed deliveries retried before the entry is dead-lettered.
    pub(crate) max_retries: u32,
    /// The retry backoff, from and to.
    pub(crate) retry_backoff: (Duration, Duration),
    /// Non-blocking retry stages' delays (GUIDE "Non-blocking retries: retry stages"); empty: retries in place.
    pub(crate) retry_stages: Vec<Duration>,
    /// Entries per read (`XREADGROUP COUNT`).
    pub(crate) batch_size: Option<usize>,
    /// A batch listener's wait for a fuller batch.
    pub(crate) linger: Duration,
    /// How long the application may take to answer one delivery.
    pub(crate) delivery_timeout: Duration,
    /// Binary (default) or structured CloudEvents.
    pub(crate) mode: Mode,
    /// The events' `type` attribute.
    pub(crate) event_type: String,
}

/// The default `type` of the events.
pub(crate) const DEFAULT_EVENT_TYPE: &str = "rsc.entry";

/// The bridge's own settings (the file's `[bridge]` section).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FileBridge {
    /// `listen`.
    pub(crate) listen: Option<String>,
    /// `app_token_file`.
    pub(crate) app_token_file: Option<PathBuf>,
    /// `publish_body_limit`.
    pub(crate) publish_body_limit: Option<usize>,
}

fn invalid(
    at: impl Into<String>,
    value: impl Into<String>,
    expected: impl Into<String>,
) -> ConfigError {
    ConfigError::Setting(rsc_client::ConfigError::InvalidSetting {
        setting: at.into(),
        value: value.into(),
        expected: expected.into(),
    })
}

/// What `load` reads.
#[derive(Debug, Default)]
pub(crate) struct Sources<'a> {
    /// The file's path and text.
    pub(crate) file: Option<(&'a str, &'a str)>,
    /// The profile.
    pub(crate) profile: Option<&'a str>,
    /// Listeners declared outside the file.
    pub(crate) declared: Vec<String>,
    /// The `RSC_LISTENER_*` variables.
    pub(crate) env: Vec<(String, String)>,
    /// The `--listener-<name>-<setting>` flags, as [`split_listener_flags`] gives them.
    pub(crate) flags: ListenerFlags,
}

/// The listeners and the file's `[bridge]` section.
pub(crate) fn load(src: &Sources<'_>) -> Result<(Vec<Route>, FileBridge), ConfigError> {
    let declared: Vec<&str> = src.declared.iter().map(String::as_str).collect();
    let overrides = ListenerOverrides::read(&OverrideSources {
        env: &src.env,
        flags: &src.flags,
        file: src.file,
        profile: src.profile,
        listeners: &declared,
        file_declares: true,
        extra_settings: SETTINGS,
        extra_sections: &["bridge"],
    })?;
    let bridge = match src.file {
        Some((path, text)) => {
            let doc: toml::Table =
                text.parse()
                    .map_err(|e: toml::de::Error| rsc_client::ConfigError::ConfigFile {
                        path: path.to_owned(),
                        reason: e.message().to_owned(),
                    })?;
            let at = format!("{path}: bridge");
            read_bridge(table(doc.get("bridge"), &at)?, path)?
        }
        None => FileBridge::default(),
    };
    let routes = overrides
        .listeners()
        .map(|name| route(name, overrides.of(name)))
        .collect::<Result<Vec<_>, _>>()?;
    if routes.is_empty() {
        return Err(ConfigError::NoListeners);
    }
    Ok((routes, bridge))
}

/// The `[bridge]` section.
fn read_bridge(section: Option<&toml::Table>, path: &str) -> Result<FileBridge, ConfigError> {
    let mut out = FileBridge::default();
    for (key, value) in section.into_iter().flatten() {
        let at = format!("{path}: bridge.{key}");
        match (key.as_str(), value) {
            ("listen", toml::Value::String(s)) => out.listen = Some(s.clone()),
            ("app_token_file", toml::Value::String(s)) => out.app_token_file = Some(s.into()),
            ("publish_body_limit", toml::Value::Integer(n)) if *n > 0 => {
                out.publish_body_limit = Some(*n as usize)
            }
            ("listen" | "app_token_file" | "publish_body_limit", v) => {
                return Err(invalid(
                    at,
                    v.to_string(),
                    "a string (listen, app_token_file) or a positive number (publish_body_limit)",
                ));
            }
            (_, v) => {
                return Err(invalid(
                    at,
                    v.to_string(),
                    "one of listen, app_token_file, publish_body_limit",
                ));
            }
        }
    }
    Ok(out)
}

/// `value` as a table (`None` when absent); anything else is an error naming `at`.
fn table<'a>(
    value: Option<&'a toml::Value>,
    at: &str,
) -> Result<Option<&'a toml::Table>, ConfigError> {
    match value {
        None => Ok(None),
        Some(toml::Value::Table(t)) => Ok(Some(t)),
        Some(other) => Err(invalid(at, other.to_string(), "a table")),
    }
}

/// The listener `name` from its settings (defaults as `Listener`'s).
fn route(name: &str, s: ListenerSettings<'_>) -> Result<Route, ConfigError> {
    let missing = |setting| ConfigError::Missing {
        listener: name.to_owned(),
        setting,
    };
    let stream = s.text("stream").ok_or_else(|| missing("stream"))?;
    let deliver_to = s.text("deliver_to").ok_or_else(|| missing("deliver_to"))?;
    let from = s.source("deliver_to").unwrap_or_default();
    let path = s.text("deliver_path").map(str::to_owned);
    let mode = match s.text("mode") {
        None | Some("binary") => Mode::Binary,
        Some("structured") => Mode::Structured,
        Some(other) => {
            let at = s.source("mode").unwrap_or_default();
            return Err(invalid(at, other, "binary or structured"));
        }
    };
    let retry_min = s
        .millis("retry_backoff_ms")?
        .unwrap_or(Duration::from_millis(200));
    let retry_max = s
        .millis("retry_backoff_max_ms")?
        .unwrap_or(Duration::from_secs(10));
    let delivery_timeout = s
        .millis("delivery_timeout_ms")?
        .unwrap_or(Duration::from_secs(30));
    Ok(Route {
        name: name.to_owned(),
        group: s.text("group").unwrap_or(name).to_owned(),
        stream: stream.to_owned(),
        deliver_to: parse_deliver_to(deliver_to, path, from)?,
        concurrency: s.number("concurrency")?.unwrap_or(1),
        key_concurrency: s.number("key_concurrency")?.unwrap_or(1),
        max_batch: s.number("max_batch")?,
        max_retries: s.number("max_retries")?.unwrap_or(3),
        retry_backoff: (retry_min, retry_max.max(retry_min)),
        retry_stages: s.delays("retry_stages")?.unwrap_or_default(),
        batch_size: s.number("batch_size")?,
        linger: s.millis("linger_ms")?.unwrap_or_default(),
        delivery_timeout: delivery_timeout.max(Duration::from_millis(1)),
        mode,
        event_type: s
            .text("event_type")
            .map_or_else(|| DEFAULT_EVENT_TYPE.to_owned(), str::to_owned),
    })
}

/// `--help`'s text on the per-listener flags, with every setting they may name.
pub(crate) fn flags_help() -> String {
    let settings: Vec<String> = (ListenerOverrides::SETTINGS.iter().chain(SETTINGS))
        .map(|(s, _)| s.replace('_', "-"))
        .collect();
    format!(
        "Listener settings (docs/BRIDGE.md \"Configuration\"), highest first:\n  \
         {flag} VALUE  a flag, e.g. {example} 8\n  \
         {var}  a variable, e.g. {example_var}\n  \
         [profiles.<profile>.listeners.<name>], then [listeners.<name>] of the --config file\n\
         <name> is the listener's name, in a flag lower-cased with - for anything but a letter or \
         a digit; <setting> one of: {list}.",
        flag = "--listener-<name>-<setting>",
        example = ListenerOverrides::flag("billing", "key_concurrency"),
        var = "RSC_LISTENER_<NAME>_<SETTING>",
        example_var = ListenerOverrides::variable("billing", "key_concurrency") + "=8",
        list = settings.join(", "),
    )
}

/// Per-listener flags, each as its name and value.
pub(crate) type ListenerFlags = Vec<(String, String)>;

/// The command line without its per-listener flags, and those flags as (name, value): an
/// argument `--listener-<name>-<setting>=VALUE`, or `--listener-<name>-<setting> VALUE`
/// (`ListenerOverrides::flag` spells them). They cannot be declared to the argument parser:
/// their names depend on the listeners. Nothing after `--` is one.
///
/// # Errors
/// A flag without a value.
pub(crate) fn split_listener_flags(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<(Vec<std::ffi::OsString>, ListenerFlags), ConfigError> {
    let prefix = ListenerOverrides::FLAG_PREFIX;
    let (mut rest, mut flags) = (Vec::new(), Vec::new());
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let text = arg
            .to_str()
            .filter(|a| a.starts_with(prefix))
            .map(str::to_owned);
        let Some(text) = text else {
            let end = arg == "--";
            rest.push(arg);
            if end {
                rest.extend(args.by_ref());
            }
            continue;
        };
        let (name, value) = match text.split_once('=') {
            Some((name, value)) => (name.to_owned(), value.to_owned()),
            None => {
                let value = args.next().and_then(|v| v.into_string().ok());
                match value {
                    Some(v) if !v.starts_with("--") => (text, v),
                    _ => {
                        return Err(invalid(
                            text,
                            "",
                            "a value (--listener-<name>-<setting> VALUE)",
                        ));
                    }
                }
            }
        };
        flags.push((name, value));
    }
    Ok((rest, flags))
}

/// `deliver_to`: an `http://` URL on a loopback host, or `unix:/path/to.sock`.
pub(crate) fn parse_deliver_to(
    text: &str,
    path: Option<String>,
    from: &str,
) -> Result<DeliverTo, ConfigError> {
    if let Some(socket) = text.strip_prefix("unix:") {
        if !socket.starts_with('/') {
            return Err(invalid(from, text, "unix:/absolute/path/of/the.sock"));
        }
        let path = path.unwrap_or_else(|| "/".to_owned());
        if !path.starts_with('/') {
            return Err(invalid(from, path, "a request path beginning with /"));
        }
        return Ok(DeliverTo::Unix {
            socket: socket.into(),
            path,
        });
    }
    let expected = "an http:// URL on a loopback address (127.0.0.1, [::1], localhost) or unix:/path/of/the.sock";
    let Ok(url) = reqwest::Url::parse(text) else {
        return Err(invalid(from, text, expected));
    };
    let loopback = url.host_str().is_some_and(|h| {
        let h = h.trim_start_matches('[').trim_end_matches(']');
        h == "localhost"
            || h.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    });
    if url.scheme() != "http" || !loopback || path.is_some() {
        return Err(invalid(from, text, expected));
    }
    Ok(DeliverTo::Http(text.to_owned()))
}

#[cfg(test)]
mod tests;
