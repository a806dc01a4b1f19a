//! Whether a consumer app is ready to work its share of the streams: every member joined,
//! the data Redis answers (see [`super::health`]). Read by `AppHandle::not_ready` and the
//! ops endpoints' `/readyz`.

use super::health::DataRedis;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::watch;

/// How many not-joined member ids a reason names.
const NAMED: usize = 3;

/// The app's members (each with its "joined" flag, set by the member) and the data Redis
/// probe (once the app runs).
#[derive(Debug)]
pub(crate) struct Readiness {
    members: Vec<(String, Arc<AtomicBool>)>,
    /// The app's data Redis probe, with the Redis's label (password hidden).
    data: Mutex<Option<(watch::Receiver<DataRedis>, String)>>,
}

impl Readiness {
    /// Not ready: none of `members` joined, the app does not run.
    pub(crate) fn new(members: impl IntoIterator<Item = String>) -> Self {
        Readiness {
            members: members.into_iter().map(|m| (m, Arc::default())).collect(),
            data: Mutex::new(None),
        }
    }

    /// The flag member `member_id` sets while it is a member of its group in good standing.
    pub(crate) fn joined(&self, member_id: &str) -> Arc<AtomicBool> {
        self.members
            .iter()
            .find(|(m, _)| m == member_id)
            .map_or_else(Arc::default, |(_, f)| f.clone())
    }

    /// The app runs: its data Redis is watched by `probe`.
    pub(crate) fn watch_data(&self, probe: watch::Receiver<DataRedis>, label: String) {
        *self.data.lock().unwrap_or_else(PoisonError::into_inner) = Some((probe, label));
    }

    /// Why the app is not ready (`None`: it is).
    pub(crate) fn not_ready(&self) -> Option<String> {
        let data = self.data.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((probe, label)) = data.as_ref() else {
            return Some("not running".into());
        };
        match &*probe.borrow() {
            DataRedis::Up => {}
            DataRedis::Unknown => return Some(format!("data Redis {label}: not probed yet")),
            DataRedis::Down { error, .. } => return Some(format!("data Redis {label}: {error}")),
        }
        let waiting: Vec<&str> = (self.members.iter())
            .filter(|(_, joined)| !joined.load(Ordering::Relaxed))
            .map(|(m, _)| m.as_str())
            .collect();
        match waiting.len() {
            0 => None,
            n if n <= NAMED => Some(format!("not joined: {}", waiting.join(", "))),
            n => Some(format!(
                "not joined: {} and {} more",
                waiting[..NAMED].join(", "),
                n - NAMED
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_the_data_redis_answers_and_every_member_joined() {
        let r = Readiness::new((0..5).map(|i| format!("m-{i}")));
        assert_eq!(r.not_ready().as_deref(), Some("not running"));
        let (tx, rx) = watch::channel(DataRedis::Unknown);
        r.watch_data(rx, "redis://h:1".into());
        assert!(r.not_ready().unwrap().starts_with("data Redis redis://h:1"));
        tx.send_replace(DataRedis::Up);
        assert_eq!(
            r.not_ready().as_deref(),
            Some("not joined: m-0, m-1, m-2 and 2 more")
        );
        for i in 0..4 {
            r.joined(&format!("m-{i}")).store(true, Ordering::Relaxed);
        }
        assert_eq!(r.not_ready().as_deref(), Some("not joined: m-4"));
        r.joined("m-4").store(true, Ordering::Relaxed);
        assert_eq!(r.not_ready(), None);
        tx.send_replace(DataRedis::Down {
            since: tokio::time::Instant::now(),
            error: "refused".into(),
        });
        assert_eq!(
            r.not_ready().as_deref(),
            Some("data Redis redis://h:1: refused")
        );
    }
}
