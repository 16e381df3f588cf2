"""schemathesis against central's and an edge's own OpenAPI documents, on real servers
with a pushed model: no request may get a 5xx, and every answer must be one the
document declares (status, content type, body schema)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from openapi_fuzzing import FuzzReport, fuzz_api

from central.auth import Role
from central.server import CentralServer
from central.storage.files.tokens import TokenStore
from support.fleet import EdgeFactory, central_settings, push
from support.wait import wait_for

#: Per operation; about 20 operations per server keep each run to a few seconds.
EXAMPLES = 20
#: With auth on, every write stops at the middleware: a few cases per operation show it.
AUTH_EXAMPLES = 5


def _failures(report: FuzzReport) -> str:
    return "\n\n".join(f"{op}:\n" + "\n--\n".join(sorted(set(msgs))[:3]) for op, msgs in report.failures.items())


async def test_central_api_answers_every_fuzzed_request_as_documented(
    central: CentralServer, api: httpx.AsyncClient, small_model_file: Path
) -> None:
    assert (await push(api, "tiny", small_model_file, version="v1")).status_code == 201
    # The SSE stream and ?follow never end; the gateway needs serving edges (off here).
    report = await asyncio.to_thread(
        fuzz_api,
        central.http_url,
        exclude=r"/stream|/infer|/gateway",
        pins={"name": "tiny", "version": "v1"},
        max_examples=EXAMPLES,
    )
    assert not report.failures, _failures(report)
    assert "POST /api/v1/models/{name}/versions" in report.operations
    assert report.statuses["GET /api/v1/models/{name}/versions"][200] > 0  # the pushed model was listed
    assert (await api.get("/api/v1/models/tiny/versions/v1")).status_code == 200  # fuzzing deleted nothing real


async def test_central_api_with_auth_declares_its_refusals(tmp_path: Path, small_model_file: Path) -> None:
    """Operator auth on, no token sent: every write is refused with the 401 the document declares."""
    server = CentralServer(central_settings(tmp_path / "central", auth={"enabled": True}))
    admin = TokenStore(tmp_path / "central" / "tokens.json").create("ci", Role.ADMIN)
    await server.start()
    try:
        headers = {"Authorization": f"Bearer {admin}"}
        async with httpx.AsyncClient(base_url=server.http_url, headers=headers, timeout=30) as api:
            assert (await push(api, "tiny", small_model_file, version="v1")).status_code == 201
        report = await asyncio.to_thread(
            fuzz_api,
            server.http_url,
            exclude=r"/stream|/infer|/gateway",
            pins={"name": "tiny", "version": "v1"},
            max_examples=AUTH_EXAMPLES,
        )
    finally:
        await server.stop()
    assert not report.failures, _failures(report)
    assert report.statuses["POST /api/v1/models/{name}/versions"][401] > 0
    assert report.statuses["DELETE /api/v1/models/{name}/versions/{version}"][401] > 0


async def test_edge_api_answers_every_fuzzed_request_as_documented(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    assert (await push(api, "tiny", small_model_file, version="v1")).status_code == 201
    edge = await make_edge("fuzzed", central)
    await wait_for(lambda: edge.edge.repository.ready(), what="the edge serving tiny")
    url = f"http://127.0.0.1:{edge.http_port}"
    report = await asyncio.to_thread(
        fuzz_api, url, exclude=r"^/bench", pins={"name": "tiny", "v": "v1"}, max_examples=EXAMPLES
    )
    assert not report.failures, _failures(report)
    infer = report.statuses["POST /v2/models/{name}/infer"]
    assert infer[400] > 0 and infer[404] > 0  # bodies reached the served model's decoder, and unknown names
    async with httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/v2/models/tiny/ready")).json() == {"name": "tiny", "ready": True}
