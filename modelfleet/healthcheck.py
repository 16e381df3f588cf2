"""``python -m modelfleet.healthcheck``: is the central or edge in this container up?

What the images' ``HEALTHCHECK``, the Compose healthchecks and the Kubernetes exec probes
run. It asks ``/healthz`` on ``127.0.0.1:$MODELFLEET_HTTP_PORT`` the way the process
serves it: HTTPS verified against ``$MODELFLEET_TLS__CA_FILE`` and showing the process's
own certificate when ``$MODELFLEET_TLS__ENABLED`` (an edge with ``require_client_cert``
takes no client without one, which is why a plain HTTP probe cannot be used), else plain
HTTP. Standard library only, and only the environment: it starts in a few tens of
milliseconds and never fails on a setting the process itself does not need here.
Exit 0 when ``/healthz`` answers 200, else 1 with one line on stderr."""

from __future__ import annotations

import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping

__all__ = ["check", "main"]

_TIMEOUT_S = 2.0


def _tls_on(env: Mapping[str, str]) -> bool:
    return env.get("MODELFLEET_TLS__ENABLED", "").strip().lower() in ("1", "true", "yes", "on")


def _context(env: Mapping[str, str]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=env.get("MODELFLEET_TLS__CA_FILE") or None)
    cert, key = env.get("MODELFLEET_TLS__CERT_FILE"), env.get("MODELFLEET_TLS__KEY_FILE")
    if cert and key:
        context.load_cert_chain(cert, key)
    return context


def check(env: Mapping[str, str]) -> str | None:
    """None when ``/healthz`` of the process configured by ``env`` answers 200, else why not."""
    port = env.get("MODELFLEET_HTTP_PORT", "8080")
    try:
        if _tls_on(env):
            url = f"https://127.0.0.1:{port}/healthz"
            answer = urllib.request.urlopen(url, timeout=_TIMEOUT_S, context=_context(env))
        else:
            url = f"http://127.0.0.1:{port}/healthz"
            answer = urllib.request.urlopen(url, timeout=_TIMEOUT_S)
        with answer:
            return None if answer.status == 200 else f"{url}: HTTP {answer.status}"
    except (OSError, ssl.SSLError, ValueError) as exc:  # URLError and HTTPError are OSErrors
        return f"{port}: {exc}"


def main() -> int:
    """Check, say why on failure, and return the exit status."""
    problem = check(os.environ)
    if problem is not None:
        sys.stderr.write(f"unhealthy: {problem}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
