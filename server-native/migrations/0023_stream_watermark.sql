-- synchro schema, version 23: the stream boundary a snapshot describes survives compaction.
--
-- Pull's terminal positions and a rebuild session's final cursor stood at the largest
-- retained effect position. Once compaction has deleted a scope's (or the whole log's)
-- newest effects, that maximum falls below the resume floors it deleted up to (to 0 when
-- the log is empty), so a rebuild ended with a cursor below its scope's floor and every
-- following pull listed the scope in rebuild_scopes again: a livelock. Effects are written
-- by the single capture leader in position order and compaction only deletes committed
-- effects, so every position up to the largest floor visible in a snapshot is a committed
-- position of that snapshot: the boundary is the greater of the two.

SET LOCAL ROLE synchro_owner;

CREATE OR REPLACE FUNCTION synchro.synchro_pull_watermark() RETURNS TABLE (effect_position bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT greatest((SELECT coalesce(max(position), 0) FROM synchro.scope_effects),
                    (SELECT coalesce(max(resume_floor), 0) FROM synchro.scope_retention))
$$;

-- Change notification compares against the same boundary (it never moves backwards).
CREATE OR REPLACE FUNCTION synchro.synchro_changed_scopes(p_user_id text, p_client_id text,
    p_client_generation bigint, p_after bigint)
RETURNS TABLE (watermark bigint, scopes text[], current_generation boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    WITH c AS (
        SELECT s.assigned_scopes, s.client_generation = p_client_generation AND NOT s.expired AS current_generation
          FROM synchro.synchro_client_state(p_user_id, p_client_id) s
    )
    SELECT (SELECT effect_position FROM synchro.synchro_pull_watermark()),
           coalesce((SELECT array_agg(DISTINCT e.scope_id ORDER BY e.scope_id) FROM synchro.scope_effects e, c
                      WHERE e.position > p_after AND e.scope_id = ANY (c.assigned_scopes)), '{}'),
           coalesce((SELECT current_generation FROM c), false)
$$;

RESET ROLE;
