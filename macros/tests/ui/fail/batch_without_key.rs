use rsc_client::prelude::*;

#[stream_listener(group = "billing", stream = "orders")]
async fn on_orders(batch: Batch<String>) -> Result<(), BatchError> {
    let _ = batch;
    Ok(())
}

fn main() {}
