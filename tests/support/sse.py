"""Reading a server-sent events response in tests (the dashboard's event stream)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    """(event name, parsed data) of each message of an SSE response, until it ends."""
    name, data = "message", ""
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data = line[len("data: ") :]
        elif line == "" and data:
            yield name, json.loads(data)
            name, data = "message", ""
