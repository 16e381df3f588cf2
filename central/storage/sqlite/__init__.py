"""SQLite implementations of the storage protocols (one ``central.sqlite3``)."""
