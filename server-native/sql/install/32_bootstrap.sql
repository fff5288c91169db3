-- synchro install 32: bootstrap of rows that existed before capture.
-- Spec 000 "Class 3: Compatible Rebuild-Requiring Change" (the copy; partly: a SHARE-locked
-- copy, not a candidate slot with an exported snapshot).
--
-- A newly registered relation is 'pending' (relation_capture, 30_capture). The capture worker
-- copies it in one transaction B that first takes a SHARE lock on the source relation (so no
-- writer of it can commit between the copy's snapshot and B's commit), replaces the
-- relation's projection with the copy, marks it 'copied' and emits the transactional logical
-- message 'synchro' / 'bootstrap:<relation_id>'. Every change of the relation that precedes
-- B in the commit-ordered stream is already in the copy and is skipped; when the worker
-- reaches B's message it evaluates membership of every copied row in the same transaction as
-- its progress row and marks the relation 'active'. Changes after B apply normally.

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
REVOKE EXECUTE ON FUNCTION synchro.synchro_bootstrap_lock(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_bootstrap_lock(text) TO synchro_worker;

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
REVOKE EXECUTE ON FUNCTION synchro.synchro_bootstrap_rows(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_bootstrap_rows(text) TO synchro_worker;

-- The column name and type OID of every registered field, in the order of
-- synchro_bootstrap_rows.
CREATE FUNCTION synchro.synchro_bootstrap_columns(p_relation_id text)
RETURNS TABLE (column_name text, type_oid oid, type_modifier integer)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT f.column_name::text, a.atttypid, a.atttypmod
      FROM synchro.fields f
      JOIN synchro.relations r USING (relation_id)
      JOIN pg_attribute a ON a.attrelid = r.physical_relation_oid AND a.attname = f.column_name
     WHERE f.relation_id = p_relation_id
     ORDER BY f.attnum
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_bootstrap_columns(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_bootstrap_columns(text) TO synchro_worker;

-- Emits the transactional bootstrap message (pg_logical_emit_message is not PUBLIC).
CREATE FUNCTION synchro.synchro_emit_bootstrap(p_relation_id text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT FROM pg_catalog.pg_logical_emit_message(true, 'synchro', 'bootstrap:' || p_relation_id)
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_emit_bootstrap(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_emit_bootstrap(text) TO synchro_worker;
