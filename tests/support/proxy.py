"""A TCP proxy of the tests' own, on 127.0.0.1, that mistreats idle connections the way
sidecars, NATs and load balancers do: `drop` stops forwarding a connection idle for more
than `idle_s` and sends nothing (the peer is never told), `close` closes it. `blackhole()`
does to every connection, and every new one, what `drop` does to an idle one, until
`heal()` closes those it swallowed."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field


@dataclass
class _Pair:
    last_s: float
    writers: tuple[asyncio.StreamWriter, asyncio.StreamWriter]
    dead: bool = False


@dataclass
class IdleProxy:
    upstream_port: int
    idle_s: float
    mode: str  # "drop" or "close"
    port: int = 0
    dropped: int = 0
    pairs: list[_Pair] = field(default_factory=list)
    holed: bool = False

    def start(self) -> IdleProxy:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10)
        return self

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.server = server
        self.port = server.sockets[0].getsockname()[1]
        self.reaper = self.loop.create_task(self._reap())
        started.set()
        self.loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.holed:  # accepted, and never answered
            pair = _Pair(last_s=time.monotonic(), writers=(writer, writer), dead=True)
            self.pairs.append(pair)
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while await reader.read(65536):
                    pass
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        pair = _Pair(last_s=time.monotonic(), writers=(writer, up_writer))
        self.pairs.append(pair)
        await asyncio.gather(
            self._pipe(reader, up_writer, pair), self._pipe(up_reader, writer, pair)
        )

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pair: _Pair
    ) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                if pair.dead:
                    continue  # swallowed: the peer waits for an answer that never comes
                pair.last_s = time.monotonic()
                writer.write(data)
                await writer.drain()
        if not pair.dead or self.mode == "close":
            with contextlib.suppress(OSError):
                writer.close()

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for pair in self.pairs:
                if pair.dead or now - pair.last_s <= self.idle_s:
                    continue
                pair.dead = True
                self.dropped += 1
                if self.mode == "close":
                    for writer in pair.writers:
                        with contextlib.suppress(OSError):
                            writer.close()

    def blackhole(self) -> None:
        """From now on nothing passes, on open connections or new ones; no peer is told."""
        self.loop.call_soon_threadsafe(self._blackhole)

    def _blackhole(self) -> None:
        self.holed = True
        for pair in self.pairs:
            pair.dead = True

    def heal(self) -> None:
        """New connections pass again; those swallowed are closed, so their peers see the
        connection end (as they would once TCP gave up on it)."""
        asyncio.run_coroutine_threadsafe(self._heal(), self.loop).result(timeout=10)

    async def _heal(self) -> None:
        self.holed = False
        for pair in self.pairs:
            if pair.dead:
                for writer in pair.writers:
                    with contextlib.suppress(OSError):
                        writer.close()

    async def _shutdown(self) -> None:
        self.server.close()
        for pair in self.pairs:
            for writer in pair.writers:
                with contextlib.suppress(OSError):
                    writer.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for pair in self.pairs:
            for writer in pair.writers:
                with contextlib.suppress(OSError, asyncio.CancelledError):
                    await writer.wait_closed()

    def stop(self) -> None:
        """Close every connection and the listener, then end the loop's thread."""
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()
