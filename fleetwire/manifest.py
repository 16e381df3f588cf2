"""The manifest: the one description of a model version that central, edges, the
REST API and the gRPC stream all agree on.

A version is served as one *artifact* (``fp32``, or an INT8 recipe such as
``int8-u8s8-qdq``). An artifact is one ``.onnx`` file (``sha256``/``size``/``chunks``)
plus, for models that keep their weights outside the graph (ONNX external data, which
every model over 2 GiB needs), the extra ``files`` it references by relative path.
Other artifacts of the same version that passed the accuracy guard travel as
``alternatives``, so an edge can serve the one that is fastest on its own CPU.

A version's ``kind`` says how it is served: ``tensor`` (the default: a fixed-signature
model served by OIP ``infer``) or ``decoder`` (a language model: a KV-cache decoder graph
with its tokenizer and generation config as ``files`` of every artifact, served by the
OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions`` and OIP ``generate``)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

#: A file name inside a version's directory: no separators, no leading dot, no "..".
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
#: The name every artifact's graph file gets on disk, next to its external data files.
MODEL_FILE = "model.onnx"
#: ``Manifest.kind`` of a fixed-signature model (OIP ``infer``).
KIND_TENSOR = "tensor"
#: ``Manifest.kind`` of a language model (a KV-cache decoder and its tokenizer).
KIND_DECODER = "decoder"
_MIB = 1024 * 1024
#: Files a language model brings beside its graph (tokenizer, configs, chat template), each
#: name with the largest size central accepts; every artifact of the version carries them.
COMPANION_FILES: dict[str, int] = {
    "genai_config.json": 1 * _MIB,
    "config.json": 1 * _MIB,
    "generation_config.json": 1 * _MIB,
    "tokenizer.json": 64 * _MIB,
    "tokenizer_config.json": 8 * _MIB,
    "special_tokens_map.json": 1 * _MIB,
    "added_tokens.json": 8 * _MIB,
    "chat_template.jinja": 1 * _MIB,
    "chat_template.json": 1 * _MIB,
    "vocab.json": 32 * _MIB,
    "merges.txt": 32 * _MIB,
    "tokenizer.model": 32 * _MIB,
}
#: The APIs that serve each kind, for descriptions (OIP metadata, ``modelfleet models``).
SERVED_BY = {
    KIND_TENSOR: ["/v2/models/{name}/infer"],
    KIND_DECODER: ["/v1/completions", "/v1/chat/completions", "/v2/models/{name}/generate"],
}


class TensorSpec(BaseModel):
    """One input or output of a model; ``-1`` marks a variable dimension."""

    model_config = ConfigDict(frozen=True)

    name: str
    dtype: str = Field(description="numpy dtype name, e.g. float32")
    shape: list[int]


class ChunkRef(BaseModel):
    """One content-defined chunk of a file, in file order."""

    model_config = ConfigDict(frozen=True)

    digest: str
    size: int


def _check_file_name(value: str) -> str:
    if not FILE_NAME.fullmatch(value) or ".." in value or value == MODEL_FILE:
        raise ValueError(f"{value!r} is not a plain file name for a model's data file")
    return value


class FileRef(BaseModel):
    """One file of an artifact beside its graph: an external-data file, by the relative name
    its graph uses, or (a language model) its tokenizer, generation config or chat template."""

    model_config = ConfigDict(frozen=True)

    path: Annotated[str, AfterValidator(_check_file_name)] = Field(
        description="File name next to model.onnx, as the graph's external-data location says."
    )
    sha256: str
    size: int
    chunks: list[ChunkRef]


def _unique(chunks: list[ChunkRef]) -> list[ChunkRef]:
    """``chunks`` in order with repeats removed (identical blocks dedupe)."""
    seen: set[str] = set()
    out: list[ChunkRef] = []
    for c in chunks:
        if c.digest not in seen:
            seen.add(c.digest)
            out.append(c)
    return out


class ArtifactRef(BaseModel):
    """One servable form of a version: its graph file and its external-data files."""

    model_config = ConfigDict(frozen=True)

    artifact: str = Field(description="fp32, or the INT8 recipe's name, e.g. int8-u8s8-qdq.")
    sha256: str = Field(description="Of the graph file (model.onnx).")
    size: int
    chunks: list[ChunkRef]
    files: list[FileRef] = Field(default_factory=list)
    quantization: dict[str, Any] | None = Field(
        None, description="How this artifact was made and what the guard measured; None for fp32."
    )

    def all_chunks(self) -> list[ChunkRef]:
        """Unique chunks of the graph file and every data file, in file order."""
        return _unique([*self.chunks, *(c for f in self.files for c in f.chunks)])

    @property
    def total_size(self) -> int:
        """Bytes on disk once assembled: the graph file plus every data file."""
        return self.size + sum(f.size for f in self.files)


class Manifest(BaseModel):
    """Name, version, the served artifact's files and chunks, alternatives, signature."""

    name: str
    version: str
    sha256: str
    size: int
    chunks: list[ChunkRef]
    inputs: list[TensorSpec] = Field(default_factory=list)
    outputs: list[TensorSpec] = Field(default_factory=list)
    created_at: str
    labels: dict[str, str] = Field(default_factory=dict)
    artifact: str = Field("fp32", description="Which artifact the chunks make up: fp32 or an INT8 recipe.")
    quantization: dict[str, Any] | None = Field(
        None, description="The push's quantization report: method, per-channel, sizes, agreement, seconds."
    )
    files: list[FileRef] = Field(
        default_factory=list,
        description="Files of the served artifact next to its model.onnx: external data, and a language model's"
        " tokenizer, config and chat template.",
    )
    alternatives: list[ArtifactRef] = Field(
        default_factory=list,
        description="Other artifacts of this version that passed the guard (FP32 always); an edge may serve one.",
    )
    pending: list[ArtifactRef] = Field(
        default_factory=list,
        description="INT8 candidates that agreed on every guard sample but too few to prove the threshold: "
        "edges run them beside the served FP32 on a sample of live traffic, and serve one only once central "
        "promotes it (a new manifest with it among the alternatives).",
    )
    kind: str = Field(
        KIND_TENSOR,
        description="tensor (served by OIP infer) or decoder (a language model: completions, chat, generate).",
    )
    signature: str = Field(
        "", description="Central's Ed25519 signature (hex) over the other fields; see fleetwire.signing."
    )

    @property
    def key(self) -> tuple[str, str]:
        """``(name, version)``: the identity of a version across the fleet."""
        return (self.name, self.version)

    @property
    def is_language_model(self) -> bool:
        """Whether this version is a language model (``kind`` decoder)."""
        return self.kind == KIND_DECODER

    def served(self) -> ArtifactRef:
        """The default artifact (the one the top-level fields describe) as an ``ArtifactRef``."""
        return ArtifactRef(
            artifact=self.artifact,
            sha256=self.sha256,
            size=self.size,
            chunks=self.chunks,
            files=self.files,
            quantization=self.quantization,
        )

    def artifacts(self) -> list[ArtifactRef]:
        """Every artifact an edge may serve, the default first."""
        return [self.served(), *(a for a in self.alternatives if a.artifact != self.artifact)]

    def artifact_named(self, artifact: str) -> ArtifactRef | None:
        """The artifact called ``artifact`` (servable or pending), or None when this version has none by that name."""
        return next((a for a in [*self.artifacts(), *self.pending] if a.artifact == artifact), None)

    def unique_chunks(self) -> list[ChunkRef]:
        """Chunks of every file of every artifact (pending ones too) with repeats removed: what placement seeds."""
        return _unique([c for a in [*self.artifacts(), *self.pending] for c in a.all_chunks()])
