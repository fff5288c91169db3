-- synchro schema, version 7: bootstrap of rows that existed before capture (issue 5).
--
-- A newly registered relation is 'pending'. The capture worker copies it in one
-- transaction B that first takes a SHARE lock on the source relation (so no writer of it
-- can commit between the copy's snapshot and B's commit), replaces the relation's
-- projection with the copy, marks it 'copied' and emits the transactional logical message
-- 'synchro' / 'bootstrap:<relation_id>'. Every change of the relation that precedes B in
-- the commit-ordered stream is already in the copy and is skipped; when the worker reaches
-- B's message it evaluates membership of every copied row in the same transaction as its
-- progress row and marks the relation 'active'. Changes after B apply normally.

GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) TO synchro_owner;

SET LOCAL ROLE synchro_owner;

CREATE TABLE synchro.relation_capture (
    relation_id text PRIMARY KEY REFERENCES synchro.relations,
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'copied', 'active')),
    -- Commit LSN of the bootstrap transaction, once the worker has reached it.
    bootstrap_lsn pg_lsn,
    rows_copied bigint,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO synchro.relation_capture (relation_id) SELECT relation_id FROM synchro.relations;

CREATE FUNCTION synchro.synchro_relation_capture_trigger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    INSERT INTO synchro.relation_capture (relation_id) VALUES (NEW.relation_id);
    RETURN NULL;
END $$;
CREATE TRIGGER synchro_relation_capture AFTER INSERT ON synchro.relations
    FOR EACH ROW EXECUTE FUNCTION synchro.synchro_relation_capture_trigger();

-- Takes the SHARE lock of the bootstrap and checks the physical identity under it. Must be
-- the first statement of a READ COMMITTED transaction so the copy's snapshot follows it.
CREATE FUNCTION synchro.synchro_bootstrap_lock(p_relation_id text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
BEGIN
    SELECT * INTO v_rel FROM synchro.relations WHERE relation_id = p_relation_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown relation' USING ERRCODE = '22023';
    END IF;
    EXECUTE format('LOCK TABLE ONLY %I.%I IN SHARE MODE', v_rel.physical_schema, v_rel.physical_relation);
    IF NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE c.oid = v_rel.physical_relation_oid AND c.relname = v_rel.physical_relation
                      AND n.nspname = v_rel.physical_schema AND c.relreplident = v_rel.replica_identity) THEN
        RAISE EXCEPTION 'registered_relation_drift' USING ERRCODE = '55000';
    END IF;
END $$;

-- Every row of the relation as the output-function text of its registered columns, in
-- field order (attnum). Runs under the caller's session settings (see SESSION_SETTINGS).
CREATE FUNCTION synchro.synchro_bootstrap_rows(p_relation_id text) RETURNS SETOF text[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_cols text;
BEGIN
    SELECT * INTO v_rel FROM synchro.relations WHERE relation_id = p_relation_id;
    SELECT string_agg(format('CASE WHEN %1$I IS NULL THEN NULL ELSE format(''%%s'', %1$I) END', f.column_name),
                      ', ' ORDER BY f.attnum)
      INTO v_cols FROM synchro.fields f WHERE f.relation_id = p_relation_id;
    RETURN QUERY EXECUTE format('SELECT ARRAY[%s]::text[] FROM ONLY %I.%I', v_cols,
                                v_rel.physical_schema, v_rel.physical_relation);
END $$;

-- The column name and type OID of every registered field, in the order of
-- synchro_bootstrap_rows.
CREATE FUNCTION synchro.synchro_bootstrap_columns(p_relation_id text)
RETURNS TABLE (column_name text, type_oid oid)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT f.column_name::text, a.atttypid
      FROM synchro.fields f
      JOIN synchro.relations r USING (relation_id)
      JOIN pg_attribute a ON a.attrelid = r.physical_relation_oid AND a.attname = f.column_name
     WHERE f.relation_id = p_relation_id
     ORDER BY f.attnum
$$;

-- Emits the transactional bootstrap message (pg_logical_emit_message is not PUBLIC).
CREATE FUNCTION synchro.synchro_emit_bootstrap(p_relation_id text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT FROM pg_catalog.pg_logical_emit_message(true, 'synchro', 'bootstrap:' || p_relation_id)
$$;

-- Readiness: every synced relation has been bootstrapped.
CREATE OR REPLACE FUNCTION synchro.synchro_health_detail() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT jsonb_build_object(
        'schema_installed', 'ok',
        'current_manifest', CASE WHEN EXISTS (SELECT 1 FROM synchro.manifests) THEN 'ok' ELSE 'failed' END,
        'registry_drift', CASE WHEN EXISTS (
            SELECT 1 FROM synchro.relations r
             WHERE NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                                WHERE c.oid = r.physical_relation_oid AND c.relname = r.physical_relation
                                  AND n.nspname = r.physical_schema AND c.relreplident = r.replica_identity))
            THEN 'failed' ELSE 'ok' END,
        'assignment_function', CASE WHEN EXISTS (
            SELECT 1 FROM synchro.synchro_assignment_function_check() WHERE NOT intact) THEN 'failed' ELSE 'ok' END,
        'capture_not_blocked', (SELECT CASE WHEN blocked_reason IS NULL THEN 'ok' ELSE 'failed' END
                                  FROM synchro.capture_state),
        'capture_heartbeat', (SELECT CASE WHEN heartbeat_at IS NULL THEN 'unknown'
                                          WHEN heartbeat_at > now() - interval '60 seconds' THEN 'ok'
                                          ELSE 'failed' END FROM synchro.capture_state),
        'capture_slot', CASE WHEN EXISTS (
            SELECT 1 FROM pg_replication_slots s JOIN synchro.capture_state c ON s.slot_name = c.slot_name
             WHERE s.plugin = 'pgoutput' AND s.slot_type = 'logical' AND s.database = current_database())
            THEN 'ok' ELSE 'failed' END,
        'capture_bootstrap', CASE WHEN EXISTS (
            SELECT 1 FROM synchro.relation_capture rc JOIN synchro.relations r USING (relation_id)
             WHERE r.kind = 'synced' AND rc.status <> 'active')
            THEN 'unknown' ELSE 'ok' END)
$$;

RESET ROLE;

REVOKE ALL ON synchro.relation_capture FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_relation_capture_trigger() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_bootstrap_lock(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_bootstrap_rows(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_bootstrap_columns(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_emit_bootstrap(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_emit_bootstrap(text) TO synchro_worker;
GRANT SELECT, UPDATE ON synchro.relation_capture TO synchro_worker;
GRANT EXECUTE ON FUNCTION synchro.synchro_bootstrap_lock(text) TO synchro_worker;
GRANT EXECUTE ON FUNCTION synchro.synchro_bootstrap_rows(text) TO synchro_worker;
GRANT EXECUTE ON FUNCTION synchro.synchro_bootstrap_columns(text) TO synchro_worker;
GRANT SELECT ON synchro.relation_capture TO synchro_monitor;
