"""A blocking Redis connection whose pipelined GETs land in a reused buffer.

redis-py's blocking client hands every value over as a new bytes object: the socket's bytes
go into hiredis's buffer, then into that object, and the caller copies them once more into the
CPU row. This connection parses the replies (RESP2) itself and receives each value's bytes
straight into a buffer the caller reuses for every value (`recv_into`; the few bytes already
read with the reply's header are moved first), and copied from there into its row once it
is verified. Measured with `kvstore bench remote --skip-ttft` (its reads section, in the bench
process, no engine running; loopback Redis 7, 63 values of 512 KiB, verified and copied into
rows; idle 2-vCPU Xeon with AVX-512/AMX; three back-to-back pairs): 24.9-29.2 ms on redis-py's
blocking client, 18.3-18.6 ms on this connection.

Only what a bulk read needs: connect (TCP or a Unix socket), AUTH, CLIENT SETNAME, SELECT,
pipelined GETs. Error replies become redis-py's exception for them (its own mapping), so a
`MOVED` or a `LOADING` reads as it would from redis-py; a broken or timed-out socket raises,
and the connection is then closed (`RespConnection.is_broken`). TLS endpoints keep redis-py.
"""

from __future__ import annotations

import contextlib
import select
import socket
from collections.abc import Iterator, Sequence

import redis.exceptions as rexc
from redis._parsers.base import BaseParser

__all__ = ["RespConnection"]

_READ_BYTES = 1 << 20  # the header buffer's size; a value's bytes go around it
_CRLF = b"\r\n"

Reply = memoryview | None | rexc.ResponseError
"""One GET's answer: the value (a view of the caller's buffer, valid until the next reply),
None when the key does not exist, or the error the server answered for it."""


class RespConnection:
    """One blocking socket to one node; used by one thread at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray(_READ_BYTES)
        self._view = memoryview(self._buf)
        self._start = 0  # unread bytes are _buf[_start:_end]
        self._end = 0
        self.is_broken = False

    @classmethod
    def open(
        cls,
        *,
        host: str | None,
        port: int | None,
        unix_path: str | None,
        timeout_s: float,
        username: str | None,
        password: str | None,
        db: int,
    ) -> RespConnection:
        """Connect within `timeout_s` and introduce the connection as redis-py would; every
        later read and write times out after `timeout_s` too."""
        if unix_path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout_s)
            try:
                sock.connect(unix_path)
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection((host or "", port or 0), timeout=timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout_s)
        conn = cls(sock)
        try:
            if password is not None:
                user = [username.encode()] if username else []
                conn._command([b"AUTH", *user, password.encode()])
            conn._command([b"CLIENT", b"SETNAME", b"kvstore"])
            if db:
                conn._command([b"SELECT", str(db).encode()])
        except BaseException:
            conn.close()
            raise
        return conn

    def get_many(self, keys: Sequence[bytes], into: bytearray) -> Iterator[Reply]:
        """GET every key in one pipeline; yields each reply in order. A value is received
        into `into` when it fits, else into a buffer of its own."""
        self._send(b"".join(_pack([b"GET", key]) for key in keys))
        target = memoryview(into)
        for _ in keys:
            yield self._get_reply(target)

    def is_stale(self) -> bool:
        """Whether the idle connection was closed under it (the server's `timeout`, a
        `CLIENT KILL`, a restart): an idle socket with something to read has only EOF or an
        error to give. Checked before each use, so a dead idle connection costs no read."""
        if self.is_broken:
            return True
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
        """Close the socket; a read blocked on it in another thread wakes and fails."""
        self.is_broken = True
        with contextlib.suppress(OSError):  # not connected (any more)
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    # -- replies ----------------------------------------------------------------------------

    def _command(self, args: list[bytes]) -> None:
        """Send one command and raise the error it was answered with, if any."""
        self._send(_pack(args))
        header = self._line()
        if header[:1] == b"-":
            raise _error(header)

    def _get_reply(self, target: memoryview) -> Reply:
        header = self._line()
        kind = header[:1]
        if kind == b"$":
            size = int(header[1:])
            if size < 0:
                return None
            out = target[:size] if size <= target.nbytes else memoryview(bytearray(size))
            self._read_into(out)
            self._skip_crlf()
            return out
        if kind == b"-":
            error = _error(header)
            if not isinstance(error, rexc.ResponseError):  # LOADING and alike: the node is down
                raise error
            return error
        self.is_broken = True  # a reply no GET gives: the stream cannot be trusted any more
        raise rexc.ConnectionError(f"unexpected reply to GET: {bytes(header[:32])!r}")

    def _line(self) -> bytes:
        while True:
            end = self._buf.find(_CRLF, self._start, self._end)
            if end >= 0:
                line = bytes(self._view[self._start : end])
                self._start = end + 2
                return line
            self._fill()

    def _read_into(self, out: memoryview) -> None:
        have = min(out.nbytes, self._end - self._start)
        out[:have] = self._view[self._start : self._start + have]
        self._start += have
        while have < out.nbytes:
            got = self._recv_into(out[have:])
            have += got

    def _skip_crlf(self) -> None:
        while self._end - self._start < 2:
            self._fill()
        if self._view[self._start : self._start + 2] != _CRLF:
            self.is_broken = True
            raise rexc.ConnectionError("malformed reply: a value not followed by CRLF")
        self._start += 2

    def _fill(self) -> None:
        """Read more into the header buffer (moving what is unread to its front)."""
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buf):
            if self._start == 0:
                self.is_broken = True
                raise rexc.ConnectionError("a reply line longer than the read buffer")
            pending = self._end - self._start
            self._view[:pending] = self._view[self._start : self._end]
            self._start, self._end = 0, pending
        self._end += self._recv_into(self._view[self._end :])

    def _recv_into(self, out: memoryview) -> int:
        try:
            got = self._sock.recv_into(out)
        except BaseException:
            self.is_broken = True
            raise
        if got == 0:
            self.is_broken = True
            raise rexc.ConnectionError("Connection closed by server.")
        return got

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except BaseException:
            self.is_broken = True
            raise


def _error(header: bytes) -> rexc.RedisError:
    """redis-py's exception for an error reply (`-MOVED ...` is a `MovedError`, `-LOADING ...`
    a `BusyLoadingError`, and so on)."""
    error: rexc.RedisError = BaseParser.parse_error(  # type: ignore[no-untyped-call]
        header[1:].decode("utf-8", "replace")
    )
    return error


def _pack(args: Sequence[bytes]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        parts.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(parts)
