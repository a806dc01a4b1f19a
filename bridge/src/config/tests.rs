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
