use rsc_client::prelude::*;

#[stream_listener(group = "billing", stream = "orders")]
async fn on_order(payload: String) -> Result<(), HandlerError> {
    let _ = payload;
    Ok(())
}

fn main() {}
