"""The fleet mode is picked once, from the settings: a central alone never loads the
replicated mode (nor psycopg through it), and tells ``/api/v1/replicas`` it is alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from central.fleet_mode import LocalMode
from central.fleet_mode.factory import open_fleet_mode
from central.settings import CentralSettings
from support.fleet import central_settings

_ALONE = """
import sys
from pathlib import Path
from central.core import Central
from central.settings import CentralSettings
central = Central(CentralSettings(data_dir=Path(sys.argv[1]), mqtt={"enabled": False}))
central.close()
print(sorted(m for m in sys.modules if m.startswith(("central.ha.", "central.fleet_mode.replicated"))))
"""


def test_a_central_alone_never_loads_the_replicated_mode(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _ALONE, str(tmp_path / "c")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_central_alone_is_its_own_only_replica(tmp_path: Path) -> None:
    mode = open_fleet_mode(central_settings(tmp_path))
    assert isinstance(mode, LocalMode)
    assert mode.replicas() == {"replicated": False, "replicas": [{"replica_id": None, "leader": True}]}
    assert mode.heartbeat_partitions("edge-0") == (0, 0) and mode.leads()


def test_a_replica_needs_the_shared_store(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"store\.url"):
        CentralSettings(data_dir=tmp_path, ha={"replica_id": "r0"})
