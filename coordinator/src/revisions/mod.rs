//! The metadata history (PROTOCOL §22): one compact record per committed change of a group
//! or stream document, written with the document in the same atomic step.
//!
//! Pure: no I/O. A record holds the change as a list of [`Change`]s — for each changed path
//! of the document's JSON, the value before and after — so that a document at an earlier
//! revision is the current document with the records after it undone, newest first
//! ([`rewind`]), and two revisions compare by rewinding to each ([`diff`]). Arrays are
//! compared whole; objects path by path. Liveness (`last_heartbeat_ms`) is left out: it is
//! kept outside the document and never makes a change.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;

/// Why a document changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// An operator's request (create, patch, pause, seek, remove a member, …).
    Admin,
    /// A member's heartbeat or leave.
    Heartbeat,
    /// The coordinator's expiry sweep (sessions, revocation timeouts).
    Sweep,
    /// A reshard or rollback and its progress.
    Reshard,
    /// A restore: from the recovery copy (PROTOCOL §2.3) or to a revision.
    Restore,
}

impl Cause {
    /// The name PROTOCOL uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Admin => "admin",
            Cause::Heartbeat => "heartbeat",
            Cause::Sweep => "sweep",
            Cause::Reshard => "reshard",
            Cause::Restore => "restore",
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One changed path: its value before (`o`, absent when the path was added) and after (`n`,
/// absent when it was removed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Change {
    /// JSON pointer (RFC 6901) of the changed value.
    #[serde(rename = "k")]
    pub path: String,
    /// The value before, absent when the path was added.
    #[serde(
        rename = "o",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub old: Option<Value>,
    /// The value after, absent when the path was removed.
    #[serde(
        rename = "n",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub new: Option<Value>,
}

/// A present value, `null` included (serde would read `null` as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// One record of a document's history, as stored (compact keys) and as answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Record {
    /// When the change was committed (Unix ms).
    #[serde(rename = "t")]
    pub t_ms: u64,
    /// The document revision the change produced.
    #[serde(rename = "r")]
    pub revision: u64,
    /// Why.
    #[serde(rename = "c")]
    pub cause: Cause,
    /// Who: the admin token's principal, the member id, or `rsc-coordinator`.
    #[serde(rename = "p")]
    pub principal: String,
    /// What changed.
    #[serde(rename = "d")]
    pub changes: Vec<Change>,
}

/// Who and why, for the record of a write about to be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// Why.
    pub cause: Cause,
    /// Who.
    pub principal: String,
}

impl Actor {
    /// The coordinator itself, for `cause`.
    pub fn coordinator(cause: Cause) -> Self {
        Actor {
            cause,
            principal: "rsc-coordinator".into(),
        }
    }
}

/// A record ready for the store: everything but the revision, which the store's
/// compare-and-set decides. [`Note::body`] is the JSON object without its opening `{` and
/// without `t` and `r`, which the store writes first (`{"t":…,"r":…,` + body), so that age
/// trimming reads a record's time without decoding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// Commit time (Unix ms).
    pub t_ms: u64,
    /// `"c":…,"p":…,"d":[…]}`.
    pub body: String,
}

impl Note {
    /// The note of a change from `before` (`None`: created) to `after`, or `None` when
    /// nothing but liveness changed.
    pub fn of(actor: &Actor, t_ms: u64, before: Option<&Value>, after: &Value) -> Option<Note> {
        let empty = Value::Object(Map::new());
        let changes = changes(before.unwrap_or(&empty), after);
        if changes.is_empty() && before.is_some() {
            return None;
        }
        Some(Note::with_changes(actor, t_ms, &changes))
    }

    /// The note of `changes` (possibly none).
    pub fn with_changes(actor: &Actor, t_ms: u64, changes: &[Change]) -> Note {
        let body = serde_json::json!({"c": actor.cause, "p": actor.principal, "d": changes});
        let text = body.to_string();
        Note {
            t_ms,
            body: text[1..].to_owned(),
        }
    }

    /// A note with no change, by the coordinator (cause `admin`) at time 0: for tests of the
    /// stores that do not look at the history.
    pub fn blank() -> Note {
        Note::with_changes(&Actor::coordinator(Cause::Admin), 0, &[])
    }

    /// The stored record this note becomes at `revision` (what the stores write).
    pub fn record_json(&self, revision: u64) -> String {
        format!("{{\"t\":{},\"r\":{revision},{}", self.t_ms, self.body)
    }
}

/// Whether a path is liveness only (never recorded).
fn ignored(key: &str) -> bool {
    key == "last_heartbeat_ms"
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn unescape(key: &str) -> String {
    key.replace("~1", "/").replace("~0", "~")
}

/// The changes from `before` to `after`: objects compared key by key, anything else whole.
pub fn changes(before: &Value, after: &Value) -> Vec<Change> {
    let mut out = Vec::new();
    walk(String::new(), before, after, &mut out);
    out
}

fn walk(path: String, before: &Value, after: &Value, out: &mut Vec<Change>) {
    if before == after {
        return;
    }
    let (Value::Object(b), Value::Object(a)) = (before, after) else {
        out.push(Change {
            path,
            old: Some(before.clone()),
            new: Some(after.clone()),
        });
        return;
    };
    for (k, bv) in b {
        if ignored(k) {
            continue;
        }
        let p = format!("{path}/{}", escape(k));
        match a.get(k) {
            Some(av) => walk(p, bv, av, out),
            None => out.push(Change {
                path: p,
                old: Some(bv.clone()),
                new: None,
            }),
        }
    }
    for (k, av) in a {
        if !ignored(k) && !b.contains_key(k) {
            out.push(Change {
                path: format!("{path}/{}", escape(k)),
                old: None,
                new: Some(av.clone()),
            });
        }
    }
}

/// Why a document could not be rewound.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RewindError {
    /// The history no longer holds (or never held) the records after `revision`.
    #[error("revision {revision} is not in the history (it holds revisions {oldest}..={newest})")]
    NotKept {
        /// The revision asked for.
        revision: u64,
        /// The oldest kept record's revision (a document at `oldest - 1` is the oldest that
        /// can be rebuilt).
        oldest: u64,
        /// The current revision.
        newest: u64,
    },
    /// A record does not apply to the document (the history and the document disagree).
    #[error("the record of revision {0} does not apply to the document")]
    Inconsistent(u64),
}

/// `doc` (at `current`) as it was at `revision`, from `records` (any order): each record
/// newer than `revision` is undone, newest first. Revision 0 is the absent document: the
/// answer is then an empty object.
pub fn rewind(
    doc: &Value,
    current: u64,
    records: &[Record],
    revision: u64,
) -> Result<Value, RewindError> {
    let mut newer: Vec<&Record> = records
        .iter()
        .filter(|r| r.revision > revision && r.revision <= current)
        .collect();
    newer.sort_by_key(|r| std::cmp::Reverse(r.revision));
    let contiguous = newer
        .iter()
        .enumerate()
        .all(|(i, r)| r.revision == current - i as u64);
    if revision > current || newer.len() as u64 != current - revision || !contiguous {
        return Err(RewindError::NotKept {
            revision,
            oldest: records
                .iter()
                .map(|r| r.revision)
                .min()
                .unwrap_or(current + 1),
            newest: current,
        });
    }
    let mut out = doc.clone();
    for r in newer {
        for c in r.changes.iter().rev() {
            set(&mut out, &c.path, c.old.clone())
                .map_err(|_| RewindError::Inconsistent(r.revision))?;
        }
    }
    Ok(out)
}

/// The changes from revision `from` to revision `to` of `doc` (at `current`).
pub fn diff(
    doc: &Value,
    current: u64,
    records: &[Record],
    from: u64,
    to: u64,
) -> Result<Vec<Change>, RewindError> {
    let a = rewind(doc, current, records, from)?;
    let b = rewind(doc, current, records, to)?;
    Ok(changes(&a, &b))
}

/// Sets (or, with `None`, removes) the value at `path`; the parent must exist.
fn set(doc: &mut Value, path: &str, value: Option<Value>) -> Result<(), ()> {
    if path.is_empty() {
        *doc = value.unwrap_or(Value::Object(Map::new()));
        return Ok(());
    }
    let (parent, last) = path.rsplit_once('/').ok_or(())?;
    let mut at = doc;
    for part in parent.split('/').skip(1) {
        at = at.get_mut(unescape(part)).ok_or(())?;
    }
    let Value::Object(map) = at else {
        return Err(());
    };
    match value {
        Some(v) => map.insert(unescape(last), v),
        None => map.remove(&unescape(last)),
    };
    Ok(())
}

/// `GET /v1/groups/{group}/revisions` and `GET /v1/streams/{stream}/revisions`: a page of
/// the kept history, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RevisionsPage {
    /// The group or stream.
    pub name: String,
    /// The document's current revision.
    pub revision: u64,
    /// Records, newest first, each with a revision below `?before` (when given).
    pub revisions: Vec<Record>,
    /// The `?before` of the next (older) page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<u64>,
}

/// `GET /v1/groups/{group}/diff?from=R1&to=R2`: what changed from one revision to another.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DiffView {
    /// Group id.
    pub group: String,
    /// The earlier revision.
    pub from: u64,
    /// The later revision.
    pub to: u64,
    /// Each changed path with its value at `from` (`o`) and at `to` (`n`).
    pub changes: Vec<Change>,
}

/// `POST /v1/groups/{group}/restore` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// The revision whose settings to restore.
    pub revision: u64,
    /// Restore even while members are live (they are removed and fenced).
    #[serde(default)]
    pub force: bool,
    /// Only answer the plan: nothing changes.
    #[serde(default)]
    pub dry_run: bool,
}

/// `POST /v1/groups/{group}/restore` answer: the plan, carried out unless `dry_run`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RestorePlan {
    /// Group id.
    pub group: String,
    /// Nothing was changed: this is what the restore would do.
    pub dry_run: bool,
    /// The revision whose settings are restored.
    pub to_revision: u64,
    /// The document's revision before the restore.
    pub from_revision: u64,
    /// The revision the restore wrote (absent in a dry run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// The group (and assignment) epoch after the restore: above every epoch recorded.
    pub group_epoch: u64,
    /// Members removed (they rejoin, at epochs above any they held).
    pub members_removed: Vec<String>,
    /// What changes, from the current document to the restored one.
    pub changes: Vec<Change>,
}

tokio::task_local! {
    static ADMIN: String;
}

/// Runs `f` as an admin request of `principal`: the document writes it makes are recorded
/// with that principal (the access middleware wraps every admin route in it).
pub(crate) async fn as_admin<F: std::future::Future>(principal: String, f: F) -> F::Output {
    ADMIN.scope(principal, f).await
}

/// Who makes a write: inside [`as_admin`], the admin principal with `admin_cause`;
/// otherwise `fallback`.
pub(crate) fn actor(admin_cause: Cause, fallback: impl FnOnce() -> Actor) -> Actor {
    ADMIN
        .try_with(|p| Actor {
            cause: admin_cause,
            principal: p.clone(),
        })
        .unwrap_or_else(|_| fallback())
}

/// The note of a write of `after` over `before` (`None`: created), by `actor` at `t_ms`;
/// a write that changed nothing but liveness still gets a record (with no changes).
pub fn note_of<T: Serialize>(actor: &Actor, t_ms: u64, before: Option<&T>, after: &T) -> Note {
    let to_value = |d: &T| serde_json::to_value(d).unwrap_or(Value::Null);
    let before = before.map(to_value);
    let after = to_value(after);
    Note::of(actor, t_ms, before.as_ref(), &after)
        .unwrap_or_else(|| Note::with_changes(actor, t_ms, &[]))
}

#[cfg(test)]
mod tests;
