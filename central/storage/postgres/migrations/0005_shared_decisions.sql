-- Decisions every replica must keep alike, and keep over a restart (docs/replicas.md).

-- What central decided beyond the registry and the rollouts, by kind: INT8 drift flags and
-- fallbacks (``drift_flag``), the baselines an operator's clear set (``drift_baseline``),
-- artifact verdicts (``verdict``), the transfer policy (``transfer``). A leader's decision is
-- written fenced by its epoch (``epoch``: the one it held), a verdict first-wins.
CREATE TABLE decisions (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    body JSONB NOT NULL,
    epoch BIGINT,
    written_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, key)
);

-- The live shadow counts each node last reported (drift: candidate ''; pending INT8: its
-- artifact), written by the replica that heard the heartbeat; ``seq`` grows at every write, so
-- the leader reads only what changed since it last looked.
CREATE SEQUENCE shadow_counts_seq;
CREATE TABLE shadow_counts (
    kind TEXT NOT NULL,
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    candidate TEXT NOT NULL,
    node_id TEXT NOT NULL,
    artifact TEXT NOT NULL,
    raw JSONB NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    seq BIGINT NOT NULL,
    PRIMARY KEY (kind, model, version, candidate, node_id)
);
CREATE INDEX shadow_counts_seq_idx ON shadow_counts (kind, seq);

-- A rollout's revision: every write names the one it read and bumps it, so a write made on a
-- stale read (another replica wrote meanwhile) is refused instead of overwriting.
ALTER TABLE rollouts ADD COLUMN rev BIGINT NOT NULL DEFAULT 0;
