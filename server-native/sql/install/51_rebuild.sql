-- synchro install 51: rebuild sessions (POST /sync/rebuild).
-- Spec 003 "Per-Scope Retention and Client Generations", "Scope-local compaction" (a live
-- session pins retention), "Strict Positive Limits" (bounded sessions).
--
-- A session stores the scope's rows as of one snapshot, in canonical row-identity order, so
-- every page of one rebuild comes from the same immutable state: each row as the output text
-- of its page record (its row digest included), rendered once when the session starts, in
-- chunks of at most 1,000 records and about 1 MiB each (a record larger than that is a chunk
-- of its own), and the scope checksum of the whole snapshot in the header. A chunk is one
-- text, its records separated by newlines (output JSON contains none): stored and read as one
-- value, where a row per record cost a second per 100,000 rows. A new rebuild of a scope
-- replaces the client's earlier session of that scope (and any session of an older client
-- generation, which can only restart), and a client holds at most p_max_sessions sessions
-- in progress (not completed, not expired, of its current generation) and, besides its
-- first, at most p_max_bytes of stored records in all (one scope larger than that can
-- still be rebuilt, alone). The final page completes a session: its rows are deleted at
-- once and its header stays until the TTL (setting rebuild_session_ttl_minutes), where it
-- keeps pinning retention at the watermark of the final cursor it issued. A session no page
-- of which was read for rebuild_session_idle_minutes loses its rows (synchro_expire); its
-- continuation, like one of a completed or expired session, restarts (409).

INSERT INTO synchro.settings (key, value) VALUES ('rebuild_session_ttl_minutes', '60');
INSERT INTO synchro.settings (key, value) VALUES ('rebuild_session_idle_minutes', '10');

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
    -- The stored records' size (the per-client storage bound).
    byte_count bigint NOT NULL CHECK (byte_count >= 0),
    checksum text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- When a page was last read (NULL: none yet): an idle session loses its rows.
    last_read_at timestamptz,
    completed_at timestamptz
);
CREATE INDEX rebuild_sessions_by_client ON synchro.rebuild_sessions (user_id, client_id);
REVOKE ALL ON synchro.rebuild_sessions FROM PUBLIC;

-- A chunk holds the record_count records from ordinal first_ordinal on (byte_count bytes).
-- Unlogged: a session's records are a copy of projection rows, written once per session (tens
-- of MB for a large scope), so they stay out of the WAL (which the capture worker decodes)
-- and out of replication. A crash empties the table; a continuation of a session whose
-- chunks are gone is answered 409 rebuild_restart_required (its header, logged, keeps
-- pinning retention until the TTL).
CREATE UNLOGGED TABLE synchro.rebuild_chunks (
    session_id text NOT NULL REFERENCES synchro.rebuild_sessions ON DELETE CASCADE,
    first_ordinal integer NOT NULL CHECK (first_ordinal >= 0),
    record_count integer NOT NULL CHECK (record_count > 0),
    byte_count integer NOT NULL CHECK (byte_count >= 0),
    records text NOT NULL,
    PRIMARY KEY (session_id, first_ordinal)
);
REVOKE ALL ON synchro.rebuild_chunks FROM PUBLIC;

-- Sessions in progress of the client's current generation, other than one for p_scope_id
-- (which a new rebuild of that scope replaces), and the bytes their records take.
CREATE FUNCTION synchro.synchro_rebuild_sessions_in_progress(p_user_id text, p_client_id text,
    p_client_generation bigint, p_scope_id text) RETURNS TABLE (sessions bigint, bytes bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT count(*), coalesce(sum(byte_count), 0)::bigint FROM synchro.rebuild_sessions
     WHERE user_id = p_user_id AND client_id = p_client_id AND client_generation = p_client_generation
       AND scope_id <> p_scope_id AND completed_at IS NULL
       AND created_at + make_interval(mins => (SELECT value::integer FROM synchro.settings
                                               WHERE key = 'rebuild_session_ttl_minutes')) > now()
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_sessions_in_progress(text, text, bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_sessions_in_progress(text, text, bigint, text) TO synchro_adapter;

-- Stores the header of a new session of p_row_count records taking p_byte_count bytes (its
-- chunks follow, synchro_rebuild_append). Returns its ID, or NULL and why not
-- ('too_many_rebuild_sessions': the client already holds p_max_sessions other sessions in
-- progress; 'too_much_rebuild_storage': its other sessions in progress and this one would
-- store more than p_max_bytes); nothing is stored then.
CREATE FUNCTION synchro.synchro_rebuild_create(p_user_id text, p_client_id text, p_client_generation bigint,
    p_scope_id text, p_schema_hash text, p_stream_generation bigint, p_membership_generation bigint,
    p_watermark bigint, p_checksum text, p_row_count integer, p_byte_count bigint,
    p_max_sessions integer, p_max_bytes bigint)
RETURNS TABLE (session_id text, refused text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_id text := replace(gen_random_uuid()::text, '-', '');
    v_others record;
BEGIN
    -- One client's sessions are created one at a time, so the counts below are exact.
    PERFORM pg_advisory_xact_lock(hashtextextended(
        'synchro.rebuild_sessions:' || length(p_user_id) || ':' || p_user_id || p_client_id, 0));
    DELETE FROM synchro.rebuild_sessions s
     WHERE s.user_id = p_user_id AND s.client_id = p_client_id
       AND (s.scope_id = p_scope_id OR s.client_generation <> p_client_generation);
    SELECT * INTO v_others
      FROM synchro.synchro_rebuild_sessions_in_progress(p_user_id, p_client_id, p_client_generation, p_scope_id);
    IF v_others.sessions >= p_max_sessions THEN
        RETURN QUERY SELECT NULL::text, 'too_many_rebuild_sessions';
        RETURN;
    END IF;
    IF v_others.sessions > 0 AND v_others.bytes + p_byte_count > p_max_bytes THEN
        RETURN QUERY SELECT NULL::text, 'too_much_rebuild_storage';
        RETURN;
    END IF;
    INSERT INTO synchro.rebuild_sessions (session_id, user_id, client_id, client_generation, scope_id,
        schema_hash, stream_generation, membership_generation, watermark, row_count, byte_count, checksum)
    VALUES (v_id, p_user_id, p_client_id, p_client_generation, p_scope_id, p_schema_hash,
        p_stream_generation, p_membership_generation, p_watermark, p_row_count, p_byte_count, p_checksum);
    RETURN QUERY SELECT v_id, NULL::text;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_create(text, text, bigint, text, text, bigint, bigint, bigint,
    text, integer, bigint, integer, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_create(text, text, bigint, text, text, bigint, bigint, bigint,
    text, integer, bigint, integer, bigint) TO synchro_adapter;

-- Stores chunks of a session just created (each chunk's first ordinal, record count, byte
-- count and records), in batches so no one statement carries a whole large scope. The
-- session is handed to its client only once every chunk is stored; a session whose chunks
-- stopped short (an error between batches) is never served past the gap: its pages find
-- their chunks missing and restart (409).
CREATE FUNCTION synchro.synchro_rebuild_append(p_session_id text, p_firsts integer[], p_counts integer[],
    p_bytes integer[], p_chunks text[]) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    INSERT INTO synchro.rebuild_chunks (session_id, first_ordinal, record_count, byte_count, records)
    SELECT p_session_id, f, n, b, c FROM unnest(p_firsts, p_counts, p_bytes, p_chunks) AS u(f, n, b, c)
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_append(text, integer[], integer[], integer[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_append(text, integer[], integer[], integer[], text[]) TO synchro_adapter;

-- A session in progress (no row when it is completed, expired or unknown: 409 restart).
CREATE FUNCTION synchro.synchro_rebuild_session(p_session_id text)
RETURNS TABLE (user_id text, client_id text, client_generation bigint, scope_id text, schema_hash text,
               stream_generation bigint, membership_generation bigint, watermark bigint, row_count integer,
               checksum text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT user_id, client_id, client_generation, scope_id, schema_hash, stream_generation, membership_generation,
           watermark, row_count, checksum
      FROM synchro.rebuild_sessions
     WHERE session_id = p_session_id AND completed_at IS NULL
       AND created_at + make_interval(mins => (SELECT value::integer FROM synchro.settings
                                               WHERE key = 'rebuild_session_ttl_minutes')) > now()
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_session(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_session(text) TO synchro_adapter;

-- The chunks holding a page of at most p_limit records from ordinal p_from, in order, up to
-- the first whose preceding chunks of the page already hold p_max_bytes; records the read
-- (an idle session loses its rows).
CREATE FUNCTION synchro.synchro_rebuild_page(p_session_id text, p_from integer, p_limit integer,
    p_max_bytes bigint)
RETURNS TABLE (first_ordinal integer, records text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    UPDATE synchro.rebuild_sessions s SET last_read_at = now()
     WHERE s.session_id = p_session_id AND s.completed_at IS NULL;
    RETURN QUERY
    WITH page AS (
        SELECT c.first_ordinal, sum(c.byte_count) OVER (ORDER BY c.first_ordinal) - c.byte_count AS before
          FROM synchro.rebuild_chunks c
         WHERE c.session_id = p_session_id
           AND c.first_ordinal + c.record_count > p_from
           AND c.first_ordinal < p_from::bigint + p_limit)
    SELECT c.first_ordinal, c.records
      FROM page JOIN synchro.rebuild_chunks c
        ON c.session_id = p_session_id AND c.first_ordinal = page.first_ordinal
     WHERE page.before < p_max_bytes
     ORDER BY c.first_ordinal;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_page(text, integer, integer, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_page(text, integer, integer, bigint) TO synchro_adapter;

-- The final page was served: the rows go, the header stays (retention pin) until the TTL.
CREATE FUNCTION synchro.synchro_rebuild_complete(p_session_id text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    DELETE FROM synchro.rebuild_chunks WHERE session_id = p_session_id;
    UPDATE synchro.rebuild_sessions SET completed_at = now() WHERE session_id = p_session_id AND completed_at IS NULL;
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_complete(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_complete(text) TO synchro_adapter;
