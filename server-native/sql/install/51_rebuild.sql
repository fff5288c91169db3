-- synchro install 51: rebuild sessions (POST /sync/rebuild).
-- Spec 003 "Per-Scope Retention and Client Generations", "Scope-local compaction" (a live
-- session pins retention), "Strict Positive Limits" (bounded sessions).
--
-- A session stores the scope's rows as of one snapshot, in canonical row-identity order, so
-- every page of one rebuild comes from the same immutable state. A new rebuild of a scope
-- replaces the client's earlier session of that scope (and any session of an older client
-- generation, which can only restart), and a client holds at most p_max_sessions sessions
-- in progress: not completed, not expired, of its current generation. The final page
-- completes a session: its rows are deleted at once and its header stays until the TTL
-- (setting rebuild_session_ttl_minutes), where it keeps pinning retention at the watermark
-- of the final cursor it issued. A continuation of a completed or expired session restarts
-- (409).

INSERT INTO synchro.settings (key, value) VALUES ('rebuild_session_ttl_minutes', '60');

CREATE TABLE synchro.rebuild_sessions (
    session_id text PRIMARY KEY,
    user_id text NOT NULL,
    client_id text NOT NULL,
    client_generation bigint NOT NULL,
    scope_id text NOT NULL,
    schema_hash text NOT NULL,
    stream_generation bigint NOT NULL,
    membership_generation bigint NOT NULL,
    watermark bigint NOT NULL,
    row_count integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz
);
CREATE INDEX rebuild_sessions_by_client ON synchro.rebuild_sessions (user_id, client_id);
REVOKE ALL ON synchro.rebuild_sessions FROM PUBLIC;

CREATE TABLE synchro.rebuild_rows (
    session_id text NOT NULL REFERENCES synchro.rebuild_sessions ON DELETE CASCADE,
    ordinal integer NOT NULL,
    table_id text NOT NULL,
    pk text NOT NULL,
    row_json text NOT NULL,
    server_version text NOT NULL,
    PRIMARY KEY (session_id, ordinal)
);
REVOKE ALL ON synchro.rebuild_rows FROM PUBLIC;

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
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_sessions_in_progress(text, text, bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_sessions_in_progress(text, text, bigint, text) TO synchro_adapter;

-- Stores a new session and its rows. Returns its ID, or NULL when the client already holds
-- p_max_sessions other sessions in progress (nothing is stored then).
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
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_create(text, text, bigint, text, text, bigint, bigint, bigint,
    text[], text[], text[], text[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_create(text, text, bigint, text, text, bigint, bigint, bigint,
    text[], text[], text[], text[], integer) TO synchro_adapter;

-- A session in progress (no row when it is completed, expired or unknown: 409 restart).
CREATE FUNCTION synchro.synchro_rebuild_session(p_session_id text)
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
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_session(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_session(text) TO synchro_adapter;

-- One page of a session's rows, from ordinal p_from.
CREATE FUNCTION synchro.synchro_rebuild_page(p_session_id text, p_from integer, p_limit integer)
RETURNS TABLE (ordinal integer, table_id text, pk text, row_json text, server_version text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT ordinal, table_id, pk, row_json, server_version FROM synchro.rebuild_rows
     WHERE session_id = p_session_id AND ordinal >= p_from ORDER BY ordinal LIMIT p_limit
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_page(text, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_page(text, integer, integer) TO synchro_adapter;

-- The final page was served: the rows go, the header stays (retention pin) until the TTL.
CREATE FUNCTION synchro.synchro_rebuild_complete(p_session_id text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    DELETE FROM synchro.rebuild_rows WHERE session_id = p_session_id;
    UPDATE synchro.rebuild_sessions SET completed_at = now() WHERE session_id = p_session_id AND completed_at IS NULL;
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_complete(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_complete(text) TO synchro_adapter;
