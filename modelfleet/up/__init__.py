"""``modelfleet up``: a whole local fleet (broker, central, edges) as child processes of
one command, with the digits model pushed, served and tried through the gateway."""

from __future__ import annotations

from modelfleet.up.errors import UpError
from modelfleet.up.progress import Steps
from modelfleet.up.runner import UpOptions, run_up

__all__ = ["Steps", "UpError", "UpOptions", "run_up"]
