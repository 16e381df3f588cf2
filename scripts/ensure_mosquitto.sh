#!/usr/bin/env bash
# Make sure Debian's mosquitto broker binary is installed (the MQTT tests start their
# own brokers from it on free loopback ports). Installs the package when `mosquitto` is
# neither on PATH nor in /usr/sbin; never starts or enables the system service itself
# (if the package's postinst starts one on 1883, the tests do not use it).
# Exits non-zero, saying why, when it cannot install it.
set -euo pipefail

find_mosquitto() {
    if [ -n "${MOSQUITTO:-}" ] && [ -x "$MOSQUITTO" ]; then
        echo "$MOSQUITTO"
        return 0
    fi
    if command -v mosquitto >/dev/null 2>&1; then
        command -v mosquitto
        return 0
    fi
    for candidate in /usr/sbin/mosquitto /usr/local/sbin/mosquitto /usr/bin/mosquitto; do
        if [ -x "$candidate" ]; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

if found="$(find_mosquitto)"; then
    echo "ensure_mosquitto: using $found" >&2
    exit 0
fi

fail() {
    echo "ensure_mosquitto: $*" >&2
    echo "ensure_mosquitto: install it by hand: sudo apt-get install mosquitto (or set MOSQUITTO=/path/to/mosquitto)" >&2
    exit 1
}

command -v apt-get >/dev/null 2>&1 || fail "mosquitto not found and there is no apt-get on this machine"

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        fail "mosquitto not found and not root (no passwordless sudo) to install it"
    fi
fi

export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

install_pkg() {
    "${SUDO[@]}" apt-get install -y -q --no-install-recommends mosquitto >>"$log" 2>&1
}

echo "ensure_mosquitto: installing Debian's mosquitto package" >&2
if ! install_pkg; then
    # package lists missing or stale: update once, then try again
    "${SUDO[@]}" apt-get update -q >>"$log" 2>&1 || { tail -n 20 "$log" >&2; fail "apt-get update failed"; }
    install_pkg || { tail -n 20 "$log" >&2; fail "apt-get install mosquitto failed"; }
fi

found="$(find_mosquitto)" || { tail -n 20 "$log" >&2; fail "package installed but no mosquitto binary found"; }
echo "ensure_mosquitto: installed $found ($("$found" -h 2>&1 | head -n 1))" >&2
