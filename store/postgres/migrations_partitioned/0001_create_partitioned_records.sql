-- idemkey Postgres store, partitioned layout (WithPartitions), schema version 1:
-- the records table partitioned by RANGE on epoch, the number of the epoch a record
-- was claimed in (floor(unix seconds / epoch length)); one partition per epoch,
-- named "<table>_p<epoch>", created ahead and dropped whole by the store's sweep.
-- There is no primary key: a unique index must contain the partition column, so
-- the claim function below keeps (scope, key) unique under an advisory lock.
-- The table's comment records the epoch length; Migrate refuses another.
-- {{table}}, {{expires_index}}, {{id_index}} and {{epoch_comment}} are rendered by the store.
CREATE TABLE IF NOT EXISTS {{table}} (
    epoch        bigint      NOT NULL,            -- epoch of the claim that inserted the row: its partition
    scope        bytea       NOT NULL,
    key          bytea       NOT NULL,
    fingerprint  bytea       NOT NULL,
    token        bytea       NOT NULL,
    lease_until  timestamptz,
    status       smallint,
    headers      bytea,
    body         bytea,
    body_omitted boolean     NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL,
    completed_at timestamptz,
    expires_at   timestamptz NOT NULL,
    waiters      boolean     NOT NULL DEFAULT false
) PARTITION BY RANGE (epoch);
CREATE INDEX IF NOT EXISTS {{id_index}} ON {{table}} (scope, key);
CREATE INDEX IF NOT EXISTS {{expires_index}} ON {{table}} (expires_at);
COMMENT ON TABLE {{table}} IS {{epoch_comment}};
