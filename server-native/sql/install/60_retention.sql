-- synchro install 60: per-scope retention: acknowledgements, durable expiry and compaction.
-- Spec 003 "Per-Scope Retention and Client Generations", "Explicit client generation and
-- expiry", "Scope-local compaction".
--
-- Pull records the position of every valid cursor a client presents (its acknowledgement).
-- Compaction first makes client expiry durable, then, per scope, deletes effects at or
-- below the smallest acknowledged position of the nonexpired clients assigned the scope
-- (the scope's whole log when there is none), never past the watermark of a live rebuild
-- session of the scope, and raises the scope's resume_floor (scope_retention, 50_pull) to
-- the largest deleted position in the same transaction. A cursor below the floor is stale;
-- a null cursor may replay the log from the start only while the floor is 0.

CREATE TABLE synchro.client_scope_acks (
    user_id text NOT NULL,
    client_id text NOT NULL,
    scope_id text NOT NULL,
    client_generation bigint NOT NULL,
    position bigint NOT NULL CHECK (position >= 0),
    acknowledged_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, client_id, scope_id),
    FOREIGN KEY (user_id, client_id) REFERENCES synchro.clients ON DELETE CASCADE
);
CREATE INDEX client_scope_acks_scope ON synchro.client_scope_acks (scope_id);
REVOKE ALL ON synchro.client_scope_acks FROM PUBLIC;

-- Records the positions of valid cursors a pull presented. A newer position refreshes the
-- client's last_acknowledged_at; positions never move backwards within a generation.
CREATE FUNCTION synchro.synchro_record_acks(p_user_id text, p_client_id text, p_client_generation bigint,
    p_scopes text[], p_positions bigint[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_newer integer;
BEGIN
    WITH upserted AS (
        INSERT INTO synchro.client_scope_acks AS a (user_id, client_id, scope_id, client_generation, position)
        SELECT p_user_id, p_client_id, s, p_client_generation, p FROM unnest(p_scopes, p_positions) AS u(s, p)
        ON CONFLICT (user_id, client_id, scope_id) DO UPDATE
           SET position = CASE WHEN a.client_generation = EXCLUDED.client_generation
                               THEN greatest(a.position, EXCLUDED.position) ELSE EXCLUDED.position END,
               client_generation = EXCLUDED.client_generation,
               acknowledged_at = now()
         WHERE a.client_generation <> EXCLUDED.client_generation OR EXCLUDED.position > a.position
        RETURNING 1)
    SELECT count(*) INTO v_newer FROM upserted;
    IF v_newer > 0 THEN
        UPDATE synchro.clients SET last_acknowledged_at = now()
         WHERE user_id = p_user_id AND client_id = p_client_id AND client_generation = p_client_generation;
    END IF;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_record_acks(text, text, bigint, text[], bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_record_acks(text, text, bigint, text[], bigint[]) TO synchro_adapter;

-- When the last compaction pass began (one row; the health report shows it, since nothing
-- but an operator-scheduled `synchro-server compact` runs compaction: spec 001 gives it to
-- synchro_operator alone).
CREATE TABLE synchro.retention_state (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_pass_at timestamptz
);
INSERT INTO synchro.retention_state DEFAULT VALUES;
REVOKE ALL ON synchro.retention_state FROM PUBLIC;

-- Makes expiry durable and drops expired rebuild sessions (the first step of a compaction
-- pass, which it records). Returns the clients expired.
CREATE FUNCTION synchro.synchro_expire() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_expired bigint;
BEGIN
    UPDATE synchro.retention_state SET last_pass_at = now();
    UPDATE synchro.clients c SET expired_at = now()
     WHERE c.expired_at IS NULL
       AND coalesce(c.last_acknowledged_at, c.generation_started_at)
           + make_interval(days => (SELECT value::integer FROM synchro.settings WHERE key = 'client_ttl_days')) <= now();
    GET DIAGNOSTICS v_expired = ROW_COUNT;
    DELETE FROM synchro.rebuild_sessions s
     WHERE s.created_at + make_interval(mins => (SELECT value::integer FROM synchro.settings
                                                 WHERE key = 'rebuild_session_ttl_minutes')) <= now();
    -- An abandoned session ends once it has been idle: its rows go and it no longer counts
    -- against its client's bounds (its header keeps pinning retention until the TTL; a
    -- continuation of it restarts).
    WITH idle AS (
        UPDATE synchro.rebuild_sessions s SET completed_at = now()
         WHERE s.completed_at IS NULL
           AND coalesce(s.last_read_at, s.created_at)
               + make_interval(mins => (SELECT value::integer FROM synchro.settings
                                        WHERE key = 'rebuild_session_idle_minutes')) <= now()
        RETURNING s.session_id)
    DELETE FROM synchro.rebuild_chunks c USING idle WHERE c.session_id = idle.session_id;
    RETURN v_expired;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_expire() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_expire() TO synchro_operator;

-- Scopes that have retained effects.
CREATE FUNCTION synchro.synchro_compaction_scopes() RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT DISTINCT scope_id FROM synchro.scope_effects
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_compaction_scopes() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_compaction_scopes() TO synchro_operator;

-- One compaction batch of one scope: deletes at most p_batch_size of its oldest effects at
-- or below the safe position and raises the floor to the largest deleted position, in this
-- one transaction. Returns the number deleted (0 when nothing is deletable).
CREATE FUNCTION synchro.synchro_compact_scope(p_scope_id text, p_batch_size integer) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_safe bigint;
    v_assigned boolean;
    v_session bigint;
    v_deleted bigint;
    v_max bigint;
BEGIN
    IF p_batch_size IS NULL OR p_batch_size < 1
       OR p_batch_size > (SELECT value::integer FROM synchro.settings WHERE key = 'max_bound') THEN
        RAISE EXCEPTION 'compaction.batch_size must be a positive integer within the configured bound'
            USING ERRCODE = '22023';
    END IF;
    -- Serialize with other compactions of this scope.
    INSERT INTO synchro.scope_retention (scope_id) VALUES (p_scope_id) ON CONFLICT DO NOTHING;
    PERFORM 1 FROM synchro.scope_retention WHERE scope_id = p_scope_id FOR UPDATE;
    SELECT bool_or(true), min(a.position) FILTER (WHERE a.client_generation = c.client_generation)
      INTO v_assigned, v_safe
      FROM synchro.clients c
      LEFT JOIN synchro.client_scope_acks a
        ON a.user_id = c.user_id AND a.client_id = c.client_id AND a.scope_id = p_scope_id
     WHERE p_scope_id = ANY (c.assigned_scopes) AND c.expired_at IS NULL;
    IF coalesce(v_assigned, false) AND v_safe IS NULL THEN
        -- Assigned clients that never acknowledged this scope rebuild it; they pin nothing.
        v_safe := (SELECT max(position) FROM synchro.scope_effects WHERE scope_id = p_scope_id);
    ELSIF NOT coalesce(v_assigned, false) THEN
        v_safe := (SELECT max(position) FROM synchro.scope_effects WHERE scope_id = p_scope_id);
    END IF;
    SELECT min(watermark) INTO v_session FROM synchro.rebuild_sessions WHERE scope_id = p_scope_id;
    IF v_session IS NOT NULL THEN
        v_safe := least(v_safe, v_session);
    END IF;
    IF v_safe IS NULL THEN
        RETURN 0;
    END IF;
    WITH gone AS (
        DELETE FROM synchro.scope_effects WHERE position IN (
            SELECT position FROM synchro.scope_effects
             WHERE scope_id = p_scope_id AND position <= v_safe
             ORDER BY position LIMIT p_batch_size)
        RETURNING position)
    SELECT count(*), max(position) INTO v_deleted, v_max FROM gone;
    IF v_deleted > 0 THEN
        UPDATE synchro.scope_retention SET resume_floor = greatest(resume_floor, v_max), compacted_at = now()
         WHERE scope_id = p_scope_id;
    END IF;
    RETURN v_deleted;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_compact_scope(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_compact_scope(text, integer) TO synchro_operator;
