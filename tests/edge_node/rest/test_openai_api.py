"""A language model pushed to central is served by an edge's OpenAI-compatible API and OIP's
generate extension: the official ``openai`` client, streaming and not, raw SSE, bad input as
clear 4xx in OpenAI's error shape, cancelled streams that free their slots, vLLM metrics."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from typer.testing import CliRunner

from central.server import CentralServer
from edge_node.server import EdgeServer
from fleetwire.mqtt.fast import decode_heartbeat, model_info
from fleetwire.mqtt.payloads import Heartbeat, ModelInfo
from modelfleet.cli import app
from support.decoder_models import build_decoder
from support.fleet import EdgeFactory
from support.wait import wait_for

PUSH = "/api/v1/models/{}/versions"
MODEL = "chat"


async def serving_edge(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, tmp_path: Path, **generation: object
) -> EdgeServer:
    """An edge serving the language model "chat" version 1 (a tiny random decoder)."""
    folder = build_decoder(tmp_path / "tiny")
    files = [("file", ("model.onnx", (folder / "model.onnx").read_bytes()))]
    files += [("data", (p.name, p.read_bytes())) for p in sorted(folder.iterdir()) if p.name != "model.onnx"]
    assert (await api.post(PUSH.format(MODEL), files=files)).status_code == 201
    edge = await make_edge("e1", central, generation={"intra_op_threads": 1, "max_waiting": 256, **generation})
    await wait_for(lambda: edge.edge.repository.serves(MODEL), what="chat served", timeout=60)
    return edge


@pytest.fixture
async def lm_edge(central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, tmp_path: Path) -> EdgeServer:
    """An edge serving "chat" without a prefix cache."""
    return await serving_edge(central, api, make_edge, tmp_path, prefix_cache=False)


@pytest.fixture
async def http(lm_edge: EdgeServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{lm_edge.http_port}", timeout=30) as client:
        yield client


@pytest.fixture
async def client(lm_edge: EdgeServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{lm_edge.http_port}/v1", api_key="none") as c:
        yield c


def sse_events(body: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    assert body.endswith("\n\n")
    return [block.removeprefix("data: ") for block in body.strip().split("\n\n")]


async def test_the_openai_client_completes_streaming_or_not_with_the_same_greedy_text(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    assert [m.id for m in (await client.models.list()).data] == [MODEL]
    whole = await client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=12, temperature=0)
    assert whole.choices[0].finish_reason in ("stop", "length") and whole.usage is not None
    assert whole.usage.completion_tokens >= 1 and whole.usage.prompt_tokens >= 1
    stream = await client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=12, temperature=0, stream=True)
    streamed = "".join([c.choices[0].text async for c in stream if c.choices])
    assert streamed == whole.choices[0].text

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "import os"}]
    chat = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)  # type: ignore[arg-type]
    assert chat.choices[0].message.role == "assistant" and chat.usage is not None
    chunks = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    parts, finish, usage = [], None, None
    async for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(parts) == chat.choices[0].message.content
    assert finish == chat.choices[0].finish_reason and usage == chat.usage

    # Raw SSE: data: {json} chunks, the finish_reason, then [DONE].
    body = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 12, "temperature": 0, "stream": True}
    raw = await http.post("/v1/completions", json=body)
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    events = sse_events(raw.text)
    assert events[-1] == "[DONE]"
    chunks_raw = [orjson.loads(e) for e in events[:-1]]
    assert chunks_raw[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert "".join(c["choices"][0]["text"] for c in chunks_raw) == whole.choices[0].text


async def test_a_chats_next_turn_finds_the_conversation_so_far_cached(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    edge = await serving_edge(central, api, make_edge, tmp_path, block_tokens=16)
    engine = edge.edge.repository.get(MODEL).engine
    assert engine is not None
    tokenizer = engine.tokenizer
    url = f"http://127.0.0.1:{edge.http_port}/v1"
    messages = [{"role": "system", "content": "Answer in code. " * 8}, {"role": "user", "content": "import os"}]
    async with openai.AsyncOpenAI(base_url=url, api_key="none") as client:
        chunks = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=24, temperature=1.0, seed=7, stream=True,  # type: ignore[arg-type]
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )  # fmt: skip
        parts, ids = [], []
        async for chunk in chunks:
            ids += (chunk.model_extra or {}).get("token_ids") or []
            parts += [c.delta.content or "" for c in chunk.choices]
        reply = "".join(parts)
        # the reply's text does not encode back to the ids generated: the next turn would
        # recompute it from where they part, had the edge not warmed the turn when it ended
        assert tokenizer.encode(reply, add_special_tokens=False) != ids
        await wait_for(lambda: engine.stats().warmed_tokens > 0, what="the turn warmed", timeout=30)
        history = [*messages, {"role": "assistant", "content": reply}]
        text = tokenizer.render_chat(history, add_generation_prompt=False)
        rendered = tokenizer.encode(text, add_special_tokens=False)
        second = await client.chat.completions.create(
            model=MODEL, messages=[*history, {"role": "user", "content": "print(os.sep)"}],  # type: ignore[arg-type]
            max_tokens=4, temperature=0,
        )  # fmt: skip
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens == len(rendered)
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"http://127.0.0.1:{edge.http_port}/metrics")).text
    assert re.search(r'^modelfleet_generation_warmed_tokens_total\{model_name="chat"\} [1-9]', metrics, re.M)


async def test_oip_generate_and_model_metadata(http: httpx.AsyncClient) -> None:
    meta = (await http.get(f"/v2/models/{MODEL}")).json()
    assert "/v1/chat/completions" in meta["parameters"]["served_by"]
    assert (await http.get(f"/v2/models/{MODEL}/ready")).json()["ready"] is True
    body = {"text_input": "class A:", "parameters": {"max_tokens": 8, "temperature": 0}}
    whole = (await http.post(f"/v2/models/{MODEL}/generate", json=body)).json()
    assert whole["model_name"] == MODEL and whole["model_version"] == "1"
    raw = await http.post(f"/v2/models/{MODEL}/generate_stream", json=body)
    steps = [orjson.loads(e) for e in sse_events(raw.text)]
    assert "".join(s["text_output"] for s in steps) == whole["text_output"]
    assert (await http.post(f"/v2/models/{MODEL}/infer", json={"inputs": []})).status_code == 400


BAD = [
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 10**9}, 400, None),
    ({"prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ({"prompt": "x", "stop": [f"s{i}" for i in range(100)]}, 400, "stop"),
    ({"prompt": "x", "n": 2}, 400, "n"),
    ({"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ({"prompt": "x", "model": "nope"}, 404, None),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_bad_input_gets_a_clear_4xx_in_openais_shape(http: httpx.AsyncClient, stream: bool) -> None:
    for extra, status, param in BAD:
        body = {"model": MODEL, "stream": stream, **extra}
        response = await http.post("/v1/completions", json=body)
        assert response.status_code == status, (extra, response.text)
        error = response.json()["error"]
        assert error["message"] and error["type"] and (param is None or error["param"] == param), (extra, error)
    chat = {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}
    response = await http.post("/v1/chat/completions", json=chat)
    assert response.status_code == 400 and "role" in response.json()["error"]["message"]
    response = await http.post("/v1/completions", content=b'{"model": "chat", "prompt": "\xff\xfe"}')
    assert response.status_code == 400


async def test_cancelled_streams_leave_no_slot_taken(lm_edge: EdgeServer, http: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 200, "temperature": 0.8, "stream": True,
            "ignore_eos": True}  # fmt: skip

    async def cancel_one() -> None:
        async with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code in (200, 429), await response.aread()
            async for _ in response.aiter_bytes():
                break  # hang up after the first chunk

    await asyncio.gather(*(cancel_one() for _ in range(100)))
    engine = lm_edge.edge.repository.get(MODEL).engine
    assert engine is not None
    await wait_for(lambda: engine.stats().running == 0 and engine.stats().waiting == 0, what="slots freed")
    await wait_for(lambda: lm_edge.edge.plane.inflight == 0, what="in-flight places freed")
    assert engine.stats().kv_blocks_used == 0  # the fixture's edge keeps no prefix cache


async def test_a_thousand_streams_at_once_are_served_or_told_to_retry(lm_edge: EdgeServer) -> None:
    """1,000 streams opened at once: each is served (200) or refused with 429 and Retry-After
    (the waiting queue is full), none gets a 5xx, and nothing stays taken after."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": 3, "temperature": 0, "stream": True, "ignore_eos": True}
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=0)
    url = f"http://127.0.0.1:{lm_edge.http_port}"
    statuses: list[int] = []

    async def one(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            await response.aread()
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert response.headers["retry-after"] and response.json()["error"]["code"]

    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        await asyncio.gather(*(one(client) for _ in range(1000)))
    assert len(statuses) == 1000 and set(statuses) <= {200, 429} and statuses.count(200) >= 16
    engine = lm_edge.edge.repository.get(MODEL).engine
    assert engine is not None
    await wait_for(lambda: engine.stats().running == 0 and engine.stats().waiting == 0, what="slots freed")
    await wait_for(lambda: lm_edge.edge.plane.inflight == 0, what="in-flight places freed")


async def test_metrics_carry_vllm_names(http: httpx.AsyncClient) -> None:
    await http.post("/v1/completions", json={"model": MODEL, "prompt": "x = 1", "max_tokens": 4})
    text = (await http.get("/metrics")).text
    for name in ("vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_count",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_requests_running",
                 "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:inter_token_latency_seconds_count"):  # fmt: skip
        assert re.search(rf'^{re.escape(name)}{{[^}}]*model_name="{MODEL}"', text, re.MULTILINE), name


async def test_metrics_say_where_each_time_to_first_token_went(http: httpx.AsyncClient) -> None:
    await http.post("/v1/completions", json={"model": MODEL, "prompt": "def g(y): return y", "max_tokens": 4})
    text = (await http.get("/metrics")).text

    def value(name: str) -> float:
        found = re.search(rf'^{re.escape(name)}{{[^}}]*model_name="{MODEL}"[^}}]*}} (\S+)$', text, re.MULTILINE)
        assert found, name
        return float(found.group(1))

    streams = value("vllm:time_to_first_token_seconds_count")
    assert streams >= 1
    # every stream's first token: its wait for a row, then admission to first token, within its TTFT
    assert value("vllm:request_queue_time_seconds_count") == value("vllm:request_prefill_time_seconds_count") == streams
    spent = value("vllm:request_queue_time_seconds_sum") + value("vllm:request_prefill_time_seconds_sum")
    assert 0 < spent <= value("vllm:time_to_first_token_seconds_sum")
    assert (
        value("modelfleet_generation_prefill_seconds_total") > 0
        and value("modelfleet_generation_decode_seconds_total") > 0
    )
    assert 0 < value("modelfleet_generation_prefilled_tokens_total") <= value("vllm:prompt_tokens_total")


async def test_a_long_answer_is_gzipped_and_a_stream_is_not(http: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 300, "ignore_eos": True, "seed": 1}
    whole = await http.post("/v1/completions", json=body, headers={"Accept-Encoding": "gzip"})
    assert whole.headers.get("content-encoding") == "gzip" and whole.json()["usage"]["completion_tokens"] == 300
    stream = await http.post("/v1/completions", json={**body, "stream": True}, headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in stream.headers and stream.text.endswith("data: [DONE]\n\n")


async def test_the_cli_generates_and_chats_through_the_api(
    lm_edge: EdgeServer, client: openai.AsyncOpenAI, tmp_path: Path
) -> None:
    """``modelfleet generate`` prints what the API answers (greedy: the same text streamed or
    not); ``modelfleet chat`` streams each reply and keeps the history; a bad request is one line."""
    expected = (await client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=8, temperature=0)).choices[
        0
    ]
    config = tmp_path / "cli.toml"
    config.write_text("", encoding="utf-8")
    env = {"MODELFLEET_CONFIG": str(config), "MODELFLEET_URL": f"http://127.0.0.1:{lm_edge.http_port}",
           "MODELFLEET_TOKEN": "", "COLUMNS": "200"}  # fmt: skip

    def cli(*args: str, stdin: str | None = None) -> Any:
        return CliRunner().invoke(app, list(args), env=env, input=stdin)

    plain = await asyncio.to_thread(cli, "generate", MODEL, "def f(x):", "--max-tokens", "8")
    assert plain.exit_code == 0, plain.output
    assert plain.stdout.startswith(expected.text) and f"finish_reason {expected.finish_reason}" in plain.stdout
    streamed = await asyncio.to_thread(cli, "generate", MODEL, "def f(x):", "--max-tokens", "8", "--stream")
    assert streamed.exit_code == 0 and streamed.stdout.rstrip("\n") == expected.text.rstrip("\n")

    talk = await asyncio.to_thread(cli, "chat", MODEL, "--max-tokens", "4", "--temperature", "0", stdin="hi\nmore\n\n")
    assert talk.exit_code == 0, talk.output
    assert talk.stdout.count("> ") == 3  # two turns answered, then the empty line ends it

    refused = await asyncio.to_thread(cli, "generate", "no-such-model", "x")
    assert refused.exit_code == 1 and "refused (404)" in refused.output


async def test_the_heartbeat_carries_the_engines_tokens_per_second_and_queue(
    lm_edge: EdgeServer, client: openai.AsyncOpenAI
) -> None:
    """Each heartbeat reports a language model's tokens/s since the last one, running, waiting
    and KV usage, and the fields survive the wire (decoded as central decodes them)."""

    def beat() -> ModelInfo:
        body = lm_edge.edge._heartbeat_sources().snapshot()
        hb = Heartbeat(node_id="e1", bdseq=0, seq=0, ts=0, interval_s=1.0, models=list(body.models))
        decoded = decode_heartbeat(hb.model_dump_json().encode())
        return model_info(next(m for m in decoded.models if m.name == MODEL))

    before = beat().generation  # marks the start of the rate
    assert before is not None and before.ttft_p50_ms is None and before.ttft_p99_ms is None  # no stream yet
    await client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=16, temperature=0)
    info = beat().generation
    assert info is not None and info.tokens_per_s > 0 and info.running == 0 and info.waiting == 0
    assert 0 <= info.kv_usage <= 1
    # the TTFT percentiles of the version's recent streams: one stream, so both are its TTFT
    assert info.ttft_p50_ms is not None and info.ttft_p50_ms > 0 and info.ttft_p99_ms == info.ttft_p50_ms


async def test_curl_reads_the_stream_as_server_sent_events(lm_edge: EdgeServer, client: openai.AsyncOpenAI) -> None:
    """``curl -N`` (no buffering), as people try an API first: ``data:`` events whose deltas
    add up to the non-streamed greedy answer, then ``data: [DONE]``."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "import os"}], "max_tokens": 8, "temperature": 0}
    whole = await client.chat.completions.create(**body)  # type: ignore[call-overload]
    curl = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-N", f"http://127.0.0.1:{lm_edge.http_port}/v1/chat/completions",
        "-H", "Content-Type: application/json", "-d", orjson.dumps({**body, "stream": True}).decode(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await curl.communicate()
    assert curl.returncode == 0, err
    events = sse_events(out.decode())
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole.choices[0].message.content
