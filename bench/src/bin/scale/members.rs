//! Simulated members and the load they send.

use super::*;

/// One simulated member: what it sends in its next heartbeat.
#[derive(Debug, Clone)]
pub(crate) struct Sim {
    pub(crate) group: String,
    pub(crate) id: String,
    pub(crate) epoch: i64,
    pub(crate) owned: Vec<u32>,
}

impl Sim {
    pub(crate) fn request(&self) -> HeartbeatRequest {
        HeartbeatRequest {
            protocol_version: 1,
            member_id: self.id.clone(),
            member_epoch: self.epoch,
            owned_shards: Some(self.owned.clone()),
            drained_shards: Vec::new(),
            client: None,
            incarnation: None,
        }
    }

    /// Takes an answer: the member owns what it is assigned at once. True when it changed
    /// anything the member sends next.
    pub(crate) fn apply(&mut self, r: &HeartbeatResponse) -> bool {
        let changed = r.member_epoch != self.epoch || r.assignment != self.owned;
        self.epoch = r.member_epoch;
        self.owned = r.assignment.clone();
        changed
    }
}

/// P processes × `batch` members over G groups: member j of process p is in group
/// `(p × batch + j) mod G`, so a process's members are in `batch` different groups (when
/// G ≥ batch) and a group's members in different processes.
pub(crate) struct Fleet {
    pub(crate) sims: Vec<Mutex<Sim>>,
    /// Member indices of each process.
    pub(crate) processes: Vec<Vec<usize>>,
    pub(crate) groups: Vec<(String, String)>,
    pub(crate) shards: u32,
}

impl Fleet {
    pub(crate) fn new(
        tag: &str,
        processes: usize,
        batch: usize,
        groups: usize,
        per_stream: usize,
    ) -> Self {
        let groups_v: Vec<(String, String)> = (0..groups)
            .map(|g| (format!("{tag}-g{g}"), format!("{tag}-s{}", g / per_stream)))
            .collect();
        let mut sims = Vec::new();
        let mut procs = Vec::new();
        for p in 0..processes {
            let mut mine = Vec::new();
            for j in 0..batch {
                let k = p * batch + j;
                mine.push(sims.len());
                sims.push(Mutex::new(Sim {
                    group: groups_v[k % groups].0.clone(),
                    id: format!("{tag}-p{p}-m{j}"),
                    epoch: 0,
                    owned: Vec::new(),
                }));
            }
            procs.push(mine);
        }
        // As many shards as a group has members: each member owns about one.
        let shards = (processes * batch).div_ceil(groups).clamp(1, 4096) as u32;
        Fleet {
            sims,
            processes: procs,
            groups: groups_v,
            shards,
        }
    }

    pub(crate) fn sim(&self, i: usize) -> Sim {
        self.sims[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn batch_request(&self, p: usize) -> HeartbeatBatchRequest {
        HeartbeatBatchRequest {
            heartbeats: self.processes[p]
                .iter()
                .map(|&i| {
                    let s = self.sim(i);
                    BatchedHeartbeat {
                        group: s.group.clone(),
                        heartbeat: s.request(),
                    }
                })
                .collect(),
        }
    }

    /// Applies a batch answer of process `p`; returns (changed, item errors by code).
    pub(crate) fn apply_batch(&self, p: usize, r: &HeartbeatBatchResponse) -> (bool, Vec<String>) {
        let mut changed = false;
        let mut errors = Vec::new();
        for (&i, item) in self.processes[p].iter().zip(&r.results) {
            match (&item.response, item.status) {
                (Some(resp), 200) => {
                    changed |= self.sims[i]
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .apply(resp);
                }
                _ => {
                    let code = item
                        .error
                        .as_ref()
                        .map(|e| e.code.as_str().to_owned())
                        .unwrap_or_else(|| format!("status {}", item.status));
                    if is_lost(&code) {
                        // As a client does: join again.
                        let mut sim = self.sims[i].lock().unwrap_or_else(|p| p.into_inner());
                        sim.epoch = 0;
                        sim.owned.clear();
                    }
                    errors.push(code);
                }
            }
        }
        if r.results.len() != self.processes[p].len() {
            errors.push("result count".into());
        }
        (changed, errors)
    }
}

/// Sends process `p`'s batch; returns the answer, or `None` when the route does not exist.
pub(crate) async fn send_batch(
    http: &reqwest::Client,
    base: &str,
    fleet: &Fleet,
    p: usize,
) -> Result<Option<HeartbeatBatchResponse>> {
    let r = http
        .post(format!("{base}/v1/heartbeats"))
        .json(&fleet.batch_request(p))
        .send()
        .await?;
    match r.status().as_u16() {
        200 => Ok(Some(r.json().await?)),
        404 | 405 => Ok(None),
        s => bail!("POST /v1/heartbeats: {s} {}", r.text().await?),
    }
}

/// The member is no longer in the group (expired, or fenced): it must join again.
pub(crate) fn is_lost(code: &str) -> bool {
    code == "UNKNOWN_MEMBER_ID" || code == "FENCED_MEMBER_EPOCH"
}

/// Heartbeats every process's batch (process p to `bases[p mod len]`) until one whole round
/// changes nothing; `None` when the batch route does not exist.
pub(crate) async fn converge_batched(
    http: &reqwest::Client,
    bases: &[String],
    fleet: &Arc<Fleet>,
    concurrency: usize,
    deadline: Duration,
) -> Result<Option<usize>> {
    let until = Instant::now() + deadline;
    // Item errors while joining (e.g. STORE_UNAVAILABLE under lock contention): retried in
    // the next round, and reported.
    let errors = Arc::new(Mutex::new(std::collections::BTreeMap::<String, u64>::new()));
    for round in 1..=50 {
        let changed = Arc::new(AtomicBool::new(false));
        let missing = Arc::new(AtomicBool::new(false));
        let bases = Arc::new(bases.to_vec());
        let (f, c, m, h, e) = (
            fleet.clone(),
            changed.clone(),
            missing.clone(),
            http.clone(),
            errors.clone(),
        );
        let left = until.saturating_duration_since(Instant::now());
        for_each_concurrent(fleet.processes.len(), concurrency, left, move |p| {
            let (f, c, m, h, e, bases) = (
                f.clone(),
                c.clone(),
                m.clone(),
                h.clone(),
                e.clone(),
                bases.clone(),
            );
            async move {
                match send_batch(&h, &bases[p % bases.len()], &f, p).await? {
                    None => m.store(true, Ordering::Relaxed),
                    Some(r) => {
                        let (changed, errors) = f.apply_batch(p, &r);
                        if changed || !errors.is_empty() {
                            c.store(true, Ordering::Relaxed);
                        }
                        if !errors.is_empty() {
                            let mut seen = e.lock().unwrap_or_else(|p| p.into_inner());
                            for code in errors {
                                *seen.entry(code).or_insert(0u64) += 1;
                            }
                        }
                    }
                }
                Ok(())
            }
        })
        .await?;
        if missing.load(Ordering::Relaxed) {
            return Ok(None);
        }
        if !changed.load(Ordering::Relaxed) {
            let errors = errors.lock().unwrap_or_else(|p| p.into_inner());
            if !errors.is_empty() {
                println!("  item errors while joining (retried): {errors:?}");
            }
            return Ok(Some(round));
        }
    }
    bail!(
        "members did not converge in 50 rounds; item errors: {:?}",
        errors.lock().unwrap_or_else(|p| p.into_inner())
    )
}

/// Is `POST /v1/heartbeats` served? An empty batch is refused (400) by a coordinator that
/// has the route, and not found (404) by one that has not.
pub(crate) async fn batch_route_available(http: &reqwest::Client, base: &str) -> Result<bool> {
    let r = http
        .post(format!("{base}/v1/heartbeats"))
        .json(&json!({"heartbeats": []}))
        .send()
        .await?;
    Ok(!matches!(r.status().as_u16(), 404 | 405))
}

pub(crate) const NO_BATCH_ROUTE: &str =
    "batch route not available (POST /v1/heartbeats answered 404)";

// ---------------------------------------------------------------------------------------------
// Closed-loop load.

/// A prepared request: URL, JSON body, member heartbeats it carries.
#[derive(Clone)]
pub(crate) struct Prepared {
    pub(crate) url: String,
    /// Serialized once, for the run: the load generator neither encodes nor copies a body
    /// while it measures.
    pub(crate) body: &'static [u8],
    pub(crate) items: u64,
    pub(crate) batch: bool,
}

pub(crate) struct LoadResult {
    /// Member heartbeats answered 200, per second.
    pub(crate) items_per_s: f64,
    /// Member heartbeats answered 200.
    pub(crate) items: u64,
    /// Items answered with an error, or requests that failed.
    pub(crate) errors: u64,
}

/// The statuses of a `POST /v1/heartbeats` answer (PROTOCOL's batch body; every other field
/// of an item is skipped unread).
#[derive(serde::Deserialize)]
pub(crate) struct BatchStatuses {
    pub(crate) results: Vec<ItemStatus>,
}

/// One item's status in [`BatchStatuses`].
#[derive(serde::Deserialize)]
pub(crate) struct ItemStatus {
    pub(crate) status: u16,
}

/// `concurrency` loops sending `requests` round robin for `duration`.
pub(crate) async fn closed_loop(
    http: &reqwest::Client,
    concurrency: usize,
    duration: Duration,
    requests: Arc<Vec<Prepared>>,
) -> Result<LoadResult> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let (http, stop, done, errors, requests) = (
            http.clone(),
            stop.clone(),
            done.clone(),
            errors.clone(),
            requests.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut n = 0usize;
            // Bounded: the stop flag ends it; the count is a backstop.
            while !stop.load(Ordering::Relaxed) && n < 100_000_000 {
                let r = &requests[(w + n * concurrency) % requests.len()];
                n += 1;
                let sent = http
                    .post(&r.url)
                    .header("content-type", "application/json")
                    .body(r.body)
                    .send()
                    .await;
                let Ok(resp) = sent else {
                    errors.fetch_add(r.items, Ordering::Relaxed);
                    continue;
                };
                if !resp.status().is_success() {
                    errors.fetch_add(r.items, Ordering::Relaxed);
                    continue;
                }
                if r.batch {
                    // Each item's status, read without building its answer: the load
                    // generator shares the cores with the coordinator, and the single
                    // requests' loop reads nothing but the status either.
                    match resp.json::<BatchStatuses>().await {
                        Ok(b) => {
                            let ok = b.results.iter().filter(|x| x.status == 200).count() as u64;
                            done.fetch_add(ok, Ordering::Relaxed);
                            errors.fetch_add(r.items - ok, Ordering::Relaxed);
                        }
                        Err(_) => {
                            errors.fetch_add(r.items, Ordering::Relaxed);
                        }
                    }
                } else {
                    let _ = resp.bytes().await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(duration).await;
    let items = done.load(Ordering::Relaxed);
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }
    Ok(LoadResult {
        items_per_s: items as f64 / elapsed.as_secs_f64(),
        items,
        errors: errors.load(Ordering::Relaxed),
    })
}

pub(crate) fn prepared_singles(fleet: &Fleet, base: &str) -> Vec<Prepared> {
    // Round robin over processes, then members: consecutive sends hit different groups.
    let mut v = Vec::new();
    for j in 0..fleet.processes.first().map_or(0, Vec::len) {
        for p in &fleet.processes {
            let s = fleet.sim(p[j]);
            v.push(Prepared {
                url: format!("{base}/v1/groups/{}/heartbeat", s.group),
                body: serde_json::to_vec(&s.request()).expect("json").leak(),
                items: 1,
                batch: false,
            });
        }
    }
    v
}

pub(crate) fn prepared_batches(fleet: &Fleet, bases: &[String]) -> Vec<Prepared> {
    (0..fleet.processes.len())
        .map(|p| Prepared {
            url: format!("{}/v1/heartbeats", bases[p % bases.len()]),
            body: serde_json::to_vec(&fleet.batch_request(p))
                .expect("json")
                .leak(),
            items: fleet.processes[p].len() as u64,
            batch: true,
        })
        .collect()
}

pub(crate) fn http_client(concurrency: usize) -> Result<reqwest::Client> {
    rsc_client::install_crypto_provider();
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency.max(32))
        .timeout(Duration::from_secs(30))
        .build()?)
}
