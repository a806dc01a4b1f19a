use rsc_client::prelude::*;

#[stream_listener(group = "billing team", stream = "orders")]
async fn on_order(msg: Message<String>) -> Result<(), HandlerError> {
    let _ = msg;
    Ok(())
}

fn main() {}
