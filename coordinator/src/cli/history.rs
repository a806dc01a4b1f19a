//! `group revisions`, `group diff` and `group restore` (PROTOCOL §22): the metadata history
//! of a group, the changes between two revisions, and the restore of a group's settings.

use super::client::{Client, ClientError};
use super::table::{Table, rfc3339_ms};
use crate::revisions::{Change, DiffView, RestorePlan, RevisionsPage};
use serde_json::Value;

/// The history commands of `rsc-coordinator group …`.
#[derive(Debug, clap::Subcommand)]
pub(super) enum HistoryCommand {
    /// The group document's metadata history, newest first (PROTOCOL §22): per committed
    /// change its revision, time, cause, principal and changed paths.
    Revisions {
        /// Group id.
        group: rsc_protocol::GroupId,
        /// Only revisions below this one (the next page).
        #[arg(long)]
        before: Option<u64>,
        /// Records per page (1..=1000, default 50).
        #[arg(long)]
        limit: Option<usize>,
    },
    /// What changed in the group document from one revision to another.
    Diff {
        /// Group id.
        group: rsc_protocol::GroupId,
        /// The earlier revision.
        #[arg(long)]
        from: u64,
        /// The later revision.
        #[arg(long)]
        to: u64,
    },
    /// Restore the group's settings as they were at a revision (PROTOCOL §22): every member
    /// is removed and rejoins at an epoch above any it held. A dry run by default: prints the
    /// plan; --execute applies.
    Restore {
        /// Group id.
        group: rsc_protocol::GroupId,
        /// The revision whose settings to restore.
        #[arg(long)]
        revision: u64,
        /// Restore even while members are live (they are fenced and rejoin).
        #[arg(long)]
        force: bool,
        /// Carry the restore out. Without it, a dry run: the plan is printed.
        #[arg(long)]
        execute: bool,
    },
}

/// Runs one history command: its answer as JSON and as text.
pub(super) async fn run(c: &Client, cmd: HistoryCommand) -> Result<(Value, String), ClientError> {
    match cmd {
        HistoryCommand::Revisions {
            group,
            before,
            limit,
        } => revisions(c, &group, before, limit).await,
        HistoryCommand::Diff { group, from, to } => diff(c, &group, from, to).await,
        HistoryCommand::Restore {
            group,
            revision,
            force,
            execute,
        } => restore(c, &group, revision, force, execute).await,
    }
}

/// Longest a value is shown in a table cell.
const CELL_MAX: usize = 60;

/// `group revisions G`: a page of the history, newest first.
async fn revisions(
    c: &Client,
    group: &str,
    before: Option<u64>,
    limit: Option<usize>,
) -> Result<(Value, String), ClientError> {
    let mut query = Vec::new();
    if let Some(b) = before {
        query.push(format!("before={b}"));
    }
    if let Some(l) = limit {
        query.push(format!("limit={l}"));
    }
    let f = c
        .revisions::<RevisionsPage>(group, false, &query.join("&"))
        .await?;
    Ok((f.json, render_page(&f.view)))
}

/// `group diff G --from R1 --to R2`.
async fn diff(c: &Client, group: &str, from: u64, to: u64) -> Result<(Value, String), ClientError> {
    let f = c.group_diff::<DiffView>(group, from, to).await?;
    let v = &f.view;
    let head = format!(
        "Group {} from revision {} to {}: {} changed path(s).\n\n",
        v.group,
        v.from,
        v.to,
        v.changes.len()
    );
    Ok((f.json, head + &changes_table(&v.changes).to_string()))
}

/// `group restore G --revision R [--force] [--execute]`: the plan, carried out with
/// `execute`.
async fn restore(
    c: &Client,
    group: &str,
    revision: u64,
    force: bool,
    execute: bool,
) -> Result<(Value, String), ClientError> {
    let body = serde_json::json!({"revision": revision, "force": force, "dry_run": !execute});
    let f = c.restore_group::<RestorePlan>(group, &body).await?;
    Ok((f.json, render_plan(&f.view)))
}

fn render_page(p: &RevisionsPage) -> String {
    let mut t = Table::new(["REVISION", "TIME", "CAUSE", "PRINCIPAL", "CHANGED"]);
    for r in &p.revisions {
        let paths: Vec<&str> = r.changes.iter().map(|c| c.path.as_str()).collect();
        t.row([
            r.revision.to_string(),
            rfc3339_ms(r.t_ms),
            r.cause.to_string(),
            r.principal.clone(),
            clip(&paths.join(" ")),
        ]);
    }
    let mut out = format!(
        "{} at revision {}; {} record(s) shown, newest first.\n\n{t}",
        p.name,
        p.revision,
        p.revisions.len()
    );
    if let Some(b) = p.next_before {
        out.push_str(&format!("\nOlder records: --before {b}\n"));
    }
    out
}

fn render_plan(p: &RestorePlan) -> String {
    let what = match (p.dry_run, p.revision) {
        (true, _) => format!(
            "Dry run: restoring group {} to the settings of revision {} would",
            p.group, p.to_revision
        ),
        (false, Some(r)) => format!(
            "Restored group {} to the settings of revision {} (now at revision {r}):",
            p.group, p.to_revision
        ),
        (false, None) => format!("Restored group {}:", p.group),
    };
    let mut out = format!(
        "{what} remove {} member(s) ({}) and set the group epoch to {} (above every epoch \
         held: removed members rejoin).\n\n{}",
        p.members_removed.len(),
        if p.members_removed.is_empty() {
            "-".to_owned()
        } else {
            p.members_removed.join(", ")
        },
        p.group_epoch,
        changes_table(&p.changes)
    );
    if p.dry_run {
        out.push_str("\nNothing changed. Run again with --execute to restore.\n");
    }
    out
}

fn changes_table(changes: &[Change]) -> Table {
    let mut t = Table::new(["PATH", "BEFORE", "AFTER"]);
    for c in changes {
        t.row([c.path.clone(), value(c.old.as_ref()), value(c.new.as_ref())]);
    }
    t
}

fn value(v: Option<&Value>) -> String {
    v.map_or_else(|| "(absent)".to_owned(), |v| clip(&v.to_string()))
}

fn clip(s: &str) -> String {
    if s.chars().count() <= CELL_MAX {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(CELL_MAX - 1).collect();
    out.push('…');
    out
}
