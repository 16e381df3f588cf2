-- Replicated central (ha.replica_id): who leads, who owns which heartbeat partition, which
-- replicas are up, and the fleet state every replica routes and places from.

-- One row. ``epoch`` grows by one at every election; the leader's writes check it (fencing).
CREATE TABLE ha_leader (
    id SMALLINT PRIMARY KEY CHECK (id = 1),
    epoch BIGINT NOT NULL DEFAULT 0,
    replica_id TEXT,
    since TIMESTAMPTZ
);
INSERT INTO ha_leader (id) VALUES (1);

-- A heartbeat partition's owner; ``epoch`` grows at every takeover and fences liveness writes.
CREATE TABLE ha_partitions (
    partition INTEGER PRIMARY KEY,
    epoch BIGINT NOT NULL DEFAULT 0,
    replica_id TEXT,
    since TIMESTAMPTZ
);

-- Replicas that are up: a row per replica, renewed every tick; ``backend_pid`` is the pid of its
-- control session, so a replica whose session is gone is gone at once (pg_stat_activity).
CREATE TABLE ha_replicas (
    replica_id TEXT PRIMARY KEY,
    http_url TEXT NOT NULL,
    grpc_address TEXT NOT NULL,
    backend_pid INTEGER,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    info JSONB NOT NULL DEFAULT '{}'::jsonb
);

-- One row: grows at every change of the fleet state below (and of registry/rollouts that others
-- must re-read). NOTIFY modelfleet_fleet carries it as a wake-up only.
CREATE TABLE ha_generation (
    id SMALLINT PRIMARY KEY CHECK (id = 1),
    gen BIGINT NOT NULL DEFAULT 0,
    -- grows with gen only for changes in other tables (registry, rollouts): a replica re-plans
    -- for those, not for every liveness write
    config_gen BIGINT NOT NULL DEFAULT 0
);
INSERT INTO ha_generation (id) VALUES (1);

-- Registered edges (what Register announced), whichever replica took the call.
CREATE TABLE ha_nodes (
    node_id TEXT PRIMARY KEY,
    record JSONB NOT NULL,
    gen BIGINT NOT NULL
);

-- Liveness transitions and the models each node reports, written by the owner of the node's partition (fenced).
CREATE TABLE ha_liveness (
    node_id TEXT PRIMARY KEY,
    partition INTEGER NOT NULL,
    state TEXT NOT NULL,
    http_address TEXT NOT NULL DEFAULT '',
    models JSONB NOT NULL DEFAULT '[]'::jsonb,
    gen BIGINT NOT NULL
);

-- The leader's placement (one row), written fenced by its epoch; followers serve it.
CREATE TABLE ha_placement (
    id SMALLINT PRIMARY KEY CHECK (id = 1),
    epoch BIGINT NOT NULL,
    gen BIGINT NOT NULL,
    body JSONB NOT NULL
);

-- Files every replica must hold alike: the manifest signing key (PEM) and its endorsement
-- chain. The first replica to start stores its own; the others take them (docs/security.md).
CREATE TABLE ha_shared_files (
    name TEXT PRIMARY KEY,
    body BYTEA NOT NULL
);

-- The event journal of each replica: its own sequence numbers, side by side.
ALTER TABLE events ADD COLUMN replica TEXT NOT NULL DEFAULT '';
ALTER TABLE events DROP CONSTRAINT events_pkey;
ALTER TABLE events ADD PRIMARY KEY (replica, seq);
ALTER TABLE events_meta ADD COLUMN replica TEXT NOT NULL DEFAULT '';
ALTER TABLE events_meta DROP CONSTRAINT events_meta_pkey;
ALTER TABLE events_meta ADD PRIMARY KEY (replica, key);

-- A replica re-reads only what changed since the generation it last saw.
CREATE INDEX ha_liveness_gen ON ha_liveness (gen);
CREATE INDEX ha_nodes_gen ON ha_nodes (gen);
