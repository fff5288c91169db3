-- synchro schema, version 4: projection views, membership functions, membership edges and
-- per-scope effects (issue 5, second part).
--
-- Membership functions read only the typed projection views in synchro_projection (never
-- live application tables); the capture worker evaluates them inside its materialization
-- transaction, after applying the source transaction, and records edge diffs and scope
-- effects in that same transaction.

SET LOCAL ROLE synchro_owner;

CREATE SCHEMA synchro_projection;
REVOKE ALL ON SCHEMA synchro_projection FROM PUBLIC;

-- The SQL type a portable type reads back as in a projection view.
CREATE FUNCTION synchro.synchro_projection_expression(p_field_id text, p_type text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT CASE p_type
        WHEN 'string' THEN format('(r.row_json::jsonb ->> %L)', p_field_id)
        WHEN 'int' THEN format('(r.row_json::jsonb ->> %L)::integer', p_field_id)
        WHEN 'int64' THEN format('(r.row_json::jsonb ->> %L)::bigint', p_field_id)
        WHEN 'decimal' THEN format('(r.row_json::jsonb ->> %L)::numeric', p_field_id)
        WHEN 'float' THEN format('(r.row_json::jsonb ->> %L)::double precision', p_field_id)
        WHEN 'boolean' THEN format('(r.row_json::jsonb ->> %L)::boolean', p_field_id)
        WHEN 'datetime' THEN format('(r.row_json::jsonb ->> %L)::timestamptz', p_field_id)
        WHEN 'date' THEN format('(r.row_json::jsonb ->> %L)::date', p_field_id)
        WHEN 'time' THEN format('(r.row_json::jsonb ->> %L)::time', p_field_id)
        WHEN 'json' THEN format('(r.row_json::jsonb ->> %L)::jsonb', p_field_id)
        ELSE format('(r.row_json::jsonb ->> %L)', p_field_id) -- bytes stay base64url text
    END
$$;

-- (Re)creates the typed view of one synced relation: synchro_projection."<relation>" named
-- after the source relation's schema and name, columns named after the source columns.
CREATE FUNCTION synchro.synchro_create_projection_view(p_relation_id text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_cols text;
BEGIN
    SELECT * INTO v_rel FROM synchro.relations WHERE relation_id = p_relation_id AND kind = 'synced';
    IF NOT FOUND THEN RETURN; END IF;
    SELECT string_agg(synchro.synchro_projection_expression(f.field_id, f.portable_type) || ' AS '
                      || quote_ident(f.column_name), ', ' ORDER BY f.attnum)
      INTO v_cols FROM synchro.fields f WHERE f.relation_id = p_relation_id;
    EXECUTE format('CREATE OR REPLACE VIEW synchro_projection.%I AS SELECT %s FROM synchro.projection_rows r '
                   'WHERE r.relation_id = %L',
                   v_rel.physical_schema || '.' || v_rel.physical_relation, v_cols, p_relation_id);
END $$;

DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT relation_id FROM synchro.relations WHERE kind = 'synced' LOOP
        PERFORM synchro.synchro_create_projection_view(r.relation_id);
    END LOOP;
END $$;

CREATE FUNCTION synchro.synchro_fields_view_trigger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    PERFORM synchro.synchro_create_projection_view(NEW.relation_id);
    RETURN NULL;
END $$;
-- Registration inserts fields after the relation row: each insert refreshes the view.
CREATE TRIGGER synchro_fields_projection_view AFTER INSERT ON synchro.fields
    FOR EACH ROW EXECUTE FUNCTION synchro.synchro_fields_view_trigger();

CREATE TABLE synchro.membership_functions (
    relation_id text PRIMARY KEY REFERENCES synchro.relations,
    function_oid oid NOT NULL,
    function_signature text NOT NULL,
    definition_sha256 text NOT NULL,
    membership_generation bigint NOT NULL DEFAULT 1 CHECK (membership_generation >= 1)
);

CREATE TABLE synchro.membership_edges (
    scope_id text NOT NULL CHECK (scope_id <> ''),
    relation_id text NOT NULL REFERENCES synchro.relations,
    pk text NOT NULL,
    PRIMARY KEY (scope_id, relation_id, pk)
);
CREATE INDEX membership_edges_row ON synchro.membership_edges (relation_id, pk);

-- Every change a scope saw, in capture (commit) order. position is the stream position
-- cursors resume from.
CREATE TABLE synchro.scope_effects (
    position bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope_id text NOT NULL,
    relation_id text NOT NULL,
    pk text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('upsert', 'delete')),
    server_version text NOT NULL
);
CREATE INDEX scope_effects_scope ON synchro.scope_effects (scope_id, position);

-- Registers the membership function of a synced relation (spec 000/003): LANGUAGE sql,
-- STABLE, SECURITY INVOKER, exactly one argument of the key's SQL type, RETURNS SETOF text,
-- reading only projection views (no live relation, no function outside pg_catalog).
CREATE FUNCTION synchro.synchro_register_membership_function(p_schema text, p_relation text, p_function text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_oid oid;
    v_proc pg_proc%ROWTYPE;
BEGIN
    SELECT * INTO v_rel FROM synchro.relations
     WHERE physical_schema = p_schema AND physical_relation = p_relation AND kind = 'synced';
    IF NOT FOUND THEN
        PERFORM synchro.synchro_registration_error('ambiguous_physical_relation');
    END IF;
    BEGIN
        v_oid := to_regprocedure(p_function);
    EXCEPTION WHEN OTHERS THEN
        v_oid := NULL;
    END;
    IF v_oid IS NULL THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', v_rel.relation_id);
    END IF;
    SELECT * INTO v_proc FROM pg_proc WHERE oid = v_oid;
    IF v_proc.prolang <> (SELECT oid FROM pg_language WHERE lanname = 'sql') OR v_proc.prosqlbody IS NULL
       OR v_proc.pronargs <> 1 OR v_proc.proargtypes[0] <> v_rel.primary_key_type
       OR NOT v_proc.proretset OR v_proc.prorettype <> 'text'::regtype
       OR v_proc.provolatile <> 's' OR v_proc.prosecdef
       OR has_function_privilege('public', v_oid, 'EXECUTE')
       OR NOT has_function_privilege('synchro_worker', v_oid, 'EXECUTE') THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', v_rel.relation_id);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_depend d JOIN pg_proc p ON p.oid = d.refobjid
                WHERE d.classid = 'pg_proc'::regclass AND d.objid = v_oid AND d.refclassid = 'pg_proc'::regclass
                  AND p.pronamespace <> 'pg_catalog'::regnamespace)
       OR EXISTS (SELECT 1 FROM pg_depend d JOIN pg_class c ON c.oid = d.refobjid
                   WHERE d.classid = 'pg_proc'::regclass AND d.objid = v_oid AND d.refclassid = 'pg_class'::regclass
                     AND c.relnamespace <> 'synchro_projection'::regnamespace) THEN
        PERFORM synchro.synchro_registration_error('undeclared_dependency', v_rel.relation_id);
    END IF;
    INSERT INTO synchro.membership_functions (relation_id, function_oid, function_signature, definition_sha256)
    VALUES (v_rel.relation_id, v_oid, v_oid::regprocedure::text, synchro.synchro_function_definition_sha256(v_oid))
    ON CONFLICT (relation_id) DO UPDATE SET function_oid = EXCLUDED.function_oid,
        function_signature = EXCLUDED.function_signature, definition_sha256 = EXCLUDED.definition_sha256,
        membership_generation = synchro.membership_functions.membership_generation + 1;
END $$;

RESET ROLE;

REVOKE ALL ON synchro.membership_functions, synchro.membership_edges, synchro.scope_effects FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_projection_expression(text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_create_projection_view(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_fields_view_trigger() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_register_membership_function(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_register_membership_function(text, text, text) TO synchro_operator;
-- Only the operator and the worker may read projection views (spec 001).
GRANT USAGE ON SCHEMA synchro_projection TO synchro_operator, synchro_worker;
ALTER DEFAULT PRIVILEGES FOR ROLE synchro_owner IN SCHEMA synchro_projection
    GRANT SELECT ON TABLES TO synchro_operator, synchro_worker;
GRANT SELECT ON ALL TABLES IN SCHEMA synchro_projection TO synchro_operator, synchro_worker;
GRANT SELECT ON synchro.membership_functions TO synchro_worker;
GRANT SELECT, INSERT, DELETE ON synchro.membership_edges TO synchro_worker;
GRANT SELECT, INSERT ON synchro.scope_effects TO synchro_worker;

-- Membership failures block capture too.
ALTER TABLE synchro.capture_state DROP CONSTRAINT capture_state_blocked_reason_check;
ALTER TABLE synchro.capture_state ADD CONSTRAINT capture_state_blocked_reason_check CHECK (blocked_reason IN
    ('registered_relation_drift', 'unrepresentable_value', 'decode_error', 'truncate_unsupported',
     'membership_evaluation_failed', 'membership_bound_exceeded'));
