use rsc_client::prelude::*;

#[stream_listener(stream = "orders")]
async fn on_order(msg: Message<String>) -> Result<(), HandlerError> {
    let _ = msg;
    Ok(())
}

fn main() {}
