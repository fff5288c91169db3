-- synchro install 00: the schema, its privileges by default, the migration ledger and the
-- settings table.
-- Spec 001 "PostgreSQL schema and authorization", "Installation and migration baseline".
--
-- `synchro-server install` (server-native/src/install.rs) runs the files of this directory
-- concatenated in name order, in one transaction, as a superuser, after the six group roles
-- exist, and records them as ledger version 1 (server-native/sql/README.md). Only the
-- statements above this file's SET LOCAL ROLE run as the installer; every object is created
-- by synchro_owner, which may grant on what it owns.

CREATE SCHEMA synchro AUTHORIZATION synchro_owner;
-- Functions are SECURITY DEFINER: revoke before anything can be created in the schema.
REVOKE ALL ON SCHEMA synchro FROM PUBLIC;
GRANT USAGE ON SCHEMA synchro TO synchro_adapter, synchro_seed, synchro_monitor, synchro_operator, synchro_worker;
-- No function synchro_owner creates is executable by PUBLIC: each file grants EXECUTE to the
-- roles that need it, and repeats the REVOKE beside each function so it reads on its own.
-- (A per-schema default can only add to this global one, so none is set for functions; tables
-- and sequences give PUBLIC nothing by default.) Types would give PUBLIC USAGE: none does
-- either (a table's row type has no privileges of its own); synchro_row_ref, which rule
-- authors' impact functions return, is granted where 41_dependencies creates it.
ALTER DEFAULT PRIVILEGES FOR ROLE synchro_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
ALTER DEFAULT PRIVILEGES FOR ROLE synchro_owner REVOKE USAGE ON TYPES FROM PUBLIC;

-- PostgreSQL lets PUBLIC emit logical messages: only synchro_owner may, through its
-- SECURITY DEFINER fence (31_fences) and bootstrap (32_bootstrap) functions, so no session
-- can forge a fence or a bootstrap marker. Every signature the server has (PostgreSQL 17
-- added a fourth argument, `flush`, with a default: the calls read the same on every version).
-- Only the functions' owner (the bootstrap superuser) can change who may run them: an install
-- by a login that is not a superuser (a managed service's database owner) leaves PUBLIC's
-- EXECUTE, and `synchro-server install --check` reports it (synchro_owner runs them through
-- PUBLIC then).
CREATE FUNCTION pg_temp.synchro_restrict_logical_messages() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_fn regprocedure;
BEGIN
    FOR v_fn IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
                 WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname = 'pg_logical_emit_message'
                   AND pg_catalog.pg_has_role(current_user, p.proowner, 'USAGE') LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_fn);
        IF (SELECT p.proargtypes[2] FROM pg_catalog.pg_proc p WHERE p.oid = v_fn) = 'text'::regtype THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO synchro_owner', v_fn);
        END IF;
    END LOOP;
END $$;
REVOKE EXECUTE ON FUNCTION pg_temp.synchro_restrict_logical_messages() FROM PUBLIC;
SELECT pg_temp.synchro_restrict_logical_messages();

SET LOCAL ROLE synchro_owner;

-- The ledger: one row per applied step (version 1 is this install script; later versions are
-- the upgrade scripts of server-native/sql/upgrades), with the SHA-256 of the text applied.
CREATE TABLE synchro.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    sha256 text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON synchro.schema_migrations FROM PUBLIC;

-- The settings an operator may change (synchro-server settings), each a whole number in
-- its range; the others are fixed by the install. NULL for a key that is not settable.
CREATE FUNCTION synchro.synchro_setting_range(p_key text) RETURNS int8range
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT CASE p_key
        -- Clients not seen for this long expire (and stop holding compaction and the
        -- rollout advisor back).
        WHEN 'client_ttl_days' THEN int8range(1, 3650, '[]')
        WHEN 'rebuild_session_ttl_minutes' THEN int8range(1, 10080, '[]')
        -- A rebuild session no page of which was read for this long loses its rows.
        WHEN 'rebuild_session_idle_minutes' THEN int8range(1, 10080, '[]')
        -- Rows a staged membership rule evaluates per worker transaction.
        WHEN 'backfill_batch_size' THEN int8range(1, 100000, '[]')
        WHEN 'capture_max_heartbeat_age_seconds' THEN int8range(1, 86400, '[]')
        WHEN 'capture_max_wal_lag_bytes' THEN int8range(1, 1000000000000000, '[]')
        WHEN 'capture_max_lag_seconds' THEN int8range(1, 86400, '[]')
    END
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_setting_range(text) FROM PUBLIC;

-- Operator settings, one text value per key; each file inserts the keys it reads. Every
-- value is a positive whole number (no sign, no leading zero), a settable one within its
-- range, whatever writes it (spec 003 "Strict Positive Limits": a value is never clamped or
-- defaulted where it is read, so none that would need it can be stored).
CREATE TABLE synchro.settings (
    key text PRIMARY KEY,
    value text NOT NULL,
    CONSTRAINT settings_value_valid
        CHECK (value ~ '^[1-9][0-9]{0,17}$'
               AND (synchro.synchro_setting_range(key) IS NULL
                    OR value::bigint <@ synchro.synchro_setting_range(key)))
);
REVOKE ALL ON synchro.settings FROM PUBLIC;
GRANT SELECT ON synchro.settings TO synchro_worker;
-- The largest bound a registration or a compaction batch may ask for (spec 003 "Strict
-- Positive Limits").
INSERT INTO synchro.settings (key, value) VALUES ('max_bound', '100000');

-- Every setting with its value and, for a settable one, its range.
CREATE FUNCTION synchro.synchro_settings() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT coalesce(jsonb_object_agg(s.key, jsonb_strip_nulls(jsonb_build_object(
               'value', s.value,
               'min', lower(synchro.synchro_setting_range(s.key)),
               'max', upper(synchro.synchro_setting_range(s.key)) - 1)) ORDER BY s.key), '{}'::jsonb)
      FROM synchro.settings s
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_settings() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_settings() TO synchro_operator, synchro_monitor;

-- Changes one settable setting. A key that is not settable, or a value that is not a whole
-- number in its range, raises 22023 'invalid_setting' with a JSON detail
-- {"key", "reason": "not_settable" | "out_of_range", "min", "max"}. Returns
-- {"key", "value", "previous"}.
CREATE FUNCTION synchro.synchro_set_setting(p_key text, p_value text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_range int8range := synchro.synchro_setting_range(p_key);
    v_previous text;
BEGIN
    SELECT value INTO v_previous FROM synchro.settings WHERE key = p_key FOR UPDATE;
    IF v_range IS NULL OR NOT FOUND THEN
        RAISE EXCEPTION 'invalid_setting' USING ERRCODE = '22023',
            DETAIL = jsonb_build_object('key', p_key, 'reason', 'not_settable')::text;
    END IF;
    IF p_value IS NULL OR p_value !~ '^[0-9]{1,18}$' OR NOT (p_value::bigint <@ v_range) THEN
        RAISE EXCEPTION 'invalid_setting' USING ERRCODE = '22023',
            DETAIL = jsonb_build_object('key', p_key, 'reason', 'out_of_range',
                                        'min', lower(v_range), 'max', upper(v_range) - 1)::text;
    END IF;
    UPDATE synchro.settings SET value = p_value::bigint::text WHERE key = p_key;
    RETURN jsonb_build_object('key', p_key, 'value', p_value::bigint::text, 'previous', v_previous);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_set_setting(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_set_setting(text, text) TO synchro_operator;
