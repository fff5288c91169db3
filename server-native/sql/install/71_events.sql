-- synchro install 71: change notification for the event stream.
-- Spec 003 "Per-Scope Retention and Client Generations" (the stream boundary it reports).
--
-- The capture worker sends an empty NOTIFY on channel synchro_effects in every
-- materialization transaction that wrote scope effects (delivered at its commit, never with
-- data: any database role may LISTEN); the adapter then asks, for each connected client,
-- which of its assigned scopes have effects after the position it last reported.

-- The boundary (synchro_pull_watermark: it never moves backwards), the client's assigned
-- scopes with effects in (p_after, boundary], whether p_client_generation is its current,
-- unexpired generation, and its assigned scopes.
CREATE FUNCTION synchro.synchro_changed_scopes(p_user_id text, p_client_id text,
    p_client_generation bigint, p_after bigint)
RETURNS TABLE (watermark bigint, scopes text[], current_generation boolean, assigned text[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    WITH c AS (
        SELECT s.assigned_scopes, s.client_generation = p_client_generation AND NOT s.expired AS current_generation
          FROM synchro.synchro_client_state(p_user_id, p_client_id) s
    ), w AS (SELECT effect_position AS watermark FROM synchro.synchro_pull_watermark())
    SELECT w.watermark,
           -- One probe of (scope_id, position) per assigned scope: the planner knows neither
           -- p_after nor the scopes, and joined it read a scope's whole effect history
           -- (130-240 ms for 100,000 effects: most of a live client's commit-to-visible).
           coalesce((SELECT array_agg(DISTINCT s.scope_id ORDER BY s.scope_id)
                       FROM c, unnest(c.assigned_scopes) AS s(scope_id)
                      WHERE EXISTS (SELECT FROM synchro.scope_effects e
                                     WHERE e.scope_id = s.scope_id AND e.position > p_after
                                       AND e.position <= w.watermark)), '{}'),
           coalesce((SELECT current_generation FROM c), false),
           coalesce((SELECT assigned_scopes FROM c), '{}')
      FROM w
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_changed_scopes(text, text, bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_changed_scopes(text, text, bigint, bigint) TO synchro_adapter;

-- Once per notification for every stream of a server: the boundary and the scopes with
-- effects in (p_after, boundary]; each stream intersects them with its client's assigned
-- scopes in memory instead of querying the database itself.
CREATE FUNCTION synchro.synchro_changed_scopes_since(p_after bigint)
RETURNS TABLE (watermark bigint, scopes text[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    WITH w AS (SELECT effect_position AS watermark FROM synchro.synchro_pull_watermark())
    SELECT w.watermark,
           coalesce((SELECT array_agg(DISTINCT e.scope_id) FROM synchro.scope_effects e
                      WHERE e.position > p_after AND e.position <= w.watermark), '{}')
      FROM w
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_changed_scopes_since(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_changed_scopes_since(bigint) TO synchro_adapter;
