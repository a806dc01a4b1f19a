"""The producer against a real coordinator and Redis: routing, async and blocking publishes,
a publish sent again after a lost reply written once (idempotence), clear errors."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any, Dict, List, Optional

import pytest
import rsc
from conftest import Stack


def test_publish_routes_by_key_and_batches_keep_order(stack: Stack) -> None:
    stack.create_group("pg1", "ps1", 4)
    producer = rsc.Producer(coordinator=stack.coordinator.url, redis_url=stack.redis.url)
    first = producer.publish_sync("ps1", {"a": 1}, key="customer-1")
    again = producer.publish_sync("ps1", b"raw bytes", key="customer-1",
                                  content_type="application/octet-stream")
    assert first.shard == again.shard, "one key, one shard"
    entries = stack.xrange(f"ps1:{first.shard}")
    assert entries[-2][1][b"payload"] == b'{"a":1}'
    assert entries[-1][1][b"payload"] == b"raw bytes"
    assert entries[-1][1][b"content_type"] == b"application/octet-stream"

    async def batch() -> List[rsc.Published]:
        single = await producer.publish("ps1", [1, 2], key="k", headers={"h": "1"})
        out = await producer.publish_batch(
            "ps1", [rsc.Record({"seq": i}, key="same") for i in range(10)] + [{"plain": True}]
        )
        return [single] + out

    out = asyncio.run(batch())
    assert len(out) == 12
    same = out[1:11]
    assert len({p.shard for p in same}) == 1
    stored = [e[1] for e in stack.xrange(f"ps1:{same[0].shard}")
              if e[1].get(b"key") == b"same"]
    assert [json.loads(e[b"payload"])["seq"] for e in stored] == list(range(10))


class ReplyDropper:
    """A loopback TCP proxy to Redis that, once armed, forwards the next request but throws
    its reply away and drops the connection (a reply lost in flight)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.armed = threading.Event()
        self.dropped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(client, up, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if replies and self.armed.is_set() and b"EXEC" not in data and self._is_exec_reply(data):
                    # The transaction ran on Redis; its answer is lost with the connection.
                    self.armed.clear()
                    self.dropped.set()
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    @staticmethod
    def _is_exec_reply(data: bytes) -> bool:
        # The producer's write is a MULTI/EXEC transaction: its EXEC answer is an array.
        return data.startswith(b"*") or b"\r\n*" in data

    def close(self) -> None:
        self.server.close()


def test_a_publish_whose_reply_was_lost_is_sent_again_and_written_once(stack: Stack) -> None:
    stack.create_group("pg2", "ps2", 1)
    proxy = ReplyDropper(stack.redis.port)
    try:
        producer = rsc.Producer(
            coordinator=stack.coordinator.url, redis_url=f"redis://127.0.0.1:{proxy.port}",
        )
        producer.publish_sync("ps2", {"warm": 1}, key="k")
        proxy.armed.set()
        published = producer.publish_batch_sync("ps2", [rsc.Record({"n": i}, key="k") for i in range(5)])
        assert proxy.dropped.is_set(), "the reply of the write was lost"
    finally:
        proxy.close()
    entries = stack.xrange("ps2:0")
    payloads = [json.loads(e[1][b"payload"]) for e in entries]
    assert payloads == [{"warm": 1}] + [{"n": i} for i in range(5)], "each record once"
    assert [p.id for p in published] == [e[0].decode() for e in entries[1:]]


def test_bad_coordinator_url_fails_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(rsc.RscError) as err:
        rsc.Producer(coordinator="not a url", redis_url="redis://127.0.0.1:1")
    assert time.monotonic() - started < 2
    assert "not a url" in str(err.value) or "URL" in str(err.value)


def test_bad_token_is_a_clear_exception_not_a_hang(secured_stack: Stack) -> None:
    stack = secured_stack
    stack.create_group("pg3", "ps3", 1)
    producer = rsc.Producer(coordinator=stack.coordinator.url, redis_url=stack.redis.url,
                            token="wrong-token")
    started = time.monotonic()
    with pytest.raises(rsc.RscError) as err:
        producer.publish_sync("ps3", {"n": 1})
    assert time.monotonic() - started < 10
    text = str(err.value) + str(err.value.__cause__)
    assert "401" in text or "UNAUTHORIZED" in text.upper(), text
    good = rsc.Producer(coordinator=stack.coordinator.url, redis_url=stack.redis.url,
                        token="good-token")
    assert good.publish_sync("ps3", {"n": 1}).shard == 0


def test_a_consumer_with_a_bad_token_stops_with_member_rejected(secured_stack: Stack) -> None:
    stack = secured_stack
    stack.create_group("pg4", "ps4", 1)
    app = rsc.ConsumerApp(coordinator=stack.coordinator.url, redis_url=stack.redis.url,
                          instance_id="py-bad", token="wrong-token")

    @app.listener(group="pg4", stream="ps4")
    async def handle(msg: rsc.Message) -> None:
        pass

    started = time.monotonic()
    with pytest.raises(rsc.MemberRejectedError) as err:
        asyncio.run(asyncio.wait_for(app.run_async(handle_signals=False), 20))
    assert time.monotonic() - started < 15
    assert isinstance(err.value.__cause__, rsc.CoordinatorError), err.value.__cause__
    assert err.value.is_retriable is False


def test_publishes_awaited_together_keep_per_key_order(stack: Stack) -> None:
    stack.create_group("pg3", "ps3", 4)
    producer = rsc.Producer(coordinator=stack.coordinator.url, redis_url=stack.redis.url,
                            max_in_flight=3)

    async def burst() -> List[List[rsc.Published]]:
        # 30 batches awaited together, each writing every key once: up to 3 in flight.
        return await asyncio.gather(*(
            producer.publish_batch("ps3", [rsc.Record({"n": n}, key=f"key-{k}") for k in range(8)])
            for n in range(30)
        ))

    out = asyncio.run(burst())
    assert sum(len(b) for b in out) == 240
    seen: Dict[bytes, List[int]] = {}
    for shard in range(4):
        for _, fields in stack.xrange(f"ps3:{shard}"):
            seen.setdefault(fields[b"key"], []).append(json.loads(fields[b"payload"])["n"])
    assert len(seen) == 8
    for key, ns in seen.items():
        assert ns == list(range(30)), f"{key!r} out of call order: {ns}"


def test_unknown_options_and_bad_values_are_refused() -> None:
    with pytest.raises(TypeError, match="colour"):
        rsc.Producer(colour="blue")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="max_in_flight"):
        rsc.Producer(coordinator="http://127.0.0.1:1", redis_url="redis://127.0.0.1:1",
                     max_in_flight=0)
    app = rsc.ConsumerApp(coordinator="http://127.0.0.1:1", redis_url="redis://127.0.0.1:1",
                          instance_id="x")
    with pytest.raises(ValueError, match="ack"):
        app.listener(group="g", stream="s", ack="sometimes")(lambda m: None)
    with pytest.raises(rsc.ConfigError):
        rsc.ConsumerApp(coordinator="http://127.0.0.1:1", instance_id="x").member_ids()


def test_handler_exception_types() -> None:
    e = rsc.RetryAfter(1.5, "slow down")
    assert e.seconds == 1.5 and str(e) == "slow down"
    assert issubclass(rsc.MemberRejectedError, rsc.RscError)
    assert issubclass(rsc.EarlierPublishFailedError, rsc.RscError)
    assert issubclass(rsc.RscError, Exception)
