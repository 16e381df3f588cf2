#!/bin/sh
# Install wrk (the serving benchmark's load generator) when it is missing.
# Harmless when it cannot: without root, apt-get or network it says so and exits 0,
# and bench/loadgen.py falls back to its own asyncio client.
if command -v wrk >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_wrk: wrk not found and no apt-get here; the benchmarks use the python load generator" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "ensure_wrk: wrk not found and not root (no passwordless sudo); the benchmarks use the python load generator" >&2
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
if $SUDO apt-get install -y -q wrk >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO apt-get install -y -q wrk >/dev/null 2>&1; }; then
    echo "ensure_wrk: installed $(command -v wrk)" >&2
else
    echo "ensure_wrk: could not install wrk; the benchmarks use the python load generator" >&2
fi
exit 0
