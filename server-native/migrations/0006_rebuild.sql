-- synchro schema, version 6: rebuild sessions (issue 5, POST /sync/rebuild). A session
-- stores the scope's rows as of one snapshot, in canonical row-identity order, so every
-- page of one rebuild comes from the same immutable state.

SET LOCAL ROLE synchro_owner;

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
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE synchro.rebuild_rows (
    session_id text NOT NULL REFERENCES synchro.rebuild_sessions ON DELETE CASCADE,
    ordinal integer NOT NULL,
    table_id text NOT NULL,
    pk text NOT NULL,
    row_json text NOT NULL,
    server_version text NOT NULL,
    PRIMARY KEY (session_id, ordinal)
);

CREATE FUNCTION synchro.synchro_rebuild_create(p_user_id text, p_client_id text, p_client_generation bigint,
    p_scope_id text, p_schema_hash text, p_stream_generation bigint, p_membership_generation bigint,
    p_watermark bigint, p_table_ids text[], p_pks text[], p_rows text[], p_versions text[]) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_id text := replace(gen_random_uuid()::text, '-', '');
BEGIN
    INSERT INTO synchro.rebuild_sessions VALUES (v_id, p_user_id, p_client_id, p_client_generation, p_scope_id,
        p_schema_hash, p_stream_generation, p_membership_generation, p_watermark, coalesce(array_length(p_pks, 1), 0));
    INSERT INTO synchro.rebuild_rows
    SELECT v_id, (o - 1)::integer, t, k, r, v
      FROM unnest(p_table_ids, p_pks, p_rows, p_versions) WITH ORDINALITY AS u(t, k, r, v, o);
    RETURN v_id;
END $$;

CREATE FUNCTION synchro.synchro_rebuild_session(p_session_id text)
RETURNS TABLE (user_id text, client_id text, client_generation bigint, scope_id text, schema_hash text,
               stream_generation bigint, membership_generation bigint, watermark bigint, row_count integer)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT user_id, client_id, client_generation, scope_id, schema_hash, stream_generation, membership_generation,
           watermark, row_count
      FROM synchro.rebuild_sessions WHERE session_id = p_session_id
$$;

CREATE FUNCTION synchro.synchro_rebuild_page(p_session_id text, p_from integer, p_limit integer)
RETURNS TABLE (ordinal integer, table_id text, pk text, row_json text, server_version text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT ordinal, table_id, pk, row_json, server_version FROM synchro.rebuild_rows
     WHERE session_id = p_session_id AND ordinal >= p_from ORDER BY ordinal LIMIT p_limit
$$;

RESET ROLE;

REVOKE ALL ON synchro.rebuild_sessions, synchro.rebuild_rows FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_create(text, text, bigint, text, text, bigint, bigint, bigint,
    text[], text[], text[], text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_session(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rebuild_page(text, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_create(text, text, bigint, text, text, bigint, bigint, bigint,
    text[], text[], text[], text[]) TO synchro_adapter;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_session(text) TO synchro_adapter;
GRANT EXECUTE ON FUNCTION synchro.synchro_rebuild_page(text, integer, integer) TO synchro_adapter;
