"""Which artifact a node serves without timing: pin, single artifact, its own earlier choice,
central's verdict for its class; and the served copy of a manifest still verifies."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge_node.inference.artifact_timer import PIN_LABEL, ArtifactChoice
from edge_node.sync.chooser import ArtifactChooser, served_as, signed_form
from edge_node.sync.saved_choices import SavedChoices
from edge_node.sync.state import DesiredVersion, SharedVerdict, state_from_pb
from fleetwire.convert import manifest_to_pb
from fleetwire.manifest import ArtifactRef, ChunkRef, Manifest
from fleetwire.signing import SignatureError, raw_public_key, sign_manifest, verify_manifest
from fleetwire.v1 import registry_pb2

CLASS = "x86_64/avx2/2c/cpu"
KEY = Ed25519PrivateKey.generate()


def _chunks(tag: str, n: int = 2) -> list[ChunkRef]:
    return [ChunkRef(digest=f"{tag}{i}".ljust(64, "0"), size=10) for i in range(n)]


def _ref(name: str) -> ArtifactRef:
    return ArtifactRef(artifact=name, sha256=f"sha-{name}", size=20, chunks=_chunks(name[-1]))


def _manifest(labels: dict[str, str] | None = None, alternatives: tuple[str, ...] = ("fp32", "int8-b")) -> Manifest:
    m = Manifest(
        name="m",
        version="1",
        sha256="sha-int8-a",
        size=20,
        chunks=_chunks("a"),
        created_at="2026-01-01T00:00:00Z",
        labels=labels or {},
        artifact="int8-a",
        quantization={"recipe": "a"},
        alternatives=[_ref(a) for a in alternatives],
    )
    return sign_manifest(m, KEY)


def _version(m: Manifest, verdict: SharedVerdict | None = None) -> DesiredVersion:
    return DesiredVersion(manifest=m, serve=True, placement={}, verdict=verdict)


def _timing_chooser(tmp_path: Path | None = None) -> ArtifactChooser:
    """A chooser that would time (a timer is set; it is never reached in these tests)."""
    records = SavedChoices(tmp_path / "choices.json") if tmp_path is not None else None
    return ArtifactChooser(CLASS, "edge-b", timer=object(), saved=records)  # type: ignore[arg-type]


def test_a_served_copy_rebuilds_the_signed_manifest() -> None:
    m = _manifest()
    copy = served_as(m, "int8-b")
    assert (copy.artifact, copy.sha256, copy.chunks, copy.quantization) == ("int8-b", "sha-int8-b", _chunks("b"), None)
    assert {a.artifact for a in copy.artifacts()} == {"int8-a", "fp32", "int8-b"}
    with pytest.raises(SignatureError):
        verify_manifest(copy, raw_public_key(KEY))
    original = signed_form(copy)
    assert original == m
    verify_manifest(original, raw_public_key(KEY))
    assert served_as(m, "int8-a") is m and signed_form(m) is None
    tampered = copy.model_copy(update={"sha256": "sha-evil"})
    assert signed_form(tampered) is None


def test_without_a_verdict_every_artifact_is_fetched_to_be_timed() -> None:
    version = _version(_manifest())
    chooser = _timing_chooser()
    assert chooser.decided(version) is None
    assert [a.artifact for a in chooser.plan(version)] == ["int8-a", "fp32", "int8-b"]
    every = {c.digest for tag in ("a", "2", "b") for c in _chunks(tag)}  # int8-a, fp32, int8-b
    assert {c.digest for c in chooser.serving_chunks(version)} == every


def test_a_verdict_for_the_class_means_only_its_artifact() -> None:
    verdict = SharedVerdict("int8-b", CLASS, "edge-a", speedup_b1=1.9, speedup_b8=1.7)
    version = _version(_manifest(), verdict)
    choice = _timing_chooser().decided(version)
    assert choice == ArtifactChoice(
        "int8-b", CLASS, "verdict", f"verdict of class {CLASS} from node edge-a", 1.9, 1.7, "edge-a"
    )
    assert _timing_chooser().serving_chunks(version) == _chunks("b")


def test_a_pin_wins_over_the_verdict_and_a_pin_of_no_artifact_is_ignored() -> None:
    verdict = SharedVerdict("int8-b", CLASS, "edge-a")
    pinned = _timing_chooser().decided(_version(_manifest({PIN_LABEL: "fp32"}), verdict))
    assert pinned is not None and (pinned.artifact, pinned.source) == ("fp32", "pinned")
    unknown = _timing_chooser().decided(_version(_manifest({PIN_LABEL: "int4"}), verdict))
    assert unknown is not None and unknown.source == "verdict"


def test_one_artifact_or_timing_off_needs_no_timing() -> None:
    only = _timing_chooser().decided(_version(_manifest(alternatives=())))
    assert only is not None and (only.artifact, only.source, only.reason) == ("int8-a", "only", "only int8-a")
    off = ArtifactChooser(CLASS, "edge-b").decided(_version(_manifest()))
    assert off is not None and (off.artifact, off.source) == ("int8-a", "default")


def test_an_own_timing_is_kept_across_restarts_for_the_same_class_and_manifest(tmp_path: Path) -> None:
    m = _manifest()
    measured = ArtifactChoice("fp32", CLASS, "measured", "fastest of 3 on this node", 1.0, 1.0, "edge-b")
    _timing_chooser(tmp_path).adopt(m, measured)
    assert _timing_chooser(tmp_path).decided(_version(m, SharedVerdict("int8-b", CLASS, "edge-a"))) == measured
    records = SavedChoices(tmp_path / "choices.json")
    other_class = ArtifactChooser("x86_64/avx2+avx512_vnni/2c/cpu", "edge-b", object(), records)  # type: ignore[arg-type]
    assert other_class.decided(_version(m)) is None
    repushed = sign_manifest(m.model_copy(update={"created_at": "2026-02-01T00:00:00Z"}), KEY)
    assert _timing_chooser(tmp_path).decided(_version(repushed)) is None
    chooser = _timing_chooser(tmp_path)
    chooser.keep([])
    assert _timing_chooser(tmp_path).decided(_version(m)) is None


def test_central_forcing_an_artifact_beats_pin_verdict_and_own_choice_until_it_ends() -> None:
    pinned = _manifest(labels={PIN_LABEL: "int8-b"})
    verdict = SharedVerdict("int8-b", CLASS, "edge-a")
    chooser = _timing_chooser()
    forced = DesiredVersion(manifest=pinned, serve=True, placement={}, verdict=verdict, force_artifact="fp32")
    choice = chooser.decided(forced)
    assert choice is not None and (choice.artifact, choice.source, choice.reason) == (
        "fp32",
        "central",
        "fallback by central",
    )
    chooser.adopt(pinned, choice)
    # The order ends: the node's own decision again, not the fallback it was serving.
    back = chooser.decided(_version(pinned, verdict))
    assert back is not None and (back.artifact, back.source) == ("int8-b", "pinned")
    unknown = DesiredVersion(manifest=pinned, serve=True, placement={}, force_artifact="int8-zz")
    assert chooser.decided(unknown) is not None and chooser.decided(unknown).artifact == "int8-b"  # type: ignore[union-attr]


def test_an_int8_artifact_checked_on_live_traffic_has_fp32_fetched_beside_it() -> None:
    verdict = SharedVerdict("int8-a", CLASS, "edge-a")
    shadowing = ArtifactChooser(CLASS, "edge-b", timer=object(), shadow_sample=0.01)  # type: ignore[arg-type]
    assert [a.artifact for a in shadowing.plan(_version(_manifest(), verdict))] == ["int8-a", "fp32"]
    off = _manifest(labels={"modelfleet.drift_policy": "off"})
    assert [a.artifact for a in shadowing.plan(_version(off, verdict))] == ["int8-a"]
    # int8-b carries no quantization report in these manifests: not INT8 as far as sampling knows
    assert [a.artifact for a in shadowing.plan(_version(_manifest(), SharedVerdict("int8-b", CLASS, "e")))] == [
        "int8-b"
    ]
    assert [a.artifact for a in _timing_chooser().plan(_version(_manifest(), verdict))] == ["int8-a"]


def test_a_language_model_served_in_4_bits_has_fp32_fetched_beside_it_only_when_sampled() -> None:
    """The generative shadow scores a sample of its generations with FP32 (teacher-forced), so the
    reference comes along as for a tensor model's INT8; with sampling off it stays away."""
    decoder = sign_manifest(_manifest().model_copy(update={"kind": "decoder", "signature": ""}), KEY)
    version = _version(decoder, SharedVerdict("int8-a", CLASS, "e"))
    shadowing = ArtifactChooser(CLASS, "edge-b", timer=object(), shadow_sample=0.01)  # type: ignore[arg-type]
    assert [a.artifact for a in shadowing.plan(version)] == ["int8-a", "fp32"]
    quiet = ArtifactChooser(CLASS, "edge-b", timer=object(), shadow_sample=0.0)  # type: ignore[arg-type]
    assert [a.artifact for a in quiet.plan(version)] == ["int8-a"]


def test_the_desired_state_carries_central_s_fallback_order() -> None:
    pb = registry_pb2.DesiredState(generation=3)
    pb.versions.add(serve=True, force_artifact="fp32").manifest.CopyFrom(manifest_to_pb(_manifest()))
    pb.versions.add(serve=True).manifest.CopyFrom(manifest_to_pb(_manifest()))
    first, second = state_from_pb(pb).versions
    assert first.force_artifact == "fp32" and second.force_artifact is None
