"""The names that bind a certificate to a node id (``fleetwire.peer_identity``)."""

from __future__ import annotations

import pytest

from fleetwire.peer_identity import AmbiguousIdentity, node_dns_name, node_of_uris, node_uri


def test_the_uri_names_one_node_exactly_and_several_name_none() -> None:
    assert node_of_uris([node_uri("edge-1")]) == "edge-1"
    assert node_of_uris([]) is None
    assert node_of_uris(["spiffe://other/node/edge-1", "https://modelfleet/node/edge-1"]) is None
    assert node_of_uris([node_uri("edge-1"), node_uri("edge-1")]) == "edge-1"  # the same node twice
    with pytest.raises(AmbiguousIdentity, match="edge-1, edge-2"):
        node_of_uris([node_uri("edge-2"), node_uri("edge-1")])


def test_the_dns_form_is_one_lower_case_label_per_id_whatever_its_case_or_length() -> None:
    names = {node_dns_name(i) for i in ("edge-1", "Edge-1", "EDGE-1", "edge_1", "edge.1", "e" * 128)}
    assert len(names) == 6
    for name in names:
        label, suffix = name.split(".", 1)
        assert suffix == "node.modelfleet.invalid" and len(label) == 32 and label == label.lower()
    assert node_dns_name("edge-1") == node_dns_name("edge-1")
