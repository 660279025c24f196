-- idemkey Postgres inbox, schema version 1: one row per (consumer, message id)
-- processed. {{table}}, {{pkey}} and {{processed_index}} are replaced by the
-- quoted (pgx.Identifier) names the inbox is configured with. Every statement
-- is idempotent.
CREATE TABLE IF NOT EXISTS {{table}} (
    consumer     bytea       NOT NULL,               -- the consumer (handler) name, any bytes
    message_id   bytea       NOT NULL,               -- the message's stable id, any bytes
    processed_at timestamptz NOT NULL DEFAULT now(), -- commit of the handler's transaction (server clock)
    CONSTRAINT {{pkey}} PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS {{processed_index}} ON {{table}} (processed_at);
