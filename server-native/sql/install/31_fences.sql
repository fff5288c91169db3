-- synchro install 31: source-trigger fences and source row versions.
-- Spec 003 "Logical and Physical Relation Identity" (fence messages carry kind and relation
-- ID, never a table ID); spec 001 "Fail-closed readiness" (a missing fence blocks capture).
--
-- Every registered relation gets a BEFORE ROW trigger synchro_source_fence (named to fire
-- after the key-update guard) that allocates the row's version in the writer's transaction,
-- before the row changes, and emits it as a transactional logical message 'synchro.fence'
-- carrying the relation ID, kind, operation, the key's text form, the version and the DML
-- ordinal within the transaction. The capture worker takes each change's version from its
-- fence; a change of an active relation without one (the trigger disabled, or
-- session_replication_role = replica) blocks capture with missing_fence. The same trigger
-- refuses values no portable type holds (12_values).

CREATE SEQUENCE synchro.row_version_seq;
REVOKE ALL ON SEQUENCE synchro.row_version_seq FROM PUBLIC;

-- The current version of every synced source row, written by the fence in the writer's
-- transaction, so a push compares-and-swaps against the source itself, never against a
-- projection that may lag (52_push). Rows untouched since their bootstrap have no entry;
-- their version is the projection's.
CREATE TABLE synchro.source_versions (
    relation_id text NOT NULL,
    pk text NOT NULL,
    version bigint NOT NULL,
    PRIMARY KEY (relation_id, pk)
);
REVOKE ALL ON synchro.source_versions FROM PUBLIC;

-- The fence. Arguments: relation_id, kind, key column, document mode, then one (column,
-- field_id, check) triple per column that needs a value check (12_values).
CREATE FUNCTION synchro.synchro_fence() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_version bigint := nextval('synchro.row_version_seq');
    v_ordinal integer := coalesce(nullif(current_setting('synchro.dml_ordinal', true), '')::integer, 0) + 1;
    v_row record;
    v_key text;
    v_check record;
BEGIN
    IF TG_OP = 'DELETE' THEN v_row := OLD; ELSE v_row := NEW; END IF;
    IF TG_NARGS <= 4 AND TG_ARGV[3] IS DISTINCT FROM 'json' THEN
        -- Nothing to check: the key as before.
        v_key := to_jsonb(v_row) ->> TG_ARGV[2];
    ELSE
        v_check := synchro.synchro_row_check(v_row, TG_ARGV, TG_OP <> 'DELETE');
        IF cardinality(v_check.refused) > 0 THEN
            PERFORM synchro.synchro_unrepresentable_error(TG_ARGV[0], v_check.refused);
        END IF;
        v_key := v_check.key_text;
    END IF;
    PERFORM set_config('synchro.dml_ordinal', v_ordinal::text, true);
    PERFORM pg_catalog.pg_logical_emit_message(true, 'synchro.fence', jsonb_build_object(
        'relation_id', TG_ARGV[0], 'kind', TG_ARGV[1], 'op', lower(TG_OP),
        'key', v_key, 'version', v_version::text, 'ordinal', v_ordinal)::text);
    IF TG_ARGV[1] = 'synced' THEN
        INSERT INTO synchro.source_versions VALUES (TG_ARGV[0], v_key, v_version)
            ON CONFLICT (relation_id, pk) DO UPDATE SET version = EXCLUDED.version;
    END IF;
    RETURN v_row;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_fence() FROM PUBLIC;

-- Stored generated columns exist only after BEFORE triggers: their values are checked after
-- the row is written (same arguments as the fence, with the generated columns' triples).
CREATE FUNCTION synchro.synchro_generated_values() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_check record;
BEGIN
    v_check := synchro.synchro_row_check(NEW, TG_ARGV, true);
    IF cardinality(v_check.refused) > 0 THEN
        PERFORM synchro.synchro_unrepresentable_error(TG_ARGV[0], v_check.refused);
    END IF;
    RETURN NULL;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_generated_values() FROM PUBLIC;

-- (Re)creates the fence of a relation from its recorded fields, and the generated-values
-- trigger when a generated column needs a check.
CREATE FUNCTION synchro.synchro_create_fence(p_relation_id text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_mode text := 'jsonb';
    v_plain text := '';
    v_generated text := '';
    v_f record;
BEGIN
    SELECT * INTO v_rel FROM synchro.relations WHERE relation_id = p_relation_id;
    FOR v_f IN SELECT f.column_name, f.field_id, a.atttypid, a.attgenerated,
                      synchro.synchro_value_check_kind(f.portable_type, a.atttypid,
                          synchro.synchro_column_zone(v_rel.timestamp_zones, f.column_name)) AS kind
                 FROM (SELECT x.column_name, x.field_id, x.attnum, x.portable_type FROM synchro.fields x
                        WHERE x.relation_id = p_relation_id
                       UNION ALL
                       -- An in-flight reconfiguration's added columns are checked from its
                       -- record on (33_reconfigure).
                       SELECT p.column_name, p.field_id, p.attnum, p.portable_type FROM synchro.pending_fields p
                         JOIN synchro.registry_generations g USING (generation)
                        WHERE p.relation_id = p_relation_id AND g.state IN ('pending', 'staged')
                          AND NOT EXISTS (SELECT 1 FROM synchro.fields y
                                           WHERE y.relation_id = p_relation_id AND y.column_name = p.column_name)) f
                 JOIN pg_catalog.pg_attribute a ON a.attrelid = v_rel.physical_relation_oid AND a.attnum = f.attnum
                WHERE NOT a.attisdropped ORDER BY f.attnum LOOP
        IF (synchro.synchro_base_type(v_f.atttypid, -1)).base_type = 'json'::regtype THEN
            v_mode := 'json';
        END IF;
        IF v_f.kind IS NOT NULL AND v_f.attgenerated = '' THEN
            v_plain := v_plain || format(', %L, %L, %L', v_f.column_name, v_f.field_id, v_f.kind);
        ELSIF v_f.kind IS NOT NULL THEN
            v_generated := v_generated || format(', %L, %L, %L', v_f.column_name, v_f.field_id, v_f.kind);
        END IF;
    END LOOP;
    EXECUTE format('CREATE OR REPLACE TRIGGER synchro_source_fence BEFORE INSERT OR UPDATE OR DELETE ON %I.%I '
                   'FOR EACH ROW EXECUTE FUNCTION synchro.synchro_fence(%L, %L, %L, %L%s)',
                   v_rel.physical_schema, v_rel.physical_relation, v_rel.relation_id, v_rel.kind,
                   v_rel.capture_key_column, v_mode, v_plain);
    IF v_generated <> '' THEN
        EXECUTE format('CREATE OR REPLACE TRIGGER synchro_source_generated_values AFTER INSERT OR UPDATE ON %I.%I '
                       'FOR EACH ROW EXECUTE FUNCTION synchro.synchro_generated_values(%L, %L, %L, %L%s)',
                       v_rel.physical_schema, v_rel.physical_relation, v_rel.relation_id, v_rel.kind,
                       v_rel.capture_key_column, v_mode, v_generated);
    END IF;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_create_fence(text) FROM PUBLIC;

CREATE FUNCTION synchro.synchro_relation_fence_trigger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    PERFORM synchro.synchro_create_fence(NEW.relation_id);
    RETURN NULL;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_relation_fence_trigger() FROM PUBLIC;
CREATE TRIGGER synchro_relation_fence AFTER INSERT ON synchro.relations
    FOR EACH ROW EXECUTE FUNCTION synchro.synchro_relation_fence_trigger();
