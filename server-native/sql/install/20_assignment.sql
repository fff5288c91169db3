-- synchro install 20: scope assignment: explicit grants, shared scopes, the default user
-- scope and the registered assignment function.
-- Spec 003 "Scope assignment", "Function restrictions"; spec 000 "Scope Assignment".

CREATE TABLE synchro.shared_scopes (scope_id text PRIMARY KEY CHECK (scope_id <> ''));
REVOKE ALL ON synchro.shared_scopes FROM PUBLIC;
CREATE TABLE synchro.user_scope_grants (
    user_id text NOT NULL CHECK (user_id <> ''),
    scope_id text NOT NULL CHECK (scope_id <> ''),
    PRIMARY KEY (user_id, scope_id)
);
REVOKE ALL ON synchro.user_scope_grants FROM PUBLIC;
-- Users whose default scope user:{id} is revoked.
CREATE TABLE synchro.user_default_scope_revocations (user_id text PRIMARY KEY);
REVOKE ALL ON synchro.user_default_scope_revocations FROM PUBLIC;

-- Grants a scope to a user (granting user:{id} to its user lifts the default's revocation).
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
REVOKE EXECUTE ON FUNCTION synchro.synchro_grant_user_scope(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_grant_user_scope(text, text) TO synchro_operator;

-- Revokes a scope from a user (revoking user:{id} revokes the default scope).
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
REVOKE EXECUTE ON FUNCTION synchro.synchro_revoke_user_scope(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_revoke_user_scope(text, text) TO synchro_operator;

-- A shared scope is assigned to every user.
CREATE FUNCTION synchro.synchro_add_shared_scope(p_scope_id text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    IF coalesce(p_scope_id, '') = '' THEN
        RAISE EXCEPTION 'scope_id must be nonempty' USING ERRCODE = '22023';
    END IF;
    INSERT INTO synchro.shared_scopes VALUES (p_scope_id) ON CONFLICT DO NOTHING;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_add_shared_scope(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_add_shared_scope(text) TO synchro_operator;

CREATE FUNCTION synchro.synchro_remove_shared_scope(p_scope_id text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    DELETE FROM synchro.shared_scopes WHERE scope_id = p_scope_id
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_remove_shared_scope(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_remove_shared_scope(text) TO synchro_operator;

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
REVOKE EXECUTE ON FUNCTION synchro.synchro_assigned_scopes(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_assigned_scopes(text) TO synchro_adapter;

-- The registered scope-assignment function: one at most. Registration validates every rule
-- and stores the SHA-256 of its definition, which connect re-checks before each call.
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
REVOKE ALL ON synchro.assignment_function FROM PUBLIC;

-- The definition hash, computed under this function's pinned search_path (the text of
-- pg_get_functiondef depends on it). Membership and impact registration (40_membership,
-- 41_dependencies) record it too.
CREATE FUNCTION synchro.synchro_function_definition_sha256(p_oid oid) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT encode(sha256(convert_to(pg_get_functiondef(p_oid), 'UTF8')), 'hex')
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_function_definition_sha256(oid) FROM PUBLIC;
-- The worker compares each registered membership and impact function with it at every
-- step: a function replaced in place is not evaluated until re-registered (definition_changed).
GRANT EXECUTE ON FUNCTION synchro.synchro_function_definition_sha256(oid) TO synchro_worker;

-- Registers (or replaces) the assignment function: LANGUAGE sql with a SQL-standard body,
-- STABLE, SECURITY INVOKER, (text) RETURNS SETOF text, search_path pinned to
-- "pg_catalog, synchro", owned by the registering session user, executable by
-- synchro_owner and not by PUBLIC, calling only pg_catalog functions and reading no synchro
-- relation. NULL registers nothing. p_evaluator is its evaluator (synchro_eval.a_<oid>,
-- 40_membership), created by the entry point below as the registration actor: connect and
-- pull call it (synchro_assignment_scopes), so the function runs as its owner on the
-- adapter's connection, never as synchro_owner, and no login of the owner's is configured.
CREATE FUNCTION synchro.synchro_register_assignment_rule(p_function text, p_max_scopes integer, p_evaluator oid)
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
    PERFORM synchro.synchro_record_evaluator(p_evaluator, v_oid, 'a', NULL);
    DELETE FROM synchro.assignment_function;
    INSERT INTO synchro.assignment_function (function_oid, function_schema, function_name, max_scopes,
                                             definition_sha256, registered_by)
    SELECT v_oid, n.nspname, v_proc.proname, p_max_scopes, v_before, session_user
      FROM pg_namespace n WHERE n.oid = v_proc.pronamespace;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_register_assignment_rule(text, integer, oid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_register_assignment_rule(text, integer, oid) TO synchro_operator;

-- The operator's entry point (spec 003): creates the function's evaluator as the
-- registration actor (SECURITY INVOKER), then registers both.
CREATE FUNCTION synchro.synchro_register_assignment_function(p_function text, p_max_scopes integer DEFAULT 1000)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    IF p_function IS NULL THEN
        RETURN;
    END IF;
    PERFORM synchro.synchro_register_assignment_rule(p_function, p_max_scopes,
                                                     synchro.synchro_rule_evaluator(p_function, 'a'));
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_register_assignment_function(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_register_assignment_function(text, integer) TO synchro_operator;

CREATE FUNCTION synchro.synchro_unregister_assignment_function() RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    DELETE FROM synchro.assignment_function
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_unregister_assignment_function() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_unregister_assignment_function() TO synchro_operator;

-- (synchro_assignment_function_check and synchro_assignment_scopes, which read the
-- function's evaluator, are in 40_membership, after the evaluators.)
