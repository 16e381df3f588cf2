#!/usr/bin/env bash
# Make sure programs from Debian packages are installed:
#
#   scripts/ensure_apt.sh PKG[:BINARY] ... [--optional PKG[:BINARY] ...]
#
# e.g. `scripts/ensure_apt.sh mosquitto chromium --optional wrk`. BINARY defaults to PKG.
# A program counts as installed when $BINARY_IN_CAPITALS names an executable
# (MOSQUITTO=/opt/mosquitto/sbin/mosquitto, CHROMIUM=...), or when BINARY is on PATH or in
# /usr/sbin, /usr/local/sbin or /usr/bin (a non-root PATH often lacks the sbin ones).
# Those already there are skipped; the rest are installed with apt-get, as root or with
# passwordless sudo, without recommends, running `apt-get update` at most once (only when
# an install fails: package lists missing or stale). Never starts or enables a service
# itself (if mosquitto's postinst starts one on 1883, the tests do not use it).
#
# Exits non-zero, saying why, when a package cannot be installed. Packages after
# --optional only warn: wrk, say, for which bench/loadgen.py falls back to its own load
# generator.
set -euo pipefail

me=ensure_apt
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

usage() {
    echo "usage: $0 PKG[:BINARY] ... [--optional PKG[:BINARY] ...]" >&2
    exit 2
}

required=()
optional=()
target=required
for arg in "$@"; do
    case "$arg" in
        --optional) target=optional ;;
        -h | --help) usage ;;
        -* | "" | :* | *:) usage ;;
        *) if [ "$target" = required ]; then required+=("$arg"); else optional+=("$arg"); fi ;;
    esac
done
[ $((${#required[@]} + ${#optional[@]})) -gt 0 ] || usage

# The variable that may name BINARY's path: chromium -> CHROMIUM, some-tool -> SOME_TOOL.
override_var() {
    printf '%s' "$1" | tr 'a-z.-' 'A-Z__'
}

# Where BINARY is, on stdout; fails when it is nowhere.
find_binary() {
    local bin="$1" var path dir
    var="$(override_var "$bin")"
    if [[ "$var" =~ ^[A-Z_][A-Z0-9_]*$ ]]; then
        path="${!var:-}"
        if [ -n "$path" ] && [ -x "$path" ]; then
            echo "$path"
            return 0
        fi
    fi
    if command -v "$bin" >/dev/null 2>&1; then
        command -v "$bin"
        return 0
    fi
    for dir in /usr/sbin /usr/local/sbin /usr/bin; do
        if [ -x "$dir/$bin" ]; then
            echo "$dir/$bin"
            return 0
        fi
    done
    return 1
}

# SPECS (PKG[:BINARY]) whose binary is missing, one a line; "using" for the others.
missing() {
    local spec bin path
    for spec in "$@"; do
        bin="${spec#*:}"
        if path="$(find_binary "$bin")"; then
            echo "$me: using $path" >&2
        else
            echo "$spec"
        fi
    done
}

mapfile -t need < <(missing ${required[@]+"${required[@]}"})
mapfile -t want < <(missing ${optional[@]+"${optional[@]}"})
[ $((${#need[@]} + ${#want[@]})) -gt 0 ] || exit 0

# A package that cannot be installed: fatal when required, a warning when optional.
give_up() {
    local kind="$1" why="$2" spec pkg bin
    shift 2
    for spec in "$@"; do
        pkg="${spec%%:*}"
        bin="${spec#*:}"
        if [ "$kind" = required ]; then
            echo "$me: $bin not found and $why" >&2
            echo "$me: install it by hand: sudo apt-get install $pkg (or set $(override_var "$bin")=/path/to/$bin)" >&2
        else
            echo "$me: $bin not found and $why; going on without it" >&2
        fi
    done
    if [ "$kind" = required ] && [ $# -gt 0 ]; then
        exit 1
    fi
}

why=""
SUDO=()
if ! command -v apt-get >/dev/null 2>&1; then
    why="there is no apt-get on this machine"
elif [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        why="not root (no passwordless sudo) to install it"
    fi
fi
if [ -n "$why" ]; then
    give_up optional "$why" ${want[@]+"${want[@]}"}
    give_up required "$why" ${need[@]+"${need[@]}"}
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
updated=no

apt_install() {
    ${SUDO[@]+"${SUDO[@]}"} apt-get install -y -q --no-install-recommends "$@" >>"$log" 2>&1
}

# Install PKGs; when that fails, update the package lists (once per run) and try again.
install() {
    echo "$me: installing Debian's $* package(s)" >&2
    apt_install "$@" && return 0
    [ "$updated" = no ] || return 1
    updated=yes
    ${SUDO[@]+"${SUDO[@]}"} apt-get update -q >>"$log" 2>&1 || return 1
    apt_install "$@"
}

# Install the packages of SPECS; report each binary, or give up on those still missing.
ensure() {
    local kind="$1" spec path version
    shift
    [ $# -gt 0 ] || return 0
    local pkgs=()
    for spec in "$@"; do
        pkgs+=("${spec%%:*}")
    done
    if ! install "${pkgs[@]}"; then
        tail -n 20 "$log" >&2
        give_up "$kind" "apt-get install ${pkgs[*]} failed" "$@"
        return 0
    fi
    for spec in "$@"; do
        if path="$(find_binary "${spec#*:}")"; then
            version="$(dpkg-query -W -f='${Version}' "${spec%%:*}" 2>/dev/null || true)"
            echo "$me: installed $path (${spec%%:*} ${version:-version unknown})" >&2
        else
            give_up "$kind" "package ${spec%%:*} installed but no ${spec#*:} binary found" "$spec"
        fi
    done
}

ensure required ${need[@]+"${need[@]}"}
ensure optional ${want[@]+"${want[@]}"}
