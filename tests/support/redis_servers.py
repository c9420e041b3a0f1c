"""Real Redis servers for tests: a standalone server and a Redis Cluster, on loopback ports in
temporary directories, with the faults the remote tier must survive (kill, restart, hang).

    with redis_server(maxmemory="8mb", maxmemory_policy="allkeys-lru") as server:
        url = server.url                      # redis://127.0.0.1:<port>/0
        server.kill(); server.restart()       # SIGKILL, then the same port again
        with server.paused():                 # SIGSTOP ... SIGCONT: a hung server
            ...

    with redis_cluster(num_masters=3) as cluster:
        url = cluster.url                     # 127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>
        cluster.node_for_key(b"kvstore:...").kill()

Servers never persist (`--save ''`, `--appendonly no`). `ensure_redis_server()` finds
`redis-server` (or installs Debian's package when root, as `make redis` does); tests call
`require_redis_server()`, which turns a missing binary into a pytest skip that says why.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.support.apt import apt_install
from tests.support.net import free_port

__all__ = [
    "RedisClusterServers",
    "RedisServer",
    "RedisUnavailable",
    "ensure_redis_server",
    "redis_cluster",
    "redis_server",
    "require_redis_server",
]

HOST = "127.0.0.1"
READY_TIMEOUT_S = 15.0
_install_lock = threading.Lock()


class RedisUnavailable(RuntimeError):
    """No redis-server binary, and none could be installed (the message says why)."""


def _find_binaries() -> tuple[Path, Path] | None:
    override = os.environ.get("KVSTORE_REDIS_SERVER_BIN")
    server = override or shutil.which("redis-server")
    cli = shutil.which("redis-cli", path=str(Path(server).parent)) if server else None
    cli = cli or shutil.which("redis-cli")
    if server is None or cli is None:
        return None
    return Path(server), Path(cli)


def _stop_debian_service() -> None:
    """The package starts its own server on 6379 where an init system runs: tests start theirs."""
    if Path("/run/systemd/system").exists() and shutil.which("systemctl"):
        cmd = ["systemctl", "disable", "--now", "redis-server"]
    elif shutil.which("service"):
        cmd = ["service", "redis-server", "stop"]
    else:
        return
    subprocess.run(cmd, capture_output=True, check=False, timeout=30)


def ensure_redis_server(*, install: bool = True) -> tuple[Path, Path]:
    """`(redis-server, redis-cli)`: `$KVSTORE_REDIS_SERVER_BIN`, on PATH, or Debian's
    `redis-server` package installed with apt-get when running as root (its service stopped).
    Raises RedisUnavailable otherwise."""
    with _install_lock:
        found = _find_binaries()
        if found is not None:
            return found
        if os.environ.get("KVSTORE_REDIS_SERVER_BIN"):
            raise RedisUnavailable(
                f"KVSTORE_REDIS_SERVER_BIN={os.environ['KVSTORE_REDIS_SERVER_BIN']}: "
                "no redis-server there, or no redis-cli beside it or on PATH"
            )
        if not install:
            raise RedisUnavailable("redis-server is not on PATH (installing was not allowed)")
        problem = apt_install("redis-server", "KVSTORE_REDIS_SERVER_BIN")
        if not problem:
            _stop_debian_service()
        found = _find_binaries()
        if found is None:
            raise RedisUnavailable(problem or "redis-server installed but not found on PATH")
        return found


def require_redis_server() -> tuple[Path, Path]:
    """`ensure_redis_server()`, or skip the calling test saying why there is no server."""
    import pytest

    try:
        return ensure_redis_server()
    except RedisUnavailable as exc:
        pytest.skip(f"no redis-server: {exc}")


@dataclass
class RedisServer:
    """One redis-server process on 127.0.0.1:`port`, started with `args` in `workdir`."""

    binary: Path
    port: int
    workdir: Path
    args: Sequence[str]
    password: str | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"redis://{self.address}/0"

    @property
    def log_path(self) -> Path:
        return self.workdir / "redis.log"

    @property
    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start (or restart) on the same port and wait until it answers PING."""
        if self.is_running:
            raise RuntimeError(f"redis-server on {self.address} is already running")
        cmd = [str(self.binary), "--port", str(self.port), *self.args]
        self.process = subprocess.Popen(
            cmd, cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        self.wait_until_ready()

    def wait_until_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"redis-server on {self.address} exited: {self.log_tail()}")
            try:
                with self.client(socket_timeout=1.0) as client:
                    if client.ping():
                        return
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {self.address} not ready: {self.log_tail()}")
            time.sleep(0.02)

    def client(self, socket_timeout: float = 5.0) -> redis.Redis:
        """A synchronous client (a context manager: close it)."""
        return redis.Redis(
            host=HOST,
            port=self.port,
            password=self.password,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
        )

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-whatever, as in a crash (its data is gone)."""
        if self.process is not None and self.process.poll() is None:
            self.resume()  # a stopped process dies on SIGKILL too; resume keeps waits simple
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: the port stays open and the kernel accepts connections, nothing answers."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    @contextmanager
    def paused(self) -> Iterator[None]:
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def stop(self) -> None:
        """Terminate (SIGTERM; SIGKILL after 10 s)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.resume()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"


def _server_args(
    *,
    password: str | None,
    maxmemory: str | int | None,
    maxmemory_policy: str | None,
    extra_args: Sequence[str],
) -> list[str]:
    args = [
        "--bind", HOST,
        "--save", "",
        "--appendonly", "no",
        "--daemonize", "no",
        "--logfile", "redis.log",
        "--dir", ".",
    ]  # fmt: skip
    if password is not None:
        args += ["--requirepass", password]
    if maxmemory is not None:
        args += ["--maxmemory", str(maxmemory)]
    if maxmemory_policy is not None:
        args += ["--maxmemory-policy", maxmemory_policy]
    return [*args, *extra_args]


def _start_on_free_port(
    binary: Path, workdir: Path, args: Sequence[str], password: str | None, attempts: int = 3
) -> RedisServer:
    """Start on a port that was free a moment ago; another one if someone took it meanwhile."""
    for attempt in range(attempts):
        server = RedisServer(binary, free_port(), workdir, args, password)
        try:
            server.start()
            return server
        except RuntimeError:
            server.stop()
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@contextmanager
def redis_server(
    *,
    password: str | None = None,
    maxmemory: str | int | None = None,
    maxmemory_policy: str | None = None,
    extra_args: Sequence[str] = (),
) -> Iterator[RedisServer]:
    """A standalone redis-server on a free loopback port; stopped and removed on exit."""
    binary, _ = require_redis_server()
    args = _server_args(
        password=password,
        maxmemory=maxmemory,
        maxmemory_policy=maxmemory_policy,
        extra_args=extra_args,
    )
    with tempfile.TemporaryDirectory(prefix="kvstore-redis-") as tmp:
        server = _start_on_free_port(binary, Path(tmp), args, password)
        try:
            yield server
        finally:
            server.stop()


@dataclass
class RedisClusterServers:
    """The masters of a Redis Cluster (no replicas) and how to reach them."""

    nodes: list[RedisServer]
    password: str | None = None

    @property
    def url(self) -> str:
        """The `remote_url` form of a cluster: `host:port,host:port,...`."""
        return ",".join(node.address for node in self.nodes)

    def node_for_key(self, key: bytes) -> RedisServer:
        """The master serving `key`'s slot (asked of a running node)."""
        for node in self.nodes:
            if not node.is_running:
                continue
            with node.client() as client:
                slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
                for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
                    if int(start) <= slot <= int(end):
                        port = int(master[1])
                        return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no running node knows the slot of {key!r}")

    def wait_until_ok(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until every running node reports `cluster_state:ok`."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = {}
            for node in self.nodes:
                if node.is_running:
                    with node.client() as client:
                        states[node.address] = client.execute_command("CLUSTER", "INFO")
            pending = [a for a, info in states.items() if b"cluster_state:ok" not in info]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster not ok after {timeout_s} s on {pending}")
            time.sleep(0.05)


@contextmanager
def redis_cluster(
    num_masters: int = 3,
    *,
    password: str | None = None,
    node_timeout_ms: int = 2000,
    extra_args: Sequence[str] = (),
) -> Iterator[RedisClusterServers]:
    """A Redis Cluster of `num_masters` masters, no replicas, every slot assigned.

    `cluster-require-full-coverage no`, as the remote tier's docs recommend: a dead master's slots
    fail while the others keep serving. Each node keeps its `nodes.conf` in its own directory,
    so `restart()` brings a killed master back with its slots (and no data).
    """
    binary, cli = require_redis_server()
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvstore-cluster-")))
        nodes: list[RedisServer] = []
        for index in range(num_masters):
            workdir = tmp / f"node{index}"
            workdir.mkdir()
            args = _server_args(
                password=password,
                maxmemory=None,
                maxmemory_policy=None,
                extra_args=[
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-port", str(free_port()),
                    "--cluster-node-timeout", str(node_timeout_ms),
                    "--cluster-require-full-coverage", "no",
                    *(["--masterauth", password] if password is not None else []),
                    *extra_args,
                ],
            )  # fmt: skip
            node = _start_on_free_port(binary, workdir, args, password)
            stack.callback(node.stop)
            nodes.append(node)
        auth = ["-a", password, "--no-auth-warning"] if password is not None else []
        create = [str(cli), *auth, "--cluster", "create", *(n.address for n in nodes)]
        done = subprocess.run(
            [*create, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")
        cluster = RedisClusterServers(nodes, password)
        cluster.wait_until_ok()
        yield cluster
