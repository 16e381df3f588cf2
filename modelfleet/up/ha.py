"""``modelfleet up --ha``: central as three replicas, the way a replicated deployment runs
it, on one machine. The replicas share what a real deployment would give them: a private
PostgreSQL (``store.url``: registry, rollouts, events, tokens, leadership) and a bucket on
a SeaweedFS S3 server (``blobs.*``: the chunks), and one manifest signing key, since edges pin
the key they first see and may then be served by any replica.

PostgreSQL and the S3 server live only as long as the fleet: each ``up --ha`` starts from
an empty registry (the demo model is pushed again), while the replicas' and edges' data
directories are kept, as with ``up``."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from modelfleet.extras import require_extra
from modelfleet.up.children import Child, ChildGroup, wait_ready
from modelfleet.up.errors import UpError
from modelfleet.up.ports import PortPlan, available
from modelfleet.up.postgres import PostgresInstance, postgres_bindir
from modelfleet.up.s3server import S3_SERVER, S3Server, require_s3_server
from modelfleet.up.secure import SecureFleet
from modelfleet.up.services import CENTRAL_READY, Service, central_args

__all__ = [
    "HA_MODULES",
    "REPLICAS",
    "SharedState",
    "check_prerequisites",
    "replica_ids",
    "share_signing_key",
    "shared_state",
    "spawn_replicas",
    "store_tokens",
    "wait_replicas",
]

#: Three replicas: one may fail or be restarted while the other two keep a majority of
#: the partitions served (and a Kubernetes PodDisruptionBudget of 2 keeps as many).
REPLICAS = 3
#: The ``ha`` extra's modules, as far as ``up`` itself needs them (psycopg for the database,
#: boto3 for the bucket); SeaweedFS's ``weed`` binary is checked apart.
HA_MODULES = ("psycopg", *S3_SERVER)


def check_prerequisites() -> None:
    """Before anything starts: the ``ha`` extra (MissingExtra) and PostgreSQL's binaries
    (UpError), each with the line that installs it, rather than a failure halfway up."""
    require_extra("ha", "modelfleet up --ha", HA_MODULES)
    require_s3_server("modelfleet up --ha")
    if postgres_bindir() is None:
        raise UpError(
            "modelfleet up --ha needs PostgreSQL's initdb and pg_ctl: bash scripts/ensure_apt.sh"
            " postgresql:pg_ctlcluster (make up UP_ARGS=--ha runs it)"
        )


def replica_ids(count: int = REPLICAS) -> list[str]:
    """``central-1`` … ``central-N``: stable, so a restarted fleet reuses each replica's data dir."""
    return [f"central-{i}" for i in range(1, count + 1)]


@dataclass(frozen=True)
class SharedState:
    """What the replicas share: the database and the bucket."""

    postgres: PostgresInstance
    s3: S3Server
    bucket: str

    @property
    def store_url(self) -> str:
        """``store.url``, password included (given to the replicas in their environment only)."""
        return self.postgres.url

    def central_env(self) -> dict[str, str]:
        """``MODELFLEET_STORE__URL`` and ``MODELFLEET_BLOBS__*`` for every replica."""
        return {"MODELFLEET_STORE__URL": self.store_url, **self.s3.blob_env(self.bucket)}


@contextlib.contextmanager
def shared_state(group: ChildGroup) -> Iterator[SharedState]:
    """Start PostgreSQL and the S3 server (a child of ``group``) with one bucket; PostgreSQL,
    which daemonizes and so is no child, is stopped and removed when the block ends (after
    ``group`` has stopped the replicas, when entered before the block that stops them), and
    so is the S3 server's data."""
    check_prerequisites()
    postgres = PostgresInstance()
    try:
        postgres.start()
    except RuntimeError as exc:
        postgres.stop()
        raise UpError(f"PostgreSQL did not start: {exc}") from exc
    s3 = S3Server()
    try:
        s3.start(group)
        yield SharedState(postgres, s3, s3.new_bucket())
    finally:
        postgres.stop()
        s3.stop()


def share_signing_key(source_dir: Path, replica_dirs: list[Path]) -> None:
    """Give every replica the manifest signing key of ``source_dir`` (made there if none):
    edges pin one key, and any replica may sign what they are served. ``source_dir`` is the
    single central's data dir, so edges keep their pinned key between ``up`` and ``up --ha``."""
    from central.registry.signing import ENDORSEMENTS_FILE, KEY_FILE, ManifestSigner

    ManifestSigner.load_or_create(source_dir)
    for target in replica_dirs:
        target.mkdir(parents=True, exist_ok=True)
        for name in (KEY_FILE, ENDORSEMENTS_FILE):
            if (source_dir / name).is_file():
                shutil.copy2(source_dir / name, target / name)
            else:
                (target / name).unlink(missing_ok=True)


def store_tokens(state: SharedState, secure: SecureFleet) -> None:
    """``--secure``: the admin and node tokens into the replicas' PostgreSQL, where replicated
    centrals keep them (a new database each run, so new tokens, written to the token files)."""
    from central.storage.tokens import open_token_store  # the [postgres] extra, checked above

    operators = open_token_store(state.store_url, Path(), "operator")
    nodes = open_token_store(state.store_url, Path(), "node")
    try:
        secure.store_tokens(operators, nodes)
    finally:
        operators.close()
        nodes.close()


def spawn_replicas(
    group: ChildGroup,
    ports: PortPlan,
    data_dir: Path,
    broker: str,
    state: SharedState,
    count: int = REPLICAS,
    secure_env: Callable[[str], dict[str, str]] | None = None,
) -> list[Child]:
    """Start ``count`` replicas at once, each in ``data_dir/replicas/<id>``. The first takes
    the planned central ports (8080 and 50051 by default, so the usual URLs work), the others
    free ones: each binds its own and names them on its ready line. ``secure_env(replica_id)``:
    ``--secure``'s settings of that replica (its own MQTT login and certificate)."""
    ids = replica_ids(count)
    dirs = [data_dir / "replicas" / rid for rid in ids]
    share_signing_key(data_dir / "central", dirs)
    children = []
    for i, (rid, replica_dir) in enumerate(zip(ids, dirs, strict=True)):
        http, grpc = (available(ports.central_http), available(ports.central_grpc)) if i == 0 else (0, 0)
        args = [*central_args(replica_dir, http, grpc, broker), "--replica-id", rid]
        env = {**state.central_env(), **(secure_env(rid) if secure_env is not None else {})}
        children.append(group.spawn_modelfleet(rid, args, env))
    return children


def wait_replicas(children: list[Child], timeout_s: float) -> list[Service]:
    """Wait for every replica's ready line (``timeout_s`` for all of them)."""
    ready = wait_ready(children, CENTRAL_READY, timeout_s)
    return [Service(c.name, line["http"], line["grpc"], c) for c, line in zip(children, ready, strict=True)]
