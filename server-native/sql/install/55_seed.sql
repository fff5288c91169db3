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
