-- examples/accounts Postgres projection, schema version 1 (docs/account-service.md section 4.2).
-- {{balances}}, {{responses}} and {{responses_expires}} are replaced by the quoted
-- (pgx.Identifier) names the projection is configured with. Every statement is idempotent.

-- The projection: one row per account, the cursor next to the state it summarises.
CREATE TABLE IF NOT EXISTS {{balances}} (
    account_id      uuid        PRIMARY KEY,
    account_name    text        NOT NULL DEFAULT '',  -- '' for accounts that are not seeded
    balance_cents   bigint      NOT NULL DEFAULT 0,   -- sum of the folded events, cents
    last_version    bigint      NOT NULL DEFAULT 0,   -- the cursor: last folded aggregate version
    last_client_seq bigint      NOT NULL DEFAULT 0,   -- highest ClientSeq folded from the service's client id
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- The dedup index, colocated with the cursor: the response each request produced.
CREATE TABLE IF NOT EXISTS {{responses}} (
    event_id          uuid        NOT NULL,  -- the request's EventId
    aggregate_id      uuid        NOT NULL,  -- the account the event landed on
    balance_cents     bigint      NOT NULL,  -- balance right after the event
    aggregate_version bigint      NOT NULL,  -- version of the event's batch
    expires_at        timestamptz NOT NULL,  -- end of the dedup window, on the database clock
    PRIMARY KEY (event_id, aggregate_id)
);
CREATE INDEX IF NOT EXISTS {{responses_expires}} ON {{responses}} (expires_at);
