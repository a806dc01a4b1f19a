use rsc_client::prelude::*;

#[stream_listener(group = "billing", stream = "orders")]
async fn on_order(msg: Message<String>) -> Result<(), u32> {
    let _ = msg;
    Ok(())
}

fn main() {}
