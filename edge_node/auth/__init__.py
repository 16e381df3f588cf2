"""This node's identity towards central: the token it presents on every Registry call."""

from __future__ import annotations

from edge_node.auth.credential import CredentialError, NodeCredential

__all__ = ["CredentialError", "NodeCredential"]
