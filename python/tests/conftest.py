"""Fixtures: a real redis-server and a real ``rsc-coordinator`` on free loopback ports (as
the Rust suites' ``tests/support`` start them), and helpers to drive them."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar, cast

import pytest
import redis

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def bin_dir() -> Path:
    """Where the workspace's debug binaries are (``RSC_BIN_DIR``, else the target dir)."""
    if "RSC_BIN_DIR" in os.environ:
        return Path(os.environ["RSC_BIN_DIR"])
    target = os.environ.get("CARGO_TARGET_DIR", str(REPO / "target"))
    return Path(target) / "debug"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(what: str, timeout: float, check: Callable[[], Optional[T]]) -> T:
    """Polls ``check`` until it returns something other than ``None``/``False``."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got is not None and got is not False:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class RedisServer:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="rsc-py-redis-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                shutil.which("redis-server") or "redis-server",
                "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                "--save", "", "--protected-mode", "no",
                "--logfile", os.path.join(self.dir, "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}"
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        wait_for("redis-server", 10, self._ping)

    def _ping(self) -> Optional[bool]:
        try:
            return bool(self.client.ping())
        except redis.ConnectionError:
            return None

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Coordinator:
    def __init__(self, data_redis: str, extra: List[str]) -> None:
        exe = bin_dir() / "rsc-coordinator"
        if not exe.exists():
            raise RuntimeError(f"{exe} not found: cargo build --workspace --bins first")
        env = dict(os.environ, RSC_LOG=os.environ.get("RSC_LOG", "info"))
        self.proc = subprocess.Popen(
            [str(exe), "serve", "--listen", "127.0.0.1:0", "--store", "memory",
             "--sweep-interval-ms", "20", "--data-redis-url", data_redis, *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.log: List[str] = []
        self._addr: Optional[str] = None
        threading.Thread(target=self._read, daemon=True).start()
        addr = wait_for("the coordinator's `listening on` line", 20, lambda: self._addr)
        self.url = f"http://{addr}"

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"listening on (\S+?)[\s\"]", line + " ")
            if m and self._addr is None:
                self._addr = m.group(1)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Stack:
    """redis-server + rsc-coordinator, and admin helpers."""

    def __init__(self, acl: Optional[str] = None) -> None:
        self.redis = RedisServer()
        extra: List[str] = []
        self._acl_dir: Optional[str] = None
        self.token: Optional[str] = None
        if acl is not None:
            self._acl_dir = tempfile.mkdtemp(prefix="rsc-py-acl-")
            path = os.path.join(self._acl_dir, "acl.toml")
            Path(path).write_text(acl)
            extra = ["--acl", path]
        self.coordinator = Coordinator(self.redis.url, extra)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.coordinator.url + path, data=data, method=method)
        req.add_header("content-type", "application/json")
        if self.token:
            req.add_header("authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read()
            return json.loads(text) if text else None

    def create_group(
        self, group: str, stream: str, shards: int, session_ms: int = 6000,
        heartbeat_ms: int = 300, rebalance_ms: Optional[int] = None,
    ) -> None:
        body: Dict[str, Any] = {
            "group": group, "stream": stream, "shard_count": shards,
            "session_timeout_ms": session_ms, "heartbeat_interval_ms": heartbeat_ms,
        }
        if rebalance_ms is not None:
            body["rebalance_timeout_ms"] = rebalance_ms
        self.request("POST", "/v1/groups", body)

    def group(self, group: str) -> Any:
        return self.request("GET", f"/v1/groups/{group}")

    def wait_stable(self, group: str, members: int, shards: int, timeout: float = 30) -> Any:
        def check() -> Any:
            g = self.group(group)
            ms = g.get("members", [])
            owned = sum(len(m.get("owned_shards", [])) for m in ms)
            ok = len(ms) == members and owned == shards and all(
                m.get("state") == "stable" for m in ms
            )
            return g if ok else None

        return wait_for(f"group {group}: {members} stable members owning {shards} shards",
                        timeout, check)

    def xrange(self, key: str) -> List[Tuple[bytes, Dict[bytes, bytes]]]:
        """Every entry of a stream key: (id, fields)."""
        return cast(List[Tuple[bytes, Dict[bytes, bytes]]], self.redis.client.xrange(key))

    def xlen(self, key: str) -> int:
        n: int = self.redis.client.xlen(key)
        return n

    def env(self) -> Dict[str, str]:
        """The environment of a pod of this stack."""
        env = dict(os.environ)
        env.update(RSC_COORDINATOR_URL=self.coordinator.url, RSC_REDIS_URL=self.redis.url)
        return env

    def stop(self) -> None:
        self.coordinator.stop()
        self.redis.stop()
        if self._acl_dir:
            shutil.rmtree(self._acl_dir, ignore_errors=True)


@pytest.fixture
def stack() -> Iterator[Stack]:
    s = Stack()
    try:
        yield s
    finally:
        s.stop()


ACL = """
[[tokens]]
principal = "app"
token = "good-token"
roles = ["admin", "member", "producer"]
groups = ["*"]
streams = ["*"]
"""


@pytest.fixture
def secured_stack() -> Iterator[Stack]:
    s = Stack(acl=ACL)
    s.token = "good-token"
    try:
        yield s
    finally:
        s.stop()
