-- idemkey MySQL/MariaDB store, schema version 1: the records table and its expiry
-- index. {{table}} is replaced by the quoted name the store is configured with.
-- Times are DATETIME(6) in UTC, written from the server's UTC_TIMESTAMP(6).
CREATE TABLE IF NOT EXISTS {{table}} (
    scope        VARBINARY(1024) NOT NULL,          -- principal or tenant, any bytes
    `key`        VARBINARY(255)  NOT NULL,          -- Idempotency-Key value, any bytes
    fingerprint  BINARY(32)      NOT NULL,          -- SHA-256 of the request
    token        BINARY(16)      NOT NULL,          -- fencing token of the current holder
    lease_until  DATETIME(6)     NULL,              -- holder's lease deadline; NULL once completed
    status       SMALLINT        NULL,              -- HTTP status; NULL while in flight
    headers      MEDIUMBLOB      NULL,              -- replayable headers (store/codec); NULL if none
    body         LONGBLOB        NULL,              -- exact response body; NULL if empty or omitted
    body_omitted BOOLEAN         NOT NULL DEFAULT FALSE, -- body was over the storage cap
    created_at   DATETIME(6)     NOT NULL,          -- first claim
    completed_at DATETIME(6)     NULL,              -- NULL while in flight
    expires_at   DATETIME(6)     NOT NULL,          -- retention deadline: after it the key is new again
    PRIMARY KEY (scope, `key`),
    KEY {{expires_index}} (expires_at)
) ENGINE = InnoDB
