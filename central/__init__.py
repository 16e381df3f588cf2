"""modelfleet central: registry, placement, origin."""
