"""Where a prompt's prefix is likely cached: a chain of hashes over the prompt's leading
blocks, matched against what each node was recently sent.

Central has no tokenizer, so blocks are bytes: a completion's prompt as UTF-8 (token ids as
their JSON), a chat's messages one canonical JSON line each (``role`` and ``content``, keys
sorted), so a conversation's next turn starts with the same bytes as the one before. Block
``i``'s hash covers every byte up to the end of block ``i`` (it chains the one before), so two
prompts share a hash exactly when they share that whole prefix, as in vLLM's prefix cache and
llm-d's prefix scorer. Only whole blocks are hashed, at most ``max_blocks`` of them.

The index is approximate, as llm-d's is: per node, the hashes of the last requests sent to it,
least recently used dropped first beyond ``blocks_per_node``. It says nothing for sure of a
node's KV (it may have evicted the blocks, or restarted); it only steers."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

__all__ = ["BLOCK_BYTES", "PrefixIndex", "block_hashes", "prompt_bytes"]

#: Bytes per hashed block (a few dozen tokens of text).
BLOCK_BYTES = 256
#: Leading blocks hashed per request (64 KiB of prompt: enough to tell conversations apart).
MAX_BLOCKS = 256


def prompt_bytes(doc: Mapping[str, Any], chat: bool) -> bytes:
    """The bytes a request's prompt starts with: its ``messages`` (chat) or ``prompt``."""
    if chat:
        messages = doc.get("messages")
        if not isinstance(messages, list):
            return b""
        lines = []
        for m in messages:
            if isinstance(m, dict):
                canonical = {"role": m.get("role"), "content": m.get("content")}
                lines.append(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS) + b"\n")
        return b"".join(lines)
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt.encode("utf-8", "replace")
    return orjson.dumps(prompt) if isinstance(prompt, list) else b""


def block_hashes(data: bytes, block: int = BLOCK_BYTES, max_blocks: int = MAX_BLOCKS) -> list[bytes]:
    """The chained hashes of ``data``'s whole leading blocks (8 bytes each)."""
    out: list[bytes] = []
    previous = b""
    for start in range(0, min(len(data) // block, max_blocks) * block, block):
        previous = hashlib.blake2b(previous + data[start : start + block], digest_size=8).digest()
        out.append(previous)
    return out


class PrefixIndex:
    """Per node, the block hashes of the requests recently sent to it (LRU, bounded)."""

    def __init__(self, blocks_per_node: int = 65536) -> None:
        if blocks_per_node < 1:
            raise ValueError("blocks_per_node must be at least 1")
        self.blocks_per_node = blocks_per_node
        self._nodes: dict[str, OrderedDict[bytes, None]] = {}

    def record(self, node_id: str, hashes: Sequence[bytes]) -> None:
        """``node_id`` was sent a prompt with these block hashes (now its most recent)."""
        if not hashes:
            return
        seen = self._nodes.setdefault(node_id, OrderedDict())
        for h in hashes:
            seen[h] = None
            seen.move_to_end(h)
        while len(seen) > self.blocks_per_node:
            seen.popitem(last=False)

    def match(self, node_id: str, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of the prompt ``node_id`` was recently sent."""
        seen = self._nodes.get(node_id)
        if not seen:
            return 0
        n = 0
        for h in hashes:  # chained: the first miss ends the shared prefix
            if h not in seen:
                break
            n += 1
        return n

    def forget(self, node_id: str) -> None:
        """Drop what ``node_id`` was sent (it restarted: its cache is empty)."""
        self._nodes.pop(node_id, None)

    def snapshot(self) -> dict[str, int]:
        """Blocks remembered per node."""
        return {node: len(seen) for node, seen in sorted(self._nodes.items())}
