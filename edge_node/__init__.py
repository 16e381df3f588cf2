"""modelfleet edge node: cache, fetch, peer server."""
