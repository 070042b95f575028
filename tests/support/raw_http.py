"""Reading an HTTP answer off a raw socket, for the tests that send what no HTTP client
would (headers without end, a body a byte a second, a body too large to send whole)."""

from __future__ import annotations

import socket


def read_answer(sock: socket.socket, *, timeout_s: float | None = None) -> bytes:
    """What the server answered on `sock`: its head, and its body up to its
    Content-Length. b"" when it closed without a word; the head alone when it reset the
    connection before the body came (a server closing a connection whose request it did not
    read whole). With `timeout_s`, raises AssertionError when no answer came within it."""
    if timeout_s is not None:
        sock.settimeout(timeout_s)
    answer = b""
    try:
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                return answer
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:  # the body may come in a packet of its own
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return head + b"\r\n\r\n" + body
    except TimeoutError:
        raise AssertionError(f"no answer within {sock.gettimeout()} s: {answer!r}") from None
    except ConnectionResetError:
        return answer


def status_of(answer: bytes) -> int:
    """The status code of an answer `read_answer` returned."""
    return int(answer.split(b" ", 2)[1])
