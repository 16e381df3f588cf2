"""A private, throw-away PostgreSQL server: ``initdb`` in a temp dir, ``pg_ctl`` on a free
loopback port, password (SCRAM) logins over TCP, stopped and removed at the end. It never
touches a system PostgreSQL on 5432.

``modelfleet up --ha`` shares it between its central replicas, and the tests' ``postgres``
fixture (``tests/conftest.py``) between tests; both want a database that costs a second to
make and leaves nothing behind, hence no durability (no fsync) and a temp dir.

PostgreSQL refuses to run as root, so as root (CI, containers) its binaries run as the
``postgres`` user Debian's package creates, on a data dir that user owns."""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from types import TracebackType

from modelfleet.up.ports import free_port

__all__ = ["USER", "PostgresInstance", "postgres_bindir"]

USER = "modelfleet"
#: A throw-away server needs no durability: no fsync makes initdb and every commit much quicker.
_FAST = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"


def postgres_bindir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are: Debian's newest /usr/lib/postgresql/N/bin, else pg_config's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    if shutil.which("pg_config"):
        bindir = Path(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip())
        if (bindir / "initdb").exists():
            return bindir
    return None


def _unprivileged_owner() -> pwd.struct_passwd | None:
    """The ``postgres`` user when running as root (PostgreSQL refuses root), else None."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError(
            "as root, PostgreSQL runs as the postgres user, which is missing: install postgresql"
        ) from None


class PostgresInstance:
    """One private PostgreSQL server with one database (``modelfleet``) and a random password."""

    def __init__(self) -> None:
        bindir = postgres_bindir()
        if bindir is None:
            raise RuntimeError(
                "PostgreSQL binaries not found: install Debian's postgresql"
                " (bash scripts/ensure_apt.sh postgresql:pg_ctlcluster; make test and make up UP_ARGS=--ha do)"
            )
        self._bin = bindir
        self.host = "127.0.0.1"
        self.port = 0
        self.password = secrets.token_urlsafe(16)
        self._owner = _unprivileged_owner()
        self._root = Path(tempfile.mkdtemp(prefix="modelfleet-pg-"))
        self.data_dir = self._root / "data"

    @property
    def url(self) -> str:
        """The connection URL, password included."""
        return f"postgresql://{USER}:{self.password}@{self.host}:{self.port}/{USER}"

    def url_for(self, database: str) -> str:
        """The URL of another database on this server (see ``create_database``)."""
        return self.url.rsplit("/", 1)[0] + f"/{database}"

    def start(self) -> None:
        """initdb, start on a free port, create the database; raises with the server log on failure."""
        pwfile = self._root / "pw"
        pwfile.write_text(self.password)
        if self._owner is not None:
            os.chown(self._root, self._owner.pw_uid, self._owner.pw_gid)
            os.chown(pwfile, self._owner.pw_uid, self._owner.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "-A",
            "scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        pwfile.unlink()
        self.port = free_port()
        self._pg_ctl_start()
        self.create_database(USER)

    def _pg_ctl_start(self) -> None:
        options = f"-h {self.host} -p {self.port} -k {self._root} {_FAST}"
        log = self._root / "server.log"
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(log), "-o", options, "-w", "-t", "30", "start")

    def stop_server(self) -> None:
        """Stop the server and keep its files (``-m fast``: every session is cut at once, as in a
        restart or a failover; committed data is kept, which ``-m immediate`` would not promise
        with this instance's ``synchronous_commit=off``); ``start_again`` brings it back."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")

    def start_again(self) -> None:
        """Start the stopped server again on the same port and data dir."""
        self._pg_ctl_start()

    def fresh_database(self) -> str:
        """The URL of a new, empty database (one per test: quicker than a server per test)."""
        import psycopg  # the [postgres] extra; only callers that want a database per user need it

        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}".encode())
        return self.url_for(name)

    def create_database(self, name: str) -> None:
        """A fresh, empty database on this server."""
        env = {**os.environ, "PGPASSWORD": self.password}
        self._run("createdb", "-h", self.host, "-p", str(self.port), "-U", USER, name, env=env)

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its files."""
        if (self.data_dir / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop", check=False)
        shutil.rmtree(self._root, ignore_errors=True)

    def _run(self, tool: str, *args: str, env: dict[str, str] | None = None, check: bool = True) -> None:
        """Run one PostgreSQL tool (as ``postgres`` when we are root); its error and the server log on failure."""
        cmd = [str(self._bin / tool), *args]
        if self._owner is not None:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=self._root, timeout=60)
        if check and done.returncode != 0:
            log = self._root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr or done.stdout}\n{tail}")

    def __enter__(self) -> PostgresInstance:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
