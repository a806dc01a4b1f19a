use rsc_client::prelude::*;
use std::rc::Rc;

// The handler's future holds an `Rc` across an `.await`: it cannot move between the
// runtime's threads.
#[stream_listener(group = "billing", stream = "orders")]
async fn on_order(msg: Message<serde_json::Value>) -> Result<(), HandlerError> {
    let seen = Rc::new(msg.id().to_owned());
    tokio::task::yield_now().await;
    println!("{seen}");
    Ok(())
}

fn main() {}
