//! Hooks that optional parts of the client register with the consumer core, so that the core
//! never calls up into them: the `ops` feature's metrics recorder registers
//! [`on_shard_released`] to drop a shard's series once this process gives the shard up.

use std::sync::OnceLock;

/// Called with the group, the stream and the shard when this process stops working a shard
/// (revoked, abandoned, fenced, stepping aside or shutting down).
pub(crate) type ShardReleased = fn(&str, &str, u32);

static SHARD_RELEASED: OnceLock<ShardReleased> = OnceLock::new();

/// Registers the shard-released hook; the first registration stands (the process has one
/// metrics recorder).
#[cfg_attr(not(feature = "ops"), allow(dead_code))]
pub(crate) fn on_shard_released(hook: ShardReleased) {
    let _ = SHARD_RELEASED.set(hook);
}

/// Tells the registered hook, if any, that `shard` of `stream` in `group` was given up.
pub(crate) fn shard_released(group: &str, stream: &str, shard: u32) {
    if let Some(hook) = SHARD_RELEASED.get() {
        hook(group, stream, shard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    static SEEN: AtomicU32 = AtomicU32::new(0);

    #[test]
    fn the_registered_hook_hears_of_a_released_shard() {
        on_shard_released(|group, stream, shard| {
            assert_eq!((group, stream), ("g", "s"));
            SEEN.store(shard + 1, Ordering::SeqCst);
        });
        shard_released("g", "s", 6);
        assert_eq!(SEEN.load(Ordering::SeqCst), 7);
    }
}
