"""``modelfleet push FOLDER`` of a language model in ONNX Runtime GenAI's layout: the CLI sends
the graph, its data and the tokenizer, configs and chat template; central stores a decoder
version and the summary says which APIs serve it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cli_harness import Cli

from central.server import CentralServer
from support.decoder_models import build_decoder
from support.fleet import central_settings


@pytest.fixture
async def quantizing_central(tmp_path: Path) -> AsyncIterator[CentralServer]:
    text = {"recipes": ["int4-b32"], "max_windows": 4}
    server = CentralServer(central_settings(tmp_path / "central", quantize={"enabled": True, "text": text}))
    await server.start()
    yield server
    await server.stop()


async def test_the_cli_pushes_a_genai_folder_as_a_language_model(
    tmp_path: Path, quantizing_central: CentralServer
) -> None:
    folder = build_decoder(tmp_path / "tiny")
    cli = Cli(tmp_path, quantizing_central.http_url)
    pushed = await cli("push", str(folder), "--name", "chat", "--json")
    assert pushed.exit_code == 0, pushed.stderr
    manifest = json.loads(pushed.stdout)["manifest"]
    assert manifest["kind"] == "decoder" and manifest["artifact"] == "int4-b32"
    assert {"genai_config.json", "tokenizer.json", "chat_template.jinja"} <= {f["path"] for f in manifest["files"]}

    shown = await cli("push", str(folder / "model.onnx"), "--name", "chat")
    assert shown.exit_code == 0, shown.stderr
    assert "language model" in shown.stdout and "/v1/chat/completions" in shown.stdout
    assert "int4-b32" in shown.stdout and "perplexity" in shown.stdout
