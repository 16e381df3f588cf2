"""This node's credential for central's gRPC Registry API.

The token comes from ``node_token`` (env ``MODELFLEET_NODE_TOKEN``) or from the file named
by ``node_token_file``; the file is re-read when it changes (one ``stat`` per call), so a
rotated token is picked up on the next call without a restart. Without either, calls carry
no credential (a central without ``auth.nodes_required`` asks for none)."""

from __future__ import annotations

import logging
from pathlib import Path

from fleetwire.credentials import bearer_metadata

log = logging.getLogger(__name__)

Metadata = tuple[tuple[str, str], ...]


class CredentialError(Exception):
    """The configured token file cannot be read or is empty."""


class NodeCredential:
    """Call metadata that presents this node's token to central."""

    def __init__(self, token: str | None = None, token_file: Path | None = None) -> None:
        if token is not None and token_file is not None:
            raise CredentialError("set node_token or node_token_file, not both")
        self._file = token_file
        self._stamp: tuple[int, int, int] | None = None
        self._metadata: Metadata = bearer_metadata(token) if token else ()
        if token_file is not None:
            self.metadata()  # a missing or empty file fails at start-up, not at the first call

    @property
    def configured(self) -> bool:
        """Whether this node presents a token at all."""
        return bool(self._metadata) or self._file is not None

    def metadata(self) -> Metadata:
        """The metadata to send on every Registry call (empty without a token)."""
        if self._file is not None:
            self._reload(self._file)
        return self._metadata

    def _reload(self, path: Path) -> None:
        try:
            st = path.stat()
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            token = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            error = CredentialError(f"cannot read node_token_file {path}: {exc}")
        else:
            if token:
                self._metadata, self._stamp = bearer_metadata(token), stamp
                return
            error = CredentialError(f"node_token_file {path} is empty")
        if self._stamp is None:  # never read: fail at start-up with the reason
            raise error
        # Mid-rotation (a half-written or briefly missing file): keep the last good token.
        log.warning("%s; keeping the last token", error)
