use rsc_client::prelude::*;

#[stream_listener(group = "billing", stream = "orders", retry_stages = "10s,1x")]
async fn on_order(msg: Message<String>) -> Result<(), HandlerError> {
    let _ = msg;
    Ok(())
}

fn main() {}
