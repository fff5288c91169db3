-- synchro schema, version 14: membership generations per scope (spec 003 "Registry and
-- Membership Generations": persisted with the scope's membership state, binding its cursors
-- and rebuild sessions). When a changed membership contract is re-evaluated, only the scopes
-- whose edge set changed advance their generation; other scopes stay resumable.

ALTER TABLE synchro.scope_retention ADD COLUMN membership_generation bigint NOT NULL DEFAULT 1
    CHECK (membership_generation >= 1);

SET LOCAL ROLE synchro_owner;

DROP FUNCTION synchro.synchro_scope_retention(text[]);
CREATE FUNCTION synchro.synchro_scope_retention(p_scopes text[])
RETURNS TABLE (scope_id text, retention_generation bigint, resume_floor bigint, membership_generation bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT s, coalesce(r.retention_generation, 1), coalesce(r.resume_floor, 0), coalesce(r.membership_generation, 1)
      FROM unnest(p_scopes) AS s LEFT JOIN synchro.scope_retention r ON r.scope_id = s
$$;

RESET ROLE;

REVOKE EXECUTE ON FUNCTION synchro.synchro_scope_retention(text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_scope_retention(text[]) TO synchro_adapter;
GRANT SELECT, INSERT, UPDATE ON synchro.scope_retention TO synchro_worker;
