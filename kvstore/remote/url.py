"""`remote_url`: where the remote tier's Redis lives.

    redis://host:port/db                a server (standalone or a cluster node: asked at connect)
    rediss://host:port/db               the same over TLS (query: ssl_ca_certs, ssl_cert_reqs,
                                        ssl_certfile, ssl_keyfile, ssl_check_hostname)
    unix:///path/to/redis.sock?db=N     a local server over a Unix socket
    host:port,host:port,...             the seed nodes of a Redis Cluster
    redis://h1:p1,h2:p2 / rediss://...  the same, with a scheme

A username may be given (`redis://user@host:6379`); a password may not: it would end up in logs
and process listings. Put it in an environment variable and name that in `remote_password_env`.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvstore.remote.errors import RemoteConfigError

__all__ = ["DEFAULT_PORT", "RemoteEndpoint", "parse_remote_url"]

DEFAULT_PORT = 6379
_KEY = "remote_url"
_SCHEMES = ("redis", "rediss", "unix")
_TLS_OPTIONS = (
    "ssl_ca_certs",
    "ssl_cert_reqs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_check_hostname",
)
_CERT_REQS = ("none", "optional", "required")


@dataclass(frozen=True, slots=True)
class RemoteEndpoint:
    """A parsed `remote_url` (never holds a password)."""

    hosts: tuple[tuple[str, int], ...] = ()
    unix_path: str | None = None
    db: int = 0
    username: str | None = None
    tls: bool = False
    tls_options: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_seed_list(self) -> bool:
        """Several addresses: the seed nodes of a cluster."""
        return len(self.hosts) > 1

    @property
    def addresses(self) -> tuple[str, ...]:
        """`host:port` of each address (the socket path for `unix://`), for logs."""
        if self.unix_path is not None:
            return (self.unix_path,)
        return tuple(f"{host}:{port}" for host, port in self.hosts)

    def display(self) -> str:
        """The URL for logs and errors: scheme, user, addresses, db; nothing secret."""
        user = f"{self.username}@" if self.username else ""
        if self.unix_path is not None:
            return f"unix://{user}{self.unix_path}?db={self.db}"
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{user}{','.join(self.addresses)}/{self.db}"


def _fail(message: str) -> RemoteConfigError:
    return RemoteConfigError(f"{_KEY}: {message}")


def _parse_port(text: str, address: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise _fail(f"port {text!r} of {address!r} is not a number") from None
    if not 0 < port <= 65535:
        raise _fail(f"port {port} of {address!r} is outside 1..65535")
    return port


def _parse_address(address: str) -> tuple[str, int]:
    address = address.strip()
    if address.startswith("["):  # [v6 address]:port
        host, sep, rest = address[1:].partition("]")
        if not sep:
            raise _fail(f"address {address!r} opens '[' without closing it")
        port_text = rest.removeprefix(":") if rest else str(DEFAULT_PORT)
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep:
            host, port_text = address, str(DEFAULT_PORT)
    if not host:
        raise _fail(f"address {address!r} has no host (expected host:port)")
    return host, _parse_port(port_text, address)


def _parse_db(text: str) -> int:
    try:
        db = int(text)
    except ValueError:
        raise _fail(f"database {text!r} is not a number (expected /0 .. /15)") from None
    if db < 0:
        raise _fail(f"database {db} is negative")
    return db


def _split_userinfo(netloc: str) -> tuple[str | None, str]:
    userinfo, sep, hosts = netloc.rpartition("@")
    if not sep:
        return None, netloc
    user, has_password, _ = userinfo.partition(":")
    if has_password:
        raise _fail(
            "must not hold a password (it would end up in logs); put it in an environment "
            "variable and set remote_password_env to that variable's name"
        )
    return urllib.parse.unquote(user) or None, hosts


def _parse_query(query: str, *, tls: bool) -> tuple[int | None, dict[str, str]]:
    db: int | None = None
    options: dict[str, str] = {}
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if name == "db":
            db = _parse_db(value)
        elif name in _TLS_OPTIONS and tls:
            if name == "ssl_cert_reqs" and value not in _CERT_REQS:
                raise _fail(f"ssl_cert_reqs={value!r}; allowed: {', '.join(_CERT_REQS)}")
            options[name] = value
        else:
            allowed = ["db", *_TLS_OPTIONS] if tls else ["db"]
            raise _fail(f"unknown query parameter {name!r}; allowed: {', '.join(allowed)}")
    return db, options


def parse_remote_url(url: str) -> RemoteEndpoint:
    """Parse and check a `remote_url`; a bad one raises `RemoteConfigError` naming the key."""
    text = url.strip()
    if not text:
        raise _fail("must not be empty (e.g. redis://127.0.0.1:6379/0)")
    scheme, has_scheme, rest = text.partition("://")
    if not has_scheme:  # host:port[,host:port...]
        return RemoteEndpoint(hosts=tuple(_parse_address(a) for a in text.split(",")))
    scheme = scheme.lower()
    if scheme not in _SCHEMES:
        raise _fail(f"scheme {scheme!r} is not supported; allowed: {', '.join(_SCHEMES)}")
    location, _, query = rest.partition("?")
    tls = scheme == "rediss"
    query_db, options = _parse_query(query, tls=tls)
    if scheme == "unix":
        username, path = _split_userinfo(location)
        if not path.startswith("/"):
            raise _fail(f"unix socket path {path!r} must be absolute (unix:///path/redis.sock)")
        return RemoteEndpoint(unix_path=path, db=query_db or 0, username=username)
    netloc, _, path = location.partition("/")
    username, hosts_text = _split_userinfo(netloc)
    if not hosts_text:
        raise _fail(f"{scheme}:// needs a host (e.g. {scheme}://127.0.0.1:6379/0)")
    hosts = tuple(_parse_address(a) for a in hosts_text.split(","))
    db = _parse_db(path) if path else (query_db or 0)
    if len(hosts) > 1 and db != 0:
        raise _fail(f"a cluster has only database 0, got /{db}")
    return RemoteEndpoint(hosts=hosts, db=db, username=username, tls=tls, tls_options=options)
