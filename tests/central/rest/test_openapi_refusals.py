"""Central's OpenAPI document declares the refusals its middleware and limits answer:
with operator auth on, 401 on every protected operation and 403 on writes (reads only
with ``protect_reads``; ``/healthz`` and the OIP gateway stay open), the push's 503 with
``Retry-After`` (max_concurrent_uploads) and the gateway's 503."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from central.auth import Role
from central.server import CentralServer
from central.storage.files.tokens import TokenStore
from support.fleet import central_settings

PUSH = ("/api/v1/models/{name}/versions", "post")
DELETE = ("/api/v1/models/{name}/versions/{version}", "delete")
LIST = ("/api/v1/models", "get")
INFER = ("/v2/models/{name}/infer", "post")
HEALTH = ("/healthz", "get")


async def _document(tmp_path: Path, **auth: Any) -> dict[str, Any]:
    server = CentralServer(central_settings(tmp_path / "central", auth=auth))
    viewer = TokenStore(tmp_path / "central" / "tokens.json").create("reader", Role.VIEWER)
    await server.start()
    headers = {"Authorization": f"Bearer {viewer}"}  # with protect_reads the document is a read too
    try:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30, headers=headers) as api:
            response = await api.get("/openapi.json")
            assert response.status_code == 200, response.text
            document: dict[str, Any] = response.json()
            return document
    finally:
        await server.stop()


def _codes(document: dict[str, Any], operation: tuple[str, str]) -> set[str]:
    path, method = operation
    return set(document["paths"][path][method]["responses"])


@pytest.mark.parametrize("protect_reads", [False, True])
async def test_auth_refusals_are_declared_where_the_middleware_answers_them(
    tmp_path: Path, protect_reads: bool
) -> None:
    document = await _document(tmp_path, enabled=True, protect_reads=protect_reads)
    assert {"401", "403", "413", "503"} <= _codes(document, PUSH)
    assert {"401", "403"} <= _codes(document, DELETE)
    assert ("401" in _codes(document, LIST)) is protect_reads
    assert "403" not in _codes(document, LIST)  # any role may read
    for open_operation in (INFER, HEALTH):
        assert not {"401", "403"} & _codes(document, open_operation)
    retry_after = document["paths"][PUSH[0]][PUSH[1]]["responses"]["503"]["headers"]
    assert "Retry-After" in retry_after


async def test_without_auth_no_401_is_declared_and_the_limits_are(tmp_path: Path) -> None:
    document = await _document(tmp_path)
    assert not {"401", "403"} & _codes(document, PUSH)
    assert {"413", "503"} <= _codes(document, PUSH)
    assert "503" in _codes(document, INFER)
