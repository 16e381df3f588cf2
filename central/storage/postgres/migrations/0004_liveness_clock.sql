-- Each node's clock offset from central, as its last heartbeat said ([offset_ms, error_ms], or
-- NULL while unknown): the leader's rollouts refuse a staged flip to a node whose clock is
-- unknown, whichever replica reads that node's heartbeats.
ALTER TABLE ha_liveness ADD COLUMN clock JSONB;
