-- synchro schema, version 19: a relation's first membership rule is staged like a rule
-- change: it is recorded as not yet live, evaluated in batches, and made live at activation.

ALTER TABLE synchro.membership_functions ADD COLUMN live boolean NOT NULL DEFAULT true;

SET LOCAL ROLE synchro_owner;

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
        -- A first rule is staged too and becomes live only at activation, so no client sees
        -- a partially evaluated relation.
        INSERT INTO synchro.membership_functions (relation_id, function_oid, function_signature, definition_sha256,
            live, pending_function_oid, pending_signature, pending_sha256, staging_started_at)
        VALUES (v_rel.relation_id, v_oid, v_oid::regprocedure::text, synchro.synchro_function_definition_sha256(v_oid),
            false, v_oid, v_oid::regprocedure::text, synchro.synchro_function_definition_sha256(v_oid), now());
    END IF;
END $$;

RESET ROLE;

REVOKE EXECUTE ON FUNCTION synchro.synchro_register_membership_function(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_register_membership_function(text, text, text) TO synchro_operator;
