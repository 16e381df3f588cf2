"""Operator and node tokens in a JSON file of token *hashes* (the default store, in the data
dir or where ``auth.tokens_file`` says), each with a name and a role.

Central re-reads the file when its inode, mtime or size changes (one ``stat`` per check), so
a token created or revoked with the CLI takes effect without a restart."""

from __future__ import annotations

import hmac
import json
import logging
import os
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ValidationError

from central.auth.tokens import Role, TokenRecord, TokenStoreError, check_binding, hash_token, new_token

log = logging.getLogger(__name__)

__all__ = ["TokenFile", "TokenStore"]


class TokenFile(BaseModel):
    """The file's document."""

    tokens: list[TokenRecord] = []


class TokenStore:
    """Load, change and check the tokens in one file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._records: list[TokenRecord] = []
        self._stamp: tuple[int, int, int] | None = None
        #: Checks run on worker threads: one re-read at a time, records and stamp set together.
        self._lock = threading.Lock()
        self.refresh()

    @property
    def location(self) -> str:
        """The file's path."""
        return str(self.path)

    def close(self) -> None:
        """Nothing to release: the file is read and written whole, never held open."""

    def records(self) -> list[TokenRecord]:
        """Every stored token (hashes, names, roles)."""
        self.refresh()
        return list(self._records)

    def refresh(self) -> None:
        """Re-read the file if it changed since the last read (a missing file holds no token).

        Under a lock, and the stamp is taken with ``fstat`` on the very file read, so records
        and stamp always belong together: a stamp taken before a racing save with the records
        read after it (or the other way round) would keep a revoked token valid until the
        next change."""
        with self._lock:
            try:
                st = self.path.stat()
            except FileNotFoundError:
                self._records, self._stamp = [], None
                return
            if (st.st_ino, st.st_mtime_ns, st.st_size) == self._stamp:  # a save is a rename: a new inode
                return
            records: list[TokenRecord] = []
            try:
                with self.path.open("rb") as f:
                    st = os.fstat(f.fileno())
                    body = f.read()
            except FileNotFoundError:
                self._records, self._stamp = [], None
                return
            except OSError as exc:
                log.error("token store %s is unreadable, no token is accepted: %s", self.path, exc)
                self._records, self._stamp = [], None  # re-tried at the next check
                return
            try:
                records = TokenFile.model_validate_json(body).tokens
            except (ValidationError, ValueError) as exc:
                # Fail closed: an unreadable store accepts no token (writes answer 401).
                log.error("token store %s is unreadable, no token is accepted: %s", self.path, exc)
            self._records, self._stamp = records, (st.st_ino, st.st_mtime_ns, st.st_size)

    def verify(self, token: str) -> TokenRecord | None:
        """The record of ``token`` or None. Compares every stored hash in constant time."""
        self.refresh()
        presented = hash_token(token)
        found: TokenRecord | None = None
        for record in self._records:
            if hmac.compare_digest(presented, record.sha256):
                found = record
        return found

    def create(self, name: str, role: Role, node_id: str | None = None) -> str:
        """Store a new token under ``name`` and return its plaintext (the only time it exists).
        A ``node`` token is bound to ``node_id``; other roles have none."""
        check_binding(role, node_id)
        records = self.records()
        if any(r.name == name for r in records):
            raise TokenStoreError(f"a token named {name!r} exists already (revoke it first)")
        token = new_token()
        created = datetime.now(UTC).isoformat(timespec="seconds")
        records.append(TokenRecord(name=name, role=role, sha256=hash_token(token), created_at=created, node_id=node_id))
        self._save(records)
        return token

    def revoke(self, name: str) -> None:
        """Remove the token named ``name``."""
        records = self.records()
        kept = [r for r in records if r.name != name]
        if len(kept) == len(records):
            raise TokenStoreError(f"no token named {name!r} in {self.path}")
        self._save(kept)

    def revoke_node(self, node_id: str) -> list[str]:
        """Remove every token bound to ``node_id``; the names of those removed."""
        records = self.records()
        gone = [r.name for r in records if r.node_id == node_id]
        if not gone:
            raise TokenStoreError(f"no token for node {node_id!r} in {self.path}")
        self._save([r for r in records if r.node_id != node_id])
        return gone

    def _save(self, records: list[TokenRecord]) -> None:
        """Write atomically (temp file, fsync, rename) and readable by the owner only."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps(TokenFile(tokens=records).model_dump(mode="json"), indent=2).encode()
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tokens-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o600)
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        with self._lock:
            self._stamp = None
        self.refresh()
