-- synchro schema, version 2: the registered scope-assignment function (spec 003 "Scope
-- assignment"). One function at most; registration validates every rule and stores the
-- SHA-256 of its definition, which connect re-checks before each call.

SET LOCAL ROLE synchro_owner;

CREATE TABLE synchro.assignment_function (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    function_oid oid NOT NULL,
    function_schema name NOT NULL,
    function_name name NOT NULL,
    max_scopes integer CHECK (max_scopes BETWEEN 1 AND 1000),
    definition_sha256 text NOT NULL,
    registered_by name NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now()
);

-- The definition hash, computed under this function's pinned search_path (the text of
-- pg_get_functiondef depends on it).
CREATE FUNCTION synchro.synchro_function_definition_sha256(p_oid oid) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT encode(sha256(convert_to(pg_get_functiondef(p_oid), 'UTF8')), 'hex')
$$;

CREATE FUNCTION synchro.synchro_register_assignment_function(p_function text, p_max_scopes integer DEFAULT 1000)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_oid oid;
    v_proc pg_proc%ROWTYPE;
    v_before text;
    v_actor oid := (SELECT oid FROM pg_roles WHERE rolname = session_user);
BEGIN
    IF p_function IS NULL THEN
        RETURN;
    END IF;
    IF p_max_scopes IS NOT NULL AND (p_max_scopes < 1 OR p_max_scopes > 1000) THEN
        PERFORM synchro.synchro_registration_error('invalid_limit');
    END IF;
    -- PostgreSQL 15's to_regprocedure raises on a name without an argument list; a schema
    -- synchro_owner may not use cannot hold a function it will call.
    BEGIN
        v_oid := CASE WHEN strpos(p_function, '(') > 0 THEN to_regprocedure(p_function) ELSE to_regproc(p_function) END;
    EXCEPTION WHEN insufficient_privilege OR invalid_text_representation OR syntax_error THEN
        v_oid := NULL;
    END;
    IF v_oid IS NULL THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function');
    END IF;
    v_before := synchro.synchro_function_definition_sha256(v_oid);
    SELECT * INTO v_proc FROM pg_proc WHERE oid = v_oid;
    IF v_proc.prolang <> (SELECT oid FROM pg_language WHERE lanname = 'sql') OR v_proc.prosqlbody IS NULL
       OR v_proc.pronargs <> 1 OR v_proc.proargtypes[0] <> 'text'::regtype
       OR v_proc.pronargdefaults <> 0 OR v_proc.provariadic <> 0
       OR NOT v_proc.proretset OR v_proc.prorettype <> 'text'::regtype
       OR v_proc.provolatile <> 's' OR v_proc.prosecdef
       OR v_proc.proconfig IS DISTINCT FROM ARRAY['search_path=pg_catalog, synchro']
       OR v_proc.proowner IS DISTINCT FROM v_actor
       OR NOT has_function_privilege('synchro_owner', v_oid, 'EXECUTE')
       OR has_function_privilege('public', v_oid, 'EXECUTE') THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function');
    END IF;
    -- Calls only pg_catalog functions; reads no synchro relation; its owner can read every
    -- relation it depends on.
    IF EXISTS (SELECT 1 FROM pg_depend d JOIN pg_proc p ON p.oid = d.refobjid
                WHERE d.classid = 'pg_proc'::regclass AND d.objid = v_oid AND d.refclassid = 'pg_proc'::regclass
                  AND p.pronamespace <> 'pg_catalog'::regnamespace)
       OR EXISTS (SELECT 1 FROM pg_depend d JOIN pg_class c ON c.oid = d.refobjid
                   WHERE d.classid = 'pg_proc'::regclass AND d.objid = v_oid AND d.refclassid = 'pg_class'::regclass
                     AND (c.relnamespace = 'synchro'::regnamespace
                          OR NOT has_table_privilege(v_proc.proowner, c.oid, 'SELECT')
                          OR NOT has_schema_privilege(v_proc.proowner, c.relnamespace, 'USAGE'))) THEN
        PERFORM synchro.synchro_registration_error('undeclared_dependency');
    END IF;
    IF synchro.synchro_function_definition_sha256(v_oid) IS DISTINCT FROM v_before THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function');
    END IF;
    DELETE FROM synchro.assignment_function;
    INSERT INTO synchro.assignment_function (function_oid, function_schema, function_name, max_scopes,
                                             definition_sha256, registered_by)
    SELECT v_oid, n.nspname, v_proc.proname, p_max_scopes, v_before, session_user
      FROM pg_namespace n WHERE n.oid = v_proc.pronamespace;
END $$;

CREATE FUNCTION synchro.synchro_unregister_assignment_function() RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    DELETE FROM synchro.assignment_function
$$;

-- For connect: the registered function, and whether it still exists with its checked
-- definition. No row when none is registered.
CREATE FUNCTION synchro.synchro_assignment_function_check()
RETURNS TABLE (function_schema name, function_name name, max_scopes integer, intact boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT a.function_schema, a.function_name, a.max_scopes,
           EXISTS (SELECT 1 FROM pg_proc p WHERE p.oid = a.function_oid)
           AND synchro.synchro_function_definition_sha256(a.function_oid) = a.definition_sha256
      FROM synchro.assignment_function a
$$;

CREATE OR REPLACE FUNCTION synchro.synchro_health_detail() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT jsonb_build_object(
        'schema_installed', 'ok',
        'current_manifest', CASE WHEN EXISTS (SELECT 1 FROM synchro.manifests) THEN 'ok' ELSE 'failed' END,
        'registry_drift', CASE WHEN EXISTS (
            SELECT 1 FROM synchro.relations r
             WHERE NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                                WHERE c.oid = r.physical_relation_oid AND c.relname = r.physical_relation
                                  AND n.nspname = r.physical_schema AND c.relreplident = r.replica_identity))
            THEN 'failed' ELSE 'ok' END,
        'assignment_function', CASE WHEN EXISTS (
            SELECT 1 FROM synchro.synchro_assignment_function_check() WHERE NOT intact) THEN 'failed' ELSE 'ok' END)
$$;

RESET ROLE;

REVOKE ALL ON synchro.assignment_function FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_function_definition_sha256(oid) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_register_assignment_function(text, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_unregister_assignment_function() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_assignment_function_check() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_register_assignment_function(text, integer) TO synchro_operator;
GRANT EXECUTE ON FUNCTION synchro.synchro_unregister_assignment_function() TO synchro_operator;
GRANT EXECUTE ON FUNCTION synchro.synchro_assignment_function_check() TO synchro_adapter, synchro_monitor;
