use rsc_client::prelude::*;

struct Pool;

#[stream_listener(group = "billing", stream = "orders")]
async fn on_order(msg: Message<String>, pool: &Pool) -> Result<(), HandlerError> {
    let _ = (msg, pool);
    Ok(())
}

fn main() {}
