-- synchro schema, version 1: registry, manifests, scope assignment, clients, readiness.
-- Applied by `synchro-server install` (server-native/src/install.rs) inside one transaction,
-- as a superuser, after the six group roles exist. Objects are created as synchro_owner.
-- Never edit an applied migration: add the next one (the ledger records each file's SHA-256).

CREATE SCHEMA synchro AUTHORIZATION synchro_owner;
-- Functions are SECURITY DEFINER: revoke before anything can be created in the schema.
REVOKE ALL ON SCHEMA synchro FROM PUBLIC;
ALTER DEFAULT PRIVILEGES FOR ROLE synchro_owner IN SCHEMA synchro REVOKE ALL ON TABLES FROM PUBLIC;
ALTER DEFAULT PRIVILEGES FOR ROLE synchro_owner IN SCHEMA synchro REVOKE ALL ON SEQUENCES FROM PUBLIC;
ALTER DEFAULT PRIVILEGES FOR ROLE synchro_owner IN SCHEMA synchro REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
ALTER DEFAULT PRIVILEGES FOR ROLE synchro_owner IN SCHEMA synchro REVOKE USAGE ON TYPES FROM PUBLIC;
ALTER DEFAULT PRIVILEGES FOR ROLE synchro_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
-- PostgreSQL 15 lets PUBLIC emit logical messages; only the trigger path may forge fences.
REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, bytea) FROM PUBLIC;

SET LOCAL ROLE synchro_owner;

CREATE TABLE synchro.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    sha256 text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- Registered source relations. Physical identity is recorded at registration and never
-- rebound; IDs are opaque and random, never derived from names.
CREATE TABLE synchro.relations (
    relation_id text PRIMARY KEY,
    kind text NOT NULL CHECK (kind IN ('synced', 'capture_dependency')),
    physical_schema name NOT NULL,
    physical_relation name NOT NULL,
    physical_relation_oid oid NOT NULL UNIQUE,
    replica_identity "char" NOT NULL,
    capture_key_column name NOT NULL,
    primary_key_type oid NOT NULL,
    table_id text UNIQUE,
    table_name text,
    composition text CHECK (composition IN ('single_scope', 'multi_scope')),
    push_enabled boolean NOT NULL,
    fanout_bound integer NOT NULL,
    impact_bound integer NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((kind = 'synced') = (table_id IS NOT NULL AND table_name IS NOT NULL AND composition IS NOT NULL))
);

CREATE TABLE synchro.fields (
    relation_id text NOT NULL REFERENCES synchro.relations,
    field_id text NOT NULL,
    column_name name NOT NULL,
    attnum smallint NOT NULL,
    portable_type text NOT NULL CHECK (portable_type IN
        ('string', 'int', 'int64', 'decimal', 'float', 'boolean', 'datetime', 'date', 'time', 'json', 'bytes')),
    nullable boolean NOT NULL,
    writable boolean NOT NULL,
    is_key boolean NOT NULL,
    decimal_precision integer,
    decimal_scale integer,
    PRIMARY KEY (relation_id, field_id),
    UNIQUE (relation_id, attnum),
    CHECK ((portable_type = 'decimal') = (decimal_precision IS NOT NULL AND decimal_scale IS NOT NULL))
);

-- Immutable manifest records: inserted once, never updated or deleted.
CREATE TABLE synchro.manifests (
    schema_version bigint PRIMARY KEY CHECK (schema_version BETWEEN 1 AND 9007199254740991),
    schema_hash text NOT NULL UNIQUE CHECK (schema_hash ~ '^[0-9a-f]{64}$'),
    body text NOT NULL,
    parent_version bigint REFERENCES synchro.manifests,
    parent_hash text,
    transition_class text NOT NULL CHECK (transition_class IN ('initial', 'class_2', 'class_3', 'class_4')),
    compatibility_floor bigint NOT NULL,
    published_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((parent_version IS NULL) = (transition_class = 'initial'))
);

CREATE FUNCTION synchro.synchro_manifest_immutable() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'published manifests are immutable' USING ERRCODE = '55000';
END $$;
CREATE TRIGGER synchro_manifests_immutable BEFORE UPDATE OR DELETE OR TRUNCATE ON synchro.manifests
    FOR EACH STATEMENT EXECUTE FUNCTION synchro.synchro_manifest_immutable();

-- Scope assignment.
CREATE TABLE synchro.shared_scopes (scope_id text PRIMARY KEY CHECK (scope_id <> ''));
CREATE TABLE synchro.user_scope_grants (
    user_id text NOT NULL CHECK (user_id <> ''),
    scope_id text NOT NULL CHECK (scope_id <> ''),
    PRIMARY KEY (user_id, scope_id)
);
CREATE TABLE synchro.user_default_scope_revocations (user_id text PRIMARY KEY);

-- Clients: one record per (user, client), with an explicit generation and expiry.
CREATE TABLE synchro.clients (
    user_id text NOT NULL,
    client_id text NOT NULL,
    client_generation bigint NOT NULL CHECK (client_generation BETWEEN 1 AND 9007199254740991),
    scope_set_version bigint NOT NULL CHECK (scope_set_version BETWEEN 1 AND 9007199254740991),
    assigned_scopes text[] NOT NULL,
    schema_version bigint,
    schema_hash text,
    -- Expiry runs from the last cursor acknowledgement, or from the start of the generation
    -- before the first one; connect traffic alone does not refresh it (spec 003).
    generation_started_at timestamptz NOT NULL DEFAULT now(),
    last_acknowledged_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, client_id)
);

CREATE TABLE synchro.settings (
    key text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO synchro.settings (key, value) VALUES
    ('client_ttl_days', '30'),
    ('max_bound', '100000');

-- The publication capture decodes; registration adds each relation.
CREATE PUBLICATION synchro_publication;

-- ---------------------------------------------------------------- registration
CREATE FUNCTION synchro.synchro_registration_error(p_reason text, p_relation_id text DEFAULT NULL,
    p_field_id text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_error jsonb := jsonb_build_object('code', 'invalid_registration', 'reason', p_reason);
BEGIN
    IF p_relation_id IS NOT NULL THEN v_error := v_error || jsonb_build_object('relation_id', p_relation_id); END IF;
    IF p_field_id IS NOT NULL THEN v_error := v_error || jsonb_build_object('field_id', p_field_id); END IF;
    RAISE EXCEPTION 'invalid_registration: %', p_reason
        USING ERRCODE = CASE WHEN p_reason = 'invalid_limit' THEN '22023' ELSE '42P17' END,
              DETAIL = jsonb_build_object('error', v_error)::text;
END $$;

CREATE FUNCTION synchro.synchro_new_id(p_prefix text) RETURNS text
LANGUAGE sql VOLATILE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT p_prefix || replace(gen_random_uuid()::text, '-', '')
$$;

-- Maps a column type to a portable type: (portable_type, precision, scale), or NULL.
CREATE FUNCTION synchro.synchro_portable_type(p_type oid, p_typmod integer,
    OUT portable_type text, OUT decimal_precision integer, OUT decimal_scale integer)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    portable_type := CASE p_type
        WHEN 'text'::regtype THEN 'string' WHEN 'varchar'::regtype THEN 'string'
        WHEN 'bpchar'::regtype THEN 'string' WHEN 'uuid'::regtype THEN 'string'
        WHEN 'int2'::regtype THEN 'int' WHEN 'int4'::regtype THEN 'int'
        WHEN 'int8'::regtype THEN 'int64'
        WHEN 'float4'::regtype THEN 'float' WHEN 'float8'::regtype THEN 'float'
        WHEN 'bool'::regtype THEN 'boolean'
        WHEN 'timestamptz'::regtype THEN 'datetime'
        WHEN 'date'::regtype THEN 'date'
        WHEN 'time'::regtype THEN 'time'
        WHEN 'json'::regtype THEN 'json' WHEN 'jsonb'::regtype THEN 'json'
        WHEN 'bytea'::regtype THEN 'bytes'
        WHEN 'numeric'::regtype THEN CASE WHEN p_typmod >= 4 THEN 'decimal' END
        ELSE NULL END;
    IF portable_type = 'decimal' THEN
        decimal_precision := ((p_typmod - 4) >> 16) & 65535;
        decimal_scale := (p_typmod - 4) & 65535;
        IF decimal_scale > decimal_precision THEN portable_type := NULL; END IF;
    END IF;
END $$;

-- Registers one schema-qualified relation (spec 000 "Registered Relation Identity", spec 003
-- "Primary key and replica identity contract"). Idempotent for an already registered
-- relation: its IDs are returned, never reassigned. Returns
-- {"relation_id","table_id"?,"fields":[{"field_id","column","type"}]}.
CREATE FUNCTION synchro.synchro_register_relation(
    p_schema text, p_relation text,
    p_kind text DEFAULT 'synced', p_composition text DEFAULT 'single_scope',
    p_push_enabled boolean DEFAULT true, p_fanout_bound integer DEFAULT 1000,
    p_impact_bound integer DEFAULT 1000, p_table_name text DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_max integer := (SELECT value::integer FROM synchro.settings WHERE key = 'max_bound');
    v_rel pg_class%ROWTYPE;
    v_pk pg_constraint%ROWTYPE;
    v_key pg_attribute%ROWTYPE;
    v_key_type text;
    v_relation_id text;
    v_table_id text;
    v_col record;
    v_type text;
    v_precision integer;
    v_scale integer;
    v_fields jsonb := '[]'::jsonb;
    v_field_id text;
BEGIN
    IF p_fanout_bound IS NULL OR p_fanout_bound < 1 OR p_fanout_bound > v_max
       OR p_impact_bound IS NULL OR p_impact_bound < 1 OR p_impact_bound > v_max THEN
        PERFORM synchro.synchro_registration_error('invalid_limit');
    END IF;
    IF p_kind IS NULL OR p_kind NOT IN ('synced', 'capture_dependency')
       OR (p_kind = 'synced' AND (p_composition IS NULL OR p_composition NOT IN ('single_scope', 'multi_scope'))) THEN
        RAISE EXCEPTION 'kind must be synced or capture_dependency, composition single_scope or multi_scope'
            USING ERRCODE = '22023';
    END IF;
    -- Exactly one ordinary or partitioned table named by exact catalog names.
    SELECT c.* INTO v_rel FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = p_schema AND c.relname = p_relation AND c.relkind IN ('r', 'p');
    IF NOT FOUND OR p_schema IS NULL OR p_relation IS NULL THEN
        PERFORM synchro.synchro_registration_error('ambiguous_physical_relation');
    END IF;
    SELECT relation_id INTO v_relation_id FROM synchro.relations WHERE physical_relation_oid = v_rel.oid;
    IF FOUND THEN
        RETURN synchro.synchro_relation_json(v_relation_id);
    END IF;
    IF NOT pg_has_role(current_user, v_rel.relowner, 'USAGE') THEN
        RAISE EXCEPTION 'registration needs synchro_owner to be granted the relation owner''s role'
            USING ERRCODE = '42501';
    END IF;
    SELECT * INTO v_pk FROM pg_constraint WHERE conrelid = v_rel.oid AND contype = 'p';
    IF NOT FOUND THEN
        PERFORM synchro.synchro_registration_error('missing_primary_key');
    END IF;
    IF array_length(v_pk.conkey, 1) <> 1 THEN
        PERFORM synchro.synchro_registration_error('composite_primary_key');
    END IF;
    IF v_pk.condeferrable THEN
        -- A deferrable key is not an immediate key and cannot back the replica identity.
        PERFORM synchro.synchro_registration_error('unsupported_replica_identity');
    END IF;
    SELECT * INTO v_key FROM pg_attribute WHERE attrelid = v_rel.oid AND attnum = v_pk.conkey[1];
    IF NOT v_key.attnotnull THEN
        PERFORM synchro.synchro_registration_error('nullable_primary_key');
    END IF;
    -- Built-in key types only, by OID (a domain over one of them is refused).
    v_key_type := CASE v_key.atttypid
        WHEN 'int2'::regtype THEN 'int' WHEN 'int4'::regtype THEN 'int'
        WHEN 'int8'::regtype THEN 'int64'
        WHEN 'text'::regtype THEN 'string' WHEN 'varchar'::regtype THEN 'string'
        WHEN 'bpchar'::regtype THEN 'string' WHEN 'uuid'::regtype THEN 'string'
        WHEN 'inet'::regtype THEN 'string' WHEN 'cidr'::regtype THEN 'string'
        WHEN 'macaddr'::regtype THEN 'string' WHEN 'macaddr8'::regtype THEN 'string'
        WHEN 'int4range'::regtype THEN 'string' WHEN 'int8range'::regtype THEN 'string'
        WHEN 'numrange'::regtype THEN 'string' WHEN 'int4multirange'::regtype THEN 'string'
        WHEN 'int8multirange'::regtype THEN 'string' WHEN 'nummultirange'::regtype THEN 'string'
        ELSE NULL END;
    IF v_key_type IS NULL THEN
        PERFORM synchro.synchro_registration_error('unsupported_primary_key_type');
    END IF;
    IF p_kind = 'synced' AND p_push_enabled AND (v_key.attidentity = 'a' OR v_key.attgenerated <> '') THEN
        -- A database-generated key cannot be written by a pushing client.
        PERFORM synchro.synchro_registration_error('unsupported_primary_key_type');
    END IF;
    IF v_rel.relreplident <> 'd' THEN
        PERFORM synchro.synchro_registration_error('unsupported_replica_identity');
    END IF;

    v_relation_id := synchro.synchro_new_id('rel_');
    IF p_kind = 'synced' THEN
        v_table_id := synchro.synchro_new_id('tbl_');
    END IF;
    INSERT INTO synchro.relations (relation_id, kind, physical_schema, physical_relation, physical_relation_oid,
        replica_identity, capture_key_column, primary_key_type, table_id, table_name, composition, push_enabled,
        fanout_bound, impact_bound)
    VALUES (v_relation_id, p_kind, p_schema, p_relation, v_rel.oid, v_rel.relreplident, v_key.attname,
        v_key.atttypid, v_table_id, CASE WHEN p_kind = 'synced' THEN coalesce(p_table_name, p_relation) END,
        CASE WHEN p_kind = 'synced' THEN p_composition END, p_push_enabled, p_fanout_bound, p_impact_bound);

    IF p_kind = 'synced' THEN
        FOR v_col IN SELECT a.* FROM pg_attribute a
                      WHERE a.attrelid = v_rel.oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum LOOP
            IF v_col.attnum = v_key.attnum THEN
                v_type := v_key_type; v_precision := NULL; v_scale := NULL;
            ELSE
                SELECT t.portable_type, t.decimal_precision, t.decimal_scale INTO v_type, v_precision, v_scale
                  FROM synchro.synchro_portable_type(v_col.atttypid, v_col.atttypmod) t;
            END IF;
            IF v_type IS NULL THEN
                -- No portable type: the relation cannot be represented (see protocol-decisions).
                PERFORM synchro.synchro_registration_error('unsupported_column_type', v_relation_id);
            END IF;
            v_field_id := synchro.synchro_new_id('fld_');
            INSERT INTO synchro.fields (relation_id, field_id, column_name, attnum, portable_type, nullable, writable,
                is_key, decimal_precision, decimal_scale)
            VALUES (v_relation_id, v_field_id, v_col.attname, v_col.attnum, v_type,
                NOT v_col.attnotnull,
                v_col.attnum <> v_key.attnum AND v_col.attgenerated = '' AND v_col.attidentity <> 'a',
                v_col.attnum = v_key.attnum, v_precision, v_scale);
        END LOOP;
    END IF;

    -- The source trigger refuses primary-key updates before any other effect.
    EXECUTE format('CREATE TRIGGER synchro_reject_key_update BEFORE UPDATE OF %I ON %I.%I FOR EACH ROW '
                   'WHEN (OLD.%I IS DISTINCT FROM NEW.%I) EXECUTE FUNCTION synchro.synchro_reject_key_update()',
                   v_key.attname, p_schema, p_relation, v_key.attname, v_key.attname);
    EXECUTE format('ALTER PUBLICATION synchro_publication ADD TABLE ONLY %I.%I', p_schema, p_relation);
    RETURN synchro.synchro_relation_json(v_relation_id);
END $$;

CREATE FUNCTION synchro.synchro_reject_key_update() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'the primary key of a synced row cannot be updated; delete and insert instead'
        USING ERRCODE = '55000';
END $$;

CREATE FUNCTION synchro.synchro_relation_json(p_relation_id text) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'relation_id', r.relation_id, 'kind', r.kind, 'table_id', r.table_id,
        'fields', coalesce((SELECT jsonb_agg(jsonb_build_object('field_id', f.field_id, 'column', f.column_name,
                                                                'type', f.portable_type) ORDER BY f.attnum)
                              FROM synchro.fields f WHERE f.relation_id = r.relation_id), '[]'::jsonb)))
      FROM synchro.relations r WHERE r.relation_id = p_relation_id
$$;

-- The synced registry as the manifest builder reads it.
CREATE FUNCTION synchro.synchro_registry_snapshot() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
        'relation_id', r.relation_id, 'table_id', r.table_id, 'name', r.table_name, 'composition', r.composition,
        'schema', r.physical_schema, 'relation', r.physical_relation,
        'fields', (SELECT jsonb_agg(jsonb_build_object('field_id', f.field_id, 'name', f.column_name,
                       'type', f.portable_type, 'nullable', f.nullable, 'writable', f.writable, 'is_key', f.is_key,
                       'precision', f.decimal_precision, 'scale', f.decimal_scale) ORDER BY f.field_id)
                     FROM synchro.fields f WHERE f.relation_id = r.relation_id)) ORDER BY r.table_id), '[]'::jsonb)
      FROM synchro.relations r WHERE r.kind = 'synced'
$$;

-- ---------------------------------------------------------------- manifests
CREATE FUNCTION synchro.synchro_manifest_history() RETURNS TABLE (schema_version bigint, body text, schema_hash text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT m.schema_version, m.body, m.schema_hash FROM synchro.manifests m ORDER BY m.schema_version
$$;

-- Inserts one immutable manifest record. The caller (the publisher) has validated body,
-- hash, lineage and class with the protocol core; the checks here keep the table honest.
CREATE FUNCTION synchro.synchro_insert_manifest(p_version bigint, p_hash text, p_body text,
    p_parent_version bigint, p_parent_hash text, p_class text, p_floor bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_current synchro.manifests%ROWTYPE;
BEGIN
    -- The body and hash must agree (SHA-256 of the domain-prefixed canonical body).
    IF p_hash IS DISTINCT FROM encode(sha256('\x73796e6368726f3a76333a736368656d612d6d616e69666573743a763100'::bytea
                                             || convert_to(p_body, 'UTF8')), 'hex') THEN
        RAISE EXCEPTION 'the manifest hash does not match its body' USING ERRCODE = '22023';
    END IF;
    LOCK TABLE synchro.manifests IN EXCLUSIVE MODE;
    SELECT * INTO v_current FROM synchro.manifests ORDER BY schema_version DESC LIMIT 1;
    IF FOUND AND (p_parent_version IS DISTINCT FROM v_current.schema_version
                  OR p_parent_hash IS DISTINCT FROM v_current.schema_hash) THEN
        RAISE EXCEPTION 'a new manifest must name the current manifest as its parent' USING ERRCODE = '40001';
    END IF;
    IF NOT FOUND AND p_parent_version IS NOT NULL THEN
        RAISE EXCEPTION 'the first manifest has no parent' USING ERRCODE = '22023';
    END IF;
    INSERT INTO synchro.manifests (schema_version, schema_hash, body, parent_version, parent_hash,
                                   transition_class, compatibility_floor)
    VALUES (p_version, p_hash, p_body, p_parent_version, p_parent_hash, p_class, p_floor);
END $$;

-- Facts a classification needs, read from the source rows under the caller's snapshot.
CREATE FUNCTION synchro.synchro_column_has_values(p_relation_id text, p_column name) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_found boolean;
BEGIN
    SELECT * INTO v_rel FROM synchro.relations WHERE relation_id = p_relation_id;
    IF NOT FOUND THEN RAISE EXCEPTION 'unknown relation' USING ERRCODE = '22023'; END IF;
    IF p_column IS NULL THEN
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM ONLY %I.%I)', v_rel.physical_schema, v_rel.physical_relation)
            INTO v_found;
    ELSE
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM ONLY %I.%I WHERE %I IS NOT NULL)',
                       v_rel.physical_schema, v_rel.physical_relation, p_column) INTO v_found;
    END IF;
    RETURN v_found;
END $$;

-- ---------------------------------------------------------------- scope assignment
CREATE FUNCTION synchro.synchro_grant_user_scope(p_user_id text, p_scope_id text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    IF coalesce(p_user_id, '') = '' OR coalesce(p_scope_id, '') = '' THEN
        RAISE EXCEPTION 'user_id and scope_id must be nonempty' USING ERRCODE = '22023';
    END IF;
    IF p_scope_id = 'user:' || p_user_id THEN
        DELETE FROM synchro.user_default_scope_revocations WHERE user_id = p_user_id;
    ELSE
        INSERT INTO synchro.user_scope_grants VALUES (p_user_id, p_scope_id) ON CONFLICT DO NOTHING;
    END IF;
END $$;

CREATE FUNCTION synchro.synchro_revoke_user_scope(p_user_id text, p_scope_id text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    IF coalesce(p_user_id, '') = '' OR coalesce(p_scope_id, '') = '' THEN
        RAISE EXCEPTION 'user_id and scope_id must be nonempty' USING ERRCODE = '22023';
    END IF;
    IF p_scope_id = 'user:' || p_user_id THEN
        INSERT INTO synchro.user_default_scope_revocations VALUES (p_user_id) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM synchro.user_scope_grants WHERE user_id = p_user_id AND scope_id = p_scope_id;
    END IF;
END $$;

CREATE FUNCTION synchro.synchro_add_shared_scope(p_scope_id text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    IF coalesce(p_scope_id, '') = '' THEN
        RAISE EXCEPTION 'scope_id must be nonempty' USING ERRCODE = '22023';
    END IF;
    INSERT INTO synchro.shared_scopes VALUES (p_scope_id) ON CONFLICT DO NOTHING;
END $$;

CREATE FUNCTION synchro.synchro_remove_shared_scope(p_scope_id text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    DELETE FROM synchro.shared_scopes WHERE scope_id = p_scope_id
$$;

-- The authoritative assigned set of a user: default user scope (unless revoked), explicit
-- grants and shared scopes, deduplicated and in byte order.
CREATE FUNCTION synchro.synchro_assigned_scopes(p_user_id text) RETURNS text[]
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT coalesce(array_agg(s ORDER BY convert_to(s, 'UTF8')), '{}') FROM (
        SELECT 'user:' || p_user_id AS s
         WHERE NOT EXISTS (SELECT 1 FROM synchro.user_default_scope_revocations r WHERE r.user_id = p_user_id)
        UNION SELECT scope_id FROM synchro.user_scope_grants WHERE user_id = p_user_id
        UNION SELECT scope_id FROM synchro.shared_scopes) q
$$;

-- ---------------------------------------------------------------- clients
CREATE FUNCTION synchro.synchro_client_state(p_user_id text, p_client_id text)
RETURNS TABLE (client_generation bigint, scope_set_version bigint, assigned_scopes text[],
               schema_version bigint, schema_hash text, expired boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT c.client_generation, c.scope_set_version, c.assigned_scopes, c.schema_version, c.schema_hash,
           coalesce(c.last_acknowledged_at, c.generation_started_at)
             + make_interval(days => (SELECT value::integer FROM synchro.settings WHERE key = 'client_ttl_days')) <= now()
      FROM synchro.clients c WHERE c.user_id = p_user_id AND c.client_id = p_client_id
$$;

-- Records a connect: issues a new generation when asked (new, expired or stale client),
-- reconciles the assignment set (advancing scope_set_version by one only when it changed)
-- and records the installed schema. Returns the stored generation and scope_set_version.
CREATE FUNCTION synchro.synchro_client_connect(p_user_id text, p_client_id text, p_new_generation boolean,
    p_assigned text[], p_schema_version bigint, p_schema_hash text)
RETURNS TABLE (client_generation bigint, scope_set_version bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_row synchro.clients%ROWTYPE;
BEGIN
    SELECT * INTO v_row FROM synchro.clients c WHERE c.user_id = p_user_id AND c.client_id = p_client_id FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO synchro.clients (user_id, client_id, client_generation, scope_set_version, assigned_scopes,
                                     schema_version, schema_hash)
        VALUES (p_user_id, p_client_id, 1, 1, p_assigned, p_schema_version, p_schema_hash)
        RETURNING * INTO v_row;
    ELSE
        UPDATE synchro.clients c SET
            client_generation = c.client_generation + CASE WHEN p_new_generation THEN 1 ELSE 0 END,
            generation_started_at = CASE WHEN p_new_generation THEN now() ELSE c.generation_started_at END,
            last_acknowledged_at = CASE WHEN p_new_generation THEN NULL ELSE c.last_acknowledged_at END,
            scope_set_version = c.scope_set_version + CASE WHEN c.assigned_scopes = p_assigned THEN 0 ELSE 1 END,
            assigned_scopes = p_assigned, schema_version = p_schema_version, schema_hash = p_schema_hash,
            updated_at = now()
         WHERE c.user_id = p_user_id AND c.client_id = p_client_id
        RETURNING * INTO v_row;
    END IF;
    client_generation := v_row.client_generation;
    scope_set_version := v_row.scope_set_version;
    RETURN NEXT;
END $$;

-- ---------------------------------------------------------------- readiness
-- Sanitized readiness: only ready or not. Detailed checks for monitor and operator.
-- Checks that apply so far; capture-worker heartbeat and lag join when capture lands.
CREATE FUNCTION synchro.synchro_health_detail() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT jsonb_build_object(
        'schema_installed', 'ok',
        'current_manifest', CASE WHEN EXISTS (SELECT 1 FROM synchro.manifests) THEN 'ok' ELSE 'failed' END,
        'registry_drift', CASE WHEN EXISTS (
            SELECT 1 FROM synchro.relations r
             WHERE NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                                WHERE c.oid = r.physical_relation_oid AND c.relname = r.physical_relation
                                  AND n.nspname = r.physical_schema AND c.relreplident = r.replica_identity))
            THEN 'failed' ELSE 'ok' END)
$$;

CREATE FUNCTION synchro.synchro_readiness() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT NOT EXISTS (SELECT 1 FROM jsonb_each_text(synchro.synchro_health_detail()) WHERE value <> 'ok')
$$;

RESET ROLE;

-- ---------------------------------------------------------------- grants
-- Default deny everywhere, then each role gets exactly its functions.
REVOKE ALL ON ALL TABLES IN SCHEMA synchro FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA synchro FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA synchro FROM PUBLIC;
GRANT USAGE ON SCHEMA synchro TO synchro_adapter, synchro_seed, synchro_monitor, synchro_operator, synchro_worker;

GRANT EXECUTE ON FUNCTION synchro.synchro_manifest_history() TO synchro_adapter, synchro_seed;
GRANT EXECUTE ON FUNCTION synchro.synchro_assigned_scopes(text) TO synchro_adapter;
GRANT EXECUTE ON FUNCTION synchro.synchro_client_state(text, text) TO synchro_adapter;
GRANT EXECUTE ON FUNCTION synchro.synchro_client_connect(text, text, boolean, text[], bigint, text) TO synchro_adapter;
GRANT EXECUTE ON FUNCTION synchro.synchro_readiness() TO synchro_adapter, synchro_monitor;
GRANT EXECUTE ON FUNCTION synchro.synchro_health_detail() TO synchro_monitor, synchro_operator;

GRANT EXECUTE ON FUNCTION synchro.synchro_register_relation(text, text, text, text, boolean, integer, integer, text)
    TO synchro_operator;
GRANT EXECUTE ON FUNCTION synchro.synchro_registry_snapshot() TO synchro_operator;
GRANT EXECUTE ON FUNCTION synchro.synchro_column_has_values(text, name) TO synchro_operator;
GRANT EXECUTE ON FUNCTION synchro.synchro_insert_manifest(bigint, text, text, bigint, text, text, bigint)
    TO synchro_operator;
GRANT EXECUTE ON FUNCTION synchro.synchro_manifest_history() TO synchro_operator;
GRANT EXECUTE ON FUNCTION synchro.synchro_grant_user_scope(text, text) TO synchro_operator;
GRANT EXECUTE ON FUNCTION synchro.synchro_revoke_user_scope(text, text) TO synchro_operator;
GRANT EXECUTE ON FUNCTION synchro.synchro_add_shared_scope(text) TO synchro_operator;
GRANT EXECUTE ON FUNCTION synchro.synchro_remove_shared_scope(text) TO synchro_operator;
