//! Where a member is in its lifecycle (PROTOCOL §5, client side): a pure value the member's
//! machine moves on (see [`super::machine`]).

use crate::error::CoordinatorError;

/// Why a worker was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// The coordinator no longer assigns the shard.
    Revoked,
    /// The lease ran out (self-fence).
    Fenced,
    /// The member was fenced or forgotten by the coordinator and must rejoin.
    Rejoin,
    /// The app is shutting down (or the member hit a fatal error).
    Shutdown,
    /// The data Redis has not answered for longer than the grace: the member gives its
    /// shards back.
    Aside,
}

/// Where a member is in its lifecycle. The heartbeat answers, the lease, the workers and the
/// app's shutdown move it on; each variant carries what is only true in it.
#[derive(Debug)]
pub(crate) enum Phase {
    /// No successful heartbeat yet: joins with epoch 0, owning nothing.
    Joining,
    /// A member of the group: works what the last answer assigned (revoking what it no longer
    /// assigns before starting what it newly assigns).
    Stable,
    /// Self-fenced: the lease ran out and every worker was stopped; a successful heartbeat
    /// resumes with what it assigns.
    Fenced,
    /// The coordinator no longer knows the member at its epoch (or its group): every worker
    /// stops, then it joins again with epoch 0, owning nothing.
    Rejoining,
    /// The data Redis has not answered for longer than the grace (see [`crate::consumer::health`]):
    /// every worker stops, the member leaves the group (heartbeating meanwhile, unless
    /// `left`), then waits, out of the group, until the data Redis answers and joins again.
    Aside { left: bool },
    /// Shutting down (the app's signal, or a failure): every worker finishes, then the member
    /// ends as `exit` says.
    Leaving {
        /// Still a member: heartbeats go on while the workers finish (keeping the lease). Not
        /// once the coordinator dropped the membership (a join would report shards that are
        /// still stopping) or refused the member for good.
        heartbeats: bool,
        /// How the member ends once every worker finished.
        exit: Exit,
    },
}

/// How a member ends.
#[derive(Debug, Default)]
pub(crate) enum Exit {
    /// Leave the group (−1, or −2 for a static member), then end well.
    #[default]
    Leave,
    /// A shard worker panicked (outside the handler): `run()` fails with it (the shard and
    /// the panic's message).
    Panicked(u32, String),
    /// The coordinator refused the member for good: no heartbeat, no leave; `run()` fails.
    Rejected(CoordinatorError),
}

impl Phase {
    /// Whether a heartbeat may go out now (none in flight), given whether every worker has
    /// stopped and whether the data Redis answers. A rejoin waits until the workers have
    /// stopped, so that it reports owning nothing; a join (epoch 0) waits until the data
    /// Redis answers, so that a member that cannot read never takes shards a healthy member
    /// could work.
    pub(crate) fn may_heartbeat(&self, workers_stopped: bool, data_up: bool) -> bool {
        match self {
            Phase::Stable | Phase::Fenced => true,
            Phase::Joining => data_up,
            Phase::Rejoining => workers_stopped && data_up,
            Phase::Aside { left } => !left,
            Phase::Leaving { heartbeats, .. } => *heartbeats,
        }
    }

    /// A successful heartbeat answer: a member working its assignment (unless leaving).
    pub(crate) fn answered(&mut self) {
        if !matches!(self, Phase::Aside { .. } | Phase::Leaving { .. }) {
            *self = Phase::Stable;
        }
    }

    /// Whether the member is in the group with shards it may be working: the one that gives
    /// them back when the data Redis stays unreachable.
    pub(crate) fn may_step_aside(&self) -> bool {
        matches!(self, Phase::Stable | Phase::Fenced)
    }

    /// The data Redis stayed unreachable past the grace.
    pub(crate) fn step_aside(&mut self) {
        if self.may_step_aside() {
            *self = Phase::Aside { left: false };
        }
    }

    /// The lease ran out.
    pub(crate) fn lease_ran_out(&mut self) {
        if let Phase::Stable = self {
            *self = Phase::Fenced;
        }
    }

    /// The coordinator no longer knows the member at its epoch, or its group.
    pub(crate) fn membership_lost(&mut self) {
        match self {
            Phase::Leaving { heartbeats, .. } => *heartbeats = false,
            // Out of the group already, as it was going to be.
            Phase::Aside { .. } => *self = Phase::Aside { left: true },
            _ => *self = Phase::Rejoining,
        }
    }

    /// The member ends, once every worker stopped, as `how` says: it leaves (the app shuts
    /// down), or `run()` fails (the coordinator refused it for good, or a shard worker
    /// panicked).
    pub(crate) fn end(&mut self, how: Exit) {
        if !matches!(self, Phase::Leaving { .. }) {
            // Forgotten by the coordinator: no heartbeat for its old membership.
            let heartbeats = !matches!(self, Phase::Rejoining | Phase::Aside { left: true });
            *self = Phase::Leaving {
                heartbeats,
                exit: Exit::Leave,
            };
        }
        if let Phase::Leaving { heartbeats, exit } = self {
            // Refused for good: no more heartbeats.
            *heartbeats &= !matches!(how, Exit::Rejected(_));
            // A failure outranks leaving, and the first panic every other end.
            if !matches!(exit, Exit::Panicked(..)) && !matches!(how, Exit::Leave) {
                *exit = how;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejection() -> CoordinatorError {
        CoordinatorError::Unexpected {
            url: "http://coordinator".into(),
            status: 400,
            body: "refused".into(),
        }
    }

    /// A leaving phase: whether it heartbeats, and how it ends.
    fn leaving(phase: &Phase) -> Option<(bool, &Exit)> {
        match phase {
            Phase::Leaving { heartbeats, exit } => Some((*heartbeats, exit)),
            _ => None,
        }
    }

    /// Whether the member works its assignment (starts and restarts workers).
    fn works(phase: &Phase) -> bool {
        matches!(phase, Phase::Stable)
    }

    #[test]
    fn an_aside_member_forgotten_or_shut_down_does_not_heartbeat_for_its_old_membership() {
        let mut p = Phase::Stable;
        p.step_aside();
        p.membership_lost();
        assert!(matches!(p, Phase::Aside { left: true }));
        p.end(Exit::Leave);
        assert!(matches!(leaving(&p), Some((false, Exit::Leave))));
        let mut p = Phase::Fenced;
        p.step_aside();
        p.end(Exit::Leave);
        assert!(
            matches!(leaving(&p), Some((true, Exit::Leave))),
            "leaves as it would have"
        );
        let mut p = Phase::Joining;
        p.step_aside();
        assert!(
            matches!(p, Phase::Joining),
            "owns nothing: nothing to give back"
        );
    }

    #[test]
    fn a_member_works_only_once_an_answer_made_it_stable() {
        let mut p = Phase::Joining;
        assert!(!works(&p) && p.may_heartbeat(true, true));
        assert!(
            !p.may_heartbeat(true, false),
            "no join before the data Redis answers"
        );
        p.lease_ran_out(); // nothing owned yet: nothing to fence
        assert!(matches!(p, Phase::Joining));
        p.answered();
        assert!(matches!(p, Phase::Stable) && works(&p) && p.may_heartbeat(false, false));
    }

    #[test]
    fn self_fence_stops_work_until_an_answer_resumes_it() {
        let mut p = Phase::Stable;
        p.lease_ran_out();
        assert!(matches!(p, Phase::Fenced));
        // Fenced, it keeps heartbeating (with its workers stopping) to get the lease back.
        assert!(!works(&p) && p.may_heartbeat(false, false));
        p.answered();
        assert!(matches!(p, Phase::Stable));
    }

    #[test]
    fn a_rejoin_waits_for_every_worker_then_joins_owning_nothing() {
        for mut p in [Phase::Joining, Phase::Stable, Phase::Fenced] {
            p.membership_lost();
            assert!(matches!(p, Phase::Rejoining));
            assert!(!works(&p));
            assert!(
                !p.may_heartbeat(false, true),
                "not while workers still stop"
            );
            assert!(p.may_heartbeat(true, true));
            assert!(
                !p.may_heartbeat(true, false),
                "no join before the data Redis answers"
            );
            p.lease_ran_out();
            assert!(matches!(p, Phase::Rejoining));
            p.answered();
            assert!(matches!(p, Phase::Stable));
        }
    }

    #[test]
    fn leaving_heartbeats_until_the_workers_stopped_and_nothing_brings_it_back() {
        let mut p = Phase::Fenced;
        p.end(Exit::Leave);
        assert!(matches!(leaving(&p), Some((true, Exit::Leave))));
        assert!(!works(&p) && p.may_heartbeat(false, false));
        p.answered();
        p.lease_ran_out();
        p.end(Exit::Leave);
        assert!(matches!(leaving(&p), Some((true, Exit::Leave))));
        // Forgotten while leaving: no join (it would report shards still stopping).
        p.membership_lost();
        assert!(matches!(leaving(&p), Some((false, Exit::Leave))));
        assert!(!p.may_heartbeat(false, true));
        p.answered();
        assert!(matches!(p, Phase::Leaving { .. }));
        let mut rejoining = Phase::Rejoining;
        rejoining.end(Exit::Leave);
        assert!(matches!(leaving(&rejoining), Some((false, Exit::Leave))));
    }

    #[test]
    fn a_rejected_member_stops_heartbeating_and_the_first_panic_is_reported() {
        let mut p = Phase::Stable;
        p.end(Exit::Rejected(rejection()));
        assert!(matches!(leaving(&p), Some((false, Exit::Rejected(_)))));
        assert!(!p.may_heartbeat(true, true));
        p.end(Exit::Panicked(3, "first".into()));
        p.end(Exit::Panicked(4, "second".into()));
        assert!(
            matches!(leaving(&p), Some((false, Exit::Panicked(3, m))) if m == "first"),
            "{p:?}"
        );
        let mut p = Phase::Joining;
        p.end(Exit::Panicked(1, "boom".into()));
        assert!(matches!(leaving(&p), Some((true, Exit::Panicked(1, _)))));
        assert!(p.may_heartbeat(false, false));
    }
}
