"""The dashboard's "Language models" panel: one row per node and language-model version it
serves, with what that version's engine reported in the node's last heartbeat
(``ModelInfo.generation``): tokens/s since the previous beat, sequences running and waiting,
KV cache usage, and the TTFT p50/p99 of its recent streams.

Built from the node rows the snapshot already made (liveness and heartbeats) and the
registry's versions (the model's kind), so it costs no extra read of either."""

from __future__ import annotations

from typing import Any

from central.storage.protocols import VersionRecord
from fleetwire.manifest import KIND_DECODER

__all__ = ["language_models_section"]


def language_models_section(versions: dict[str, list[VersionRecord]], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """``rows`` (by node, then model and version) and ``tokens_per_s``, the sum over the rows
    of nodes not dead; ``declared`` names the language models the registry holds, served or not."""
    kinds = {(name, r.version): r.manifest.kind for name, records in versions.items() for r in records}
    rows = [
        _row(node, model, kinds.get((model["name"], model["version"])))
        for node in nodes
        for model in node["models"]
        if model.get("generation") is not None
    ]
    rows.sort(key=lambda r: (r["node_id"], r["model"], r["version"]))
    return {
        "rows": rows,
        "tokens_per_s": round(sum(r["tokens_per_s"] for r in rows if r["node_state"] != "dead"), 3),
        "declared": sorted(
            name for name, records in versions.items() if records and records[0].manifest.is_language_model
        ),
    }


def _row(node: dict[str, Any], model: dict[str, Any], kind: str | None) -> dict[str, Any]:
    generation: dict[str, Any] = model["generation"]
    choice = model.get("choice") or {}
    return {
        "node_id": node["node_id"],
        "node_state": node["state"],
        "model": model["name"],
        "version": model["version"],
        # A version central no longer lists (pruned) still generates: only a decoder does.
        "kind": kind or KIND_DECODER,
        "state": model["state"],
        "artifact": choice.get("artifact"),
        "tokens_per_s": generation.get("tokens_per_s", 0.0),
        "running": generation.get("running", 0),
        "waiting": generation.get("waiting", 0),
        "kv_usage": generation.get("kv_usage", 0.0),
        "ttft_p50_ms": generation.get("ttft_p50_ms"),
        "ttft_p99_ms": generation.get("ttft_p99_ms"),
    }
