"""PY1 and PY2 (docs/BENCHMARKS.md): the rsc package against redis-py written the way a user
would, in the same run, against one redis-server and one rsc-coordinator.

    python bench.py [--messages N]

PY1: a no-op ``async def`` listener draining a pre-filled 4-shard stream, against a redis-py
asyncio loop per shard (``XREADGROUP COUNT 64`` + ``XACK``). PY2: ``publish_batch`` against
redis-py pipelined ``XADD`` (batches of 500). Prints messages per second and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any, List

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import redis
import redis.asyncio as aioredis

import rsc
from conftest import Stack

SHARDS = 4
BATCH = 500


def fill(stack: Stack, stream: str, n: int) -> None:
    p = rsc.Producer(coordinator=stack.coordinator.url, redis_url=stack.redis.url)
    for start in range(0, n, BATCH):
        p.publish_batch_sync(stream, [rsc.Record({"n": i}, key=f"k{i}")
                                      for i in range(start, min(n, start + BATCH))])


def py1_rsc(stack: Stack, n: int) -> float:
    stack.create_group("b1", "bench1", SHARDS)
    fill(stack, "bench1", n)
    app = rsc.ConsumerApp(coordinator=stack.coordinator.url, redis_url=stack.redis.url,
                          instance_id="bench")
    count = [0]
    first: List[float] = []

    @app.listener(group="b1", stream="bench1")
    async def noop(msg: rsc.Message) -> None:
        if not first:
            first.append(time.perf_counter())
        count[0] += 1

    async def main() -> float:
        task = asyncio.create_task(app.run_async(handle_signals=False))
        while count[0] < n:
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - first[0]
        app.shutdown()
        await task
        return elapsed

    return n / asyncio.run(main())


def py1_redis_py(stack: Stack, n: int) -> float:
    stack.create_group("b2", "bench2", SHARDS)
    fill(stack, "bench2", n)

    async def main() -> float:
        r = aioredis.Redis(host="127.0.0.1", port=stack.redis.port)
        for s in range(SHARDS):
            await r.xgroup_create(f"bench2:{s}", "b2", id="0", mkstream=True)
        done = [0]

        async def shard(s: int) -> None:
            key = f"bench2:{s}"
            while done[0] < n:
                got: Any = await r.xreadgroup("b2", "c", {key: ">"}, count=64, block=100)
                if not got:
                    if done[0] >= n:
                        return
                    continue
                ids = [e[0] for e in got[0][1]]
                await r.xack(key, "b2", *ids)
                done[0] += len(ids)

        started = time.perf_counter()
        await asyncio.gather(*(shard(s) for s in range(SHARDS)))
        elapsed = time.perf_counter() - started
        await r.aclose()
        return elapsed

    return n / asyncio.run(main())


def py2_rsc(stack: Stack, n: int) -> float:
    stack.create_group("b3", "bench3", SHARDS)
    p = rsc.Producer(coordinator=stack.coordinator.url, redis_url=stack.redis.url)
    batches = [[rsc.Record({"n": i}, key=f"k{i}") for i in range(s, min(n, s + BATCH))]
               for s in range(0, n, BATCH)]
    p.publish_sync("bench3", {"warm": True})
    started = time.perf_counter()
    for b in batches:
        p.publish_batch_sync("bench3", b)
    return n / (time.perf_counter() - started)


def py2_redis_py(stack: Stack, n: int) -> float:
    import json

    r = redis.Redis(host="127.0.0.1", port=stack.redis.port)
    started = time.perf_counter()
    for s in range(0, n, BATCH):
        pipe = r.pipeline(transaction=False)
        for i in range(s, min(n, s + BATCH)):
            pipe.xadd(f"bench4:{i % SHARDS}", {"payload": json.dumps({"n": i}), "key": f"k{i}"})
        pipe.execute()
    return n / (time.perf_counter() - started)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20000)
    n = ap.parse_args().messages
    stack = Stack()
    try:
        base1, ours1 = py1_redis_py(stack, n), py1_rsc(stack, n)
        base2, ours2 = py2_redis_py(stack, n), py2_rsc(stack, n)
    finally:
        stack.stop()
    print(f"PY1 drain {n} msgs, 4 shards: rsc {ours1:,.0f}/s, redis-py XREADGROUP+XACK "
          f"{base1:,.0f}/s, ratio {ours1 / base1:.2f}")
    print(f"PY2 publish {n} msgs, batches of {BATCH}: rsc {ours2:,.0f}/s, redis-py pipelined "
          f"XADD {base2:,.0f}/s, ratio {ours2 / base2:.2f}")


if __name__ == "__main__":
    main()
