"""Wires central's services together. Transports get this one object."""

from __future__ import annotations

from central.distribution import DesiredStateService
from central.membership import NodeDirectory
from central.origin import OriginService, TokenBucket
from central.placement import PlacementService
from central.quantize import QuantizeStep
from central.registry.blobs import BlobStore
from central.registry.chunker import Chunker
from central.registry.pipeline import ChunkStep, ManifestStep, PushPipeline, PushStep, ValidateStep
from central.registry.service import RegistryService
from central.registry.sqlite_impl import SQLiteMetadataStore
from central.registry.staging import Staging
from central.settings import CentralSettings


class Central:
    """The registry, placement, node directory, desired state and origin of one central."""

    def __init__(self, settings: CentralSettings) -> None:
        self.settings = settings
        data = settings.data_dir
        data.mkdir(parents=True, exist_ok=True)
        self.blobs = BlobStore(data / "blobs")
        self.blobs.remove_temp_files()
        self.staging = Staging(data / "staging", settings.max_upload_bytes)
        self.store = SQLiteMetadataStore(data / "registry.sqlite3")
        p = settings.placement
        self.placement = PlacementService(replicas=p.replicas, load_factor=p.load_factor, enabled=p.enabled)
        steps: list[PushStep] = [
            ValidateStep(),
            QuantizeStep(settings.quantize),
            ChunkStep(Chunker(settings.chunking), self.blobs),
            ManifestStep(),
        ]
        pipeline = PushPipeline(steps)
        self.registry = RegistryService(self.store, self.blobs, pipeline, on_change=self._changed)
        self.registry.remove_orphan_blobs()
        self.nodes = NodeDirectory(self.placement, on_change=self._changed)
        self.desired = DesiredStateService(self.placement, self.registry.active_versions, self.nodes.peers)
        bucket = TokenBucket(settings.origin.egress_bytes_s)
        self.origin = OriginService(self.blobs, self.placement, bucket, settings.origin.max_concurrent_streams)

    def _changed(self) -> None:
        self.desired.refresh()

    def start(self) -> None:
        """Compute the initial desired state (needs the running loop)."""
        self.desired.refresh()

    def close(self) -> None:
        """Release the metadata store."""
        self.store.close()
