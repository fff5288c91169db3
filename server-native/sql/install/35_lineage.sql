-- synchro install 35: the capture stream's lineage reset (issue 38; capture/lineage.rs).
-- Spec 003 "Per-Scope Retention and Client Generations" (stream generation).
--
-- When the slot whose stream was materialized is lost (dropped, invalidated by
-- max_slot_wal_keep_size, absent after a failover or a base-backup restore, made anew, on
-- another database system), capture blocks (slot_missing, slot_invalidated,
-- lineage_changed). The way out is `synchro-server lineage reset` (operator):
--   1. synchro_lineage_reset(false) records the request (the plan it returns is what
--      `--dry-run` prints: synchro_lineage_reset(true) changes nothing).
--   2. The capture worker, which holds the leader lock and the REPLICATION the slot needs,
--      takes it at its next step: drops whatever slot has the name, puts every registered
--      relation up for a fresh copy (synchro_lineage_reset_prepare: a 'resync' generation
--      with its fields unchanged; a staged generation whose message went into the lost
--      stream back to pending; a bootstrap copy whose message was lost back to pending),
--      creates the new slot with an exported snapshot (and failover on PostgreSQL 17 and
--      later), copies every relation as of exactly that snapshot (synchro_lineage_copy: no
--      write gate, writers never wait), then synchro_lineage_reset_begin records the new
--      lineage and a new stream generation bridged from the old one.
--   3. Before it reads the new stream the worker activates the copies at the slot's
--      beginning: each copy is compared with the projection and only the rows that differ
--      become changes (capture/reconfigure.rs), so nothing written while no slot existed is
--      skipped, and no scope is made to rebuild for it. The generations put back to pending
--      are staged again (synchro_stage_generation, their message in the new stream).
-- Cursors bind the stream generation. A cursor of an earlier generation resumes when its
-- position is at or below the bridge (that history survives: effects are written in
-- position order by the single capture leader, so the history up to the bridge is the one
-- the new generation continues); one beyond it comes from a history the database no longer
-- has (a restored backup) and is stale: its scope rebuilds. The new generation is at least
-- the clock in microseconds, so a generation lost with a restored database is never issued
-- again.

-- Every stream generation after the first, with its bridge.
CREATE TABLE synchro.stream_generations (
    stream_generation bigint PRIMARY KEY CHECK (stream_generation >= 1),
    previous_generation bigint NOT NULL CHECK (previous_generation >= 1),
    -- Cursors of previous_generation at or below this position resume.
    bridged_through bigint NOT NULL CHECK (bridged_through >= 0),
    began_at timestamptz NOT NULL DEFAULT now(),
    CHECK (previous_generation < stream_generation)
);
REVOKE ALL ON synchro.stream_generations FROM PUBLIC;

-- The generations whose cursors still resume, each with the highest position that does:
-- the lowest bridge on the way from it to the current generation.
CREATE FUNCTION synchro.synchro_stream_bridges()
RETURNS TABLE (stream_generation bigint, bridged_through bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    WITH RECURSIVE chain (generation, through) AS (
        SELECT g.previous_generation, g.bridged_through
          FROM synchro.stream_generations g JOIN synchro.capture_state c ON c.stream_generation = g.stream_generation
        UNION ALL
        SELECT g.previous_generation, least(chain.through, g.bridged_through)
          FROM chain JOIN synchro.stream_generations g ON g.stream_generation = chain.generation)
    SELECT generation, through FROM chain
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_stream_bridges() FROM PUBLIC;

-- What a lineage reset does, and (unless p_dry_run) the request the worker carries out.
-- Refused (55000) while capture is blocked for another reason (resolve that first) or while
-- a reconfiguration is pending that was never staged (publish it first: its copy then
-- covers the relation). Asked again while one is under way, it only reports. Returns
-- {"dry_run","requested_at","capture_blocked","slot":{"name","state": missing|invalidated|
-- usable},"stream_generation","in_progress","relations":[{"relation","action": copy|restage|
-- bootstrap,"rows_estimate"}]}.
CREATE FUNCTION synchro.synchro_lineage_reset(p_dry_run boolean) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_state synchro.capture_state%ROWTYPE;
    v_wal_status text;
    v_slot_found boolean;
    v_unstaged text;
BEGIN
    IF p_dry_run IS NULL THEN
        RAISE EXCEPTION 'p_dry_run is required' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v_state FROM synchro.capture_state FOR UPDATE;
    SELECT s.wal_status::text INTO v_wal_status FROM pg_replication_slots s
     WHERE s.slot_name = v_state.slot_name AND s.database = current_database();
    v_slot_found := FOUND;
    -- Asked again while one is requested or its copies are on their way: nothing more.
    IF NOT p_dry_run AND v_state.lineage_reset_requested_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM synchro.registry_generations
                        WHERE change = 'resync' AND state IN ('pending', 'staged')) THEN
        IF v_state.blocked_reason IS NOT NULL
           AND v_state.blocked_reason NOT IN ('slot_missing', 'slot_invalidated', 'lineage_changed') THEN
            RAISE EXCEPTION 'capture is blocked for another reason (%): resolve that first', v_state.blocked_reason
                USING ERRCODE = '55000',
                      HINT = 'synchro-server health shows the block; docs/operator.md "When capture blocks"';
        END IF;
        SELECT format('%I.%I', r.physical_schema, r.physical_relation) INTO v_unstaged
          FROM synchro.registry_generations g JOIN synchro.relations r USING (relation_id)
         WHERE g.state = 'pending' AND g.staged_at IS NULL AND g.change <> 'resync'
         LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'a reconfiguration of % is pending: publish it first', v_unstaged
                USING ERRCODE = '55000', HINT = 'synchro-server publish stages it';
        END IF;
        UPDATE synchro.capture_state SET lineage_reset_requested_at = now();
        v_state.lineage_reset_requested_at := now();
    END IF;
    RETURN jsonb_build_object(
        'dry_run', p_dry_run,
        'requested_at', v_state.lineage_reset_requested_at,
        'capture_blocked', v_state.blocked_reason,
        'slot', jsonb_build_object('name', v_state.slot_name,
                                   'state', CASE WHEN NOT v_slot_found THEN 'missing'
                                                 WHEN v_wal_status = 'lost' THEN 'invalidated'
                                                 ELSE 'usable' END),
        'stream_generation', v_state.stream_generation,
        -- Copies of the last reset not yet activated.
        'in_progress', (SELECT count(*) FROM synchro.registry_generations
                         WHERE change = 'resync' AND state IN ('pending', 'staged')),
        'relations', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'relation', format('%I.%I', r.physical_schema, r.physical_relation),
                       'action', CASE WHEN c.status IN ('pending', 'copied')
                                           AND NOT EXISTS (SELECT 1 FROM synchro.registry_generations g
                                                            WHERE g.relation_id = r.relation_id
                                                              AND g.state IN ('pending', 'staged'))
                                      THEN 'bootstrap'
                                      WHEN EXISTS (SELECT 1 FROM synchro.registry_generations g
                                                    WHERE g.relation_id = r.relation_id
                                                      AND g.state IN ('pending', 'staged') AND g.change <> 'resync')
                                      THEN 'restage'
                                      ELSE 'copy' END,
                       'rows_estimate', greatest(pc.reltuples, 0)::bigint)
                   ORDER BY r.physical_schema, r.physical_relation)
              FROM synchro.relations r
              JOIN synchro.relation_capture c ON c.relation_id = r.relation_id
              LEFT JOIN pg_class pc ON pc.oid = r.physical_relation_oid), '[]'::jsonb));
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_lineage_reset(boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_lineage_reset(boolean) TO synchro_operator;

-- The worker's first part of a requested reset, after it dropped what was left of the old
-- slot and before it creates the new one: every relation is put up for a fresh copy (a
-- 'resync' generation with its fields unchanged; a staged generation whose message went into
-- the lost stream back to pending, to be staged again; a bootstrap copy whose message was
-- lost back to pending, to be copied again). Idempotent (a crash before the reset is recorded
-- runs it again). Returns the resync generations to copy.
CREATE FUNCTION synchro.synchro_lineage_reset_prepare() RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM synchro.capture_state WHERE lineage_reset_requested_at IS NOT NULL) THEN
        RAISE EXCEPTION 'no lineage reset was requested' USING ERRCODE = '55000';
    END IF;
    DELETE FROM synchro.projection_rows p USING synchro.relation_capture c
     WHERE p.relation_id = c.relation_id AND c.status = 'copied'
       AND NOT EXISTS (SELECT 1 FROM synchro.registry_generations g
                        WHERE g.relation_id = c.relation_id AND g.state = 'staged');
    UPDATE synchro.relation_capture c SET status = 'pending', rows_copied = NULL, updated_at = now()
     WHERE c.status = 'copied'
       AND NOT EXISTS (SELECT 1 FROM synchro.registry_generations g
                        WHERE g.relation_id = c.relation_id AND g.state = 'staged');
    DELETE FROM synchro.projection_stage s USING synchro.registry_generations g
     WHERE s.generation = g.generation AND g.state = 'staged';
    UPDATE synchro.registry_generations SET state = 'pending', snapshot_lsn = NULL WHERE state = 'staged';
    PERFORM synchro.synchro_record_fresh_copy(c.relation_id, 'resync')
       FROM synchro.relation_capture c
      WHERE c.status = 'active'
        AND NOT EXISTS (SELECT 1 FROM synchro.registry_generations g
                         WHERE g.relation_id = c.relation_id AND g.state = 'pending')
      ORDER BY c.relation_id;
    RETURN QUERY SELECT generation FROM synchro.registry_generations
                  WHERE change = 'resync' AND state = 'pending' ORDER BY generation;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_lineage_reset_prepare() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_lineage_reset_prepare() TO synchro_worker;

-- The copies of the prepared resync generations, in the caller's transaction, which imported
-- the new slot's exported snapshot (SET TRANSACTION SNAPSHOT): each relation exactly as of
-- the point the new stream begins, with no write gate (writers never wait) and no message.
-- Only inserts into projection_stage (the rows the snapshot cannot see are written after it,
-- by synchro_lineage_reset_begin). Returns the rows copied.
CREATE FUNCTION synchro.synchro_lineage_copy(p_generations bigint[]) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_generation bigint;
    v_rows bigint := 0;
BEGIN
    FOREACH v_generation IN ARRAY coalesce(p_generations, '{}') LOOP
        IF NOT EXISTS (SELECT 1 FROM synchro.registry_generations
                        WHERE generation = v_generation AND change = 'resync' AND state = 'pending') THEN
            RAISE EXCEPTION 'no such pending lineage copy' USING ERRCODE = '22023';
        END IF;
        DELETE FROM synchro.projection_stage WHERE generation = v_generation;
        v_rows := v_rows + synchro.synchro_copy_to_stage(v_generation);
    END LOOP;
    RETURN v_rows;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_lineage_copy(bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_lineage_copy(bigint[]) TO synchro_worker;

-- The worker's last part, once the copies are made: the new slot (beginning at p_began on
-- system p_system, timeline p_timeline) becomes the recorded lineage, a new stream
-- generation bridged from the old one begins, the block and the request are cleared, and the
-- copies are staged at the slot's beginning (the worker activates them there before it reads
-- the stream). One transaction; returns the new stream generation.
CREATE FUNCTION synchro.synchro_lineage_reset_begin(p_system text, p_timeline integer, p_began pg_lsn,
    p_generations bigint[])
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_state synchro.capture_state%ROWTYPE;
    v_next bigint;
BEGIN
    SELECT * INTO v_state FROM synchro.capture_state FOR UPDATE;
    IF v_state.lineage_reset_requested_at IS NULL THEN
        RAISE EXCEPTION 'no lineage reset was requested' USING ERRCODE = '55000';
    END IF;
    v_next := greatest(v_state.stream_generation + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
    INSERT INTO synchro.stream_generations (stream_generation, previous_generation, bridged_through)
    VALUES (v_next, v_state.stream_generation, (SELECT effect_position FROM synchro.synchro_pull_watermark()));
    -- The new stream begins at the slot: positions of the old one mean nothing in it (on
    -- another database system they can even be higher).
    UPDATE synchro.capture_state
       SET stream_generation = v_next, confirmed_lsn = p_began, acknowledged_lsn = p_began,
           lineage_system_identifier = p_system, lineage_timeline = p_timeline, lineage_slot_began_lsn = p_began,
           lineage_recorded_at = now(), lineage_reset_requested_at = NULL,
           blocked_reason = NULL, blocked_at = NULL, blocked_relation_id = NULL, blocked_detail = NULL,
           blocked_lsn = NULL, blocked_ordinal = NULL, blocked_sqlstate = NULL;
    UPDATE synchro.registry_generations SET state = 'staged', staged_at = now(), snapshot_lsn = p_began
     WHERE generation = ANY (p_generations) AND change = 'resync' AND state = 'pending';
    UPDATE synchro.relation_capture c
       SET status = 'copied', updated_at = now(),
           rows_copied = (SELECT count(*) FROM synchro.projection_stage s WHERE s.generation = g.generation)
      FROM synchro.registry_generations g
     WHERE g.relation_id = c.relation_id AND g.generation = ANY (p_generations) AND g.state = 'staged';
    RETURN v_next;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_lineage_reset_begin(text, integer, pg_lsn, bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_lineage_reset_begin(text, integer, pg_lsn, bigint[]) TO synchro_worker;

-- The copies made from the new slot's snapshot and not yet activated, with the position the
-- worker activates them at (before it reads the stream).
CREATE FUNCTION synchro.synchro_lineage_snapshot_copies()
RETURNS TABLE (generation bigint, at pg_lsn)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT g.generation, g.snapshot_lsn FROM synchro.registry_generations g
     WHERE g.state = 'staged' AND g.snapshot_lsn IS NOT NULL ORDER BY g.generation
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_lineage_snapshot_copies() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_lineage_snapshot_copies() TO synchro_worker;

-- The generations the worker stages itself after a reset (before it opens the stream): the
-- reset's copies and the generations it put back to pending, each with the manifest and
-- scope recording it was staged with.
CREATE FUNCTION synchro.synchro_lineage_restage()
RETURNS TABLE (generation bigint, schema_version bigint, record_scopes boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT g.generation, g.schema_version, g.scopes_recorded FROM synchro.registry_generations g
     WHERE g.state = 'pending' AND (g.change = 'resync' OR g.staged_at IS NOT NULL)
     ORDER BY g.generation
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_lineage_restage() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_lineage_restage() TO synchro_worker;

-- A lineage reset of one scope (spec 003: retention_generation changes only when the
-- retention lineage itself is invalidated): its retention generation advances, so every
-- cursor and seed receipt of the scope is stale and each client holding it rebuilds it from
-- the current projection; its rebuild sessions end (they restart) and its acknowledgements go
-- (they pinned a history no client resumes from). Every other scope resumes untouched. For a
-- scope whose rows a client may hold wrongly although the stream is intact (rows repaired
-- outside capture for it alone, a scope's history in doubt after an incident). Refused
-- (22023) for a blank scope and for one synchro knows nothing of (no rows, effects, stream
-- state, grant, shared declaration or assigned client). Returns {"dry_run",
-- "retention_generation": {"from","to"},"clients_assigned","rebuild_sessions"} (no IDs).
CREATE FUNCTION synchro.synchro_lineage_reset_scope(p_scope text, p_dry_run boolean) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_from bigint;
    v_to bigint;
    v_clients bigint;
    v_sessions bigint;
BEGIN
    IF p_dry_run IS NULL OR p_scope IS NULL OR btrim(p_scope) = '' THEN
        RAISE EXCEPTION 'a scope and p_dry_run are required' USING ERRCODE = '22023';
    END IF;
    SELECT count(*) INTO v_clients FROM synchro.clients c
     WHERE p_scope = ANY (c.assigned_scopes) AND c.expired_at IS NULL;
    IF v_clients = 0
       AND NOT EXISTS (SELECT 1 FROM synchro.membership_edges WHERE scope_id = p_scope)
       AND NOT EXISTS (SELECT 1 FROM synchro.scope_effects WHERE scope_id = p_scope)
       AND NOT EXISTS (SELECT 1 FROM synchro.scope_retention WHERE scope_id = p_scope)
       AND NOT EXISTS (SELECT 1 FROM synchro.user_scope_grants WHERE scope_id = p_scope)
       AND NOT EXISTS (SELECT 1 FROM synchro.shared_scopes WHERE scope_id = p_scope) THEN
        RAISE EXCEPTION 'no such scope' USING ERRCODE = '22023';
    END IF;
    IF NOT p_dry_run THEN
        INSERT INTO synchro.scope_retention (scope_id) VALUES (p_scope) ON CONFLICT DO NOTHING;
    END IF;
    SELECT coalesce(max(retention_generation), 1) INTO v_from FROM synchro.scope_retention WHERE scope_id = p_scope;
    SELECT count(*) INTO v_sessions FROM synchro.rebuild_sessions WHERE scope_id = p_scope;
    v_to := v_from;
    IF NOT p_dry_run THEN
        UPDATE synchro.scope_retention SET retention_generation = retention_generation + 1 WHERE scope_id = p_scope
        RETURNING retention_generation INTO v_to;
        v_from := v_to - 1;
        DELETE FROM synchro.rebuild_sessions WHERE scope_id = p_scope;
        DELETE FROM synchro.client_scope_acks WHERE scope_id = p_scope;
    END IF;
    RETURN jsonb_build_object('dry_run', p_dry_run,
                              'retention_generation', jsonb_build_object('from', v_from, 'to', v_to),
                              'clients_assigned', v_clients, 'rebuild_sessions', v_sessions);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_lineage_reset_scope(text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_lineage_reset_scope(text, boolean) TO synchro_operator;
