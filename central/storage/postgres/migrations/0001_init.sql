-- Registry metadata: the same two tables as the SQLite store, manifests as JSONB.
CREATE TABLE models (
    name TEXT PRIMARY KEY,
    created_at TEXT NOT NULL
);
CREATE TABLE versions (
    name TEXT NOT NULL REFERENCES models(name),
    version TEXT NOT NULL,
    seq INTEGER NOT NULL,
    manifest JSONB NOT NULL,
    artifacts JSONB NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE INDEX versions_by_seq ON versions (name, seq);
