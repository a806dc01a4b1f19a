"""The Python sample pods as processes: SIGTERM hands the shards over at once (exit 0);
kill -9 hands them over after the session timeout; every message is handled; the Python
producer pod's entries are what the Rust pods expect (PROTOCOL §8)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from conftest import REPO, Stack, wait_for

EXAMPLES = REPO / "examples" / "python"


def consumer(stack: Stack, pod_ip: str, *extra: str) -> "subprocess.Popen[bytes]":
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / "sample_consumer.py"), "--coordinator",
         stack.coordinator.url, "--redis-url", stack.redis.url, "--pod-ip", pod_ip, *extra],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=None if os.environ.get("RSC_TEST_ECHO") else subprocess.DEVNULL,
    )


def produce(stack: Stack, stream: str, count: int, keys: int = 20) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "sample_producer.py"), "--coordinator",
         stack.coordinator.url, "--redis-url", stack.redis.url, "--stream", stream,
         "--count", str(count), "--keys", str(keys), "--batch", "50"],
        capture_output=True, timeout=60, check=True,
    )
    assert out.stdout.decode().strip() == f"published {count}"


def records(stack: Stack, key: str) -> List[Dict[bytes, bytes]]:
    return [e[1] for e in stack.xrange(key)]


def owners(stack: Stack, group: str) -> Dict[str, List[int]]:
    g = stack.group(group)
    return {m["member_id"]: m.get("owned_shards", []) for m in g.get("members", [])}


def test_sigterm_hands_the_shards_over_at_once(stack: Stack) -> None:
    stack.create_group("pods1", "pods1", 4, session_ms=30000, heartbeat_ms=300)
    a = consumer(stack, "127.0.0.2", "--group", "pods1", "--stream", "pods1",
                 "--concurrency", "2", "--record-stream", "pods1:handled")
    b = consumer(stack, "127.0.0.3", "--group", "pods1", "--stream", "pods1",
                 "--record-stream", "pods1:handled")
    try:
        stack.wait_stable("pods1", 3, 4)
        produce(stack, "pods1", 200)
        wait_for("200 handled", 60, lambda: len(records(stack, "pods1:handled")) >= 200 or None)
        a.send_signal(signal.SIGTERM)
        assert a.wait(30) == 0, "a graceful shutdown exits 0"
        # The session is 30 s: only a leave moves the shards this fast.
        g = stack.wait_stable("pods1", 1, 4, timeout=10)
        assert g["members"][0]["member_id"] == "127.0.0.3-pods1-0"
        produce(stack, "pods1", 100)
        wait_for("300 handled", 60, lambda: len(records(stack, "pods1:handled")) >= 300 or None)
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
    handled = records(stack, "pods1:handled")
    for r in handled:
        assert set(r) >= {b"entry_id", b"shard", b"member", b"key", b"seq", b"started_ms", b"finished_ms"}
    seqs = sorted(int(r[b"seq"]) for r in handled)
    # Two runs of the producer: seq 0..199 and 0..99 again.
    assert seqs == sorted(list(range(200)) + list(range(100))), "each message once"


def test_kill9_hands_the_shards_over_after_the_session(stack: Stack) -> None:
    stack.create_group("pods2", "pods2", 2, session_ms=2000, heartbeat_ms=200)
    a = consumer(stack, "127.0.0.4", "--group", "pods2", "--stream", "pods2",
                 "--record-stream", "pods2:handled")
    b = consumer(stack, "127.0.0.5", "--group", "pods2", "--stream", "pods2",
                 "--record-stream", "pods2:handled")
    try:
        stack.wait_stable("pods2", 2, 2)
        a.kill()
        a.wait()
        g = stack.wait_stable("pods2", 1, 2, timeout=20)
        assert g["members"][0]["member_id"] == "127.0.0.5-pods2-0"
        produce(stack, "pods2", 50)
        wait_for("50 handled", 60, lambda: len(records(stack, "pods2:handled")) >= 50 or None)
        assert {r[b"member"] for r in records(stack, "pods2:handled")} == {b"127.0.0.5-pods2-0"}
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
