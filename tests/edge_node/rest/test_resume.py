"""The edge's hooks for central's stream failover: ``return_token_ids`` (each chunk's token
ids, the prompt's on the first) and ``resume_offset`` (a completion continued from the
prompt's ids plus the tokens already sent): greedy and seeded streams continue exactly, token
for token and character for character."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from central.server import CentralServer
from edge_node.server import EdgeServer
from support.decoder_models import build_decoder
from support.fleet import EdgeFactory
from support.wait import wait_for

MODEL = "chat"


@pytest.fixture
async def http(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, tmp_path: Path
) -> AsyncIterator[httpx.AsyncClient]:
    folder = build_decoder(tmp_path / "tiny")
    files = [("file", ("model.onnx", (folder / "model.onnx").read_bytes()))]
    files += [("data", (p.name, p.read_bytes())) for p in sorted(folder.iterdir()) if p.name != "model.onnx"]
    assert (await api.post(f"/api/v1/models/{MODEL}/versions", files=files)).status_code == 201
    edge: EdgeServer = await make_edge("e1", central, generation={"intra_op_threads": 1})
    await wait_for(lambda: edge.edge.repository.serves(MODEL), what="chat served", timeout=60)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as client:
        yield client


async def _chunks(http: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = await http.post("/v1/completions", json={**body, "stream": True, "return_token_ids": True})
    assert response.status_code == 200, response.text
    blocks = [b.removeprefix("data: ") for b in response.text.strip().split("\n\n")]
    assert blocks[-1] == "[DONE]"
    return [orjson.loads(b) for b in blocks[:-1]]


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "top_p": 0.95, "seed": 7},
                                      {"temperature": 1.2, "seed": 3, "repetition_penalty": 1.3}],
                         ids=["greedy", "seeded-top-p", "seeded-penalty"])  # fmt: skip
async def test_a_resumed_completion_continues_exactly(http: httpx.AsyncClient, sampling: dict[str, Any]) -> None:
    body = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 40, "ignore_eos": True, **sampling}
    whole = await _chunks(http, body)
    prompt_ids = whole[0]["prompt_token_ids"]
    assert whole[0]["max_tokens"] == 40 and whole[0]["model_version"] == "1"
    tokens = [t for c in whole for t in c["token_ids"]]
    text = "".join(c["choices"][0]["text"] for c in whole)
    assert len(tokens) == 40
    for cut in (1, len(whole) // 2, len(whole) - 2):  # the stream broke after chunk ``cut``
        sent = [t for c in whole[:cut] for t in c["token_ids"]]
        shown = "".join(c["choices"][0]["text"] for c in whole[:cut])
        resumed = await _chunks(http, {**body, "prompt": prompt_ids + sent, "max_tokens": 40 - len(sent),
                                       "resume_offset": len(sent)})  # fmt: skip
        assert sent + [t for c in resumed for t in c["token_ids"]] == tokens, cut
        assert shown + "".join(c["choices"][0]["text"] for c in resumed) == text, cut


async def test_a_bad_resume_offset_is_a_400(http: httpx.AsyncClient) -> None:
    for offset in (-1, 3, 10):
        body = {"model": MODEL, "prompt": [1, 2, 3], "resume_offset": offset}
        response = await http.post("/v1/completions", json=body)
        assert response.status_code == 400 and response.json()["error"]["param"] == "resume_offset", offset
