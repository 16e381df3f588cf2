"""The manifest: the one description of a model version that central, edges, the
REST API and the gRPC stream all agree on."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class TensorSpec(BaseModel):
    """One input or output of a model; ``-1`` marks a variable dimension."""

    model_config = ConfigDict(frozen=True)

    name: str
    dtype: str = Field(description="numpy dtype name, e.g. float32")
    shape: list[int]


class ChunkRef(BaseModel):
    """One content-defined chunk of the model file, in file order."""

    model_config = ConfigDict(frozen=True)

    digest: str
    size: int


class Manifest(BaseModel):
    """Name, version, whole-file digest, ordered chunks and signature of a version."""

    name: str
    version: str
    sha256: str
    size: int
    chunks: list[ChunkRef]
    inputs: list[TensorSpec] = Field(default_factory=list)
    outputs: list[TensorSpec] = Field(default_factory=list)
    created_at: str
    labels: dict[str, str] = Field(default_factory=dict)
    artifact: str = Field("fp32", description="Which file the chunks make up: int8 or fp32.")
    quantization: dict[str, Any] | None = Field(
        None, description="The push's quantization report: method, per-channel, sizes, agreement, seconds."
    )
    signature: str = Field(
        "", description="Central's Ed25519 signature (hex) over the other fields; see fleetwire.signing."
    )

    @property
    def key(self) -> tuple[str, str]:
        """``(name, version)``: the identity of a version across the fleet."""
        return (self.name, self.version)

    def unique_chunks(self) -> list[ChunkRef]:
        """Chunks in file order with repeats removed (identical blocks dedupe)."""
        seen: set[str] = set()
        out: list[ChunkRef] = []
        for c in self.chunks:
            if c.digest not in seen:
                seen.add(c.digest)
                out.append(c)
        return out
