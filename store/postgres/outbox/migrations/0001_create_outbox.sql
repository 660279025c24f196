-- idemkey Postgres outbox, schema version 1: one row per message committed and
-- not yet published. {{table}}, {{pkey}} and {{id_key}} are replaced by the
-- quoted (pgx.Identifier) names the outbox is configured with. Every statement
-- is idempotent.
CREATE TABLE IF NOT EXISTS {{table}} (
    seq        bigint      GENERATED ALWAYS AS IDENTITY, -- publishing order
    message_id text        NOT NULL,                     -- the stable id every publish carries
    topic      text        NOT NULL,                     -- where the relay publishes it (a subject)
    payload    bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),       -- start of the enqueuing transaction
    CONSTRAINT {{pkey}} PRIMARY KEY (seq),
    CONSTRAINT {{id_key}} UNIQUE (message_id)
);
