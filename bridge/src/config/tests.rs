//! The bridge's configuration: the file, its profile, the variables, and every refusal.

use super::*;

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

const FILE: &str = r#"
[bridge]
listen = "127.0.0.1:0"
publish_body_limit = 1000

[listeners.billing]
stream = "orders"
deliver_to = "http://127.0.0.1:8080/events"
key_concurrency = 4

[listeners.audit]
group = "audit-g"
stream = "orders"
deliver_to = "unix:/run/app.sock"
deliver_path = "/batch"
max_batch = 20
mode = "structured"

[profiles.prod.listeners.billing]
concurrency = 3
"#;

#[test]
fn the_file_the_profile_and_the_variables_layer() {
    let vars = env(&[
        ("RSC_LISTENER_BILLING_MAX_RETRIES", "7"),
        ("RSC_LISTENER_AUDIT_DELIVERY_TIMEOUT_MS", "500"),
    ]);
    let src = Sources {
        file: Some(("b.toml", FILE)),
        profile: Some("prod"),
        declared: vec![],
        env: vars,
        flags: vec![],
    };
    let (routes, bridge) = load(&src).unwrap();
    assert_eq!(bridge.listen.as_deref(), Some("127.0.0.1:0"));
    assert_eq!(bridge.publish_body_limit, Some(1000));
    let audit = &routes[0];
    assert_eq!(
        (audit.name.as_str(), audit.group.as_str()),
        ("audit", "audit-g")
    );
    assert_eq!(
        audit.deliver_to,
        DeliverTo::Unix {
            socket: "/run/app.sock".into(),
            path: "/batch".into()
        }
    );
    assert_eq!((audit.max_batch, audit.mode), (Some(20), Mode::Structured));
    assert_eq!(audit.delivery_timeout, Duration::from_millis(500));
    let billing = &routes[1];
    assert_eq!(billing.group, "billing", "the group defaults to the name");
    assert_eq!(
        (
            billing.concurrency,
            billing.key_concurrency,
            billing.max_retries
        ),
        (3, 4, 7)
    );
    assert_eq!(billing.mode, Mode::Binary);
    assert_eq!(billing.event_type, DEFAULT_EVENT_TYPE);
}

#[test]
fn a_listener_may_come_from_variables_alone() {
    let vars = env(&[
        ("RSC_LISTENER_PAY_2_STREAM", "payments"),
        ("RSC_LISTENER_PAY_2_DELIVER_TO", "http://localhost:9000/"),
    ]);
    let src = Sources {
        declared: vec!["pay-2".into()],
        env: vars,
        ..Sources::default()
    };
    let (routes, _) = load(&src).unwrap();
    assert_eq!(routes[0].stream, "payments");
    assert_eq!(
        routes[0].deliver_to,
        DeliverTo::Http("http://localhost:9000/".into())
    );
}

#[test]
fn mistakes_are_refused_with_where_they_were_read() {
    let err = |vars: &[(&str, &str)], file: Option<&str>| {
        let src = Sources {
            file: file.map(|f| ("b.toml", f)),
            declared: vec!["x".into()],
            env: env(vars),
            ..Sources::default()
        };
        load(&src).unwrap_err().to_string()
    };
    let base = [
        ("RSC_LISTENER_X_STREAM", "s"),
        ("RSC_LISTENER_X_DELIVER_TO", "http://127.0.0.1:1/"),
    ];
    let with = |extra: (&'static str, &'static str)| {
        let mut v = base.to_vec();
        v.push(extra);
        v
    };
    assert!(err(&with(("RSC_LISTENER_Y_STREAM", "s")), None).contains("RSC_LISTENER_Y_STREAM"));
    assert!(err(&with(("RSC_LISTENER_X_COLOUR", "red")), None).contains("RSC_LISTENER_X_COLOUR"));
    assert!(err(&with(("RSC_LISTENER_X_CONCURRENCY", "0")), None).contains("at least 1"));
    assert!(err(&with(("RSC_LISTENER_X_MODE", "fancy")), None).contains("binary or structured"));
    assert!(
        err(
            &with(("RSC_LISTENER_X_DELIVER_TO", "http://10.0.0.1/")),
            None
        )
        .contains("loopback")
    );
    assert!(
        err(
            &with(("RSC_LISTENER_X_DELIVER_TO", "https://127.0.0.1/")),
            None
        )
        .contains("loopback")
    );
    assert!(
        err(
            &with(("RSC_LISTENER_X_DELIVER_TO", "unix:relative.sock")),
            None
        )
        .contains("absolute")
    );
    assert!(err(&base[..1], None).contains("deliver_to is required"));
    assert!(
        err(&base, Some("[listeners.x]\nretries = 3\n")).contains("b.toml: listeners.x.retries")
    );
    assert!(err(&base, Some("[server]\n")).contains("b.toml: server"));
    assert!(err(&base, Some("[bridge]\nlisten = 3\n")).contains("bridge.listen"));
    let none = Sources::default();
    assert_eq!(load(&none).unwrap_err(), ConfigError::NoListeners);
    let unknown_profile = Sources {
        file: Some(("b.toml", FILE)),
        profile: Some("dev"),
        ..Sources::default()
    };
    assert!(
        load(&unknown_profile)
            .unwrap_err()
            .to_string()
            .contains("prod")
    );
}

#[test]
fn every_setting_of_consumer_app_changes_the_route() {
    let base = [
        ("RSC_LISTENER_X_STREAM", "s"),
        ("RSC_LISTENER_X_DELIVER_TO", "http://127.0.0.1:1/"),
    ];
    let route = |extra: Option<(String, &str)>| {
        let mut vars = env(&base);
        vars.extend(extra.map(|(k, v)| (k, v.to_owned())));
        let src = Sources {
            declared: vec!["x".into()],
            env: vars,
            ..Sources::default()
        };
        load(&src).unwrap().0.remove(0)
    };
    let default = route(None);
    for (setting, kind) in rsc_client::ListenerOverrides::SETTINGS {
        let value = match kind {
            SettingKind::Text => "other",
            SettingKind::Delays => "7s",
            _ => "7",
        };
        let var = format!("RSC_LISTENER_X_{}", setting.to_ascii_uppercase());
        assert_ne!(route(Some((var, value))), default, "{setting} is ignored");
    }
}

/// Every per-listener setting, as its flag, its variable (listener `pay-eu`) and a value that
/// is not the default: the names are pinned here, so renaming one breaks this test.
const NAMES: &[(&str, &str, &str)] = &[
    ("--listener-pay-eu-group", "RSC_LISTENER_PAY_EU_GROUP", "g2"),
    (
        "--listener-pay-eu-stream",
        "RSC_LISTENER_PAY_EU_STREAM",
        "s2",
    ),
    (
        "--listener-pay-eu-concurrency",
        "RSC_LISTENER_PAY_EU_CONCURRENCY",
        "3",
    ),
    (
        "--listener-pay-eu-key-concurrency",
        "RSC_LISTENER_PAY_EU_KEY_CONCURRENCY",
        "3",
    ),
    (
        "--listener-pay-eu-max-retries",
        "RSC_LISTENER_PAY_EU_MAX_RETRIES",
        "7",
    ),
    (
        "--listener-pay-eu-retry-backoff-ms",
        "RSC_LISTENER_PAY_EU_RETRY_BACKOFF_MS",
        "7",
    ),
    (
        "--listener-pay-eu-retry-backoff-max-ms",
        "RSC_LISTENER_PAY_EU_RETRY_BACKOFF_MAX_MS",
        "70000",
    ),
    (
        "--listener-pay-eu-retry-stages",
        "RSC_LISTENER_PAY_EU_RETRY_STAGES",
        "7s,1m",
    ),
    (
        "--listener-pay-eu-batch-size",
        "RSC_LISTENER_PAY_EU_BATCH_SIZE",
        "7",
    ),
    (
        "--listener-pay-eu-max-batch",
        "RSC_LISTENER_PAY_EU_MAX_BATCH",
        "7",
    ),
    (
        "--listener-pay-eu-linger-ms",
        "RSC_LISTENER_PAY_EU_LINGER_MS",
        "7",
    ),
    (
        "--listener-pay-eu-deliver-to",
        "RSC_LISTENER_PAY_EU_DELIVER_TO",
        "unix:/other.sock",
    ),
    (
        "--listener-pay-eu-deliver-path",
        "RSC_LISTENER_PAY_EU_DELIVER_PATH",
        "/events",
    ),
    (
        "--listener-pay-eu-delivery-timeout-ms",
        "RSC_LISTENER_PAY_EU_DELIVERY_TIMEOUT_MS",
        "7",
    ),
    (
        "--listener-pay-eu-mode",
        "RSC_LISTENER_PAY_EU_MODE",
        "structured",
    ),
    (
        "--listener-pay-eu-event-type",
        "RSC_LISTENER_PAY_EU_EVENT_TYPE",
        "other",
    ),
];

fn pay_eu(vars: &[(&str, &str)], flags: &[(&str, &str)]) -> Result<Route, ConfigError> {
    let mut all = vec![
        ("RSC_LISTENER_PAY_EU_STREAM", "s"),
        ("RSC_LISTENER_PAY_EU_DELIVER_TO", "unix:/run/app.sock"),
    ];
    all.extend_from_slice(vars);
    let src = Sources {
        declared: vec!["pay-eu".into()],
        env: env(&all),
        flags: env(flags),
        ..Sources::default()
    };
    load(&src).map(|(mut routes, _)| routes.remove(0))
}

#[test]
fn each_setting_has_a_flag_named_as_its_variable_and_the_flag_wins() {
    let every: Vec<&str> = (ListenerOverrides::SETTINGS.iter().chain(SETTINGS))
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(
        NAMES.len(),
        every.len(),
        "a setting without its row in NAMES"
    );
    let default = pay_eu(&[], &[]).unwrap();
    for (&(flag, var, value), setting) in NAMES.iter().zip(&every) {
        assert_eq!(ListenerOverrides::flag("pay-eu", setting), flag);
        assert_eq!(ListenerOverrides::variable("pay-eu", setting), var);
        let by_var = pay_eu(&[(var, value)], &[]).unwrap();
        assert_ne!(by_var, default, "{var} is ignored");
        assert_eq!(
            pay_eu(&[], &[(flag, value)]).unwrap(),
            by_var,
            "{flag} is not {var}"
        );
    }
    // Flag over variable over file.
    let file = "[listeners.pay-eu]\nstream = \"s\"\ndeliver_to = \"http://127.0.0.1:1/\"\nmax_retries = 1\nmode = \"structured\"\n";
    let src = Sources {
        file: Some(("b.toml", file)),
        env: env(&[
            ("RSC_LISTENER_PAY_EU_MAX_RETRIES", "2"),
            ("RSC_LISTENER_PAY_EU_MODE", "binary"),
        ]),
        flags: env(&[("--listener-pay-eu-max-retries", "3")]),
        ..Sources::default()
    };
    let route = load(&src).unwrap().0.remove(0);
    assert_eq!((route.max_retries, route.mode), (3, Mode::Binary));
    // A flag's error names the flag.
    let e = pay_eu(&[], &[("--listener-pay-eu-mode", "fancy")]).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("--listener-pay-eu-mode=\"fancy\""),
        "{e}"
    );
    let e = pay_eu(&[], &[("--listener-pay-eu-concurency", "2")]).unwrap_err();
    assert!(
        e.to_string().contains("key-concurrency"),
        "lists the settings as flags: {e}"
    );
}

#[test]
fn listener_flags_are_taken_out_of_the_command_line() {
    let args = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
    let (rest, flags) = split_listener_flags(args(&[
        "rsc-bridge",
        "--listeners",
        "a,b",
        "--listener-a-concurrency=2",
        "--listen",
        "127.0.0.1:0",
        "--listener-b-deliver-to",
        "http://127.0.0.1:1/x=y",
        "--listener-a-retry-stages=",
        "--",
        "--listener-a-mode",
    ]))
    .unwrap();
    assert_eq!(
        rest,
        args(&[
            "rsc-bridge",
            "--listeners",
            "a,b",
            "--listen",
            "127.0.0.1:0",
            "--",
            "--listener-a-mode"
        ])
    );
    assert_eq!(
        flags,
        env(&[
            ("--listener-a-concurrency", "2"),
            ("--listener-b-deliver-to", "http://127.0.0.1:1/x=y"),
            ("--listener-a-retry-stages", ""),
        ])
    );
    for missing in [
        &["x", "--listener-a-mode"][..],
        &["x", "--listener-a-mode", "--listen"],
    ] {
        let e = split_listener_flags(args(missing)).unwrap_err();
        assert!(e.to_string().starts_with("--listener-a-mode"), "{e}");
    }
}
