-- synchro schema, version 26: bounded rebuild sessions (issue 12). Every rebuild without a
-- continuation used to store a new snapshot of its whole scope for an hour, however often a
-- client asked.
--
-- Now a new rebuild of a scope replaces the client's earlier session of that scope (and any
-- session of an older client generation, which can only restart), and a client holds at
-- most p_max_sessions sessions in progress: not completed, not expired, of its current
-- generation. The final page completes a session: its rows are deleted at once and its
-- header stays until the TTL, where it keeps pinning retention at the watermark of the final
-- cursor it issued. A continuation of a completed session restarts (409).

SET LOCAL ROLE synchro_owner;

ALTER TABLE synchro.rebuild_sessions ADD COLUMN completed_at timestamptz;
CREATE INDEX rebuild_sessions_by_client ON synchro.rebuild_sessions (user_id, client_id);

-- Sessions in progress of the client's current generation, other than one for p_scope_id
-- (which a new rebuild of that scope replaces).
CREATE FUNCTION synchro.synchro_rebuild_sessions_in_progress(p_user_id text, p_client_id text,
    p_client_generation bigint, p_scope_id text) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT count(*) FROM synchro.rebuild_sessions
     WHERE user_id = p_user_id AND client_id = p_client_id AND client_generation = p_client_generation
       AND scope_id <> p_scope_id AND completed_at IS NULL
       AND created_at + make_interval(mins => (SELECT value::integer FROM synchro.settings
                                               WHERE key = 'rebuild_session_ttl_minutes')) > now()
$$;

DROP FUNCTION synchro.synchro_rebuild_create(text, text, bigint, text, text, bigint, bigint, bigint,
    text[], text[], text[], text[]);

-- Returns the new session's ID, or NULL when the client already holds p_max_sessions other
-- sessions in progress (nothing is stored then).
CREATE FUNCTION synchro.synchro_rebuild_create(p_user_id text, p_client_id text, p_client_generation bigint,
    p_scope_id text, p_schema_hash text, p_stream_generation bigint, p_membership_generation bigint,
    p_watermark bigint, p_table_ids text[], p_pks text[], p_rows text[], p_versions text[],
    p_max_sessions integer) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_id text := replace(gen_random_uuid()::text, '-', '');
BEGIN
    -- One client's sessions are created one at a time, so the count below is exact.
    PERFORM pg_advisory_xact_lock(hashtextextended(
        'synchro.rebuild_sessions:' || length(p_user_id) || ':' || p_user_id || p_client_id, 0));
    DELETE FROM synchro.rebuild_sessions
     WHERE user_id = p_user_id AND client_id = p_client_id
       AND (scope_id = p_scope_id OR client_generation <> p_client_generation);
    IF synchro.synchro_rebuild_sessions_in_progress(p_user_id, p_client_id, p_client_generation, p_scope_id)
       >= p_max_sessions THEN
        RETURN NULL;
    END IF;
    INSERT INTO synchro.rebuild_sessions VALUES (v_id, p_user_id, p_client_id, p_client_generation, p_scope_id,
        p_schema_hash, p_stream_generation, p_membership_generation, p_watermark, coalesce(array_length(p_pks, 1), 0));
    INSERT INTO synchro.rebuild_rows
    SELECT v_id, (o - 1)::integer, t, k, r, v
      FROM unnest(p_table_ids, p_pks, p_rows, p_versions) WITH ORDINALITY AS u(t, k, r, v, o);
    RETURN v_id;
END $$;

-- The final page was served: the rows go, the header stays (retention pin) until the TTL.
CREATE FUNCTION synchro.synchro_rebuild_complete(p_session_id text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    DELETE FROM synchro.rebuild_rows WHERE session_id = p_session_id;
    UPDATE synchro.rebuild_sessions SET completed_at = now() WHERE session_id = p_session_id AND completed_at IS NULL;
$$;

-- A completed or expired session is gone for its client (409 restart).
CREATE OR REPLACE FUNCTION synchro.synchro_rebuild_session(p_session_id text)
RETURNS TABLE (user_id text, client_id text, client_generation bigint, scope_id text, schema_hash text,
               stream_generation bigint, membership_generation bigint, watermark bigint, row_count integer)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT user_id, client_id, client_generation, scope_id, schema_hash, stream_generation, membership_generation,
           watermark, row_count
      FROM synchro.rebuild_sessions
     WHERE session_id = p_session_id AND completed_at IS NULL
       AND created_at + make_interval(mins => (SELECT value::integer FROM synchro.settings
                                               WHERE key = 'rebuild_session_ttl_minutes')) > now()
$$;

RESET ROLE;

REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_sessions_in_progress(text, text, bigint, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_create(text, text, bigint, text, text, bigint, bigint, bigint,
    text[], text[], text[], text[], integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_complete(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_sessions_in_progress(text, text, bigint, text) TO synchro_adapter;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_create(text, text, bigint, text, text, bigint, bigint, bigint,
    text[], text[], text[], text[], integer) TO synchro_adapter;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_complete(text) TO synchro_adapter;
