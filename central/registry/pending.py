"""Promoting or dropping a version's pending INT8 candidate: a new signed manifest.

A candidate the guard could not prove travels in the served manifest's ``pending`` list
(``central.quantize.guard_step``). Once live evidence decides (``central.rollout.promotion``),
the version's served manifest is re-issued and re-signed in the store:

* **promoted**: the candidate becomes the default artifact, FP32 and the other servable
  artifacts its alternatives (so each hardware class still serves its fastest, timed as
  usual), the push report's ``int8`` says ``promoted`` with the evidence;
* **rejected**: the candidate leaves ``pending``; FP32 stays served, ``int8`` says
  ``rejected`` with the evidence.

The decision is the stored manifest itself: durable, shared by every replica reading the
store, and bound into each node's sealed desired state by its signature. Re-issuing is
idempotent: a candidate no longer pending is left alone (False)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from central.registry.signing import ManifestSigner
from central.storage.protocols import MetadataStore
from fleetwire.manifest import Manifest

log = logging.getLogger(__name__)

__all__ = ["PendingDecisions", "promoted_manifest", "rejected_manifest"]


def _int8_report(manifest: Manifest, status: str, artifact: str, evidence: dict[str, Any]) -> dict[str, Any]:
    """The push report with ``int8`` saying what live traffic decided."""
    report = dict(manifest.quantization or {})
    int8 = dict(report.get("int8") or {})
    int8.update({"status": status, status: {"artifact": artifact, **evidence}})
    int8["pending"] = [p for p in int8.get("pending", []) if p != artifact]
    report["int8"] = int8
    if status == "promoted":
        report.update({"served": artifact, "served_reason": None})
        int8["reason"] = None
    return report


def promoted_manifest(manifest: Manifest, candidate: Manifest, evidence: dict[str, Any]) -> Manifest:
    """``manifest`` (served FP32 with ``candidate`` pending) re-issued with the candidate as
    its default artifact (unsigned)."""
    artifact = candidate.artifact
    return candidate.model_copy(
        update={
            "labels": manifest.labels,
            "created_at": manifest.created_at,
            "quantization": _int8_report(manifest, "promoted", artifact, evidence),
            "alternatives": [manifest.served(), *(a for a in manifest.alternatives if a.artifact != artifact)],
            "pending": [p for p in manifest.pending if p.artifact != artifact],
            "signature": "",
        }
    )


def rejected_manifest(manifest: Manifest, artifact: str, evidence: dict[str, Any]) -> Manifest:
    """``manifest`` re-issued without ``artifact`` among its pending candidates (unsigned)."""
    return manifest.model_copy(
        update={
            "quantization": _int8_report(manifest, "rejected", artifact, evidence),
            "pending": [p for p in manifest.pending if p.artifact != artifact],
            "signature": "",
        }
    )


class PendingDecisions:
    """Re-issues a version's manifest when its pending candidate is promoted or rejected."""

    def __init__(
        self,
        store: MetadataStore,
        signer: ManifestSigner,
        on_change: Callable[[], None],
        transaction: Callable[[], AbstractContextManager[object]] = nullcontext,
    ) -> None:
        self._store = store
        self._signer = signer
        self._on_change = on_change
        self._transaction = transaction

    def promote(self, model: str, version: str, artifact: str, evidence: dict[str, Any]) -> bool:
        """Serve ``artifact`` by default from now on; False when it is no longer pending."""
        return self._reissue(model, version, artifact, evidence, promote=True)

    def reject(self, model: str, version: str, artifact: str, evidence: dict[str, Any]) -> bool:
        """Drop ``artifact`` from the pending candidates; False when it is no longer pending."""
        return self._reissue(model, version, artifact, evidence, promote=False)

    def _reissue(self, model: str, version: str, artifact: str, evidence: dict[str, Any], *, promote: bool) -> bool:
        with self._transaction():
            record = self._store.get_version(model, version)
            if record is None or not any(p.artifact == artifact for p in record.manifest.pending):
                return False
            candidate = record.artifacts.get(artifact)
            if promote and candidate is None:
                log.error("%s:%s: pending %s has no stored manifest; not promoted", model, version, artifact)
                return False
            if promote and candidate is not None:
                reissued = promoted_manifest(record.manifest, candidate, evidence)
            else:
                reissued = rejected_manifest(record.manifest, artifact, evidence)
            self._store.replace_manifests(self._signer.sign(reissued), record.artifacts)
        log.warning("%s:%s: pending INT8 %s %s on live evidence", model, version, artifact,
                    "promoted" if promote else "rejected")  # fmt: skip
        self._on_change()
        return True
