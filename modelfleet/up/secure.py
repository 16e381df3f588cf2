"""``modelfleet up --secure``: every credential a hardened local fleet needs, made under
``<data_dir>/secure/`` (mode 0700) before anything starts, and the settings that hand
them to the broker, central and each edge.

- A private CA and a certificate per process (central, each edge, the broker) plus one
  for an operator's tools (``curl`` to an edge, whose HTTP API asks for one). Made anew
  on every run: cheap, never expired, and nothing outlives the run that trusted it.
- An operator ``admin`` token (``admin.token``) and a node token per edge
  (``edges/<id>.token``), in central's token stores. Kept between runs while central
  still accepts them, so the CLI lines printed last time keep working.
- MQTT users ``central`` and one per edge (user name = node id, as the shipped ACL
  expects) with random passwords, new on every run, hashed into a Mosquitto password
  file; the ACL is the shipped ``deploy/mosquitto/acl``; client ids are the user names
  (``use_username_as_clientid``), so one login cannot take over another's session.
- With ``--ha``, each replica instead of ``central``: its own MQTT user (its replica id)
  under central's rules, and its own certificate; the tokens go to the replicas' PostgreSQL
  (``store_tokens``, once it runs), which is where replicated centrals keep them.

Settings are handed over as ``MODELFLEET_*`` variables, which win over the caller's own."""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from central.auth import Role
from central.settings import AuthSettings
from central.storage.files.tokens import TokenStore
from central.storage.protocols import Tokens
from fleetwire.mqtt.topics import DEFAULT_PREFIX
from fleetwire.signing import write_atomic
from modelfleet.pki import LOOPBACK_SANS, CertAuthority, LeafFiles

__all__ = ["ACL_RULES", "BrokerSecurity", "SecureFleet", "central_acl", "mosquitto_password_hash", "prepare"]

#: Certificates of one run; long enough for any fleet kept running on a laptop.
_VALID_DAYS = 365
_ADMIN_TOKEN_NAME = "up-admin"
CENTRAL_MQTT_USER = "central"
#: What a central may do on the broker: its status, probes and events; read every node's
#: topics (plain, and each partition's ``p/<n>/`` of a replicated central).
_CENTRAL_RULES = (
    f"topic write {DEFAULT_PREFIX}/central/#",
    f"topic write {DEFAULT_PREFIX}/events",
    f"topic read {DEFAULT_PREFIX}/#",
)
#: The rules of the shipped ``deploy/mosquitto/acl`` (a test keeps them equal).
ACL_RULES = (
    f"pattern write {DEFAULT_PREFIX}/nodes/%u/status",
    f"pattern write {DEFAULT_PREFIX}/nodes/%u/heartbeat",
    f"pattern write {DEFAULT_PREFIX}/p/+/nodes/%u/status",
    f"pattern write {DEFAULT_PREFIX}/p/+/nodes/%u/heartbeat",
    f"pattern read {DEFAULT_PREFIX}/central/status",
    f"user {CENTRAL_MQTT_USER}",
    *_CENTRAL_RULES,
    "user healthcheck",
    "topic read $SYS/broker/uptime",
)


def central_acl(users: list[str]) -> list[str]:
    """ACL blocks giving each of ``users`` (a replicated central's replicas, one login each)
    central's rules. One login per replica: Mosquitto binds a client id to its user
    (``use_username_as_clientid``), so replicas sharing one would close each other's sessions."""
    return [line for user in users for line in (f"user {user}", *_CENTRAL_RULES)]


def mosquitto_password_hash(password: str, salt: bytes | None = None, iterations: int = 101) -> str:
    """A password file entry's hash as Mosquitto 2.0's ``mosquitto_passwd`` writes it:
    ``$7$<iterations>$<base64 salt>$<base64 PBKDF2-HMAC-SHA512>`` (12-byte salt)."""
    salt = os.urandom(12) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def _write_secret(path: Path, text: str) -> None:
    """Write ``text`` to a file readable by its owner only."""
    write_atomic(path, text.encode(), 0o600)


@dataclass(frozen=True)
class BrokerSecurity:
    """What Mosquitto needs for a TLS-only listener with logins and the ACL."""

    tls: LeafFiles
    password_file: Path
    acl_file: Path

    def config_lines(self) -> tuple[list[str], list[str]]:
        """Global lines (before the listener) and the listener's own TLS lines (after it)."""
        global_lines = [
            "per_listener_settings false",
            "allow_anonymous false",
            f"password_file {self.password_file}",
            f"acl_file {self.acl_file}",
        ]
        listener_lines = [
            f"cafile {self.tls.ca_file}",
            f"certfile {self.tls.cert_file}",
            f"keyfile {self.tls.key_file}",
            "require_certificate true",  # central and edges show their fleet certificates
            # A client's id is its user name, whatever it asks for: with edge-1's login nobody
            # can connect as edge-2's client id, which would close edge-2's session and
            # have the broker publish its Last Will (central would see it die).
            "use_username_as_clientid true",
        ]
        return global_lines, listener_lines


@dataclass(frozen=True)
class SecureFleet:
    """The credentials of one secure run, and the settings that use them."""

    root: Path
    ca_file: Path
    central_data: Path
    central_tls: LeafFiles
    operator_tls: LeafFiles
    broker: BrokerSecurity
    edge_tls: dict[str, LeafFiles]
    admin_token_file: Path
    node_token_files: dict[str, Path]
    mqtt_passwords: dict[str, str]
    #: ``--ha``: each replica's certificate (its MQTT user is its replica id); else empty.
    replica_tls: dict[str, LeafFiles]

    @property
    def admin_token(self) -> str:
        """The operator admin token (``Authorization: Bearer …`` for writes)."""
        return self.admin_token_file.read_text().strip()

    def central_env(self, replica_id: str | None = None) -> dict[str, str]:
        """Central: operator and node tokens required, TLS with client certificates on
        gRPC, HTTPS to the edges, MQTT over TLS as user ``central``; a replica (``replica_id``)
        under its own certificate and MQTT user, its tokens in PostgreSQL (``store.url``)."""
        auth = AuthSettings()
        user, tls = (
            (CENTRAL_MQTT_USER, self.central_tls) if replica_id is None else (replica_id, self.replica_tls[replica_id])
        )
        files = {
            "MODELFLEET_AUTH__TOKENS_FILE": str(auth.tokens_path(self.central_data)),
            "MODELFLEET_AUTH__NODE_TOKENS_FILE": str(auth.node_tokens_path(self.central_data)),
        }
        return {
            "MODELFLEET_AUTH__ENABLED": "true",
            "MODELFLEET_AUTH__PROTECT_READS": "true",  # /metrics, /dashboard, nodes and events too
            "MODELFLEET_AUTH__NODES_REQUIRED": "true",
            **(files if replica_id is None else {}),
            **_tls_env("MODELFLEET_TLS__", tls),
            "MODELFLEET_TLS__REQUIRE_CLIENT_CERT": "true",
            "MODELFLEET_BROKER__USERNAME": user,
            "MODELFLEET_BROKER__PASSWORD": self.mqtt_passwords[user],
            **_tls_env("MODELFLEET_BROKER__TLS__", tls),
        }

    def store_tokens(self, operators: Tokens, nodes: Tokens) -> None:
        """Put the admin token and every edge's node token in these stores (kept when the
        stores still hold the ones in the token files, else new ones written there)."""
        _kept_token(operators, _ADMIN_TOKEN_NAME, Role.ADMIN, self.admin_token_file)
        for node_id, path in self.node_token_files.items():
            _kept_token(nodes, node_id, Role.NODE, path, node_id)

    def edge_env(self, node_id: str) -> dict[str, str]:
        """One edge: its node token, TLS (mutual on peers, client certificates required on
        its HTTP API), heartbeats over MQTT TLS under its own login."""
        tls = self.edge_tls[node_id]
        return {
            "MODELFLEET_NODE_TOKEN_FILE": str(self.node_token_files[node_id]),
            **_tls_env("MODELFLEET_TLS__", tls),
            "MODELFLEET_TLS__REQUIRE_CLIENT_CERT": "true",
            "MODELFLEET_BROKER__USERNAME": node_id,
            "MODELFLEET_BROKER__PASSWORD": self.mqtt_passwords[node_id],
            **_tls_env("MODELFLEET_BROKER__TLS__", tls),
        }


def _tls_env(prefix: str, leaf: LeafFiles) -> dict[str, str]:
    return {
        f"{prefix}ENABLED": "true",
        f"{prefix}CERT_FILE": str(leaf.cert_file),
        f"{prefix}KEY_FILE": str(leaf.key_file),
        f"{prefix}CA_FILE": str(leaf.ca_file),
    }


def _kept_token(store: Tokens, name: str, role: Role, path: Path, node_id: str | None = None) -> None:
    """The token in ``path`` if the store still holds it under ``name``; else a new one."""
    if path.is_file():
        record = store.verify(path.read_text().strip())
        if record is not None and record.name == name and record.node_id == node_id:
            return
    if any(r.name == name for r in store.records()):
        store.revoke(name)
    _write_secret(path, store.create(name, role, node_id) + "\n")


def prepare(root: Path, central_data: Path, node_ids: list[str], replica_ids: list[str] | None = None) -> SecureFleet:
    """Make (or renew) every credential under ``root`` for central (data in
    ``central_data``) and the edges ``node_ids``. With ``replica_ids`` (``--ha``), for those
    replicas instead of one central, and the tokens are left to ``store_tokens``."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    ca = CertAuthority(root / "pki", "fleet", common_name="modelfleet up CA", valid_days=_VALID_DAYS)

    def issue(name: str, node_id: str | None = None) -> LeafFiles:
        return ca.issue(name, LOOPBACK_SANS, valid_days=_VALID_DAYS, node_id=node_id)

    replicas = replica_ids or []
    centrals = replicas or [CENTRAL_MQTT_USER]
    passwords = {user: secrets.token_urlsafe(24) for user in (*centrals, *node_ids)}
    password_file = root / "mosquitto" / "passwd"
    _write_secret(password_file, "".join(f"{u}:{mosquitto_password_hash(p)}\n" for u, p in passwords.items()))
    acl_file = root / "mosquitto" / "acl"
    replica_rules = "".join(f"{line}\n" for line in central_acl(replicas))
    acl_file.write_text(
        "# made by modelfleet up --secure: the rules of deploy/mosquitto/acl\n"
        + "\n".join(ACL_RULES)
        + "\n"
        + ("# and one login per central replica, under central's rules\n" + replica_rules if replicas else "")
    )
    fleet = SecureFleet(
        root=root,
        ca_file=ca.ca_file,
        central_data=central_data,
        central_tls=issue("central"),
        operator_tls=issue("operator"),
        broker=BrokerSecurity(issue("broker"), password_file, acl_file),
        edge_tls={node_id: issue(node_id, node_id) for node_id in node_ids},  # bound to its id: peers check it
        admin_token_file=root / "admin.token",
        node_token_files={node_id: root / "edges" / f"{node_id}.token" for node_id in node_ids},
        mqtt_passwords=passwords,
        replica_tls={rid: issue(rid) for rid in replicas},
    )
    if not replicas:  # a replicated central's tokens live in its PostgreSQL: store_tokens, later
        auth = AuthSettings()
        fleet.store_tokens(TokenStore(auth.tokens_path(central_data)), TokenStore(auth.node_tokens_path(central_data)))
    return fleet
