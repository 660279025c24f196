-- idemkey Postgres store, partitioned layout, schema version 2: the functions.
-- Advisory locks: a key's lock is of the single-bigint form, the table's hash
-- ({{lock_class}}) in its high half and the key's in its low half; the table-level
-- locks (partition creation: ({{lock_class}}, 0); the sweep: ({{lock_class}}, 1))
-- are of the two-int4 form. Postgres keeps the two forms apart (pg_locks shows a
-- bigint key with objsubid 1, two int4 keys with objsubid 2: the functions' docs
-- say the key spaces do not overlap), so no key, whatever its hash, waits on them.
--
-- {{claim_fn}} is the claim: under an advisory lock on the key it reads the key's row in every partition, then inserts into the current epoch's
-- partition, takes over in place, or answers from the row, in the shape of the
-- plain layout's claim statement. A row past its retention is deleted, not
-- revived, so an old partition never gains a live row. Liveness is judged on
-- clock_timestamp(), read after the statement's locks are granted (see {{expired_fn}}).
-- An insert that finds the clock past its epoch's end undoes itself and inserts
-- again: the sweep may have judged that partition wholly expired before the insert
-- locked it. The advisory lock stands in for a unique index only if each statement
-- sees the commits before it, so the claim refuses any isolation but READ COMMITTED.
CREATE OR REPLACE FUNCTION {{claim_fn}}(p_scope bytea, p_key bytea, p_fp bytea, p_tok bytea, p_lease bigint, p_ret bigint)
RETURNS TABLE (o_claimed boolean, o_takeover boolean, o_same_fp boolean, o_status smallint, o_headers bytea,
               o_body bytea, o_omitted boolean, o_created timestamptz, o_completed timestamptz,
               o_expires timestamptz, o_retry_ms bigint, o_stale boolean)
LANGUAGE plpgsql AS $idemkey$
DECLARE
    r {{table}}%ROWTYPE;
    t timestamptz;
    e bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'idemkey: the partitioned layout''s claim needs READ COMMITTED, not %', current_setting('transaction_isolation')
            USING ERRCODE = '0A000', HINT = 'set default_transaction_isolation to read committed for the store''s connections';
    END IF;
    PERFORM pg_advisory_xact_lock({{key_lock_base}}::bigint
        | (hashtext(encode(sha256(int4send(length(p_scope)) || p_scope || p_key), 'hex'))::bigint & 4294967295));
    FOR attempt IN 1..5 LOOP
        t := clock_timestamp();
        SELECT * INTO r FROM {{table}} x WHERE x.scope = p_scope AND x.key = p_key ORDER BY x.expires_at DESC LIMIT 1;
        IF NOT FOUND THEN
            e := floor(extract(epoch FROM t) / {{epoch_seconds}})::bigint;
            INSERT INTO {{table}} (epoch, scope, key, fingerprint, token, lease_until, created_at, expires_at)
            VALUES (e, p_scope, p_key, p_fp, p_tok,
                    t + p_lease * interval '1 millisecond', t, t + p_ret * interval '1 millisecond');
            -- Still the epoch of t once the partition is locked: a sweep that checks it
            -- now waits for this commit and sees the row.
            IF floor(extract(epoch FROM clock_timestamp()) / {{epoch_seconds}})::bigint = e THEN
                RETURN QUERY SELECT true, false, true, NULL::smallint, NULL::bytea, NULL::bytea, false,
                    NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::bigint, false;
                RETURN;
            END IF;
            DELETE FROM {{table}} x WHERE x.epoch = e AND x.scope = p_scope AND x.key = p_key AND x.token = p_tok;
        ELSIF r.expires_at <= t THEN -- a new key: delete the old record, insert at the next attempt
            DELETE FROM {{table}} x WHERE x.epoch = r.epoch AND x.scope = p_scope AND x.key = p_key
                AND x.expires_at <= clock_timestamp();
        ELSIF r.status IS NULL AND r.lease_until <= t AND r.fingerprint = p_fp THEN
            UPDATE {{table}} x SET token = p_tok, lease_until = t + p_lease * interval '1 millisecond',
                   expires_at = t + p_ret * interval '1 millisecond'
            WHERE x.epoch = r.epoch AND x.scope = p_scope AND x.key = p_key AND x.token = r.token
              AND x.status IS NULL AND x.lease_until <= clock_timestamp() AND x.expires_at > clock_timestamp();
            IF FOUND THEN
                RETURN QUERY SELECT true, true, true, NULL::smallint, NULL::bytea, NULL::bytea, false,
                    NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::bigint, false;
                RETURN;
            END IF; -- renewed, completed or released meanwhile: look again
        ELSE
            RETURN QUERY SELECT false, false, r.fingerprint = p_fp, r.status,
                CASE WHEN r.fingerprint = p_fp THEN r.headers END, CASE WHEN r.fingerprint = p_fp THEN r.body END,
                r.body_omitted, r.created_at, r.completed_at, r.expires_at,
                ceil(extract(epoch FROM r.lease_until - t) * 1000)::bigint, false;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'idemkey: claim: no definite answer after 5 attempts' USING ERRCODE = '40001';
END
$idemkey$;

-- {{ensure_fn}} creates the partitions of the current epoch and the p_ahead next
-- ones that are missing (CREATE TABLE, then ATTACH PARTITION, which takes only a
-- SHARE UPDATE EXCLUSIVE lock on the records table, so claims go on), one caller
-- at a time. It returns how many it created.
CREATE OR REPLACE FUNCTION {{ensure_fn}}(p_ahead integer) RETURNS integer
LANGUAGE plpgsql AS $idemkey$
DECLARE
    parent regclass := {{table_literal}}::regclass;
    nsp    text;
    cur    bigint := floor(extract(epoch FROM clock_timestamp()) / {{epoch_seconds}})::bigint;
    made   integer := 0;
    part   text;
BEGIN
    PERFORM pg_advisory_xact_lock({{lock_class}}, 0);
    SELECT n.nspname INTO nsp FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = parent;
    FOR e IN cur .. cur + p_ahead LOOP
        part := {{part_prefix}} || e;
        CONTINUE WHEN EXISTS (SELECT FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                              WHERE i.inhparent = parent AND c.relname = part);
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I.%I (LIKE %s INCLUDING DEFAULTS)', nsp, part, parent);
        EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I.%I FOR VALUES FROM (%s) TO (%s)', parent, nsp, part, e, e + 1);
        made := made + 1;
    END LOOP;
    RETURN made;
END
$idemkey$;

-- {{expired_fn}} tells whether every row of a partition is past its retention.
-- It first takes a SHARE lock on the partition (waiting at most p_wait_ms): that
-- waits for the transactions writing to it and holds off new writers, so no
-- statement judged a row live before the check and commits after it; writers
-- judge liveness on clock_timestamp(), later than the check, and no statement
-- makes an expired row live again.
CREATE OR REPLACE FUNCTION {{expired_fn}}(p_part regclass, p_wait_ms integer) RETURNS boolean
LANGUAGE plpgsql AS $idemkey$
DECLARE
    live boolean;
BEGIN
    PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
    EXECUTE format('LOCK TABLE %s IN SHARE MODE', p_part);
    EXECUTE format('SELECT EXISTS (SELECT FROM %s WHERE expires_at > clock_timestamp())', p_part) INTO live;
    RETURN NOT live;
END
$idemkey$;

-- {{drop_detached_fn}} drops the partitions a sweep detached but did not drop (it
-- stopped between DETACH PARTITION CONCURRENTLY and DROP TABLE), which no longer
-- show among the records table's partitions. It drops only a table that is all of:
-- in the records table's schema, named exactly {{part_prefix}} and digits (as
-- {{ensure_fn}} names them), a plain table attached to nothing, of an epoch before
-- the current one, and commented {{detached_comment}} (the sweep comments a
-- partition so just before it detaches it). A partition detached by hand carries
-- no such comment and is left alone. It re-checks under an ACCESS EXCLUSIVE lock
-- and returns the dropped tables' estimated row counts (pg_class.reltuples), summed.
CREATE OR REPLACE FUNCTION {{drop_detached_fn}}() RETURNS bigint
LANGUAGE plpgsql AS $idemkey$
DECLARE
    parent regclass := {{table_literal}}::regclass;
    prefix text := {{part_prefix}};
    cur    bigint := floor(extract(epoch FROM clock_timestamp()) / {{epoch_seconds}})::bigint;
    part   regclass;
    est    bigint;
    total  bigint := 0;
BEGIN
    FOR part, est IN
        SELECT c.oid::regclass, greatest(c.reltuples, 0)::bigint FROM pg_class c
        WHERE c.relnamespace = (SELECT p.relnamespace FROM pg_class p WHERE p.oid = parent)
          AND c.relkind = 'r' AND NOT c.relispartition
          AND starts_with(c.relname, prefix)
          AND substr(c.relname, length(prefix) + 1) ~ '^[1-9][0-9]{0,17}$'
          AND substr(c.relname, length(prefix) + 1)::bigint < cur
          AND obj_description(c.oid, 'pg_class') = {{detached_comment}}
    LOOP
        EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', part);
        CONTINUE WHEN EXISTS (SELECT FROM pg_inherits i WHERE i.inhrelid = part OR i.inhparent = part)
            OR obj_description(part, 'pg_class') IS DISTINCT FROM {{detached_comment}};
        EXECUTE format('DROP TABLE %s', part);
        total := total + est;
    END LOOP;
    RETURN total;
END
$idemkey$;
