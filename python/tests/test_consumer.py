"""Listeners against a real coordinator and Redis: async and thread-pool handlers, retries
and dead letters, manual acknowledgement, batches, rebalance callbacks, a handler hung past
the revocation deadline."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set

import pytest
import rsc
from conftest import Stack


def app_for(stack: Stack, instance: str = "py-a", **options: Any) -> rsc.ConsumerApp:
    return rsc.ConsumerApp(
        coordinator=stack.coordinator.url, redis_url=stack.redis.url, instance_id=instance,
        **options,
    )


def producer_for(stack: Stack, **options: Any) -> rsc.Producer:
    return rsc.Producer(coordinator=stack.coordinator.url, redis_url=stack.redis.url, **options)


async def run_until(app: rsc.ConsumerApp, done: Callable[[], bool], timeout: float = 30) -> None:
    """Runs ``app`` until ``done()``, then shuts it down gracefully (errors raised)."""
    task = asyncio.create_task(app.run_async(handle_signals=False))
    deadline = time.monotonic() + timeout
    try:
        while not done():
            if task.done():
                await task
                raise AssertionError("the app stopped on its own")
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting for the condition")
            await asyncio.sleep(0.02)
    finally:
        app.shutdown()
        await asyncio.wait_for(task, 30)


def pending(stack: Stack, stream: str, group: str, shards: int) -> int:
    total = 0
    for i in range(shards):
        info: Any = stack.redis.client.xpending(f"{stream}:{i}", group)
        total += int(info["pending"])
    return total


def test_async_handler_consumes_every_message_once(stack: Stack) -> None:
    stack.create_group("g1", "s1", 4)
    producer = producer_for(stack)
    sent = producer.publish_batch_sync(
        "s1", [rsc.Record({"n": i}, key=f"k{i}", headers={"h": "v"}) for i in range(40)]
    )
    app = app_for(stack)
    seen: Dict[Any, Any] = {}

    @app.listener(group="g1", stream="s1", concurrency=2)
    async def handle(msg: rsc.Message) -> None:
        assert msg.headers == {"h": "v"}
        assert msg.key == f"k{msg.json()['n']}"
        assert msg.shard_key == f"s1:{msg.shard}"
        seen[(msg.shard, msg.id)] = msg.json()

    asyncio.run(run_until(app, lambda: len(seen) >= 40))
    assert sorted(seen) == sorted((p.shard, p.id) for p in sent)
    assert pending(stack, "s1", "g1", 4) == 0


def test_raising_handler_is_retried_then_dead_lettered(stack: Stack) -> None:
    stack.create_group("g2", "s2", 1)
    producer = producer_for(stack)
    producer.publish_sync("s2", {"n": 1}, key="boom")
    producer.publish_sync("s2", {"n": 2}, key="poison")
    producer.publish_sync("s2", {"n": 3}, key="later")
    attempts: Dict[str, List[int]] = {}
    app = app_for(stack)

    @app.listener(group="g2", stream="s2", max_retries=2, retry_backoff=(0.01, 0.05))
    async def handle(msg: rsc.Message) -> None:
        key = msg.key or ""
        attempts.setdefault(key, []).append(msg.attempt)
        if key == "boom":
            raise ValueError("cannot handle boom") from KeyError("inner")
        if key == "poison":
            raise rsc.DeadLetter("never valid")
        if key == "later" and msg.attempt == 1:
            raise rsc.RetryAfter(0.05, "rate limited")

    def dlq_len() -> int:
        return stack.xlen("s2:dlq")

    asyncio.run(run_until(app, lambda: dlq_len() >= 2 and len(attempts.get("later", [])) >= 2))
    assert attempts["boom"] == [1, 2, 3], "max_retries=2: three attempts, then the dead letter"
    assert attempts["poison"] == [1], "DeadLetter: no retry"
    assert attempts["later"] == [1, 2], "RetryAfter: retried, then handled"
    entries = stack.xrange("s2:dlq")
    errors = {e[1][b"key"].decode(): e[1].get(b"error", b"").decode() for e in entries}
    assert set(errors) == {"boom", "poison"}
    assert "ValueError: cannot handle boom" in errors["boom"] and "KeyError" in errors["boom"]
    assert "never valid" in errors["poison"]
    assert pending(stack, "s2", "g2", 1) == 0


def test_plain_def_handler_runs_on_the_thread_pool(stack: Stack) -> None:
    stack.create_group("g3", "s3", 2)
    producer_for(stack).publish_batch_sync("s3", [{"n": i} for i in range(10)])
    threads: Set[str] = set()
    count = [0]
    lock = threading.Lock()
    app = app_for(stack, handler_threads=4)

    @app.listener(group="g3", stream="s3")
    def handle(msg: rsc.Message) -> None:
        with lock:
            threads.add(threading.current_thread().name)
            count[0] += 1

    asyncio.run(run_until(app, lambda: count[0] >= 10))
    assert all(t.startswith("rsc-handler") for t in threads), threads
    assert threading.main_thread().name not in threads


def test_manual_ack_leaves_unacknowledged_entries_pending(stack: Stack) -> None:
    stack.create_group("g4", "s4", 1)
    producer_for(stack).publish_batch_sync("s4", [{"n": i} for i in range(10)])
    handled: List[int] = []
    app = app_for(stack)

    @app.listener(group="g4", stream="s4", ack="manual")
    async def handle(msg: rsc.Message) -> None:
        n = msg.json()["n"]
        if n % 2 == 0:
            await msg.ack()
        handled.append(n)

    asyncio.run(run_until(app, lambda: len(handled) >= 10))
    assert pending(stack, "s4", "g4", 1) == 5


def test_manual_ack_from_a_thread_pool_handler(stack: Stack) -> None:
    stack.create_group("g4b", "s4b", 1)
    producer_for(stack).publish_batch_sync("s4b", [{"n": i} for i in range(4)])
    handled: List[int] = []
    app = app_for(stack)

    @app.listener(group="g4b", stream="s4b", ack="manual")
    def handle(msg: rsc.Message) -> None:
        msg.ack_sync()
        handled.append(1)

    asyncio.run(run_until(app, lambda: len(handled) >= 4))
    assert pending(stack, "s4b", "g4b", 1) == 0


def test_batch_handler_fails_single_messages(stack: Stack) -> None:
    stack.create_group("g5", "s5", 1)
    producer_for(stack).publish_batch_sync("s5", [{"n": i} for i in range(30)])
    sizes: List[int] = []
    done: Set[int] = set()
    app = app_for(stack)

    @app.listener(group="g5", stream="s5", max_batch=8)
    async def handle(msgs: List[rsc.Message]) -> Optional[Dict[Any, BaseException]]:
        sizes.append(len(msgs))
        failed: Dict[Any, BaseException] = {}
        for m in msgs:
            n = m.json()["n"]
            if n == 7:
                failed[m] = rsc.DeadLetter("seven")
            else:
                done.add(n)
        return failed

    asyncio.run(
        run_until(app, lambda: len(done) >= 29 and stack.xlen("s5:dlq") == 1)
    )
    assert max(sizes) <= 8 and max(sizes) > 1, sizes
    assert 7 not in done
    assert pending(stack, "s5", "g5", 1) == 0


def test_rebalance_callbacks_name_the_shards(stack: Stack) -> None:
    stack.create_group("g6", "s6", 3)
    assigned: List[int] = []
    revoked: List[int] = []
    app = app_for(stack)

    def on_assigned(r: rsc.Rebalance) -> None:
        assert r.group == "g6" and r.stream == "s6"
        assigned.extend(r.shards)

    @app.listener(group="g6", stream="s6", on_assigned=on_assigned,
                  on_revoked=lambda r: revoked.extend(r.shards))
    async def handle(msg: rsc.Message) -> None:
        pass

    asyncio.run(run_until(app, lambda: sorted(assigned) == [0, 1, 2]))
    assert sorted(revoked) == [0, 1, 2], "a graceful shutdown gives every shard back"


def test_a_handler_hung_past_the_revocation_deadline_is_cancelled(stack: Stack) -> None:
    stack.create_group("g7", "s7", 2, rebalance_ms=1500)
    producer = producer_for(stack)
    # One hanging message on each shard: whichever shard moves, its handler is stuck.
    shards: Dict[int, str] = {}
    i = 0
    while len(shards) < 2:
        key = f"hang-{i}"
        shards.setdefault(producer.publish_sync("s7", {"n": i}, key=key).shard, key)
        i += 1
    a = app_for(stack, "py-a", shutdown_timeout=1.0)
    b = app_for(stack, "py-b")
    cancelled: List[str] = []
    started: Set[str] = set()
    taken_over: Dict[str, int] = {}

    @a.listener(group="g7", stream="s7")
    async def stuck(msg: rsc.Message) -> None:
        started.add(msg.key or "")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(msg.key or "")
            raise

    @b.listener(group="g7", stream="s7")
    async def fine(msg: rsc.Message) -> None:
        taken_over[msg.key or ""] = msg.delivery_count

    async def main() -> None:
        task_a = asyncio.create_task(a.run_async(handle_signals=False))
        deadline = time.monotonic() + 30
        while len(started) < 2:
            assert time.monotonic() < deadline and not task_a.done()
            await asyncio.sleep(0.02)
        try:
            await run_until(b, lambda: bool(taken_over) and bool(cancelled))
        finally:
            a.shutdown()
            # The shard A kept still has its stuck handler: the shutdown gives up on it.
            with pytest.raises(rsc.ShutdownTimedOutError):
                await asyncio.wait_for(task_a, 30)

    asyncio.run(main())
    (key, deliveries), = taken_over.items()
    assert key in cancelled, "the stuck handler of the moved shard was cancelled"
    assert deliveries >= 2, "the new owner handles the entry again"


def test_tracing_events_reach_python_logging(stack: Stack, caplog: Any) -> None:
    import logging

    caplog.set_level(logging.INFO)
    stack.create_group("g8", "s8", 1)
    app = app_for(stack)
    ready = [False]

    @app.listener(group="g8", stream="s8")
    async def handle(msg: rsc.Message) -> None:
        pass

    async def main() -> None:
        async def watch() -> None:
            while app.not_ready() is not None:
                await asyncio.sleep(0.02)
            ready[0] = True

        watcher = asyncio.create_task(watch())
        await run_until(app, lambda: ready[0])
        await watcher

    asyncio.run(main())
    names = {r.name for r in caplog.records}
    assert any(n.startswith("rsc_client") for n in names), names
    assert any("consumer app started" in r.getMessage() for r in caplog.records)


def test_health_and_metrics_endpoints(stack: Stack) -> None:
    import urllib.request

    from conftest import free_port

    stack.create_group("g9", "s9", 1)
    producer_for(stack).publish_sync("s9", {"n": 1})
    port = free_port()
    app = app_for(stack, health_listen=f"127.0.0.1:{port}")
    handled: List[int] = []

    @app.listener(group="g9", stream="s9")
    async def handle(msg: rsc.Message) -> None:
        handled.append(1)

    def get(path: str) -> Any:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except OSError:
            return None

    seen: Dict[str, Any] = {}

    async def probe() -> None:
        while not handled or "metrics" not in seen:
            ready = await asyncio.to_thread(get, "/readyz")
            if ready and ready[0] == 200 and handled:
                seen["metrics"] = await asyncio.to_thread(get, "/metrics")
            await asyncio.sleep(0.05)

    async def main() -> None:
        prober = asyncio.create_task(probe())
        await run_until(app, lambda: "metrics" in seen)
        await prober

    asyncio.run(main())
    status, text = seen["metrics"]
    assert status == 200 and "rsc_client_messages_handled_total" in text, text[:500]
