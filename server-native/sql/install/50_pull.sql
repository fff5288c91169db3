-- synchro install 50: scope effects and per-scope stream state, and what POST /sync/pull
-- and the terminal checksums read.
-- Spec 003 "Registry and Membership Generations", "Per-Scope Retention and Client
-- Generations"; spec 001 "Scope digest", "Wire checksum objects and terminal maps"; spec 000
-- "Class 3: Compatible Rebuild-Requiring Change" (a manifest is served only once its tables
-- are materialized).

-- Every change a scope saw, in capture (commit) order. position is the stream position
-- cursors resume from.
CREATE TABLE synchro.scope_effects (
    position bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope_id text NOT NULL,
    relation_id text NOT NULL,
    pk text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('upsert', 'delete')),
    server_version text NOT NULL
);
CREATE INDEX scope_effects_scope ON synchro.scope_effects (scope_id, position);
REVOKE ALL ON synchro.scope_effects FROM PUBLIC;
GRANT SELECT, INSERT ON synchro.scope_effects TO synchro_worker;

-- Each scope's persisted stream state: its retention generation and resume floor (compaction,
-- 60_retention; every effect at or below the floor is deleted) and its membership generation
-- (advanced only when a changed rule changes the scope's edge set, 42_staging). Cursors and
-- rebuild sessions bind all three. A scope without a row has the defaults.
CREATE TABLE synchro.scope_retention (
    scope_id text PRIMARY KEY CHECK (scope_id <> ''),
    retention_generation bigint NOT NULL DEFAULT 1 CHECK (retention_generation >= 1),
    -- Inclusive minimum resumable position; every effect at or below it is deleted.
    resume_floor bigint NOT NULL DEFAULT 0 CHECK (resume_floor >= 0),
    compacted_at timestamptz,
    membership_generation bigint NOT NULL DEFAULT 1 CHECK (membership_generation >= 1)
);
REVOKE ALL ON synchro.scope_retention FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE ON synchro.scope_retention TO synchro_worker;

-- Each scope's stream state (defaults for a scope never compacted or re-evaluated).
CREATE FUNCTION synchro.synchro_scope_retention(p_scopes text[])
RETURNS TABLE (scope_id text, retention_generation bigint, resume_floor bigint, membership_generation bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT s, coalesce(r.retention_generation, 1), coalesce(r.resume_floor, 0), coalesce(r.membership_generation, 1)
      FROM unnest(p_scopes) AS s LEFT JOIN synchro.scope_retention r ON r.scope_id = s
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_scope_retention(text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_scope_retention(text[]) TO synchro_adapter;

-- The stream generation a cursor binds, and a membership generation summed over every
-- membership contract (pull and rebuild bind each scope's own generation from
-- synchro_scope_retention instead); the earlier stream generations whose cursors resume up
-- to a position (a lineage reset's bridge, 35_lineage), in two arrays of the same order.
CREATE FUNCTION synchro.synchro_stream_state()
RETURNS TABLE (stream_generation bigint, membership_generation bigint, bridged_generations bigint[],
               bridged_through bigint[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT c.stream_generation,
           coalesce((SELECT sum(m.membership_generation) FROM synchro.membership_functions m), 0)::bigint
           + coalesce((SELECT sum(d.generation) FROM synchro.membership_dependencies d), 0)::bigint + 1,
           coalesce(b.generations, '{}'), coalesce(b.through, '{}')
      FROM synchro.capture_state c
      CROSS JOIN (SELECT array_agg(s.stream_generation ORDER BY s.stream_generation) AS generations,
                         array_agg(s.bridged_through ORDER BY s.stream_generation) AS through
                    FROM synchro.synchro_stream_bridges() s) b
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_stream_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_stream_state() TO synchro_adapter;

-- The next effects after each scope's position, in stream order, with the row's current
-- state when it is still in the scope (otherwise the change is a delete).
CREATE FUNCTION synchro.synchro_pull_page(p_scopes text[], p_positions bigint[], p_limit integer)
RETURNS TABLE (effect_position bigint, scope_id text, table_id text, pk text, kind text, server_version text,
               row_json text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp
-- No bitmap scans: with statistics older than a large source transaction (autovacuum
-- analyzes at its next round) the planner estimated a scope's effects after a position at a
-- few hundred, read all of them through a bitmap and sorted them for the first p_limit —
-- O(effects left) per page, 16 ms per page of 1,000 while catching up on 100,000 changes
-- (0.8 ms in index order).
SET enable_bitmapscan = off AS $$
    -- The page's effects first: at most p_limit per scope from (scope_id, position), then
    -- the first p_limit of those. (Joined directly, with the positions unknown to the
    -- planner, it walked every effect from the first in position order: O(all effects) per
    -- pull, 5-11 ms at 12,000 effects for a page of one change.)
    WITH page AS (
        SELECT e.*
          FROM unnest(p_scopes, p_positions) AS c(scope_id, after_position)
         CROSS JOIN LATERAL (
               SELECT * FROM synchro.scope_effects e
                WHERE e.scope_id = c.scope_id AND e.position > c.after_position
                ORDER BY e.position LIMIT p_limit) e
         ORDER BY e.position
         LIMIT p_limit)
    SELECT e.position, e.scope_id, r.table_id, e.pk,
           CASE WHEN e.kind = 'upsert' AND p.row_json IS NOT NULL AND m.scope_id IS NOT NULL
                THEN 'upsert' ELSE 'delete' END,
           CASE WHEN e.kind = 'upsert' AND p.row_json IS NOT NULL AND m.scope_id IS NOT NULL
                THEN p.server_version ELSE e.server_version END,
           CASE WHEN e.kind = 'upsert' AND m.scope_id IS NOT NULL THEN p.row_json END
      FROM page e
      JOIN synchro.relations r ON r.relation_id = e.relation_id
      LEFT JOIN synchro.projection_rows p ON p.relation_id = e.relation_id AND p.pk = e.pk
      LEFT JOIN synchro.membership_edges m ON m.scope_id = e.scope_id AND m.relation_id = e.relation_id AND m.pk = e.pk
     ORDER BY e.position
     LIMIT p_limit
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_pull_page(text[], bigint[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_pull_page(text[], bigint[], integer) TO synchro_adapter;

-- The stream boundary a snapshot describes: pull's terminal positions and a rebuild's final
-- cursor. Effects are written by the single capture leader in position order and compaction
-- only deletes committed effects, so every position up to the largest floor visible in a
-- snapshot is a committed position of that snapshot: the boundary is the greater of the
-- largest retained position and the largest floor. (The largest retained position alone
-- falls below the floors once compaction deletes a scope's newest effects, and a rebuild
-- would end below its scope's floor: a livelock.)
CREATE FUNCTION synchro.synchro_pull_watermark() RETURNS TABLE (effect_position bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT greatest((SELECT coalesce(max(position), 0) FROM synchro.scope_effects),
                    (SELECT coalesce(max(resume_floor), 0) FROM synchro.scope_retention))
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_pull_watermark() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_pull_watermark() TO synchro_adapter;

-- A scope's stream fingerprint: the greater of its last effect position and its resume
-- floor (0 for a scope that never had an effect). Every change of its rows or membership
-- writes an effect at a higher position, and compaction only deletes effects at or below the
-- floor it raises: the terminal digest is reused while this is unchanged (pull.rs).
CREATE FUNCTION synchro.synchro_scope_fingerprint(p_scope text) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT greatest(coalesce((SELECT max(e.position) FROM synchro.scope_effects e WHERE e.scope_id = p_scope), 0),
                    coalesce((SELECT r.resume_floor FROM synchro.scope_retention r WHERE r.scope_id = p_scope), 0))
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_scope_fingerprint(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_scope_fingerprint(text) TO synchro_adapter;

-- The rows a scope's effects after a fingerprint name (a terminal digest brings its scope
-- index forward by re-reading just these, pull.rs), and the scope's resume floor: effects
-- at or below it may have been compacted away, so an index older than it is rebuilt.
CREATE FUNCTION synchro.synchro_scope_touched(p_scope text, p_after bigint)
RETURNS TABLE (table_id text, pk text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT DISTINCT r.table_id, e.pk
      FROM synchro.scope_effects e JOIN synchro.relations r ON r.relation_id = e.relation_id
     WHERE e.scope_id = p_scope AND e.position > p_after
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_scope_touched(text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_scope_touched(text, bigint) TO synchro_adapter;

CREATE FUNCTION synchro.synchro_scope_floor(p_scope text) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT coalesce((SELECT r.resume_floor FROM synchro.scope_retention r WHERE r.scope_id = p_scope), 0)
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_scope_floor(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_scope_floor(text) TO synchro_adapter;

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
REVOKE EXECUTE ON FUNCTION synchro.synchro_scope_rows(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_scope_rows(text) TO synchro_adapter;

-- A scope's terminal checksum is computed from row digests the server keeps in memory per
-- (schema, table, key, server_version): these two let it read only the keys and versions of
-- a scope, and the rows of just the keys it has not digested yet, inside the same snapshot.
CREATE FUNCTION synchro.synchro_scope_keys(p_scope text)
RETURNS TABLE (table_id text, pk text, server_version text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT r.table_id, p.pk, p.server_version
      FROM synchro.membership_edges m
      JOIN synchro.projection_rows p ON p.relation_id = m.relation_id AND p.pk = m.pk
      JOIN synchro.relations r ON r.relation_id = m.relation_id
     WHERE m.scope_id = p_scope
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_scope_keys(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_scope_keys(text) TO synchro_adapter;

CREATE FUNCTION synchro.synchro_scope_rows_of(p_scope text, p_table_ids text[], p_pks text[])
RETURNS TABLE (table_id text, pk text, row_json text, server_version text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    -- One index probe per key: OFFSET 0 keeps each subquery a parameterized loop, so the
    -- relation is resolved first and every probe uses the whole edge key. As a plain join,
    -- a planner that underestimated the scope filtered all of its edges per key (O(keys x
    -- scope): 0.3-0.8 s for 2,500 keys in capture_bench, 20 ms now).
    SELECT k.table_id, p.pk, p.row_json, p.server_version
      FROM unnest(p_table_ids, p_pks) AS k(table_id, pk)
      CROSS JOIN LATERAL (SELECT r.relation_id FROM synchro.relations r WHERE r.table_id = k.table_id OFFSET 0) r
      CROSS JOIN LATERAL (
            SELECT p.pk, p.row_json, p.server_version
              FROM synchro.projection_rows p
             WHERE p.relation_id = r.relation_id AND p.pk = k.pk
               AND EXISTS (SELECT 1 FROM synchro.membership_edges m
                            WHERE m.scope_id = p_scope AND m.relation_id = r.relation_id AND m.pk = k.pk)
            OFFSET 0) p
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_scope_rows_of(text, text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_scope_rows_of(text, text[], text[]) TO synchro_adapter;

-- The synced tables not yet materialized: the bootstrap copy not finished, or the first
-- membership rule not yet live. A Class 3 manifest with such a table is not served: connect,
-- pull and rebuild keep using the manifest before it until the worker's commit that
-- completes them (a reconfiguration's manifest waits for its generation instead, 33), so no client is told to rebuild from projections that lack the new
-- table's rows.
CREATE FUNCTION synchro.synchro_unready_tables() RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT r.table_id FROM synchro.relations r
      JOIN synchro.relation_capture c USING (relation_id)
      LEFT JOIN synchro.membership_functions m USING (relation_id)
     WHERE r.kind = 'synced' AND ((c.status <> 'active' AND c.bootstrap_lsn IS NULL) OR m.live IS FALSE)
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_unready_tables() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_unready_tables() TO synchro_adapter, synchro_operator, synchro_monitor;
