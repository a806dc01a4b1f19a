use rsc_client::prelude::*;

struct Pool;
struct Settings;

#[stream_listener(group = "billing", stream = "orders")]
async fn with_state(
    msg: Message<u64>,
    pool: Data<Pool>,
    cfg: Data<Settings>,
) -> Result<(), HandlerError> {
    let _ = (msg, pool, cfg);
    Ok(())
}

#[stream_listener(group = "audit", stream = "orders")]
async fn with_anyhow(msg: Message<u64>) -> anyhow::Result<()> {
    anyhow::ensure!(*msg.payload() > 0, "zero");
    Ok(())
}

#[stream_listener(group = "warehouse", stream = "orders", batch = 100, linger_ms = 20)]
async fn batch(batch: Batch<u64>, pool: Data<Pool>) -> Result<(), BatchError> {
    let _ = (batch, pool);
    Ok(())
}

#[stream_listener(group = "ledger", stream = "orders", batch = 10)]
async fn batch_one_verdict(batch: Batch<u64>) -> Result<(), HandlerError> {
    let _ = batch;
    Ok(())
}

pub(crate) fn main() {
    let _ = with_state(Message::test(1), Data::new(Pool), Data::new(Settings));
    let _ = batch(Batch::test(vec![1, 2]), Data::new(Pool));
}
