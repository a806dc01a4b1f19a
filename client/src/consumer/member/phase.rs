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
    /// leaves the group.
    Leaving {
        standing: Standing,
        /// A shard worker panicked (outside the handler): `run()` fails with it.
        panicked: Option<(u32, String)>,
    },
}

/// A leaving member's standing with the coordinator.
#[derive(Debug)]
pub(crate) enum Standing {
    /// Still a member: heartbeats go on while the workers finish (keeping the lease), then
    /// it leaves with epoch −1 (−2 for a static member).
    Member,
    /// The coordinator dropped the membership: no heartbeat (a join would report shards that
    /// are still stopping).
    Forgotten,
    /// The coordinator refused the member for good: no heartbeat, no leave; `run()` fails.
    Rejected(CoordinatorError),
}

impl Phase {
    pub(crate) fn leaving() -> Self {
        Phase::Leaving {
            standing: Standing::Member,
            panicked: None,
        }
    }

    pub(crate) fn is_leaving(&self) -> bool {
        matches!(self, Phase::Leaving { .. })
    }

    /// Whether the member works its assignment (starts and restarts workers).
    pub(crate) fn can_work(&self) -> bool {
        matches!(self, Phase::Stable)
    }

    /// Whether a heartbeat may go out now (none in flight), given whether every worker has
    /// stopped: a rejoin waits until they have, so that it reports owning nothing.
    pub(crate) fn may_heartbeat(&self, workers_stopped: bool) -> bool {
        match self {
            Phase::Joining | Phase::Stable | Phase::Fenced => true,
            Phase::Rejoining => workers_stopped,
            Phase::Aside { left } => !left,
            Phase::Leaving { standing, .. } => match standing {
                Standing::Member => true,
                Standing::Forgotten => workers_stopped,
                Standing::Rejected(_) => false,
            },
        }
    }

    /// A successful heartbeat answer: a member working its assignment (unless leaving).
    pub(crate) fn answered(&mut self) {
        if matches!(
            self,
            Phase::Joining | Phase::Stable | Phase::Fenced | Phase::Rejoining
        ) {
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
            Phase::Leaving { standing, .. } => {
                if let Standing::Member = standing {
                    *standing = Standing::Forgotten;
                }
            }
            // Out of the group already, as it was going to be.
            Phase::Aside { .. } => *self = Phase::Aside { left: true },
            _ => *self = Phase::Rejoining,
        }
    }

    /// The app shuts down.
    pub(crate) fn shut_down(&mut self) {
        match self {
            Phase::Leaving { .. } => {}
            Phase::Rejoining | Phase::Aside { left: true } => {
                *self = Phase::Leaving {
                    standing: Standing::Forgotten,
                    panicked: None,
                }
            }
            _ => *self = Phase::leaving(),
        }
    }

    /// The coordinator refused the member for good.
    pub(crate) fn rejected(&mut self, e: CoordinatorError) {
        self.shut_down();
        if let Phase::Leaving { standing, .. } = self {
            *standing = Standing::Rejected(e);
        }
    }

    /// A shard worker panicked (the first panic is the one reported).
    pub(crate) fn panicked(&mut self, shard: u32, message: String) {
        self.shut_down();
        if let Phase::Leaving { panicked, .. } = self {
            panicked.get_or_insert((shard, message));
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

    fn standing(phase: &Phase) -> Option<&Standing> {
        match phase {
            Phase::Leaving { standing, .. } => Some(standing),
            _ => None,
        }
    }

    #[test]
    fn an_aside_member_forgotten_or_shut_down_does_not_heartbeat_for_its_old_membership() {
        let mut p = Phase::Stable;
        p.step_aside();
        p.membership_lost();
        assert!(matches!(p, Phase::Aside { left: true }));
        p.shut_down();
        assert!(matches!(standing(&p), Some(Standing::Forgotten)));
        let mut p = Phase::Fenced;
        p.step_aside();
        p.shut_down();
        assert!(
            matches!(standing(&p), Some(Standing::Member)),
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
        assert!(!p.can_work() && p.may_heartbeat(true));
        p.lease_ran_out(); // nothing owned yet: nothing to fence
        assert!(matches!(p, Phase::Joining));
        p.answered();
        assert!(matches!(p, Phase::Stable) && p.can_work() && p.may_heartbeat(false));
    }

    #[test]
    fn self_fence_stops_work_until_an_answer_resumes_it() {
        let mut p = Phase::Stable;
        p.lease_ran_out();
        assert!(matches!(p, Phase::Fenced));
        // Fenced, it keeps heartbeating (with its workers stopping) to get the lease back.
        assert!(!p.can_work() && p.may_heartbeat(false));
        p.answered();
        assert!(matches!(p, Phase::Stable));
    }

    #[test]
    fn a_rejoin_waits_for_every_worker_then_joins_owning_nothing() {
        for mut p in [Phase::Joining, Phase::Stable, Phase::Fenced] {
            p.membership_lost();
            assert!(matches!(p, Phase::Rejoining));
            assert!(!p.can_work());
            assert!(!p.may_heartbeat(false), "not while workers still stop");
            assert!(p.may_heartbeat(true));
            p.lease_ran_out();
            assert!(matches!(p, Phase::Rejoining));
            p.answered();
            assert!(matches!(p, Phase::Stable));
        }
    }

    #[test]
    fn leaving_heartbeats_until_the_workers_stopped_and_nothing_brings_it_back() {
        let mut p = Phase::Fenced;
        p.shut_down();
        assert!(matches!(standing(&p), Some(Standing::Member)));
        assert!(!p.can_work() && p.may_heartbeat(false));
        p.answered();
        p.lease_ran_out();
        p.shut_down();
        assert!(matches!(standing(&p), Some(Standing::Member)));
        // Forgotten while leaving: no join (it would report shards still stopping).
        p.membership_lost();
        assert!(matches!(standing(&p), Some(Standing::Forgotten)));
        assert!(!p.may_heartbeat(false));
        p.answered();
        assert!(p.is_leaving());
        let mut rejoining = Phase::Rejoining;
        rejoining.shut_down();
        assert!(matches!(standing(&rejoining), Some(Standing::Forgotten)));
    }

    #[test]
    fn a_rejected_member_stops_heartbeating_and_the_first_panic_is_reported() {
        let mut p = Phase::Stable;
        p.rejected(rejection());
        assert!(matches!(standing(&p), Some(Standing::Rejected(_))));
        assert!(!p.may_heartbeat(true));
        p.panicked(3, "first".into());
        p.panicked(4, "second".into());
        assert!(matches!(standing(&p), Some(Standing::Rejected(_))));
        let Phase::Leaving { panicked, .. } = &p else {
            panic!("leaving")
        };
        assert_eq!(panicked.as_ref(), Some(&(3, "first".to_owned())));
        let mut p = Phase::Joining;
        p.panicked(1, "boom".into());
        assert!(matches!(standing(&p), Some(Standing::Member)) && p.may_heartbeat(false));
    }
}
