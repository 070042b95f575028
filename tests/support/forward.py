"""A plain TCP forwarder, run as its own process: `python -m tests.support.forward
LISTEN_HOST:PORT=TARGET_HOST:PORT ...`. It lets hosts in network namespaces reach a
service that listens on 127.0.0.1 only (the machine's PostgreSQL, a recorder of the
tests), through an address on the namespaces' bridge. It prints `forwarding` once every
listener is up, and runs until it is stopped."""

from __future__ import annotations

import asyncio
import contextlib
import sys

# How much one read moves at a time.
CHUNK_BYTES = 65536


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.CancelledError):
        while data := await reader.read(CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
    # One side ended: end the other, so that neither end waits for the forwarder.
    with contextlib.suppress(OSError):
        writer.close()


def _handler(target_host: str, target_port: int):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return handle


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def serve(mappings: list[tuple[tuple[str, int], tuple[str, int]]]) -> None:
    servers = [
        await asyncio.start_server(_handler(*target), listen[0], listen[1])
        for listen, target in mappings
    ]
    print("forwarding", flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


def main(argv: list[str]) -> None:
    mappings = []
    for argument in argv:
        listen, _, target = argument.partition("=")
        mappings.append((_address(listen), _address(target)))
    asyncio.run(serve(mappings))


if __name__ == "__main__":
    main(sys.argv[1:])
