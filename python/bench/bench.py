"""PY1–PY4 (docs/BENCHMARKS.md "Running"): the ``rsc`` package against what a Python user
would write by hand, in the same run, against one redis-server and one rsc-coordinator.

    python bench.py [--messages N] [--reps R] [--only py1,py2,py3,py4] [--py3-secs S]
                    [--py4-messages N] [--json FILE]

- **PY1**: a no-op ``async def`` listener draining a pre-filled 4-shard stream, against a
  redis-py asyncio loop per shard (``XREADGROUP COUNT 64`` + ``XACK``), each on a stream of
  its own filled the same way; msgs/s from the first message handled to the last, and the
  process's CPU per 1,000 messages over that span.
- **PY2**: ``Producer.publish_batch_sync`` (fenced, idempotent; batches of 500 keyed
  records) against redis-py pipelined ``XADD`` of the same payloads, interleaved in 10 chunks
  rotating which goes first.
- **PY3**: a 20 ms ``async def`` handler (``asyncio.sleep``) on 8 shards, 8 members, a
  backlog over 10,000 keys published once the members own every shard, with
  ``key_concurrency`` 16 against ``key_concurrency`` 1; the one-per-shard bound is
  8 × 1000 / 20 = 400/s.
- **PY4**: the Python sample pod (``examples/python/sample_consumer.py``) against the Rust
  one (``sample-consumer``), each a process of its own with ``--handle-ms 0`` and no record
  stream (a listener decoding the JSON payload, nothing else: P3's shape), draining a
  pre-filled 4-shard stream; msgs/s from the first entry read to the last acknowledged (read
  from ``XINFO GROUPS`` every 5 ms), and where the pod's CPU went over that span: per thread
  (``/proc/PID/task``: the asyncio loop's thread, the tokio workers), with context switches.

Every figure runs ``--reps`` times, the variants of a repetition back to back, rotating which
goes first; medians are printed. The coordinator and the Rust pod are those of
``RSC_BIN_DIR`` (e.g. ``target/release``), else the target dir's debug build.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import redis
import redis.asyncio as aioredis

import rsc
from conftest import REPO, Stack, bin_dir, wait_for

SHARDS = 4
BATCH = 500
PY3_SHARDS = 8
PY3_HANDLE_S = 0.020
PY3_BOUND = PY3_SHARDS / PY3_HANDLE_S
_names = [0]


def fresh(prefix: str) -> str:
    """A group/stream name not used before in this run."""
    _names[0] += 1
    return f"{prefix}{_names[0]}"


def cpu_s() -> float:
    """This process's user + system CPU time, seconds."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def fill(stack: Stack, stream: str, n: int, keys: int = 1000) -> None:
    """``n`` keyed JSON entries (``{"seq", "key"}``, the sample pods' payload) on ``stream``."""
    p = rsc.Producer(coordinator=stack.coordinator.url, redis_url=stack.redis.url)
    for start in range(0, n, BATCH):
        p.publish_batch_sync(stream, [
            rsc.Record({"seq": i, "key": f"k{i % keys}"}, key=f"k{i % keys}")
            for i in range(start, min(n, start + BATCH))
        ])


# PY1 ---------------------------------------------------------------------------------------

def py1_rsc(stack: Stack, n: int) -> Tuple[float, float]:
    """(msgs/s, CPU ms per 1,000 msgs) of a no-op async listener draining ``n`` entries."""
    name = fresh("py1-rsc-")
    stack.create_group(name, name, SHARDS)
    fill(stack, name, n)
    app = rsc.ConsumerApp(coordinator=stack.coordinator.url, redis_url=stack.redis.url,
                          instance_id="bench")
    count = [0]
    marks: List[float] = []

    @app.listener(group=name, stream=name)
    async def noop(msg: rsc.Message) -> None:
        if not marks:
            marks.extend((time.perf_counter(), cpu_s()))
        count[0] += 1
        if count[0] == n:
            marks.extend((time.perf_counter(), cpu_s()))

    async def main() -> None:
        task = asyncio.create_task(app.run_async(handle_signals=False))
        deadline = time.monotonic() + 300
        while count[0] < n:
            if task.done() or time.monotonic() > deadline:
                raise RuntimeError(f"PY1: {count[0]} of {n} handled")
            await asyncio.sleep(0.005)
        app.shutdown()
        await task

    asyncio.run(main())
    t0, c0, t1, c1 = marks
    return n / (t1 - t0), (c1 - c0) * 1e6 / n


def py1_redis_py(stack: Stack, n: int) -> Tuple[float, float]:
    """The same drain by a redis-py asyncio ``XREADGROUP COUNT 64`` + ``XACK`` loop per shard."""
    name = fresh("py1-raw-")
    stack.create_group(name, name, SHARDS)
    fill(stack, name, n)

    async def main() -> Tuple[float, float]:
        r = aioredis.Redis(host="127.0.0.1", port=stack.redis.port)
        for s in range(SHARDS):
            try:
                await r.xgroup_create(f"{name}:{s}", name, id="0", mkstream=True)
            except redis.ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise
        done = [0]
        marks: List[float] = []

        async def shard(s: int) -> None:
            key = f"{name}:{s}"
            while done[0] < n:
                got: Any = await r.xreadgroup(name, "c", {key: ">"}, count=64, block=100)
                if not got:
                    continue
                if not marks:
                    marks.extend((time.perf_counter(), cpu_s()))
                ids = [e[0] for e in got[0][1]]
                await r.xack(key, name, *ids)
                done[0] += len(ids)

        await asyncio.wait_for(asyncio.gather(*(shard(s) for s in range(SHARDS))), 300)
        t1, c1 = time.perf_counter(), cpu_s()
        await r.aclose()
        return n / (t1 - marks[0]), (c1 - marks[1]) * 1e6 / n

    return asyncio.run(main())


# PY2 ---------------------------------------------------------------------------------------

def py2(stack: Stack, n: int, rep: int) -> Tuple[float, float]:
    """(rsc msgs/s, redis-py msgs/s): ``n`` records each, in 10 interleaved chunks."""
    name = fresh("py2-")
    stack.create_group(name, name, SHARDS)
    p = rsc.Producer(coordinator=stack.coordinator.url, redis_url=stack.redis.url)
    r = redis.Redis(host="127.0.0.1", port=stack.redis.port)
    # Warm both: connections, routing table, the scripts loaded.
    p.publish_sync(name, {"warm": True})
    r.ping()
    chunk = max(BATCH, n // 10)
    spent = {"rsc": 0.0, "raw": 0.0}
    seq = [0]

    def ours(m: int) -> None:
        for s in range(0, m, BATCH):
            batch = [rsc.Record({"seq": i, "key": f"k{i}"}, key=f"k{i}")
                     for i in range(seq[0] + s, seq[0] + min(m, s + BATCH))]
            p.publish_batch_sync(name, batch)

    def theirs(m: int) -> None:
        for s in range(0, m, BATCH):
            pipe = r.pipeline(transaction=False)
            for i in range(seq[0] + s, seq[0] + min(m, s + BATCH)):
                pipe.xadd(f"{name}-raw:{i % SHARDS}",
                          {"payload": json.dumps({"seq": i, "key": f"k{i}"}), "key": f"k{i}"})
            pipe.execute()

    for c in range(0, n, chunk):
        m = min(chunk, n - c)
        order = [("rsc", ours), ("raw", theirs)]
        if (c // chunk + rep) % 2:
            order.reverse()
        for what, fn in order:
            t = time.perf_counter()
            fn(m)
            spent[what] += time.perf_counter() - t
        seq[0] += m
    r.close()
    return n / spent["rsc"], n / spent["raw"]


# PY3 ---------------------------------------------------------------------------------------

def py3(stack: Stack, lanes: int, secs: float) -> Tuple[float, float]:
    """(msgs/s, CPU µs per msg) of a 20 ms handler, ``key_concurrency`` ``lanes``."""
    name = fresh(f"py3-k{lanes}-")
    stack.create_group(name, name, PY3_SHARDS, heartbeat_ms=500)
    entries = max(400, int(lanes * PY3_BOUND * secs))
    app = rsc.ConsumerApp(coordinator=stack.coordinator.url, redis_url=stack.redis.url,
                          instance_id=f"bench-{name}")
    count = [0]
    first: List[float] = []
    last = [0.0]

    @app.listener(group=name, stream=name, concurrency=PY3_SHARDS, key_concurrency=lanes)
    async def slow(msg: rsc.Message) -> None:
        if not first:
            first.append(time.perf_counter())
        await asyncio.sleep(PY3_HANDLE_S)
        count[0] += 1
        last[0] = time.perf_counter()

    async def main() -> Tuple[float, float]:
        task = asyncio.create_task(app.run_async(handle_signals=False))
        await asyncio.to_thread(stack.wait_stable, name, PY3_SHARDS, PY3_SHARDS, 60)
        p = rsc.Producer(coordinator=stack.coordinator.url, redis_url=stack.redis.url)
        for start in range(0, entries, BATCH):
            await p.publish_batch(name, [
                rsc.Record({"seq": i}, key=f"k{i % 10_000}")
                for i in range(start, min(entries, start + BATCH))
            ])
        c0 = cpu_s()
        deadline = time.monotonic() + 300
        while count[0] < entries:
            if task.done() or time.monotonic() > deadline:
                raise RuntimeError(f"PY3: {count[0]} of {entries} handled")
            await asyncio.sleep(0.005)
        c1 = cpu_s()
        app.shutdown()
        await task
        return entries / (last[0] - first[0]), (c1 - c0) * 1e6 / entries

    return asyncio.run(main())


# PY4 ---------------------------------------------------------------------------------------

def threads(pid: int) -> Dict[str, List[float]]:
    """Per thread name of process ``pid``: [CPU s, voluntary, involuntary context switches]."""
    tick = os.sysconf("SC_CLK_TCK")
    out: Dict[str, List[float]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / tick
        cs = {k: int(v) for k, v in (ln.split(":") for ln in status.splitlines()
                                     if ln.endswith(tuple("0123456789")) and "ctxt" in ln)}
        row = out.setdefault(comm, [0.0, 0.0, 0.0, 0.0])
        row[0] += cpu
        row[1] += cs.get("voluntary_ctxt_switches", 0)
        row[2] += cs.get("nonvoluntary_ctxt_switches", 0)
        row[3] += 1
    return out


def progress(r: "redis.Redis", stream: str, group: str) -> Tuple[int, int]:
    """(entries read, entries pending) of ``group`` over the shards of ``stream``."""
    pipe = r.pipeline(transaction=False)
    for s in range(SHARDS):
        pipe.xinfo_groups(f"{stream}:{s}")
    read = pending = 0
    for groups in pipe.execute():
        for g in groups:
            if g["name"].decode() == group:
                read += g.get("entries-read") or 0
                pending += g["pending"]
    return read, pending


def py4(stack: Stack, n: int, lang: str) -> Dict[str, Any]:
    """One sample pod (``lang``: python or rust) draining ``n`` pre-filled entries."""
    name = fresh(f"py4-{lang}-")
    stack.create_group(name, name, SHARDS)
    fill(stack, name, n)
    args = ["--coordinator", stack.coordinator.url, "--redis-url", stack.redis.url,
            "--group", name, "--stream", name, "--pod-ip", "127.0.0.1", "--handle-ms", "0"]
    if lang == "python":
        cmd = [sys.executable, str(REPO / "examples/python/sample_consumer.py"), *args]
    else:
        cmd = [str(bin_dir() / "sample-consumer"), *args]
    env = dict(os.environ, RSC_LOG="warn")
    pod = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=None if os.environ.get("RSC_BENCH_ECHO") else subprocess.DEVNULL)
    r = redis.Redis(host="127.0.0.1", port=stack.redis.port)
    try:
        pid = pod.pid
        wait_for("the first entry read", 60, lambda: progress(r, name, name)[0] > 0 or None)
        t0, c0 = time.perf_counter(), threads(pid)
        deadline = time.monotonic() + 300
        while True:
            read, pending = progress(r, name, name)
            if read >= n and pending == 0:
                break
            if time.monotonic() > deadline or pod.poll() is not None:
                raise RuntimeError(f"PY4 {lang}: {read} of {n} read, {pending} pending")
            time.sleep(0.005)
        t1, c1 = time.perf_counter(), threads(pid)
    finally:
        pod.send_signal(signal.SIGTERM)
        try:
            pod.wait(30)
        except subprocess.TimeoutExpired:
            pod.kill()
            pod.wait()
        r.close()
    per_thread = {k: [v[0] - c0.get(k, [0.0] * 4)[0], v[1] - c0.get(k, [0.0] * 4)[1],
                      v[2] - c0.get(k, [0.0] * 4)[2], v[3]] for k, v in c1.items()}
    return {"rate": n / (t1 - t0), "cpu_ms_per_1k": sum(v[0] for v in per_thread.values())
            * 1e6 / n, "threads": per_thread}


# Report ------------------------------------------------------------------------------------

def med(xs: List[float]) -> float:
    return statistics.median(xs)


def span(xs: List[float]) -> str:
    return f"{min(xs):,.0f}–{max(xs):,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=50_000, help="PY1 and PY2 messages")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="py1,py2,py3,py4")
    ap.add_argument("--py3-secs", type=float, default=3.0,
                    help="PY3: seconds of backlog at the goal's rate")
    ap.add_argument("--py4-messages", type=int, default=100_000)
    ap.add_argument("--json", help="append the figures as JSON to this file")
    a = ap.parse_args()
    only = set(a.only.split(","))
    n = a.messages
    out: Dict[str, Any] = {"load_start": open("/proc/loadavg").read().strip(),
                           "messages": n, "reps": a.reps}
    from redis.utils import HIREDIS_AVAILABLE

    out["hiredis"] = HIREDIS_AVAILABLE
    print(f"load average at start: {out['load_start']}; redis-py {redis.__version__}, "
          f"hiredis parser: {HIREDIS_AVAILABLE}", flush=True)
    stack = Stack()
    res: Dict[str, List[Any]] = {k: [] for k in ("py1", "py2", "py3", "py4")}
    try:
        for rep in range(a.reps):
            if "py1" in only:
                runs: List[Tuple[str, Callable[[Stack, int], Tuple[float, float]]]] = [
                    ("rsc", py1_rsc), ("raw", py1_redis_py)]
                got = {k: f(stack, n) for k, f in (runs if rep % 2 == 0 else runs[::-1])}
                res["py1"].append(got)
                print(f"PY1 rep {rep}: {got}", flush=True)
            if "py2" in only:
                ours, theirs = py2(stack, n, rep)
                res["py2"].append({"rsc": ours, "raw": theirs})
                print(f"PY2 rep {rep}: rsc {ours:,.0f}/s raw {theirs:,.0f}/s", flush=True)
            if "py3" in only:
                order = [1, 16] if rep % 2 == 0 else [16, 1]
                got3 = {k: py3(stack, k, a.py3_secs) for k in order}
                res["py3"].append(got3)
                print(f"PY3 rep {rep}: {got3}", flush=True)
            if "py4" in only:
                order4 = ["python", "rust"] if rep % 2 == 0 else ["rust", "python"]
                got4 = {k: py4(stack, a.py4_messages, k) for k in order4}
                res["py4"].append(got4)
                print(f"PY4 rep {rep}: " + ", ".join(
                    f"{k} {v['rate']:,.0f}/s {v['cpu_ms_per_1k']:.1f} ms/1k"
                    for k, v in got4.items()), flush=True)
    finally:
        stack.stop()
    out["load_end"] = open("/proc/loadavg").read().strip()
    out["results"] = res
    print(f"\nload average at end: {out['load_end']}; medians of {a.reps} repetitions")
    if res["py1"]:
        ours_, raw_ = [x["rsc"][0] for x in res["py1"]], [x["raw"][0] for x in res["py1"]]
        ratios = [x["rsc"][0] / x["raw"][0] for x in res["py1"]]
        print(f"PY1 drain {n} msgs, 4 shards: rsc {med(ours_):,.0f}/s ({span(ours_)}), "
              f"redis-py XREADGROUP+XACK {med(raw_):,.0f}/s ({span(raw_)}); ratio "
              f"{med(ratios):.2f} (per rep {', '.join(f'{x:.2f}' for x in ratios)}); CPU/1k: "
              f"rsc {med([x['rsc'][1] for x in res['py1']]):.1f} ms, redis-py "
              f"{med([x['raw'][1] for x in res['py1']]):.1f} ms")
    if res["py2"]:
        ratios = [x["rsc"] / x["raw"] for x in res["py2"]]
        print(f"PY2 publish {n} msgs, batches of {BATCH}: rsc "
              f"{med([x['rsc'] for x in res['py2']]):,.0f}/s, redis-py pipelined XADD "
              f"{med([x['raw'] for x in res['py2']]):,.0f}/s; ratio {med(ratios):.2f} "
              f"(per rep {', '.join(f'{x:.2f}' for x in ratios)})")
    if res["py3"]:
        r16 = [x[16][0] for x in res["py3"]]
        ratios = [x[16][0] / x[1][0] for x in res["py3"]]
        print(f"PY3 20 ms handler, 8 shards: key_concurrency 16 {med(r16):,.0f}/s = "
              f"{med(r16) / PY3_BOUND:.1f} × the one-per-shard bound ({PY3_BOUND:.0f}/s; goal "
              f"≥ {0.7 * 16:.1f}); key_concurrency 1 {med([x[1][0] for x in res['py3']]):,.0f}/s;"
              f" 16 vs 1: {med(ratios):.1f}; CPU/msg 16: "
              f"{med([x[16][1] for x in res['py3']]):.0f} µs, 1: "
              f"{med([x[1][1] for x in res['py3']]):.0f} µs")
    if res["py4"]:
        ratios = [x["python"]["rate"] / x["rust"]["rate"] for x in res["py4"]]
        print(f"PY4 sample pods draining {a.py4_messages} msgs: python "
              f"{med([x['python']['rate'] for x in res['py4']]):,.0f}/s, rust "
              f"{med([x['rust']['rate'] for x in res['py4']]):,.0f}/s; ratio {med(ratios):.2f} "
              f"(per rep {', '.join(f'{x:.2f}' for x in ratios)}); pod CPU/1k: python "
              f"{med([x['python']['cpu_ms_per_1k'] for x in res['py4']]):.1f} ms, rust "
              f"{med([x['rust']['cpu_ms_per_1k'] for x in res['py4']]):.1f} ms")
        for lang in ("python", "rust"):
            names = sorted({t for x in res["py4"] for t in x[lang]["threads"]})
            for t in names:
                rows = [x[lang]["threads"].get(t, [0.0] * 4) for x in res["py4"]]
                print(f"    {lang} thread {t!r} (×{rows[0][3]:.0f}): CPU/1k "
                      f"{med([r[0] * 1e6 / a.py4_messages for r in rows]):.2f} ms, voluntary "
                      f"switches/1k {med([r[1] * 1e3 / a.py4_messages for r in rows]):.1f}, "
                      f"involuntary/1k {med([r[2] * 1e3 / a.py4_messages for r in rows]):.1f}")
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(out, default=str) + "\n")


if __name__ == "__main__":
    main()
