"""The birth/death sequence number (``bdseq``), persisted in the edge's data dir.

Every MQTT connection of a node gets a fresh ``bdseq``: the Last Will given in its
CONNECT and the birth published after its CONNACK carry the same number, so a consumer
can tell a death that belongs to an older connection (smaller ``bdseq``) from the
current one. The number is written to disk *before* the CONNECT that carries it is
sent, so it keeps growing across process restarts and crashes too: a restarted edge
never reuses a number a broker may still hold as someone's will.

The file holds one decimal integer: the last number handed out (``reserve``).
Writes are atomic (temp file, fsync, rename)."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

#: File name under the data dir.
BDSEQ_FILE = "mqtt-bdseq"


class BdseqStore:
    """The last ``bdseq`` handed out, in ``path``; ``reserve()`` hands out the next."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._last = self._read()

    @classmethod
    def in_dir(cls, data_dir: Path) -> BdseqStore:
        """The store at ``data_dir/mqtt-bdseq``."""
        return cls(Path(data_dir) / BDSEQ_FILE)

    @property
    def last(self) -> int:
        """The last number handed out (0 before the first one: numbers start at 1)."""
        return self._last

    def _read(self) -> int:
        try:
            text = self.path.read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            return 0
        except OSError as exc:
            log.error("cannot read bdseq file %s (%s); starting again at 1", self.path, exc)
            return 0
        try:
            value = int(text)
        except ValueError:
            log.warning("ignoring unreadable bdseq file %s (%r); starting again at 1", self.path, text[:40])
            return 0
        if value < 0:
            log.warning("ignoring negative bdseq %d in %s", value, self.path)
            return 0
        return value

    def reserve(self) -> int:
        """The next number, persisted before it is returned.

        When the file can't be written the number still grows in memory (logged): a
        heartbeat must not stop over a full disk, only the restart guarantee weakens."""
        with self._lock:
            value = self._last + 1
            try:
                self._write(value)
            except OSError:
                log.exception("could not persist bdseq %d to %s", value, self.path)
            self._last = value
            return value

    def _write(self, value: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(f"{value}\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        with contextlib.suppress(OSError):  # make the rename itself durable where the OS allows
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
