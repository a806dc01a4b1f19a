use rsc_client::prelude::*;

#[derive(serde::Deserialize)]
struct Order {
    id: u64,
}

#[stream_listener(group = "billing", stream = "orders", concurrency = 4)]
async fn on_order(msg: Message<Order>) -> Result<(), HandlerError> {
    let _ = msg.payload().id;
    Ok(())
}

#[stream_listener(
    group = "audit",
    stream = "orders",
    name = "audit-raw",
    ack = "manual",
    max_retries = 0
)]
async fn on_raw(msg: rsc_client::Message<Raw>) -> Result<(), HandlerError> {
    msg.ack().await?;
    Ok(())
}

#[stream_listener(group = "mailer", stream = "orders", retry_stages = "10s,1m,2h")]
async fn on_mail(msg: Message<Order>) -> Result<(), HandlerError> {
    let _ = msg.payload().id;
    Ok(())
}

pub(crate) fn main() {
    // Still plain functions.
    let _ = on_order(Message::test(Order { id: 1 }));
    let _ = on_raw(Message::test(Raw(vec![])));
    let _ = on_mail(Message::test(Order { id: 2 }));
}
