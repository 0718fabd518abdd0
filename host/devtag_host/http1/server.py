"""Serving an ASGI application on listening sockets: in this thread until a signal, from a
background thread, or in worker processes.

Every setting is a field of :class:`Limits` (no environment, no globals); an
application is given as an object, or for worker processes as a callable
that builds it in each worker.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import signal
import socket
import threading
import time
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from .admission import WAITING, Admission, Phase
from .protocol import Connection, Head, plain_answer
from .refusals import Each, RefusalCounter, Summary, summary_text

log = logging.getLogger("devtag_host.http1")


@dataclass(frozen=True)
class Limits:
    """What one server allows a connection (see :mod:`.protocol` and :mod:`.admission`)."""

    request_timeout: float = 10.0  # a request, head and body, must arrive whole within this
    keep_alive_timeout: float = 5.0  # an idle kept-alive connection is closed after this
    per_source_limit: int = 64  # connections waiting for a head or body, per source address
    max_connections: int = 2048  # open connections in all
    max_head_bytes: int = 64 * 1024
    max_body_bytes: Optional[int] = None  # None: the application decides
    max_pipelined: int = 16  # requests waiting behind the one being answered, per connection
    write_buffer_bytes: int = 64 * 1024  # answers not yet taken by the client, per connection
    inline: bool = False  # run the application's coroutine at once until it first waits
    date_header: bool = False
    lifespan: bool = False  # run the application's ASGI lifespan
    refusal_interval: float = 10.0  # refusals are written once per source and interval
    graceful_timeout: float = 30.0  # at a stop, how long requests being answered may take
    answer_headers: Optional[Callable[[], Sequence[Tuple[bytes, bytes]]]] = None  # of the layer's own answers

    def check(self) -> None:
        for name in ("request_timeout", "keep_alive_timeout", "refusal_interval", "graceful_timeout"):
            value = getattr(self, name)
            if not 0 < value < 1e6:
                raise ValueError(f"{name} must be positive and finite, not {value!r}")
        if self.per_source_limit < 1 or self.max_pipelined < 1 or self.max_head_bytes < 1024:
            raise ValueError("per_source_limit and max_pipelined must be at least 1, max_head_bytes 1024")


def _logged_summary(source: Optional[str], rows: Any, seconds: float) -> None:
    log.warning("%s: %s", source or "-", summary_text(rows, seconds))


class ServerState:
    """What the connections of one server share: the application, limits, admission and refusal counts."""

    def __init__(
        self,
        app: Any,
        settings: Limits,
        loop: asyncio.AbstractEventLoop,
        *,
        on_refusals: Optional[Summary] = None,
        on_refusal: Optional[Each] = None,
    ) -> None:
        settings.check()
        self.app = app
        self.settings = settings
        self.loop = loop
        self.connections: Set[Connection] = set()
        self.admission = Admission(settings.per_source_limit, settings.max_connections)
        self.refusals = RefusalCounter(on_refusals or _logged_summary, on_refusal, interval=settings.refusal_interval)
        self.date_header: Optional[Callable[[], bytes]] = self._date if settings.date_header else None
        self.heads: Dict[Tuple[int, Any], Head] = {}  # response heads sent before (protocol.head_of)
        self.targets: Dict[bytes, Tuple[str, bytes, bytes]] = {}  # request targets parsed (protocol.target_of)
        self._date_at = 0
        self._date_line = b""
        period = min(settings.request_timeout, settings.keep_alive_timeout, settings.refusal_interval) / 3
        self._period = max(0.05, min(period, 1.0))
        self._sweep: Optional[asyncio.TimerHandle] = loop.call_later(self._period, self.sweep)

    def _date(self) -> bytes:
        now = int(time.time())
        if now != self._date_at:
            self._date_at = now
            self._date_line = b"date: %s\r\n" % formatdate(now, usegmt=True).encode("ascii")
        return self._date_line

    def opened(self, conn: Connection) -> None:
        self.connections.add(conn)
        conn.counted = conn.source is not None
        if not conn.counted:
            return
        decision = self.admission.admit(conn)
        for victim, reason, answer in decision.evict:
            self.admission.forget(victim)
            victim.counted = False
            if answer:
                victim.refuse(503, reason, b"Service Unavailable")
            else:
                victim.close()
                self.refused(victim, 503, reason)
        if decision.refuse is not None:
            conn.refuse(503, decision.refuse, b"Service Unavailable")

    def closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if conn.counted:
            conn.counted = False
            self.admission.forget(conn)

    def refused(self, conn: Connection, status: int, reason: str) -> None:
        if conn.counted:
            conn.counted = False
            self.admission.forget(conn)
        self.refusals.add(conn.source, status, reason, self.loop.time())

    def sweep(self) -> None:
        """Close connections past their deadlines; write the refusals of an interval that is over."""
        now = self.loop.time()
        settings = self.settings
        for conn in list(self.connections):
            if conn.closing:
                continue
            if conn.phase in WAITING and now - conn.since > settings.request_timeout:
                conn.close()
                self.refused(conn, 408, f"no complete request within {settings.request_timeout:g} s")
            elif conn.phase == Phase.IDLE and now - conn.since > settings.keep_alive_timeout:
                conn.close()
        if self.refusals.due(now):
            self.refusals.flush(now)
        self._sweep = self.loop.call_later(self._period, self.sweep)

    async def shutdown(self) -> None:
        """Close every connection not being answered; wait (up to the graceful timeout) for the others."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        deadline = self.loop.time() + self.settings.graceful_timeout
        while True:
            for conn in list(self.connections):
                if conn.phase != Phase.BUSY and not conn.closing:
                    conn.close()
            if not self.connections or self.loop.time() > deadline:
                break
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.close()
        self.refusals.flush(self.loop.time())


class Lifespan:
    """The application's ASGI lifespan: startup before serving, shutdown after."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._messages: asyncio.Queue[Dict[str, Any]] = asyncio.Queue()
        self._started: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._stopped: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._task: Optional[asyncio.Task[None]] = None

    async def startup(self) -> None:
        self._messages.put_nowait({"type": "lifespan.startup"})
        self._task = asyncio.get_running_loop().create_task(self._run())
        if not await self._started:
            raise RuntimeError("the application's lifespan startup failed")

    async def shutdown(self) -> None:
        if self._task is None or self._task.done():
            return
        self._messages.put_nowait({"type": "lifespan.shutdown"})
        await self._stopped

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        try:
            await self.app(scope, self._messages.get, self._send)
        except BaseException:
            log.exception("the application's lifespan failed")
        finally:
            for future in (self._started, self._stopped):
                if not future.done():
                    future.set_result(future is self._started)  # an app without a lifespan: serve

    async def _send(self, message: Dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "lifespan.startup.complete":
            self._started.set_result(True)
        elif kind == "lifespan.startup.failed":
            self._started.set_result(False)
        elif kind.startswith("lifespan.shutdown") and not self._stopped.done():
            self._stopped.set_result(True)


class Server:
    """``app`` on ``sockets`` (listening already) with ``settings``; :meth:`serve` until :meth:`stop`."""

    def __init__(
        self,
        app: Any,
        sockets: Sequence[socket.socket],
        settings: Limits = Limits(),
        *,
        on_refusals: Optional[Summary] = None,
        on_refusal: Optional[Each] = None,
        on_shutdown: Sequence[Callable[[], None]] = (),
    ) -> None:
        settings.check()
        self.app = app
        self.sockets = list(sockets)
        self.settings = settings
        self._on_refusals = on_refusals
        self._on_refusal = on_refusal
        self._on_shutdown = list(on_shutdown)
        self.connections: Set[Connection] = set()  # the open connections (metrics read its length)
        self.started = threading.Event()
        self._stop: Optional[asyncio.Event] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stop = asyncio.Event()
        state = ServerState(self.app, self.settings, loop, on_refusals=self._on_refusals, on_refusal=self._on_refusal)
        state.connections = self.connections
        lifespan = Lifespan(self.app) if self.settings.lifespan else None
        if lifespan is not None:
            await lifespan.startup()
        servers = [
            await loop.create_server(lambda: Connection(state), sock=sock, backlog=1024) for sock in self.sockets
        ]
        self.started.set()
        try:
            await self._stop.wait()
        finally:
            for server in servers:
                server.close()
            await state.shutdown()
            if lifespan is not None:
                await lifespan.shutdown()
            for callback in self._on_shutdown:
                callback()

    def stop(self) -> None:
        """Stop serving (from any thread)."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            loop.call_soon_threadsafe(stop.set)

    def run(self) -> None:
        """Serve in this (the main) thread until SIGTERM or SIGINT, then stop and raise the signal again
        (SIGTERM's default action ends the process by the signal; SIGINT's is KeyboardInterrupt)."""
        received: List[int] = []

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stopped_by, signum)
            await self.serve()

        def stopped_by(signum: int) -> None:
            received.append(signum)
            self.stop()

        _new_runner()(main())
        if received:
            signal.signal(received[0], signal.SIG_DFL if received[0] == signal.SIGTERM else signal.default_int_handler)
            signal.raise_signal(received[0])


def _new_runner() -> Callable[[Any], None]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency of the host extra
        return asyncio.run
    return uvloop.run


class BackgroundServer:
    """``app`` served from a daemon thread on ``host:port`` (tests, benchmarks, embedding)."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, settings: Limits = Limits(), **kw: Any):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)[0][4]
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(address)
        self._socket.listen(1024)
        self.host = host
        self.port: int = self._socket.getsockname()[1]
        self.server = Server(app, [self._socket], settings, **kw)
        self._thread = threading.Thread(target=self._serve, name="devtag-http", daemon=True)
        self._thread.start()
        if not self.server.started.wait(10):
            raise RuntimeError("the server did not start")

    def _serve(self) -> None:
        _new_runner()(self.server.serve())

    def stop(self) -> None:
        self.server.stop()
        self._thread.join(timeout=30)
        self._socket.close()


def run_workers(
    build_app: Callable[[], Any],
    sock: socket.socket,
    settings: Limits,
    count: int,
    *,
    on_shutdown: Sequence[Callable[[], None]] = (),
) -> None:
    """Serve the application ``build_app()`` builds in each of ``count`` forked worker processes,
    all on ``sock``, until SIGTERM or SIGINT (passed on to the workers); once they have stopped,
    run ``on_shutdown`` and raise the signal again."""
    context = multiprocessing.get_context("fork")  # the application's builder and the socket, as they are
    workers = [context.Process(target=_worker, args=(build_app, sock, settings), daemon=True) for _ in range(count)]
    for worker in workers:
        worker.start()
    received: List[int] = []

    def passed_on(signum: int, _frame: Any) -> None:
        received.append(signum)
        for worker in workers:
            if worker.is_alive():
                worker.terminate()  # SIGTERM: the worker stops as a single server does

    previous = {signum: signal.signal(signum, passed_on) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        for worker in workers:
            worker.join()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    for callback in on_shutdown:
        callback()
    if received:
        signal.signal(received[0], signal.SIG_DFL if received[0] == signal.SIGTERM else signal.default_int_handler)
        signal.raise_signal(received[0])


def _worker(build_app: Callable[[], Any], sock: socket.socket, settings: Limits) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent passes it on
    Server(build_app(), [sock], settings).run()


__all__ = ["BackgroundServer", "Limits", "Server", "plain_answer", "run_workers"]
