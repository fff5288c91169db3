-- synchro install 55: portable seeds (spec 001 "Snapshot-bound portable seed export").
--
-- portable_scopes holds the shared scopes an operator declared portable: only their rows
-- may ever be exported into a seed artifact. A scope qualifies only while it is a shared
-- scope (20_assignment: assigned to every user); a user: scope or any other scope assigned
-- by who the user is (grants, the assignment function) never does, since a seed is built
-- without a user and served to anyone holding it. A declaration outlives a later removal
-- of the shared scope, but such a scope is not portable until it is shared again
-- (synchro_portable_scopes says which).

CREATE TABLE synchro.portable_scopes (
    scope_id text PRIMARY KEY CHECK (scope_id <> ''),
    declared_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON synchro.portable_scopes FROM PUBLIC;

-- Declares a shared scope portable. A scope that is not one raises 22023
-- 'invalid_portable_scope' with a JSON detail {"reason": "empty" | "user_scope" |
-- "not_shared"} (the detail never names the scope). Returns {"scope_id", "portable": true,
-- "changed"}: changed is false when it was declared already.
CREATE FUNCTION synchro.synchro_declare_portable_scope(p_scope_id text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_reason text;
    v_changed bigint;
BEGIN
    v_reason := CASE
        WHEN coalesce(p_scope_id, '') = '' THEN 'empty'
        WHEN p_scope_id LIKE 'user:%' THEN 'user_scope'
        WHEN NOT EXISTS (SELECT 1 FROM synchro.shared_scopes s WHERE s.scope_id = p_scope_id) THEN 'not_shared'
    END;
    IF v_reason IS NOT NULL THEN
        RAISE EXCEPTION 'invalid_portable_scope' USING ERRCODE = '22023',
            DETAIL = jsonb_build_object('reason', v_reason)::text;
    END IF;
    INSERT INTO synchro.portable_scopes (scope_id) VALUES (p_scope_id) ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_changed = ROW_COUNT;
    RETURN jsonb_build_object('scope_id', p_scope_id, 'portable', true, 'changed', v_changed > 0);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_declare_portable_scope(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_declare_portable_scope(text) TO synchro_operator;

-- Withdraws a declaration (no later export includes the scope; seeds already built keep
-- it, and connect no longer accepts their receipts for it). Returns {"scope_id",
-- "portable": false, "changed"}: changed is false when it was not declared.
CREATE FUNCTION synchro.synchro_undeclare_portable_scope(p_scope_id text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_changed bigint;
BEGIN
    DELETE FROM synchro.portable_scopes WHERE scope_id = p_scope_id;
    GET DIAGNOSTICS v_changed = ROW_COUNT;
    RETURN jsonb_build_object('scope_id', p_scope_id, 'portable', false, 'changed', v_changed > 0);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_undeclare_portable_scope(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_undeclare_portable_scope(text) TO synchro_operator;

-- The declared scopes in byte order, each with whether it is shared now (only those are
-- portable: exported, and accepted in a receipt).
CREATE FUNCTION synchro.synchro_portable_scopes()
RETURNS TABLE (scope_id text, shared boolean, declared_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT p.scope_id, EXISTS (SELECT 1 FROM synchro.shared_scopes s WHERE s.scope_id = p.scope_id), p.declared_at
      FROM synchro.portable_scopes p ORDER BY convert_to(p.scope_id, 'UTF8')
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_portable_scopes() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_portable_scopes() TO synchro_operator, synchro_seed;

-- ---------------------------------------------------------------------------------------
-- Export (spec 001 "Snapshot-bound portable seed export", "Seed page token", "Seed
-- continuation receipt"). The exporter (`synchro-server seed export`, as a login that is a
-- member of synchro_seed only) runs, on one connection, in one transaction started as
-- BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY DEFERRABLE:
--   1. synchro_seed_export_begin(scopes, page_limit): loads the materialization progress
--      row and creates the transaction-local export state (export_id, a 32-octet nonce);
--      returns the snapshot's facts: schema, stream generation, boundary, each scope's
--      generations and cardinality.
--   2. synchro_seed_scope_rows(scope) for each scope: its rows, from which the exporter
--      computes each scope digest with the protocol core. (The original project computed
--      digests inside PostgreSQL with pgrx; plain SQL cannot run the digest grammar, so the
--      exporter computes them in the same snapshot and the database binds them: see
--      docs/protocol-decisions.md "Portable seeds".)
--   3. synchro_seed_export_seal(checksums, cardinalities): the export manifest, its hash
--      and each scope's first sp1. page token; the database checks the cardinalities.
--   4. synchro_seed_page(token) until each scope's final page, which carries the scope's
--      sc1. continuation receipt instead of a next token. Pages are in unsigned canonical
--      row-identity order; replaying a token in the same transaction returns the same page.
-- Every call checks SERIALIZABLE, READ ONLY and DEFERRABLE. The state lives in a
-- transaction-local setting (set_config(..., true): gone at commit or rollback, absent on
-- any other connection), authenticated with the state key and bound to this backend and
-- transaction, so it cannot be carried into another transaction by hand. Nothing here
-- reads an application relation, and nothing writes.

-- The HMAC keys of the seed tokens and of the export state, each purpose its own (spec 001:
-- page-token keys are not reused for receipts or anything else). Generated at install; only
-- synchro_owner reads them.
CREATE TABLE synchro.seed_keys (
    purpose text NOT NULL CHECK (purpose IN ('page', 'receipt', 'state')),
    key_id text NOT NULL CHECK (key_id ~ '^[a-z0-9-]{1,64}$'),
    key bytea NOT NULL CHECK (octet_length(key) >= 32),
    current boolean NOT NULL DEFAULT true,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (purpose, key_id)
);
CREATE UNIQUE INDEX seed_keys_current ON synchro.seed_keys (purpose) WHERE current;
REVOKE ALL ON synchro.seed_keys FROM PUBLIC;
-- 48 octets from three UUIDv4 (pg_strong_random: 366 random bits).
INSERT INTO synchro.seed_keys (purpose, key_id, key)
SELECT p, p || '-1', decode(replace(gen_random_uuid()::text || gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex')
  FROM unnest(ARRAY['page', 'receipt', 'state']) AS p;

-- HMAC-SHA-256 (RFC 2104) over PostgreSQL's sha256.
CREATE FUNCTION synchro.synchro_hmac_sha256(p_key bytea, p_message bytea) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_key bytea := CASE WHEN octet_length(p_key) > 64 THEN sha256(p_key) ELSE p_key END;
    v_inner bytea;
    v_outer bytea;
BEGIN
    v_key := v_key || decode(repeat('00', 64 - octet_length(v_key)), 'hex');
    v_inner := v_key;
    v_outer := v_key;
    FOR i IN 0 .. 63 LOOP
        v_inner := set_byte(v_inner, i, get_byte(v_key, i) # 54);
        v_outer := set_byte(v_outer, i, get_byte(v_key, i) # 92);
    END LOOP;
    RETURN sha256(v_outer || sha256(v_inner || p_message));
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_hmac_sha256(bytea, bytea) FROM PUBLIC;

-- Equality of two MACs that takes the same time wherever they differ.
CREATE FUNCTION synchro.synchro_equal_in_constant_time(a bytea, b bytea) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_diff integer := 0;
BEGIN
    IF octet_length(a) <> octet_length(b) THEN
        RETURN false;
    END IF;
    FOR i IN 0 .. octet_length(a) - 1 LOOP
        v_diff := v_diff | (get_byte(a, i) # get_byte(b, i));
    END LOOP;
    RETURN v_diff = 0;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_equal_in_constant_time(bytea, bytea) FROM PUBLIC;

-- RFC 4648 base64url without padding, both ways; decoding refuses anything but the one
-- canonical spelling (NULL).
CREATE FUNCTION synchro.synchro_base64url(p bytea) RETURNS text
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT translate(rtrim(replace(encode(p, 'base64'), E'\n', ''), '='), '+/', '-_')
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_base64url(bytea) FROM PUBLIC;

CREATE FUNCTION synchro.synchro_base64url_decode(p text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v bytea;
BEGIN
    IF p !~ '^[A-Za-z0-9_-]*$' OR length(p) % 4 = 1 THEN
        RETURN NULL;
    END IF;
    v := decode(translate(p, '-_', '+/') || repeat('=', (4 - length(p) % 4) % 4), 'base64');
    RETURN CASE WHEN synchro.synchro_base64url(v) = p THEN v END;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_base64url_decode(text) FROM PUBLIC;

-- RFC 8785 text of a JSON value whose member names are ASCII and whose numbers are
-- integers (all the seed objects are): members sorted, no whitespace, strings escaped as
-- PostgreSQL's to_json escapes them (\" \\ \b \f \n \r \t, other control characters as
-- \u00xx in lowercase hex, everything else as is), which is RFC 8785's escaping.
CREATE FUNCTION synchro.synchro_jcs(v jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    CASE jsonb_typeof(v)
        WHEN 'object' THEN
            RETURN '{' || coalesce((SELECT string_agg(to_json(k)::text || ':' || synchro.synchro_jcs(v -> k), ','
                                                      ORDER BY convert_to(k, 'UTF8'))
                                      FROM jsonb_object_keys(v) AS k), '') || '}';
        WHEN 'array' THEN
            RETURN '[' || coalesce((SELECT string_agg(synchro.synchro_jcs(e), ',' ORDER BY o)
                                      FROM jsonb_array_elements(v) WITH ORDINALITY AS a(e, o)), '') || ']';
        WHEN 'string' THEN
            RETURN to_json(v #>> '{}')::text;
        WHEN 'number' THEN
            IF (v #>> '{}') !~ '^-?(0|[1-9][0-9]{0,15})$' THEN
                RAISE EXCEPTION 'synchro_jcs: only integers below 2^53' USING ERRCODE = '22023';
            END IF;
            RETURN v #>> '{}';
        ELSE
            RETURN v::text;
    END CASE;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_jcs(jsonb) FROM PUBLIC;

-- The MAC domain and token prefix of each purpose (protocol/src/token.rs).
CREATE FUNCTION synchro.synchro_seed_domain(p_purpose text) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT convert_to(CASE p_purpose
               WHEN 'page' THEN 'synchro:v3:seed-page:v1'
               WHEN 'receipt' THEN 'synchro:v3:seed-continuation:v1'
               WHEN 'state' THEN 'synchro:v3:seed-export-state:v1' END, 'UTF8') || '\x00'::bytea
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_domain(text) FROM PUBLIC;

-- Signs a payload object with the purpose's current key (its key_id member added):
-- <prefix>.<base64url(RFC 8785 payload)>.<base64url(mac)>.
CREATE FUNCTION synchro.synchro_seed_sign(p_purpose text, p_payload jsonb) RETURNS text
LANGUAGE plpgsql STABLE STRICT SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_key synchro.seed_keys%ROWTYPE;
    v_text bytea;
BEGIN
    SELECT * INTO STRICT v_key FROM synchro.seed_keys WHERE purpose = p_purpose AND current;
    v_text := convert_to(synchro.synchro_jcs(p_payload || jsonb_build_object('key_id', v_key.key_id)), 'UTF8');
    RETURN CASE p_purpose WHEN 'page' THEN 'sp1' WHEN 'receipt' THEN 'sc1' ELSE 'ss1' END
        || '.' || synchro.synchro_base64url(v_text)
        || '.' || synchro.synchro_base64url(synchro.synchro_hmac_sha256(v_key.key, synchro.synchro_seed_domain(p_purpose) || v_text));
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_sign(text, jsonb) FROM PUBLIC;

-- The payload of a token of this purpose whose MAC verifies (in constant time) under the key
-- it names and whose payload is exactly its canonical text; NULL otherwise.
CREATE FUNCTION synchro.synchro_seed_open(p_purpose text, p_token text) RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_parts text[] := string_to_array(p_token, '.');
    v_prefix text := CASE p_purpose WHEN 'page' THEN 'sp1' WHEN 'receipt' THEN 'sc1' ELSE 'ss1' END;
    v_text bytea;
    v_mac bytea;
    v_payload jsonb;
    v_key bytea;
BEGIN
    IF p_token IS NULL OR length(p_token) > 4096 OR cardinality(v_parts) <> 3
       OR v_parts[1] <> v_prefix THEN
        RETURN NULL;
    END IF;
    v_text := synchro.synchro_base64url_decode(v_parts[2]);
    v_mac := synchro.synchro_base64url_decode(v_parts[3]);
    IF v_text IS NULL OR v_mac IS NULL THEN
        RETURN NULL;
    END IF;
    BEGIN
        v_payload := convert_from(v_text, 'UTF8')::jsonb;
    EXCEPTION WHEN others THEN
        RETURN NULL;
    END;
    IF jsonb_typeof(v_payload) <> 'object' OR jsonb_typeof(v_payload -> 'key_id') <> 'string' THEN
        RETURN NULL;
    END IF;
    SELECT k.key INTO v_key FROM synchro.seed_keys k WHERE k.purpose = p_purpose AND k.key_id = v_payload ->> 'key_id';
    IF v_key IS NULL OR NOT synchro.synchro_equal_in_constant_time(
           synchro.synchro_hmac_sha256(v_key, synchro.synchro_seed_domain(p_purpose) || v_text), v_mac) THEN
        RETURN NULL;
    END IF;
    -- Only the exact canonical serialization was ever signed (a duplicate member, which
    -- jsonb drops, fails here too).
    BEGIN
        IF convert_to(synchro.synchro_jcs(v_payload), 'UTF8') <> v_text THEN
            RETURN NULL;
        END IF;
    EXCEPTION WHEN others THEN
        RETURN NULL;
    END;
    RETURN v_payload;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_open(text, text) FROM PUBLIC;

-- The manifest clients are served (publish.rs load_serving_lineage, which this mirrors):
-- the history before the first manifest whose registry generation is not active, cut
-- before the first Class 3 manifest after the first that has a table not yet materialized.
CREATE FUNCTION synchro.synchro_served_manifest(OUT schema_version bigint, OUT schema_hash text, OUT body text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_first_unactivated bigint := (SELECT min(u) FROM synchro.synchro_unactivated_manifests() AS u);
    v_unready text[] := ARRAY(SELECT synchro.synchro_unready_tables());
    v_m record;
    v_first boolean := true;
BEGIN
    FOR v_m IN SELECT m.schema_version, m.schema_hash, m.transition_class, m.body FROM synchro.manifests m
                WHERE v_first_unactivated IS NULL OR m.schema_version < v_first_unactivated
                ORDER BY m.schema_version LOOP
        IF NOT v_first AND v_m.transition_class = 'class_3' AND cardinality(v_unready) > 0
           AND EXISTS (SELECT 1 FROM jsonb_array_elements(v_m.body::jsonb -> 'tables') AS t
                        WHERE t ->> 'table_id' = ANY (v_unready)) THEN
            EXIT;
        END IF;
        schema_version := v_m.schema_version;
        schema_hash := v_m.schema_hash;
        body := v_m.body;
        v_first := false;
    END LOOP;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_served_manifest() FROM PUBLIC;

-- Rows ordered as their canonical row identities (protocol/src/digest.rs RowIdentity:
-- domain, blob(table_id), blob(key field_id), type tag, 0x01, key value; compared as
-- unsigned octets) without building them: by the part that is constant for a relation
-- (synchro_seed_order_prefix), then by the key's own octets, computed inline in
-- synchro_seed_records (as a function, called per row with its pinned search_path, they cost
-- about 10 us a row: half of a 100,000-row export).
-- Prefixes are length-prefixed, so two different ones differ at an octet inside both and
-- (prefix, key) sorts exactly as prefix || key. The key's wire JSON text is read without
-- jsonb where it can be: an int is a JSON number, an int64 a string of digits, a string
-- without a backslash its own text between the quotes.
CREATE FUNCTION synchro.synchro_seed_order_prefix(p_table_id text, p_key_field_id text, p_key_type text)
RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT int8send(octet_length(convert_to(p_table_id, 'UTF8'))) || convert_to(p_table_id, 'UTF8')
        || int8send(octet_length(convert_to(p_key_field_id, 'UTF8'))) || convert_to(p_key_field_id, 'UTF8')
        || CASE p_key_type WHEN 'string' THEN '\x01'::bytea WHEN 'int' THEN '\x02'::bytea ELSE '\x03'::bytea END
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_order_prefix(text, text, text) FROM PUBLIC;


-- Refuses a call outside a SERIALIZABLE READ ONLY DEFERRABLE transaction.
CREATE FUNCTION synchro.synchro_seed_check_transaction() RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_reason text := CASE
        WHEN current_setting('transaction_isolation') <> 'serializable' THEN 'not_serializable'
        WHEN current_setting('transaction_read_only') <> 'on' THEN 'not_read_only'
        WHEN current_setting('transaction_deferrable') <> 'on' THEN 'not_deferrable'
    END;
BEGIN
    IF v_reason IS NOT NULL THEN
        RAISE EXCEPTION 'seed_export_transaction_required' USING ERRCODE = '25000',
            DETAIL = jsonb_build_object('reason', v_reason)::text,
            HINT = 'BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY DEFERRABLE';
    END IF;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_check_transaction() FROM PUBLIC;

-- What binds the export state to this backend and this transaction: the backend's pid, the
-- postmaster's start, the transaction's start and its virtual transaction ID (pg_locks
-- shows every session its own; pg_stat_activity would hide this session's details from
-- synchro_owner).
CREATE FUNCTION synchro.synchro_seed_binding() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT pg_backend_pid()::text || '/' || pg_postmaster_start_time()::text || '/'
        || transaction_timestamp()::text || '/'
        || coalesce((SELECT l.virtualtransaction FROM pg_locks l
                      WHERE l.locktype = 'virtualxid' AND l.pid = pg_backend_pid() LIMIT 1), 'none')
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_binding() FROM PUBLIC;

-- This transaction's export state (NULL when none was begun in it). A state that does not
-- verify (copied from another transaction, edited) is refused.
CREATE FUNCTION synchro.synchro_seed_state() RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_text text := current_setting('synchro.seed_export', true);
    v_state jsonb;
BEGIN
    IF coalesce(v_text, '') = '' THEN
        RETURN NULL;
    END IF;
    v_state := synchro.synchro_seed_open('state', v_text);
    IF v_state IS NULL OR (v_state ->> 'binding') IS NULL
       OR v_state ->> 'binding' IS DISTINCT FROM synchro.synchro_seed_binding() THEN
        RAISE EXCEPTION 'seed_export_state' USING ERRCODE = '25000',
            DETAIL = jsonb_build_object('reason', 'not_this_transaction')::text;
    END IF;
    RETURN v_state;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_state() FROM PUBLIC;

CREATE FUNCTION synchro.synchro_seed_put_state(p_state jsonb) RETURNS void
LANGUAGE sql VOLATILE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT set_config('synchro.seed_export',
                      synchro.synchro_seed_sign('state', p_state || jsonb_build_object('binding', synchro.synchro_seed_binding())),
                      true)
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_put_state(jsonb) FROM PUBLIC;

CREATE FUNCTION synchro.synchro_seed_refuse(p_message text, p_reason text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    RAISE EXCEPTION '%', p_message USING ERRCODE = CASE WHEN p_message = 'seed_export_state' THEN '25000' ELSE '22023' END,
        DETAIL = jsonb_build_object('reason', p_reason)::text;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_refuse(text, text) FROM PUBLIC;

-- Step 1: creates this transaction's export of p_scopes (declared portable, shared now, in
-- any order, each once) with pages of p_page_limit records (1..10000). Returns {export_id,
-- key_id, schema_version, schema_hash, stream_generation, registry_generation,
-- snapshot_boundary, page_limit, scopes: [{scope_id, membership_generation,
-- retention_generation, cardinality}]} with the scopes in byte order. Refusals: 22023
-- 'invalid_seed_export' with a reason (page_limit, no_scopes, duplicate_scope,
-- not_portable, no_manifest), 25000 'seed_export_state' (already_begun).
CREATE FUNCTION synchro.synchro_seed_export_begin(p_scopes text[], p_page_limit integer) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_capture synchro.capture_state%ROWTYPE;
    v_served record;
    v_position bigint;
    v_registry bigint;
    v_scopes jsonb;
    v_facts jsonb;
BEGIN
    PERFORM synchro.synchro_seed_check_transaction();
    IF synchro.synchro_seed_state() IS NOT NULL THEN
        PERFORM synchro.synchro_seed_refuse('seed_export_state', 'already_begun');
    END IF;
    -- The pages sort and keep each scope's records in memory (a 100,000-row scope is about
    -- 20 MB; PostgreSQL's default of 4 MB sent it to disk twice).
    IF pg_size_bytes(current_setting('work_mem')) < 64 * 1024 * 1024 THEN
        PERFORM set_config('work_mem', '64MB', true);
    END IF;
    -- The materialization progress row first: the snapshot is exactly what it says was
    -- materialized.
    SELECT * INTO STRICT v_capture FROM synchro.capture_state;
    IF p_page_limit IS NULL OR p_page_limit NOT BETWEEN 1 AND 10000 THEN
        PERFORM synchro.synchro_seed_refuse('invalid_seed_export', 'page_limit');
    END IF;
    IF coalesce(cardinality(p_scopes), 0) = 0 THEN
        PERFORM synchro.synchro_seed_refuse('invalid_seed_export', 'no_scopes');
    END IF;
    IF (SELECT count(DISTINCT s) FROM unnest(p_scopes) AS s) <> cardinality(p_scopes) THEN
        PERFORM synchro.synchro_seed_refuse('invalid_seed_export', 'duplicate_scope');
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_scopes) AS s
                WHERE s IS NULL
                   OR NOT EXISTS (SELECT 1 FROM synchro.portable_scopes p WHERE p.scope_id = s)
                   OR NOT EXISTS (SELECT 1 FROM synchro.shared_scopes h WHERE h.scope_id = s)) THEN
        PERFORM synchro.synchro_seed_refuse('invalid_seed_export', 'not_portable');
    END IF;
    v_served := synchro.synchro_served_manifest();
    IF v_served.schema_version IS NULL THEN
        PERFORM synchro.synchro_seed_refuse('invalid_seed_export', 'no_manifest');
    END IF;
    v_position := (SELECT w.effect_position FROM synchro.synchro_pull_watermark() AS w);
    v_registry := coalesce((SELECT max(g.generation) FROM synchro.registry_generations g WHERE g.state = 'active'), 0);
    SELECT jsonb_agg(jsonb_build_object(
               'scope_id', s,
               'membership_generation', r.membership_generation::text,
               'retention_generation', r.retention_generation::text,
               'cardinality', (SELECT count(*) FROM synchro.synchro_seed_rows(s, v_served.body))::text)
             ORDER BY convert_to(s, 'UTF8'))
      INTO v_scopes
      FROM unnest(p_scopes) AS s
      JOIN synchro.synchro_scope_retention(p_scopes) AS r ON r.scope_id = s;
    v_facts := jsonb_build_object(
        'export_id', gen_random_uuid()::text,
        'key_id', (SELECT k.key_id FROM synchro.seed_keys k WHERE k.purpose = 'page' AND k.current),
        'schema_version', v_served.schema_version::text,
        'schema_hash', v_served.schema_hash,
        'stream_generation', v_capture.stream_generation::text,
        'registry_generation', v_registry::text,
        'snapshot_boundary', CASE WHEN v_capture.confirmed_lsn = '0/0'::pg_lsn
            THEN jsonb_build_object('kind', 'generation_start', 'position', v_position::text)
            ELSE jsonb_build_object('kind', 'transaction_end', 'commit_lsn', v_capture.confirmed_lsn::text,
                                    'position', v_position::text) END,
        'page_limit', p_page_limit::text,
        'scopes', v_scopes);
    PERFORM synchro.synchro_seed_put_state(jsonb_build_object(
        'phase', 'begun', 'facts', v_facts,
        'nonce', synchro.synchro_base64url(decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'))));
    RETURN v_facts;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_export_begin(text[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_seed_export_begin(text[], integer) TO synchro_seed;

-- A scope's rows of the tables the served manifest (p_body) has.
CREATE FUNCTION synchro.synchro_seed_rows(p_scope text, p_body text)
RETURNS TABLE (table_id text, pk text, row_json text, server_version text)
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT r.table_id, p.pk, p.row_json, p.server_version
      FROM synchro.membership_edges m
      JOIN synchro.projection_rows p ON p.relation_id = m.relation_id AND p.pk = m.pk
      JOIN synchro.relations r ON r.relation_id = m.relation_id
     WHERE m.scope_id = p_scope
       AND r.table_id IN (SELECT t ->> 'table_id' FROM jsonb_array_elements(p_body::jsonb -> 'tables') AS t)
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_rows(text, text) FROM PUBLIC;

-- The same rows as page records ({"pk","row","server_version","table_id"} JSON text, the
-- stored key and row as they are), in canonical row-identity order.
CREATE FUNCTION synchro.synchro_seed_records(p_scope text, p_body text) RETURNS TABLE (record text)
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    -- MATERIALIZED: the prefix once per relation (inlined, the planner called the function
    -- once per row, 3.5 us each).
    WITH k AS MATERIALIZED (
        SELECT r.relation_id, r.table_id, f.portable_type,
               synchro.synchro_seed_order_prefix(r.table_id, f.field_id, f.portable_type) AS prefix
          FROM synchro.relations r JOIN synchro.fields f ON f.relation_id = r.relation_id AND f.is_key
         WHERE r.table_id IN (SELECT t ->> 'table_id' FROM jsonb_array_elements(p_body::jsonb -> 'tables') AS t))
    SELECT '{"pk":' || p.pk || ',"row":' || p.row_json || ',"server_version":' || to_json(p.server_version)::text
           || ',"table_id":' || to_json(k.table_id)::text || '}'
      FROM synchro.membership_edges m
      JOIN k ON k.relation_id = m.relation_id
      JOIN synchro.projection_rows p ON p.relation_id = m.relation_id AND p.pk = m.pk
     WHERE m.scope_id = p_scope
     ORDER BY k.prefix, CASE k.portable_type
        WHEN 'string' THEN (SELECT int8send(octet_length(b)) || b
                              FROM convert_to(CASE WHEN strpos(p.pk, '\') = 0 THEN substr(p.pk, 2, length(p.pk) - 2)
                                                   ELSE p.pk::jsonb #>> '{}' END, 'UTF8') AS b)
        WHEN 'int' THEN int4send(p.pk::integer)
        ELSE int8send(btrim(p.pk, '"')::bigint) END
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_records(text, text) FROM PUBLIC;

-- Step 2: every row of one scope of this export (for its digest), in no particular order.
CREATE FUNCTION synchro.synchro_seed_scope_rows(p_scope text)
RETURNS TABLE (table_id text, pk text, row_json text, server_version text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_state jsonb;
BEGIN
    PERFORM synchro.synchro_seed_check_transaction();
    v_state := synchro.synchro_seed_state();
    IF v_state IS NULL THEN
        PERFORM synchro.synchro_seed_refuse('seed_export_state', 'not_begun');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM jsonb_array_elements(v_state -> 'facts' -> 'scopes') AS s WHERE s ->> 'scope_id' = p_scope) THEN
        PERFORM synchro.synchro_seed_refuse('invalid_seed_export', 'not_in_export');
    END IF;
    RETURN QUERY SELECT r.table_id, r.pk, r.row_json, r.server_version
                   FROM synchro.synchro_seed_rows(p_scope, (synchro.synchro_served_manifest()).body) AS r;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_scope_rows(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_seed_scope_rows(text) TO synchro_seed;

-- Step 3: seals the export with each scope's digest (64 lowercase hex) and the cardinality
-- the exporter observed, both in the scopes' byte order. Returns {manifest (the body the
-- hash covers), export_manifest_hash, page_tokens: {scope: first page token}} and opens one
-- cursor per scope over its rows in identity order. Refusals: 22023 'invalid_seed_export'
-- (checksums, cardinality_mismatch), 25000 'seed_export_state' (not_begun, already_sealed).
CREATE FUNCTION synchro.synchro_seed_export_seal(p_checksums text[], p_cardinalities bigint[]) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_state jsonb;
    v_facts jsonb;
    v_body jsonb;
    v_hash text;
    v_tokens jsonb := '{}';
    v_served text := (synchro.synchro_served_manifest()).body;
    v_cursor refcursor;
    v_n integer;
BEGIN
    PERFORM synchro.synchro_seed_check_transaction();
    v_state := synchro.synchro_seed_state();
    IF v_state IS NULL THEN
        PERFORM synchro.synchro_seed_refuse('seed_export_state', 'not_begun');
    END IF;
    IF v_state ->> 'phase' <> 'begun' THEN
        PERFORM synchro.synchro_seed_refuse('seed_export_state', 'already_sealed');
    END IF;
    v_facts := v_state -> 'facts';
    v_n := jsonb_array_length(v_facts -> 'scopes');
    IF coalesce(cardinality(p_checksums), 0) <> v_n OR coalesce(cardinality(p_cardinalities), 0) <> v_n
       OR EXISTS (SELECT 1 FROM unnest(p_checksums) AS c WHERE c IS NULL OR c !~ '^[0-9a-f]{64}$') THEN
        PERFORM synchro.synchro_seed_refuse('invalid_seed_export', 'checksums');
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(v_facts -> 'scopes') WITH ORDINALITY AS s(e, i)
                WHERE (s.e ->> 'cardinality')::bigint IS DISTINCT FROM p_cardinalities[s.i]) THEN
        PERFORM synchro.synchro_seed_refuse('invalid_seed_export', 'cardinality_mismatch');
    END IF;
    v_body := jsonb_build_object(
        'kind', 'portable_seed_export', 'version', 1,
        'key_id', v_facts -> 'key_id', 'export_id', v_facts -> 'export_id',
        'schema_version', v_facts -> 'schema_version', 'schema_hash', v_facts -> 'schema_hash',
        'stream_generation', v_facts -> 'stream_generation', 'snapshot_boundary', v_facts -> 'snapshot_boundary',
        'page_limit', v_facts -> 'page_limit',
        'scopes', (SELECT jsonb_agg(jsonb_build_object(
                       'scope_id', s.e -> 'scope_id',
                       'registry_generation', v_facts -> 'registry_generation',
                       'membership_generation', s.e -> 'membership_generation',
                       'retention_generation', s.e -> 'retention_generation',
                       'cardinality', s.e -> 'cardinality',
                       'checksum', jsonb_build_object('algorithm', 'sha256', 'version', 1, 'encoding', 'hex',
                                                      'digest', p_checksums[s.i])) ORDER BY s.i)
                     FROM jsonb_array_elements(v_facts -> 'scopes') WITH ORDINALITY AS s(e, i)));
    v_hash := encode(sha256(convert_to('synchro:v3:seed-export-manifest:v1', 'UTF8') || '\x00'::bytea
                            || convert_to(synchro.synchro_jcs(v_body), 'UTF8')), 'hex');
    FOR i IN 1 .. v_n LOOP
        -- The scope's rows in identity order, kept for the transaction: pages move in it.
        v_cursor := 'synchro_seed_' || i;
        OPEN v_cursor SCROLL FOR
            SELECT r.record FROM synchro.synchro_seed_records(v_body -> 'scopes' -> (i - 1) ->> 'scope_id', v_served) AS r;
        v_tokens := v_tokens || jsonb_build_object(v_body -> 'scopes' -> (i - 1) ->> 'scope_id',
            synchro.synchro_seed_page_token(v_state ->> 'nonce', v_hash, v_body, i, 0));
    END LOOP;
    PERFORM synchro.synchro_seed_put_state(v_state || jsonb_build_object('phase', 'sealed', 'body', v_body, 'hash', v_hash));
    RETURN jsonb_build_object('manifest', v_body, 'export_manifest_hash', v_hash, 'page_tokens', v_tokens);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_export_seal(text[], bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_seed_export_seal(text[], bigint[]) TO synchro_seed;

-- The page token payload (without key_id) of scope number p_index (1-based, in the body's
-- order) from p_ordinal, and the token.
CREATE FUNCTION synchro.synchro_seed_page_payload(p_nonce text, p_hash text, p_body jsonb, p_index integer,
    p_ordinal bigint) RETURNS jsonb
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT jsonb_build_object(
        'kind', 'portable_seed_page', 'version', 1,
        'export_id', p_body -> 'export_id', 'transaction_nonce', p_nonce, 'export_manifest_hash', p_hash,
        'schema_hash', p_body -> 'schema_hash',
        'scope_id', p_body -> 'scopes' -> (p_index - 1) -> 'scope_id',
        'registry_generation', p_body -> 'scopes' -> (p_index - 1) -> 'registry_generation',
        'membership_generation', p_body -> 'scopes' -> (p_index - 1) -> 'membership_generation',
        'retention_generation', p_body -> 'scopes' -> (p_index - 1) -> 'retention_generation',
        'stream_generation', p_body -> 'stream_generation', 'snapshot_boundary', p_body -> 'snapshot_boundary',
        'next_row_ordinal', p_ordinal::text, 'page_limit', p_body -> 'page_limit')
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_page_payload(text, text, jsonb, integer, bigint) FROM PUBLIC;

CREATE FUNCTION synchro.synchro_seed_page_token(p_nonce text, p_hash text, p_body jsonb, p_index integer, p_ordinal bigint)
RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT synchro.synchro_seed_sign('page', synchro.synchro_seed_page_payload(p_nonce, p_hash, p_body, p_index, p_ordinal))
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_page_token(text, text, jsonb, integer, bigint) FROM PUBLIC;

-- The next p_count records of a scope's cursor (one FETCH, not one per record).
CREATE FUNCTION synchro.synchro_seed_fetch(p_cursor text, p_count integer) RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    RETURN QUERY EXECUTE format('FETCH FORWARD %s FROM %I', p_count, p_cursor);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_fetch(text, integer) FROM PUBLIC;

-- Step 4: one page. The token must be one this export issued in this transaction (MAC and
-- every binding); returns the JSON text {"records": [{"table_id", "pk", "row",
-- "server_version"}], "next_page_token"} or, on the scope's final page, {"records",
-- "receipt"} with the scope's sc1. continuation receipt. Rows and keys are their stored
-- canonical wire JSON, as stored. Refusals: 22023 'invalid_seed_page_token' (reason
-- malformed_or_forged, other_export, ordinal), 25000 'seed_export_state' (not_sealed).
CREATE FUNCTION synchro.synchro_seed_page(p_token text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_state jsonb;
    v_body jsonb;
    v_token jsonb;
    v_index integer;
    v_scope jsonb;
    v_ordinal bigint;
    v_limit integer;
    v_count bigint;
    v_cursor refcursor;
    v_records text;
    v_end text;
BEGIN
    PERFORM synchro.synchro_seed_check_transaction();
    v_state := synchro.synchro_seed_state();
    IF v_state IS NULL OR v_state ->> 'phase' <> 'sealed' THEN
        PERFORM synchro.synchro_seed_refuse('seed_export_state', 'not_sealed');
    END IF;
    v_body := v_state -> 'body';
    v_token := synchro.synchro_seed_open('page', p_token);
    IF v_token IS NULL OR v_token ->> 'next_row_ordinal' !~ '^(0|[1-9][0-9]{0,17})$' THEN
        PERFORM synchro.synchro_seed_refuse('invalid_seed_page_token', 'malformed_or_forged');
    END IF;
    SELECT s.i::integer INTO v_index FROM jsonb_array_elements(v_body -> 'scopes') WITH ORDINALITY AS s(e, i)
     WHERE s.e -> 'scope_id' = v_token -> 'scope_id';
    v_ordinal := (v_token ->> 'next_row_ordinal')::bigint;
    -- Every binding: the token must be exactly the one this export issues for its ordinal.
    IF v_index IS NULL OR (v_token - 'key_id') IS DISTINCT FROM
           synchro.synchro_seed_page_payload(v_state ->> 'nonce', v_state ->> 'hash', v_body, v_index, v_ordinal) THEN
        PERFORM synchro.synchro_seed_refuse('invalid_seed_page_token', 'other_export');
    END IF;
    v_scope := v_body -> 'scopes' -> (v_index - 1);
    v_limit := (v_body ->> 'page_limit')::integer;
    v_count := (v_scope ->> 'cardinality')::bigint;
    IF v_ordinal % v_limit <> 0 OR (v_ordinal >= v_count AND v_ordinal > 0) THEN
        PERFORM synchro.synchro_seed_refuse('invalid_seed_page_token', 'ordinal');
    END IF;
    v_cursor := 'synchro_seed_' || v_index;
    MOVE ABSOLUTE v_ordinal FROM v_cursor;
    IF v_count > v_ordinal THEN
        SELECT string_agg(f.record, ',' ORDER BY f.n) INTO v_records
          FROM synchro.synchro_seed_fetch('synchro_seed_' || v_index, least(v_limit, v_count - v_ordinal)::integer)
               WITH ORDINALITY AS f(record, n);
    END IF;
    IF v_ordinal + v_limit < v_count THEN
        v_end := '"next_page_token":' || to_json(synchro.synchro_seed_page_token(
            v_state ->> 'nonce', v_state ->> 'hash', v_body, v_index, v_ordinal + v_limit))::text;
    ELSE
        v_end := '"receipt":' || to_json(synchro.synchro_seed_sign('receipt', jsonb_build_object(
            'kind', 'portable_seed_continuation', 'version', 1,
            'export_id', v_body -> 'export_id', 'export_manifest_hash', v_state -> 'hash',
            'schema_hash', v_body -> 'schema_hash', 'scope_id', v_scope -> 'scope_id',
            'registry_generation', v_scope -> 'registry_generation',
            'membership_generation', v_scope -> 'membership_generation',
            'retention_generation', v_scope -> 'retention_generation',
            'stream_generation', v_body -> 'stream_generation', 'snapshot_boundary', v_body -> 'snapshot_boundary',
            'cardinality', v_scope -> 'cardinality', 'checksum', v_scope -> 'checksum',
            'issued_at', to_char(transaction_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))))::text;
    END IF;
    RETURN '{' || v_end || ',"records":[' || coalesce(v_records, '') || ']}';
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_page(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_seed_page(text) TO synchro_seed;

-- Connect's side of a receipt (the adapter): the bindings of a seed continuation receipt
-- whose MAC verifies (in constant time) under a receipt key and whose payload is exactly
-- its canonical text, with what connect compares them with: whether its scope is portable
-- now (declared and shared) and the registry generation now. No row for a receipt that
-- does not verify. Connect checks the rest (schema, assignment, stream, membership and
-- retention generations, the resume floor) and issues a cursor at the boundary.
CREATE FUNCTION synchro.synchro_seed_receipt(p_receipt text)
RETURNS TABLE (scope_id text, schema_hash text, stream_generation bigint, registry_generation bigint,
               membership_generation bigint, retention_generation bigint, boundary_position bigint,
               portable boolean, current_registry_generation bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v jsonb := synchro.synchro_seed_open('receipt', p_receipt);
BEGIN
    IF v IS NULL OR v ->> 'kind' IS DISTINCT FROM 'portable_seed_continuation' THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT v ->> 'scope_id', v ->> 'schema_hash', (v ->> 'stream_generation')::bigint,
        (v ->> 'registry_generation')::bigint, (v ->> 'membership_generation')::bigint,
        (v ->> 'retention_generation')::bigint, (v -> 'snapshot_boundary' ->> 'position')::bigint,
        EXISTS (SELECT 1 FROM synchro.portable_scopes p WHERE p.scope_id = v ->> 'scope_id')
            AND EXISTS (SELECT 1 FROM synchro.shared_scopes h WHERE h.scope_id = v ->> 'scope_id'),
        coalesce((SELECT max(g.generation) FROM synchro.registry_generations g WHERE g.state = 'active'), 0);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_seed_receipt(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_seed_receipt(text) TO synchro_adapter;
