-- Rollouts, the event journal and API tokens: the same tables as their SQLite/file stores.
CREATE TABLE releases (
    model TEXT PRIMARY KEY,
    stable TEXT,
    epoch BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE rollouts (
    id BIGSERIAL PRIMARY KEY,
    model TEXT NOT NULL,
    state TEXT NOT NULL,
    body JSONB NOT NULL
);
CREATE INDEX rollouts_by_model ON rollouts (model, id);

CREATE TABLE events (
    seq BIGINT PRIMARY KEY,
    ts BIGINT NOT NULL,
    type TEXT NOT NULL,
    node_id TEXT,
    body TEXT NOT NULL
);
CREATE TABLE events_meta (
    key TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);

-- Only sha256(token) is stored, never a token. ``kind`` keeps operator and node tokens apart
-- (two files in the file store).
CREATE TABLE api_tokens (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    created_at TEXT NOT NULL,
    node_id TEXT,
    PRIMARY KEY (kind, name)
);
CREATE INDEX api_tokens_by_hash ON api_tokens (sha256);
