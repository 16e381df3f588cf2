"""A Prometheus collector over an edge's parts: counters that already exist as
attributes (cache, fetcher, peer servicer, heartbeat publisher) are read at scrape
time instead of being duplicated on the hot paths."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from edge_node.cache import ChunkStore
from edge_node.fetch import ChunkFetcher
from edge_node.heartbeat import HeartbeatPublisher
from edge_node.inference import ModelRepository
from edge_node.peer import PeerServicer
from edge_node.sync import DesiredStateFollower, Materializer
from edge_node.transfer import TransferGovernor

__all__ = ["EdgeStateCollector"]

#: States a version's files go through (``edge_node.sync.progress.VersionProgress``).
VERSION_STATES = ("pending", "fetching", "complete", "failed")
#: States of a model version in ONNX Runtime (``edge_node.inference.repository``).
MODEL_STATES = ("loading", "ready", "failed", "retired")


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _by_label(
    family: CounterMetricFamily | GaugeMetricFamily, values: dict[str, int]
) -> CounterMetricFamily | GaugeMetricFamily:
    for label, value in sorted(values.items()):
        family.add_metric((label,), value)
    return family


class EdgeStateCollector(Collector):
    """Cache, fetch, peer, heartbeat and version figures of one edge."""

    def __init__(
        self,
        *,
        store: ChunkStore,
        fetcher: ChunkFetcher,
        peer: PeerServicer,
        heartbeat: HeartbeatPublisher,
        follower: DesiredStateFollower,
        materializer: Materializer,
        repository: ModelRepository,
        transfer: TransferGovernor | None = None,
    ) -> None:
        self._store = store
        self._fetcher = fetcher
        self._peer_servicer = peer
        self._publisher = heartbeat
        self._follower = follower
        self._materializer = materializer
        self._repository = repository
        self._transfer = transfer

    def collect(self) -> Iterable[Metric]:
        """Every family, read now."""
        yield from self._cache()
        yield from self._fetch()
        yield from self._peer()
        yield from self._transfer_caps()
        yield from self._heartbeat()
        yield from self._versions()

    def _cache(self) -> Iterator[Metric]:
        s = self._store.stats()
        yield _gauge("modelfleet_cache_bytes", "Bytes of chunks in the local cache.", s.bytes)
        yield _gauge("modelfleet_cache_capacity_bytes", "Cache size cap (pinned chunks may exceed it).", s.capacity)
        yield _gauge(
            "modelfleet_cache_pinned_bytes", "Bytes of chunks pinned by versions this node holds.", s.pinned_bytes
        )
        yield _gauge("modelfleet_cache_entries", "Chunks in the local cache.", s.entries)
        yield _counter("modelfleet_cache_hits", "Chunk reads served by the cache (verified).", s.hits)
        yield _counter("modelfleet_cache_misses", "Chunk reads the cache could not serve.", s.misses)
        yield _counter("modelfleet_cache_read_bytes", "Bytes read from the cache.", s.bytes_read)
        yield _counter("modelfleet_cache_written_bytes", "Bytes written into the cache.", s.bytes_written)
        yield _counter("modelfleet_cache_evictions", "Chunks evicted to stay under the cap.", s.evictions)
        yield _counter(
            "modelfleet_cache_corrupt_dropped",
            "Cache entries that failed their digest on read and were dropped (then fetched again).",
            s.corrupt_dropped,
        )

    def _fetch(self) -> Iterator[Metric]:
        f = self._fetcher.stats
        chunks = CounterMetricFamily(
            "modelfleet_fetch_chunks", "Chunks this node needed, by where they came from.", labels=("source",)
        )
        yield _by_label(chunks, {"cache": f.cache_hits, "peer": f.chunks_from_peers, "origin": f.chunks_from_origin})
        chunk_bytes = CounterMetricFamily(
            "modelfleet_fetch_bytes", "Chunk bytes this node needed, by where they came from.", labels=("source",)
        )
        yield _by_label(
            chunk_bytes, {"cache": f.bytes_from_cache, "peer": f.bytes_from_peers, "origin": f.bytes_from_origin}
        )
        yield _counter("modelfleet_fetch_failures", "Chunks no owner nor the origin could deliver.", f.failures)
        yield _counter("modelfleet_fetch_peer_errors", "Failed chunk requests to peers.", sum(f.peer_errors.values()))
        yield _counter(
            "modelfleet_fetch_origin_refusals", "Origin refusals (an owner had to be tried first).", f.origin_refusals
        )
        rejected = CounterMetricFamily(
            "modelfleet_fetch_rejected",
            "Chunks refused because their bytes did not match the digest.",
            labels=("source",),
        )
        by_source: Counter[str] = Counter({"peer": 0, "origin": 0})
        for source, n in f.rejected_corrupt.items():
            by_source["origin" if source == "origin" else "peer"] += n
        yield _by_label(rejected, dict(by_source))

    def _peer(self) -> Iterator[Metric]:
        peer = self._peer_servicer
        yield _counter("modelfleet_peer_served_chunks", "Chunks this node served to peers.", peer.chunks_served)
        yield _counter("modelfleet_peer_served_bytes", "Chunk bytes this node served to peers.", peer.bytes_served)
        yield _counter(
            "modelfleet_peer_claims_refused",
            "Peer calls refused because the requester is not the node the client certificate names.",
            peer.claims.refused,
        )

    def _transfer_caps(self) -> Iterator[Metric]:
        t = self._transfer
        if t is None:
            return
        caps = GaugeMetricFamily(
            "modelfleet_transfer_cap_bytes_per_second",
            "Chunk byte-rate caps in force (0: no cap); serve_now: the serve cap applied now (busy or not).",
            labels=("direction",),
        )
        yield _by_label(
            caps,
            {
                "fetch": t.caps.fetch_bytes_per_s or 0,
                "serve": t.caps.serve_bytes_per_s or 0,
                "busy_serve": t.caps.busy_serve_bytes_per_s or 0,
                "serve_now": t.serve_cap_now(),
            },
        )
        rates = GaugeMetricFamily(
            "modelfleet_transfer_rate_bytes_per_second",
            "Chunk bytes/s over the last 5 s, fetched and served to peers.",
            labels=("direction",),
        )
        yield _by_label(rates, {"fetch": round(t.fetched.rate()), "serve": round(t.served.rate())})
        yield _gauge("modelfleet_transfer_serving_busy", "1 while serving runs at the busy cap.", int(t.serving_busy))

    def _heartbeat(self) -> Iterator[Metric]:
        hb = self._publisher
        yield _counter("modelfleet_heartbeats_sent", "Heartbeats handed to the MQTT client.", hb.heartbeats_sent)
        yield _counter(
            "modelfleet_heartbeats_dropped", "Heartbeats not sent (no connection, full queue, snapshot error).",
            hb.heartbeats_dropped,
        )  # fmt: skip
        yield _counter("modelfleet_mqtt_connects", "Successful connections to the MQTT broker.", hb.connects)
        yield _gauge("modelfleet_mqtt_connected", "1 while connected to the MQTT broker.", int(hb.connected))
        yield _gauge(
            "modelfleet_central_connected", "1 while the desired-state stream to central is open.",
            int(self._follower.connected.is_set()),
        )  # fmt: skip
        yield _counter(
            "modelfleet_central_switches", "Moves of the link to the next configured central address.",
            self._follower.centrals.switches,
        )  # fmt: skip

    def _versions(self) -> Iterator[Metric]:
        files: Counter[str] = Counter(dict.fromkeys(VERSION_STATES, 0))
        for p in self._materializer.progress.values():
            files[p.state] += 1
        yield _by_label(
            GaugeMetricFamily(
                "modelfleet_edge_versions", "Versions this node holds, by file state.", labels=("state",)
            ),
            dict(files),
        )
        models: Counter[str] = Counter(dict.fromkeys(MODEL_STATES, 0))
        for m in self._repository.models():
            models[str(m.state)] += 1
        yield _by_label(
            GaugeMetricFamily("modelfleet_edge_models", "Model versions in ONNX Runtime, by state.", labels=("state",)),
            dict(models),
        )
