//! Surviving a lost metadata store (PROTOCOL §2.3): a recovery copy of every stream
//! document and of every group's settings, kept in the data Redis, from which a coordinator
//! restores what the store lost.
//!
//! - [`copy`]: what the copy holds and how a document is rebuilt from it (pure);
//! - [`mirror`]: the copy's keys in the data Redis, and [`CopyLayer`], the store decorator
//!   that writes the copy after each committed change and removes a group's copy before
//!   its document is deleted.
//!
//! The restore itself is the service's (`service/recovery.rs`): on a request that finds a
//! document missing, and in a periodic check that compares the copy's names with the
//! store's.

pub mod copy;
pub mod mirror;

pub use copy::{EPOCH_GAP, GroupCopy, StreamCopy};
pub use mirror::{CopyLayer, RecoveryCopy};

use clap::ValueEnum;
use serde::Deserialize;

/// What a coordinator does when the store lost a document its recovery copy holds
/// (`--store-recovery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RecoveryMode {
    /// Restore it at once (logged, audited, counted).
    #[default]
    Auto,
    /// Refuse, log and count; `rsc-coordinator store restore` restores.
    Manual,
}
