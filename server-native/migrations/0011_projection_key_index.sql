-- synchro schema, version 11: an expression index per synced relation on its key as the
-- projection view exposes it, so a membership function's `WHERE <key> = p_row_key` lookup
-- is an index probe instead of a scan that parses every projected row (the capture
-- benchmark measured that scan as the dominant cost of capture and of its latency).

SET LOCAL ROLE synchro_owner;

CREATE OR REPLACE FUNCTION synchro.synchro_create_projection_view(p_relation_id text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_cols text;
    v_key text;
BEGIN
    SELECT * INTO v_rel FROM synchro.relations WHERE relation_id = p_relation_id AND kind = 'synced';
    IF NOT FOUND THEN RETURN; END IF;
    SELECT string_agg(synchro.synchro_projection_expression(f.field_id, f.portable_type) || ' AS '
                      || quote_ident(f.column_name), ', ' ORDER BY f.attnum)
      INTO v_cols FROM synchro.fields f WHERE f.relation_id = p_relation_id;
    EXECUTE format('CREATE OR REPLACE VIEW synchro_projection.%I AS SELECT %s FROM synchro.projection_rows r '
                   'WHERE r.relation_id = %L',
                   v_rel.physical_schema || '.' || v_rel.physical_relation, v_cols, p_relation_id);
    SELECT synchro.synchro_projection_expression(f.field_id, f.portable_type)
      INTO v_key FROM synchro.fields f WHERE f.relation_id = p_relation_id AND f.is_key;
    IF v_key IS NOT NULL THEN
        -- The view's key expression over "r"; the index is on the table itself.
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON synchro.projection_rows ((%s)) WHERE relation_id = %L',
                       'projection_key_' || md5(p_relation_id),
                       replace(v_key, 'r.row_json', 'row_json'), p_relation_id);
    END IF;
END $$;

DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT relation_id FROM synchro.relations WHERE kind = 'synced' LOOP
        PERFORM synchro.synchro_create_projection_view(r.relation_id);
    END LOOP;
END $$;

RESET ROLE;

REVOKE EXECUTE ON FUNCTION synchro.synchro_create_projection_view(text) FROM PUBLIC;
