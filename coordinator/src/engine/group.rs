//! Group operations: join, heartbeat (revoke before assign), leave, expiry, fencing, config.

use super::{EngineError, GroupConfig, GroupDoc, MemberDoc, StreamDoc};
use crate::assignor::{self, AssignorMember, StickyAssignor};
use rsc_protocol::FencingMode;
use rsc_protocol::MemberEpoch;
use rsc_protocol::names::validate_name;
use rsc_protocol::owner::OwnerToken;
use rsc_protocol::{
    HeartbeatRequest, HeartbeatResponse, MemberState, PROTOCOL_VERSION, PatchGroupRequest,
};
use std::collections::BTreeSet;

/// Something that happened to a group, for logs, metrics and the audit trail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupEvent {
    /// A new member joined.
    Joined(String),
    /// A known member rejoined with epoch 0 (what its old incarnation held is released once
    /// it reports at its new epoch, or at once past its session: PROTOCOL §5.1).
    Rejoined(String),
    /// A member left.
    Left(String),
    /// A member was expired: no heartbeat within the session timeout.
    SessionExpired(String),
    /// A member was removed for not revoking within the rebalance timeout.
    RebalanceTimedOut(String),
    /// An operator removed a member.
    Removed(String),
    /// A static member left with epoch -2: it keeps its shards until it returns or expires.
    SteppedAway(String),
    /// A static member joined again under its id (a new incarnation after a -2 leave): it
    /// resumes its shards, no rebalance.
    Resumed(String),
    /// A new target assignment was computed at this group epoch.
    Rebalanced(u64),
    /// A member was asked to revoke shards (first time for this revocation).
    RevocationRequested(String, Vec<u32>),
}

/// The decision for one heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    /// The answer for the member. (Whether the document changed is
    /// [`GroupDoc::differs_beyond_liveness`] against the document before.)
    pub response: HeartbeatResponse,
    /// Draining shards the member reported drained that the stream has not yet recorded as
    /// drained by this group: the service records them in the stream document.
    pub drained: Vec<u32>,
    /// What happened.
    pub events: Vec<GroupEvent>,
}

impl GroupDoc {
    /// A new, empty group on `stream`.
    pub fn new(group: &str, config: GroupConfig, stream: &StreamDoc, now_ms: u64) -> Self {
        GroupDoc {
            group: group.to_owned(),
            stream: stream.stream.clone(),
            config,
            group_epoch: 0,
            assignment_epoch: 0,
            layout_version: stream.layout_version,
            members: Default::default(),
            created_ms: now_ms,
            reconciling_since_ms: None,
            last_seek: None,
        }
    }

    /// Keeps [`GroupDoc::reconciling_since_ms`] up to date after an operation at `now_ms`:
    /// starts the clock when a group with members stops being stable, and stops it when it
    /// is stable again (or empty). Returns how long the group took to converge (ms) when it
    /// just became stable, for the convergence-time histogram.
    pub fn track_convergence(&mut self, now_ms: u64) -> Option<u64> {
        let settled = self.members.is_empty() || self.is_stable();
        match (settled, self.reconciling_since_ms) {
            (false, None) => {
                self.reconciling_since_ms = Some(now_ms);
                None
            }
            (true, Some(since)) => {
                self.reconciling_since_ms = None;
                (!self.members.is_empty()).then(|| now_ms.saturating_sub(since))
            }
            _ => None,
        }
    }

    /// Whether every member is stable at the assignment epoch (a static member that is
    /// away does not count: it cannot act until it returns; nor does a removed member whose
    /// lease still runs, [`MemberDoc::is_removed`]).
    pub fn is_stable(&self) -> bool {
        self.members.values().all(|m| {
            m.away_since_ms.is_some()
                || m.is_removed()
                || (m.state == MemberState::Stable
                    && MemberEpoch::new(m.member_epoch).is(self.assignment_epoch))
        })
    }

    /// Recomputes the target when the stream's layout changed since it was last computed.
    /// Returns whether the document changed.
    pub fn sync_layout(&mut self, stream: &StreamDoc) -> bool {
        if self.layout_version == stream.layout_version {
            return false;
        }
        self.rebalance(stream);
        true
    }

    /// Removes every member whose session expired or whose revocation outlived the
    /// rebalance timeout, then recomputes the target once.
    ///
    /// A member removed for the rebalance timeout while its lease (last heartbeat + session
    /// timeout) still runs may still be reading, and is not told until its next heartbeat:
    /// its record stays, out of the assignment ([`MemberDoc::is_removed`]), holding what it
    /// held pending revocation — as a rejoin within the session does (PROTOCOL §5.1) — until
    /// its lease ends (then it is expired like any silent member) or it joins again (§5.3).
    pub fn expire(&mut self, stream: &StreamDoc, now_ms: u64) -> Vec<GroupEvent> {
        let cfg = &self.config;
        let mut events = Vec::new();
        for (id, m) in &self.members {
            if now_ms.saturating_sub(m.last_heartbeat_ms) > cfg.session_timeout_ms {
                events.push(GroupEvent::SessionExpired(id.clone()));
            } else if m.state == MemberState::Unrevoked
                && m.revoke_started_ms
                    .is_some_and(|t| now_ms.saturating_sub(t) > cfg.rebalance_timeout_ms)
            {
                events.push(GroupEvent::RebalanceTimedOut(id.clone()));
            }
        }
        for e in &events {
            match e {
                GroupEvent::SessionExpired(id) => {
                    self.members.remove(id);
                }
                GroupEvent::RebalanceTimedOut(id) => {
                    let m = self.members.get_mut(id).expect("member found above");
                    start_over(m, MemberEpoch::LEAVE, true);
                    m.target.clear();
                }
                _ => {}
            }
        }
        if !events.is_empty() {
            self.rebalance(stream);
            events.push(GroupEvent::Rebalanced(self.group_epoch));
        }
        events
    }

    /// The earliest time at which [`GroupDoc::expire`] would remove someone, if any.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.members
            .values()
            .flat_map(|m| {
                let session = m.last_heartbeat_ms + self.config.session_timeout_ms + 1;
                let revoke = (m.state == MemberState::Unrevoked)
                    .then_some(m.revoke_started_ms)
                    .flatten()
                    .map(|t| t + self.config.rebalance_timeout_ms + 1);
                std::iter::once(session).chain(revoke)
            })
            .min()
    }

    /// Handles one heartbeat (PROTOCOL §5). On error the document is left unchanged.
    ///
    /// The steps: validate the request; by its epoch, leave (-1), step away (-2), join or
    /// rejoin (0), or check the member is not fenced (its current or tolerated previous
    /// epoch); then reconcile what it owns with its target (revoke before assign) and answer.
    pub fn heartbeat(
        &mut self,
        stream: &StreamDoc,
        req: &HeartbeatRequest,
        now_ms: u64,
    ) -> Result<HeartbeatOutcome, EngineError> {
        validate_heartbeat(req)?;
        let id = req.member_id.as_str();
        let events = match MemberEpoch::new(req.member_epoch) {
            MemberEpoch::LEAVE => {
                self.check_leaving_incarnation(id, req.incarnation.as_deref(), now_ms)?;
                return self.heartbeat_leave(stream, id);
            }
            MemberEpoch::STEP_AWAY => return self.heartbeat_step_away(stream, id, req, now_ms),
            MemberEpoch::JOIN => self.heartbeat_join(stream, id, req, now_ms)?,
            epoch if epoch.is_invalid() => {
                return Err(EngineError::Invalid(format!(
                    "member_epoch {epoch} is invalid: send 0 to join, -1 to leave, -2 to leave for a restart (static members), or the epoch last received"
                )));
            }
            epoch => {
                self.check_fenced(id, epoch.get(), req)?;
                Vec::new()
            }
        };
        Ok(self.heartbeat_reconcile(stream, req, now_ms, events))
    }

    /// A heartbeat with epoch -1: the member leaves.
    fn heartbeat_leave(
        &mut self,
        stream: &StreamDoc,
        id: &str,
    ) -> Result<HeartbeatOutcome, EngineError> {
        self.leave(stream, id, MemberEpoch::LEAVE.get())?;
        Ok(HeartbeatOutcome {
            response: self.response(stream, id, MemberEpoch::LEAVE.get(), Vec::new()),
            drained: Vec::new(),
            events: vec![
                GroupEvent::Left(id.to_owned()),
                GroupEvent::Rebalanced(self.group_epoch),
            ],
        })
    }

    /// A heartbeat with epoch -2: a static member leaves for a restart, keeping its shards.
    fn heartbeat_step_away(
        &mut self,
        stream: &StreamDoc,
        id: &str,
        req: &HeartbeatRequest,
        now_ms: u64,
    ) -> Result<HeartbeatOutcome, EngineError> {
        self.step_away(id, req.incarnation.as_deref(), now_ms)?;
        let mut response = self.response(stream, id, MemberEpoch::STEP_AWAY.get(), Vec::new());
        response.owner_tokens.clear();
        Ok(HeartbeatOutcome {
            response,
            drained: Vec::new(),
            events: vec![GroupEvent::SteppedAway(id.to_owned())],
        })
    }

    /// A heartbeat with epoch 0: the member joins or rejoins (rebalancing the group), or a
    /// static member resumes (no rebalance). Returns what happened.
    fn heartbeat_join(
        &mut self,
        stream: &StreamDoc,
        id: &str,
        req: &HeartbeatRequest,
        now_ms: u64,
    ) -> Result<Vec<GroupEvent>, EngineError> {
        let event = self.join(id, req.incarnation.as_deref(), now_ms)?;
        let resumed = matches!(event, GroupEvent::Resumed(_));
        let mut events = vec![event];
        if !resumed {
            self.rebalance(stream);
            events.push(GroupEvent::Rebalanced(self.group_epoch));
        }
        Ok(events)
    }

    /// The fencing check of a member heartbeating at `epoch`: it must be known, the process
    /// run that holds the id when the request names one (PROTOCOL §11), not away (only a join
    /// brings back a member that left with -2), and at its current epoch, or at its previous
    /// one while reporting `owned_shards` within what it holds, its assignment and the shards
    /// pending revocation (PROTOCOL §5.4: a request without the list cannot be checked, so it
    /// is fenced).
    fn check_fenced(
        &self,
        id: &str,
        epoch: i64,
        req: &HeartbeatRequest,
    ) -> Result<(), EngineError> {
        let m = self
            .members
            .get(id)
            .filter(|m| !m.is_removed())
            .ok_or_else(|| EngineError::UnknownMember(id.to_owned()))?;
        if let Some(sent) = req.incarnation.as_deref()
            && m.incarnation.as_deref() != Some(sent)
        {
            return Err(EngineError::FencedIncarnation {
                member: id.to_owned(),
                sent: sent.to_owned(),
            });
        }
        if m.away_since_ms.is_some() {
            return Err(EngineError::Fenced {
                member: id.to_owned(),
                sent: epoch,
                current: MemberEpoch::STEP_AWAY.get(),
            });
        }
        let tolerated = epoch == m.previous_epoch
            && req
                .owned_shards
                .as_ref()
                .is_some_and(|owned| owned.iter().all(|s| m.holds(*s)));
        if epoch != m.member_epoch && !tolerated {
            return Err(EngineError::Fenced {
                member: id.to_owned(),
                sent: epoch,
                current: m.member_epoch,
            });
        }
        Ok(())
    }

    /// A leave (-1) that names a process run must come from the run that holds the id
    /// (PROTOCOL §11), as a -2 must: another run's leave would end the live holder's
    /// membership.
    fn check_leaving_incarnation(
        &self,
        id: &str,
        incarnation: Option<&str>,
        now_ms: u64,
    ) -> Result<(), EngineError> {
        match (self.members.get(id), incarnation) {
            (Some(m), Some(sent)) if m.incarnation.as_deref() != Some(sent) => {
                Err(EngineError::MemberIdInUse {
                    member: id.to_owned(),
                    retry_after_ms: (m.last_heartbeat_ms + self.config.session_timeout_ms + 1)
                        .saturating_sub(now_ms),
                })
            }
            _ => Ok(()),
        }
    }

    /// The list of a heartbeat that says what the member owns now (PROTOCOL §5, §5.4): one
    /// sent at the member's current epoch. A list sent at the tolerated previous epoch may be
    /// a request that reached the coordinator after newer ones (its sender gave up on it, and
    /// its report predates a revocation asked since): it is ignored, as a missing list is.
    fn current_report<'r>(&self, req: &'r HeartbeatRequest) -> Option<&'r [u32]> {
        let m = self.members.get(&req.member_id)?;
        let owned = req.owned_shards.as_deref()?;
        (req.member_epoch == m.member_epoch).then_some(owned)
    }

    /// What a heartbeat says the member owns now, for reconciliation (PROTOCOL §5.2): the list
    /// it sent at its current epoch. `None` — "unchanged", nothing released — without the
    /// list, at the tolerated previous epoch (§5.4), and for a join: a join may be a late copy
    /// of one the member sent before it joined and started shards.
    fn report(&self, req: &HeartbeatRequest) -> Option<BTreeSet<u32>> {
        if MemberEpoch::new(req.member_epoch).is_join() {
            return None;
        }
        self.current_report(req)
            .map(|owned| owned.iter().copied().collect())
    }

    /// After the join or the fencing check: records the heartbeat, reconciles what the
    /// member reports owning with its target (revoke before assign), and answers.
    fn heartbeat_reconcile(
        &mut self,
        stream: &StreamDoc,
        req: &HeartbeatRequest,
        now_ms: u64,
        mut events: Vec<GroupEvent>,
    ) -> HeartbeatOutcome {
        let id = req.member_id.as_str();
        let report = self.report(req);
        let m = self
            .members
            .get_mut(id)
            .expect("member present after join/check");
        m.last_heartbeat_ms = now_ms;
        if req.client.is_some() {
            m.client.clone_from(&req.client);
        }
        // Without a report, what the member last reported stays on record (the view shows it).
        if let Some(e) = self.reconcile(id, report, now_ms) {
            events.push(e);
        }
        let m = &self.members[id];
        let drained = self.newly_drained(stream, m, &req.drained_shards);
        let assignment = m.assigned.iter().copied().collect();
        HeartbeatOutcome {
            response: self.response(stream, id, m.member_epoch, assignment),
            drained,
            events,
        }
    }

    /// Of the shards member `m` reports drained, the draining ones it holds that the stream
    /// has not yet recorded as drained by this group (sorted, without duplicates).
    fn newly_drained(&self, stream: &StreamDoc, m: &MemberDoc, reported: &[u32]) -> Vec<u32> {
        reported
            .iter()
            .copied()
            .filter(|s| {
                m.holds(*s)
                    && stream
                        .draining
                        .get(s)
                        .is_some_and(|groups| !groups.contains(&self.group))
            })
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect()
    }

    /// The answer to a steady-state heartbeat, computed without changing the document.
    ///
    /// `Some` only when [`GroupDoc::heartbeat`] at any time within the member's session would
    /// leave the document as it is (apart from the member's heartbeat time), report no event
    /// and no drained shard, and answer exactly this: the member is stable at the assignment
    /// epoch, holds its whole target, reports what it reported last, sends its current epoch
    /// and no new client facts, and the stream layout is the one the target was computed
    /// for. It does not look at the clock: the caller makes sure the member's session has not
    /// expired (and that the document is still the stored one) when it answers.
    pub fn steady_heartbeat(
        &self,
        stream: &StreamDoc,
        req: &HeartbeatRequest,
    ) -> Option<HeartbeatResponse> {
        if req.protocol_version != PROTOCOL_VERSION
            || !MemberEpoch::new(req.member_epoch).is_generation()
            || self.layout_version != stream.layout_version
        {
            return None;
        }
        let m = self.members.get(&req.member_id)?;
        let steady = m.member_epoch == req.member_epoch
            && MemberEpoch::new(m.member_epoch).is(self.assignment_epoch)
            && m.state == MemberState::Stable
            && m.pending_revocation.is_empty()
            && m.revoke_started_ms.is_none()
            && m.assigned == m.target
            && req
                .owned_shards
                .as_ref()
                .is_none_or(|o| same_set(o, &m.reported))
            && (req.incarnation.is_none() || req.incarnation == m.incarnation)
            && (req.client.is_none() || req.client == m.client)
            && req.drained_shards.iter().all(|s| {
                !(m.holds(*s)
                    && stream
                        .draining
                        .get(s)
                        .is_some_and(|groups| !groups.contains(&self.group)))
            });
        steady.then(|| {
            self.response(
                stream,
                &req.member_id,
                m.member_epoch,
                m.assigned.iter().copied().collect(),
            )
        })
    }

    /// A join (epoch 0) of `id`: a new member, a rejoin of a known one (it owns nothing; what
    /// its old incarnation held is released once it reports so at its new epoch, or at once
    /// past its session; a rebalance follows), or a static member's return after a -2
    /// leave (`Resumed`: it keeps its shards, no rebalance). Refuses a static member's id
    /// held by another live incarnation.
    fn join(
        &mut self,
        id: &str,
        incarnation: Option<&str>,
        now_ms: u64,
    ) -> Result<GroupEvent, EngineError> {
        let session_ms = self.config.session_timeout_ms;
        let Some(m) = self.members.get_mut(id) else {
            if let Some(max) = self.config.max_members
                && self.members.len() >= max as usize
            {
                return Err(EngineError::MaxSize(max));
            }
            let mut m = MemberDoc::new(now_ms);
            m.incarnation = incarnation.map(str::to_owned);
            self.members.insert(id.to_owned(), m);
            return Ok(GroupEvent::Joined(id.to_owned()));
        };
        let live = now_ms.saturating_sub(m.last_heartbeat_ms) <= session_ms;
        if let (Some(new), Some(old)) = (incarnation, m.incarnation.as_deref())
            && live
        {
            if m.away_since_ms.is_some() {
                m.away_since_ms = None;
                m.incarnation = Some(new.to_owned());
                return Ok(GroupEvent::Resumed(id.to_owned()));
            }
            if new != old {
                return Err(EngineError::MemberIdInUse {
                    member: id.to_owned(),
                    retry_after_ms: (m.last_heartbeat_ms + session_ms + 1).saturating_sub(now_ms),
                });
            }
        }
        // The new incarnation owns nothing. Within the old one's session the join may also be a
        // late copy of one this run sent before it joined and started shards (PROTOCOL §5.4),
        // or the old run, removed for the rebalance timeout, may still be reading (§5.3).
        start_over(m, MemberEpoch::JOIN, live);
        m.incarnation = incarnation.map(str::to_owned);
        Ok(GroupEvent::Rejoined(id.to_owned()))
    }

    /// A static member's leave for a restart (epoch -2): it stopped reading, keeps the shards
    /// of its target (unread) until it joins again or its session expires; what it was
    /// revoking is released at once.
    fn step_away(
        &mut self,
        id: &str,
        incarnation: Option<&str>,
        now_ms: u64,
    ) -> Result<(), EngineError> {
        let m = self
            .members
            .get_mut(id)
            .filter(|m| !m.is_removed())
            .ok_or_else(|| EngineError::UnknownMember(id.to_owned()))?;
        let Some(held) = m
            .incarnation
            .as_deref()
            .filter(|i| rsc_protocol::is_static_incarnation(i))
        else {
            return Err(EngineError::Invalid(format!(
                "member {id} is not static (it joined without a static incarnation): leave with \
                 epoch -1"
            )));
        };
        if incarnation != Some(held) {
            return Err(EngineError::MemberIdInUse {
                member: id.to_owned(),
                retry_after_ms: (m.last_heartbeat_ms + self.config.session_timeout_ms + 1)
                    .saturating_sub(now_ms),
            });
        }
        m.away_since_ms = Some(now_ms);
        m.last_heartbeat_ms = now_ms;
        m.pending_revocation.clear();
        m.revoke_started_ms = None;
        m.reported.clear();
        let target = &m.target;
        m.assigned.retain(|s| target.contains(s));
        let assigned = &m.assigned;
        m.granted_at.retain(|s, _| assigned.contains(s));
        m.state = MemberState::Stable;
        Ok(())
    }

    /// Removes a member that leaves (`POST leave` or a heartbeat with epoch -1). Epoch -1 is not
    /// checked; otherwise the current or the tolerated previous epoch is required. A member
    /// removed for the rebalance timeout whose lease still runs (PROTOCOL §5.3) leaves at any
    /// epoch: its run stopped reading, so what it held is free.
    pub fn leave(
        &mut self,
        stream: &StreamDoc,
        member_id: &str,
        epoch: i64,
    ) -> Result<(), EngineError> {
        let m = self
            .members
            .get(member_id)
            .ok_or_else(|| EngineError::UnknownMember(member_id.to_owned()))?;
        let tolerated = MemberEpoch::new(epoch).is_generation() && epoch == m.previous_epoch;
        let checked = MemberEpoch::new(epoch) != MemberEpoch::LEAVE && !m.is_removed();
        if checked && epoch != m.member_epoch && !tolerated {
            return Err(EngineError::Fenced {
                member: member_id.to_owned(),
                sent: epoch,
                current: m.member_epoch,
            });
        }
        self.members.remove(member_id);
        self.rebalance(stream);
        Ok(())
    }

    /// Fences and removes a member (operator action). Its shards are free at once.
    pub fn remove_member(
        &mut self,
        stream: &StreamDoc,
        member_id: &str,
    ) -> Result<(), EngineError> {
        self.leave(stream, member_id, MemberEpoch::LEAVE.get())
    }

    /// Applies a settings change; bumps the group epoch when anything changed.
    /// Returns whether it did.
    pub fn update_config(
        &mut self,
        stream: &StreamDoc,
        patch: &PatchGroupRequest,
    ) -> Result<bool, EngineError> {
        let mut cfg = self.config.clone();
        if let Some(v) = patch.session_timeout_ms {
            cfg.session_timeout_ms = v;
        }
        if let Some(v) = patch.heartbeat_interval_ms {
            cfg.heartbeat_interval_ms = v;
        }
        if let Some(v) = patch.rebalance_timeout_ms {
            cfg.rebalance_timeout_ms = v;
        }
        if let Some(v) = patch.max_members {
            cfg.max_members = (v != 0).then_some(v);
        }
        if let Some(v) = patch.fencing {
            cfg.fencing = v;
        }
        if let Some(v) = patch.ordering {
            cfg.ordering = v;
        }
        cfg.validate()?;
        if cfg == self.config {
            return Ok(false);
        }
        self.config = cfg;
        self.rebalance(stream);
        Ok(true)
    }

    /// Pauses (`true`) or resumes the group (an operator's durable pause, PROTOCOL §14).
    /// Membership and assignment are untouched (no epoch bump, no rebalance): members learn
    /// it from their next heartbeat answer. Returns whether anything changed.
    pub fn set_paused(&mut self, paused: bool, now_ms: u64) -> bool {
        match (paused, self.config.paused_since_ms) {
            (true, None) => {
                self.config.paused_since_ms = Some(now_ms);
                true
            }
            (false, Some(_)) => {
                self.config.paused_since_ms = None;
                true
            }
            _ => false,
        }
    }

    /// Bumps the group epoch and recomputes the target assignment, eagerly (PROTOCOL §5.2).
    fn rebalance(&mut self, stream: &StreamDoc) {
        self.group_epoch += 1;
        self.layout_version = stream.layout_version;
        let shards = stream.assignable_shards();
        static DEFAULT: StickyAssignor = StickyAssignor;
        let assignor = assignor::by_name(&self.config.assignor).unwrap_or(&DEFAULT);
        // A removed member whose lease still runs is out of the assignment (PROTOCOL §5.3).
        let specs: Vec<AssignorMember<'_>> = self
            .members
            .iter()
            .filter(|(_, m)| !m.is_removed())
            .map(|(id, m)| AssignorMember {
                id,
                previous: &m.target,
            })
            .collect();
        let targets = assignor.assign(&specs, &shards);
        let assigned = self.members.values_mut().filter(|m| !m.is_removed());
        for (m, t) in assigned.zip(targets) {
            m.target = t.into_iter().collect();
            if m.away_since_ms.is_some() {
                // An away static member reads nothing: what it no longer gets is free at once.
                let target = &m.target;
                m.assigned.retain(|s| target.contains(s));
                let assigned = &m.assigned;
                m.granted_at.retain(|s, _| assigned.contains(s));
            }
        }
        self.assignment_epoch = self.group_epoch;
    }

    /// KIP-848's current-assignment rule for one member (PROTOCOL §5.2), given what the
    /// heartbeat reports it owns now (`None`: unchanged). Returns the event when this
    /// heartbeat starts a revocation.
    ///
    /// A shard is released only when a report at the member's current epoch no longer names
    /// it, and only if the member was asked to revoke it before that heartbeat: asking moves
    /// the member to the assignment epoch, so a report that predates the request (a late
    /// request, sent before the member started the shard again) is at an older epoch.
    fn reconcile(
        &mut self,
        id: &str,
        report: Option<BTreeSet<u32>>,
        now_ms: u64,
    ) -> Option<GroupEvent> {
        let m = &self.members[id];
        let owned: BTreeSet<u32> = m.assigned.union(&m.pending_revocation).copied().collect();
        let keep: BTreeSet<u32> = owned.intersection(&m.target).copied().collect();
        let released = |s: &u32| {
            m.pending_revocation.contains(s) && report.as_ref().is_some_and(|r| !r.contains(s))
        };
        let still_owned: BTreeSet<u32> = owned
            .difference(&m.target)
            .filter(|s| !released(s))
            .copied()
            .collect();
        let epoch = MemberEpoch::of_assignment(self.assignment_epoch).get();
        if still_owned.is_empty() {
            self.grant(id, keep, report, epoch);
            return None;
        }
        let m = self.members.get_mut(id).expect("member exists");
        m.state = MemberState::Unrevoked;
        m.assigned = keep;
        m.pending_revocation = still_owned;
        record_step(m, epoch, report);
        if m.revoke_started_ms.is_some() {
            return None;
        }
        m.revoke_started_ms = Some(now_ms);
        Some(GroupEvent::RevocationRequested(
            id.to_owned(),
            m.pending_revocation.iter().copied().collect(),
        ))
    }

    /// Nothing left to revoke: the member keeps `keep`, is granted what its target wants and
    /// nobody else holds, and moves to the assignment `epoch` (PROTOCOL §5.2).
    fn grant(&mut self, id: &str, keep: BTreeSet<u32>, report: Option<BTreeSet<u32>>, epoch: i64) {
        let wanted: BTreeSet<u32> = self.members[id].target.difference(&keep).copied().collect();
        let mut held_elsewhere = BTreeSet::new();
        if !wanted.is_empty() {
            for (other_id, other) in &self.members {
                if other_id != id {
                    held_elsewhere.extend(
                        other
                            .assigned
                            .iter()
                            .chain(&other.pending_revocation)
                            .filter(|s| wanted.contains(s)),
                    );
                }
            }
        }
        let m = self.members.get_mut(id).expect("member exists");
        m.assigned = keep;
        m.assigned.extend(wanted.difference(&held_elsewhere));
        m.pending_revocation.clear();
        m.revoke_started_ms = None;
        record_step(m, epoch, report);
        m.state = if held_elsewhere.is_empty() {
            MemberState::Stable
        } else {
            MemberState::Unreleased
        };
    }

    fn response(
        &self,
        stream: &StreamDoc,
        member_id: &str,
        member_epoch: i64,
        assignment: Vec<u32>,
    ) -> HeartbeatResponse {
        HeartbeatResponse {
            member_id: member_id.to_owned(),
            member_epoch,
            heartbeat_interval_ms: self.config.heartbeat_interval_ms,
            session_timeout_ms: self.config.session_timeout_ms,
            assignment,
            stream: self.stream.clone(),
            shard_count: stream.shard_count,
            routing_epoch: stream.routing_epoch,
            start: self.config.start,
            owner_tokens: self.owner_tokens(member_id),
            ordering: self.config.ordering,
            paused: self.config.paused_since_ms.is_some(),
            rebalance_timeout_ms: self.config.rebalance_timeout_ms,
        }
    }

    /// The owner tokens of a member's assignment, with strict fencing (none in lease mode).
    pub fn owner_tokens(&self, member_id: &str) -> std::collections::BTreeMap<u32, String> {
        let Some(m) = self.members.get(member_id) else {
            return Default::default();
        };
        if self.config.fencing != FencingMode::Strict {
            return Default::default();
        }
        m.assigned
            .iter()
            .map(|&s| {
                let epoch = m.granted_at.get(&s).copied().unwrap_or(m.member_epoch);
                (
                    s,
                    OwnerToken::new(self.created_ms, epoch, member_id).to_string(),
                )
            })
            .collect()
    }
}

/// Starts member `m` over at `epoch` (a rejoin, or a removal for the rebalance timeout),
/// owning nothing. While its lease runs (`live`) a run of it may still be reading what it
/// held: that stays held, pending revocation, until a report at a new epoch no longer names
/// it or the lease ends (PROTOCOL §5.1, §5.3). Past the lease the run has stopped reading
/// (it self-fences first): released at once.
fn start_over(m: &mut MemberDoc, epoch: MemberEpoch, live: bool) {
    let held: BTreeSet<u32> = m.assigned.union(&m.pending_revocation).copied().collect();
    m.pending_revocation = if live { held } else { BTreeSet::new() };
    m.assigned.clear();
    m.granted_at.clear();
    m.reported.clear();
    m.revoke_started_ms = None;
    m.member_epoch = epoch.get();
    m.previous_epoch = epoch.get();
    m.away_since_ms = None;
}

/// After a reconciliation step of member `m`: what it reported (when it did) goes on record,
/// it moves to the assignment `epoch`, and each shard of its assignment keeps the epoch it
/// was granted at (one without, kept across a rejoin, is granted now: PROTOCOL §5.6).
fn record_step(m: &mut MemberDoc, epoch: i64, report: Option<BTreeSet<u32>>) {
    if let Some(r) = report {
        m.reported = r;
    }
    if m.member_epoch != epoch {
        m.previous_epoch = m.member_epoch;
        m.member_epoch = epoch;
    }
    let assigned = &m.assigned;
    m.granted_at.retain(|s, _| assigned.contains(s));
    for &s in assigned {
        m.granted_at.entry(s).or_insert(epoch);
    }
}

/// Whether the list `owned` names exactly the shards of `set` (in any order, repeats
/// allowed). Without allocating when the list is sorted and without repeats, as clients send
/// it (the steady path, PROTOCOL §5.1).
fn same_set(owned: &[u32], set: &BTreeSet<u32>) -> bool {
    if owned.len() == set.len() && owned.iter().eq(set.iter()) {
        return true;
    }
    owned.iter().copied().collect::<BTreeSet<u32>>() == *set
}

/// The request-level checks of a heartbeat: protocol version, field limits (checked at the
/// edge already, PROTOCOL §4.3: here so that no caller can store an oversized field), member
/// and incarnation names.
fn validate_heartbeat(req: &HeartbeatRequest) -> Result<(), EngineError> {
    if req.protocol_version != PROTOCOL_VERSION {
        return Err(EngineError::UnsupportedProtocolVersion(
            req.protocol_version,
        ));
    }
    req.check_limits()
        .map_err(|e| EngineError::Invalid(e.to_string()))?;
    // The member id stays a string on the wire, so that a batch answers a bad one in its
    // own result (PROTOCOL §10): this is where it is checked, for both routes.
    let invalid = |e: rsc_protocol::IdError| EngineError::Invalid(e.to_string());
    validate_name("member", &req.member_id).map_err(invalid)?;
    if let Some(incarnation) = &req.incarnation {
        validate_name("incarnation", incarnation).map_err(invalid)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rsc_protocol::ClientInfo;

    #[test]
    fn same_set_ignores_order_and_repeats() {
        let set: BTreeSet<u32> = [1, 4, 7].into();
        assert!(same_set(&[1, 4, 7], &set));
        assert!(same_set(&[7, 1, 4], &set));
        assert!(same_set(&[1, 4, 4, 7], &set));
        assert!(!same_set(&[1, 4], &set));
        assert!(!same_set(&[1, 4, 8], &set));
        assert!(!same_set(&[1, 1, 4], &set));
        assert!(same_set(&[], &BTreeSet::new()));
    }

    const NOW: u64 = 1_000;

    fn req(member: &str, epoch: i64, owned: Vec<u32>) -> HeartbeatRequest {
        HeartbeatRequest {
            protocol_version: PROTOCOL_VERSION,
            member_id: member.to_owned(),
            member_epoch: epoch,
            owned_shards: Some(owned),
            drained_shards: Vec::new(),
            client: None,
            incarnation: None,
        }
    }

    fn hb(member: &str, epoch: i64, owned: &[u32]) -> HeartbeatRequest {
        HeartbeatRequest {
            protocol_version: PROTOCOL_VERSION,
            member_id: member.into(),
            member_epoch: epoch,
            owned_shards: Some(owned.to_vec()),
            drained_shards: vec![],
            client: None,
            incarnation: None,
        }
    }

    #[test]
    fn convergence_is_timed_from_unsettled_to_stable() {
        let stream = StreamDoc::new("s", 2, 0).unwrap();
        let mut g = GroupDoc::new("g", GroupConfig::default(), &stream, 0);
        assert_eq!(g.track_convergence(0), None, "an empty group is settled");
        let a = g.heartbeat(&stream, &hb("a", 0, &[]), 100).unwrap();
        assert_eq!(g.track_convergence(100), None);
        assert_eq!(
            g.reconciling_since_ms, None,
            "a lone member is stable at once"
        );
        // b joins at 200: a must give up a shard first, so the group is reconciling.
        let b = g.heartbeat(&stream, &hb("b", 0, &[]), 200).unwrap();
        assert_eq!(g.track_convergence(200), None);
        assert_eq!(g.reconciling_since_ms, Some(200));
        // Both heartbeat every 100 ms, reporting what they were last assigned.
        let mut members = [
            ("a", a.response.member_epoch, a.response.assignment),
            ("b", b.response.member_epoch, b.response.assignment),
        ];
        let mut converged = None;
        for step in 1..=10u64 {
            let now = 200 + 100 * step;
            for (id, epoch, owned) in members.iter_mut() {
                let out = g.heartbeat(&stream, &hb(id, *epoch, owned), now).unwrap();
                *epoch = out.response.member_epoch;
                *owned = out.response.assignment;
                if let Some(ms) = g.track_convergence(now) {
                    converged = Some((ms, now));
                }
            }
            if converged.is_some() {
                break;
            }
            assert_eq!(g.reconciling_since_ms, Some(200));
        }
        let (ms, at) = converged.expect("the group converges within 10 rounds");
        assert_eq!(ms, at - 200);
        assert!(g.is_stable());
        assert_eq!(g.reconciling_since_ms, None);
        assert_eq!(g.track_convergence(at + 100), None, "observed once");
    }

    /// `steady_heartbeat` answers only what `heartbeat` would, and only when it changes
    /// nothing but the member's heartbeat time.
    fn check_steady(doc: &GroupDoc, stream: &StreamDoc, r: &HeartbeatRequest) -> bool {
        let Some(fast) = doc.steady_heartbeat(stream, r) else {
            return false;
        };
        let mut slow = doc.clone();
        let out = slow
            .heartbeat(stream, r, NOW + 1)
            .expect("a steady heartbeat is accepted");
        assert!(
            !slow.differs_beyond_liveness(doc),
            "steady heartbeat changed the document: {r:?}"
        );
        assert!(out.events.is_empty() && out.drained.is_empty(), "{out:?}");
        assert_eq!(out.response, fast);
        let m = slow.members.get_mut(&r.member_id).expect("member");
        m.last_heartbeat_ms = doc.members[&r.member_id].last_heartbeat_ms;
        assert_eq!(&slow, doc, "only the heartbeat time may change");
        true
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A heartbeat of member `m`: the protocol-following one, or a distorted one.
        Heartbeat {
            m: usize,
            epoch_shift: i64,
            owned_mask: Option<u16>,
            /// Send no `owned_shards` at all ("unchanged").
            omit_owned: bool,
            drained_mask: u16,
            client: bool,
        },
        Leave(usize),
        Reshard(u32),
        MarkDrained(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0..4usize, prop_oneof![6 => Just(0i64), 1 => Just(-1), 1 => Just(1)],
                  prop::option::weighted(0.2, any::<u16>()), prop::bool::weighted(0.15), prop_oneof![5 => Just(0u16), 1 => any::<u16>()], prop::bool::weighted(0.1))
                .prop_map(|(m, epoch_shift, owned_mask, omit_owned, drained_mask, client)| Op::Heartbeat { m, epoch_shift, owned_mask, omit_owned, drained_mask, client }),
            1 => (0..4usize).prop_map(Op::Leave),
            1 => (1..12u32).prop_map(Op::Reshard),
            1 => any::<u16>().prop_map(Op::MarkDrained),
        ]
    }

    fn mask(m: u16) -> Vec<u32> {
        (0..16).filter(|i| m & (1 << i) != 0).collect()
    }

    /// A protocol-following member, for the late-heartbeat property: the epoch it knows, the
    /// shards it works (a revoked one until its worker ended) and those whose workers stop.
    #[derive(Debug, Clone, Default)]
    struct Worker {
        epoch: i64,
        works: BTreeSet<u32>,
        stopping: BTreeSet<u32>,
    }

    impl Worker {
        /// Takes an answer as the member does: revoke what is missing, start what is new;
        /// refused, it stops every worker and joins again once they ended.
        fn answered(&mut self, r: Result<HeartbeatResponse, EngineError>) {
            let Ok(resp) = r else {
                self.epoch = 0;
                self.stopping.clone_from(&self.works);
                return;
            };
            self.epoch = resp.member_epoch;
            let assigned: BTreeSet<u32> = resp.assignment.into_iter().collect();
            let revoked = self.works.difference(&assigned).copied();
            self.stopping.extend(revoked.collect::<Vec<_>>());
            self.works.extend(assigned);
        }
    }

    #[derive(Debug, Clone)]
    enum Late {
        /// Member `m` heartbeats (a join once its workers ended, after a refusal or a leave),
        /// reporting every shard it works. The request is `delayed` (it stays on the network
        /// and its sender gives up on it) or delivered now, its answer `lost` or not.
        Beat { m: usize, delayed: bool, lost: bool },
        /// Member `m`'s stopping workers end.
        Finish(usize),
        /// Member `m`'s lease runs out: it stops every worker, keeping its epoch (a later
        /// answer resumes it with what it assigns).
        Fence(usize),
        /// A delayed request reaches the coordinator: its answer goes nowhere.
        Deliver(usize),
        /// Member `m` leaves (-1) once its workers ended.
        Leave(usize),
    }

    fn late_op() -> impl Strategy<Value = Late> {
        prop_oneof![
            8 => (0..3usize, prop::bool::weighted(0.25), prop::bool::weighted(0.2))
                .prop_map(|(m, delayed, lost)| Late::Beat { m, delayed, lost }),
            3 => (0..3usize).prop_map(Late::Finish),
            1 => (0..3usize).prop_map(Late::Fence),
            3 => any::<usize>().prop_map(Late::Deliver),
            1 => (0..3usize).prop_map(Late::Leave),
        ]
    }

    /// Steps one [`Late`] operation of the late-heartbeat property.
    fn step_late(
        doc: &mut GroupDoc,
        stream: &StreamDoc,
        workers: &mut [Worker],
        network: &mut Vec<HeartbeatRequest>,
        op: Late,
    ) {
        match op {
            Late::Beat { m, delayed, lost } => {
                let w = &workers[m];
                if w.epoch == 0 && !w.works.is_empty() {
                    return;
                }
                let r = req(&format!("m{m}"), w.epoch, w.works.iter().copied().collect());
                if delayed {
                    network.push(r);
                    return;
                }
                let out = doc.heartbeat(stream, &r, NOW).map(|o| o.response);
                if !lost {
                    workers[m].answered(out);
                }
            }
            Late::Finish(m) => {
                let w = &mut workers[m];
                for s in std::mem::take(&mut w.stopping) {
                    w.works.remove(&s);
                }
            }
            Late::Fence(m) => {
                let w = &mut workers[m];
                w.stopping.clone_from(&w.works);
            }
            Late::Deliver(i) if !network.is_empty() => {
                let r = network.remove(i % network.len());
                let _ = doc.heartbeat(stream, &r, NOW);
            }
            Late::Deliver(_) => {}
            Late::Leave(m) if workers[m].works.is_empty() => {
                if doc
                    .leave(stream, &format!("m{m}"), MemberEpoch::LEAVE.get())
                    .is_ok()
                {
                    workers[m].epoch = 0;
                }
            }
            Late::Leave(_) => {}
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn steady_heartbeat_agrees_with_heartbeat(ops in prop::collection::vec(op(), 1..80)) {
            let mut stream = StreamDoc::new("s", 6, 0).unwrap();
            stream.add_group("g");
            let mut doc = GroupDoc::new("g", GroupConfig::default(), &stream, 0);
            let mut known: Vec<Option<(i64, Vec<u32>)>> = vec![None; 4];
            for op in ops {
                match op {
                    Op::Heartbeat { m, epoch_shift, owned_mask, omit_owned, drained_mask, client } => {
                        let id = format!("m{m}");
                        let (epoch, owned) = known[m].clone().unwrap_or((0, Vec::new()));
                        let mut r = req(&id, if epoch == 0 { 0 } else { epoch + epoch_shift }, owned_mask.map(mask).unwrap_or(owned));
                        if omit_owned {
                            r.owned_shards = None;
                        }
                        r.drained_shards = mask(drained_mask);
                        if client {
                            r.client = Some(ClientInfo { host: Some(format!("h{drained_mask}")), ..Default::default() });
                        }
                        check_steady(&doc, &stream, &r);
                        match doc.heartbeat(&stream, &r, NOW) {
                            Ok(out) => known[m] = Some((out.response.member_epoch, out.response.assignment)),
                            Err(_) => known[m] = None,
                        }
                    }
                    Op::Leave(m) => {
                        if doc.leave(&stream, &format!("m{m}"), -1).is_ok() {
                            known[m] = None;
                        }
                    }
                    Op::Reshard(n) => {
                        if stream.reshard(n, NOW).is_ok() {
                            check_steady(&doc, &stream, &req("m0", known[0].as_ref().map_or(0, |k| k.0), known[0].clone().map(|k| k.1).unwrap_or_default()));
                            doc.sync_layout(&stream);
                        }
                    }
                    Op::MarkDrained(bits) => {
                        if stream.mark_drained("g", &mask(bits), NOW) {
                            doc.sync_layout(&stream);
                        }
                    }
                }
            }
        }

        /// Revoke before assign through late requests (PROTOCOL §5.2, §5.4): whatever order
        /// the heartbeats of protocol-following members reach the engine in (a request may
        /// arrive after newer ones of its sender, which gave up on it), no shard is worked by
        /// two members of the group at once.
        #[test]
        fn members_never_share_a_shard_through_late_heartbeats(
            ops in prop::collection::vec(late_op(), 1..120)
        ) {
            let mut stream = StreamDoc::new("s", 6, 0).unwrap();
            stream.add_group("g");
            let mut doc = GroupDoc::new("g", GroupConfig::default(), &stream, 0);
            let mut workers = vec![Worker::default(); 3];
            let mut network = Vec::new();
            for op in ops {
                step_late(&mut doc, &stream, &mut workers, &mut network, op.clone());
                for s in 0..6 {
                    let working: Vec<usize> = (0..workers.len())
                        .filter(|&i| workers[i].works.contains(&s)
                            && doc.members.contains_key(&format!("m{i}")))
                        .collect();
                    prop_assert!(working.len() <= 1,
                        "after {:?}: shard {} worked by members {:?}", op, s, working);
                }
            }
        }
    }

    #[test]
    fn converged_members_heartbeat_steadily() {
        let stream = StreamDoc::new("s", 8, 0).unwrap();
        let mut doc = GroupDoc::new("g", GroupConfig::default(), &stream, 0);
        let mut known: Vec<(i64, Vec<u32>)> = vec![(0, Vec::new()); 3];
        // Protocol-following members converge within a few rounds.
        for _ in 0..4 {
            for (i, k) in known.iter_mut().enumerate() {
                let out = doc
                    .heartbeat(&stream, &req(&format!("m{i}"), k.0, k.1.clone()), NOW)
                    .unwrap();
                *k = (out.response.member_epoch, out.response.assignment);
            }
        }
        assert!(doc.is_stable());
        for (i, k) in known.iter().enumerate() {
            let r = req(&format!("m{i}"), k.0, k.1.clone());
            assert!(check_steady(&doc, &stream, &r), "member m{i} is steady");
            // Anything new is not steady: another epoch, other owned shards, new client facts.
            assert!(
                doc.steady_heartbeat(&stream, &req(&format!("m{i}"), k.0 - 1, k.1.clone()))
                    .is_none()
            );
            assert!(
                doc.steady_heartbeat(&stream, &req(&format!("m{i}"), k.0, vec![]))
                    .is_none()
            );
            let mut c = r.clone();
            c.client = Some(ClientInfo {
                concurrency: Some(4),
                ..Default::default()
            });
            assert!(doc.steady_heartbeat(&stream, &c).is_none());
        }
        assert!(
            doc.steady_heartbeat(&stream, &req("stranger", 3, vec![]))
                .is_none()
        );
    }
}
