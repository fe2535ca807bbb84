"""A throwaway PostgreSQL server for the PostgresInbox tests: Debian's server programs
(package ``postgresql``, which scripts/test.sh installs), a fresh cluster in a temporary
directory, listening on a free loopback port and on a unix socket in that directory.

PostgreSQL refuses to run as root, so when the tests run as root the cluster belongs to
the ``postgres`` user (``nobody`` where there is none) and its programs run as that user.
``POSTGRES_BIN`` may name the directory holding ``initdb`` and ``postgres``.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

USER = "kernelbot"
START_TIMEOUT = 30.0


class PostgresUnavailable(Exception):
    """The server could not be found or started; the message says why and what to do."""


def _version(bin_dir: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", bin_dir.parent.name)) or (0,)


def server_programs() -> Path:
    """The directory holding ``initdb`` and ``postgres``."""
    if os.environ.get("POSTGRES_BIN"):
        candidates = [Path(os.environ["POSTGRES_BIN"])]
    else:
        on_path = shutil.which("initdb")
        candidates = [Path(on_path).resolve().parent] if on_path else []
        candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version, reverse=True)
    for bin_dir in candidates:
        if (bin_dir / "initdb").is_file() and (bin_dir / "postgres").is_file():
            return bin_dir
    if os.environ.get("POSTGRES_BIN"):
        raise PostgresUnavailable(
            f"POSTGRES_BIN={os.environ['POSTGRES_BIN']} holds no initdb and postgres"
        )
    raise PostgresUnavailable(
        "PostgreSQL's server programs (initdb, postgres) were not found under "
        "/usr/lib/postgresql/<version>/bin or on PATH: install Debian's `postgresql` "
        "package (./scripts/test.sh does, as root), or set POSTGRES_BIN to their directory"
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        _, port = probe.getsockname()
        return int(port)


class PostgresServer:
    """``with PostgresServer() as server:`` a running server; ``server.new_database()``
    gives the URL of a fresh, empty database on it."""

    def __init__(self) -> None:
        self.bin_dir = server_programs()
        running_as_root = os.geteuid() == 0
        # As root, the server's user must be able to reach the directory.
        parent = tempfile.gettempdir()
        if running_as_root and not _reachable_by_all(Path(parent)):
            parent = "/tmp"
        self.dir = Path(tempfile.mkdtemp(prefix="kernelbot-postgres-", dir=parent))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._as: dict[str, Any] = {}
        if running_as_root:
            owner = _unprivileged_user()
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            self._as = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}

    def __enter__(self) -> PostgresServer:
        try:
            self._initdb()
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _initdb(self) -> None:
        done = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                "--pgdata", str(self.data),
                "--username", USER,
                "--auth", "trust",
                "--encoding", "UTF8",
                "--no-locale",
                "--no-sync",
            ],
            cwd=self.dir,
            capture_output=True,
            text=True,
            timeout=120,
            **self._as,
        )
        if done.returncode != 0:
            raise PostgresUnavailable(
                f"initdb failed ({done.returncode}):\n{done.stdout}{done.stderr}"
            )

    def _start(self) -> None:
        for _ in range(3):  # a free port may be taken before the server binds it
            self.port = _free_port()
            with open(self.log, "ab") as log:
                self._process = subprocess.Popen(
                    [
                        str(self.bin_dir / "postgres"),
                        "-D", str(self.data),
                        "-p", str(self.port),
                        "-c", "listen_addresses=127.0.0.1",
                        "-c", f"unix_socket_directories={self.dir}",
                        "-c", "fsync=off",
                        "-c", "synchronous_commit=off",
                        "-c", "full_page_writes=off",
                    ],
                    cwd=self.dir,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    **self._as,
                )
            if self._ready():
                return
            if "could not bind" not in self._log_tail():
                break
        raise PostgresUnavailable(
            f"postgres did not start on 127.0.0.1:{self.port} within {START_TIMEOUT:.0f} s; "
            f"its log:\n{self._log_tail()}"
        )

    def _ready(self) -> bool:
        process = self._process
        assert process is not None, "_start starts it first"
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                time.sleep(0.05)
        self._stop()
        return False

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"

    def url(self, database: str) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        name = f"test_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)  # fast shutdown: clients disconnected
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def __exit__(self, *_: object) -> None:
        self._stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _reachable_by_all(path: Path) -> bool:
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in [path, *path.resolve().parents])


def _unprivileged_user() -> pwd.struct_passwd:
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise PostgresUnavailable(
        "running as root, and there is neither a `postgres` nor a `nobody` user to run "
        "PostgreSQL as (it refuses to run as root)"
    )
