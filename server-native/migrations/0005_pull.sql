-- synchro schema, version 5: the adapter's read functions for POST /sync/pull.

SET LOCAL ROLE synchro_owner;

-- Generations a cursor binds. The membership generation advances whenever any membership
-- function is (re)registered, which invalidates every cursor (safe, coarse).
CREATE FUNCTION synchro.synchro_stream_state()
RETURNS TABLE (stream_generation bigint, membership_generation bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT c.stream_generation,
           coalesce((SELECT sum(m.membership_generation) FROM synchro.membership_functions m), 0)::bigint + 1
      FROM synchro.capture_state c
$$;

-- The next effects after each scope's position, in stream order, with the row's current
-- state when it is still in the scope (otherwise the change is a delete).
CREATE FUNCTION synchro.synchro_pull_page(p_scopes text[], p_positions bigint[], p_limit integer)
RETURNS TABLE (effect_position bigint, scope_id text, table_id text, pk text, kind text, server_version text,
               row_json text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT e.position, e.scope_id, r.table_id, e.pk,
           CASE WHEN e.kind = 'upsert' AND p.row_json IS NOT NULL AND m.scope_id IS NOT NULL
                THEN 'upsert' ELSE 'delete' END,
           CASE WHEN e.kind = 'upsert' AND p.row_json IS NOT NULL AND m.scope_id IS NOT NULL
                THEN p.server_version ELSE e.server_version END,
           CASE WHEN e.kind = 'upsert' AND m.scope_id IS NOT NULL THEN p.row_json END
      FROM unnest(p_scopes, p_positions) AS c(scope_id, after_position)
      JOIN synchro.scope_effects e ON e.scope_id = c.scope_id AND e.position > c.after_position
      JOIN synchro.relations r ON r.relation_id = e.relation_id
      LEFT JOIN synchro.projection_rows p ON p.relation_id = e.relation_id AND p.pk = e.pk
      LEFT JOIN synchro.membership_edges m ON m.scope_id = e.scope_id AND m.relation_id = e.relation_id AND m.pk = e.pk
     ORDER BY e.position
     LIMIT p_limit
$$;

CREATE FUNCTION synchro.synchro_pull_watermark() RETURNS TABLE (effect_position bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT coalesce(max(position), 0) FROM synchro.scope_effects
$$;

-- A scope's current rows, for its digest.
CREATE FUNCTION synchro.synchro_scope_rows(p_scope text)
RETURNS TABLE (table_id text, pk text, row_json text, server_version text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT r.table_id, p.pk, p.row_json, p.server_version
      FROM synchro.membership_edges m
      JOIN synchro.projection_rows p ON p.relation_id = m.relation_id AND p.pk = m.pk
      JOIN synchro.relations r ON r.relation_id = m.relation_id
     WHERE m.scope_id = p_scope
$$;

RESET ROLE;

REVOKE EXECUTE ON FUNCTION synchro.synchro_stream_state() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_pull_page(text[], bigint[], integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_pull_watermark() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_scope_rows(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_stream_state() TO synchro_adapter;
GRANT EXECUTE ON FUNCTION synchro.synchro_pull_page(text[], bigint[], integer) TO synchro_adapter;
GRANT EXECUTE ON FUNCTION synchro.synchro_pull_watermark() TO synchro_adapter;
GRANT EXECUTE ON FUNCTION synchro.synchro_scope_rows(text) TO synchro_adapter;
