use rsc_client::prelude::*;

#[stream_listener(group = "billing", stream = "orders", linger_ms = 20)]
async fn on_order(msg: Message<String>) -> Result<(), HandlerError> {
    let _ = msg;
    Ok(())
}

fn main() {}
