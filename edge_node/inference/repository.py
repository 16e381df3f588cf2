"""The models an edge serves: loading, warm-up, zero-downtime version swaps, lookup.

A new version is loaded and warmed up beside the current one, then becomes the
model's default in one step. The old version keeps serving what was already handed
to it: requests in its queue or running are drained, and for ``retire_grace_s`` it
also still serves callers that resolved it just before the switch (the HTTP layer
reads the request body between ``get`` and ``infer``) or ask for it by version. Then
it is retired: its batcher closed and its session released. A version that fails to
load or warm up is recorded as failed and the last good version keeps serving.

A load may carry a ``switch_at`` instant (a staged rollout's flip): the version is loaded
and warmed up at once, waits ``staged`` beside the current one, and becomes the default at
that instant, so a fleet flips together however long each node takes to load."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort
from prometheus_client import CollectorRegistry

from edge_node.errors import InvalidRequest, ModelNotFound, ModelNotReady, ModelUnavailable
from edge_node.generation import EngineSettings, GenerationEngine
from edge_node.generation.metrics import RecentLatencies
from edge_node.inference.batcher import DynamicBatcher, Tensors
from edge_node.inference.inputs import check_inputs
from edge_node.inference.metrics import ModelMetrics, render
from edge_node.inference.session import SessionFactory, batchable, dummy_inputs, reconcile_manifest
from edge_node.inference.shadow import LiveShadow, ShadowSampler
from edge_node.settings import BatchSettings
from fleetwire.manifest import ArtifactRef, Manifest
from fleetwire.mqtt.payloads import GenerationInfo, ShadowInfo

log = logging.getLogger(__name__)

ModelState = Literal["loading", "staged", "ready", "failed", "retired"]

#: The longest single sleep while a staged version waits for its instant (it re-reads the
#: instant after each, so a flip moved earlier is not missed).
_SWITCH_POLL_S = 0.5
#: Makes the live-traffic sampler of a version as it loads (blocking), or None: not sampled.
ShadowMaker = Callable[[Manifest, Path], LiveShadow | None]


class LoadedModel:
    """One version of a model: its state, effective signature, session and batcher.

    ``manifest`` carries the signature the session really has (it wins over the
    published one when they differ)."""

    def __init__(self, manifest: Manifest, seq: int) -> None:
        self.name = manifest.name
        self.version = manifest.version
        self.manifest = manifest
        #: The artifact this session serves (a version may switch artifacts: central's fallback).
        self.artifact = manifest.artifact
        #: Checks a sample of the requests (a language model's: generations) against the FP32
        #: artifact (a quantized one served only), or None.
        self.shadow: LiveShadow | None = None
        self.state: ModelState = "loading"
        self.error: str | None = None
        self.cache_hit: bool | None = None
        self._seq = seq
        self._session: ort.InferenceSession | None = None
        self._batcher: DynamicBatcher | None = None
        self._metrics: ModelMetrics | None = None
        self._output_names: list[str] = []
        self._active = 0
        #: The generation engine of a language model (``manifest.kind`` decoder), else None.
        self.engine: GenerationEngine | None = None
        #: (tokens generated, when) at the last ``generation_info``: its rate is since then.
        self._token_mark: tuple[int, float] = (0, 0.0)
        #: A language model's last times to first token (observed by the generation service).
        self.recent_ttfts = RecentLatencies()
        #: The instant (this node's clock) a ``staged`` version becomes the default.
        self.switch_at: float | None = None
        #: When it did (this node's clock); None before.
        self.switched_at: float | None = None

    def __repr__(self) -> str:
        return f"LoadedModel({self.name!r}, {self.version!r}, state={self.state!r})"

    @property
    def session(self) -> ort.InferenceSession | None:
        """The session, or None once released (or before it loaded)."""
        return self._session

    @property
    def errors(self) -> int:
        """Requests this version failed in the session since it loaded."""
        return self._metrics.errors if self._metrics is not None else 0

    @property
    def shadow_info(self) -> ShadowInfo | None:
        """Agreement with the FP32 reference on live samples so far (None: not sampled)."""
        return self.shadow.info() if self.shadow is not None else None

    @property
    def generation_info(self) -> GenerationInfo | None:
        """A language model's engine now, tokens/s since the last call (the heartbeat's); None otherwise."""
        if self.engine is None or self.state != "ready":
            return None
        stats, now = self.engine.stats(), time.monotonic()
        tokens, since = self._token_mark
        rate = (stats.generation_tokens - tokens) / (now - since) if now > since and since else 0.0
        self._token_mark = (stats.generation_tokens, now)
        p50, p99 = self.recent_ttfts.percentiles_ms(0.5, 0.99) or (None, None)
        return GenerationInfo(tokens_per_s=round(max(0.0, rate), 3), running=stats.running, waiting=stats.waiting,
                              kv_usage=round(min(1.0, stats.kv_usage), 4),
                              ttft_p50_ms=p50, ttft_p99_ms=p99)  # fmt: skip

    @property
    def active_requests(self) -> int:
        """Requests inside ``infer`` right now (queued or running)."""
        return self._active

    async def infer(self, inputs: Tensors, priority: int = 0) -> Tensors:
        """All outputs for ``inputs`` (first axis = rows), through the dynamic batcher.

        Raises ModelUnavailable once retired, ModelNotReady while loading or failed,
        InvalidInputs for tensors that do not fit, QueueFull when overloaded."""
        if self.state == "ready" and self.engine is not None:
            raise InvalidRequest(
                f"{self.name} is a language model: use POST /v1/completions, /v1/chat/completions"
                f" or /v2/models/{self.name}/generate"
            )
        if self.state != "ready" or self._batcher is None:
            raise self._not_serving()
        arrays = {k: np.asarray(v) for k, v in inputs.items()}
        # Refused before the model's queue, so not counted among the model's requests (as a
        # malformed body is not): "invalid" counts what the model itself refused.
        check_inputs(arrays, self.manifest.inputs)
        self._active += 1
        try:
            outputs = await self._batcher.submit(arrays, priority)
        finally:
            self._active -= 1
        if isinstance(self.shadow, ShadowSampler):
            self.shadow.offer(arrays, outputs)  # a random draw; a sampled copy is queued, never awaited
        return outputs

    def _not_serving(self) -> Exception:
        if self.state == "retired":
            return ModelUnavailable(f"{self.name} version {self.version} was retired")
        reason = f": {self.error}" if self.error else ""
        return ModelNotReady(f"{self.name} version {self.version} is {self.state}{reason}", state=self.state,
                             reason=self.error)  # fmt: skip

    def _run(self, inputs: Tensors) -> Tensors:
        """One session run (in a worker thread), all outputs by name."""
        session = self._session
        if session is None:
            raise ModelUnavailable(f"{self.name} version {self.version} was released")
        values = session.run(self._output_names, inputs)
        return dict(zip(self._output_names, values, strict=True))

    def _attach(self, session: ort.InferenceSession, batcher: DynamicBatcher, metrics: ModelMetrics) -> None:
        self._session, self._batcher, self._metrics = session, batcher, metrics
        self._output_names = [o.name for o in self.manifest.outputs]

    async def _shutdown(self) -> None:
        """Retire: refuse new requests, drain queued and running ones, release the session."""
        self.state = "retired"
        if self._batcher is not None:
            await self._batcher.close()
        self._session = None
        if self.engine is not None:
            await self.engine.stop()  # every open stream ends with 503
        if self.shadow is not None:
            await asyncio.to_thread(self.shadow.close)  # waits out the sample running, if any
        if self._metrics is not None:
            self._metrics.retire()


def loaded_artifact(manifest: Manifest, path: Path) -> ArtifactRef:
    """The artifact whose ``model.onnx`` is ``path``: named by its directory
    (``<version>/<artifact>/model.onnx``), else the manifest's default one."""
    return manifest.artifact_named(path.parent.name) or manifest.served()


def session_key(artifact: ArtifactRef) -> str:
    """What identifies an artifact's optimized form: the graph's sha256 for a single file
    (as before external data), else a digest over the graph's and every data file's sha256
    (the same graph with other weights is another model)."""
    if not artifact.files:
        return artifact.sha256
    parts = [artifact.sha256, *(f"{f.path}:{f.sha256}" for f in artifact.files)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


class ModelRepository:
    """All model versions known to this edge and, per model, the default version."""

    def __init__(
        self,
        factory: SessionFactory,
        *,
        batching: BatchSettings | None = None,
        metrics_registry: CollectorRegistry | None = None,
        retire_grace_s: float = 5.0,
        shadows: ShadowMaker | None = None,
        generation: EngineSettings | None = None,
    ) -> None:
        self._factory = factory
        #: How a language-model version's generation engine is set up.
        self.generation = generation or EngineSettings()
        self._shadows = shadows
        self.batching = batching or BatchSettings()
        self.metrics_registry = metrics_registry if metrics_registry is not None else CollectorRegistry()
        self.retire_grace_s = retire_grace_s
        self._versions: dict[str, dict[str, LoadedModel]] = {}
        self._default: dict[str, str] = {}
        self._seq = itertools.count()
        self._retiring: set[asyncio.Task[None]] = set()
        self._closing = asyncio.Event()

    # -- lookup --------------------------------------------------------------------------

    def get(self, name: str, version: str | None = None) -> LoadedModel:
        """The ready model ``name`` at ``version`` (None: its default version)."""
        versions = self._versions.get(name)
        if not versions:
            raise ModelNotFound(f"model {name!r} is not served by this edge")
        if version is None:
            default = self._default.get(name)
            if default is not None:
                return versions[default]
            latest = max(versions.values(), key=lambda m: m._seq)
            raise latest._not_serving() if latest.state != "retired" else ModelNotFound(f"model {name!r} is retired")
        model = versions.get(version)
        if model is None or model.state == "retired":
            raise ModelNotFound(f"model {name!r} has no version {version!r} on this edge")
        if model.state != "ready":
            raise model._not_serving()
        return model

    def serves(self, name: str) -> bool:
        """Whether some version of ``name`` is its default now."""
        return name in self._default

    def failed(self, key: tuple[str, str]) -> bool:
        """Whether version ``key`` (name, version) failed to load and was not loaded since."""
        model = self._versions.get(key[0], {}).get(key[1])
        return model is not None and model.state == "failed"

    def models(self) -> list[LoadedModel]:
        """Every known version (loading, ready, failed, retired), by name then load order."""
        return sorted((m for vs in self._versions.values() for m in vs.values()), key=lambda m: (m.name, m._seq))

    def ready(self) -> bool:
        """True when at least one model is known and every known model has a ready default
        version. A model whose newest version failed but whose previous one still serves
        counts as ready; one that never loaded successfully (or is still loading) does not, and
        one whose only version waits for a flip is left out."""
        return bool(self._versions) and all(
            name in self._default or all(m.state == "staged" for m in versions.values())
            for name, versions in self._versions.items()
        )

    def render_metrics(self) -> bytes:
        """This repository's metrics in the Prometheus text format."""
        return render(self.metrics_registry)

    # -- loading -------------------------------------------------------------------------

    async def load(self, manifest: Manifest, path: Path, switch_at: float | None = None) -> None:
        """Load, warm up and switch to ``manifest``'s version; never raises for a bad model.

        ``switch_at`` (this node's clock): switch at that instant, not as soon as loaded; a
        second load of a version waiting for its instant only moves the instant. Returns once
        the new version serves (or is recorded as failed); the previous default is retired in
        the background (see ``wait_retirements``).

        A language model (``manifest.kind`` decoder) gets a :class:`GenerationEngine` on its
        assembled folder (``path``'s directory: graph, tokenizer, config) instead of a tensor
        session; it is swapped, retired and reported like any other version."""
        existing = self._versions.get(manifest.name, {}).get(manifest.version)
        if existing is not None and existing.state in ("staged", "loading") and existing.artifact == manifest.artifact:
            existing.switch_at = switch_at  # the load under way reads it once the session is up
            return
        if existing is not None and existing.state == "ready" and existing.artifact != manifest.artifact:
            await self._switch_artifact(existing, manifest, Path(path))
            return
        if existing is not None and existing.state == "ready":
            if existing.manifest.pending != manifest.pending:  # central decided a pending candidate
                await self._reshadow(existing, manifest, Path(path))
            if self._default.get(manifest.name) != manifest.version:
                existing._seq = next(self._seq)  # a rollback to a version still in its grace period
                self._promote(existing)
            return
        model = LoadedModel(manifest, next(self._seq))
        model.switch_at = switch_at
        self._versions.setdefault(manifest.name, {})[manifest.version] = model
        try:
            await self._bring_up(model, Path(path))
            if model.switch_at is not None and model.switch_at > time.time():
                await self._wait_for_switch(model)
                model._seq = next(self._seq)  # the flip is the newest decision about this model
        except asyncio.CancelledError:  # unwanted meanwhile (a rollback, a new state): forget it
            versions = self._versions.get(model.name, {})
            if versions.get(model.version) is model:
                del versions[model.version]
            self._retire_later(model, grace=0.0)
            raise
        except Exception as exc:
            self._record_failure(model, exc)
            return
        self._promote(model)
        model.switched_at = time.time()

    async def _wait_for_switch(self, model: LoadedModel) -> None:
        """Hold ``model`` loaded and ``staged`` until its instant (``switch_at``, which a later
        load may move)."""
        model.state = "staged"
        log.info(
            "%s version %s staged; switching in %.3f s", model.name, model.version, (model.switch_at or 0) - time.time()
        )
        while (left := (model.switch_at or 0.0) - time.time()) > 0:
            await asyncio.sleep(min(left, _SWITCH_POLL_S))

    async def _switch_artifact(self, serving: LoadedModel, manifest: Manifest, path: Path) -> None:
        """Serve ``serving``'s version as another artifact (central's fallback, or its end):
        the new session is brought up beside the one serving, then takes its place in one
        step; the old one is retired like a displaced version. If it fails, the old one stays."""
        model = LoadedModel(manifest, next(self._seq))
        try:
            await self._bring_up(model, path)
        except Exception as exc:
            log.warning("%s version %s: cannot switch to %s (%s: %s); %s keeps serving", model.name,
                        model.version, model.artifact, type(exc).__name__, exc, serving.artifact)  # fmt: skip
            return
        versions = self._versions.get(model.name, {})
        if versions.get(model.version) is not serving:  # unloaded or replaced meanwhile
            self._retire_later(model, grace=0.0)
            return
        versions[model.version] = model
        serving._metrics = None  # the new session's series carry the version's labels now: keep them
        self._promote(model)
        log.info("%s version %s now serves artifact %s", model.name, model.version, model.artifact)
        self._retire_later(serving, grace=self.retire_grace_s)

    async def _bring_up(self, model: LoadedModel, path: Path) -> None:
        """Create the session (in a thread), reconcile its signature, warm it up, attach.
        ORT reads the graph's external-data files from ``path``'s directory. A language model
        gets its generation engine instead, started here."""
        if model.manifest.is_language_model:
            engine = await asyncio.to_thread(GenerationEngine.load, path.parent, self.generation)
            await engine.start()
            model.engine = engine
            model.shadow = await self._shadow_for(model, path)
            return
        artifact = loaded_artifact(model.manifest, path)
        create = self._factory.create_with_info
        created = await asyncio.to_thread(create, path, session_key(artifact), artifact.total_size)
        model.cache_hit = created.cache_hit
        model.manifest = reconcile_manifest(model.manifest, created.session)
        await asyncio.to_thread(created.session.run, None, dummy_inputs(model.manifest.inputs))
        metrics = ModelMetrics(self.metrics_registry, model.name, model.version)
        model._attach(created.session, self._batcher_for(model, metrics), metrics)
        model.shadow = await self._shadow_for(model, path)

    async def _reshadow(self, model: LoadedModel, manifest: Manifest, path: Path) -> None:
        """Serve on as before, sampling as ``manifest`` (re-issued by central) says now."""
        old, model.shadow = model.shadow, None
        if old is not None:
            await asyncio.to_thread(old.close)
        model.manifest = model.manifest.model_copy(
            update={"pending": manifest.pending, "signature": manifest.signature}
        )
        model.shadow = await self._shadow_for(model, path)

    async def _shadow_for(self, model: LoadedModel, path: Path) -> LiveShadow | None:
        """The version's live-traffic sampler; a failure to make one never fails the load."""
        if self._shadows is None:
            return None
        try:
            return await asyncio.to_thread(self._shadows, model.manifest, path)
        except Exception as exc:
            log.warning("%s version %s: not sampled against FP32 (%s: %s)", model.name, model.version,
                        type(exc).__name__, exc)  # fmt: skip
            return None

    def _batcher_for(self, model: LoadedModel, metrics: ModelMetrics) -> DynamicBatcher:
        s = self.batching
        batch = s.enabled and batchable(model.manifest)
        if s.enabled and not batch:
            log.info("%s version %s has a fixed batch axis; batching disabled for it", model.name, model.version)
        return DynamicBatcher(
            model._run,
            max_batch_size=s.max_batch_size if batch else 1,
            max_queue_delay_s=s.max_queue_delay_ms / 1000 if batch else 0.0,
            max_queue_rows=s.max_queue_rows,
            max_concurrent_batches=s.max_concurrent_batches,
            metrics=metrics,
            split_oversized=batch,
            name=f"{model.name}:{model.version}",
        )

    def _record_failure(self, model: LoadedModel, exc: Exception) -> None:
        model.state, model.error = "failed", f"{type(exc).__name__}: {exc}"
        serving = self._default.get(model.name)
        log.warning(
            "%s version %s failed to load (%s); %s", model.name, model.version, model.error,
            f"version {serving} keeps serving" if serving else "no version of it is serving",
        )  # fmt: skip

    def _promote(self, model: LoadedModel) -> None:
        """Make ``model`` ready and the default at once (unless a newer load won), then
        retire whichever version that displaces."""
        model.state = "ready"
        if self._versions.get(model.name, {}).get(model.version) is not model:
            self._retire_later(model, grace=0.0)  # unloaded while it was loading
            return
        current = self._current(model.name)
        if current is not None and current._seq > model._seq:
            self._retire_later(model, grace=0.0)  # a later-started load finished first
            return
        self._default[model.name] = model.version
        log.info("%s now serves version %s", model.name, model.version)
        if current is not None and current is not model:
            self._retire_later(current, grace=self.retire_grace_s)

    def _current(self, name: str) -> LoadedModel | None:
        version = self._default.get(name)
        return self._versions.get(name, {}).get(version) if version is not None else None

    # -- retiring ------------------------------------------------------------------------

    def _retire_later(self, model: LoadedModel, grace: float) -> None:
        task = asyncio.get_running_loop().create_task(self._retire(model, grace), name=f"retire-{model.name}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, model: LoadedModel, grace: float) -> None:
        """After ``grace`` (cut short by ``close``), drain and release ``model`` unless it
        became the default again meanwhile (a rollback)."""
        if grace > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._closing.wait()
        if self._current(model.name) is model and not self._closing.is_set():
            return
        await model._shutdown()
        log.info("%s version %s retired", model.name, model.version)

    async def wait_retirements(self) -> None:
        """Wait until every displaced version has been drained and released."""
        while self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)

    async def unload(self, name: str) -> None:
        """Stop serving ``name``: drain and release all its versions and forget them."""
        versions = self._versions.pop(name, {})
        self._default.pop(name, None)
        await asyncio.gather(*(m._shutdown() for m in versions.values() if m.state == "ready"))

    async def close(self) -> None:
        """Retire everything at once (pending grace periods end now) and drain it."""
        self._closing.set()
        await self.wait_retirements()
        for name in list(self._versions):
            await self.unload(name)
