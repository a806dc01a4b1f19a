//! Coordinated retention (PROTOCOL §18): trimming the shard keys of the data Redis up to what
//! every group of the stream has handled.
//!
//! [`point`] decides, per shard, what may go (pure); `trimmer` reads what it needs and
//! runs the `XTRIM`s after each lag sampling tick (the history sampler of `metrics`), for
//! the shards that tick read. `redrive` republishes the dead letters of a group.

pub mod point;
pub(crate) mod redrive;
pub(crate) mod trimmer;
mod view;

pub(crate) use view::blocked_by;
