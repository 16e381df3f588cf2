"""Replicated central (issue 13): the control session that elects one leader and spreads heartbeat
partitions over the live replicas, the fencing that keeps a stale one from writing, and the
fleet state replicas share. Import the modules themselves: they need psycopg (the [postgres]
extra), which a single central does not."""
