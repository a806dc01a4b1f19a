//! The member runtime: one logical member of a consumer group (PROTOCOL §5, client side).
//!
//! A pure machine ([`machine`]: phase, assignment, lease and self-fencing, the revocation and
//! drain deadlines, rejoin and static-membership rules; events in, steps out, the time passed
//! in) and its driver ([`driver`]: the one task per member that does the I/O). The machine's
//! lifecycle is a [`phase::Phase`].

mod driver;
mod machine;
mod phase;
#[cfg(test)]
mod sim;

pub(crate) use driver::MemberRuntime;
