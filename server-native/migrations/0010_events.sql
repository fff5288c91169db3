-- synchro schema, version 10: change notification (issue 5). The capture worker sends an
-- empty NOTIFY on channel synchro_effects in every materialization transaction that wrote
-- scope effects (delivered at its commit, never with data: any database role may LISTEN);
-- the adapter then asks, for each connected client, which of its assigned scopes have
-- effects after the position it last reported.

SET LOCAL ROLE synchro_owner;

CREATE FUNCTION synchro.synchro_changed_scopes(p_user_id text, p_client_id text, p_client_generation bigint,
    p_after bigint)
RETURNS TABLE (watermark bigint, scopes text[], current_generation boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    WITH c AS (
        SELECT s.assigned_scopes, s.client_generation = p_client_generation AND NOT s.expired AS current_generation
          FROM synchro.synchro_client_state(p_user_id, p_client_id) s
    )
    SELECT (SELECT coalesce(max(position), 0) FROM synchro.scope_effects),
           coalesce((SELECT array_agg(DISTINCT e.scope_id ORDER BY e.scope_id) FROM synchro.scope_effects e, c
                      WHERE e.position > p_after AND e.scope_id = ANY (c.assigned_scopes)), '{}'),
           coalesce((SELECT current_generation FROM c), false)
$$;

RESET ROLE;

REVOKE EXECUTE ON FUNCTION synchro.synchro_changed_scopes(text, text, bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_changed_scopes(text, text, bigint, bigint) TO synchro_adapter;
