"""An edge times a language model's weight-only artifacts by decode tokens/s and serves the
fastest, never one slower than FP32: a real central makes the candidates of the trained zoo
Llama on push (judged on its held-out text), a real edge fetches every artifact, times them
and reports its choice, the figures in it, through ``/api/v1/status``. Which artifact wins
depends on this machine's CPU; the rule that picked it does not."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from central.server import CentralServer
from edge_node.inference.artifact_timer import ArtifactChoice
from edge_node.settings import ChoiceSettings
from modelfleet.zoo.llm import eval_text, trained_llm
from support.fleet import EdgeFactory, central_settings, version_state

PUSH = "/api/v1/models/{}/versions"
QUANTIZE = {"enabled": True, "text": {"recipes": ["int4-b32", "int4-b128", "int8-wo"], "max_windows": 4}}
#: A few rounds: the test checks what is chosen by which rule, not how fast anything is.
QUICK_CHOICE = {"budget_s": 1.0, "min_rounds": 2, "max_rounds": 4, "warmup_runs": 1}
COMPANIONS = {"genai_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}


@pytest.fixture
async def central(tmp_path: Path) -> AsyncIterator[CentralServer]:
    server = CentralServer(central_settings(tmp_path / "central", quantize=QUANTIZE))
    await server.start()
    yield server
    await server.stop()


async def _push_trained(central: CentralServer) -> dict[str, object]:
    folder = trained_llm()
    files = [("file", ("model.onnx", (folder / "model.onnx").read_bytes()))]
    files += [("data", (p.name, p.read_bytes())) for p in sorted(folder.iterdir()) if p.name != "model.onnx"]
    files.append(("eval", ("eval.txt", eval_text().encode())))
    async with httpx.AsyncClient(base_url=central.http_url, timeout=120) as api:
        response = await api.post(PUSH.format("zoo-llm"), files=files)
    assert response.status_code == 201, response.text
    manifest: dict[str, object] = response.json()["manifest"]
    return manifest


async def test_an_edge_times_a_language_models_artifacts_by_decode_and_serves_the_fastest(
    central: CentralServer, make_edge: EdgeFactory
) -> None:
    manifest = await _push_trained(central)
    alternatives = manifest["alternatives"]
    assert isinstance(alternatives, list)
    artifacts = {str(manifest["artifact"]), *(a["artifact"] for a in alternatives)}
    assert "fp32" in artifacts and len(artifacts) >= 2  # the trained model's 4-bit candidates pass the guard

    edge = await make_edge("e1", central, inference={"choice": QUICK_CHOICE})
    deadline = time.monotonic() + 60
    while version_state(edge, "zoo-llm", "1") != "complete" and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert version_state(edge, "zoo-llm", "1") == "complete"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=10) as client:
        status = (await client.get("/api/v1/status")).json()
    choice = ArtifactChoice.from_json(status["artifacts"]["zoo-llm:1"])

    assert (choice.source, choice.from_node, choice.hardware_class) == ("measured", "e1", status["hardware_class"])
    # Every artifact's decode tokens/s, single stream and batch 8, is in the reason.
    speeds = {a: (int(b1), int(b8)) for a, b1, b8 in re.findall(r"([\w-]+) (\d+)/(\d+)", choice.reason)}
    assert set(speeds) == artifacts and all(b1 > 0 and b8 > 0 for b1, b8 in speeds.values())
    assert choice.speedup_b1 is not None and choice.speedup_b8 is not None
    floor = ChoiceSettings().min_speedup
    if choice.artifact == "fp32":
        assert (choice.speedup_b1, choice.speedup_b8) == (1.0, 1.0)
    else:  # a candidate serves only when it decodes faster than FP32 by the margin, alone and batched
        assert choice.speedup_b1 >= floor and choice.speedup_b8 >= floor

    # The artifact served is on disk with every file of the GenAI folder; the trials are gone.
    served = edge.settings.data_dir / "versions" / "zoo-llm" / "1" / choice.artifact
    assert COMPANIONS | {"model.onnx", "manifest.json"} <= {p.name for p in served.iterdir()}
    assert not any((edge.settings.data_dir / "trials").rglob("model.onnx"))
