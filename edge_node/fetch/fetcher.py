"""The chunk fetcher: cache → owners ahead of this node (same site first) → origin, verified.

- Which owners, in which order: only those ahead of this node in the chunk's owners list
  (all of them for a non-owner), so waits follow the ranks (next point). Among those, the
  ones in this node's site first, then the other sites', each group in placement order:
  with site-aware placement a site's first owner is ahead of its later owners and of its
  non-owners, so the chunk crosses into the site once. Origin is asked last, naming every
  owner tried as failed: that is every owner ahead, whatever the order, which is what
  central's origin rule asks for before it lets a later owner or a non-owner in.

- Single-flight: one fetch per digest in this process, however many callers (the
  local sync loop and any number of peers asking this node as an owner) wait on it.
- Slots by owner rank: a fetch by a chunk's k-th owner (k = 0 for the first) takes a
  slot of pool k; a non-owner's, of the general pool. A fetch at rank k waits only on
  owners ranked before k (their fetches hold slots of lower pools) and rank 0 only on
  central, so waits across nodes follow the ranks and never close a cycle. One pool
  for every owned chunk did: with two edges each owns every chunk, A's slots all
  waited on B for chunks B ranks first while B's waited on A, and each first-owner
  fetch the other waited for queued behind them until the peer timeout sent both to
  central for the same chunks.
- Every chunk is hashed before it enters the cache; a peer that sends wrong bytes,
  too many bytes or nothing in time is skipped for that chunk and counted."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field

import grpc
from tenacity import RetryCallState, retry_if_result

from edge_node.cache import ChunkStore, CorruptChunk, HotChunks
from edge_node.fetch.placement_view import PlacementView
from edge_node.fetch.sources import OriginClient, OversizedChunk, PeerClient, wrong_certificate
from edge_node.settings import FetchSettings
from fleetwire.backoff import retrying

log = logging.getLogger(__name__)


class FetchFailed(Exception):
    """Every source failed for a chunk, for every attempt."""


@dataclass
class FetchStats:
    """What this node fetched, from where, and what went wrong."""

    cache_hits: int = 0
    bytes_from_cache: int = 0
    chunks_from_peers: int = 0
    chunks_from_origin: int = 0
    bytes_from_peers: int = 0
    bytes_from_origin: int = 0
    #: Of ``bytes_from_peers``: from peers in this node's site, and from peers elsewhere.
    bytes_from_own_site: int = 0
    bytes_from_other_sites: int = 0
    rejected_corrupt: Counter[str] = field(default_factory=Counter)
    peer_errors: Counter[str] = field(default_factory=Counter)
    #: Of ``peer_errors``: handshakes where the peer did not show its own node's certificate.
    peer_wrong_certificate: Counter[str] = field(default_factory=Counter)
    origin_refusals: int = 0
    failures: int = 0

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly form."""
        return {
            "cache_hits": self.cache_hits,
            "chunks_from_peers": self.chunks_from_peers,
            "chunks_from_origin": self.chunks_from_origin,
            "bytes_from_peers": self.bytes_from_peers,
            "bytes_from_origin": self.bytes_from_origin,
            "bytes_from_own_site": self.bytes_from_own_site,
            "bytes_from_other_sites": self.bytes_from_other_sites,
            "bytes_fetched": self.bytes_from_peers + self.bytes_from_origin,
            "rejected_corrupt": dict(self.rejected_corrupt),
            "peer_errors": dict(self.peer_errors),
            "peer_wrong_certificate": dict(self.peer_wrong_certificate),
            "origin_refusals": self.origin_refusals,
            "failures": self.failures,
        }


def upstream_owners(owners: list[str], node_id: str) -> list[str]:
    """Owners to try before the origin: those ahead of this node, or all of them."""
    return owners[: owners.index(node_id)] if node_id in owners else list(owners)


def downstream_owners(owners: list[str], node_id: str) -> list[str]:
    """Owners after this node (none when it is no owner: ``upstream_owners`` has them all)."""
    return owners[owners.index(node_id) + 1 :] if node_id in owners else []


class ChunkFetcher:
    """Makes sure chunks are in the local ChunkStore."""

    def __init__(
        self,
        node_id: str,
        store: ChunkStore,
        view: PlacementView,
        peers: PeerClient,
        origin: OriginClient,
        settings: FetchSettings,
    ) -> None:
        self.node_id = node_id
        self.store = store
        self.view = view
        self._peers = peers
        self._origin = origin
        self._settings = settings
        self._general = asyncio.Semaphore(settings.max_in_flight)
        #: Owner rank → slots for chunks this node owns at that rank (made on first use).
        self._owned: dict[int, asyncio.Semaphore] = {}
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self.hot = HotChunks(settings.hot_cache_bytes)
        self.stats = FetchStats()
        self._puts: set[asyncio.Future[bool]] = set()

    async def close(self) -> None:
        """Cancel fetches in flight, then wait for puts still running in worker threads,
        so that nothing touches the cache once the node has stopped."""
        fetches = list(self._inflight.values())
        for future in fetches:
            future.cancel()
        await asyncio.gather(*fetches, return_exceptions=True)
        await asyncio.gather(*self._puts, return_exceptions=True)

    def read(self, digest: str) -> bytes | None:
        """A held chunk's bytes: from memory if verified recently, else from the cache (re-hashed)."""
        data = self.hot.get(digest)
        if data is None:
            data = self.store.get(digest)
        return data

    async def ensure(self, digest: str, size: int, owners: list[str] | None = None) -> None:
        """Return once ``digest`` is in the cache; raises FetchFailed."""
        if digest in self.hot:
            self._cache_hit(size)
            return
        future = self._inflight.get(digest)
        if future is None:
            # The cache check runs inside the single flight: checked outside, a fetch that
            # completed during the check's await was missed and the chunk fetched twice.
            future = asyncio.ensure_future(self._held_or_fetch(digest, size, owners or []))
            self._inflight[digest] = future
            future.add_done_callback(lambda f: self._fetch_done(digest, f))
        await asyncio.shield(future)

    def _cache_hit(self, size: int) -> None:
        self.stats.cache_hits += 1
        self.stats.bytes_from_cache += size

    async def _held_or_fetch(self, digest: str, size: int, owners: list[str]) -> None:
        if await asyncio.to_thread(self.store.has, digest):
            self._cache_hit(size)
            return
        await self._fetch(digest, size, owners)

    def _fetch_done(self, digest: str, future: asyncio.Future[None]) -> None:
        """Forget a finished fetch; its error is marked retrieved (the waiter that would have
        raised it may be gone: a sibling chunk failed first), so asyncio logs no traceback."""
        self._inflight.pop(digest, None)
        if not future.cancelled():
            future.exception()

    def _slots(self, owners: list[str]) -> asyncio.Semaphore:
        """The pool a fetch takes its slot from: the general one for a non-owner, else
        the one of this node's rank in ``owners`` (see the module docstring)."""
        if self.node_id not in owners:
            return self._general
        rank = owners.index(self.node_id)
        slots = self._owned.get(rank)
        if slots is None:
            slots = self._owned[rank] = asyncio.Semaphore(self._settings.max_owned_in_flight)
        return slots

    async def _fetch(self, digest: str, size: int, hinted_owners: list[str]) -> None:
        s = self._settings

        def log_retry(state: RetryCallState) -> None:
            log.info(
                "chunk %s: round %d failed, retrying in %.1fs", digest[:12], state.attempt_number, state.upcoming_sleep
            )

        # Each round re-reads the placement view, so a retry goes to the owners of now.
        failed = retry_if_result(lambda delivered: not delivered)
        rounds = retrying(s.backoff_s, s.backoff_max_s, attempts=s.attempts, retry=failed, before_sleep=log_retry)
        async with self._slots(self.view.owners(digest) or hinted_owners):
            if await rounds(self._one_round, digest, size, hinted_owners):
                return
        self.stats.failures += 1
        raise FetchFailed(f"chunk {digest[:12]}: no owner and not the origin could deliver it")

    async def _one_round(self, digest: str, size: int, hinted_owners: list[str]) -> bool:
        owners = self.view.owners(digest) or hinted_owners
        failed: list[str] = []
        for peer in self.view.same_site_first(upstream_owners(owners, self.node_id)):
            if await self._from_peer(peer, digest, size, owners):
                return True
            failed.append(peer)
        if await self._from_origin(digest, size, failed):
            return True
        # The origin failed (central away): an owner after this one may hold the chunk. Asked
        # for held bytes only: a relay from it would come back to this node.
        for peer in self.view.same_site_first(downstream_owners(owners, self.node_id)):
            if await self._from_peer(peer, digest, size, owners, held_only=True):
                return True
        return False

    async def _from_peer(self, peer: str, digest: str, size: int, owners: list[str], held_only: bool = False) -> bool:
        address = self.view.address(peer)
        if address is None:
            return False
        try:
            timeout = self._settings.peer_timeout_s
            data = await self._peers.fetch(peer, address, digest, size, owners, timeout, held_only=held_only)
        except (grpc.aio.AioRpcError, OversizedChunk) as exc:
            not_held = held_only and isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.NOT_FOUND
            if not not_held:  # "not held here" is an answer to a held-only ask, not a peer failing
                self.stats.peer_errors[peer] += 1
            if isinstance(exc, grpc.aio.AioRpcError) and wrong_certificate(exc):
                self._impostor(peer, address)
            log.debug("peer %s failed for %s: %s", peer, digest[:12], exc)
            return False
        return await self._accept(digest, size, data, source=peer)

    async def _from_origin(self, digest: str, size: int, failed: list[str]) -> bool:
        try:
            data = await self._origin.fetch(digest, size, failed, self._settings.origin_timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                self.stats.origin_refusals += 1  # our placement is stale; the next round re-reads it
            log.info("origin failed for %s: %s", digest[:12], exc.details())
            return False
        except OversizedChunk:
            return False
        return await self._accept(digest, size, data, source="origin")

    async def _accept(self, digest: str, size: int, data: bytes, source: str) -> bool:
        """Verify and store off the event loop; ChunkStore.put hashes and refuses wrong bytes.

        Counting happens in the thread future's callback and the future is shielded, so a
        put that a shutdown interrupts still completes and is counted exactly once.
        """
        if size and len(data) != size:
            self._reject(digest, source)
            return False
        future = asyncio.get_running_loop().run_in_executor(None, self.store.put, digest, data)
        self._puts.add(future)
        future.add_done_callback(self._puts.discard)
        future.add_done_callback(lambda f: self._count(f, source, len(data)))
        try:
            await asyncio.shield(future)
        except CorruptChunk:
            return False
        self.hot.add(digest, data)
        return True

    def _count(self, future: asyncio.Future[bool], source: str, nbytes: int) -> None:
        if future.cancelled():
            return
        if isinstance(future.exception(), CorruptChunk):
            self._reject("", source)
        elif future.exception() is None:
            if source == "origin":
                self.stats.chunks_from_origin += 1
                self.stats.bytes_from_origin += nbytes
            else:
                self.stats.chunks_from_peers += 1
                self.stats.bytes_from_peers += nbytes
                if self.view.site_of(source) == self.view.site:
                    self.stats.bytes_from_own_site += nbytes
                else:
                    self.stats.bytes_from_other_sites += nbytes

    def _impostor(self, peer: str, address: str) -> None:
        """Count, and log once per peer, a peer whose certificate is not its own node's."""
        self.stats.peer_wrong_certificate[peer] += 1
        if self.stats.peer_wrong_certificate[peer] == 1:
            log.warning(
                "peer %s at %s did not show a certificate naming node %s: not fetching from it (each"
                " edge needs a certificate issued with its node id, e.g. `modelfleet pki issue --node`)",
                peer,
                address,
                peer,
            )

    def _reject(self, digest: str, source: str) -> None:
        self.stats.rejected_corrupt[source] += 1
        log.warning("rejected chunk %s from %s: bytes do not match the digest", digest[:12] or "?", source)
