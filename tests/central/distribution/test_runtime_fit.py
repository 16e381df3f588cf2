"""Which artifacts of a version a node's ONNX Runtime loads, from the formats the push report
recorded: every one (nothing forced), some (the first that loads is forced), none (refused,
saying why); an edge that reported nothing is taken to run central's runtime."""

from __future__ import annotations

from typing import Any

from central.distribution.runtime_fit import RuntimeFit, fit_version
from fleetwire.manifest import ArtifactRef, Manifest
from fleetwire.runtime_limits import FORMATS_KEY, ModelFormat, RuntimeLimits, manifest_formats

OLD = RuntimeLimits("onnxruntime 1.17.0", max_ir_version=9, max_opsets={"": 20, "ai.onnx.ml": 4})
NEW = RuntimeLimits("onnxruntime 1.31.1", max_ir_version=13, max_opsets={"": 26, "ai.onnx.ml": 5})


def _manifest(formats: dict[str, dict[str, Any]], artifacts: tuple[str, ...] = ("fp32",)) -> Manifest:
    def ref(name: str) -> ArtifactRef:
        return ArtifactRef(artifact=name, sha256=name, size=1, chunks=[])

    return Manifest(
        name="m",
        version="1",
        sha256=artifacts[0],
        size=1,
        chunks=[],
        created_at="2026-01-01T00:00:00Z",
        artifact=artifacts[0],
        alternatives=[ref(a) for a in artifacts[1:]],
        quantization={FORMATS_KEY: formats},
    )


def _format(ir: int, opset: int, **more: int) -> dict[str, Any]:
    return ModelFormat(ir, {"": opset, **more}).as_json()


def test_a_runtime_that_loads_every_artifact_forces_none() -> None:
    m = _manifest({"fp32": _format(9, 17), "int8": _format(9, 17)}, ("fp32", "int8"))
    fit = fit_version(m, manifest_formats(m.quantization), OLD)
    assert fit.every and fit.refusal is None and fit.loadable == ("fp32", "int8")
    assert fit.artifact_for(None) is None and fit.artifact_for("int8") == "int8"


def test_when_only_some_load_the_first_of_them_is_forced_unless_another_rule_chose_one_that_loads() -> None:
    formats = {"int8": _format(10, 21), "fp32": _format(10, 21), "fp32-opset20": _format(9, 20)}
    m = _manifest(formats, ("int8", "fp32", "fp32-opset20"))
    fit = RuntimeFit(lambda _: OLD).check("edge-0", m)
    assert not fit.every and fit.loadable == ("fp32-opset20",) and fit.refusal is None
    assert fit.artifact_for(None) == "fp32-opset20" and fit.artifact_for("fp32") == "fp32-opset20"


def test_when_none_loads_the_node_is_refused_with_the_default_artifacts_reason() -> None:
    m = _manifest({"fp32": _format(9, 21)})
    fit = RuntimeFit(lambda _: OLD).check("edge-0", m)
    assert fit.loadable == () and fit.artifact_for(None) is None
    assert fit.refusal == (
        "m:1, its only artifact: fp32: opset 21 of ai.onnx is newer than opset 20, the newest onnxruntime 1.17.0 loads"
    )
    ml = _manifest({"fp32": _format(8, 17, **{"ai.onnx.ml": 5})})
    assert "opset 5 of ai.onnx.ml" in (RuntimeFit(lambda _: OLD).check("edge-0", ml).refusal or "")
    ir = _manifest({"fp32": _format(10, 17)})
    assert "IR version 10 is newer than IR 9" in (RuntimeFit(lambda _: OLD).check("edge-0", ir).refusal or "")


def test_unknown_formats_and_unknown_runtimes_are_taken_to_load() -> None:
    pushed_before = _manifest({})  # a version pushed before central recorded formats
    assert RuntimeFit(lambda _: OLD).check("edge-0", pushed_before).every
    m = _manifest({"fp32": _format(10, 21)})
    silent = RuntimeFit(lambda _: None, own=lambda: NEW)  # an edge that did not report its runtime
    assert silent.runtime("edge-0") == NEW and silent.check("edge-0", m).every
    assert RuntimeFit(lambda _: OLD, own=lambda: NEW).check("edge-0", m).refusal is not None
