//! Randomized simulation of the protocol engine: thousands of steps of joins, leaves, lost
//! responses, slow revokers, silent members, config changes and reshards, with the safety
//! invariants checked after every step and convergence checked once churn stops.
//!
//! Seeds are fixed, so a failure reproduces exactly; set `RSC_SIM_SEED` to try another.

use rsc_coordinator::engine::{GroupConfig, GroupDoc, GroupEvent, StreamDoc};
use rsc_protocol::{ErrorCode, HeartbeatRequest, MemberState, PatchGroupRequest};
use std::collections::{BTreeMap, BTreeSet};

const SESSION_MS: u64 = 10_000;
const HEARTBEAT_MS: u64 = 1_000;
const REBALANCE_MS: u64 = 8_000;
/// The client stops handling at 90% of the session timeout after its last successful send.
const SELF_FENCE_MS: u64 = SESSION_MS * 9 / 10;

/// xorshift64*: tiny, deterministic, good enough to pick actions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Debug, Clone)]
struct Client {
    id: String,
    epoch: i64,
    owned: BTreeSet<u32>,
    last_ok_sent: u64,
    /// Heartbeats during which it keeps shards it was asked to revoke.
    slow_revokes: u32,
    silent: bool,
    /// Removed by the coordinator while still running (rebalance timeout): it learns at its
    /// next heartbeat. Data-plane fencing, not the control plane, covers this window.
    zombie: bool,
}

impl Client {
    fn processing(&self, now: u64) -> bool {
        !self.zombie && now.saturating_sub(self.last_ok_sent) <= SELF_FENCE_MS
    }
}

struct Sim {
    rng: Rng,
    now: u64,
    stream: StreamDoc,
    group: GroupDoc,
    clients: Vec<Client>,
    next_id: u32,
    churn: bool,
    steps: u64,
    stats: BTreeMap<&'static str, u64>,
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut stream = StreamDoc::new("orders", 12, 0).unwrap();
        stream.add_group("g");
        let config = GroupConfig {
            session_timeout_ms: SESSION_MS,
            heartbeat_interval_ms: HEARTBEAT_MS,
            rebalance_timeout_ms: REBALANCE_MS,
            max_members: Some(12),
            ..GroupConfig::default()
        };
        let group = GroupDoc::new("g", config, &stream, 0);
        Sim {
            rng: Rng(seed | 1),
            now: 1,
            stream,
            group,
            clients: Vec::new(),
            next_id: 0,
            churn: true,
            steps: 0,
            stats: BTreeMap::new(),
        }
    }

    fn count(&mut self, what: &'static str) {
        *self.stats.entry(what).or_default() += 1;
    }

    fn step(&mut self) {
        self.steps += 1;
        let roll = self.rng.below(100);
        match roll {
            0..=5 if self.clients.len() < 14 => self.spawn_client(),
            6..=8 if !self.clients.is_empty() => {
                let i = self.rng.below(self.clients.len() as u64) as usize;
                self.leave(i);
            }
            9..=10 if !self.clients.is_empty() => {
                let i = self.rng.below(self.clients.len() as u64) as usize;
                self.clients[i].silent = true;
                self.count("silenced");
            }
            11..=25 => self.now += self.rng.below(1_500),
            26..=33 => self.expire(),
            34 => self.config_change(),
            35 if self.stream.running_reshard().is_none() => self.reshard(),
            36 if self.stream.last_reshard.is_some() => {
                if self.stream.rollback(self.now, 60_000).is_ok() {
                    self.count("rollbacks");
                    self.layout_changed();
                }
            }
            _ => {
                if let Some(i) = self.pick_live() {
                    self.heartbeat(i);
                }
            }
        }
        self.check_safety();
    }

    fn pick_live(&mut self) -> Option<usize> {
        let live: Vec<usize> = (0..self.clients.len())
            .filter(|&i| !self.clients[i].silent)
            .collect();
        (!live.is_empty()).then(|| live[self.rng.below(live.len() as u64) as usize])
    }

    fn spawn_client(&mut self) {
        self.next_id += 1;
        let slow = if self.rng.chance(25) {
            1 + self.rng.below(4) as u32
        } else {
            0
        };
        self.clients.push(Client {
            id: format!("m{}", self.next_id),
            epoch: 0,
            owned: BTreeSet::new(),
            last_ok_sent: 0,
            slow_revokes: slow,
            silent: false,
            zombie: false,
        });
        let i = self.clients.len() - 1;
        self.heartbeat(i);
    }

    fn leave(&mut self, i: usize) {
        let c = self.clients[i].clone();
        if c.epoch > 0 && !c.silent {
            match self.group.leave(&self.stream, &c.id, c.epoch) {
                Ok(()) => self.count("left"),
                Err(e) if e.code() == ErrorCode::UnknownMemberId => {}
                Err(e) if e.code() == ErrorCode::FencedMemberEpoch => {
                    // The process exits anyway; the coordinator expires it later.
                    self.clients[i].silent = true;
                    self.clients[i].owned.clear();
                    return;
                }
                Err(e) => panic!("leave refused with {e}"),
            }
            self.clients.remove(i);
        }
    }

    fn expire(&mut self) {
        for e in self.group.expire(&self.stream, self.now) {
            match e {
                GroupEvent::SessionExpired(id) => {
                    self.count("expired");
                    let c = self
                        .clients
                        .iter()
                        .find(|c| c.id == id)
                        .expect("known client");
                    assert!(
                        !c.processing(self.now),
                        "{id} expired while still handling (self-fence must come first)"
                    );
                }
                GroupEvent::RebalanceTimedOut(id) => {
                    self.count("rebalance_timeouts");
                    if let Some(c) = self.clients.iter_mut().find(|c| c.id == id) {
                        c.zombie = true;
                    }
                }
                _ => {}
            }
        }
        // Silent clients the coordinator removed are gone for good.
        let members = &self.group.members;
        self.clients
            .retain(|c| !c.silent || members.contains_key(&c.id));
    }

    fn config_change(&mut self) {
        let hb = if self.group.config.heartbeat_interval_ms == HEARTBEAT_MS {
            900
        } else {
            HEARTBEAT_MS
        };
        let patch = PatchGroupRequest {
            heartbeat_interval_ms: Some(hb),
            ..PatchGroupRequest::default()
        };
        assert!(self.group.update_config(&self.stream, &patch).unwrap());
        self.count("config_changes");
    }

    fn reshard(&mut self) {
        let to = 1 + self.rng.below(20) as u32;
        if self.stream.reshard(to, self.now).is_ok() {
            self.count("reshards");
            self.layout_changed();
        }
    }

    fn layout_changed(&mut self) {
        assert!(self.group.sync_layout(&self.stream));
    }

    fn heartbeat(&mut self, i: usize) {
        let lose = self.churn && self.rng.chance(10);
        let c = self.clients[i].clone();
        let drained: Vec<u32> = c
            .owned
            .iter()
            .copied()
            .filter(|s| self.stream.draining.contains_key(s))
            .filter(|_| !self.churn || self.rng.chance(30))
            .collect();
        let req = HeartbeatRequest {
            protocol_version: 1,
            member_id: c.id.clone(),
            member_epoch: c.epoch,
            owned_shards: Some(c.owned.iter().copied().collect()),
            drained_shards: drained,
            client: None,
            incarnation: None,
        };
        let sent = self.now;
        match self.group.heartbeat(&self.stream, &req, sent) {
            Ok(out) => {
                self.count("heartbeats");
                if !out.drained.is_empty() && self.stream.mark_drained("g", &out.drained, self.now)
                {
                    self.count("retirements");
                    self.layout_changed();
                }
                if lose {
                    self.count("lost_responses");
                    return;
                }
                let r = out.response;
                let c = &mut self.clients[i];
                c.last_ok_sent = sent;
                c.epoch = r.member_epoch;
                let assignment: BTreeSet<u32> = r.assignment.iter().copied().collect();
                let revoked: BTreeSet<u32> = c.owned.difference(&assignment).copied().collect();
                if !revoked.is_empty() {
                    if self.churn && c.slow_revokes > 0 && self.rng.chance(70) {
                        return; // keeps them a while longer (and takes nothing new)
                    }
                    c.owned.retain(|s| assignment.contains(s));
                }
                c.owned.extend(assignment);
            }
            Err(e) => match e.code() {
                ErrorCode::UnknownMemberId | ErrorCode::FencedMemberEpoch => {
                    self.count("rejoins");
                    let c = &mut self.clients[i];
                    c.epoch = 0;
                    c.owned.clear();
                    c.zombie = false;
                }
                ErrorCode::GroupMaxSizeReached => {
                    self.count("refused_joins");
                    self.clients.remove(i);
                }
                other => panic!("unexpected refusal {other}: {e}"),
            },
        }
    }

    fn check_safety(&self) {
        // Control plane: no shard held by two members.
        let mut holder: BTreeMap<u32, &str> = BTreeMap::new();
        for (id, m) in &self.group.members {
            for s in m.assigned.iter().chain(&m.pending_revocation) {
                if let Some(other) = holder.insert(*s, id) {
                    panic!("step {}: shard {s} held by {other} and {id}", self.steps);
                }
            }
        }
        // Data plane as the clients see it: no shard handled by two clients at once.
        let mut handler: BTreeMap<u32, &str> = BTreeMap::new();
        for c in self.clients.iter().filter(|c| c.processing(self.now)) {
            for s in &c.owned {
                if let Some(other) = handler.insert(*s, &c.id) {
                    panic!(
                        "step {}: shard {s} handled by {other} and {}",
                        self.steps, c.id
                    );
                }
            }
        }
    }

    /// Stops churn and runs heartbeat rounds until the group is stable; returns the rounds.
    fn converge(&mut self) -> u32 {
        self.churn = false;
        // Live members keep heartbeating while the silent ones expire.
        for _ in 0..=(SESSION_MS / HEARTBEAT_MS + 1) {
            self.now += HEARTBEAT_MS;
            self.heartbeat_round();
            self.expire();
        }
        assert!(
            self.clients.iter().all(|c| !c.silent),
            "silent members expired"
        );
        for round in 1..=12 {
            self.now += 100;
            self.heartbeat_round();
            self.expire();
            let converged = self.group.is_stable()
                && self.group.layout_version == self.stream.layout_version
                && self.stream.draining.is_empty()
                && self.clients.iter().all(|c| {
                    self.group
                        .members
                        .get(&c.id)
                        .is_some_and(|m| m.assigned == c.owned && m.state == MemberState::Stable)
                });
            if converged {
                return round;
            }
        }
        panic!(
            "did not converge after 12 rounds: {:#?}",
            self.group.members
        );
    }

    /// Every live client heartbeats once (clients may drop out while iterating).
    fn heartbeat_round(&mut self) {
        let ids: Vec<String> = self
            .clients
            .iter()
            .filter(|c| !c.silent)
            .map(|c| c.id.clone())
            .collect();
        for id in ids {
            if let Some(i) = self.clients.iter().position(|c| c.id == id) {
                self.heartbeat(i);
                self.check_safety();
            }
        }
    }

    fn check_balanced(&self) {
        let shards: BTreeSet<u32> = self.stream.assignable_shards().into_iter().collect();
        let counts: Vec<usize> = self
            .group
            .members
            .values()
            .map(|m| m.assigned.len())
            .collect();
        if counts.is_empty() {
            return;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(max - min <= 1, "unbalanced after convergence: {counts:?}");
        let all: BTreeSet<u32> = self
            .group
            .members
            .values()
            .flat_map(|m| m.assigned.iter().copied())
            .collect();
        assert_eq!(all, shards, "every shard is owned after convergence");
    }
}

fn run(seed: u64, steps: u64) -> BTreeMap<&'static str, u64> {
    let mut sim = Sim::new(seed);
    for _ in 0..steps {
        sim.step();
    }
    let rounds = sim.converge();
    sim.check_balanced();
    sim.stats.insert("convergence_rounds", u64::from(rounds));
    sim.stats
}

#[test]
fn random_churn_is_safe_and_converges() {
    let seeds: Vec<u64> = match std::env::var("RSC_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("RSC_SIM_SEED is a number")],
        Err(_) => (1..=24u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect(),
    };
    let mut total: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seed in seeds {
        for (k, v) in run(seed, 3_000) {
            *total.entry(k).or_default() += v;
        }
    }
    eprintln!("simulation totals: {total:?}");
    // The schedule must actually exercise the protocol's hard paths.
    for what in [
        "heartbeats",
        "lost_responses",
        "expired",
        "left",
        "rejoins",
        "reshards",
        "retirements",
    ] {
        assert!(
            total.get(what).copied().unwrap_or(0) > 0,
            "no {what} happened"
        );
    }
}
