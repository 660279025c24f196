-- idemkey Postgres store, schema version 1: the records table and its expiry index.
-- {{table}} and {{expires_index}} are replaced by the quoted (pgx.Identifier) names
-- the store is configured with. Every statement is idempotent.
CREATE TABLE IF NOT EXISTS {{table}} (
    scope        bytea       NOT NULL,            -- principal or tenant, any bytes
    key          bytea       NOT NULL,            -- Idempotency-Key value, any bytes
    fingerprint  bytea       NOT NULL,            -- SHA-256 of the request, 32 bytes
    token        bytea       NOT NULL,            -- fencing token of the current holder, 16 bytes
    lease_until  timestamptz,                     -- holder's lease deadline; NULL once completed
    status       smallint,                        -- HTTP status; NULL while in flight
    headers      bytea,                           -- replayable headers (binary encoding, see doc.go); NULL if none
    body         bytea,                           -- exact response body; NULL if empty or omitted
    body_omitted boolean     NOT NULL DEFAULT false, -- body was over the storage cap, replay without it
    created_at   timestamptz NOT NULL,            -- first claim
    completed_at timestamptz,                     -- NULL while in flight
    expires_at   timestamptz NOT NULL,            -- retention deadline: after it the key is new again
    PRIMARY KEY (scope, key)
);
CREATE INDEX IF NOT EXISTS {{expires_index}} ON {{table}} (expires_at);
