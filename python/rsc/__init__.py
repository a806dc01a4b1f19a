"""Python client of Redis Stream Coordinator, on the Rust client ``rsc-client``.

Consumers: decorate handlers with :meth:`ConsumerApp.listener` and run the app; the Rust
runtime reads, retries, dead-letters and acknowledges, and keeps each shard with one member
at a time. Producers: :class:`Producer` routes each message to its shard by key and writes
it, fenced and idempotent. See ``docs/PYTHON.md``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import signal
from typing import Any, Awaitable, Callable, List, Optional, Tuple, TypeVar, Union

from . import _rsc
from ._rsc import (
    ConfigError,
    CoordinatorError,
    DataRedisUnreachableError,
    DeliveryTimeoutError,
    EarlierPublishFailedError,
    EncodeError,
    FencedError,
    MemberRejectedError,
    Message,
    NotReplicatedError,
    OpsListenError,
    PanickedError,
    Producer,
    Published,
    Rebalance,
    Record,
    RedisError,
    RscError,
    ShutdownTimedOutError,
    StaleRoutingError,
)

__version__: str = _rsc.__version__

__all__ = [
    "ConsumerApp",
    "Message",
    "Rebalance",
    "Producer",
    "Record",
    "Published",
    "RetryAfter",
    "DeadLetter",
    "RscError",
    "ConfigError",
    "RedisError",
    "DataRedisUnreachableError",
    "FencedError",
    "StaleRoutingError",
    "DeliveryTimeoutError",
    "NotReplicatedError",
    "CoordinatorError",
    "EncodeError",
    "PanickedError",
    "ShutdownTimedOutError",
    "OpsListenError",
    "MemberRejectedError",
    "EarlierPublishFailedError",
]


class RetryAfter(Exception):
    """Raise from a handler to retry the message after ``seconds`` (counts as a retry)."""

    def __init__(self, seconds: float, reason: str = "retry later") -> None:
        super().__init__(reason)
        self.seconds = float(seconds)


class DeadLetter(Exception):
    """Raise from a handler to dead-letter the message now (to ``<stream>:dlq``): retrying
    cannot help."""


_Verdict = Optional[Tuple[str, float, str]]
_F = TypeVar("_F", bound=Callable[..., Any])


def _describe(e: BaseException) -> str:
    """The exception and its causes, ``: ``-separated (the dead letter's ``error``)."""
    parts = []
    seen = 0
    cur: Optional[BaseException] = e
    while cur is not None and seen < 8:
        parts.append(f"{type(cur).__name__}: {cur}" if str(cur) else type(cur).__name__)
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
        seen += 1
    return ": ".join(parts)


def _verdict(e: BaseException) -> Tuple[str, float, str]:
    if isinstance(e, RetryAfter):
        return ("retry_after", e.seconds, _describe(e))
    if isinstance(e, DeadLetter):
        return ("dead_letter", 0.0, _describe(e))
    return ("retry", 0.0, _describe(e))


class ConsumerApp:
    """Runs listeners: for each, ``concurrency`` members of its consumer group, until
    SIGTERM / Ctrl-C (or :meth:`shutdown`); then finishes in-flight messages, acknowledges
    them and leaves the groups so that the shards move on at once.

    Options (keyword arguments) left out keep the environment's values, read as the Rust
    client reads them (``RSC_COORDINATOR_URL``, ``RSC_REDIS_URL``, ``RSC_TOKEN``,
    ``RSC_TOKEN_FILE``, ``POD_IP``, …): ``coordinator``, ``redis_url``, ``redis_cluster``,
    ``redis_sentinel`` + ``redis_sentinel_master``, ``redis_sentinel_tls``,
    ``redis_tls_ca``, ``redis_tls_cert`` + ``redis_tls_key``, ``token``, ``token_file``,
    ``coordinator_ca``, ``coordinator_cert``, ``coordinator_key``, ``instance_id``,
    ``static_instance_id``, ``shutdown_timeout`` (s), ``data_redis_grace`` (s),
    ``heartbeat_batching``, ``shared_reader``, ``wake_channel``, ``health_listen``
    (``HOST:PORT``: ``/healthz``, ``/readyz``, ``/metrics``), and ``handler_threads`` (the
    thread pool of plain ``def`` handlers).
    """

    def __init__(self, **options: Any) -> None:
        self._threads: Optional[int] = options.pop("handler_threads", None)
        self._inner = _rsc.ConsumerApp(**options)
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    @classmethod
    def from_env(cls, **options: Any) -> "ConsumerApp":
        """An app configured from the environment (the same names as the Rust client's),
        any keyword argument taking precedence."""
        return cls(**options)

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=self._threads, thread_name_prefix="rsc-handler"
            )
        return self._pool

    def listener(
        self,
        *,
        group: str,
        stream: str,
        name: Optional[str] = None,
        concurrency: Optional[int] = None,
        key_concurrency: Optional[int] = None,
        max_retries: Optional[int] = None,
        retry_backoff: Optional[Tuple[float, float]] = None,
        ack: str = "auto",
        max_batch: Optional[int] = None,
        linger: Optional[float] = None,
        batch_size: Optional[int] = None,
        block_timeout: Optional[float] = None,
        drain_grace: Optional[float] = None,
        on_assigned: Optional[Callable[[Rebalance], Any]] = None,
        on_revoked: Optional[Callable[[Rebalance], Any]] = None,
    ) -> Callable[[_F], _F]:
        """Registers the decorated function as a listener of ``group`` on ``stream``.

        The function takes a :class:`Message` (with ``max_batch``: a list of them, from one
        shard) and returns nothing; an ``async def`` runs on the app's asyncio loop, a plain
        ``def`` on a thread pool. An exception retries the message with the listener's
        backoff, then dead-letters it; :class:`RetryAfter` and :class:`DeadLetter` say
        otherwise. A batch handler may return a dict ``{message or entry id: exception}`` to
        fail some messages only.
        """

        def decorate(fn: _F) -> _F:
            batch = max_batch is not None
            wrapped = self._batch(fn) if batch else self._single(fn)
            self._inner.add_listener(
                wrapped,
                group,
                stream,
                batch,
                name=name,
                concurrency=concurrency,
                key_concurrency=key_concurrency,
                max_retries=max_retries,
                retry_backoff=retry_backoff,
                ack=ack,
                max_batch=max_batch,
                linger=linger,
                batch_size=batch_size,
                block_timeout=block_timeout,
                drain_grace=drain_grace,
                on_assigned=self._callback(on_assigned),
                on_revoked=self._callback(on_revoked),
            )
            return fn

        return decorate

    def _call(self, fn: Callable[..., Any]) -> Callable[[Any], Awaitable[Any]]:
        """The function as a coroutine function: ``async def`` as it is, ``def`` on the pool."""
        if inspect.iscoroutinefunction(fn):
            return fn

        async def in_pool(arg: Any) -> Any:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor(), fn, arg)

        return in_pool

    def _single(self, fn: Callable[[Message], Any]) -> Callable[[Message], Awaitable[_Verdict]]:
        call = self._call(fn)

        @functools.wraps(fn)
        async def handle(msg: Message) -> _Verdict:
            try:
                await call(msg)
                return None
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # noqa: BLE001 - every failure is a verdict
                return _verdict(e)

        return handle

    def _batch(
        self, fn: Callable[[List[Message]], Any]
    ) -> Callable[[List[Message]], Awaitable[Tuple[_Verdict, List[Tuple[str, _Verdict]]]]]:
        call = self._call(fn)

        @functools.wraps(fn)
        async def handle(msgs: List[Message]) -> Tuple[_Verdict, List[Tuple[str, _Verdict]]]:
            try:
                failed = await call(msgs)
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # noqa: BLE001 - every failure is a verdict
                return (_verdict(e), [])
            each: List[Tuple[str, _Verdict]] = []
            if failed:
                for which, err in dict(failed).items():
                    entry_id = which.id if isinstance(which, Message) else str(which)
                    each.append((entry_id, _verdict(err)))
            return (None, each)

        return handle

    def _callback(
        self, fn: Optional[Callable[[Rebalance], Any]]
    ) -> Optional[Callable[[Rebalance], None]]:
        """A rebalance callback the Rust runtime calls: an ``async def`` one is scheduled on
        the app's loop (the member does not wait for it)."""
        if fn is None:
            return None
        if not inspect.iscoroutinefunction(fn):
            return fn
        coro_fn = fn

        def schedule(r: Rebalance) -> None:
            if self._loop is not None:
                asyncio.run_coroutine_threadsafe(coro_fn(r), self._loop)

        return schedule

    def member_ids(self) -> List[str]:
        """The member ids the app runs (``<instance>-<listener>-<index>``); raises
        :class:`ConfigError` as running would for a bad configuration."""
        return self._inner.member_ids()

    async def run_async(self, *, handle_signals: bool = True) -> None:
        """Runs the app on the running asyncio loop until SIGTERM / SIGINT (with
        ``handle_signals``, in the main thread) or :meth:`shutdown`, then shuts down
        gracefully. Raises the error that stopped it (e.g. :class:`MemberRejectedError`)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        installed = []
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, self.shutdown)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    pass
        try:
            await self._inner.run(loop)
        except asyncio.CancelledError:
            self.shutdown()
            raise
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None

    def run(self) -> None:
        """Runs the app (blocking) on a new asyncio loop: :meth:`run_async` under
        ``asyncio.run``."""
        asyncio.run(self.run_async())

    def shutdown(self) -> None:
        """Starts a graceful shutdown (as SIGTERM does); callable from any thread."""
        self._inner.shutdown()

    def pause(self, listener: str) -> bool:
        """Stops handling new messages of a listener (by name) in this process."""
        return self._inner.pause(listener)

    def resume(self, listener: str) -> bool:
        """Resumes a paused listener."""
        return self._inner.resume(listener)

    def not_ready(self) -> Optional[str]:
        """Why the app is not ready (``None``: every member joined and Redis answers)."""
        return self._inner.not_ready()

    def wait_ready(self, timeout: float) -> bool:
        """Blocks until the app is ready or ``timeout`` seconds passed; whether it is."""
        return self._inner.wait_ready(timeout)


Payload = Union[bytes, bytearray, memoryview, Any]
