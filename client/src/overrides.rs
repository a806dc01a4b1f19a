//! Listener settings from outside the code (GUIDE "Configuration outside the code"): the
//! environment and an optional TOML file override what `#[stream_listener]` (or the
//! [`Listener`] builder) says, so that one binary serves several deployments.
//!
//! Precedence, highest first: an environment variable `RSC_LISTENER_<NAME>_<SETTING>`, the
//! file's section of the profile `RSC_PROFILE` names (`[profiles.<profile>.listeners.<name>]`),
//! the file's `[listeners.<name>]` section, then the code. `<name>` is the listener's name
//! (the group unless `name = "…"` says otherwise); in a variable it is upper-cased, with
//! every character other than a letter or digit written `_`. The file is the one
//! `RSC_CONFIG_FILE` names (or [`crate::ConsumerAppBuilder::config_file`]).
//!
//! Nothing is ignored silently: a value of the wrong kind, a setting or section that names
//! no listener of the app, an unknown setting or profile is a [`ConfigError`] naming the
//! variable or the file's key.

use crate::error::ConfigError;
use crate::listener::Listener;
use std::collections::BTreeMap;
use std::time::Duration;

/// The prefix of the override variables.
const ENV_PREFIX: &str = "RSC_LISTENER_";
/// The variable that selects a profile of the file.
pub(crate) const PROFILE_ENV: &str = "RSC_PROFILE";
/// The variable that names the file.
pub(crate) const FILE_ENV: &str = "RSC_CONFIG_FILE";

/// What a setting's value must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A group or stream name (checked with the listener's, at build).
    Name,
    /// A whole number, at least 1.
    Count,
    /// A whole number, 0 or more.
    Number,
    /// A duration in whole milliseconds.
    Millis,
    /// Retry stages' delays, e.g. `10s,1m` (see [`rsc_protocol::retry::parse_stages`]).
    Delays,
}

impl Kind {
    fn expected(self) -> &'static str {
        match self {
            Kind::Name => "a name",
            Kind::Count => "a whole number of at least 1",
            Kind::Number => "a whole number",
            Kind::Millis => "a whole number of milliseconds",
            Kind::Delays => "delays separated by commas, e.g. 10s,1m (empty: retries in place)",
        }
    }
}

/// Every setting that may be overridden, as the file spells it (a variable upper-cases it).
const SETTINGS: &[(&str, Kind)] = &[
    ("group", Kind::Name),
    ("stream", Kind::Name),
    ("concurrency", Kind::Count),
    ("key_concurrency", Kind::Count),
    ("max_retries", Kind::Number),
    ("retry_backoff_ms", Kind::Millis),
    ("retry_backoff_max_ms", Kind::Millis),
    ("retry_stages", Kind::Delays),
    ("batch_size", Kind::Count),
    ("max_batch", Kind::Count),
    ("linger_ms", Kind::Millis),
];

/// One value and where it was read (the variable, or the file and key).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Value {
    text: String,
    from: String,
}

/// The overrides of every listener, by listener name then setting.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Overrides {
    by_listener: BTreeMap<String, BTreeMap<&'static str, Value>>,
}

/// Where the overrides are read: the environment's variables and the file, if any.
#[derive(Debug, Default, Clone)]
pub(crate) struct Sources {
    /// The variables (`RSC_LISTENER_*`, `RSC_PROFILE`, `RSC_CONFIG_FILE`).
    pub(crate) env: Vec<(String, String)>,
    /// The file's path (from `RSC_CONFIG_FILE` unless set by hand).
    pub(crate) file: Option<String>,
}

impl Sources {
    /// The process's environment.
    pub(crate) fn from_env() -> Self {
        let env: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX) || k == PROFILE_ENV || k == FILE_ENV)
            .collect();
        let file = env
            .iter()
            .find(|(k, v)| k == FILE_ENV && !v.trim().is_empty())
            .map(|(_, v)| v.trim().to_owned());
        Sources { env, file }
    }

    /// Reads the file (if any) and resolves the overrides of the listeners `names`.
    pub(crate) fn resolve(&self, names: &[&str]) -> Result<Overrides, ConfigError> {
        let text = match &self.file {
            None => None,
            Some(path) => Some((
                path.as_str(),
                std::fs::read_to_string(path).map_err(|e| ConfigError::ConfigFile {
                    path: path.clone(),
                    reason: e.to_string(),
                })?,
            )),
        };
        resolve(
            &self.env,
            text.as_ref().map(|(p, t)| (*p, t.as_str())),
            names,
        )
    }
}

/// A listener name as a variable spells it: upper case, `_` for anything but a letter or
/// digit.
fn env_name(listener: &str) -> String {
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

fn invalid(
    setting: impl Into<String>,
    value: impl Into<String>,
    expected: impl Into<String>,
) -> ConfigError {
    ConfigError::InvalidSetting {
        setting: setting.into(),
        value: value.into(),
        expected: expected.into(),
    }
}

/// The overrides of the listeners `names` from the variables `env` and the file
/// `(path, text)`, highest precedence last applied: file, profile, variables.
pub(crate) fn resolve(
    env: &[(String, String)],
    file: Option<(&str, &str)>,
    names: &[&str],
) -> Result<Overrides, ConfigError> {
    let get = |k: &str| {
        env.iter()
            .find(|(n, v)| n == k && !v.trim().is_empty())
            .map(|(_, v)| v.trim().to_owned())
    };
    let mut out = Overrides::default();
    let profile = get(PROFILE_ENV);
    match file {
        Some((path, text)) => out.read_file(path, text, profile.as_deref(), names)?,
        None => {
            if let Some(p) = profile {
                return Err(invalid(
                    PROFILE_ENV,
                    p,
                    format!("a profile of a configuration file ({FILE_ENV} is not set)"),
                ));
            }
        }
    }
    out.read_env(env, names)?;
    Ok(out)
}

impl Overrides {
    /// The file's `[listeners.*]` sections, then the profile's.
    fn read_file(
        &mut self,
        path: &str,
        text: &str,
        profile: Option<&str>,
        names: &[&str],
    ) -> Result<(), ConfigError> {
        let doc: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::ConfigFile {
                    path: path.to_owned(),
                    reason: e.message().to_owned(),
                })?;
        if let Some(key) = doc
            .keys()
            .find(|k| !matches!(k.as_str(), "listeners" | "profiles"))
        {
            return Err(invalid(
                format!("{path}: {key}"),
                "…",
                "a [listeners.<name>] or [profiles.<profile>] section",
            ));
        }
        let profiles = table(doc.get("profiles"), &format!("{path}: profiles"))?;
        if let Some(p) = profile {
            let known: Vec<&str> = profiles
                .iter()
                .flat_map(|t| t.keys())
                .map(String::as_str)
                .collect();
            if !known.contains(&p) {
                return Err(invalid(
                    PROFILE_ENV,
                    p,
                    format!("a profile of {path} ({})", known.join(", ")),
                ));
            }
        }
        for key in profiles.iter().flat_map(|t| t.iter()) {
            let at = format!("{path}: profiles.{}", key.0);
            let t = table(Some(key.1), &at)?.expect("a value");
            if let Some(other) = t.keys().find(|k| *k != "listeners") {
                return Err(invalid(
                    format!("{at}.{other}"),
                    "…",
                    "a [profiles.<profile>.listeners.<name>] section",
                ));
            }
        }
        let base = (doc.get("listeners"), format!("{path}: listeners"));
        let chosen = profile.map(|p| {
            let t = &profiles.expect("checked above")[p];
            (
                t.get("listeners"),
                format!("{path}: profiles.{p}.listeners"),
            )
        });
        for (section, at) in std::iter::once(base).chain(chosen) {
            self.read_section(table(section, &at)?, &at, names)?;
        }
        Ok(())
    }

    /// One `listeners` table: a table of settings per listener name.
    fn read_section(
        &mut self,
        section: Option<&toml::Table>,
        at: &str,
        names: &[&str],
    ) -> Result<(), ConfigError> {
        for (name, settings) in section.into_iter().flatten() {
            let at = format!("{at}.{name}");
            if !names.contains(&name.as_str()) {
                return Err(invalid(
                    at,
                    "…",
                    format!("a listener of the app ({})", names.join(", ")),
                ));
            }
            let settings = table(Some(settings), &at)?.expect("a value");
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
                    other => {
                        return Err(invalid(from, other.to_string(), "a string or an integer"));
                    }
                };
                self.set(name, setting, Value { text, from });
            }
        }
        Ok(())
    }

    /// `RSC_LISTENER_<NAME>_<SETTING>` of each listener; any other `RSC_LISTENER_*` is an
    /// error (a misspelt listener or setting).
    fn read_env(&mut self, env: &[(String, String)], names: &[&str]) -> Result<(), ConfigError> {
        for (var, value) in env.iter().filter(|(k, _)| k.starts_with(ENV_PREFIX)) {
            let found = names.iter().find_map(|name| {
                let rest = var[ENV_PREFIX.len()..]
                    .strip_prefix(&env_name(name))?
                    .strip_prefix('_')?;
                let setting = SETTINGS
                    .iter()
                    .find(|(s, _)| s.to_ascii_uppercase() == rest)?;
                Some((*name, setting.0))
            });
            let Some((name, setting)) = found else {
                let listeners: Vec<String> = names.iter().map(|n| env_name(n)).collect();
                return Err(invalid(
                    var.clone(),
                    value.clone(),
                    format!(
                        "a variable RSC_LISTENER_<listener>_<setting> of a listener of the app ({}) and \
                     a setting ({})",
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
                self.set(name, setting, v);
            }
        }
        Ok(())
    }

    fn set(&mut self, listener: &str, setting: &'static str, value: Value) {
        (self.by_listener.entry(listener.to_owned()).or_default()).insert(setting, value);
    }

    /// Applies the overrides of `listener`'s name to it.
    pub(crate) fn apply(&self, listener: &mut Listener) -> Result<(), ConfigError> {
        let Some(settings) = self.by_listener.get(&listener.name) else {
            return Ok(());
        };
        for (&setting, value) in settings {
            let kind = SETTINGS
                .iter()
                .find(|(s, _)| *s == setting)
                .map(|(_, k)| *k)
                .expect("known");
            let n = || -> Result<u64, ConfigError> {
                let n: u64 = (value.text.parse())
                    .map_err(|_| invalid(&value.from, &value.text, kind.expected()))?;
                if kind == Kind::Count && n == 0 {
                    return Err(invalid(&value.from, &value.text, kind.expected()));
                }
                Ok(n)
            };
            let count = || -> Result<usize, ConfigError> {
                usize::try_from(n()?)
                    .map_err(|_| invalid(&value.from, &value.text, "a smaller number"))
            };
            let s = &mut listener.settings;
            match setting {
                "group" => listener.group = value.text.clone(),
                "stream" => listener.stream = value.text.clone(),
                "concurrency" => {
                    listener.concurrency = u32::try_from(n()?)
                        .map_err(|_| invalid(&value.from, &value.text, "a smaller number"))?
                }
                "key_concurrency" => s.key_concurrency = count()?,
                "max_retries" => {
                    s.max_retries = u32::try_from(n()?)
                        .map_err(|_| invalid(&value.from, &value.text, "a smaller number"))?
                }
                "retry_backoff_ms" => s.retry_min = Duration::from_millis(n()?),
                "retry_backoff_max_ms" => s.retry_max = Duration::from_millis(n()?),
                "retry_stages" => {
                    s.retry_stages = rsc_protocol::retry::parse_stages(&value.text)
                        .map_err(|why| invalid(&value.from, &value.text, why))?
                }
                "batch_size" => s.batch_size = count()?,
                "max_batch" => {
                    s.max_batch = count()?;
                    s.batch_size = s.max_batch;
                }
                "linger_ms" => s.linger = Duration::from_millis(n()?),
                _ => unreachable!("every entry of SETTINGS is applied"),
            }
        }
        let s = &mut listener.settings;
        s.retry_max = s.retry_max.max(s.retry_min);
        Ok(())
    }
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

#[cfg(test)]
mod tests;
