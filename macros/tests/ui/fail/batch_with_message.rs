use rsc_client::prelude::*;

#[stream_listener(group = "billing", stream = "orders", batch = 100)]
async fn on_orders(msg: Message<String>) -> Result<(), HandlerError> {
    let _ = msg;
    Ok(())
}

fn main() {}
