-- idemkey Postgres store, schema version 2: the waiters flag. A duplicate that
-- waits for a claim in flight sets it (store.Waiter); Complete and Release then
-- NOTIFY the store's channel, and only then, so a key nobody waits for costs no
-- notification. Adding a column with a constant default rewrites no row.
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS waiters boolean NOT NULL DEFAULT false;
