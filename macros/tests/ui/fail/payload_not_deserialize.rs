use rsc_client::prelude::*;

// No `#[derive(serde::Deserialize)]`: the payload cannot be decoded.
struct Order {
    id: u64,
}

#[stream_listener(group = "billing", stream = "orders")]
async fn on_order(msg: Message<Order>) -> Result<(), HandlerError> {
    println!("{}", msg.payload().id);
    Ok(())
}

fn main() {}
