#!/usr/bin/env python3
"""``sample_consumer.py``: the sample consumer pod (PROTOCOL §8) in Python, on the ``rsc``
package; the same flags and record stream as the Rust ``sample-consumer``.

    sample_consumer.py --coordinator URL[,URL…] --redis-url URL[,URL…] [--redis-cluster] \\
      --group G --stream S --concurrency N --pod-ip IP [--key-concurrency N] [--token T] \\
      [--handle-ms N] [--fail-rate F] [--poison-key K] [--hang-key-prefix P] \\
      [--record-stream KEY] [--max-retries N] [--retry-backoff-ms N] [--health-listen ADDR] \\
      [--static-id ID] [--data-redis-grace-ms N]

Member ids are ``<pod_ip>-<group>-<index>``. Each handling attempt takes ``--handle-ms`` and
fails with probability ``--fail-rate`` (then it is retried, then dead-lettered); every
attempt on an entry with key ``--poison-key`` fails; the handling of an entry whose key
starts with ``--hang-key-prefix`` never ends. With ``--record-stream``, every successful
handling adds one entry to KEY (``entry_id, shard, member, key, seq, started_ms,
finished_ms``) before the acknowledgement. SIGTERM: finish in-flight messages, acknowledge,
leave the group, exit 0; a crash of the app exits non-zero. Logs: ``RSC_LOG`` filters the
client's events, written to stderr through Python's ``logging``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
import time
from typing import Any, Optional

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

import rsc


def unix_ms() -> int:
    return int(time.time() * 1000)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="sample_consumer.py", description="A sample consumer pod of Redis Stream Coordinator"
    )
    p.add_argument("--coordinator", default=env("RSC_COORDINATOR_URL"), required=not env("RSC_COORDINATOR_URL"))
    p.add_argument("--redis-url", default=env("RSC_REDIS_URL"), required=not env("RSC_REDIS_URL"))
    p.add_argument("--redis-cluster", action="store_true")
    p.add_argument("--redis-sentinel", default=env("RSC_REDIS_SENTINEL"))
    p.add_argument("--redis-sentinel-master", default=env("RSC_REDIS_SENTINEL_MASTER"))
    p.add_argument("--group", required=True)
    p.add_argument("--stream", required=True)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--pod-ip", default=env("POD_IP"), required=not env("POD_IP"))
    p.add_argument("--static-id", default=env("RSC_STATIC_ID"))
    p.add_argument("--token", default=env("RSC_TOKEN"))
    p.add_argument("--key-concurrency", type=int, default=int(env("RSC_KEY_CONCURRENCY", "1")))
    p.add_argument("--handle-ms", type=int, default=0)
    p.add_argument("--poison-key")
    p.add_argument("--hang-key-prefix")
    p.add_argument("--fail-rate", type=float, default=0.0)
    p.add_argument("--record-stream")
    p.add_argument("--max-retries", type=int, default=3)
    p.add_argument("--retry-backoff-ms", type=int, default=200)
    p.add_argument("--health-listen", default=env("RSC_HEALTH_LISTEN"))
    p.add_argument("--data-redis-grace-ms", type=int,
                   default=int(os.environ["RSC_DATA_REDIS_GRACE_MS"]) if env("RSC_DATA_REDIS_GRACE_MS") else None)
    args = p.parse_args(argv)
    if not 0.0 <= args.fail_rate <= 1.0:
        p.error("--fail-rate must be within 0..=1")
    return args


def record_client(args: argparse.Namespace) -> Any:
    """The pod's own connection to the data Redis, for the record stream."""
    urls = [u.strip() for u in args.redis_url.split(",") if u.strip()]
    if args.redis_sentinel and args.redis_sentinel_master:
        from redis.asyncio.sentinel import Sentinel

        hosts = [(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1]))
                 for h in args.redis_sentinel.split(",") if h.strip()]
        sentinel = Sentinel(hosts, sentinel_kwargs={"password": os.environ.get("RSC_REDIS_SENTINEL_PASSWORD")})
        return sentinel.master_for(args.redis_sentinel_master)
    if args.redis_cluster:
        return RedisCluster.from_url(urls[0])
    return aioredis.from_url(urls[0])


def build_app(args: argparse.Namespace) -> rsc.ConsumerApp:
    options: dict[str, Any] = dict(
        coordinator=args.coordinator, redis_url=args.redis_url, redis_cluster=args.redis_cluster,
        instance_id=args.pod_ip, token=args.token, health_listen=args.health_listen,
    )
    if args.static_id:
        options["static_instance_id"] = args.static_id
    if args.data_redis_grace_ms is not None:
        options["data_redis_grace"] = args.data_redis_grace_ms / 1000
    if args.redis_sentinel and args.redis_sentinel_master:
        options.update(redis_sentinel=args.redis_sentinel, redis_sentinel_master=args.redis_sentinel_master)
    app = rsc.ConsumerApp.from_env(**options)
    record = record_client(args) if args.record_stream else None
    log = logging.getLogger("sample_consumer")

    @app.listener(
        group=args.group, stream=args.stream, concurrency=args.concurrency,
        key_concurrency=args.key_concurrency, max_retries=args.max_retries,
        retry_backoff=(args.retry_backoff_ms / 1000, 10.0),
    )
    async def handle(msg: rsc.Message) -> None:
        started_ms = unix_ms()
        if args.handle_ms:
            await asyncio.sleep(args.handle_ms / 1000)
        payload = msg.json()
        key = msg.key or payload["key"]
        if args.hang_key_prefix and key.startswith(args.hang_key_prefix):
            log.info("stuck handler: this handling never ends entry_id=%s key=%s", msg.id, key)
            await asyncio.Event().wait()
        if args.poison_key == key:
            raise RuntimeError(f"poison key {key} (seq {payload['seq']}, attempt {msg.attempt})")
        if args.fail_rate > 0 and random.random() < args.fail_rate:
            raise RuntimeError(f"injected failure (seq {payload['seq']}, attempt {msg.attempt})")
        if record is not None:
            await record.xadd(args.record_stream, {
                "entry_id": msg.id, "shard": msg.shard, "member": msg.member_id, "key": key,
                "seq": payload["seq"], "started_ms": started_ms, "finished_ms": unix_ms(),
            })

    return app


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args()
    app = build_app(args)
    logging.getLogger("sample_consumer").info("sample consumer starting members=%s", app.member_ids())
    try:
        app.run()
    except rsc.RscError as e:
        logging.getLogger("sample_consumer").error("the app stopped: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
