"""Gateway candidates at the addresses nodes registered, not the ones their heartbeats claim.

A heartbeat is an MQTT message anyone holding the node's broker login can publish; the address
a node registered came with its token-checked gRPC ``Register``. The gateway sends requests
(with central's own fleet certificate) to whatever address a candidate carries, so it takes the
registered one, and a node that has not registered here is no candidate."""

from __future__ import annotations

from central.gateway.candidates import Candidate, NodeSource
from central.membership.nodes import NodeDirectory

__all__ = ["RegisteredNodeSource"]


class RegisteredNodeSource:
    """``source``'s candidates that are registered, each at its registered HTTP address."""

    def __init__(self, source: NodeSource, directory: NodeDirectory) -> None:
        self._source = source
        self._directory = directory

    def candidates(self, model: str, version: str | None) -> list[Candidate]:
        """The inner source's candidates, registered ones only, at their registered address."""
        out = []
        for candidate in self._source.candidates(model, version):
            record = self._directory.get(candidate.node_id)
            if record is not None and record.http_address:
                out.append(Candidate(candidate.node_id, record.http_address))
        return out
