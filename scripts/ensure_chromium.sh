#!/usr/bin/env bash
# Make sure Debian's chromium browser is installed: the dashboard test drives it headless
# with Playwright for Python (executable_path=/usr/bin/chromium; Playwright's own browser
# download is never used, the tests run without network). Installs the package when
# `chromium` is neither on PATH nor in /usr/bin.
# Exits non-zero, saying why, when it cannot install it.
set -euo pipefail

find_chromium() {
    if [ -n "${CHROMIUM:-}" ] && [ -x "$CHROMIUM" ]; then
        echo "$CHROMIUM"
        return 0
    fi
    if command -v chromium >/dev/null 2>&1; then
        command -v chromium
        return 0
    fi
    if [ -x /usr/bin/chromium ]; then
        echo /usr/bin/chromium
        return 0
    fi
    return 1
}

if found="$(find_chromium)"; then
    echo "ensure_chromium: using $found" >&2
    exit 0
fi

fail() {
    echo "ensure_chromium: $*" >&2
    echo "ensure_chromium: install it by hand: sudo apt-get install chromium" >&2
    exit 1
}

command -v apt-get >/dev/null 2>&1 || fail "chromium not found and there is no apt-get on this machine"

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        fail "chromium not found and not root (no passwordless sudo) to install it"
    fi
fi

export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

install_pkg() {
    "${SUDO[@]}" apt-get install -y -q --no-install-recommends chromium >>"$log" 2>&1
}

echo "ensure_chromium: installing Debian's chromium package" >&2
if ! install_pkg; then
    # package lists missing or stale: update once, then try again
    "${SUDO[@]}" apt-get update -q >>"$log" 2>&1 || { tail -n 20 "$log" >&2; fail "apt-get update failed"; }
    install_pkg || { tail -n 20 "$log" >&2; fail "apt-get install chromium failed"; }
fi

found="$(find_chromium)" || { tail -n 20 "$log" >&2; fail "package installed but no chromium binary found"; }
echo "ensure_chromium: installed $found ($("$found" --version 2>/dev/null | tail -n 1))" >&2
