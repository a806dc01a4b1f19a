//! The operators' CLI (PROTOCOL §8): `rsc-coordinator group|stream|member …`.
//!
//! Every command is one or two calls to the coordinator's `/v1` API through the shared
//! [`rsc_api::CoordinatorClient`]. Human
//! tables by default; `--output json` prints the coordinator's JSON unchanged, for scripts.
//!
//! Exit status: `0` success; `1` the coordinator refused the request (a 4xx answer: unknown
//! group, bad argument, missing token, …); `2` bad command line; `3` the coordinator is
//! unreachable or failed (5xx, timeout, not a coordinator); `4` `--wait` did not see the
//! reshard complete (time-out, or replaced by a rollback). Errors go to stderr as
//! `error: CODE: message`.

mod client;
mod duration;
mod history;
pub(crate) use duration::parse_ms;
mod render;
mod table;

use client::{Client, ClientError, Fetched};

use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rsc_protocol::{
    CreateGroupRequest, ErrorCode, GroupId, MemberId, PatchStreamRequest, ReshardState,
    ReshardingView, RetentionPolicy, StartPosition, StreamId, StreamView,
};
use serde_json::{Value, json};
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Exit status of a successful command.
pub const EXIT_OK: u8 = 0;
/// Exit status when the coordinator refused the request (4xx).
pub const EXIT_REFUSED: u8 = 1;
/// Exit status of a bad command line (also what clap uses).
pub const EXIT_USAGE: u8 = 2;
/// Exit status when the coordinator is unreachable or failed (5xx, timeout, bad answer).
pub const EXIT_UNAVAILABLE: u8 = 3;
/// Exit status when `--wait` did not see the reshard complete.
pub const EXIT_WAIT_FAILED: u8 = 4;

/// Shown under every operator command's `--help`.
const EXIT_HELP: &str = "Exit status: 0 done; 1 refused by the coordinator (4xx: unknown group, \
bad argument, missing token, ...); 2 bad command line; 3 coordinator unreachable or failing \
(5xx, timeout); 4 --wait did not see the reshard complete.";

/// How often `--wait` polls the stream.
const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum OutputFormat {
    /// Human-readable tables.
    #[default]
    Table,
    /// The coordinator's JSON, pretty-printed.
    Json,
}

/// Options every operator command takes (before or after the sub-command), listed apart
/// from a command's own under "Global options". `Debug` hides the token (PROTOCOL §12).
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Global options")]
pub struct ClientOptions {
    /// Base URL of the coordinator.
    #[arg(
        long,
        global = true,
        env = "RSC_COORDINATOR_URL",
        default_value = "http://127.0.0.1:7070",
        value_name = "URL"
    )]
    pub coordinator: String,
    /// Bearer token (role admin for changes, viewer for reads).
    #[arg(long, global = true, env = "RSC_TOKEN", hide_env_values = true)]
    pub token: Option<rsc_protocol::redact::SecretString>,
    /// File holding the bearer token, read again when it changes (a Kubernetes projected
    /// service-account token); takes the place of `--token`.
    #[arg(long, global = true, env = "RSC_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// CA certificate (PEM) trusted for an `https://` coordinator, besides the system's.
    #[arg(long, global = true, env = "RSC_COORDINATOR_CA", value_name = "FILE")]
    pub coordinator_ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for a coordinator that asks for one (mutual TLS).
    #[arg(long, global = true, env = "RSC_COORDINATOR_CERT", value_name = "FILE")]
    pub coordinator_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of `--coordinator-cert`.
    #[arg(long, global = true, env = "RSC_COORDINATOR_KEY", value_name = "FILE")]
    pub coordinator_key: Option<std::path::PathBuf>,
    /// Output format: human tables, or the API's JSON for scripts.
    #[arg(long, global = true, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// The operator sub-commands of `rsc-coordinator`.
#[derive(Debug, Subcommand)]
pub enum OperatorCommand {
    /// Consumer groups: create, describe (positions per shard), list, pause, resume, seek
    /// (replay or skip entries), revisions, diff, restore (metadata history), delete.
    Group(GroupArgs),
    /// Streams: describe, list, reshard, retention, rollback.
    Stream(StreamArgs),
    /// Members: remove (fence) a member.
    Member(MemberArgs),
    /// Dead letters: list (depth per group, filtered pages), purge (dry run first), redrive
    /// to their shards.
    Dlq(DlqArgs),
}

/// `rsc-coordinator group …`.
#[derive(Debug, Args)]
#[command(after_help = EXIT_HELP)]
pub struct GroupArgs {
    #[command(flatten)]
    client: ClientOptions,
    #[command(subcommand)]
    command: GroupCommand,
}

#[derive(Debug, Subcommand)]
enum GroupCommand {
    /// Create a group on a stream (creating the stream when it is new).
    Create(Box<CreateArgs>),
    /// Show a group: shards with target and current owners, position (last delivered entry),
    /// lag, pending entries, and members.
    Describe {
        /// Group id.
        group: GroupId,
    },
    /// List every group.
    List,
    /// Pause a group: every member stops fetching within one heartbeat and keeps its shards;
    /// durable until `resume` (survives rebalances and restarts).
    Pause {
        /// Group id.
        group: GroupId,
    },
    /// Resume a paused group.
    Resume {
        /// Group id.
        group: GroupId,
    },
    /// Move a paused (or member-less) group's position on its shards (PROTOCOL §18): entries
    /// after the new position are delivered (again). A dry run by default: prints, per shard,
    /// the position now and after, and the entries to be delivered again; --execute applies.
    #[command(after_help = SEEK_HELP)]
    Seek(Box<SeekArgs>),
    /// `revisions`, `diff`, `restore` (PROTOCOL §22).
    #[command(flatten)]
    History(history::HistoryCommand),
    /// Delete a group.
    Delete {
        /// Group id.
        group: GroupId,
        /// Delete even when the group has live members (they are fenced).
        #[arg(long)]
        force: bool,
    },
}

/// Shown under `group seek --help`.
const SEEK_HELP: &str = "Examples:
  rsc-coordinator group pause billing
  rsc-coordinator group seek billing --to earliest               # the plan only
  rsc-coordinator group seek billing --to earliest --execute
  rsc-coordinator group seek billing --to 2026-01-31T09:30:00Z --execute
  rsc-coordinator group seek billing --by-duration 10m --execute
  rsc-coordinator group seek billing --shift-by -100 --execute   # 100 entries back per shard
  rsc-coordinator group seek billing --shard 3 --to-id 1767225600000-0 --execute
  rsc-coordinator group resume billing

Exit status: 0 done; 1 refused by the coordinator (4xx: the group runs, unknown group, bad \
target, ...); 2 bad command line; 3 coordinator unreachable or failing (5xx, timeout).";

/// `group seek`'s arguments: one target, optional shards, dry run or execute.
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("target")
        .required(true)
        .args(["to", "to_id", "by_duration", "shift_by"])
))]
struct SeekArgs {
    /// Group id.
    group: GroupId,
    /// `earliest` (every entry kept), `latest` (only new entries), an RFC 3339 time
    /// (`2026-01-31T09:30:00Z`: the entries from then on) or a Unix time in ms.
    #[arg(long, value_name = "WHERE", value_parser = parse_seek)]
    to: Option<rsc_protocol::SeekTarget>,
    /// An entry id (`<ms>-<seq>`): the group is next delivered the entries after it (usually
    /// with --shard).
    #[arg(long, value_name = "ID")]
    to_id: Option<String>,
    /// The entries of the last DURATION (now minus it, on the coordinator's clock; e.g. 90s,
    /// 10m, 2h, 1d).
    #[arg(long, value_name = "DURATION", value_parser = duration::parse_ms)]
    by_duration: Option<u64>,
    /// N entries on each shard, from the group's position there: negative goes back (those
    /// entries are delivered again), positive forward (they are skipped); at most 100000.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    shift_by: Option<i64>,
    /// Only this shard (repeat for several) [default: every shard the group reads].
    #[arg(long = "shard", value_name = "N")]
    shards: Vec<u32>,
    /// Carry the seek out. Without it, a dry run: the plan is printed, nothing changes.
    #[arg(long, conflicts_with = "dry_run")]
    execute: bool,
    /// Only print the plan (the default; for scripts that want to say so).
    #[arg(long)]
    dry_run: bool,
}

impl SeekArgs {
    /// The request these arguments make.
    fn request(&self) -> rsc_protocol::SeekRequest {
        use rsc_protocol::{SeekDuration, SeekId, SeekShift, SeekTarget};
        let to = match (&self.to, &self.to_id, self.by_duration, self.shift_by) {
            (Some(to), ..) => to.clone(),
            (None, Some(id), ..) => SeekTarget::Id(SeekId { id: id.clone() }),
            (None, None, Some(by_duration_ms), _) => {
                SeekTarget::Duration(SeekDuration { by_duration_ms })
            }
            // clap requires one of the four.
            (None, None, None, shift) => SeekTarget::Shift(SeekShift {
                shift_by: shift.unwrap_or_default(),
            }),
        };
        rsc_protocol::SeekRequest {
            to,
            shards: self.shards.clone(),
            dry_run: !self.execute,
        }
    }
}

#[derive(Debug, Args)]
struct CreateArgs {
    /// Group id.
    group: GroupId,
    /// The stream the group reads.
    #[arg(long)]
    stream: StreamId,
    /// Shard count; required when the stream is new, must match when it exists.
    #[arg(long, value_name = "N")]
    shards: Option<u32>,
    /// Where new Redis consumer groups start [coordinator default: earliest].
    #[arg(long, value_enum)]
    start: Option<StartArg>,
    /// Session timeout [coordinator default: 45000].
    #[arg(long, value_name = "MS")]
    session_timeout_ms: Option<u64>,
    /// Heartbeat interval [coordinator default: 3000].
    #[arg(long, value_name = "MS")]
    heartbeat_interval_ms: Option<u64>,
    /// Rebalance timeout [coordinator default: 60000].
    #[arg(long, value_name = "MS")]
    rebalance_timeout_ms: Option<u64>,
    /// Member limit [coordinator default: none].
    #[arg(long, value_name = "N")]
    max_members: Option<u32>,
    /// Assignor name [coordinator default: sticky].
    #[arg(long)]
    assignor: Option<String>,
    /// Data-path fencing [coordinator default: strict with a data Redis, else lease].
    #[arg(long, value_enum)]
    fencing: Option<FencingArg>,
    /// Per-key ordering through reshards [coordinator default: key].
    #[arg(long, value_enum)]
    ordering: Option<OrderingArg>,
    /// When the stream is new: keep acknowledged entries this long (PROTOCOL §18; e.g. 0,
    /// 15m, 1h) [coordinator default: 1h]; hard caps are set with `stream retention`.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse_ms)]
    keep_acked: Option<u64>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OrderingArg {
    /// A moved key's new entries wait until its old shard is drained up to the seal.
    Key,
    /// No waiting after a reshard (per-key order only between reshards).
    None,
}

impl From<OrderingArg> for rsc_protocol::OrderingMode {
    fn from(o: OrderingArg) -> Self {
        match o {
            OrderingArg::Key => rsc_protocol::OrderingMode::Key,
            OrderingArg::None => rsc_protocol::OrderingMode::None,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FencingArg {
    /// Owner tokens checked by Redis on every read and acknowledgement.
    Strict,
    /// The heartbeat lease only.
    Lease,
}

impl From<FencingArg> for rsc_protocol::FencingMode {
    fn from(f: FencingArg) -> Self {
        match f {
            FencingArg::Strict => rsc_protocol::FencingMode::Strict,
            FencingArg::Lease => rsc_protocol::FencingMode::Lease,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StartArg {
    /// From the first entry: the backlog is consumed.
    Earliest,
    /// From the next new entry: the backlog is skipped.
    Latest,
}

impl From<StartArg> for StartPosition {
    fn from(s: StartArg) -> Self {
        match s {
            StartArg::Earliest => StartPosition::Earliest,
            StartArg::Latest => StartPosition::Latest,
        }
    }
}

/// `rsc-coordinator stream …`.
#[derive(Debug, Args)]
#[command(after_help = EXIT_HELP)]
pub struct StreamArgs {
    #[command(flatten)]
    client: ClientOptions,
    #[command(subcommand)]
    command: StreamCommand,
}

#[derive(Debug, Subcommand)]
enum StreamCommand {
    /// Show a stream: layout, groups, reshard progress, rollback window.
    Describe {
        /// Stream name.
        stream: StreamId,
    },
    /// List every stream.
    List,
    /// Change a stream's shard count, for every group reading it.
    Reshard {
        /// Stream name.
        stream: StreamId,
        /// The new shard count.
        #[arg(long, value_name = "M")]
        shards: u32,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Set a stream's retention policy (PROTOCOL §18): entries every group acknowledged are
    /// trimmed once older than --keep-acked; --max-age and --max-entries are hard caps that
    /// also trim entries some group has not handled (counted, audited).
    Retention(Box<RetentionArgs>),
    /// Undo the stream's latest reshard (while it runs or within the rollback window).
    Rollback {
        /// Stream name.
        stream: StreamId,
        #[command(flatten)]
        wait: WaitArgs,
    },
}

#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("policy")
        .required(true)
        .multiple(true)
        .args(["keep_acked", "max_age", "max_entries"])
))]
struct RetentionArgs {
    /// Stream name.
    stream: StreamId,
    /// Keep acknowledged entries this long (`0` = trim at once; e.g. 30s, 15m, 1h, 7d).
    #[arg(long, value_name = "DURATION", value_parser = duration::parse_ms)]
    keep_acked: Option<u64>,
    /// Hard cap on age: older entries are trimmed even if undelivered [default: none].
    #[arg(long, value_name = "DURATION", value_parser = duration::parse_ms)]
    max_age: Option<u64>,
    /// Hard cap on entries per shard: older ones trimmed even if undelivered [default: none].
    #[arg(long, value_name = "N")]
    max_entries: Option<u64>,
    /// Set exactly the policy given: a cap not given is removed, --keep-acked not given is
    /// the default. Without it, the flags are merged into the current policy, and a
    /// --keep-acked change that does not repeat an existing cap is refused.
    #[arg(long)]
    replace: bool,
    /// Set the policy of the dead-letter stream `<stream>:dlq` instead.
    #[arg(long)]
    dlq: bool,
}

/// `ms` as a duration flag takes it: the largest unit it is a whole number of (`2d`, `90m`).
fn flag_duration(ms: u64) -> String {
    for (unit, scale) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms > 0 && ms.is_multiple_of(scale) {
            return format!("{}{unit}", ms / scale);
        }
    }
    format!("{ms}ms")
}

impl RetentionArgs {
    /// The policy to set, from `current` (the stream's policy now, `dlq`'s when --dlq) and
    /// the flags (see `--replace`); refused, with what to do, when a --keep-acked change would
    /// silently drop a cap.
    fn policy(&self, current: &RetentionPolicy) -> Result<RetentionPolicy, String> {
        if self.replace {
            let default = if self.dlq {
                RetentionPolicy::dlq_default().keep_acked_ms
            } else {
                RetentionPolicy::DEFAULT_KEEP_ACKED_MS
            };
            return Ok(RetentionPolicy {
                keep_acked_ms: self.keep_acked.unwrap_or(default),
                max_age_ms: self.max_age,
                max_entries_per_shard: self.max_entries,
            });
        }
        let mut dropped = Vec::new();
        if let (Some(ms), None) = (current.max_age_ms, self.max_age) {
            dropped.push(format!("--max-age {}", flag_duration(ms)));
        }
        if let (Some(n), None) = (current.max_entries_per_shard, self.max_entries) {
            dropped.push(format!("--max-entries {n}"));
        }
        if self.keep_acked.is_some() && !dropped.is_empty() {
            return Err(format!(
                "{}the current policy has {}: repeat it to keep it, or add --replace to drop it",
                if self.dlq { "--dlq: " } else { "" },
                dropped.join(" and ")
            ));
        }
        Ok(RetentionPolicy {
            keep_acked_ms: self.keep_acked.unwrap_or(current.keep_acked_ms),
            max_age_ms: self.max_age.or(current.max_age_ms),
            max_entries_per_shard: self.max_entries.or(current.max_entries_per_shard),
        })
    }
}

#[derive(Debug, Clone, Copy, Args)]
struct WaitArgs {
    /// Wait, with a progress bar, until every draining shard has retired.
    #[arg(long)]
    wait: bool,
    /// Give up waiting after this long (exit status 4) [default: wait forever].
    #[arg(long, value_name = "MS", requires = "wait")]
    timeout_ms: Option<u64>,
}

/// `rsc-coordinator member …`.
#[derive(Debug, Args)]
#[command(after_help = EXIT_HELP)]
pub struct MemberArgs {
    #[command(flatten)]
    client: ClientOptions,
    #[command(subcommand)]
    command: MemberCommand,
}

#[derive(Debug, Subcommand)]
enum MemberCommand {
    /// Fence a member and remove it from its group; its shards are reassigned at once.
    Remove {
        /// Group id.
        group: GroupId,
        /// Member id.
        member: MemberId,
    },
}

/// `rsc-coordinator dlq …`.
#[derive(Debug, Args)]
#[command(after_help = EXIT_HELP)]
pub struct DlqArgs {
    #[command(flatten)]
    client: ClientOptions,
    #[command(subcommand)]
    command: DlqCommand,
}

#[derive(Debug, Subcommand)]
enum DlqCommand {
    /// List dead letters (PROTOCOL §18): by group, routing key, error text and time, a page
    /// at a time, with the depth per group.
    #[command(after_help = DLQ_LIST_HELP)]
    List {
        #[command(flatten)]
        filter: DlqFilterArgs,
        /// How many per page (1..=1000) [coordinator default: 100].
        #[arg(long, value_name = "N")]
        count: Option<u32>,
        /// Start after this dead-letter id (the `next` a previous page printed).
        #[arg(long, value_name = "ID")]
        after: Option<String>,
        /// Newest first (default: oldest first).
        #[arg(long)]
        newest_first: bool,
    },
    /// Delete dead letters by the same filters as `list` (PROTOCOL §18). A dry run by
    /// default: prints what would be deleted; --execute deletes. Admin only, audited.
    #[command(after_help = DLQ_PURGE_HELP)]
    Purge {
        #[command(flatten)]
        filter: DlqFilterArgs,
        /// At most this many, oldest first (1..=100000) [coordinator default: 10000].
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
        /// Delete them. Without it, a dry run: nothing is deleted.
        #[arg(long)]
        execute: bool,
    },
    /// Republish a group's dead letters from `<stream>:dlq` to their shards (PROTOCOL §18).
    ///
    /// The coordinator writes each dead letter of the group again, oldest first, to its key's
    /// shard under the stream's current routing (so the redriven entries of one key keep
    /// their order), with the header `rsc-redrive-count` counting its redrives, and removes
    /// it from the dead-letter stream only once the write is confirmed: a crash in between
    /// leaves both copies (a duplicate, never a loss). Every group of the stream is delivered
    /// the republished entry; the header `rsc-redrive-group` names the group it was redriven
    /// for.
    #[command(after_help = EXIT_HELP)]
    Redrive {
        /// Stream name.
        stream: StreamId,
        /// The group whose dead letters are redriven.
        #[arg(long)]
        group: GroupId,
        /// Only dead letters written at or after this time: an RFC 3339 time
        /// (`2026-01-31T09:30:00Z`) or a Unix time in ms.
        #[arg(long, value_name = "TIME", value_parser = parse_since)]
        since: Option<u64>,
        /// At most this many dead letters (1..=10000) [coordinator default: 1000].
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
        /// Only print what would be redriven: nothing is written or removed.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Shown under `dlq list --help`.
const DLQ_LIST_HELP: &str = "Examples:
  rsc-coordinator dlq list --group billing
  rsc-coordinator dlq list orders --error timeout --since 1h
  rsc-coordinator dlq list --group billing --key customer-42 --until 2026-01-31T09:30:00Z
  rsc-coordinator dlq list --group billing --count 50 --after 1767225600000-0   # next page

Exit status: 0 done; 1 refused by the coordinator (4xx); 2 bad command line; 3 coordinator \
unreachable or failing (5xx, timeout).";

/// Shown under `dlq purge --help`.
const DLQ_PURGE_HELP: &str = "Examples:
  rsc-coordinator dlq purge --group billing --error 'schema v1'            # what would go
  rsc-coordinator dlq purge --group billing --error 'schema v1' --execute
  rsc-coordinator dlq purge orders --until 7d --execute    # older than 7 days, every group

Exit status: 0 done; 1 refused by the coordinator (4xx: not admin, bad filter, ...); 2 bad \
command line; 3 coordinator unreachable or failing (5xx, timeout).";

/// Which dead letters `dlq list` and `dlq purge` take: each filter given must match.
#[derive(Debug, Args)]
struct DlqFilterArgs {
    /// Stream name [default: the stream of --group].
    stream: Option<StreamId>,
    /// Only the dead letters of this group.
    #[arg(long)]
    group: Option<GroupId>,
    /// Only those of this routing key.
    #[arg(long)]
    key: Option<String>,
    /// Only those whose error contains this text.
    #[arg(long, value_name = "TEXT")]
    error: Option<String>,
    /// Only those dead-lettered at or after TIME: an RFC 3339 time, a Unix time in ms, or a
    /// duration ago (10m, 2h, 7d).
    #[arg(long, value_name = "TIME", value_parser = parse_when)]
    since: Option<u64>,
    /// Only those dead-lettered before TIME (same forms as --since).
    #[arg(long, value_name = "TIME", value_parser = parse_when)]
    until: Option<u64>,
}

impl DlqFilterArgs {
    /// The stream: the one given, else the stream --group reads.
    async fn stream(&self, c: &Client) -> Result<String, CliError> {
        match (&self.stream, &self.group) {
            (Some(s), _) => Ok(s.to_string()),
            (None, Some(g)) => Ok(c.describe_group(g.as_str()).await?.view.stream),
            (None, None) => Err(CliError::Usage(
                "name the stream (rsc-coordinator dlq list orders) or a group (--group \
                 billing)"
                    .into(),
            )),
        }
    }

    /// The filters as `GET /v1/streams/{stream}/dlq` query parameters.
    fn query(&self) -> Vec<(&'static str, String)> {
        let mut q = Vec::new();
        if let Some(g) = &self.group {
            q.push(("group", g.to_string()));
        }
        if let Some(k) = &self.key {
            q.push(("key", k.clone()));
        }
        if let Some(e) = &self.error {
            q.push(("error", e.clone()));
        }
        if let Some(t) = self.since {
            q.push(("since_ms", t.to_string()));
        }
        if let Some(t) = self.until {
            q.push(("until_ms", t.to_string()));
        }
        q
    }
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("{}", client::message(.0))]
    Client(#[from] ClientError),
    #[error("{0}")]
    WaitFailed(String),
    #[error("{0}")]
    Usage(String),
}

/// The command a refusal answered, for its hint: the same code calls for another remedy.
#[derive(Debug, Clone)]
enum HintFor {
    /// `group delete` (which has `--force`).
    GroupDelete,
    /// `group seek` of this group.
    GroupSeek(String),
    /// Any other command.
    Other,
}

impl HintFor {
    fn of(cmd: &OperatorCommand) -> Self {
        match cmd {
            OperatorCommand::Group(GroupArgs {
                command: GroupCommand::Delete { .. },
                ..
            }) => HintFor::GroupDelete,
            OperatorCommand::Group(GroupArgs {
                command: GroupCommand::Seek(a),
                ..
            }) => HintFor::GroupSeek(a.group.to_string()),
            _ => HintFor::Other,
        }
    }
}

impl CliError {
    fn exit_code(&self) -> u8 {
        match self {
            CliError::Client(ClientError::InvalidUrl(_)) => EXIT_USAGE,
            CliError::Client(e) if client::is_refusal(e) => EXIT_REFUSED,
            CliError::Client(_) => EXIT_UNAVAILABLE,
            CliError::WaitFailed(_) => EXIT_WAIT_FAILED,
            CliError::Usage(_) => EXIT_USAGE,
        }
    }

    /// What to do about the error, when the CLI can say (only ever naming commands and flags
    /// that exist: `tests/cli.rs` runs every hint's command line through the parser).
    fn hint(&self, context: &HintFor) -> Option<String> {
        match self {
            CliError::Client(e) => match (e.code()?, context) {
                (ErrorCode::Unauthenticated, _) => Some(
                    "pass --token (or --token-file), or set RSC_TOKEN (or RSC_TOKEN_FILE)".into(),
                ),
                (ErrorCode::Forbidden, _) => {
                    Some("the token lacks the role or scope for this".into())
                }
                (ErrorCode::GroupNotEmpty, HintFor::GroupDelete) => {
                    Some("add --force to delete it anyway (its members are fenced)".into())
                }
                (ErrorCode::GroupNotEmpty, HintFor::GroupSeek(g)) => Some(format!(
                    "pause it first: rsc-coordinator group pause {g} (its members keep their \
                     shards), seek, then rsc-coordinator group resume {g}"
                )),
                _ => None,
            },
            CliError::WaitFailed(_) | CliError::Usage(_) => None,
        }
    }
}

/// Runs an operator command; prints its result to stdout and any error to stderr.
pub async fn run(cmd: OperatorCommand) -> ExitCode {
    let context = HintFor::of(&cmd);
    let result = match cmd {
        OperatorCommand::Group(a) => group(a).await,
        OperatorCommand::Stream(a) => stream(a).await,
        OperatorCommand::Member(a) => member(a).await,
        OperatorCommand::Dlq(a) => dlq(a).await,
    };
    match result {
        Ok(()) => ExitCode::from(EXIT_OK),
        Err(e) => {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "error: {e}");
            if let Some(hint) = e.hint(&context) {
                let _ = writeln!(err, "hint: {hint}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}

fn connect(o: &ClientOptions) -> Result<Client, CliError> {
    let tls = rsc_api::ClientTls {
        ca: o.coordinator_ca.clone(),
        cert: o.coordinator_cert.clone(),
        key: o.coordinator_key.clone(),
    };
    Ok(client::connect(
        &o.coordinator,
        o.token.clone(),
        o.token_file.clone(),
        tls,
    )?)
}

/// Writes to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    if !text.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
    let _ = out.flush();
}

/// Prints an answer as JSON or as its text.
fn shown((json, text): (Value, String), json_out: bool) {
    if json_out {
        emit_json(&json);
    } else {
        emit(&text);
    }
}

fn emit_json(v: &Value) {
    emit(&serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()));
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn group(a: GroupArgs) -> Result<(), CliError> {
    let c = connect(&a.client)?;
    let json_out = a.client.output == OutputFormat::Json;
    match a.command {
        GroupCommand::Create(args) => {
            let req = CreateGroupRequest {
                group: args.group,
                stream: args.stream,
                shard_count: args.shards,
                start: args.start.map(Into::into),
                session_timeout_ms: args.session_timeout_ms,
                heartbeat_interval_ms: args.heartbeat_interval_ms,
                rebalance_timeout_ms: args.rebalance_timeout_ms,
                max_members: args.max_members,
                assignor: args.assignor,
                fencing: args.fencing.map(Into::into),
                ordering: args.ordering.map(Into::into),
                retention: args.keep_acked.map(|keep_acked_ms| RetentionPolicy {
                    keep_acked_ms,
                    ..RetentionPolicy::default()
                }),
            };
            let f = c.create_group(&req).await?;
            if json_out {
                emit_json(&f.json);
            } else {
                emit(&format!(
                    "Created group {} on stream {} ({} shards).\n\n{}",
                    f.view.group,
                    f.view.stream,
                    f.view.shards.len(),
                    render::group(&f.view)
                ));
            }
        }
        GroupCommand::Describe { group } => {
            let f = c.describe_group(&group).await?;
            if json_out {
                emit_json(&f.json);
            } else {
                emit(&render::group(&f.view));
            }
        }
        GroupCommand::List => {
            let f = c.list_groups().await?;
            if json_out {
                emit_json(&f.json);
            } else {
                emit(&render::group_list(&f.view.groups));
            }
        }
        GroupCommand::Pause { group } => set_paused(&c, &group, true, json_out).await?,
        GroupCommand::Resume { group } => set_paused(&c, &group, false, json_out).await?,
        GroupCommand::Seek(args) => seek(&c, &args, json_out).await?,
        GroupCommand::History(cmd) => shown(history::run(&c, cmd).await?, json_out),
        GroupCommand::Delete { group, force } => {
            c.delete_group(&group, force).await?;
            if json_out {
                emit_json(&json!({"group": group, "deleted": true}));
            } else {
                emit(&format!("Deleted group {group}."));
            }
        }
    }
    Ok(())
}

/// `group seek`: the plan (a dry run unless `--execute`), and whether the group is still to
/// be resumed after a move.
async fn seek(c: &Client, args: &SeekArgs, json_out: bool) -> Result<(), CliError> {
    let req = args.request();
    let f = c.seek(&args.group, &req).await?;
    if json_out {
        emit_json(&f.json);
        return Ok(());
    }
    let paused = match f.view.dry_run {
        true => None,
        false => c
            .describe_group(&args.group)
            .await
            .ok()
            .map(|g| g.view.paused),
    };
    emit(&render::seek(&f.view, &req.to, paused));
    Ok(())
}

/// `group pause` / `group resume`.
async fn set_paused(c: &Client, group: &str, paused: bool, json_out: bool) -> Result<(), CliError> {
    let f = c.set_group_paused(group, paused).await?;
    if json_out {
        emit_json(&f.json);
    } else if paused {
        emit(&format!(
            "Paused group {group}: its members stop fetching within one heartbeat ({}) and \
             keep their shards, until `group resume {group}`.",
            table::duration_ms(f.view.heartbeat_interval_ms)
        ));
    } else {
        emit(&format!("Resumed group {group}."));
    }
    Ok(())
}

async fn member(a: MemberArgs) -> Result<(), CliError> {
    let c = connect(&a.client)?;
    match a.command {
        MemberCommand::Remove { group, member } => {
            c.remove_member(&group, &member).await?;
            if a.client.output == OutputFormat::Json {
                emit_json(&json!({"group": group, "member": member, "removed": true}));
            } else {
                emit(&format!(
                    "Removed member {member} from group {group}: it is fenced, its shards are \
                     reassigned."
                ));
            }
        }
    }
    Ok(())
}

async fn dlq(a: DlqArgs) -> Result<(), CliError> {
    let c = connect(&a.client)?;
    let json_out = a.client.output == OutputFormat::Json;
    match a.command {
        DlqCommand::List {
            filter,
            count,
            after,
            newest_first,
        } => {
            let stream = filter.stream(&c).await?;
            let mut q = filter.query();
            if let Some(n) = count {
                q.push(("count", n.to_string()));
            }
            if let Some(id) = after {
                q.push(("after", id));
            }
            if newest_first {
                q.push(("newest_first", "true".into()));
            }
            let f = c.dlq_list(&stream, &q).await?;
            if json_out {
                emit_json(&f.json);
            } else {
                emit(&render::dlq_list(&f.view, now_ms()));
            }
        }
        DlqCommand::Purge {
            filter,
            limit,
            execute,
        } => {
            let stream = filter.stream(&c).await?;
            let req = rsc_protocol::DlqPurgeRequest {
                group: filter.group,
                key: filter.key,
                error: filter.error,
                since_ms: filter.since,
                until_ms: filter.until,
                limit,
                dry_run: !execute,
            };
            let f = c.dlq_purge(&stream, &req).await?;
            if json_out {
                emit_json(&f.json);
            } else {
                emit(&render::dlq_purge(&f.view));
            }
        }
        DlqCommand::Redrive {
            stream,
            group,
            since,
            limit,
            dry_run,
        } => {
            let req = rsc_protocol::RedriveRequest {
                group,
                since_ms: since,
                limit,
                dry_run,
            };
            let f = c.redrive(&stream, &req).await?;
            if json_out {
                emit_json(&f.json);
            } else {
                emit(&render::redrive(&f.view));
            }
        }
    }
    Ok(())
}

async fn stream(a: StreamArgs) -> Result<(), CliError> {
    let c = connect(&a.client)?;
    let json_out = a.client.output == OutputFormat::Json;
    let (started, wait) = match a.command {
        StreamCommand::Describe { stream } => {
            let f = c.describe_stream(&stream).await?;
            if json_out {
                emit_json(&f.json);
            } else {
                emit(&render::stream(&f.view, now_ms()));
            }
            return Ok(());
        }
        StreamCommand::List => {
            let f = c.list_streams().await?;
            if json_out {
                emit_json(&f.json);
            } else {
                emit(&render::stream_list(&f.view.streams));
            }
            return Ok(());
        }
        StreamCommand::Retention(r) => {
            let now = c.describe_stream(&r.stream).await?.view;
            let current = if r.dlq {
                &now.dlq_retention
            } else {
                &now.retention
            };
            let policy = r.policy(current).map_err(CliError::Usage)?;
            return set_retention(&c, json_out, &r.stream, policy, r.dlq).await;
        }
        StreamCommand::Reshard {
            stream,
            shards,
            wait,
        } => (c.reshard(&stream, shards).await?, wait),
        StreamCommand::Rollback { stream, wait } => (c.rollback(&stream).await?, wait),
    };
    let done = if wait.wait {
        wait_until_complete(
            &c,
            started,
            wait.timeout_ms.map(Duration::from_millis),
            !json_out,
        )
        .await?
    } else {
        started
    };
    if json_out {
        emit_json(&done.json);
        return Ok(());
    }
    let s = &done.view;
    let mut text = render::stream(s, now_ms());
    if let Some(r) = &s.resharding {
        text.push_str(&format!(
            "\n{} is still draining: follow it with `rsc-coordinator stream describe {}` \
             or pass --wait.\n",
            if r.rollback {
                "The rollback"
            } else {
                "The reshard"
            },
            s.stream
        ));
    }
    emit(&text);
    Ok(())
}

/// `--to` of `group seek`: `earliest`, `latest`, a Unix time in ms or an RFC 3339 time.
fn parse_seek(text: &str) -> Result<rsc_protocol::SeekTarget, String> {
    use rsc_protocol::{SeekTarget, SeekTime};
    let t = text.trim();
    let time = |time_ms| Ok(SeekTarget::Time(SeekTime { time_ms }));
    match t {
        "earliest" => Ok(SeekTarget::Position(StartPosition::Earliest)),
        "latest" => Ok(SeekTarget::Position(StartPosition::Latest)),
        _ if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => t
            .parse()
            .map_or_else(|_| Err(format!("{t:?} is too large")), time),
        _ => table::parse_rfc3339_ms(t).map_or_else(
            || {
                Err(format!(
                    "{t:?}: give earliest, latest, an RFC 3339 time (2026-01-31T09:30:00Z) \
                     or a Unix time in ms"
                ))
            },
            time,
        ),
    }
}

/// `--since` of `dlq redrive`: a Unix time in ms or an RFC 3339 time (as `group seek --to`
/// takes a time).
fn parse_since(text: &str) -> Result<u64, String> {
    let t = text.trim();
    t.parse()
        .ok()
        .or_else(|| table::parse_rfc3339_ms(t))
        .ok_or_else(|| {
            format!(
                "{text:?}: give an RFC 3339 time (2026-01-31T09:30:00Z) or a Unix time in ms \
                 (e.g. 1767225600000)"
            )
        })
}

/// `--since`/`--until` of `dlq list|purge`: an RFC 3339 time, a Unix time in ms, or a
/// duration ago (`10m`: now minus ten minutes, on this machine's clock).
fn parse_when(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if let Ok(ms) = t.parse::<u64>() {
        return Ok(ms);
    }
    if let Some(ms) = table::parse_rfc3339_ms(t) {
        return Ok(ms);
    }
    match duration::parse_ms(t) {
        Ok(d) if t.ends_with(|c: char| c.is_ascii_alphabetic()) => Ok(now_ms().saturating_sub(d)),
        _ => Err(format!(
            "{text:?}: give an RFC 3339 time (2026-01-31T09:30:00Z), a Unix time in ms, or a \
             duration ago (10m, 2h, 7d)"
        )),
    }
}

/// `stream retention`: `PATCH /v1/streams/{stream}` with the policy (of the dead-letter
/// stream with `dlq`), then the stream as the coordinator answered it.
async fn set_retention(
    c: &Client,
    json_out: bool,
    stream: &str,
    policy: RetentionPolicy,
    dlq: bool,
) -> Result<(), CliError> {
    let patch = if dlq {
        PatchStreamRequest {
            dlq_retention: Some(policy),
            ..Default::default()
        }
    } else {
        PatchStreamRequest {
            retention: Some(policy),
            ..Default::default()
        }
    };
    let f = c.patch_stream(stream, &patch).await?;
    if json_out {
        emit_json(&f.json);
    } else {
        emit(&render::stream(&f.view, now_ms()));
    }
    Ok(())
}

/// Whether `a` and `b` describe the same reshard.
fn same_reshard(a: &ReshardingView, b: &ReshardingView) -> bool {
    (a.from, a.to, a.rollback, a.started_ms) == (b.from, b.to, b.rollback, b.started_ms)
}

/// Polls `GET /v1/streams/{stream}` until the reshard `started` describes is complete,
/// drawing a progress bar on stderr (hidden when stderr is not a terminal).
///
/// A coordinator that is briefly unreachable or failing does not end the wait (it is
/// retried until the time-out); a refusal (e.g. the token was revoked) does.
async fn wait_until_complete(
    c: &Client,
    started: Fetched<StreamView>,
    timeout: Option<Duration>,
    show: bool,
) -> Result<Fetched<StreamView>, CliError> {
    let stream = started.view.stream.clone();
    let Some(ours) = started.view.last_reshard.clone() else {
        return Err(CliError::WaitFailed(format!(
            "the coordinator did not report a reshard of {stream}"
        )));
    };
    if ours.state == ReshardState::Complete {
        return Ok(started);
    }
    let bar = progress_bar(&stream, &ours, show);
    let deadline = timeout.map(|t| Instant::now() + t);
    let result = loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break Err(CliError::WaitFailed(format!(
                "gave up waiting after {} ms: the reshard of {stream} is still draining \
                 (see `rsc-coordinator stream describe {stream}`)",
                timeout.map_or(0, |t| t.as_millis())
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
        let f = match c.describe_stream(&stream).await {
            Ok(f) => f,
            Err(e) if client::is_refusal(&e) => break Err(e.into()),
            Err(e) => {
                bar.set_message(format!("(retrying: {})", client::message(&e)));
                continue;
            }
        };
        let latest = match still_ours(&stream, &ours, &f.view) {
            Ok(latest) => latest,
            Err(e) => break Err(e),
        };
        let (done, total) = render::reshard_progress(&latest);
        bar.set_length(total);
        bar.set_position(done);
        if latest.state == ReshardState::Complete {
            break Ok(f);
        }
        bar.set_message(waiting_message(&latest));
    };
    match &result {
        Ok(_) => bar.finish_with_message("(complete)"),
        Err(_) => bar.abandon(),
    }
    result
}

/// The progress bar of a wait for `ours` (hidden unless `show`).
fn progress_bar(stream: &str, ours: &ReshardingView, show: bool) -> ProgressBar {
    let (done, total) = render::reshard_progress(ours);
    let target = if show {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} {prefix} [{bar:24}] {pos}/{len} shards retired ({elapsed}) {msg}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(format!(
        "{} {stream} {} -> {}",
        if ours.rollback { "rollback" } else { "reshard" },
        ours.from,
        ours.to
    ));
    bar.set_position(done);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// The stream's latest reshard, when it is still `ours` (the one waited for); otherwise why
/// the wait ends.
fn still_ours(
    stream: &str,
    ours: &ReshardingView,
    view: &StreamView,
) -> Result<ReshardingView, CliError> {
    let Some(latest) = view.last_reshard.clone() else {
        return Err(CliError::WaitFailed(format!(
            "stream {stream} no longer reports the reshard"
        )));
    };
    if !same_reshard(&latest, ours) {
        return Err(CliError::WaitFailed(format!(
            "the reshard of {stream} {} -> {} was replaced by a {} {} -> {}",
            ours.from,
            ours.to,
            if latest.rollback {
                "rollback"
            } else {
                "reshard"
            },
            latest.from,
            latest.to
        )));
    }
    Ok(latest)
}

/// `(waiting for g1, g2)`: the groups the draining shards wait for (empty when none).
fn waiting_message(latest: &ReshardingView) -> String {
    let waiting: std::collections::BTreeSet<&str> = latest
        .draining
        .iter()
        .flat_map(|d| d.waiting_groups.iter().map(String::as_str))
        .collect();
    if waiting.is_empty() {
        String::new()
    } else {
        format!(
            "(waiting for {})",
            waiting.into_iter().collect::<Vec<_>>().join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use rsc_protocol::{SeekDuration, SeekId, SeekShift, SeekTarget, SeekTime};

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: OperatorCommand,
    }

    /// `stream retention`'s policy from its command line, over `current`.
    fn retention(args: &[&str], current: &RetentionPolicy) -> Result<RetentionPolicy, String> {
        let mut line = vec!["rsc", "stream", "retention", "orders"];
        line.extend_from_slice(args);
        let cli = Cli::try_parse_from(line).map_err(|e| e.to_string())?;
        let OperatorCommand::Stream(StreamArgs {
            command: StreamCommand::Retention(r),
            ..
        }) = cli.command
        else {
            panic!("not stream retention");
        };
        r.policy(current)
    }

    #[test]
    fn retention_merges_refuses_a_silent_drop_and_replaces_on_request() {
        let day = 86_400_000;
        let current = RetentionPolicy {
            keep_acked_ms: 3_600_000,
            max_age_ms: Some(2 * day),
            max_entries_per_shard: None,
        };
        // --keep-acked alone would drop the 2-day cap: refused, saying how to keep or drop it.
        let err = retention(&["--keep-acked", "0"], &current).unwrap_err();
        assert!(
            err.contains("--max-age 2d") && err.contains("--replace"),
            "{err}"
        );
        // Repeating the cap keeps it; adding a cap merges; --replace drops.
        let kept = retention(&["--keep-acked", "0", "--max-age", "2d"], &current).unwrap();
        assert_eq!((kept.keep_acked_ms, kept.max_age_ms), (0, Some(2 * day)));
        let added = retention(&["--max-entries", "1000"], &current).unwrap();
        assert_eq!(
            added,
            RetentionPolicy {
                max_entries_per_shard: Some(1000),
                ..current
            }
        );
        let replaced = retention(&["--keep-acked", "0", "--replace"], &current).unwrap();
        assert_eq!((replaced.keep_acked_ms, replaced.max_age_ms), (0, None));
        let defaulted = retention(&["--max-age", "1d", "--replace"], &current).unwrap();
        assert_eq!(
            defaulted.keep_acked_ms,
            RetentionPolicy::DEFAULT_KEEP_ACKED_MS
        );
        // Nothing to set is a usage error.
        assert!(retention(&[], &current).is_err());
    }

    /// `group seek`'s request from its command line.
    fn seek(args: &[&str]) -> Result<rsc_protocol::SeekRequest, clap::Error> {
        let argv = ["rsc-coordinator", "group", "seek", "billing"]
            .iter()
            .chain(args)
            .copied();
        match Cli::try_parse_from(argv)?.command {
            OperatorCommand::Group(GroupArgs {
                command: GroupCommand::Seek(a),
                ..
            }) => Ok(a.request()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_seek_target_parses_and_a_dry_run_is_the_default() {
        let r = seek(&["--to", "earliest"]).unwrap();
        assert_eq!(r.to, SeekTarget::Position(StartPosition::Earliest));
        assert!(r.dry_run && r.shards.is_empty());
        assert!(!seek(&["--to", "latest", "--execute"]).unwrap().dry_run);
        assert!(seek(&["--to", "latest", "--dry-run"]).unwrap().dry_run);
        assert_eq!(
            seek(&["--to", "1767225600000"]).unwrap().to,
            SeekTarget::Time(SeekTime {
                time_ms: 1_767_225_600_000
            })
        );
        assert_eq!(
            seek(&["--to", "2026-01-01T01:00:00+01:00"]).unwrap().to,
            SeekTarget::Time(SeekTime {
                time_ms: 1_767_225_600_000
            })
        );
        assert_eq!(
            seek(&["--by-duration", "10m"]).unwrap().to,
            SeekTarget::Duration(SeekDuration {
                by_duration_ms: 600_000
            })
        );
        assert_eq!(
            seek(&["--shift-by", "-100"]).unwrap().to,
            SeekTarget::Shift(SeekShift { shift_by: -100 })
        );
        let r = seek(&["--shard", "3", "--shard", "5", "--to-id", "17-2"]).unwrap();
        assert_eq!(r.to, SeekTarget::Id(SeekId { id: "17-2".into() }));
        assert_eq!(r.shards, [3, 5]);
        for bad in [
            &[][..],
            &["--to", "yesterday"],
            &["--to", "earliest", "--to-id", "1-0"],
            &["--to", "earliest", "--execute", "--dry-run"],
            &["--by-duration", "1w"],
        ] {
            assert!(seek(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn dlq_since_takes_unix_ms_or_rfc_3339() {
        assert_eq!(parse_since("1767225600000"), Ok(1_767_225_600_000));
        assert_eq!(parse_since("2026-01-01T00:00:00Z"), Ok(1_767_225_600_000));
        assert!(parse_since("monday").is_err());
    }
}
