-- synchro install 10: registered relations and their fields, and registration.
-- Spec 003 "Logical and Physical Relation Identity", "Registered-relation validation",
-- "Primary key and replica identity contract"; spec 000 "Registered Relation Identity",
-- "Registration Contract", "Primary Key And Replica Identity", "Registration Errors",
-- "Portable Type System".
--
-- Fields of a capture_dependency relation are recorded by 41_dependencies; the checks that
-- refuse values no portable type holds by 12_values; a relation's capture state, fence and
-- projection view by triggers of 30_capture, 31_fences and 40_membership.

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
    -- Columns the operator declared server-only: never synced, never drift.
    server_only_columns name[] NOT NULL DEFAULT '{}',
    -- Server-owned lifecycle columns ({"created_at","updated_at","deleted_at"}: column names;
    -- each a non-writable datetime field).
    lifecycle jsonb NOT NULL DEFAULT '{}',
    -- How `timestamp` (without time zone) columns are read ({"<column>" or "*": a time zone
    -- name, or "text"}); a column not named (and no "*") is read as UTC (synchro_column_zone).
    timestamp_zones jsonb NOT NULL DEFAULT '{}',
    registered_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((kind = 'synced') = (table_id IS NOT NULL AND table_name IS NOT NULL AND composition IS NOT NULL))
);
REVOKE ALL ON synchro.relations FROM PUBLIC;
GRANT SELECT ON synchro.relations TO synchro_worker;

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
    -- The column's SQL type as registered: a change of it in the stream is drift.
    type_oid oid NOT NULL,
    type_modifier integer NOT NULL,
    PRIMARY KEY (relation_id, field_id),
    UNIQUE (relation_id, attnum),
    CHECK ((portable_type = 'decimal') = (decimal_precision IS NOT NULL AND decimal_scale IS NOT NULL))
);
REVOKE ALL ON synchro.fields FROM PUBLIC;
GRANT SELECT ON synchro.fields TO synchro_worker;

-- Raises a registration refusal with its error body as DETAIL: SQLSTATE 22023 for
-- invalid_limit, 42P17 for every other reason. The code is invalid_registration for the
-- reasons of spec 000's closed list, and invalid_column for the column refusals the list
-- has no entry for (a column with no portable type, a registered column gone, a value its
-- portable type cannot hold); any other reason is an internal error, so the closed list
-- holds by construction. relation_id and field_id are passed only when already assigned.
CREATE FUNCTION synchro.synchro_registration_error(p_reason text, p_relation_id text DEFAULT NULL,
    p_field_id text DEFAULT NULL, p_extra jsonb DEFAULT NULL) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_code text := CASE
        WHEN p_reason IN ('ambiguous_physical_relation', 'missing_primary_key', 'nullable_primary_key',
                          'composite_primary_key', 'partial_primary_key', 'unsupported_primary_key_type',
                          'unsupported_replica_identity', 'invalid_scope_function', 'undeclared_dependency',
                          'invalid_limit') THEN 'invalid_registration'
        WHEN p_reason IN ('unsupported_column_type', 'missing_field', 'unrepresentable_value') THEN 'invalid_column'
        END;
    v_error jsonb := jsonb_build_object('code', v_code, 'reason', p_reason);
BEGIN
    IF v_code IS NULL THEN
        RAISE EXCEPTION 'synchro internal error: registration reason outside the closed list'
            USING ERRCODE = 'XX000';
    END IF;
    IF p_relation_id IS NOT NULL THEN v_error := v_error || jsonb_build_object('relation_id', p_relation_id); END IF;
    IF p_field_id IS NOT NULL THEN v_error := v_error || jsonb_build_object('field_id', p_field_id); END IF;
    -- Members that say what to fix (a column and its type, a missing grant): catalog names
    -- the operator wrote, never row values. A member "hint" (why, and the way out, in words)
    -- becomes the error's HINT instead.
    IF p_extra IS NOT NULL THEN v_error := (p_extra - 'hint') || v_error; END IF;
    RAISE EXCEPTION '%: %', v_code, p_reason
        USING ERRCODE = CASE WHEN p_reason = 'invalid_limit' THEN '22023' ELSE '42P17' END,
              DETAIL = jsonb_build_object('error', v_error)::text,
              HINT = coalesce(p_extra ->> 'hint', '');
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_registration_error(text, text, text, jsonb) FROM PUBLIC;

-- The relation registered under this schema and name (only a synced one with
-- p_synced_only), or NULL. While a retired relation waits for capture to reach its boundary,
-- the same table may already be registered again: the name then means the new registration.
CREATE FUNCTION synchro.synchro_named_relation(p_schema text, p_relation text, p_synced_only boolean)
RETURNS synchro.relations
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
BEGIN
    SELECT r.* INTO v_rel FROM synchro.relations r
     WHERE r.physical_schema = p_schema AND r.physical_relation = p_relation
       AND (r.kind = 'synced' OR NOT p_synced_only)
     ORDER BY EXISTS (SELECT 1 FROM synchro.registry_generations g
                       WHERE g.relation_id = r.relation_id AND g.change = 'retirement'
                         AND g.state IN ('pending', 'staged'))
     LIMIT 1;
    RETURN v_rel; -- all NULL when none
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_named_relation(text, text, boolean) FROM PUBLIC;

-- The synced relation registered under this schema and name, or the registration error
-- ambiguous_physical_relation (the operator functions that name a relation).
CREATE FUNCTION synchro.synchro_synced_relation(p_schema text, p_relation text) RETURNS synchro.relations
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
BEGIN
    v_rel := synchro.synchro_named_relation(p_schema, p_relation, true);
    IF v_rel.relation_id IS NULL THEN
        PERFORM synchro.synchro_registration_error('ambiguous_physical_relation');
    END IF;
    RETURN v_rel;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_synced_relation(text, text) FROM PUBLIC;

-- An opaque random ID: the prefix and 32 hex digits.
CREATE FUNCTION synchro.synchro_new_id(p_prefix text) RETURNS text
LANGUAGE sql VOLATILE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT p_prefix || replace(gen_random_uuid()::text, '-', '')
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_new_id(text) FROM PUBLIC;

-- A type and modifier seen through its domains: the base type a domain (of a domain ...) is
-- over, with the modifier the innermost domain declared; any other type unchanged. A
-- domain's values are its base type's values (its constraints only narrow them), so they
-- take the base type's portable type and source form.
CREATE FUNCTION synchro.synchro_base_type(p_type oid, p_typmod integer,
    OUT base_type oid, OUT base_typmod integer)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_next oid;
    v_mod integer;
BEGIN
    base_type := p_type;
    base_typmod := p_typmod;
    LOOP
        SELECT t.typbasetype, t.typtypmod INTO v_next, v_mod FROM pg_catalog.pg_type t
         WHERE t.oid = base_type AND t.typtype = 'd';
        EXIT WHEN NOT FOUND;
        base_type := v_next;
        base_typmod := v_mod;
    END LOOP;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_base_type(oid, integer) FROM PUBLIC;

-- The element type of an array type (the true arrays that subscript as arrays, not int2vector
-- and the like), or NULL.
CREATE FUNCTION synchro.synchro_array_element(p_type oid) RETURNS oid
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT t.typelem FROM pg_catalog.pg_type t
     WHERE t.oid = p_type AND t.typelem <> 0 AND t.typcategory = 'A'
       AND t.typsubscript = 'pg_catalog.array_subscript_handler'::regproc
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_array_element(oid) FROM PUBLIC;

-- Maps a column type to a portable type: (portable_type, precision, scale), or NULL.
-- Through domains (synchro_base_type). Text-like types whose output is PostgreSQL's canonical
-- text are strings: text, varchar(n), char(n), uuid, enums (the label), citext (the
-- extension's type), interval (IntervalStyle postgres), inet, cidr, macaddr, macaddr8.
-- timestamp without time zone is a datetime read as UTC (what Prisma and Drizzle write).
-- An array (of any dimensions) whose element type has a portable type is json: an array of
-- the elements' wire values (12_values refuses lower bounds other than 1).
-- numeric needs a declared precision and scale (spec 000 validates against them): an
-- unconstrained numeric has none, and no declaration can hold all of its values.
CREATE FUNCTION synchro.synchro_portable_type(p_type oid, p_typmod integer,
    OUT portable_type text, OUT decimal_precision integer, OUT decimal_scale integer)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_type oid;
    v_typmod integer;
BEGIN
    SELECT b.base_type, b.base_typmod INTO v_type, v_typmod FROM synchro.synchro_base_type(p_type, p_typmod) b;
    portable_type := CASE v_type
        WHEN 'text'::regtype THEN 'string' WHEN 'varchar'::regtype THEN 'string'
        WHEN 'bpchar'::regtype THEN 'string' WHEN 'uuid'::regtype THEN 'string'
        WHEN 'interval'::regtype THEN 'string' WHEN 'inet'::regtype THEN 'string'
        WHEN 'cidr'::regtype THEN 'string' WHEN 'macaddr'::regtype THEN 'string'
        WHEN 'macaddr8'::regtype THEN 'string'
        WHEN 'int2'::regtype THEN 'int' WHEN 'int4'::regtype THEN 'int'
        WHEN 'int8'::regtype THEN 'int64'
        WHEN 'float4'::regtype THEN 'float' WHEN 'float8'::regtype THEN 'float'
        WHEN 'bool'::regtype THEN 'boolean'
        WHEN 'timestamptz'::regtype THEN 'datetime' WHEN 'timestamp'::regtype THEN 'datetime'
        WHEN 'date'::regtype THEN 'date'
        WHEN 'time'::regtype THEN 'time'
        WHEN 'json'::regtype THEN 'json' WHEN 'jsonb'::regtype THEN 'json'
        WHEN 'bytea'::regtype THEN 'bytes'
        WHEN 'numeric'::regtype THEN CASE WHEN v_typmod >= 4 THEN 'decimal' END
        ELSE CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_type t WHERE t.oid = v_type AND t.typtype = 'e')
                       OR EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                                    JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
                                    JOIN pg_catalog.pg_type t ON t.oid = d.objid
                                   WHERE d.classid = 'pg_catalog.pg_type'::regclass AND d.objid = v_type
                                     AND d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.deptype = 'e'
                                     AND e.extname = 'citext' AND t.typname = 'citext')
                  THEN 'string' END
        END;
    IF portable_type = 'decimal' THEN
        decimal_precision := ((v_typmod - 4) >> 16) & 65535;
        decimal_scale := (v_typmod - 4) & 65535;
        IF decimal_scale > decimal_precision THEN portable_type := NULL; END IF;
    ELSIF portable_type IS NULL AND synchro.synchro_array_element(v_type) IS NOT NULL THEN
        -- An array of elements that have a portable type is a json array of their wire values.
        IF (SELECT e.portable_type FROM synchro.synchro_portable_type(synchro.synchro_array_element(v_type), v_typmod) e)
           IS NOT NULL THEN
            portable_type := 'json';
        END IF;
    END IF;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_portable_type(oid, integer) FROM PUBLIC;

-- The time zone a relation reads a timestamp (without time zone) column in: the column's
-- own entry of timestamp_zones, else the relation's "*", else NULL (UTC); "text" registers
-- the column as a string of PostgreSQL's text instead.
CREATE FUNCTION synchro.synchro_column_zone(p_zones jsonb, p_column name) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT nullif(coalesce(p_zones ->> p_column, p_zones ->> '*'), 'UTC')
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_column_zone(jsonb, name) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_column_zone(jsonb, name) TO synchro_worker;

-- synchro_portable_type of a column read in zone p_zone (synchro_column_zone): a timestamp
-- (without time zone) column in "text" is a string.
CREATE FUNCTION synchro.synchro_field_type(p_type oid, p_typmod integer, p_zone text,
    OUT portable_type text, OUT decimal_precision integer, OUT decimal_scale integer)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    SELECT t.* INTO portable_type, decimal_precision, decimal_scale
      FROM synchro.synchro_portable_type(p_type, p_typmod) t;
    IF p_zone = 'text' AND (synchro.synchro_base_type(p_type, p_typmod)).base_type = 'timestamp'::regtype THEN
        portable_type := 'string';
    END IF;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_field_type(oid, integer, text) FROM PUBLIC;

-- Refuses a timestamp_zones declaration whose keys are not "*" or a timestamp (without time
-- zone) column of the relation, or whose values are not "text", "UTC" or a time zone name
-- PostgreSQL knows (pg_timezone_names), with SQLSTATE 22023 naming the entry.
CREATE FUNCTION synchro.synchro_check_timestamp_zones(p_relation oid, p_zones jsonb) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_entry record;
BEGIN
    IF jsonb_typeof(p_zones) <> 'object' THEN
        RAISE EXCEPTION 'timestamp zones are an object of column (or "*") to zone' USING ERRCODE = '22023';
    END IF;
    FOR v_entry IN SELECT e.key, e.value FROM jsonb_each(p_zones) e LOOP
        IF v_entry.key <> '*' AND NOT EXISTS (
            SELECT 1 FROM pg_attribute a
             WHERE a.attrelid = p_relation AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = v_entry.key
               AND (synchro.synchro_base_type(a.atttypid, a.atttypmod)).base_type = 'timestamp'::regtype) THEN
            RAISE EXCEPTION 'a timestamp zone names column %, which is no timestamp (without time zone) column of the relation',
                quote_ident(v_entry.key) USING ERRCODE = '22023';
        END IF;
        IF jsonb_typeof(v_entry.value) <> 'string' OR NOT (v_entry.value #>> '{}' IN ('text', 'UTC')
               OR EXISTS (SELECT 1 FROM pg_timezone_names z WHERE z.name = v_entry.value #>> '{}')) THEN
            RAISE EXCEPTION 'timestamp zone %: not a time zone PostgreSQL knows (pg_timezone_names), UTC or text',
                v_entry.value::text USING ERRCODE = '22023';
        END IF;
    END LOOP;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_check_timestamp_zones(oid, jsonb) FROM PUBLIC;

-- How capture and push read a column's text (synchro_value_source): the base type's OID for a
-- scalar, with ' <zone>' for a timestamp (without time zone) read in a zone other than UTC
-- (p_zone, synchro_column_zone; "text" reads it as a string); for an array, 'array <element
-- portable type> <element base type OID>' and, for decimal elements, ' <precision> <scale>'
-- (the column's modifier is its elements'; arrays are read in UTC).
CREATE FUNCTION synchro.synchro_value_source(p_type oid, p_typmod integer, p_zone text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_type oid;
    v_typmod integer;
    v_element oid;
    v_base oid;
    v_portable record;
BEGIN
    SELECT b.base_type, b.base_typmod INTO v_type, v_typmod FROM synchro.synchro_base_type(p_type, p_typmod) b;
    v_element := synchro.synchro_array_element(v_type);
    IF v_element IS NULL THEN
        RETURN concat_ws(' ', v_type::text, CASE WHEN v_type = 'timestamp'::regtype AND p_zone <> 'text' THEN p_zone END);
    END IF;
    SELECT e.* INTO v_portable FROM synchro.synchro_portable_type(v_element, v_typmod) e;
    SELECT b.base_type INTO v_base FROM synchro.synchro_base_type(v_element, v_typmod) b;
    RETURN concat_ws(' ', 'array', v_portable.portable_type, v_base::text, v_portable.decimal_precision::text,
                     v_portable.decimal_scale::text);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_value_source(oid, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_value_source(oid, integer, text) TO synchro_worker;

-- Why a column has no portable type, and the way out, for a person: the registration error's
-- HINT and the CLI's message. Names the column and its type, never a value.
CREATE FUNCTION synchro.synchro_unsupported_type_hint(p_column name, p_type oid, p_typmod integer) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_type oid;
    v_typmod integer;
    v_spelled text := format_type(p_type, p_typmod);
    v_why text;
    v_fix text;
BEGIN
    SELECT b.base_type, b.base_typmod INTO v_type, v_typmod FROM synchro.synchro_base_type(p_type, p_typmod) b;
    IF v_type = 'numeric'::regtype AND v_typmod < 4 THEN
        v_why := 'a synced decimal is checked against a declared precision and scale, and an unconstrained '
                 'numeric declares none (no declaration holds every value it accepts)';
        v_fix := format('declare them, for example ALTER TABLE ... ALTER COLUMN %I TYPE numeric(20, 6)', p_column);
    ELSIF v_type = 'numeric'::regtype THEN
        v_why := 'its scale is negative or larger than its precision, which no portable decimal can declare';
        v_fix := format('declare a scale in 0..precision (ALTER TABLE ... ALTER COLUMN %I TYPE numeric(p, s))', p_column);
    ELSIF synchro.synchro_array_element(v_type) IS NOT NULL THEN
        v_why := format('its elements (%s) have no portable type',
                        format_type(synchro.synchro_array_element(v_type), v_typmod));
        v_fix := format('change the element type (text, numeric(p, s), jsonb, ...), or keep %I on the server', p_column);
    ELSE
        v_why := 'it maps to none of the portable types (string, int, int64, decimal, float, boolean, '
                 'datetime, date, time, json, bytes)';
        v_fix := format('change its type to one that does (text, jsonb, ...), or keep %I on the server', p_column);
    END IF;
    RETURN format('column %I is of type %s: %s. Way out: %s; or keep it on the server only: --server-only %s',
                  p_column, v_spelled, v_why, v_fix, p_column);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_unsupported_type_hint(name, oid, integer) FROM PUBLIC;

-- The registration result, {"relation_id","kind","table_id"?,"fields":[...]}.
CREATE FUNCTION synchro.synchro_relation_json(p_relation_id text) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'relation_id', r.relation_id, 'kind', r.kind, 'table_id', r.table_id,
        'fields', coalesce((SELECT jsonb_agg(jsonb_build_object('field_id', f.field_id, 'column', f.column_name,
                                                                'type', f.portable_type) ORDER BY f.attnum)
                              FROM synchro.fields f WHERE f.relation_id = r.relation_id), '[]'::jsonb)))
      FROM synchro.relations r WHERE r.relation_id = p_relation_id
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_relation_json(text) FROM PUBLIC;

-- Refuses a lifecycle declaration ({"created_at","updated_at","deleted_at"} → column) that
-- names an unknown member, a missing, server-only, key or non-timestamp column, or one
-- column twice (SQLSTATE 22023). The columns become non-writable fields.
CREATE FUNCTION synchro.synchro_check_lifecycle(p_relation oid, p_lifecycle jsonb, p_server_only name[],
    p_key name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    IF jsonb_typeof(p_lifecycle) <> 'object'
       OR EXISTS (SELECT 1 FROM jsonb_each(p_lifecycle) l
                   WHERE l.key NOT IN ('created_at', 'updated_at', 'deleted_at') OR jsonb_typeof(l.value) <> 'string'
                      OR (l.value #>> '{}')::name = p_key OR (l.value #>> '{}')::name = ANY (p_server_only)
                      OR NOT EXISTS (SELECT 1 FROM pg_attribute a
                                      WHERE a.attrelid = p_relation AND a.attnum > 0 AND NOT a.attisdropped
                                        AND a.attname = (l.value #>> '{}')
                                        AND (synchro.synchro_base_type(a.atttypid, a.atttypmod)).base_type
                                            IN ('timestamptz'::regtype, 'timestamp'::regtype)))
       OR (SELECT count(DISTINCT l.value) <> count(*) FROM jsonb_each(p_lifecycle) l) THEN
        RAISE EXCEPTION 'lifecycle fields are created_at, updated_at and deleted_at, each a distinct synced timestamp column other than the key'
            USING ERRCODE = '22023';
    END IF;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_check_lifecycle(oid, jsonb, name[], name) FROM PUBLIC;

-- The trigger registration puts on every source relation: a primary-key update is refused
-- before any other effect.
CREATE FUNCTION synchro.synchro_reject_key_update() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'the primary key of a synced row cannot be updated; delete and insert instead'
        USING ERRCODE = '55000';
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_reject_key_update() FROM PUBLIC;

-- Registers one schema-qualified relation (spec 000 "Registered Relation Identity", spec 003
-- "Primary key and replica identity contract"). Idempotent for an already registered
-- relation: its IDs are returned, never reassigned. p_server_only names columns that are not
-- synced (a server-only column, or one without a portable type); never the key. p_lifecycle
-- declares server-owned lifecycle columns (synchro_lifecycle_error lists the rules);
-- p_timestamp_zones how timestamp (without time zone) columns are read (synchro_column_zone,
-- synchro_check_timestamp_zones). Records the
-- relation's first registry generation (33_reconfigure). Returns
-- {"relation_id","table_id"?,"fields":[{"field_id","column","type"}]}.
CREATE FUNCTION synchro.synchro_register_relation(
    p_schema text, p_relation text,
    -- Required, never defaulted (spec 003 "Strict Positive Limits": max_scope_fanout and
    -- max_impact_rows); NULL or out of 1..max_bound is invalid_limit.
    p_fanout_bound integer, p_impact_bound integer,
    p_kind text DEFAULT 'synced', p_composition text DEFAULT 'single_scope',
    p_push_enabled boolean DEFAULT true, p_table_name text DEFAULT NULL, p_server_only text[] DEFAULT '{}',
    p_lifecycle jsonb DEFAULT '{}', p_timestamp_zones jsonb DEFAULT '{}')
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
    -- First, before this transaction holds any other lock (the capture worker takes
    -- projection_rows before the views, so this order forms no cycle with it).
    PERFORM synchro.synchro_drop_orphaned_projection_indexes();
    IF p_fanout_bound IS NULL OR p_fanout_bound < 1 OR p_fanout_bound > v_max
       OR p_impact_bound IS NULL OR p_impact_bound < 1 OR p_impact_bound > v_max THEN
        PERFORM synchro.synchro_registration_error('invalid_limit');
    END IF;
    IF p_kind IS NULL OR p_kind NOT IN ('synced', 'capture_dependency')
       OR (p_kind = 'synced' AND (p_composition IS NULL OR p_composition NOT IN ('single_scope', 'multi_scope'))) THEN
        RAISE EXCEPTION 'kind must be synced or capture_dependency, composition single_scope or multi_scope'
            USING ERRCODE = '22023';
    END IF;
    -- Exactly one ordinary table named by exact catalog names (a partitioned one is refused
    -- below, with the way out).
    SELECT c.* INTO v_rel FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = p_schema AND c.relname = p_relation AND c.relkind IN ('r', 'p');
    IF NOT FOUND OR p_schema IS NULL OR p_relation IS NULL THEN
        PERFORM synchro.synchro_registration_error('ambiguous_physical_relation');
    END IF;
    IF v_rel.relkind = 'p' THEN
        -- Its rows are in its partitions, whose changes the publication would carry under their
        -- own names, and attaching or detaching one moves rows without a change: refused, not
        -- registered and silent.
        PERFORM synchro.synchro_registration_error('ambiguous_physical_relation', NULL, NULL,
            jsonb_build_object('hint', format('%I.%I is a partitioned table: its rows are in %s partitions, and '
                'this version syncs ordinary tables only. Way out: register each partition as a table of its '
                'own, or sync an ordinary table', p_schema, p_relation,
                (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = v_rel.oid))));
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
        PERFORM synchro.synchro_registration_error('composite_primary_key', NULL, NULL,
            jsonb_build_object('hint', 'a synced table has a primary key of one column. Way out (a join table, '
                'say): add a one-column key the clients can make and keep the natural key unique, for example '
                'ALTER TABLE ... ADD COLUMN id uuid NOT NULL DEFAULT gen_random_uuid(), DROP CONSTRAINT <its '
                'primary key>, ADD PRIMARY KEY (id), ADD UNIQUE (a_id, b_id); see docs/registration.md'));
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
        PERFORM synchro.synchro_registration_error('unsupported_primary_key_type', NULL, NULL,
            jsonb_build_object('hint', format('the primary key %I is of type %s; a key is one of smallint, integer, bigint, text, '
                               'varchar, char, uuid, inet, cidr, macaddr, macaddr8 or a built-in range type '
                               '(not a domain over one). Way out: a key column of one of those types',
                               v_key.attname, format_type(v_key.atttypid, v_key.atttypmod))));
    END IF;
    IF p_kind = 'synced' AND p_push_enabled AND (v_key.attidentity = 'a' OR v_key.attgenerated <> '') THEN
        -- A database-generated key cannot be written by a pushing client.
        PERFORM synchro.synchro_registration_error('unsupported_primary_key_type', NULL, NULL,
            jsonb_build_object('hint', format('the primary key %I is generated by the database (%s), and a client that '
                               'inserts offline must choose the key of its new row itself. Way out: register '
                               'with --no-push (clients read and the server writes), or give the table a key '
                               'clients can make (uuid or text, for example DEFAULT gen_random_uuid())',
                               v_key.attname, CASE WHEN v_key.attidentity = 'a' THEN 'GENERATED ALWAYS AS IDENTITY'
                                                   ELSE 'a generated column' END)));
    END IF;
    IF v_rel.relreplident <> 'd' THEN
        PERFORM synchro.synchro_registration_error('unsupported_replica_identity');
    END IF;
    IF p_server_only IS NULL OR v_key.attname = ANY (p_server_only) OR EXISTS (
        SELECT 1 FROM unnest(p_server_only) c(name)
         WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = v_rel.oid AND a.attnum > 0
                              AND NOT a.attisdropped AND a.attname = c.name)) THEN
        RAISE EXCEPTION 'server-only columns must be existing columns other than the primary key'
            USING ERRCODE = '22023';
    END IF;
    IF p_kind = 'synced' THEN
        PERFORM synchro.synchro_check_lifecycle(v_rel.oid, coalesce(p_lifecycle, '{}'), p_server_only::name[],
                                                v_key.attname);
    END IF;
    PERFORM synchro.synchro_check_timestamp_zones(v_rel.oid, coalesce(p_timestamp_zones, '{}'));

    v_relation_id := synchro.synchro_new_id('rel_');
    IF p_kind = 'synced' THEN
        v_table_id := synchro.synchro_new_id('tbl_');
    END IF;
    INSERT INTO synchro.relations (relation_id, kind, physical_schema, physical_relation, physical_relation_oid,
        replica_identity, capture_key_column, primary_key_type, table_id, table_name, composition, push_enabled,
        fanout_bound, impact_bound, server_only_columns, lifecycle, timestamp_zones)
    VALUES (v_relation_id, p_kind, p_schema, p_relation, v_rel.oid, v_rel.relreplident, v_key.attname,
        v_key.atttypid, v_table_id, CASE WHEN p_kind = 'synced' THEN coalesce(p_table_name, p_relation) END,
        CASE WHEN p_kind = 'synced' THEN p_composition END, p_push_enabled, p_fanout_bound, p_impact_bound,
        CASE WHEN p_kind = 'synced' THEN p_server_only::name[] ELSE '{}' END,
        CASE WHEN p_kind = 'synced' THEN coalesce(p_lifecycle, '{}') ELSE '{}' END,
        coalesce(p_timestamp_zones, '{}'));

    IF p_kind = 'synced' THEN
        FOR v_col IN SELECT a.* FROM pg_attribute a
                      WHERE a.attrelid = v_rel.oid AND a.attnum > 0 AND NOT a.attisdropped
                        AND NOT a.attname = ANY (p_server_only) ORDER BY a.attnum LOOP
            IF v_col.attnum = v_key.attnum THEN
                v_type := v_key_type; v_precision := NULL; v_scale := NULL;
            ELSE
                SELECT t.portable_type, t.decimal_precision, t.decimal_scale INTO v_type, v_precision, v_scale
                  FROM synchro.synchro_field_type(v_col.atttypid, v_col.atttypmod,
                      synchro.synchro_column_zone(p_timestamp_zones, v_col.attname)) t;
            END IF;
            IF v_type IS DISTINCT FROM 'datetime' AND EXISTS (
                SELECT 1 FROM jsonb_each_text(coalesce(p_lifecycle, '{}')) l WHERE l.value = v_col.attname) THEN
                RAISE EXCEPTION 'lifecycle column % is read as text (its timestamp zone): a lifecycle field is a datetime',
                    quote_ident(v_col.attname) USING ERRCODE = '22023';
            END IF;
            IF v_type IS NULL THEN
                -- No portable type: the relation cannot be represented (see protocol-decisions).
                -- The error names the column and its type, and no ID this registration made
                -- (they are rolled back with it; spec 003: relation_id only "when already
                -- assigned").
                PERFORM synchro.synchro_registration_error('unsupported_column_type', NULL, NULL,
                    jsonb_build_object('column', v_col.attname, 'type', format_type(v_col.atttypid, v_col.atttypmod),
                        'hint', synchro.synchro_unsupported_type_hint(v_col.attname, v_col.atttypid, v_col.atttypmod)));
            END IF;
            v_field_id := synchro.synchro_new_id('fld_');
            INSERT INTO synchro.fields (relation_id, field_id, column_name, attnum, portable_type, nullable, writable,
                is_key, decimal_precision, decimal_scale, type_oid, type_modifier)
            VALUES (v_relation_id, v_field_id, v_col.attname, v_col.attnum, v_type,
                NOT v_col.attnotnull,
                v_col.attnum <> v_key.attnum AND v_col.attgenerated = '' AND v_col.attidentity <> 'a'
                    AND NOT EXISTS (SELECT 1 FROM jsonb_each_text(coalesce(p_lifecycle, '{}')) l
                                     WHERE l.value = v_col.attname),
                v_col.attnum = v_key.attnum, v_precision, v_scale, v_col.atttypid, v_col.atttypmod);
        END LOOP;
    END IF;

    -- The source trigger refuses primary-key updates before any other effect.
    EXECUTE format('CREATE TRIGGER synchro_reject_key_update BEFORE UPDATE OF %I ON %I.%I FOR EACH ROW '
                   'WHEN (OLD.%I IS DISTINCT FROM NEW.%I) EXECUTE FUNCTION synchro.synchro_reject_key_update()',
                   v_key.attname, p_schema, p_relation, v_key.attname, v_key.attname);
    EXECUTE format('ALTER PUBLICATION synchro_publication ADD TABLE ONLY %I.%I', p_schema, p_relation);
    PERFORM synchro.synchro_record_generation(v_relation_id, 'registration');
    RETURN synchro.synchro_relation_json(v_relation_id);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_register_relation(text, text, integer, integer, text, text, boolean, text,
    text[], jsonb, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_register_relation(text, text, integer, integer, text, text, boolean, text,
    text[], jsonb, jsonb) TO synchro_operator;

-- Every column of an ordinary table with the portable type registration would give it (NULL
-- where none, with why and the way out): what `registry register --check` reports, all at
-- once. A column named in p_server_only is reported as server-only. Catalog names only.
CREATE FUNCTION synchro.synchro_column_report(p_schema text, p_relation text, p_server_only text[],
    p_timestamp_zones jsonb)
RETURNS TABLE (column_name text, sql_type text, portable_type text, decimal_precision integer,
               decimal_scale integer, server_only boolean, hint text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), t.portable_type, t.decimal_precision,
           t.decimal_scale, a.attname = ANY (coalesce(p_server_only, '{}')),
           CASE WHEN t.portable_type IS NULL AND NOT a.attname = ANY (coalesce(p_server_only, '{}'))
                THEN synchro.synchro_unsupported_type_hint(a.attname, a.atttypid, a.atttypmod) END
      FROM pg_catalog.pg_class c
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      CROSS JOIN LATERAL synchro.synchro_field_type(a.atttypid, a.atttypmod,
                             synchro.synchro_column_zone(coalesce(p_timestamp_zones, '{}'), a.attname)) t
     WHERE n.nspname = p_schema AND c.relname = p_relation AND c.relkind IN ('r', 'p')
     ORDER BY a.attnum
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_column_report(text, text, text[], jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_column_report(text, text, text[], jsonb) TO synchro_operator;

-- The ordinary and partitioned tables of a schema, by name, that no synced or dependency
-- registration holds yet (partitions are left out: they are rows of their parent):
-- `registry register --all`.
CREATE FUNCTION synchro.synchro_unregistered_tables(p_schema text) RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT c.relname::text
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = p_schema AND c.relkind IN ('r', 'p') AND NOT c.relispartition
       AND NOT EXISTS (SELECT 1 FROM synchro.relations r WHERE r.physical_relation_oid = c.oid)
     ORDER BY c.relname COLLATE "C"
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_unregistered_tables(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_unregistered_tables(text) TO synchro_operator;
