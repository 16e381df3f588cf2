"""What sealing a fleet-wide change costs central: one signature per node (the single form)
against one signature over a Merkle tree of every node's seal (the tree form), in one run.

Usage: ``python -m bench._ha_seal --json out.json [--nodes 10000] [--versions 3] [--repeats 5]``

A fleet of ``--nodes`` nodes holds ``--versions`` signed versions; nodes differ in hardware
class (each class's artifact verdict), site caps and whether they serve a canary, as a real
fleet does. The measured change is a push: every node's state gains the new version and a new
generation. Each node's ``DesiredState`` message is built beforehand (both forms send the same
one); what is timed is only the sealing, with ``time.process_time``:

- single form (before): per node, ``fleetwire.sealing.seal_state`` (encode the seal, sign it);
- tree form (now): ``central.grpc.sealer.seal_batch`` (every seal from cached pieces, the tree,
  one signature) and, per node, its seal and audit path set on its message.

Each timed change is a push (a new version, the oldest retired), ``--repeats`` of them, the
median reported. The tree form's caches then hold the node ids and the pieces of the versions
that did not change, as in a running central; the first change after a start fills them from
nothing and is reported as ``_cold``.

Also measured, per change: building every node's ``DesiredState`` message
(``build_s_per_change``, ``central.grpc.converters.desired_state_to_pb``: each signed
manifest converted once, copied into each node's message) against the conversion before
(``_old``: every manifest converted again for every node, as ``desired_state_from_scratch``
here does), in the same run; the two give equal messages (checked on a sample).

Also measured: a lone state (a node joining or reconnecting) in each form; an edge's check of
one state in each form (``open_seal``); and the real ``SealBatcher`` under the servicer's
pattern (every stream woken by one condition; it seals, then converts its state), which says
how many signatures one change takes and when each node's message is ready, against the
single form (convert, then seal) in the same pattern.

Keys: ``seal_cpu_s_per_change`` (tree form, warm), ``seal_cpu_s_per_change_old``,
``seal_cpu_s_per_change_cold``, ``speedup``, ``build_s_per_change`` and ``_old``,
``seal_cpu_us_per_join`` and ``_old``,
``edge_open_us`` and ``_old``, ``proof_bytes_mean``, ``signatures_per_change``,
``state_ready_s_p50`` / ``_max`` (and ``_old``: the streams' run), ``cpu_flags`` and ``machine``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bench._fleet import write_result
from bench.report import machine
from bench.zoo import cpu_flags
from central.distribution import ArtifactVerdict, DesiredState
from central.distribution.assignment import VersionAssignment
from central.grpc.converters import desired_state_to_pb
from central.grpc.sealer import SealBatcher, SealEncoder, seal_batch
from fleetwire.convert import manifest_to_pb
from fleetwire.manifest import ChunkRef, Manifest
from fleetwire.sealing import open_seal, seal_state
from fleetwire.signing import raw_public_key, sign_manifest
from fleetwire.transfer import DEFAULT_SITE, TransferCaps, caps_to_pb
from fleetwire.v1 import registry_pb2

TARGETS = {"seal_cpu_s_per_change": 0.05}
_CLASSES = ("x86-avx512", "x86-avx2", "arm64", "gpu")
_CAPS = (TransferCaps(), TransferCaps(serve_bytes_per_s=50_000_000), TransferCaps(fetch_bytes_per_s=20_000_000))
_CHUNKS = 8  # per version: the chunks only weigh on the message, not on the seal


class Fleet:
    """Nodes, signed versions and each node's desired state at a generation."""

    def __init__(self, nodes: int, versions: int, key: Ed25519PrivateKey) -> None:
        self.key = key
        self.node_ids = [f"sim-{i:06d}" for i in range(nodes)]
        self.manifests = [self._manifest(str(v + 1)) for v in range(versions)]
        self._pushed = versions

    def _manifest(self, version: str) -> Manifest:
        chunks = [
            ChunkRef(digest=f"{version}:{c}".encode().hex().ljust(64, "0")[:64], size=1 << 20, offset=c << 20)
            for c in range(_CHUNKS)
        ]
        m = Manifest(
            name="model",
            version=version,
            sha256="ab" * 32,
            size=_CHUNKS << 20,
            chunks=chunks,
            created_at="2026-12-05T00:00:00Z",
        )
        return sign_manifest(m, self.key)

    def push(self) -> None:
        """A new version, the oldest retired: the fleet-wide change measured."""
        self._pushed += 1
        self.manifests = [*self.manifests[1:], self._manifest(str(self._pushed))]

    def states(self, generation: int) -> list[DesiredState]:
        """Every node's state; the newest version is a canary on one node in ten."""
        verdicts = {
            c: ArtifactVerdict(artifact="int8", hardware_class=c, node_id="n", speedup_b1=2.0) for c in _CLASSES
        }
        out = []
        for i, _ in enumerate(self.node_ids):
            hw = _CLASSES[i % len(_CLASSES)]
            newest = len(self.manifests) - 1
            versions = [
                VersionAssignment(
                    manifest=m,
                    serve=k == newest - 1 or (k == newest and i % 10 == 0),
                    placement={},
                    verdict=verdicts[hw] if hw != "gpu" else None,
                )
                for k, m in enumerate(self.manifests)
            ]
            out.append(DesiredState(generation=generation, versions=versions, limits=_CAPS[i % len(_CAPS)]))
        return out


def _cpu(fn: Callable[[], object]) -> float:
    gc.collect()
    started = time.process_time()
    fn()
    return time.process_time() - started


def desired_state_from_scratch(state: DesiredState) -> registry_pb2.DesiredState:
    """``desired_state_to_pb`` as it was before its manifest cache, every manifest converted
    anew: the baseline of ``build_s_per_change_old``, and the oracle of the cache's tests."""
    return registry_pb2.DesiredState(
        generation=state.generation,
        versions=[
            registry_pb2.VersionAssignment(
                manifest=manifest_to_pb(v.manifest),
                serve=v.serve,
                placement=[registry_pb2.ChunkPlacement(digest=d, owners=owners) for d, owners in v.placement.items()],
                verdict=None
                if v.verdict is None
                else registry_pb2.ArtifactVerdict(
                    artifact=v.verdict.artifact,
                    hardware_class=v.verdict.hardware_class,
                    node_id=v.verdict.node_id,
                    speedup_b1=v.verdict.speedup_b1,
                    speedup_b8=v.verdict.speedup_b8,
                ),
                stage=v.stage,
                serve_at_ms=round(v.serve_at * 1000) if v.serve_at is not None else 0,
                force_artifact=v.force_artifact or "",
            )
            for v in state.versions
        ],
        peers=[
            registry_pb2.PeerAddress(node_id=k, grpc_address=a, site=state.peer_sites.get(k, DEFAULT_SITE))
            for k, a in sorted(state.peers.items())
        ],
        placement_enabled=state.placement_enabled,
        limits=caps_to_pb(state.limits),
    )


def _build(
    convert: Callable[[DesiredState], registry_pb2.DesiredState], states: list[DesiredState]
) -> list[registry_pb2.DesiredState]:
    return [convert(s) for s in states]


def _single_form(pbs: list[registry_pb2.DesiredState], node_ids: list[str], sign: Callable[[bytes], bytes]) -> None:
    now = int(time.time() * 1000)
    for pb, node_id in zip(pbs, node_ids, strict=True):
        seal_state(pb, node_id, now, sign)


def _tree_form(
    encoder: SealEncoder,
    states: list[DesiredState],
    pbs: list[registry_pb2.DesiredState],
    node_ids: list[str],
    sign: Callable[[bytes], bytes],
) -> None:
    seals, signed = seal_batch(encoder, list(zip(states, node_ids, strict=True)), int(time.time() * 1000), sign)
    for index, (pb, seal) in enumerate(zip(pbs, seals, strict=True)):  # each stream, on its message
        signed.attach(pb, index, seal)


def _change(
    fleet: Fleet, generation: int, states: list[DesiredState] | None = None
) -> tuple[list[DesiredState], list[registry_pb2.DesiredState], list[registry_pb2.DesiredState]]:
    states = states if states is not None else fleet.states(generation)
    return states, [desired_state_to_pb(s) for s in states], [desired_state_to_pb(s) for s in states]


def _per_state_us(fn: Callable[[int], object], count: int) -> float:
    gc.collect()
    times = []
    for i in range(count):
        started = time.process_time()
        fn(i)
        times.append(time.process_time() - started)
    return statistics.median(times) * 1e6


def _joins(fleet: Fleet, encoder: SealEncoder, count: int) -> dict[str, float]:
    """One lone state sealed (a node joining), in each form; and an edge opening one."""
    sign, key = fleet.key.sign, raw_public_key(fleet.key)
    state = fleet.states(1)[0]
    single, tree = desired_state_to_pb(state), desired_state_to_pb(state)
    node = fleet.node_ids[0]
    old = _per_state_us(lambda i: seal_state(single, node, i, sign), count)
    new = _per_state_us(lambda i: _tree_form(encoder, [state], [tree], [node], sign), count)
    states = fleet.states(1)  # a tree of the whole fleet: paths as long as they get
    pbs = [desired_state_to_pb(s) for s in states]
    _tree_form(encoder, states, pbs, fleet.node_ids, sign)
    n = len(pbs)
    return {
        "seal_cpu_us_per_join_old": round(old, 1),
        "seal_cpu_us_per_join": round(new, 1),
        "edge_open_us_old": round(_per_state_us(lambda i: open_seal(single, node, key), count), 1),
        "edge_open_us": round(_per_state_us(lambda i: open_seal(pbs[i % n], fleet.node_ids[i % n], key), count), 1),
    }


async def _streamed_change(fleet: Fleet, states: list[DesiredState], batcher: SealBatcher | None) -> list[float]:
    """The servicer's pattern for one change: every stream waits on one condition (as on
    ``DesiredStateService``'s), wakes, and makes its sealed message: through ``batcher``
    (seal, then convert and attach), or without one in the single form (convert, then seal).
    When each node's message was ready, in seconds from the change."""
    changed = asyncio.Condition()
    changes = 0
    ready: list[float] = []
    sign = fleet.key.sign

    async def stream(state: DesiredState, node_id: str) -> None:
        async with changed:
            await changed.wait_for(lambda: changes > 0)
        if batcher is not None:
            sealed = await batcher.seal(state, node_id)
            sealed.attach(desired_state_to_pb(state))
        else:
            seal_state(desired_state_to_pb(state), node_id, int(time.time() * 1000), sign)
        ready.append(time.perf_counter() - started)

    tasks = [asyncio.ensure_future(stream(s, n)) for s, n in zip(states, fleet.node_ids, strict=True)]
    await asyncio.sleep(0.1)  # every stream waiting
    started = time.perf_counter()
    async with changed:
        changes += 1
        changed.notify_all()
    await asyncio.gather(*tasks)
    return ready


def _streamed(fleet: Fleet) -> dict[str, Any]:
    """How many signatures a change takes through the batcher, and when nodes' messages are
    ready, in both forms (the batch waits for every woken stream's state)."""
    states = fleet.states(99)
    batcher = SealBatcher(fleet.key.sign)
    new = asyncio.run(_streamed_change(fleet, states, batcher))
    old = asyncio.run(_streamed_change(fleet, states, None))
    return {
        "signatures_per_change": batcher.signatures,
        "state_ready_s_p50": round(statistics.median(new), 3),
        "state_ready_s_max": round(max(new), 3),
        "state_ready_s_p50_old": round(statistics.median(old), 3),
        "state_ready_s_max_old": round(max(old), 3),
    }


def measure_change(fleet: Fleet, encoder: SealEncoder, repeats: int) -> dict[str, Any]:
    """Sealing one fleet-wide change (a push) in both forms: medians of ``repeats`` changes."""
    sign, node_ids = fleet.key.sign, fleet.node_ids
    states, single, tree = _change(fleet, 1)
    cold = _cpu(lambda: _tree_form(encoder, states, tree, node_ids, sign))  # empty caches
    old_times: list[float] = []
    new_times: list[float] = []
    build_times: list[float] = []
    build_old_times: list[float] = []
    for r in range(repeats):  # each a push: one version new to the caches
        fleet.push()
        states = fleet.states(2 + r)
        builds = [
            (build_times, functools.partial(_build, desired_state_to_pb, states)),
            (build_old_times, functools.partial(_build, desired_state_from_scratch, states)),
        ]
        for times, build in builds if r % 2 == 0 else builds[::-1]:
            times.append(_cpu(build))
        states, single, tree = _change(fleet, 2 + r, states)
        for i in range(0, len(states), max(1, len(states) // 50)):  # the same message either way
            if tree[i] != desired_state_from_scratch(states[i]):
                raise AssertionError(f"desired_state_to_pb differs from the conversion before for node {i}")
        old_form = functools.partial(_single_form, single, node_ids, sign)
        new_form = functools.partial(_tree_form, encoder, states, tree, node_ids, sign)
        forms = [(old_times, old_form), (new_times, new_form)]
        for times, form in forms if r % 2 == 0 else forms[::-1]:  # neither form always runs first
            times.append(_cpu(form))
    key = raw_public_key(fleet.key)
    for i in range(0, len(node_ids), max(1, len(node_ids) // 50)):  # what was timed is what an edge accepts
        open_seal(tree[i], node_ids[i], key)
        open_seal(single[i], node_ids[i], key)
    old, new = statistics.median(old_times), statistics.median(new_times)
    return {
        "seal_cpu_s_per_change": round(new, 4),
        "seal_cpu_s_per_change_old": round(old, 4),
        "seal_cpu_s_per_change_cold": round(cold, 4),
        "seal_cpu_s_per_change_runs": [round(t, 4) for t in new_times],
        "seal_cpu_s_per_change_old_runs": [round(t, 4) for t in old_times],
        "speedup": round(old / new, 1) if new > 0 else None,
        "build_s_per_change": round(statistics.median(build_times), 4),
        "build_s_per_change_old": round(statistics.median(build_old_times), 4),
        "build_s_per_change_runs": [round(t, 4) for t in build_times],
        "build_s_per_change_old_runs": [round(t, 4) for t in build_old_times],
        "proof_bytes_mean": round(sum(len(pb.seal_path) for pb in tree) / len(node_ids), 1),
    }


def seal_keys(nodes: int, repeats: int = 3) -> dict[str, float]:
    """The sealing figures ``bench.central_ha`` reports for its ``nodes``: now and before."""
    r = measure_change(Fleet(nodes, 3, Ed25519PrivateKey.generate()), SealEncoder(), repeats)
    return {k: r[k] for k in ("seal_cpu_s_per_change", "seal_cpu_s_per_change_old")}


def measure(nodes: int, versions: int = 3, repeats: int = 5) -> dict[str, Any]:
    """Every key above, at ``nodes`` nodes."""
    fleet = Fleet(nodes, versions, Ed25519PrivateKey.generate())
    encoder = SealEncoder()
    change = measure_change(fleet, encoder, repeats)
    return {
        "nodes": nodes,
        "versions": len(fleet.manifests),
        "repeats": repeats,
        **change,
        **_streamed(fleet),
        **_joins(fleet, encoder, 200),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"bench": "ha_seal", "machine": machine(), "cpu_flags": cpu_flags()}
    result.update(measure(args.nodes, args.versions, args.repeats))
    met = {k: result[k] <= target for k, target in TARGETS.items()}
    result["targets"] = dict(TARGETS)
    result["met"] = {**met, "all": all(met.values())}
    result["errors"] = []
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench._ha_seal", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, default=Path("ha_seal.json"), help="Where to write the result.")
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--versions", type=int, default=3, help="Versions every node holds before the push.")
    p.add_argument("--repeats", type=int, default=5, help="Changes timed per form (the median is reported).")
    return p


def print_table(r: dict[str, Any]) -> None:
    print(f"ha_seal: {r['nodes']} nodes, {r['versions']} versions ({r['machine']}; {' '.join(r['cpu_flags'])})")
    print(f"  {'':28} {'single (before)':>16} {'tree (now)':>12}")
    print(
        f"  {'seal_cpu_s_per_change':28} {r['seal_cpu_s_per_change_old']:>16} {r['seal_cpu_s_per_change']:>12}"
        f"  target ≤ {TARGETS['seal_cpu_s_per_change']} {'met' if r['met']['seal_cpu_s_per_change'] else 'MISSED'}"
    )
    print(f"  {'build_s_per_change':28} {r['build_s_per_change_old']:>16} {r['build_s_per_change']:>12}")
    print(f"  {'seal_cpu_us_per_join':28} {r['seal_cpu_us_per_join_old']:>16} {r['seal_cpu_us_per_join']:>12}")
    print(f"  {'edge_open_us':28} {r['edge_open_us_old']:>16} {r['edge_open_us']:>12}")
    print(
        f"  {'state_ready_s p50 / max':28} {r['state_ready_s_p50_old']:>8} / {r['state_ready_s_max_old']:<6}"
        f" {r['state_ready_s_p50']:>5} / {r['state_ready_s_max']}"
    )
    for key in ("seal_cpu_s_per_change_cold", "speedup", "proof_bytes_mean", "signatures_per_change"):
        print(f"  {key:28} {r[key]!s:>16}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.nodes < 1 or args.repeats < 1 or args.versions < 1:
        print("--nodes, --versions and --repeats must be at least 1")
        return 2
    result = run(args)
    print_table(result)
    return write_result(args.json, result)


if __name__ == "__main__":
    raise SystemExit(main())
