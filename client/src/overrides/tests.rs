use super::*;
use crate::prelude::*;

async fn on_order(_msg: Message<serde_json::Value>) -> Result<(), HandlerError> {
    Ok(())
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn listener() -> Listener {
    Listener::new("billing", "orders", on_order)
        .concurrency(2)
        .max_retries(3)
}

const FILE: &str = r#"
[listeners.billing]
stream = "orders-file"
concurrency = 4
key_concurrency = 8
retry_backoff_ms = 50
retry_backoff_max_ms = 2000

[profiles.eu.listeners.billing]
stream = "orders-eu"
max_retries = 9

[profiles.us.listeners.billing]
group = "billing-us"
"#;

#[test]
fn the_variables_override_the_profile_which_overrides_the_file_which_overrides_the_code() {
    let names = ["billing"];
    let vars = env(&[
        ("RSC_PROFILE", "eu"),
        ("RSC_LISTENER_BILLING_CONCURRENCY", "6"),
        ("RSC_LISTENER_BILLING_LINGER_MS", "20"),
    ]);
    let o = resolve(&vars, Some(("rsc.toml", FILE)), &names).expect("valid");
    let mut l = listener();
    o.apply(&mut l).expect("applies");
    assert_eq!(l.group, "billing", "not overridden: the code's");
    assert_eq!(l.stream, "orders-eu", "the profile over the file");
    assert_eq!(l.concurrency, 6, "the variable over the file");
    assert_eq!(l.settings.key_concurrency, 8, "the file over the code");
    assert_eq!(l.settings.max_retries, 9, "the profile over the code");
    assert_eq!(l.settings.retry_min, Duration::from_millis(50));
    assert_eq!(l.settings.retry_max, Duration::from_millis(2000));
    assert_eq!(l.settings.linger, Duration::from_millis(20));

    // Without a profile: the file's base section only.
    let o = resolve(&[], Some(("rsc.toml", FILE)), &names).expect("valid");
    let mut l = listener();
    o.apply(&mut l).expect("applies");
    assert_eq!(
        (l.stream.as_str(), l.concurrency, l.settings.max_retries),
        ("orders-file", 4, 3)
    );

    // Neither: the code's values stay.
    let o = resolve(&[], None, &names).expect("nothing to read");
    let mut l = listener();
    o.apply(&mut l).expect("applies");
    assert_eq!((l.stream.as_str(), l.concurrency), ("orders", 2));
}

#[test]
fn a_variable_names_its_listener_upper_cased_with_underscores() {
    assert_eq!(env_name("billing-eu.v2"), "BILLING_EU_V2");
    let vars = env(&[
        ("RSC_LISTENER_BILLING_EU_KEY_CONCURRENCY", "3"),
        ("RSC_LISTENER_BILLING_MAX_BATCH", "100"),
        ("RSC_LISTENER_BILLING_BATCH_SIZE", ""),
    ]);
    let o = resolve(&vars, None, &["billing", "billing-eu"]).expect("valid");
    let mut eu = Listener::new("billing-eu", "orders", on_order);
    o.apply(&mut eu).expect("applies");
    assert_eq!(eu.settings.key_concurrency, 3);
    assert_eq!(eu.settings.max_batch, 64, "the other listener's variable");
    let mut b = listener();
    o.apply(&mut b).expect("applies");
    assert_eq!((b.settings.max_batch, b.settings.batch_size), (100, 100));
    assert_eq!(
        b.settings.key_concurrency, 1,
        "an empty variable is not set"
    );
}

fn err(vars: &[(&str, &str)], file: Option<&str>) -> ConfigError {
    let names = ["billing"];
    let o = match resolve(&env(vars), file.map(|f| ("rsc.toml", f)), &names) {
        Ok(o) => o,
        Err(e) => return e,
    };
    o.apply(&mut listener()).expect_err("a bad value")
}

fn setting_of(e: &ConfigError) -> &str {
    match e {
        ConfigError::InvalidSetting { setting, .. } => setting,
        other => panic!("not an invalid setting: {other}"),
    }
}

#[test]
fn a_bad_value_is_an_error_naming_the_variable_or_the_files_key() {
    let e = err(&[("RSC_LISTENER_BILLING_CONCURRENCY", "four")], None);
    assert_eq!(setting_of(&e), "RSC_LISTENER_BILLING_CONCURRENCY");
    assert_eq!(
        e.to_string(),
        "RSC_LISTENER_BILLING_CONCURRENCY=\"four\": expected a whole number of at least 1"
    );
    let e = err(&[("RSC_LISTENER_BILLING_KEY_CONCURRENCY", "0")], None);
    assert_eq!(setting_of(&e), "RSC_LISTENER_BILLING_KEY_CONCURRENCY");
    let e = err(&[], Some("[listeners.billing]\nmax_retries = -1\n"));
    assert_eq!(setting_of(&e), "rsc.toml: listeners.billing.max_retries");
    let e = err(&[], Some("[listeners.billing]\nlinger_ms = 1.5\n"));
    assert_eq!(setting_of(&e), "rsc.toml: listeners.billing.linger_ms");
}

#[test]
fn what_names_no_listener_setting_or_profile_is_an_error_not_ignored() {
    let e = err(&[("RSC_LISTENER_BILING_CONCURRENCY", "2")], None);
    assert_eq!(setting_of(&e), "RSC_LISTENER_BILING_CONCURRENCY");
    assert!(e.to_string().contains("(BILLING)"), "{e}");
    let e = err(&[("RSC_LISTENER_BILLING_RETRIES", "2")], None);
    assert!(
        e.to_string().contains("MAX_RETRIES"),
        "lists the settings: {e}"
    );
    let e = err(&[], Some("[listeners.shipping]\nconcurrency = 2\n"));
    assert_eq!(setting_of(&e), "rsc.toml: listeners.shipping");
    let e = err(&[], Some("[listeners.billing]\nconcurency = 2\n"));
    assert_eq!(setting_of(&e), "rsc.toml: listeners.billing.concurency");
    let e = err(&[("RSC_PROFILE", "apac")], Some(FILE));
    assert_eq!(setting_of(&e), "RSC_PROFILE");
    assert!(e.to_string().contains("eu, us"), "names the profiles: {e}");
    let e = err(&[("RSC_PROFILE", "eu")], None);
    assert_eq!(setting_of(&e), "RSC_PROFILE");
    let e = err(&[], Some("listeners = 3\n"));
    assert_eq!(setting_of(&e), "rsc.toml: listeners");
    let e = err(&[], Some("[listener.billing]\n"));
    assert_eq!(setting_of(&e), "rsc.toml: listener");
    let e = err(&[], Some("[listeners.billing\n"));
    assert!(matches!(e, ConfigError::ConfigFile { .. }), "{e}");
}

#[test]
fn retry_stages_are_delays_separated_by_commas() {
    let names = ["billing"];
    let vars = env(&[("RSC_LISTENER_BILLING_RETRY_STAGES", "10s, 1m")]);
    let o = resolve(&vars, None, &names).expect("valid");
    let mut l = listener();
    o.apply(&mut l).expect("applies");
    assert_eq!(
        l.settings.retry_stages,
        [Duration::from_secs(10), Duration::from_secs(60)]
    );
    // The file may turn them off for a deployment: an empty list retries in place.
    let file = "[listeners.billing]\nretry_stages = \"\"\n";
    let o = resolve(&[], Some(("rsc.toml", file)), &names).expect("valid");
    let mut l = listener().retry_stages(&[Duration::from_secs(1)]);
    o.apply(&mut l).expect("applies");
    assert!(l.settings.retry_stages.is_empty());

    let e = err(&[("RSC_LISTENER_BILLING_RETRY_STAGES", "10s,0s")], None);
    assert_eq!(setting_of(&e), "RSC_LISTENER_BILLING_RETRY_STAGES");
    assert!(e.to_string().contains("at least 1ms"), "{e}");
}

#[test]
fn a_flag_is_the_variable_in_lower_case_with_dashes_and_overrides_it() {
    assert_eq!(
        ListenerOverrides::variable("billing-eu.v2", "key_concurrency"),
        "RSC_LISTENER_BILLING_EU_V2_KEY_CONCURRENCY"
    );
    assert_eq!(
        ListenerOverrides::flag("billing-eu.v2", "key_concurrency"),
        "--listener-billing-eu-v2-key-concurrency"
    );
    assert_eq!(
        ListenerOverrides::flag("Pay_2", "linger_ms"),
        "--listener-pay-2-linger-ms"
    );
    let vars = env(&[
        ("RSC_LISTENER_BILLING_CONCURRENCY", "6"),
        ("RSC_LISTENER_BILLING_MAX_RETRIES", "5"),
    ]);
    let flags = env(&[
        ("--listener-billing-concurrency", "7"),
        ("--listener-billing-retry-stages", ""),
    ]);
    let file = "[listeners.billing]\nconcurrency = 4\nretry_stages = \"1s\"\nlinger_ms = 9\n";
    let o = ListenerOverrides::read(&OverrideSources {
        env: &vars,
        flags: &flags,
        file: Some(("rsc.toml", file)),
        listeners: &["billing"],
        ..OverrideSources::default()
    })
    .expect("valid");
    let mut l = listener();
    o.apply(&mut l).expect("applies");
    assert_eq!(l.concurrency, 7, "the flag over the variable and the file");
    assert_eq!(
        l.settings.max_retries, 5,
        "the variable where no flag is given"
    );
    assert_eq!(
        l.settings.linger,
        Duration::from_millis(9),
        "the file below both"
    );
    assert!(
        l.settings.retry_stages.is_empty(),
        "an empty flag is a value: no stages"
    );
    assert_eq!(
        o.of("billing").source("concurrency"),
        Some("--listener-billing-concurrency")
    );
}

#[test]
fn a_flag_or_variable_two_listeners_spell_alike_or_naming_nothing_is_refused() {
    let read = |vars: &[(&str, &str)], flags: &[(&str, &str)]| {
        let (vars, flags) = (env(vars), env(flags));
        ListenerOverrides::read(&OverrideSources {
            env: &vars,
            flags: &flags,
            listeners: &["billing", "billing-key"],
            ..OverrideSources::default()
        })
        .map(|_| ())
    };
    let e = read(&[("RSC_LISTENER_BILLING_KEY_CONCURRENCY", "2")], &[]).unwrap_err();
    assert_eq!(setting_of(&e), "RSC_LISTENER_BILLING_KEY_CONCURRENCY");
    assert!(
        e.to_string()
            .contains("key_concurrency of billing or concurrency of billing-key"),
        "{e}"
    );
    let e = read(&[], &[("--listener-billing-key-concurrency", "2")]).unwrap_err();
    assert_eq!(setting_of(&e), "--listener-billing-key-concurrency");
    let e = read(&[], &[("--listener-biling-concurrency", "2")]).unwrap_err();
    assert_eq!(setting_of(&e), "--listener-biling-concurrency");
    assert!(e.to_string().contains("(billing, billing-key)"), "{e}");
    assert!(e.to_string().contains("key-concurrency"), "{e}");
    let e = read(&[], &[("--listener-billing-concurrency", "four")]);
    assert!(e.is_ok(), "kinds are checked when read");
    let twice = [
        ("--listener-billing-max-retries", "2"),
        ("--listener-billing-max-retries", "3"),
    ];
    let e = read(&[], &twice).unwrap_err();
    assert!(e.to_string().contains("the flag once"), "{e}");
    assert!(read(&[("RSC_LISTENER_BILLING_MAX_RETRIES", "2")], &[]).is_ok());
}
