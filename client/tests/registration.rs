//! `#[stream_listener]` functions are collected without a central list, and the app's
//! configuration is checked before anything runs.

use rsc_client::prelude::*;
use rsc_client::{ClientError, ConfigError, ConsumerAppBuilder};

#[derive(Debug, serde::Deserialize)]
struct Order {
    id: u64,
}

#[stream_listener(group = "billing", stream = "orders", concurrency = 2)]
async fn on_order(msg: Message<Order>) -> Result<(), HandlerError> {
    if msg.payload().id == 0 {
        return Err(HandlerError::dead_letter("order 0 does not exist"));
    }
    Ok(())
}

#[stream_listener(group = "audit", stream = "orders", name = "audit-log", ack = "manual")]
async fn audit(msg: Message<Raw>) -> Result<(), HandlerError> {
    msg.ack().await?;
    Ok(())
}

fn builder() -> ConsumerAppBuilder {
    ConsumerAppBuilder::with_config(Default::default())
        .coordinator("http://127.0.0.1:7070,http://127.0.0.1:7071")
        .instance_id("10.1.2.3")
}

#[test]
fn annotated_functions_are_registered() {
    let app = builder().registered_listeners().build().unwrap();
    let mut ids = app.member_ids();
    ids.sort();
    assert_eq!(
        ids,
        [
            "10.1.2.3-audit-log-0",
            "10.1.2.3-billing-0",
            "10.1.2.3-billing-1"
        ]
    );
}

#[tokio::test]
async fn annotated_functions_stay_plain_functions() {
    assert!(on_order(Message::test(Order { id: 1 })).await.is_ok());
    let err = on_order(Message::test(Order { id: 0 })).await.unwrap_err();
    assert_eq!(err.action(), FailureAction::DeadLetter);
    assert!(audit(Message::test(Raw(b"x".to_vec()))).await.is_ok());
}

#[test]
fn misconfiguration_is_reported_before_running() {
    let err = |b: ConsumerAppBuilder| match b.build() {
        Err(ClientError::Config(e)) => e,
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("built"),
    };
    // Typed: tests match the variant, not the message (the message says what to set).
    let e = err(ConsumerAppBuilder::with_config(Default::default()).instance_id("x"));
    assert_eq!(e, ConfigError::NoCoordinator);
    assert!(e.to_string().contains("RSC_COORDINATOR_URL"));
    let e = err(ConsumerAppBuilder::with_config(Default::default()).coordinator("http://c"));
    assert_eq!(
        e,
        ConfigError::NoInstanceId {
            static_membership: false
        }
    );
    assert!(e.to_string().contains("POD_IP"));
    assert_eq!(err(builder()), ConfigError::NoListeners);
    let twice = builder()
        .listener(Listener::new("g", "s", on_order))
        .listener(Listener::new("g", "t", on_order));
    assert_eq!(err(twice), ConfigError::DuplicateListener("g".into()));
    assert!(matches!(
        err(builder().listener(Listener::new("bad group", "s", on_order))),
        ConfigError::InvalidName { kind: "group", .. }
    ));
    assert_eq!(
        err(builder().listener(Listener::new("g", "s", on_order).concurrency(0))),
        ConfigError::ZeroConcurrency("g".into())
    );
    let e = err(builder()
        .redis_url("nonsense://")
        .listener(Listener::new("g", "s", on_order)));
    assert!(
        matches!(&e, ConfigError::DataRedis(m) if m.contains("Redis URL")),
        "{e}"
    );
}
