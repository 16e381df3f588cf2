"""Central's text gateway in front of real edges (Mosquitto heartbeats, a pushed language
model): the official ``openai`` client pointed at central, streaming and not; OIP generate;
``modelfleet generate`` through central; a shared-prefix conversation sticking to one node
while other conversations spread; a stream that moves to another node when its edge stops
mid-stream, token for token the undisturbed greedy stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types import CompletionUsage

from central.server import CentralServer
from edge_node.server import EdgeServer
from support.brokers import MosquittoBroker
from support.cli import run_cli
from support.decoder_models import build_decoder
from support.fleet import EdgeFactory, central_settings
from support.wait import wait_for

MODEL = "chat"
EDGES = ("e0", "e1", "e2")
GENERATION = {"intra_op_threads": 1, "max_waiting": 64}


@pytest.fixture
async def text_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    mqtt = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    server = CentralServer(central_settings(tmp_path / "central", mqtt=mqtt, broker=broker))
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def edges(
    text_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, tmp_path: Path
) -> list[EdgeServer]:
    """Three edges serving "chat" (a tiny peaked decoder), alive in central's membership."""
    folder = build_decoder(tmp_path / "tiny", peaked=True)
    files = [("file", ("model.onnx", (folder / "model.onnx").read_bytes()))]
    files += [("data", (p.name, p.read_bytes())) for p in sorted(folder.iterdir()) if p.name != "model.onnx"]
    async with httpx.AsyncClient(base_url=text_central.http_url, timeout=60) as api:
        assert (await api.post(f"/api/v1/models/{MODEL}/versions", files=files)).status_code == 201
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    started = await asyncio.gather(*(
        make_edge(n, text_central, heartbeat={"enabled": True, "interval_s": 0.3}, broker=broker,
                  generation=GENERATION) for n in EDGES))  # fmt: skip
    gateway = text_central.central.gateway
    await wait_for(lambda: len(gateway.router.source.candidates(MODEL, None)) == len(EDGES), 60, "all serve chat")
    return list(started)


@pytest.fixture
async def client(text_central: CentralServer, edges: list[EdgeServer]) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{text_central.http_url}/v1", api_key="none", max_retries=0) as c:
        yield c


def _counts(usage: CompletionUsage) -> tuple[int, int, int]:
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    assert 0 <= (cached or 0) <= usage.prompt_tokens
    return usage.prompt_tokens, usage.completion_tokens, usage.total_tokens


def events(body: str) -> list[Any]:
    return [orjson.loads(b.removeprefix("data: ")) for b in body.strip().split("\n\n") if b != "data: [DONE]"]


async def test_the_openai_client_through_central_streaming_or_not(
    client: openai.AsyncOpenAI, text_central: CentralServer, edges: list[EdgeServer], tmp_path: Path
) -> None:
    assert [m.id for m in (await client.models.list()).data] == [MODEL]
    direct = f"http://127.0.0.1:{edges[0].http_port}/v1"
    async with openai.AsyncOpenAI(base_url=direct, api_key="none") as edge:
        straight = await edge.completions.create(model=MODEL, prompt="def f(x):", max_tokens=12, temperature=0)
    whole = await client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=12, temperature=0)
    assert whole.choices[0].text == straight.choices[0].text
    assert whole.usage is not None and straight.usage is not None and _counts(whole.usage) == _counts(straight.usage)
    stream = await client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=12, temperature=0, stream=True)
    assert "".join([c.choices[0].text async for c in stream if c.choices]) == whole.choices[0].text

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "import os"}]
    chat = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)  # type: ignore[arg-type]
    assert chat.choices[0].message.role == "assistant" and chat.usage is not None
    chunks = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    parts, usage, ids = [], None, set()
    async for chunk in chunks:
        ids.add(chunk.id)
        usage = chunk.usage or usage
        parts += [c.delta.content or "" for c in chunk.choices]
    assert "".join(parts) == chat.choices[0].message.content and len(ids) == 1
    # The same counts, except what the node found cached: the second time the same prompt may hit
    # the prefix the first one left, or land on a node that has not seen it.
    assert usage is not None and _counts(usage) == _counts(chat.usage)

    async with httpx.AsyncClient(base_url=text_central.http_url, timeout=60) as http:
        body = {"text_input": "def f(x):", "parameters": {"max_tokens": 12, "temperature": 0}}
        oip = (await http.post(f"/v2/models/{MODEL}/generate", json=body)).json()
        assert oip["text_output"] == whole.choices[0].text and oip["model_version"] == "1"
        streamed = await http.post(f"/v2/models/{MODEL}/generate_stream", json=body)
        assert "".join(e["text_output"] for e in events(streamed.text)) == oip["text_output"]
        unknown = await http.post("/v1/completions", json={"model": "nope", "prompt": "x"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        bad = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 0})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"

    shown = await run_cli(tmp_path, text_central, "generate", MODEL, "def f(x):", "--max-tokens", "12",
                          "--temperature", "0")  # fmt: skip
    assert whole.choices[0].text.strip() in shown
    # the operator's node list says which versions are language models, with their engine's figures
    nodes = await run_cli(tmp_path, text_central, "nodes")
    assert f"{MODEL}:1 ready (language model:" in nodes and "tok/s" in nodes


async def test_a_conversation_sticks_to_one_node_while_conversations_spread(
    client: openai.AsyncOpenAI, text_central: CentralServer
) -> None:
    system = {"role": "system", "content": "Review this Python."}  # shared by every conversation
    served: dict[int, list[str]] = {}
    async with httpx.AsyncClient(base_url=text_central.http_url, timeout=60) as http:
        for turn in range(2):
            for conversation in range(6):
                messages = [system] + [
                    {"role": "user", "content": f"conversation {conversation}, turn {t}: " + "x = 1\n" * 40}
                    for t in range(turn + 1)
                ]  # fmt: skip
                body = {"model": MODEL, "messages": messages, "max_tokens": 2, "temperature": 0}
                answer = await http.post("/v1/chat/completions", json=body)
                assert answer.status_code == 200, answer.text
                served.setdefault(conversation, []).append(answer.headers["x-modelfleet-node"])
        status = (await http.get("/api/v1/gateway")).json()["text"]
    assert all(len(set(nodes)) == 1 for nodes in served.values()), served  # each conversation stays
    assert len({nodes[0] for nodes in served.values()}) >= 2, served  # conversations spread
    assert status["routed"].get("prefix", 0) >= 6, status


async def test_a_stream_moves_on_when_its_edge_stops_token_for_token(
    text_central: CentralServer, edges: list[EdgeServer]
) -> None:
    body = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}  # fmt: skip
    by_id = {e.node_id: e for e in edges}
    async with httpx.AsyncClient(base_url=text_central.http_url, timeout=60) as http:
        undisturbed = (await http.post("/v1/completions", json=body)).json()
        # The tiny model may write all 400 tokens into the sockets' buffers before the client
        # reads its first chunk (a loaded machine); the edge is stopped only while its engine
        # still runs the stream, else the stream is read to its end and tried again.
        for _attempt in range(5):
            tokens, text, stopped = await _read_stopping_its_edge(http, {**body, "stream": True}, by_id)
            if stopped:
                break
        status = (await http.get("/api/v1/gateway")).json()["text"]
    assert stopped, "every stream had ended at its edge before its first chunk was read"
    assert tokens == undisturbed["token_ids"] and text == undisturbed["choices"][0]["text"], status
    assert status["resumed"] == 1 and status["broken"] == 0, status
    assert len(tokens) == 400


async def _read_stopping_its_edge(
    http: httpx.AsyncClient, body: dict[str, Any], by_id: dict[str, EdgeServer]
) -> tuple[list[int], str, bool]:
    """Stream ``body``, stopping the serving edge at the first chunk if it is still generating."""
    tokens: list[int] = []
    text, stopped, checked = "", False, False
    async with http.stream("POST", "/v1/completions", json=body) as response:
        first = by_id[response.headers["x-modelfleet-node"]]
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            tokens += chunk["token_ids"]
            text += chunk["choices"][0]["text"]
            if not checked:
                checked = True
                engine = first.edge.repository.get(MODEL).engine
                if engine is not None and engine.stats().running > 0:
                    stopped = True
                    await first.stop()  # mid-stream: its engine ends every stream
    return tokens, text, stopped


async def test_a_client_that_goes_away_cancels_the_edges_stream(
    text_central: CentralServer, edges: list[EdgeServer]
) -> None:
    body = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 400, "temperature": 0.8, "ignore_eos": True,
            "stream": True}  # fmt: skip
    async with httpx.AsyncClient(base_url=text_central.http_url, timeout=60) as http:
        for _ in range(6):
            async with http.stream("POST", "/v1/chat/completions" if _ % 2 else "/v1/completions",
                                   json=body if not _ % 2 else {**body, "prompt": None,
                                   "messages": [{"role": "user", "content": "hi"}]}) as response:  # fmt: skip
                assert response.status_code == 200
                async for _chunk in response.aiter_bytes():
                    break  # hang up after the first chunk

    def idle() -> bool:
        engines = [e.edge.repository.get(MODEL).engine for e in edges]
        return all(e is not None and e.stats().running == 0 for e in engines) and all(
            e.edge.plane.inflight == 0 for e in edges
        )

    await wait_for(idle, 10, "every edge's streams cancelled")
    async with httpx.AsyncClient(base_url=text_central.http_url, timeout=60) as http:
        status = (await http.get("/api/v1/gateway")).json()
    assert all(n["outstanding"] == 0 for n in status["nodes"]) and status["text"]["broken"] == 0
