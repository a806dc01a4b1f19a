#!/usr/bin/env python3
"""Checks of docker/smoke.sh on the data in Redis (standard library only).

Reads the shard streams and the record stream of the sample consumer pods through
`docker exec -i REDIS redis-cli --json` (commands on stdin, one JSON reply per line).

  smoke_check.py REDIS STREAM SHARDS GROUP RECORDS handled
      every entry of every shard has a record, nothing is pending, the DLQ is empty
      (exit 0), or not yet (exit 3, with what is missing)
  smoke_check.py REDIS STREAM SHARDS GROUP RECORDS overlaps
      per shard, no two different members' handling intervals [started_ms, finished_ms]
      overlap (exit 0), else exit 1 listing them
  smoke_check.py REDIS STREAM SHARDS GROUP RECORDS activity PREFIX FROM_MS TO_MS
      prints how many handlings members whose id starts with PREFIX started in [FROM, TO]
  smoke_check.py REDIS STREAM SHARDS GROUP RECORDS last-finish PREFIX
      prints the last finished_ms of members whose id starts with PREFIX (0 if none)
  smoke_check.py REDIS STREAM SHARDS GROUP RECORDS handoffs PREFIX AFTER_MS
      per shard that PREFIX worked, the gap between its last finish and the first start of
      another member after AFTER_MS; exit 1 if another member started one first
"""

import json
import subprocess
import sys


def redis(container, commands):
    """Runs redis-cli commands (lists of words) in one `docker exec`; returns the replies."""
    script = "".join(" ".join(words) + "\n" for words in commands)
    out = subprocess.run(
        ["docker", "exec", "-i", container, "redis-cli", "--json"],
        input=script.encode(),
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    replies = []
    for line in out.splitlines():
        if not line.strip():
            continue
        if line.startswith("error:"):
            replies.append({"error": line[len("error:"):]})
        else:
            replies.append(json.loads(line))
    if len(replies) != len(commands):
        raise SystemExit(f"redis-cli answered {len(replies)} replies to {len(commands)} commands")
    return replies


def fields(flat):
    return dict(zip(flat[0::2], flat[1::2]))


class Data:
    def __init__(self, container, stream, shards, group, records_key):
        self.shards = shards
        cmds = [["XRANGE", f"{stream}:{i}", "-", "+"] for i in range(shards)]
        cmds += [["XPENDING", f"{stream}:{i}", group] for i in range(shards)]
        cmds += [["XLEN", f"{stream}:dlq"], ["XRANGE", records_key, "-", "+"]]
        replies = redis(container, cmds)
        self.entries = {(i, e[0]) for i in range(shards) for e in replies[i]}
        self.pending = 0
        for r in replies[shards:2 * shards]:
            # XPENDING summary: [count, min, max, consumers]; an error when the group does not
            # exist on that shard yet (nothing was ever read from it).
            if isinstance(r, list):
                self.pending += int(r[0])
        self.dlq = replies[2 * shards]
        self.records = []
        for rid, flat in replies[2 * shards + 1]:
            f = fields(flat)
            self.records.append({
                "shard": int(f["shard"]),
                "entry_id": f["entry_id"],
                "member": f["member"],
                "started": int(f["started_ms"]),
                "finished": int(f["finished_ms"]),
            })


def handled(d):
    recorded = {(r["shard"], r["entry_id"]) for r in d.records}
    missing = d.entries - recorded
    redelivered = len(d.records) - len(recorded)
    print(f"entries {len(d.entries)}, recorded {len(recorded)} "
          f"(+{redelivered} handled twice: at-least-once), missing {len(missing)}, "
          f"pending {d.pending}, dead letters {d.dlq}")
    if missing or d.pending or d.dlq:
        return 3
    return 0


def overlaps(d):
    by_shard = {}
    for r in d.records:
        by_shard.setdefault(r["shard"], []).append(r)
    bad = []
    handoffs = 0
    for shard, recs in sorted(by_shard.items()):
        recs.sort(key=lambda r: (r["started"], r["finished"]))
        latest = {}  # member -> (latest finish, record)
        prev_member = None
        for r in recs:
            if prev_member is not None and r["member"] != prev_member:
                handoffs += 1
            prev_member = r["member"]
            for member, (fin, other) in latest.items():
                # Strict: one ending in the millisecond the other starts is a hand-over.
                if member != r["member"] and r["started"] < fin:
                    bad.append((shard, other, r))
            cur = latest.get(r["member"])
            if cur is None or r["finished"] > cur[0]:
                latest[r["member"]] = (r["finished"], r)
    members = {r["member"] for r in d.records}
    print(f"{len(d.records)} handlings by {len(members)} members on {len(by_shard)} shards, "
          f"{handoffs} hand-overs between members: {len(bad)} overlapping")
    for shard, a, b in bad[:20]:
        print(f"  shard {shard}: {a['member']} [{a['started']}, {a['finished']}] overlaps "
              f"{b['member']} [{b['started']}, {b['finished']}]")
    return 1 if bad else 0


def activity(d, prefix, lo, hi):
    n = sum(1 for r in d.records if r["member"].startswith(prefix) and lo <= r["started"] <= hi)
    print(n)
    return 0


def last_finish(d, prefix):
    print(max((r["finished"] for r in d.records if r["member"].startswith(prefix)), default=0))
    return 0


def handoffs(d, prefix, after):
    """For each shard PREFIX worked: its last finish vs. the next owner's first start."""
    worst = None
    status = 0
    for shard in range(d.shards):
        recs = [r for r in d.records if r["shard"] == shard]
        mine = [r["finished"] for r in recs if r["member"].startswith(prefix)]
        if not mine:
            continue
        last = max(mine)
        later = [r["started"] for r in recs
                 if not r["member"].startswith(prefix) and r["started"] >= after]
        if not later:
            continue
        gap = min(later) - last
        if gap <= 0:
            print(f"shard {shard}: another member started at {min(later)} before {prefix}* "
                  f"finished at {last}")
            status = 1
        worst = gap if worst is None else min(worst, gap)
    print(f"smallest gap between {prefix}* last finish and the next owner's first start: "
          f"{worst} ms")
    return status


def main(argv):
    if len(argv) < 7:
        print(__doc__, file=sys.stderr)
        return 2
    container, stream, shards, group, records_key, cmd = argv[1:7]
    args = argv[7:]
    d = Data(container, stream, int(shards), group, records_key)
    if cmd == "handled":
        return handled(d)
    if cmd == "overlaps":
        return overlaps(d)
    if cmd == "activity":
        return activity(d, args[0], int(args[1]), int(args[2]))
    if cmd == "last-finish":
        return last_finish(d, args[0])
    if cmd == "handoffs":
        return handoffs(d, args[0], int(args[1]))
    print(f"unknown command {cmd}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
