"""The gateway over KServe v2 gRPC (``inference.GRPCInferenceService``) on its own port
(``gateway.grpc_port``): each call is translated to the REST gateway's own path and back, so
routing, failover, breakers, retries, timeouts and limits live once, in
``central.gateway.proxy``. ModelInfer → an OIP binary-tensor REST request through
``GatewayProxy.forward`` (``central.grpc.gateway_convert``); ModelReady / ModelMetadata →
``central.gateway.metadata``'s answers; errors end the call with the gRPC code of the HTTP
status the REST gateway would answer (``fleetwire.kserve.status``), ``retry-after`` in the
trailing metadata when the REST answer carries ``Retry-After``. The node that answered is
named in the trailing metadata ``x-modelfleet-node``; gRPC metadata
``x-modelfleet-affinity-key`` pins requests as the REST header does.

A model no node serves is ``ready: false`` (as the REST gateway's 400), never NOT_FOUND:
Triton's gRPC client raises on any error status."""

from __future__ import annotations

import logging
from typing import Any

import grpc
import orjson

from central.gateway.catalog import GatedCatalog
from central.gateway.metadata import gateway_server_metadata, model_ready, node_document
from central.gateway.proxy import AFFINITY_HEADER, NODE_HEADER, GatewayProxy
from central.grpc.gateway_convert import ConvertError, error_message, grpc_response, rest_request
from fleetwire.credentials import parse_bearer
from fleetwire.kserve import grpc_predict_v2_pb2 as pb
from fleetwire.kserve import grpc_predict_v2_pb2_grpc
from fleetwire.kserve.documents import model_metadata_to_pb, server_metadata_to_pb
from fleetwire.kserve.status import abort
from fleetwire.names import InvalidName, check_name

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext


def _version_of(version: str) -> str | None:
    return version or None


def _check_names(name: str, version: str | None) -> str | None:
    """The rule a name breaks (REST: 422), or None."""
    try:
        check_name("model name", name)
        if version is not None:
            check_name("version", version)
    except InvalidName as exc:
        return str(exc)
    return None


def _affinity_key(context: Context) -> str | None:
    wanted = AFFINITY_HEADER.lower()
    for key, value in context.invocation_metadata() or ():
        if key == wanted:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return None


async def _abort_answer(context: Context, status: int, body: bytes, headers: Any) -> None:
    await abort(context, status, error_message(body), headers.get("Retry-After") or headers.get("retry-after"))


class GatewayInferenceServicer(grpc_predict_v2_pb2_grpc.GRPCInferenceServiceServicer):
    """``GRPCInferenceService`` in front of the fleet, over the REST gateway's ``proxy``;
    ``catalog`` (central's registry) describes models no node serves yet."""

    def __init__(self, proxy: GatewayProxy, catalog: GatedCatalog | None = None) -> None:
        self.proxy = proxy
        self.catalog = catalog

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)  # as REST: ready while it accepts requests

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Context) -> pb.ServerMetadataResponse:
        return server_metadata_to_pb(gateway_server_metadata())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> pb.ModelReadyResponse:
        answer = model_ready(self.proxy, request.name, _version_of(request.version))
        if answer.status == 422:
            await _abort_answer(context, 422, answer.body, answer.headers)
        return pb.ModelReadyResponse(ready=answer.status == 200)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context) -> pb.ModelMetadataResponse:
        catalog = await self.catalog.for_caller(_bearer(context)) if self.catalog is not None else None
        answer = await node_document(self.proxy, request.name, _version_of(request.version), "", catalog)
        body = answer.body
        if answer.status != 200:
            await _abort_answer(context, answer.status, body, answer.headers)
        if NODE_HEADER in answer.headers:
            context.set_trailing_metadata(((NODE_HEADER.lower(), answer.headers[NODE_HEADER]),))
        return model_metadata_to_pb(orjson.loads(body))

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Context) -> pb.ModelInferResponse:
        name, version = request.model_name, _version_of(request.model_version)
        if (broken := _check_names(name, version)) is not None:
            await abort(context, 422, broken)
        try:
            response, node = await self._forward(request, name, version, context)
        except ConvertError as exc:
            await abort(context, exc.status, str(exc))
        except _Refused as refused:
            await _abort_answer(context, refused.status, refused.body, refused.headers)
        except Exception as exc:  # a bug here must still end in a status, never a traceback
            log.exception("gateway gRPC inference request for %s failed", name)
            await abort(context, 500, f"the gateway failed on this request: {type(exc).__name__}: {exc}")
        if node is not None:
            context.set_trailing_metadata(((NODE_HEADER.lower(), node),))
        return response

    async def _forward(
        self, request: pb.ModelInferRequest, name: str, version: str | None, context: Context
    ) -> tuple[pb.ModelInferResponse, str | None]:
        proxy = self.proxy
        with proxy.holding() as refusal:
            if refusal is not None:
                raise _Refused(refusal.status, refusal.body, refusal.headers)
            body, headers = rest_request(request)
            answer = await proxy.forward_recorded(name, version, body, headers, _affinity_key(context))
        if answer.status != 200:
            raise _Refused(answer.status, answer.body, answer.headers)
        return grpc_response(answer.body, answer.headers), answer.headers.get(NODE_HEADER)


class _Refused(Exception):
    """The REST gateway's answer was an error: its status, body and headers."""

    def __init__(self, status: int, body: bytes, headers: Any) -> None:
        super().__init__(status)
        self.status, self.body, self.headers = status, body, headers


def _bearer(context: Context) -> str | None:
    """The token of an ``authorization: Bearer …`` metadata entry, if any."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return parse_bearer(value if isinstance(value, str) else value.decode("latin-1"))
    return None
