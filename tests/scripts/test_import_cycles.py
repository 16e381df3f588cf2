"""central, edge_node and fleetwire import without cycles (scripts/check_import_cycles.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_import_cycles.py"


def test_no_import_cycles() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), str(REPO)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "module-level imports:" in done.stdout and ", 0 cycles" in done.stdout


def test_the_check_finds_a_cycle(tmp_path: Path) -> None:
    """The check is not vacuous: two modules importing each other, one lazily, fail it."""
    pkg = tmp_path / "central"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from central.b import B\n\nA = 1\n")
    (pkg / "b.py").write_text("B = 2\n\n\ndef f():\n    from central.a import A\n    return A\n")
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "import cycle (all imports, function-local ones too): central.a <-> central.b" in done.stdout
    (pkg / "b.py").write_text("from central.a import A\n\nB = 2\n")
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert "import cycle (module-level imports): central.a <-> central.b" in done.stdout
