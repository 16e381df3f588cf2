"""Central's REST transport: the FastAPI app (operator API, dashboard, metrics, the gateway's
``/v2``) and its uvicorn listener. Routes translate HTTP to ``central.handlers`` calls."""

from __future__ import annotations

__all__: list[str] = []
