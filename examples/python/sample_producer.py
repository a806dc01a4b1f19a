#!/usr/bin/env python3
"""``sample_producer.py``: publishes ``--count`` keyed messages (PROTOCOL §8), in Python on
the ``rsc`` package; the same flags and entry fields as the Rust ``sample-producer``.

    sample_producer.py --coordinator URL --redis-url URL --stream S --count N --keys K \\
      [--rate R] [--token T] [--redis-sentinel HOST:PORT,… --redis-sentinel-master NAME] \\
      [--wait-replicas N [--wait-timeout-ms MS]] [--batch N] [--acked-log FILE]

Entry fields: ``payload`` (JSON ``{"seq": …, "key": …}``), ``key`` (``k{seq % K}``), ``seq``
(0..N-1). Prints ``published N`` at the end. With ``--acked-log FILE``, appends
``FIRST_SEQ END_SEQ UNIX_MS`` for every batch the moment Redis confirmed it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any, List, Optional

import rsc

RETRY_FOR = 60.0


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="sample_producer.py", description="Publishes keyed sample messages")
    p.add_argument("--coordinator", default=env("RSC_COORDINATOR_URL"), required=not env("RSC_COORDINATOR_URL"))
    p.add_argument("--redis-url", default=env("RSC_REDIS_URL"), required=not env("RSC_REDIS_URL"))
    p.add_argument("--redis-cluster", action="store_true")
    p.add_argument("--redis-sentinel", default=env("RSC_REDIS_SENTINEL"))
    p.add_argument("--redis-sentinel-master", default=env("RSC_REDIS_SENTINEL_MASTER"))
    p.add_argument("--wait-replicas", type=int,
                   default=int(os.environ["RSC_PUBLISH_WAIT_REPLICAS"]) if env("RSC_PUBLISH_WAIT_REPLICAS") else None)
    p.add_argument("--wait-timeout-ms", type=int, default=int(env("RSC_PUBLISH_WAIT_TIMEOUT_MS", "1000")))
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--acked-log")
    p.add_argument("--stream", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--keys", type=int, default=100)
    p.add_argument("--rate", type=float)
    p.add_argument("--token", default=env("RSC_TOKEN"))
    return p.parse_args(argv)


def record(seq: int, keys: int) -> rsc.Record:
    key = f"k{seq % max(keys, 1)}"
    return rsc.Record({"seq": seq, "key": key}, key=key, fields={"seq": str(seq)})


def publish_retrying(producer: rsc.Producer, stream: str, batch: List[rsc.Record]) -> None:
    """The producer itself sends a batch again after a lost reply or an outage, without
    writing it twice (PROTOCOL §21); an error past that is retried here until the deadline."""
    deadline = time.monotonic() + RETRY_FOR
    while True:
        try:
            producer.publish_batch_sync(stream, batch)
            return
        except rsc.RscError as e:
            if time.monotonic() >= deadline:
                raise
            logging.getLogger("sample_producer").warning("publish failed; retrying the batch: %s", e)
            time.sleep(0.2)


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args()
    options: dict[str, Any] = dict(
        coordinator=args.coordinator, redis_url=args.redis_url, redis_cluster=args.redis_cluster,
        token=args.token, retry_budget=RETRY_FOR,
    )
    if args.redis_sentinel and args.redis_sentinel_master:
        options.update(redis_sentinel=args.redis_sentinel, redis_sentinel_master=args.redis_sentinel_master)
    if args.wait_replicas:
        options.update(wait_replicas=args.wait_replicas, wait_timeout=args.wait_timeout_ms / 1000)
    producer = rsc.Producer(**options)
    acked = open(args.acked_log, "a") if args.acked_log else None
    started = time.monotonic()
    next_seq = 0
    while next_seq < args.count:
        due = args.count
        if args.rate and args.rate > 0:
            due = min(int((time.monotonic() - started) * args.rate) + 1, args.count)
        if due <= next_seq:
            time.sleep(0.005)
            continue
        end = min(due, next_seq + max(args.batch, 1))
        publish_retrying(producer, args.stream, [record(s, args.keys) for s in range(next_seq, end)])
        if acked is not None:
            acked.write(f"{next_seq} {end} {int(time.time() * 1000)}\n")
            acked.flush()
        next_seq = end
    print(f"published {args.count}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
