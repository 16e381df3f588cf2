"""modelfleet benchmarks: reproducible measurements behind the design targets."""
