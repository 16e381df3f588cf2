"""``scripts/ensure_apt.sh`` against a stand-in ``apt-get`` (and ``id``, ``sudo``) on PATH:
the real script, the real shell; only the package manager is played by a small script
that logs its calls and "installs" a package by putting its program in a bin dir."""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ensure_apt.sh"

#: apt-get: `update` leaves a mark; `install` fails without it unless APT_LISTS_FRESH is set,
#: fails for packages named in APT_UNKNOWN, else writes each package's program into $BIN.
_APT_GET = """#!/bin/sh
echo "${SUDO_USED:-}apt-get $*" >> "$CALLS"
case "$1" in
update) touch "$STATE/updated"; exit 0 ;;
install)
    [ -e "$STATE/updated" ] || [ -n "${APT_LISTS_FRESH:-}" ] || exit 100
    for arg; do
        case " $APT_UNKNOWN " in *" $arg "*) exit 100 ;; esac
    done
    for arg; do
        case "$arg" in install|-*) ;; *) printf '#!/bin/sh\\n' > "$BIN/$arg"; chmod +x "$BIN/$arg" ;; esac
    done ;;
esac
"""
_SUDO_OK = '#!/bin/sh\n[ "$1" = -n ] && shift\nSUDO_USED="sudo " exec "$@"\n'
_SUDO_ASKS = "#!/bin/sh\nexit 1\n"  # a sudo that wants a password
_ID_USER = '#!/bin/sh\n[ "$1" = -u ] && echo 1000 || exec /usr/bin/id "$@"\n'


@dataclass
class Machine:
    """A PATH with the stand-ins first, and where they leave their traces."""

    root: Path
    env: dict[str, str]

    @property
    def calls(self) -> list[str]:
        calls = self.root / "calls"
        return calls.read_text().splitlines() if calls.exists() else []

    def tool(self, name: str, text: str) -> None:
        path = self.root / "stubs" / name
        path.write_text(text)
        path.chmod(0o755)

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(SCRIPT), *args], env={**self.env, **env}, capture_output=True, text=True, timeout=60
        )


def _machine(tmp_path: Path) -> Machine:
    for folder in ("stubs", "bin", "state"):
        (tmp_path / folder).mkdir()
    env = {
        "PATH": f"{tmp_path / 'stubs'}:{tmp_path / 'bin'}:/usr/bin:/bin",
        "CALLS": str(tmp_path / "calls"),
        "STATE": str(tmp_path / "state"),
        "BIN": str(tmp_path / "bin"),
        "APT_UNKNOWN": "",
    }
    machine = Machine(tmp_path, env)
    machine.tool("apt-get", _APT_GET)
    return machine


def _name() -> str:
    """A program no machine has (not in /usr/sbin, /usr/bin either)."""
    return f"mf-tool-{uuid.uuid4().hex[:8]}"


def test_programs_already_there_are_used_and_nothing_is_installed(tmp_path: Path) -> None:
    machine = _machine(tmp_path)
    on_path, elsewhere, optional = _name(), _name(), _name()
    machine.tool(on_path, "#!/bin/sh\n")
    machine.tool(optional, "#!/bin/sh\n")
    custom = tmp_path / "custom"
    custom.write_text("#!/bin/sh\n")
    custom.chmod(0o755)
    variable = elsewhere.upper().replace("-", "_")  # as MOSQUITTO=/path names mosquitto's

    done = machine.run(f"pkg-a:{on_path}", f"pkg-b:{elsewhere}", "--optional", optional, **{variable: str(custom)})
    assert done.returncode == 0, done.stderr
    assert machine.calls == []
    for path in (tmp_path / "stubs" / on_path, custom, tmp_path / "stubs" / optional):
        assert f"using {path}" in done.stderr


def test_missing_programs_are_installed_with_one_update_at_most(tmp_path: Path) -> None:
    machine = _machine(tmp_path)
    first, second, extra = _name(), _name(), _name()

    done = machine.run(first, f"{second}:{second}", "--optional", extra)
    assert done.returncode == 0, done.stderr
    assert machine.calls == [  # the lists were stale: one update, then both installs work
        f"apt-get install -y -q --no-install-recommends {first} {second}",
        "apt-get update -q",
        f"apt-get install -y -q --no-install-recommends {first} {second}",
        f"apt-get install -y -q --no-install-recommends {extra}",
    ]
    for name in (first, second, extra):
        assert f"installed {tmp_path / 'bin' / name} ({name} version unknown)" in done.stderr
        assert (tmp_path / "bin" / name).exists()

    again = machine.run(first, "--optional", extra)  # idempotent
    assert again.returncode == 0 and len(machine.calls) == 4, again.stderr


def test_an_optional_package_that_cannot_be_installed_only_warns(tmp_path: Path) -> None:
    machine = _machine(tmp_path)
    needed, absent = _name(), _name()

    done = machine.run(needed, "--optional", absent, APT_UNKNOWN=absent)
    assert done.returncode == 0, done.stderr
    assert f"{absent} not found and apt-get install {absent} failed; going on without it" in done.stderr
    assert (tmp_path / "bin" / needed).exists()
    # the first install needed an update; the failing one does not update again
    assert [c.split()[1] for c in machine.calls] == ["install", "update", "install", "install"]


def test_a_required_package_that_cannot_be_installed_fails_saying_how_to_fix_it(tmp_path: Path) -> None:
    machine = _machine(tmp_path)
    absent = _name()

    done = machine.run(f"{absent}-pkg:{absent}", APT_UNKNOWN=f"{absent}-pkg")
    assert done.returncode == 1
    variable = absent.upper().replace("-", "_")
    assert f"install it by hand: sudo apt-get install {absent}-pkg (or set {variable}=/path/to/{absent})" in done.stderr


def test_without_root_it_installs_through_passwordless_sudo(tmp_path: Path) -> None:
    machine = _machine(tmp_path)
    machine.tool("id", _ID_USER)
    machine.tool("sudo", _SUDO_OK)
    name = _name()

    done = machine.run(name, APT_LISTS_FRESH="1")
    assert done.returncode == 0, done.stderr
    assert machine.calls == [f"sudo apt-get install -y -q --no-install-recommends {name}"]


def test_without_root_or_sudo_it_fails_for_required_and_warns_for_optional(tmp_path: Path) -> None:
    machine = _machine(tmp_path)
    machine.tool("id", _ID_USER)
    machine.tool("sudo", _SUDO_ASKS)
    needed, wanted = _name(), _name()

    done = machine.run(needed, "--optional", wanted)
    assert done.returncode == 1
    assert f"{needed} not found and not root (no passwordless sudo) to install it" in done.stderr
    assert f"{wanted} not found and not root (no passwordless sudo) to install it; going on without it" in done.stderr
    assert machine.calls == []

    optional_only = machine.run("--optional", wanted)
    assert optional_only.returncode == 0, optional_only.stderr


def test_bad_arguments_print_the_usage() -> None:
    for args in ([], ["--optional"], ["pkg:"], ["--nope"]):
        done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30, env=os.environ)
        assert done.returncode == 2 and "usage:" in done.stderr, (args, done.stderr)
