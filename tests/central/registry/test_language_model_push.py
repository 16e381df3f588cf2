"""Pushes of language models through central's real REST API: the folder ONNX Runtime
GenAI's builder writes (multipart, tar.gz) and a plain decoder with its tokenizer are
versions of kind ``decoder`` whose companion files travel with every artifact; a config,
graph or tokenizer that disagree is a 400 naming the field; weight-only candidates are
made and judged on text, the smallest passing one served."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from central.server import CentralServer
from modelfleet.zoo.llm import eval_text, trained_llm
from support.decoder_models import build_decoder, edit_json
from support.external_data import build_external_mlp, tar_of
from support.fleet import central_settings

PUSH = "/api/v1/models/{}/versions"
GENAI_FILES = ["model.onnx.data", "chat_template.jinja", "genai_config.json", "tokenizer.json", "tokenizer_config.json"]
#: Two candidates keep each push near a second; the third recipe is judged the same way.
QUANTIZE = {"enabled": True, "text": {"recipes": ["int4-b32", "int8-wo"], "max_windows": 8}}


def parts(directory: Path, *extra: tuple[str, bytes], skip: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    """Every file of the folder as multipart parts (the graph as ``file``, the rest as ``data``)."""
    files = [("file", ("model.onnx", (directory / "model.onnx").read_bytes()))]
    for path in sorted(directory.iterdir()):
        if path.name != "model.onnx" and path.name not in skip:
            files.append(("data", (path.name, path.read_bytes())))
    return files + [("data", (name, data)) for name, data in extra]


def error_of(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    return str(response.json()["error"])


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[CentralServer]:
    central = CentralServer(central_settings(tmp_path / "central", quantize=QUANTIZE))
    await central.start()
    yield central
    await central.stop()


@pytest.fixture
async def client(server: CentralServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=120) as api:
        yield api


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_decoder(tmp_path_factory.mktemp("llm") / "tiny")


def fresh(decoder: Path, tmp_path: Path) -> Path:
    """A copy of the decoder's folder a test may edit."""
    target = tmp_path / "copy"
    target.mkdir()
    for path in decoder.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def assert_files(manifest: dict[str, Any], directory: Path) -> None:
    """Every artifact carries the companions byte for byte (and the reference its data file)."""
    for artifact in [manifest, *manifest["alternatives"]]:
        files = {f["path"]: f for f in artifact["files"]}
        for name in GENAI_FILES[1:]:
            assert files[name]["sha256"] == hashlib.sha256((directory / name).read_bytes()).hexdigest()
    fp32 = next(a for a in [manifest, *manifest["alternatives"]] if a["artifact"] == "fp32")
    assert sorted(f["path"] for f in fp32["files"]) == sorted(GENAI_FILES)


async def test_the_genai_folder_is_a_language_model_version_served_as_its_smallest_passing_candidate(
    client: httpx.AsyncClient, decoder: Path
) -> None:
    response = await client.post(PUSH.format("chat"), files=parts(decoder))
    assert response.status_code == 201, response.text
    manifest, report = response.json()["manifest"], response.json()["report"]
    assert manifest["kind"] == "decoder"
    assert_files(manifest, decoder)
    lm = report["language_model"]
    assert (lm["source"], lm["layers"], lm["kv_heads"], lm["vocab_size"]) == ("genai_config.json", 2, 2, 320)
    assert lm["chat_template"] == "chat_template.jinja"
    q = report["quantization"]
    assert q["family"] == "decoder" and q["samples_source"] == "builtin"
    assert set(q["candidates"]) == {"int4-b32", "int8-wo"}
    for candidate in q["candidates"].values():
        guard = candidate["text_guard"]
        assert guard["passed"] and guard["decided_by"] in ("perplexity_ratio", "greedy_agreement")
        assert guard["perplexity_ratio"]["upper_bound"] <= 1.10
        assert guard["greedy_agreement"]["lower_bound"] >= 0.90
    assert manifest["artifact"] == "int4-b32"  # the smallest that passed
    assert [a["artifact"] for a in manifest["alternatives"]] == ["int8-wo", "fp32"]
    assert "static" not in json.dumps(q) and "dynamic" not in json.dumps(q)  # no tensor-model INT8 recipe

    listed = (await client.get("/api/v1/models")).json()
    assert listed[0]["kind"] == "decoder" and "/v1/chat/completions" in listed[0]["served_by"]
    versions = (await client.get("/api/v1/models/chat/versions")).json()
    assert versions[0]["kind"] == "decoder" and "tokenizer.json" in versions[0]["files"]


async def test_a_tar_gz_of_the_folder_and_a_plain_decoder_with_its_tokenizer_are_accepted(
    client: httpx.AsyncClient, decoder: Path, tmp_path: Path
) -> None:
    files: dict[str, bytes | None] = {"tiny/": None}
    files |= {f"tiny/{p.name}": p.read_bytes() for p in sorted(decoder.iterdir())}
    response = await client.post(PUSH.format("tarred"), content=tar_of(files, gz=True))
    assert response.status_code == 201, response.text
    assert response.json()["manifest"]["kind"] == "decoder"

    plain = build_decoder(tmp_path / "optimum", genai=False)
    response = await client.post(PUSH.format("plain"), files=parts(plain), params={"threshold": "0.9"})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["manifest"]["kind"] == "decoder" and body["report"]["language_model"]["source"] == "graph"
    artifacts = {a["artifact"]: a for a in [body["manifest"], *body["manifest"]["alternatives"]]}
    assert sorted(f["path"] for f in artifacts["fp32"]["files"]) == ["model.onnx.data", "tokenizer.json"]
    assert all("tokenizer.json" in [f["path"] for f in a["files"]] for a in artifacts.values())


def _genai(change: dict[str, object]) -> Callable[[Path], None]:
    return lambda d: edit_json(d / "genai_config.json", change)


MISMATCHES: dict[str, tuple[Callable[[Path], None], str]] = {
    "layers": (
        _genai({"model.decoder.num_hidden_layers": 4}),
        "genai_config.json: model.decoder.num_hidden_layers is 4 but the graph has 2 past_key_values pairs",
    ),
    "kv heads": (_genai({"model.decoder.num_key_value_heads": 3}), "model.decoder.num_key_value_heads is 3"),
    "head size": (_genai({"model.decoder.head_size": 8}), "model.decoder.head_size is 8"),
    "vocab vs logits": (_genai({"model.vocab_size": 999}), "model.vocab_size is 999 but the graph's logits have 320"),
    "eos outside the vocabulary": (_genai({"model.eos_token_id": 5000}), "model.eos_token_id is 5000"),
    "input name": (_genai({"model.decoder.inputs.input_ids": "tokens"}), "model.decoder.inputs.input_ids"),
    "graph file name": (_genai({"model.decoder.filename": "decoder.onnx"}), "model.decoder.filename"),
    "special token id": (
        lambda d: edit_json(d / "tokenizer_config.json", {"eos_token": "the"}),
        "tokenizer_config.json: eos_token 'the'",
    ),
    "missing tokenizer": (lambda d: (d / "tokenizer.json").unlink(), "needs its tokenizer.json"),
    "tokenizer that does not load": (lambda d: (d / "tokenizer.json").write_text("{}"), "tokenizer.json does not load"),
    "bad chat template": (
        lambda d: (d / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }"),
        "chat_template.jinja: the chat template does not parse",
    ),
    "config not JSON": (lambda d: (d / "genai_config.json").write_text("{"), "genai_config.json is not valid JSON"),
    "unknown extra file": (lambda d: (d / "notes.txt").write_text("hi"), "'notes.txt'"),
}


@pytest.mark.parametrize("case", MISMATCHES.values(), ids=MISMATCHES.keys())
async def test_a_language_model_whose_files_disagree_is_refused_naming_the_field(
    server: CentralServer, client: httpx.AsyncClient, decoder: Path, tmp_path: Path, case: tuple[Any, str]
) -> None:
    edit, expected = case
    folder = fresh(decoder, tmp_path)
    edit(folder)
    message = error_of(await client.post(PUSH.format("bad"), files=parts(folder)))
    assert expected in message, message
    assert list((server.settings.data_dir / "staging").iterdir()) == []


async def test_a_tokenizer_with_a_model_that_is_not_a_decoder_is_refused(
    client: httpx.AsyncClient, decoder: Path, tmp_path: Path
) -> None:
    graph = build_external_mlp(tmp_path / "mlp", width=16)
    (graph.parent / "tokenizer.json").write_bytes((decoder / "tokenizer.json").read_bytes())
    message = error_of(await client.post(PUSH.format("mlp"), files=parts(graph.parent)))
    assert "'tokenizer.json'" in message and "not a language model" in message


async def test_random_weights_that_4_bits_disturb_fall_back_to_int8_and_the_report_says_why(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    noisy = build_decoder(tmp_path / "noisy", peaked=False)
    eval_text = tmp_path / "eval.txt"
    eval_text.write_text((Path(json.__file__).parent / "decoder.py").read_text() * 2)
    response = await client.post(
        PUSH.format("noisy"), files=[*parts(noisy), ("eval", ("eval.txt", eval_text.read_bytes()))]
    )
    assert response.status_code == 201, response.text
    q = response.json()["report"]["quantization"]
    int4 = q["candidates"]["int4-b32"]["text_guard"]
    assert not int4["passed"] and not int4[int4["decided_by"]]["passed"]  # the measure that failed decided
    assert q["samples_source"] == "eval"
    assert response.json()["manifest"]["artifact"] == q["served"] == "int8-wo"
    assert q["fallback"] == ["int4-b32", "int8-wo", "fp32"]


async def test_the_trained_zoo_model_is_served_in_4_bits_within_the_text_guard(client: httpx.AsyncClient) -> None:
    """The zoo's Llama trained on the stdlib's source, pushed with its held-out text: a 4-bit
    candidate keeps perplexity within 10 % and the greedy next token at least 90 % of the time
    (confidence bounds included), so 4 bits are served, FP32 and the others alternatives."""
    folder = trained_llm()
    response = await client.post(
        PUSH.format("zoo-llm"), files=[*parts(folder), ("eval", ("eval.txt", eval_text().encode()))]
    )
    assert response.status_code == 201, response.text
    manifest, q = response.json()["manifest"], response.json()["report"]["quantization"]
    assert manifest["kind"] == "decoder" and manifest["artifact"].startswith("int4-")
    guard = q["candidates"][manifest["artifact"]]["text_guard"]
    assert guard["passed"] and guard["samples_source"] == "eval"
    assert guard["perplexity_ratio"]["upper_bound"] <= 1.10 and guard["greedy_agreement"]["lower_bound"] >= 0.90
    assert "fp32" in [a["artifact"] for a in manifest["alternatives"]]
