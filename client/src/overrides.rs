//! Listener settings from outside the code (GUIDE "Configuration outside the code"): the
//! environment and an optional TOML file override what `#[stream_listener]` (or the
//! [`Listener`] builder) says, so that one binary serves several deployments.
//!
//! Precedence, highest first: a program's flag `--listener-<name>-<setting>` (for programs
//! with a command line that read them, as `rsc-bridge`), an environment variable
//! `RSC_LISTENER_<NAME>_<SETTING>`, the
//! file's section of the profile `RSC_PROFILE` names (`[profiles.<profile>.listeners.<name>]`),
//! the file's `[listeners.<name>]` section, then the code. `<name>` is the listener's name
//! (the group unless `name = "…"` says otherwise); in a variable it is upper-cased, with
//! every character other than a letter or digit written `_`; in a flag it is lower-cased, with
//! `-` for them (and `-` for the `_` of the setting). The file is the one
//! `RSC_CONFIG_FILE` names (or [`crate::ConsumerAppBuilder::config_file`]).
//!
//! Nothing is ignored silently: a value of the wrong kind, a setting or section that names
//! no listener of the app, an unknown setting or profile is a [`ConfigError`] naming the
//! variable or the file's key.
//!
//! [`ListenerOverrides`] is this layering as a public reader, for programs that run
//! listeners from their own configuration (`rsc-bridge`) and add settings of their own.

use crate::error::ConfigError;
use crate::listener::Listener;
use std::collections::BTreeMap;
use std::time::Duration;

/// The prefix of the override variables.
const ENV_PREFIX: &str = "RSC_LISTENER_";
/// The prefix of the override flags.
const FLAG_PREFIX: &str = "--listener-";
/// The variable that selects a profile of the file.
pub(crate) const PROFILE_ENV: &str = "RSC_PROFILE";
/// The variable that names the file.
pub(crate) const FILE_ENV: &str = "RSC_CONFIG_FILE";

/// What a listener setting's value must be; [`ListenerSettings`]' getters check it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingKind {
    /// Any text (a name, a URL…: the caller checks it).
    Text,
    /// A whole number, at least 1.
    Count,
    /// A whole number, 0 or more.
    Number,
    /// A duration in whole milliseconds.
    Millis,
    /// Retry stages' delays, e.g. `10s,1m` (see [`rsc_protocol::retry::parse_stages`]).
    Delays,
}

impl SettingKind {
    fn expected(self) -> &'static str {
        match self {
            SettingKind::Text => "a string",
            SettingKind::Count => "a whole number of at least 1",
            SettingKind::Number => "a whole number",
            SettingKind::Millis => "a whole number of milliseconds",
            SettingKind::Delays => {
                "delays separated by commas, e.g. 10s,1m (empty: retries in place)"
            }
        }
    }
}

/// Every setting `ConsumerApp` applies, as the file spells it (a variable upper-cases it).
/// A new setting is a row here and a line of [`ListenerOverrides::apply`].
const SETTINGS: &[(&str, SettingKind)] = &[
    ("group", SettingKind::Text),
    ("stream", SettingKind::Text),
    ("concurrency", SettingKind::Count),
    ("key_concurrency", SettingKind::Count),
    ("max_retries", SettingKind::Number),
    ("retry_backoff_ms", SettingKind::Millis),
    ("retry_backoff_max_ms", SettingKind::Millis),
    ("retry_stages", SettingKind::Delays),
    ("batch_size", SettingKind::Count),
    ("max_batch", SettingKind::Count),
    ("linger_ms", SettingKind::Millis),
];

/// One value, its kind, and where it was read (the variable, or the file and key).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Value {
    text: String,
    from: String,
    kind: SettingKind,
}

/// Where listener settings are read, and what a program adds to `ConsumerApp`'s settings
/// and file sections. The layering (variable over profile over file) and every refusal are
/// [`ListenerOverrides::read`]'s.
#[derive(Debug, Default, Clone, Copy)]
pub struct OverrideSources<'a> {
    /// The environment's variables; those beginning `RSC_LISTENER_` are read, the others
    /// ignored.
    pub env: &'a [(String, String)],
    /// The program's per-listener flags, each as its name (`--listener-billing-concurrency`)
    /// and value; they override the variables. Unlike a variable's, an empty value is a
    /// value (checked as any other).
    pub flags: &'a [(String, String)],
    /// The TOML file: its path (named in errors) and its text.
    pub file: Option<(&'a str, &'a str)>,
    /// The profile whose `[profiles.<profile>.listeners.<name>]` sections apply
    /// (`RSC_PROFILE`); it must be one of the file's.
    pub profile: Option<&'a str>,
    /// The listeners that exist without the file.
    pub listeners: &'a [&'a str],
    /// Whether the file's `[listeners.<name>]` sections declare more listeners; if not, a
    /// section naming a listener not in `listeners` is an error. A profile's section or a
    /// variable never declares one.
    pub file_declares: bool,
    /// Settings read beyond `ConsumerApp`'s, with their kinds.
    pub extra_settings: &'a [(&'static str, SettingKind)],
    /// Top-level sections of the file that the caller reads itself (e.g. `bridge`); any
    /// other section but `listeners` and `profiles` is an error.
    pub extra_sections: &'a [&'a str],
}

/// The settings of every listener, layered: variable over profile section over file section
/// (module docs). [`Self::of`] gives one listener's.
#[derive(Debug, Default, Clone)]
pub struct ListenerOverrides {
    /// The settings of each listener (every listener, with settings or not).
    by_listener: BTreeMap<String, BTreeMap<&'static str, Value>>,
    /// The listeners in the order they were named (for errors).
    names: Vec<String>,
}

/// One listener's settings, from [`ListenerOverrides::of`]. A getter answers `None` for a
/// setting that is not set, and an error naming where the value was read when it is not of
/// the setting's kind.
#[derive(Debug, Clone, Copy)]
pub struct ListenerSettings<'a> {
    settings: Option<&'a BTreeMap<&'static str, Value>>,
}

impl Value {
    /// The value as a whole number of its kind, converted to `T`.
    fn number<T: TryFrom<u64>>(&self) -> Result<T, ConfigError> {
        let bad = |expected: &str| invalid(&self.from, &self.text, expected);
        let n: u64 = (self.text.parse()).map_err(|_| bad(self.kind.expected()))?;
        if self.kind == SettingKind::Count && n == 0 {
            return Err(bad(self.kind.expected()));
        }
        T::try_from(n).map_err(|_| bad("a smaller number"))
    }

    /// The value as whole milliseconds.
    fn millis(&self) -> Result<Duration, ConfigError> {
        self.number().map(Duration::from_millis)
    }

    /// The value as retry stages' delays (`10s,1m`; empty: none).
    fn delays(&self) -> Result<Vec<Duration>, ConfigError> {
        rsc_protocol::retry::parse_stages(&self.text)
            .map_err(|why| invalid(&self.from, &self.text, why))
    }
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
    pub(crate) fn resolve(&self, names: &[&str]) -> Result<ListenerOverrides, ConfigError> {
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

/// How a layer above the file names a listener's setting: a variable or a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// `RSC_LISTENER_<NAME>_<SETTING>`: upper case, `_` for anything but a letter or digit.
    Variable,
    /// `--listener-<name>-<setting>`: lower case, `-` for anything but a letter or digit.
    Flag,
}

impl Spelling {
    fn prefix(self) -> &'static str {
        match self {
            Spelling::Variable => ENV_PREFIX,
            Spelling::Flag => FLAG_PREFIX,
        }
    }

    /// What errors show as the expected shape.
    fn pattern(self) -> &'static str {
        match self {
            Spelling::Variable => "a variable RSC_LISTENER_<listener>_<setting>",
            Spelling::Flag => "a flag --listener-<listener>-<setting>",
        }
    }

    /// A listener's name or a setting as this layer writes it.
    fn listener(self, name: &str) -> String {
        let (sep, case): (char, fn(&char) -> char) = match self {
            Spelling::Variable => ('_', char::to_ascii_uppercase),
            Spelling::Flag => ('-', char::to_ascii_lowercase),
        };
        name.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    case(&c)
                } else {
                    sep
                }
            })
            .collect()
    }

    /// The variable or flag of `setting` of `listener`.
    fn name(self, listener: &str, setting: &str) -> String {
        let sep = if self == Spelling::Variable { '_' } else { '-' };
        let (prefix, listener, setting) = (
            self.prefix(),
            self.listener(listener),
            self.listener(setting),
        );
        format!("{prefix}{listener}{sep}{setting}")
    }
}

/// A listener name as a variable spells it: upper case, `_` for anything but a letter or
/// digit.
#[cfg(test)]
fn env_name(listener: &str) -> String {
    Spelling::Variable.listener(listener)
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

/// `ConsumerApp`'s overrides of the listeners `names` from the variables `env` (with
/// `RSC_PROFILE`) and the file `(path, text)`.
pub(crate) fn resolve(
    env: &[(String, String)],
    file: Option<(&str, &str)>,
    names: &[&str],
) -> Result<ListenerOverrides, ConfigError> {
    let profile = env
        .iter()
        .find(|(n, v)| n == PROFILE_ENV && !v.trim().is_empty())
        .map(|(_, v)| v.trim());
    ListenerOverrides::read(&OverrideSources {
        env,
        file,
        profile,
        listeners: names,
        ..OverrideSources::default()
    })
}

impl ListenerOverrides {
    /// The settings `ConsumerApp` applies to a listener, as the file spells them (a variable
    /// upper-cases them), with their kinds.
    pub const SETTINGS: &'static [(&'static str, SettingKind)] = SETTINGS;

    /// The prefix of the per-listener flags ([`Self::flag`]): an argument beginning with it is
    /// one, for [`OverrideSources::flags`].
    pub const FLAG_PREFIX: &'static str = FLAG_PREFIX;

    /// The variable that sets `setting` of `listener`: `RSC_LISTENER_<NAME>_<SETTING>`, the
    /// name upper-cased with `_` for every character other than a letter or a digit
    /// (`billing-eu`, `key_concurrency` → `RSC_LISTENER_BILLING_EU_KEY_CONCURRENCY`).
    pub fn variable(listener: &str, setting: &str) -> String {
        Spelling::Variable.name(listener, setting)
    }

    /// The flag that sets `setting` of `listener`: the variable's name without `RSC_`, in
    /// lower case with `-` for `_` (`billing-eu`, `key_concurrency` →
    /// `--listener-billing-eu-key-concurrency`), as each of the coordinator's flags is its
    /// variable's.
    pub fn flag(listener: &str, setting: &str) -> String {
        Spelling::Flag.name(listener, setting)
    }

    /// Reads the settings of the listeners of `src`, highest precedence last applied: the
    /// file's `[listeners.<name>]` sections, the profile's
    /// `[profiles.<profile>.listeners.<name>]`, the variables
    /// `RSC_LISTENER_<NAME>_<SETTING>` (an empty one is not set), then the flags
    /// `--listener-<name>-<setting>`.
    ///
    /// # Errors
    /// [`ConfigError::ConfigFile`] for a file that is not TOML; [`ConfigError::InvalidSetting`]
    /// naming the variable, the flag or the file's key for an unknown section, listener,
    /// setting or profile, a variable or flag that two listeners' names make ambiguous, a flag
    /// given twice, a profile without a file, or a value that is neither a string nor an
    /// integer.
    /// The values' kinds are checked when read ([`ListenerSettings`]).
    pub fn read(src: &OverrideSources<'_>) -> Result<Self, ConfigError> {
        let mut out = ListenerOverrides::default();
        for name in src.listeners {
            out.declare(name);
        }
        match src.file {
            Some((path, text)) => out.read_file(src, path, text)?,
            None => {
                if let Some(p) = src.profile {
                    return Err(invalid(
                        PROFILE_ENV,
                        p,
                        format!("a profile of a configuration file ({FILE_ENV} is not set)"),
                    ));
                }
            }
        }
        out.read_layer(src, Spelling::Variable, src.env)?;
        out.read_layer(src, Spelling::Flag, src.flags)?;
        Ok(out)
    }

    /// Every listener: those of the sources, then those the file declares, by name.
    pub fn listeners(&self) -> impl Iterator<Item = &str> {
        self.by_listener.keys().map(String::as_str)
    }

    /// The settings of `listener` (none for a listener it does not know).
    pub fn of(&self, listener: &str) -> ListenerSettings<'_> {
        ListenerSettings {
            settings: self.by_listener.get(listener),
        }
    }

    fn declare(&mut self, name: &str) {
        if !self.by_listener.contains_key(name) {
            self.by_listener.insert(name.to_owned(), BTreeMap::new());
            self.names.push(name.to_owned());
        }
    }

    /// The file's `[listeners.*]` sections, then the profile's.
    fn read_file(
        &mut self,
        src: &OverrideSources<'_>,
        path: &str,
        text: &str,
    ) -> Result<(), ConfigError> {
        let doc: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::ConfigFile {
                    path: path.to_owned(),
                    reason: e.message().to_owned(),
                })?;
        let known =
            |k: &str| matches!(k, "listeners" | "profiles") || src.extra_sections.contains(&k);
        if let Some(key) = doc.keys().find(|k| !known(k)) {
            return Err(invalid(
                format!("{path}: {key}"),
                "…",
                sections(src.extra_sections),
            ));
        }
        let profiles = table(doc.get("profiles"), &format!("{path}: profiles"))?;
        if let Some(p) = src.profile {
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
        let at = format!("{path}: listeners");
        self.read_section(
            src,
            table(doc.get("listeners"), &at)?,
            &at,
            src.file_declares,
        )?;
        if let Some(p) = src.profile {
            let chosen = &profiles.expect("checked above")[p];
            let at = format!("{path}: profiles.{p}.listeners");
            self.read_section(src, table(chosen.get("listeners"), &at)?, &at, false)?;
        }
        Ok(())
    }

    /// One `listeners` table: a table of settings per listener name; `declares`: a name
    /// the sources do not know is a new listener (else an error).
    fn read_section(
        &mut self,
        src: &OverrideSources<'_>,
        section: Option<&toml::Table>,
        at: &str,
        declares: bool,
    ) -> Result<(), ConfigError> {
        for (name, settings) in section.into_iter().flatten() {
            let at = format!("{at}.{name}");
            if declares {
                self.declare(name);
            } else if !self.by_listener.contains_key(name) {
                return Err(invalid(
                    at,
                    "…",
                    format!("a listener of the app ({})", self.names.join(", ")),
                ));
            }
            let settings = table(Some(settings), &at)?.expect("a value");
            for (key, value) in settings {
                let from = format!("{at}.{key}");
                let Some(&(setting, kind)) = all_settings(src).find(|(s, _)| s == key) else {
                    return Err(invalid(
                        from,
                        value.to_string(),
                        format!("one of {}", setting_list(src, None)),
                    ));
                };
                let text = match value {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Integer(i) => i.to_string(),
                    other => {
                        return Err(invalid(from, other.to_string(), "a string or an integer"));
                    }
                };
                self.set(name, setting, Value { text, from, kind });
            }
        }
        Ok(())
    }

    /// The variables (or the flags) of each listener, by their spelling's names; any other
    /// beginning with the spelling's prefix is an error (a misspelt listener or setting), and
    /// so is one that two listeners' names spell alike (`billing` and `billing-key` both
    /// spell `RSC_LISTENER_BILLING_KEY_CONCURRENCY`).
    fn read_layer(
        &mut self,
        src: &OverrideSources<'_>,
        spelling: Spelling,
        pairs: &[(String, String)],
    ) -> Result<(), ConfigError> {
        let mut seen: Vec<&str> = Vec::new();
        for (var, value) in pairs
            .iter()
            .filter(|(k, _)| k.starts_with(spelling.prefix()))
        {
            let found: Vec<(&String, &(&'static str, SettingKind))> = (self.names.iter())
                .flat_map(|name| all_settings(src).map(move |s| (name, s)))
                .filter(|(name, (setting, _))| spelling.name(name, setting) == *var)
                .collect();
            let (name, &(setting, kind)) = match found.as_slice() {
                [one] => *one,
                [] => {
                    let listeners: Vec<String> =
                        self.names.iter().map(|n| spelling.listener(n)).collect();
                    return Err(invalid(
                        var.clone(),
                        value.clone(),
                        format!(
                            "{} of a listener of the app ({}) and a setting ({})",
                            spelling.pattern(),
                            listeners.join(", "),
                            setting_list(src, spelling),
                        ),
                    ));
                }
                [..] => {
                    let meanings: Vec<String> = (found.iter())
                        .map(|(name, (setting, _))| format!("{setting} of {name}"))
                        .collect();
                    return Err(invalid(
                        var.clone(),
                        value.clone(),
                        format!(
                            "one setting of one listener, not one of {}: rename a listener",
                            meanings.join(" or ")
                        ),
                    ));
                }
            };
            if spelling == Spelling::Flag {
                if seen.contains(&var.as_str()) {
                    return Err(invalid(var.clone(), value.clone(), "the flag once"));
                }
                seen.push(var);
            }
            let text = value.trim();
            if !text.is_empty() || spelling == Spelling::Flag {
                let (text, from) = (text.to_owned(), var.clone());
                let name = name.clone();
                self.set(&name, setting, Value { text, from, kind });
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
        for (&setting, v) in settings {
            let s = &mut listener.settings;
            match setting {
                "group" => listener.group = v.text.clone(),
                "stream" => listener.stream = v.text.clone(),
                "concurrency" => listener.concurrency = v.number()?,
                "key_concurrency" => s.key_concurrency = v.number()?,
                "max_retries" => s.max_retries = v.number()?,
                "retry_backoff_ms" => s.retry_min = v.millis()?,
                "retry_backoff_max_ms" => s.retry_max = v.millis()?,
                "retry_stages" => s.retry_stages = v.delays()?,
                "batch_size" => s.batch_size = v.number()?,
                "max_batch" => {
                    s.max_batch = v.number()?;
                    s.batch_size = s.max_batch;
                }
                "linger_ms" => s.linger = v.millis()?,
                _ => unreachable!("every entry of SETTINGS is applied"),
            }
        }
        let s = &mut listener.settings;
        s.retry_max = s.retry_max.max(s.retry_min);
        Ok(())
    }
}

impl<'a> ListenerSettings<'a> {
    /// `setting`'s value as written.
    pub fn text(&self, setting: &str) -> Option<&'a str> {
        self.value(setting).map(|v| v.text.as_str())
    }

    /// Where `setting`'s value was read: the variable (`RSC_LISTENER_BILLING_MODE`) or the
    /// file and key (`rsc.toml: listeners.billing.mode`), for the caller's own errors.
    pub fn source(&self, setting: &str) -> Option<&'a str> {
        self.value(setting).map(|v| v.from.as_str())
    }

    /// `setting` as a whole number of its kind (a [`SettingKind::Count`] at least 1),
    /// converted to `T`.
    ///
    /// # Errors
    /// [`ConfigError::InvalidSetting`] naming where the value was read.
    pub fn number<T: TryFrom<u64>>(&self, setting: &str) -> Result<Option<T>, ConfigError> {
        self.value(setting).map(Value::number).transpose()
    }

    /// `setting` as whole milliseconds.
    ///
    /// # Errors
    /// [`ConfigError::InvalidSetting`] naming where the value was read.
    pub fn millis(&self, setting: &str) -> Result<Option<Duration>, ConfigError> {
        self.value(setting).map(Value::millis).transpose()
    }

    /// `setting` as retry stages' delays (`10s,1m`; an empty value: none).
    ///
    /// # Errors
    /// [`ConfigError::InvalidSetting`] naming where the value was read.
    pub fn delays(&self, setting: &str) -> Result<Option<Vec<Duration>>, ConfigError> {
        self.value(setting).map(Value::delays).transpose()
    }

    fn value(&self, setting: &str) -> Option<&'a Value> {
        self.settings?.get(setting)
    }
}

/// `ConsumerApp`'s settings, then the caller's.
fn all_settings<'s>(
    src: &OverrideSources<'s>,
) -> impl Iterator<Item = &'s (&'static str, SettingKind)> {
    SETTINGS.iter().chain(src.extra_settings)
}

/// The settings' names, as the file spells them (`None`) or as variables or flags do.
fn setting_list(src: &OverrideSources<'_>, spelling: impl Into<Option<Spelling>>) -> String {
    let spelling = spelling.into();
    let names: Vec<String> = all_settings(src)
        .map(|(s, _)| spelling.map_or_else(|| (*s).to_owned(), |sp| sp.listener(s)))
        .collect();
    names.join(", ")
}

/// What a top-level key of the file must be: the caller's sections, `[listeners.<name>]` or
/// `[profiles.<profile>]`.
fn sections(extra: &[&str]) -> String {
    let mut all: Vec<String> = extra.iter().map(|s| format!("[{s}]")).collect();
    all.push("[listeners.<name>]".to_owned());
    let listed = all.join(", ");
    format!("a {listed} or [profiles.<profile>] section")
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
