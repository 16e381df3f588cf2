"""Byte-rate caps of an edge's chunk traffic: the limiters (token buckets of bytes), the caps
in force, rates."""

from edge_node.transfer.governor import TransferGovernor
from edge_node.transfer.meter import RateMeter
from edge_node.transfer.rate_limiter import ByteRateLimiter

__all__ = ["ByteRateLimiter", "RateMeter", "TransferGovernor"]
