-- synchro schema, version 18: registration checks that a membership or impact function's
-- owner may read what the function reads (spec 003: USAGE on synchro_projection and SELECT on
-- every projection view it depends on), since the worker evaluates it as that owner.

SET LOCAL ROLE synchro_owner;

CREATE FUNCTION synchro.synchro_function_owner_can_read(p_function oid) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT has_schema_privilege(p.proowner, 'synchro_projection', 'USAGE')
       AND NOT EXISTS (
           SELECT 1 FROM pg_depend d JOIN pg_class c ON c.oid = d.refobjid
            WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.refclassid = 'pg_class'::regclass
              AND NOT has_table_privilege(p.proowner, c.oid, 'SELECT'))
      FROM pg_proc p WHERE p.oid = p_function
$$;

CREATE OR REPLACE FUNCTION synchro.synchro_register_membership_function(p_schema text, p_relation text, p_function text)
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
    IF NOT synchro.synchro_function_owner_can_read(v_oid) THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', v_rel.relation_id);
    END IF;
    IF EXISTS (SELECT 1 FROM synchro.membership_functions WHERE relation_id = v_rel.relation_id) THEN
        -- A rule change is staged: the live rule keeps serving until the worker has evaluated
        -- the new one over every row and activates it atomically.
        UPDATE synchro.membership_functions
           SET pending_function_oid = v_oid, pending_signature = v_oid::regprocedure::text,
               pending_sha256 = synchro.synchro_function_definition_sha256(v_oid),
               staged_through = NULL, staging_started_at = now()
         WHERE relation_id = v_rel.relation_id;
        DELETE FROM synchro.membership_staged_edges WHERE relation_id = v_rel.relation_id;
    ELSE
        INSERT INTO synchro.membership_functions (relation_id, function_oid, function_signature, definition_sha256)
        VALUES (v_rel.relation_id, v_oid, v_oid::regprocedure::text, synchro.synchro_function_definition_sha256(v_oid));
    END IF;
END $$;

CREATE OR REPLACE FUNCTION synchro.synchro_register_impact_function(p_target_schema text, p_target_relation text,
    p_dependency_schema text, p_dependency_relation text, p_function text, p_max_impact_rows integer DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_target synchro.relations%ROWTYPE;
    v_dep synchro.relations%ROWTYPE;
    v_oid oid;
    v_proc pg_proc%ROWTYPE;
    v_max integer := (SELECT value::integer FROM synchro.settings WHERE key = 'max_bound');
    v_bound integer;
    v_id text;
BEGIN
    SELECT * INTO v_target FROM synchro.relations
     WHERE physical_schema = p_target_schema AND physical_relation = p_target_relation AND kind = 'synced';
    IF NOT FOUND THEN
        PERFORM synchro.synchro_registration_error('ambiguous_physical_relation');
    END IF;
    SELECT * INTO v_dep FROM synchro.relations
     WHERE physical_schema = p_dependency_schema AND physical_relation = p_dependency_relation;
    IF NOT FOUND THEN
        PERFORM synchro.synchro_registration_error('undeclared_dependency', v_target.relation_id);
    END IF;
    v_bound := coalesce(p_max_impact_rows, v_dep.impact_bound);
    IF v_bound < 1 OR v_bound > v_max THEN
        PERFORM synchro.synchro_registration_error('invalid_limit', v_target.relation_id);
    END IF;
    BEGIN
        v_oid := to_regprocedure(p_function);
    EXCEPTION WHEN OTHERS THEN
        v_oid := NULL;
    END;
    IF v_oid IS NULL THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', v_target.relation_id);
    END IF;
    SELECT * INTO v_proc FROM pg_proc WHERE oid = v_oid;
    IF v_proc.prolang <> (SELECT oid FROM pg_language WHERE lanname = 'sql') OR v_proc.prosqlbody IS NULL
       OR v_proc.pronargs <> 2 OR v_proc.proargtypes[0] <> 'jsonb'::regtype OR v_proc.proargtypes[1] <> 'jsonb'::regtype
       OR NOT v_proc.proretset OR v_proc.prorettype <> 'synchro.synchro_row_ref'::regtype
       OR v_proc.provolatile <> 's' OR v_proc.prosecdef
       OR has_function_privilege('public', v_oid, 'EXECUTE')
       OR NOT has_function_privilege('synchro_worker', v_oid, 'EXECUTE') THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', v_target.relation_id);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_depend d JOIN pg_proc p ON p.oid = d.refobjid
                WHERE d.classid = 'pg_proc'::regclass AND d.objid = v_oid AND d.refclassid = 'pg_proc'::regclass
                  AND p.pronamespace <> 'pg_catalog'::regnamespace)
       OR EXISTS (SELECT 1 FROM pg_depend d JOIN pg_class c ON c.oid = d.refobjid
                   WHERE d.classid = 'pg_proc'::regclass AND d.objid = v_oid AND d.refclassid = 'pg_class'::regclass
                     AND c.relnamespace <> 'synchro_projection'::regnamespace) THEN
        PERFORM synchro.synchro_registration_error('undeclared_dependency', v_target.relation_id);
    END IF;
    IF NOT synchro.synchro_function_owner_can_read(v_oid) THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', v_target.relation_id);
    END IF;
    INSERT INTO synchro.membership_dependencies (dependency_id, target_relation_id, dependency_relation_id,
        impact_function_oid, impact_function_signature, definition_sha256, max_impact_rows)
    VALUES (synchro.synchro_new_id('dep_'), v_target.relation_id, v_dep.relation_id, v_oid,
        v_oid::regprocedure::text, synchro.synchro_function_definition_sha256(v_oid), v_bound)
    ON CONFLICT (target_relation_id, dependency_relation_id) DO UPDATE
       SET impact_function_oid = EXCLUDED.impact_function_oid,
           impact_function_signature = EXCLUDED.impact_function_signature,
           definition_sha256 = EXCLUDED.definition_sha256, max_impact_rows = EXCLUDED.max_impact_rows,
           generation = synchro.membership_dependencies.generation + 1
    RETURNING dependency_id INTO v_id;
    RETURN v_id;
END $$;

RESET ROLE;

REVOKE EXECUTE ON FUNCTION synchro.synchro_function_owner_can_read(oid) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_register_membership_function(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_register_membership_function(text, text, text) TO synchro_operator;
REVOKE EXECUTE ON FUNCTION synchro.synchro_register_impact_function(text, text, text, text, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_register_impact_function(text, text, text, text, text, integer)
    TO synchro_operator;
