"""Bring a pushed model within what ONNX Runtime loads, or refuse it saying what to do.

A model can pass ``onnx.checker`` and still fail to load on every edge: the checker knows
the ``onnx`` package's newest IR version and opset, ONNX Runtime those of the older ONNX it
was built with (``runtime_limits``). At push time, then:

- an ``ai.onnx`` opset newer than the runtime's is converted down with ONNX's version
  converter, and the push report says so; when the converter cannot (an operator with no
  older version), a 400 names the model's opset and the newest the runtime loads;
- an ``ai.onnx.ml`` opset newer than the runtime's is a 400 (ONNX has no converter for it);
- an IR version newer than the runtime's is rewritten down when nothing in the model needs
  it (``ir_features``: exporters stamp the newest IR whatever the content), and a 400 that
  names what needs it otherwise.

The graph file is rewritten in place only when something changed, through a temporary file
next to it (external-data locations are relative to it) that ``onnx.checker`` accepts first."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from onnx import version_converter

from central.errors import BadRequest
from central.registry.ir_features import UNKNOWN_IR, required_ir_version
from fleetwire.runtime_limits import DEFAULT_DOMAIN, ML_DOMAIN, RuntimeLimits

#: The C++ source location and assertion wording before the converter's own reason.
_CONVERTER_PREFIX = re.compile(r"^\S+\.(?:h|cc|cpp):\d+: (?:\w+: )?(?:Assertion `[^`]*` failed: )?")


@dataclass
class Compatibility:
    """What was changed to make a model loadable, for the push report."""

    runtime: str
    max_ir_version: int
    max_opset: int
    changes: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        """The push report's ``compatibility`` section."""
        return {
            "runtime": self.runtime,
            "max_ir_version": self.max_ir_version,
            "max_opset": self.max_opset,
            **self.changes,
            "notes": self.notes,
        }


def _opset(model: onnx.ModelProto, domain: str) -> int | None:
    names = {"", "ai.onnx"} if domain == DEFAULT_DOMAIN else {domain}
    versions = [o.version for o in model.opset_import if o.domain in names]
    return max(versions) if versions else None


def _converter_reason(exc: Exception) -> str:
    """``.../no_previous_version.h:23: adapt: Assertion `false` failed: No Previous Version of
    SwiGLU exists`` → ``No Previous Version of SwiGLU exists``."""
    lines = str(exc).strip().splitlines()
    return _CONVERTER_PREFIX.sub("", lines[-1]) if lines else type(exc).__name__


def _fit_opset(model: onnx.ModelProto, limits: RuntimeLimits, compat: Compatibility) -> onnx.ModelProto:
    version, newest = _opset(model, DEFAULT_DOMAIN), compat.max_opset
    if version is None or version <= newest:
        return model
    try:
        converted = version_converter.convert_version(model, newest)
    except Exception as exc:  # the converter raises RuntimeError, ValidationError, ...
        reason = _converter_reason(exc)
        raise BadRequest(
            f"the model uses opset {version} (ai.onnx), newer than opset {newest}, the newest that {limits.runtime}"
            f" loads, and ONNX's version converter cannot convert it down ({reason}); export it again with"
            f" opset {newest} or lower (torch.onnx.export(..., opset_version={newest}))"
        ) from exc
    compat.changes["opset"] = {"from": version, "to": newest}
    compat.notes.append(
        f"opset {version} converted to {newest} with ONNX's version converter: {limits.runtime} loads ai.onnx"
        f" opsets up to {newest}"
    )
    return converted


def _check_ml_opset(model: onnx.ModelProto, limits: RuntimeLimits) -> None:
    version, newest = _opset(model, ML_DOMAIN), limits.max_opset(ML_DOMAIN)
    if version is not None and newest is not None and version > newest:
        raise BadRequest(
            f"the model uses opset {version} of ai.onnx.ml, newer than {newest}, the newest that {limits.runtime}"
            f" loads (ONNX has no converter for ai.onnx.ml); export it again with ai.onnx.ml opset {newest}"
            f" (skl2onnx: target_opset={{'': ..., 'ai.onnx.ml': {newest}}})"
        )


def _fit_ir(model: onnx.ModelProto, limits: RuntimeLimits, compat: Compatibility) -> None:
    stamped, newest = model.ir_version, compat.max_ir_version
    if stamped <= newest:
        return
    need = required_ir_version(model)
    if need.ir_version > newest:
        what = "a data type this central does not know" if need.ir_version == UNKNOWN_IR else f"IR {need.ir_version}"
        raise BadRequest(
            f"the model's IR version {stamped} is newer than IR {newest}, the newest that {limits.runtime} loads, and"
            f" it needs {what} ({need.why}); export it for IR {newest} or older"
        )
    model.ir_version = newest
    compat.changes["ir_version"] = {"from": stamped, "to": newest}
    compat.notes.append(
        f"IR version {stamped} rewritten to {newest}: {limits.runtime} loads IR versions up to {newest}, and the"
        f" model needs no more than IR {need.ir_version}"
    )


def _rewrite(path: Path, model: onnx.ModelProto) -> None:
    """Replace the graph file with ``model``, once the checker accepts it (its data files unchanged)."""
    scratch = path.with_name(f".compat-{path.name}")
    try:
        scratch.write_bytes(model.SerializeToString())
        try:
            onnx.checker.check_model(str(scratch))
        except Exception as exc:
            raise BadRequest(f"the model converted for ONNX Runtime fails the ONNX checker: {exc}") from exc
        os.replace(scratch, path)
    finally:
        scratch.unlink(missing_ok=True)


def fit_model(model: onnx.ModelProto, limits: RuntimeLimits) -> tuple[onnx.ModelProto, Compatibility]:
    """``model`` fitted to ``limits`` (converted down where it must be; ``model`` itself may be
    changed) and what was done; ``BadRequest`` saying why when it cannot be. Used at push time
    for central's own runtime, and for the converted artifacts of nodes with older runtimes
    (``central.registry.conversion``)."""
    newest_opset = limits.max_opset(DEFAULT_DOMAIN)
    assert newest_opset is not None
    compat = Compatibility(limits.runtime, limits.max_ir_version, newest_opset)
    _check_ml_opset(model, limits)
    fitted = _fit_opset(model, limits, compat)
    _fit_ir(fitted, limits, compat)
    return fitted, compat


def make_loadable(path: Path, model: onnx.ModelProto, limits: RuntimeLimits) -> Compatibility:
    """Fit the graph at ``path`` (parsed as ``model``, external data not loaded) to ``limits``,
    rewriting the file when needed; 400 when it cannot be. What was done comes back."""
    fitted, compat = fit_model(model, limits)
    if compat.changes:
        _rewrite(path, fitted)
    return compat
