"""PostgreSQL implementations of the storage protocols (``store.url``): the pool, the
migrations, and one store per protocol. Imported only where ``store.url`` is set (psycopg is
the ``[postgres]`` extra)."""
