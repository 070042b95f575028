"""What `pipeline up` prints: every component's lines, each prefixed with its name.

The children write to pipes; one thread per child reads its lines and writes them here,
prefixed, to the terminal and to one log file, a whole line at a time (lines of two
components never mix within a line)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from typing import IO, TextIO

# The name `pipeline up` gives its own lines.
SUPERVISOR = "up"
# Between a component's name and its line, as in `docker compose up` and honcho.
SEPARATOR = " | "


def prefixed(name: str, text: str, *, width: int) -> str:
    """One output line: the component's name, padded to `width`, then its text."""
    return f"{name:<{width}}{SEPARATOR}{text}"


def decoded_line(raw: bytes) -> str:
    """A line as a child wrote it, without its line ending, undecodable bytes replaced."""
    return raw.decode("utf-8", errors="replace").rstrip("\r\n")


class Output:
    """The terminal and the log file of one `pipeline up`."""

    def __init__(self, *, terminal: TextIO, log_file: TextIO | None, names: Iterable[str]) -> None:
        self.terminal = terminal
        self.log_file = log_file
        self.width = max((len(name) for name in (SUPERVISOR, *names)), default=0)
        self._lock = threading.RLock()
        self._pumps: list[threading.Thread] = []

    def _write(self, lines: list[str], *, to_terminal: bool = True, to_file: bool = True) -> None:
        text = "".join(f"{line}\n" for line in lines)
        targets = [self.terminal] if to_terminal else []
        if to_file and self.log_file is not None:
            targets.append(self.log_file)
        with self._lock:
            for target in targets:
                # A terminal or a pipe that went away must not stop the stack.
                with contextlib.suppress(OSError, ValueError):
                    target.write(text)
                    target.flush()

    def line(self, name: str, text: str, *, terminal_only: bool = False) -> None:
        """Write `text` (which may span lines) as `name`'s, to the terminal and, unless
        `terminal_only` (a secret shown once), to the log file."""
        self.block(name, text.splitlines() or [""], terminal_only=terminal_only)

    def block(self, name: str, texts: list[str], *, terminal_only: bool = False) -> None:
        """Write several lines of `name`'s together, with no other line between them."""
        self._write([prefixed(name, t, width=self.width) for t in texts], to_file=not terminal_only)

    def show_once(self, name: str, on_terminal: list[str], in_file: list[str]) -> None:
        """Write `on_terminal` to the terminal and `in_file` (the same without its secrets)
        to the log file, together, with no other line between."""
        with self._lock:
            self._write([prefixed(name, t, width=self.width) for t in on_terminal], to_file=False)
            self._write([prefixed(name, t, width=self.width) for t in in_file], to_terminal=False)

    def pump(self, name: str, stream: IO[bytes]) -> None:
        """Copy `stream`'s lines, prefixed with `name`, until it ends (in a thread)."""

        def copy() -> None:
            with contextlib.closing(stream):
                for raw in iter(stream.readline, b""):
                    self.block(name, [decoded_line(raw)])

        thread = threading.Thread(target=copy, name=f"output-{name}", daemon=True)
        thread.start()
        self._pumps.append(thread)

    def drain(self, *, timeout_s: float) -> None:
        """Wait (up to `timeout_s` each) for the pumps to copy what their children wrote."""
        for thread in self._pumps:
            thread.join(timeout=timeout_s)

    def close(self) -> None:
        with self._lock:
            if self.log_file is not None:
                self.log_file.close()
                self.log_file = None
