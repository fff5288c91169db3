-- synchro install 51: rebuild sessions (POST /sync/rebuild).
-- Spec 003 "Per-Scope Retention and Client Generations", "Scope-local compaction" (a live
-- session pins retention), "Strict Positive Limits" (bounded sessions).
--
-- A session stores the scope's rows as of one snapshot, in canonical row-identity order, so
-- every page of one rebuild comes from the same immutable state: each row as the output text
-- of its page record (its row digest included), rendered once when the session starts, in
-- chunks of chunk_rows records, and the scope checksum of the whole snapshot in the header.
-- A chunk is one text, its records separated by newlines (output JSON contains none): stored
-- and read as one value, where a row per record cost a second per 100,000 rows. A new rebuild
-- of a scope replaces the client's earlier session of that scope (and any session of an older client
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
    chunk_rows integer NOT NULL CHECK (chunk_rows > 0),
    checksum text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz
);
CREATE INDEX rebuild_sessions_by_client ON synchro.rebuild_sessions (user_id, client_id);
REVOKE ALL ON synchro.rebuild_sessions FROM PUBLIC;

-- Chunk c holds the records of ordinals c * chunk_rows .. (c + 1) * chunk_rows - 1.
-- Unlogged: a session's records are a copy of projection rows, written once per session (tens
-- of MB for a large scope), so they stay out of the WAL (which the capture worker decodes)
-- and out of replication. A crash empties the table; a continuation of a session whose
-- chunks are gone is answered 409 rebuild_restart_required (its header, logged, keeps
-- pinning retention until the TTL).
CREATE UNLOGGED TABLE synchro.rebuild_chunks (
    session_id text NOT NULL REFERENCES synchro.rebuild_sessions ON DELETE CASCADE,
    chunk integer NOT NULL,
    records text NOT NULL,
    PRIMARY KEY (session_id, chunk)
);
REVOKE ALL ON synchro.rebuild_chunks FROM PUBLIC;

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

-- Stores a new session of p_row_count records in chunks (in order). Returns its ID, or NULL
-- when the client already holds p_max_sessions other sessions in progress (nothing is stored
-- then).
CREATE FUNCTION synchro.synchro_rebuild_create(p_user_id text, p_client_id text, p_client_generation bigint,
    p_scope_id text, p_schema_hash text, p_stream_generation bigint, p_membership_generation bigint,
    p_watermark bigint, p_checksum text, p_row_count integer, p_chunk_rows integer, p_chunks text[],
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
        p_schema_hash, p_stream_generation, p_membership_generation, p_watermark,
        p_row_count, p_chunk_rows, p_checksum);
    INSERT INTO synchro.rebuild_chunks
    SELECT v_id, (o - 1)::integer, c FROM unnest(p_chunks) WITH ORDINALITY AS u(c, o);
    RETURN v_id;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_create(text, text, bigint, text, text, bigint, bigint, bigint,
    text, integer, integer, text[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_create(text, text, bigint, text, text, bigint, bigint, bigint,
    text, integer, integer, text[], integer) TO synchro_adapter;

-- A session in progress (no row when it is completed, expired or unknown: 409 restart).
CREATE FUNCTION synchro.synchro_rebuild_session(p_session_id text)
RETURNS TABLE (user_id text, client_id text, client_generation bigint, scope_id text, schema_hash text,
               stream_generation bigint, membership_generation bigint, watermark bigint, row_count integer,
               chunk_rows integer, checksum text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT user_id, client_id, client_generation, scope_id, schema_hash, stream_generation, membership_generation,
           watermark, row_count, chunk_rows, checksum
      FROM synchro.rebuild_sessions
     WHERE session_id = p_session_id AND completed_at IS NULL
       AND created_at + make_interval(mins => (SELECT value::integer FROM synchro.settings
                                               WHERE key = 'rebuild_session_ttl_minutes')) > now()
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_session(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_session(text) TO synchro_adapter;

-- The chunks holding a page of p_limit records from ordinal p_from, in order.
CREATE FUNCTION synchro.synchro_rebuild_page(p_session_id text, p_from integer, p_limit integer)
RETURNS TABLE (chunk integer, records text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT c.chunk, c.records
      FROM synchro.rebuild_sessions s
      JOIN synchro.rebuild_chunks c ON c.session_id = s.session_id
     WHERE s.session_id = p_session_id
       AND c.chunk BETWEEN p_from / s.chunk_rows AND (p_from::bigint + p_limit - 1) / s.chunk_rows
     ORDER BY c.chunk
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_page(text, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_page(text, integer, integer) TO synchro_adapter;

-- The final page was served: the rows go, the header stays (retention pin) until the TTL.
CREATE FUNCTION synchro.synchro_rebuild_complete(p_session_id text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    DELETE FROM synchro.rebuild_chunks WHERE session_id = p_session_id;
    UPDATE synchro.rebuild_sessions SET completed_at = now() WHERE session_id = p_session_id AND completed_at IS NULL;
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_complete(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_complete(text) TO synchro_adapter;
