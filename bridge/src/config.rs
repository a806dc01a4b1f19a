//! The bridge's listeners and settings, from the TOML file, the environment and the flags,
//! with `ConsumerApp`'s names (GUIDE "Configuration outside the code"): a listener is a
//! `[listeners.<name>]` section of the file `RSC_CONFIG_FILE` (`--config`), overridden by
//! the section `[profiles.<profile>.listeners.<name>]` of the profile `RSC_PROFILE`
//! (`--profile`) names, overridden by variables `RSC_LISTENER_<NAME>_<SETTING>`. A listener
//! no file declares is named in `RSC_BRIDGE_LISTENERS` (`--listeners`, comma-separated) and
//! set by variables alone. The bridge's own settings are the file's `[bridge]` section,
//! under `RSC_BRIDGE_*` variables and flags.
//!
//! Nothing is ignored silently: an unknown setting, section or variable, or a value of the
//! wrong kind, is an error naming where it was read.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The prefix of the listener variables (as `ConsumerApp`'s).
const ENV_PREFIX: &str = "RSC_LISTENER_";

/// A configuration that cannot be used: where, what, and what was expected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ConfigError {
    /// A value of the wrong kind, or a key that names nothing.
    #[error("{at}: {value:?} is not valid: expected {expected}")]
    Invalid {
        /// The variable, or the file and key.
        at: String,
        /// The value as read.
        value: String,
        /// What it must be.
        expected: String,
    },
    /// The file cannot be read or parsed.
    #[error("configuration file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
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

/// What a setting's value must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Any text.
    Text,
    /// A whole number, at least 1.
    Count,
    /// A whole number, 0 or more.
    Number,
    /// Whole milliseconds.
    Millis,
}

impl Kind {
    fn expected(self) -> &'static str {
        match self {
            Kind::Text => "a string",
            Kind::Count => "a whole number of at least 1",
            Kind::Number => "a whole number",
            Kind::Millis => "a whole number of milliseconds",
        }
    }
}

/// Every listener setting: `ConsumerApp`'s, then the bridge's own.
const SETTINGS: &[(&str, Kind)] = &[
    ("group", Kind::Text),
    ("stream", Kind::Text),
    ("concurrency", Kind::Count),
    ("key_concurrency", Kind::Count),
    ("max_retries", Kind::Number),
    ("retry_backoff_ms", Kind::Millis),
    ("retry_backoff_max_ms", Kind::Millis),
    ("batch_size", Kind::Count),
    ("max_batch", Kind::Count),
    ("linger_ms", Kind::Millis),
    ("deliver_to", Kind::Text),
    ("deliver_path", Kind::Text),
    ("delivery_timeout_ms", Kind::Millis),
    ("mode", Kind::Text),
    ("event_type", Kind::Text),
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

/// One setting's value and where it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Value {
    text: String,
    from: String,
}

/// Settings by listener, then by setting name.
type Raw = BTreeMap<String, BTreeMap<&'static str, Value>>;

fn invalid(
    at: impl Into<String>,
    value: impl Into<String>,
    expected: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        at: at.into(),
        value: value.into(),
        expected: expected.into(),
    }
}

/// A listener name as a variable spells it: upper case, `_` for anything but a letter or
/// digit (as `ConsumerApp`'s).
pub(crate) fn env_name(listener: &str) -> String {
    listener
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
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
}

/// The listeners and the file's `[bridge]` section.
pub(crate) fn load(src: &Sources<'_>) -> Result<(Vec<Route>, FileBridge), ConfigError> {
    let mut raw = Raw::new();
    for name in &src.declared {
        raw.entry(name.clone()).or_default();
    }
    let mut bridge = FileBridge::default();
    match src.file {
        Some((path, text)) => bridge = read_file(&mut raw, path, text, src.profile)?,
        None => {
            if let Some(p) = src.profile {
                return Err(invalid(
                    "RSC_PROFILE",
                    p,
                    "a profile of a configuration file (RSC_CONFIG_FILE is not set)",
                ));
            }
        }
    }
    read_env(&mut raw, &src.env)?;
    if raw.is_empty() {
        return Err(ConfigError::NoListeners);
    }
    let routes = raw
        .iter()
        .map(|(name, settings)| route(name, settings))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((routes, bridge))
}

/// The file: `[bridge]`, `[listeners.*]`, then the profile's `[profiles.<p>.listeners.*]`.
fn read_file(
    raw: &mut Raw,
    path: &str,
    text: &str,
    profile: Option<&str>,
) -> Result<FileBridge, ConfigError> {
    let doc: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::File {
            path: path.to_owned(),
            reason: e.message().to_owned(),
        })?;
    if let Some(key) = doc
        .keys()
        .find(|k| !matches!(k.as_str(), "listeners" | "profiles" | "bridge"))
    {
        return Err(invalid(
            format!("{path}: {key}"),
            "…",
            "a [bridge], [listeners.<name>] or [profiles.<profile>] section",
        ));
    }
    let bridge = read_bridge(table(doc.get("bridge"), &format!("{path}: bridge"))?, path)?;
    read_section(
        raw,
        table(doc.get("listeners"), &format!("{path}: listeners"))?,
        &format!("{path}: listeners"),
        true,
    )?;
    let profiles = table(doc.get("profiles"), &format!("{path}: profiles"))?;
    if let Some(p) = profile {
        let Some(chosen) = profiles.and_then(|t| t.get(p)) else {
            let known: Vec<&str> = profiles
                .iter()
                .flat_map(|t| t.keys())
                .map(String::as_str)
                .collect();
            return Err(invalid(
                "RSC_PROFILE",
                p,
                format!("a profile of {path} ({})", known.join(", ")),
            ));
        };
        let at = format!("{path}: profiles.{p}");
        let chosen = table(Some(chosen), &at)?.expect("a value");
        if let Some(other) = chosen.keys().find(|k| *k != "listeners") {
            return Err(invalid(
                format!("{at}.{other}"),
                "…",
                "a [profiles.<profile>.listeners.<name>] section",
            ));
        }
        let at = format!("{at}.listeners");
        read_section(raw, table(chosen.get("listeners"), &at)?, &at, false)?;
    }
    Ok(bridge)
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

/// One `listeners` table; `declares`: it may name new listeners (the base section; a
/// profile only overrides the listeners the file declares).
fn read_section(
    raw: &mut Raw,
    section: Option<&toml::Table>,
    at: &str,
    declares: bool,
) -> Result<(), ConfigError> {
    for (name, settings) in section.into_iter().flatten() {
        let at = format!("{at}.{name}");
        if !declares && !raw.contains_key(name) {
            let names: Vec<&str> = raw.keys().map(String::as_str).collect();
            return Err(invalid(
                at,
                "…",
                format!("a listener of the file ({})", names.join(", ")),
            ));
        }
        let settings = table(Some(settings), &at)?.expect("a value");
        let entry = raw.entry(name.clone()).or_default();
        for (key, value) in settings {
            let from = format!("{at}.{key}");
            let Some(&(setting, _)) = SETTINGS.iter().find(|(s, _)| s == key) else {
                return Err(invalid(
                    from,
                    value.to_string(),
                    format!("one of {}", setting_list(false)),
                ));
            };
            let text = match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                other => return Err(invalid(from, other.to_string(), "a string or an integer")),
            };
            entry.insert(setting, Value { text, from });
        }
    }
    Ok(())
}

/// `RSC_LISTENER_<NAME>_<SETTING>` of each listener; any other `RSC_LISTENER_*` is an error.
fn read_env(raw: &mut Raw, env: &[(String, String)]) -> Result<(), ConfigError> {
    let names: Vec<String> = raw.keys().cloned().collect();
    for (var, value) in env.iter().filter(|(k, _)| k.starts_with(ENV_PREFIX)) {
        let found = names.iter().find_map(|name| {
            let rest = var[ENV_PREFIX.len()..]
                .strip_prefix(&env_name(name))?
                .strip_prefix('_')?;
            let setting = SETTINGS
                .iter()
                .find(|(s, _)| s.to_ascii_uppercase() == rest)?;
            Some((name.clone(), setting.0))
        });
        let Some((name, setting)) = found else {
            let listeners: Vec<String> = names.iter().map(|n| env_name(n)).collect();
            return Err(invalid(
                var.clone(),
                value.clone(),
                format!(
                    "RSC_LISTENER_<listener>_<setting> of a listener ({}) and a setting ({})",
                    listeners.join(", "),
                    setting_list(true)
                ),
            ));
        };
        if !value.trim().is_empty() {
            let v = Value {
                text: value.trim().to_owned(),
                from: var.clone(),
            };
            raw.entry(name).or_default().insert(setting, v);
        }
    }
    Ok(())
}

/// The settings' names, as the file spells them or (`upper`) as variables do.
fn setting_list(upper: bool) -> String {
    let names: Vec<String> = SETTINGS
        .iter()
        .map(|(s, _)| {
            if upper {
                s.to_ascii_uppercase()
            } else {
                (*s).to_owned()
            }
        })
        .collect();
    names.join(", ")
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

/// The listener `name` from its settings.
fn route(name: &str, s: &BTreeMap<&'static str, Value>) -> Result<Route, ConfigError> {
    let text = |k: &str| s.get(k).map(|v| v.text.clone());
    let num = |k: &'static str| -> Result<Option<u64>, ConfigError> {
        let Some(v) = s.get(k) else { return Ok(None) };
        let kind = SETTINGS
            .iter()
            .find(|(n, _)| *n == k)
            .map_or(Kind::Number, |(_, k)| *k);
        match v.text.parse::<u64>() {
            Ok(n) if !(kind == Kind::Count && n == 0) && n <= u64::from(u32::MAX) => Ok(Some(n)),
            _ => Err(invalid(&v.from, &v.text, kind.expected())),
        }
    };
    let ms = |k: &'static str, d: Duration| -> Result<Duration, ConfigError> {
        Ok(num(k)?.map_or(d, Duration::from_millis))
    };
    let stream = text("stream").ok_or(ConfigError::Missing {
        listener: name.to_owned(),
        setting: "stream",
    })?;
    let deliver_to = s.get("deliver_to").ok_or(ConfigError::Missing {
        listener: name.to_owned(),
        setting: "deliver_to",
    })?;
    let path = s.get("deliver_path").map(|v| v.text.clone());
    let mode = match s.get("mode") {
        None => Mode::Binary,
        Some(v) => match v.text.as_str() {
            "binary" => Mode::Binary,
            "structured" => Mode::Structured,
            _ => return Err(invalid(&v.from, &v.text, "binary or structured")),
        },
    };
    let retry_min = ms("retry_backoff_ms", Duration::from_millis(200))?;
    Ok(Route {
        name: name.to_owned(),
        group: text("group").unwrap_or_else(|| name.to_owned()),
        stream,
        deliver_to: parse_deliver_to(&deliver_to.text, path, &deliver_to.from)?,
        concurrency: num("concurrency")?.map_or(1, |n| n as u32),
        key_concurrency: num("key_concurrency")?.map_or(1, |n| n as usize),
        max_batch: num("max_batch")?.map(|n| n as usize),
        max_retries: num("max_retries")?.map_or(3, |n| n as u32),
        retry_backoff: (
            retry_min,
            ms("retry_backoff_max_ms", Duration::from_secs(10))?.max(retry_min),
        ),
        batch_size: num("batch_size")?.map(|n| n as usize),
        linger: ms("linger_ms", Duration::ZERO)?,
        delivery_timeout: ms("delivery_timeout_ms", Duration::from_secs(30))?
            .max(Duration::from_millis(1)),
        mode,
        event_type: text("event_type").unwrap_or_else(|| DEFAULT_EVENT_TYPE.to_owned()),
    })
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
