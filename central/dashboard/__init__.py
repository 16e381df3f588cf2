"""Central's live dashboard: a snapshot of the fleet as one JSON document, a Server-Sent
Events stream of snapshots and membership changes, and the page that draws them."""

from __future__ import annotations

from central.dashboard.routes import STATIC_DIR, create_dashboard_router
from central.dashboard.service import DashboardService, RolloutSource, sse_message
from central.dashboard.snapshot import DashboardSources, build_snapshot

__all__ = [
    "STATIC_DIR",
    "DashboardService",
    "DashboardSources",
    "RolloutSource",
    "build_snapshot",
    "create_dashboard_router",
    "sse_message",
]
