"""Byte-rate caps of an edge's chunk traffic: token buckets, the caps in force, rates."""

from edge_node.transfer.bucket import TokenBucket
from edge_node.transfer.governor import TransferGovernor
from edge_node.transfer.meter import RateMeter

__all__ = ["RateMeter", "TokenBucket", "TransferGovernor"]
