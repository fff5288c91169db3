-- synchro schema, version 24: registration and publication emit no NOTICE. The projection
-- view of a relation is refreshed for every field registration inserts, and its key index
-- was created with CREATE INDEX IF NOT EXISTS, which makes PostgreSQL emit (and, with
-- log_min_messages at notice, log) "relation ... already exists, skipping" every time
-- after the first. The index is now created only when the catalog does not have it.

SET LOCAL ROLE synchro_owner;

CREATE OR REPLACE FUNCTION synchro.synchro_create_projection_view(p_relation_id text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_cols text;
    v_key text;
    v_index text := 'projection_key_' || md5(p_relation_id);
BEGIN
    SELECT * INTO v_rel FROM synchro.relations WHERE relation_id = p_relation_id;
    IF NOT FOUND THEN RETURN; END IF;
    SELECT string_agg(synchro.synchro_projection_expression(f.field_id, f.portable_type) || ' AS '
                      || quote_ident(f.column_name), ', ' ORDER BY f.attnum)
      INTO v_cols FROM synchro.fields f WHERE f.relation_id = p_relation_id;
    IF v_cols IS NULL THEN RETURN; END IF;
    EXECUTE format('CREATE OR REPLACE VIEW synchro_projection.%I AS SELECT %s FROM synchro.projection_rows r '
                   'WHERE r.relation_id = %L',
                   v_rel.physical_schema || '.' || v_rel.physical_relation, v_cols, p_relation_id);
    SELECT synchro.synchro_projection_expression(f.field_id, f.portable_type)
      INTO v_key FROM synchro.fields f WHERE f.relation_id = p_relation_id AND f.is_key;
    IF v_key IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM pg_class c WHERE c.relname = v_index AND c.relnamespace = 'synchro'::regnamespace) THEN
        EXECUTE format('CREATE INDEX %I ON synchro.projection_rows ((%s)) WHERE relation_id = %L',
                       v_index, replace(v_key, 'r.row_json', 'row_json'), p_relation_id);
    END IF;
END $$;

RESET ROLE;
