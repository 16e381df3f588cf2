"""The artifact choices this node made, kept across restarts in ``choices.json``, so a
restarted node serves what it timed before instead of timing (and fetching) every artifact
again. A choice stands only for the very version it was made for (the same signed manifest)
on the same hardware class."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from edge_node.inference.artifact_timer import ArtifactChoice
from fleetwire.manifest import Manifest

__all__ = ["SavedChoices"]

log = logging.getLogger(__name__)

Key = tuple[str, str]


class SavedChoices:
    """The choices this node made, by version, in one small JSON file written atomically."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._records: dict[str, dict[str, object]] = {}
        try:
            loaded = json.loads(path.read_text())
            self._records = loaded if isinstance(loaded, dict) else {}
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable artifact choices in %s: %s", path, exc)

    @staticmethod
    def _key(key: Key) -> str:
        return f"{key[0]}/{key[1]}"

    def get(self, manifest: Manifest, hardware_class: str) -> ArtifactChoice | None:
        """The choice made for exactly this version (same signed manifest) on this class."""
        record = self._records.get(self._key(manifest.key))
        if not isinstance(record, dict) or record.get("signature") != manifest.signature:
            return None
        try:
            choice = ArtifactChoice.from_json(record["choice"])  # type: ignore[arg-type]
        except (KeyError, TypeError):
            return None
        if choice.hardware_class != hardware_class or manifest.artifact_named(choice.artifact) is None:
            return None
        return choice

    def put(self, manifest: Manifest, choice: ArtifactChoice) -> None:
        """Remember ``choice`` for ``manifest``'s version."""
        self._records[self._key(manifest.key)] = {"signature": manifest.signature, "choice": choice.as_json()}
        self._write()

    def keep(self, keys: Iterable[Key]) -> None:
        """Forget every version not in ``keys``."""
        wanted = {self._key(k) for k in keys}
        if set(self._records) - wanted:
            self._records = {k: v for k, v in self._records.items() if k in wanted}
            self._write()

    def _write(self) -> None:
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self._path.parent, prefix=".choices-")
            with os.fdopen(fd, "w") as f:
                json.dump(self._records, f, indent=1, sort_keys=True)
            os.replace(tmp, self._path)
        except OSError as exc:  # a full disk: the choice holds in memory, it is re-timed after a restart
            log.warning("cannot record artifact choices in %s: %s", self._path, exc)
