"""KServe v2 gRPC (``inference.GRPCInferenceService``): a thin transport over the edge's
:class:`DataPlane`, as ``edge_node.rest.routes`` is for REST. Each RPC is one call on the plane;
``edge_node.grpc.converters`` turns messages into the plane's types and back, and an
:class:`~edge_node.errors.EdgeError` ends the call with the gRPC code of its HTTP status
(``fleetwire.kserve.status``), ``retry-after`` in the trailing metadata on an overload.

ModelReady of a model this edge does not serve answers ``ready: false`` (not NOT_FOUND):
Triton's gRPC client raises on any error status, and its HTTP client, like KServe's, reads
the REST 404 as "not ready"; so ``is_model_ready`` says False over both transports."""

from __future__ import annotations

import logging

import grpc

from edge_node.errors import EdgeError, InferenceFailed, ModelNotFound
from edge_node.grpc.converters import decode_infer_request, encode_infer_response, version_of
from edge_node.inference.dataplane import DataPlane
from edge_node.inference.repository import LoadedModel
from edge_node.inference.request import InferRequest
from fleetwire.kserve import grpc_predict_v2_pb2 as pb
from fleetwire.kserve import grpc_predict_v2_pb2_grpc
from fleetwire.kserve.documents import model_metadata_to_pb, server_metadata_to_pb
from fleetwire.kserve.status import abort

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext


async def _abort_plane(context: Context, exc: EdgeError) -> None:
    retry = exc.retry_after_header
    await abort(context, exc.status, str(exc), retry["Retry-After"] if retry else None)


class InferenceServicer(grpc_predict_v2_pb2_grpc.GRPCInferenceServiceServicer):
    """The six RPCs of ``GRPCInferenceService`` over one :class:`DataPlane`."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.plane.live())

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.ready())

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Context) -> pb.ServerMetadataResponse:
        return server_metadata_to_pb(self.plane.server_metadata())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> pb.ModelReadyResponse:
        try:
            ready = self.plane.model_ready(request.name, version_of(request.version))
        except ModelNotFound:
            ready = False
        except EdgeError as exc:  # a name no model can have: say which rule it breaks
            await _abort_plane(context, exc)
        return pb.ModelReadyResponse(ready=ready)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context) -> pb.ModelMetadataResponse:
        try:
            doc = self.plane.model_metadata(request.name, version_of(request.version))
        except EdgeError as exc:
            await _abort_plane(context, exc)
        return model_metadata_to_pb(doc)

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Context) -> pb.ModelInferResponse:
        try:
            return await self._infer(request)
        except EdgeError as exc:
            error = exc
        except Exception as exc:  # a bug here must still end in a status, never a traceback
            log.exception("gRPC inference request for %s failed", request.model_name)
            error = InferenceFailed(f"the edge failed on this request: {type(exc).__name__}: {exc}")
        await _abort_plane(context, error)
        raise AssertionError("not reached: abort raises")

    async def _infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        plane, name, version = self.plane, request.model_name, version_of(request.model_version)
        limit = plane.limits.max_tensor_elements

        def decode(_: LoadedModel) -> InferRequest:  # after the lookup, as REST decodes its body
            return decode_infer_request(request, limit)

        with plane.admitted(name, version):
            result = await plane.infer(name, version, decode)
        return encode_infer_response(result, request.id)
