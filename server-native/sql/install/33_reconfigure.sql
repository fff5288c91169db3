-- synchro install 33: registry generations and controlled reconfiguration.
-- Spec 000 "Registration Contract", "Class 2: Compatible Additive Change" (historical
-- nullness), "Membership Generations And Controlled Reconfiguration", "Relation Drift",
-- "Controlled Relation Reconfiguration"; spec 003 "Relation drift and controlled
-- reconfiguration".
--
-- A relation's fields change only through a new registry generation:
--   1. synchro_reconfigure_relation (operator, after or in the same transaction as the DDL)
--      reads the relation's new shape under a SHARE lock (the write gate), keeps every field
--      ID whose contract survives, gives each added column a new field ID, retires only the
--      fields the operator names, records whether each added column holds any value (once,
--      for classification), and persists the complete 'pending' generation.
--   2. The publisher (`synchro-server publish`) classifies the pending shape with the protocol
--      core, inserts its manifest and calls synchro_stage_generation, which copies the rows
--      under the new shape into synchro.projection_stage under the same SHARE lock, marks the
--      relation 'copied' and emits the transactional message 'synchro' / 'reconfigure:<n>'.
--      The manifest is not served yet (synchro_unactivated_manifests).
--   3. When the stream reaches that message the worker, in one materialization transaction,
--      replaces the relation's projection with the staged rows (every row whose content
--      differs becomes a change at that boundary, with its effects), activates the generation
--      (synchro_activate_generation: fields, fence, view), records the scopes whose rows
--      gained historical values, and the manifest becomes served. Changes of the relation
--      before the message are covered by the stage and skipped, as for a bootstrap.
-- A capture block found at a change of the relation is cleared by step 2 (the copy covers it).
-- synchro_reset_relation is the same with the registered fields unchanged: a stream reset
-- of one relation, whose activation also invalidates every scope holding its rows, so they
-- rebuild (spec 000: an equivalent reconfiguration still rebuilds the affected scopes).

CREATE TABLE synchro.registry_generations (
    generation bigint PRIMARY KEY CHECK (generation >= 1),
    -- (No foreign key: a retired relation's generations stay as history.)
    relation_id text NOT NULL,
    change text NOT NULL CHECK (change IN ('registration', 'reconfiguration', 'reset', 'retirement', 'resync')),
    state text NOT NULL CHECK (state IN ('pending', 'staged', 'active', 'superseded')),
    server_only_columns name[] NOT NULL DEFAULT '{}',
    -- The relation's lifecycle declaration under this generation (as synchro.relations).
    lifecycle jsonb NOT NULL DEFAULT '{}',
    -- Added fields, and those among them whose source values were all NULL under the write
    -- gates when the generation was recorded (never recomputed).
    added_fields text[] NOT NULL DEFAULT '{}',
    added_without_history text[] NOT NULL DEFAULT '{}',
    retired_fields text[] NOT NULL DEFAULT '{}',
    -- The manifest it activates with (none when the client-visible schema is unchanged), and
    -- whether its affected scopes stand for that manifest's whole transition (false when the
    -- same manifest carries another change, which then rebuilds every assigned scope).
    schema_version bigint REFERENCES synchro.manifests,
    scopes_recorded boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    staged_at timestamptz,
    activated_at timestamptz,
    activated_lsn pg_lsn,
    -- A lineage reset's copy made from the new slot's exported snapshot (35_lineage): the
    -- slot's consistent point, where the worker activates it before reading the stream.
    snapshot_lsn pg_lsn
);
REVOKE ALL ON synchro.registry_generations FROM PUBLIC;
GRANT SELECT ON synchro.registry_generations TO synchro_worker;
-- At most one reconfiguration of a relation is in flight.
CREATE UNIQUE INDEX registry_generations_in_flight ON synchro.registry_generations (relation_id)
    WHERE state IN ('pending', 'staged');

-- The complete field list of a generation that is not active yet.
CREATE TABLE synchro.pending_fields (
    generation bigint NOT NULL REFERENCES synchro.registry_generations ON DELETE CASCADE,
    relation_id text NOT NULL REFERENCES synchro.relations,
    field_id text NOT NULL,
    column_name name NOT NULL,
    attnum smallint NOT NULL,
    portable_type text NOT NULL,
    nullable boolean NOT NULL,
    writable boolean NOT NULL,
    is_key boolean NOT NULL,
    decimal_precision integer,
    decimal_scale integer,
    type_oid oid NOT NULL,
    type_modifier integer NOT NULL,
    PRIMARY KEY (generation, field_id),
    UNIQUE (generation, attnum)
);
REVOKE ALL ON synchro.pending_fields FROM PUBLIC;
GRANT SELECT ON synchro.pending_fields TO synchro_worker;
-- An added column's existing values are checked exactly as registration checks them (12_values).
CREATE TRIGGER synchro_pending_fields_value_checks AFTER INSERT ON synchro.pending_fields
    FOR EACH ROW EXECUTE FUNCTION synchro.synchro_fields_value_trigger();

-- Rows copied under a staged generation's fields (output-function text in attnum order).
CREATE TABLE synchro.projection_stage (
    generation bigint NOT NULL REFERENCES synchro.registry_generations ON DELETE CASCADE,
    n bigint NOT NULL,
    row_values text[] NOT NULL,
    source_version text,
    PRIMARY KEY (generation, n)
);
REVOKE ALL ON synchro.projection_stage FROM PUBLIC;
GRANT SELECT ON synchro.projection_stage TO synchro_worker;

-- The scopes a Class 3 manifest's activation gave historical values: connect rebuilds only
-- these (intersected with the client's assigned scopes). A Class 3 manifest without a
-- recorded set (an added table) rebuilds every assigned scope.
CREATE TABLE synchro.manifest_affected_scopes (
    schema_version bigint NOT NULL REFERENCES synchro.manifests,
    scope_id text NOT NULL,
    PRIMARY KEY (schema_version, scope_id)
);
REVOKE ALL ON synchro.manifest_affected_scopes FROM PUBLIC;
GRANT SELECT, INSERT ON synchro.manifest_affected_scopes TO synchro_worker;

-- The next registry generation (serialized).
CREATE FUNCTION synchro.synchro_next_generation() RETURNS bigint
LANGUAGE sql VOLATILE SET search_path = pg_catalog, synchro, pg_temp AS $$
    LOCK TABLE synchro.registry_generations IN EXCLUSIVE MODE;
    SELECT coalesce(max(generation), 0) + 1 FROM synchro.registry_generations;
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_next_generation() FROM PUBLIC;

-- A registration's generation: active at once (its bootstrap is the staged copy).
CREATE FUNCTION synchro.synchro_record_generation(p_relation_id text, p_change text) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_generation bigint := synchro.synchro_next_generation();
BEGIN
    INSERT INTO synchro.registry_generations (generation, relation_id, change, state, server_only_columns,
                                              activated_at)
    SELECT v_generation, p_relation_id, p_change, 'active', r.server_only_columns, now()
      FROM synchro.relations r WHERE r.relation_id = p_relation_id;
    UPDATE synchro.relation_capture SET registry_generation = v_generation WHERE relation_id = p_relation_id;
    RETURN v_generation;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_record_generation(text, text) FROM PUBLIC;

-- The physical identity drift of every registered relation that the catalog shows: dropped
-- (or recreated), renamed or moved, another replica identity, another primary key (a
-- relation being retired no longer counts).
CREATE FUNCTION synchro.synchro_catalog_drift() RETURNS TABLE (relation_id text, detail text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT r.relation_id,
           CASE WHEN c.oid IS NULL THEN 'relation_dropped'
                WHEN c.relname <> r.physical_relation OR n.nspname <> r.physical_schema THEN 'relation_renamed'
                WHEN c.relreplident <> r.replica_identity THEN 'replica_identity_changed'
                ELSE 'primary_key_changed' END
      FROM synchro.relations r
      LEFT JOIN pg_class c ON c.oid = r.physical_relation_oid
      LEFT JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE NOT EXISTS (SELECT 1 FROM synchro.registry_generations g
                        WHERE g.relation_id = r.relation_id AND g.change = 'retirement'
                          AND g.state IN ('pending', 'staged'))
       AND (c.oid IS NULL OR c.relname <> r.physical_relation OR n.nspname <> r.physical_schema
        OR c.relreplident <> r.replica_identity
        OR NOT EXISTS (SELECT 1 FROM pg_constraint k JOIN pg_attribute a
                                  ON a.attrelid = k.conrelid AND a.attnum = k.conkey[1]
                        WHERE k.conrelid = c.oid AND k.contype = 'p' AND cardinality(k.conkey) = 1
                          AND a.attname = r.capture_key_column AND a.atttypid = r.primary_key_type))
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_catalog_drift() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_catalog_drift() TO synchro_worker, synchro_monitor, synchro_operator;

-- The registered synced relation a reconfiguration, reset or retirement names, refused
-- (spec error body, or SQLSTATE 55000/55006) when it is unknown, when its physical identity
-- drifted (unless p_drift_ok: a retirement recovers from that), while its bootstrap copy or a
-- staged change is in flight, and while another change of it is pending (unless
-- p_pending_ok: a reconfiguration replaces a pending one).
CREATE FUNCTION synchro.synchro_relation_for_change(p_schema text, p_relation text, p_drift_ok boolean,
    p_pending_ok boolean) RETURNS synchro.relations
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
BEGIN
    v_rel := synchro.synchro_synced_relation(p_schema, p_relation);
    IF NOT p_drift_ok AND EXISTS (SELECT 1 FROM synchro.synchro_catalog_drift() d
                                   WHERE d.relation_id = v_rel.relation_id) THEN
        RAISE EXCEPTION 'the relation''s physical identity changed (dropped, renamed, another key or replica identity); retire it and register the new table'
            USING ERRCODE = '55000';
    END IF;
    IF EXISTS (SELECT 1 FROM synchro.relation_capture c WHERE c.relation_id = v_rel.relation_id
                  AND c.status <> 'active')
       OR EXISTS (SELECT 1 FROM synchro.registry_generations g WHERE g.relation_id = v_rel.relation_id
                     AND (g.state = 'staged' OR (g.state = 'pending' AND NOT (p_pending_ok AND g.change = 'reconfiguration')))) THEN
        RAISE EXCEPTION 'the relation is being bootstrapped, or another change of it is in flight; retry once capture has applied it (or publish the pending one)'
            USING ERRCODE = '55006';
    END IF;
    RETURN v_rel;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_relation_for_change(text, text, boolean, boolean) FROM PUBLIC;

-- Records a pending reconfiguration of one synced relation from its current catalog shape
-- (see the top of this file). p_server_only: the columns that are not synced (NULL keeps the
-- current list, less columns that no longer exist); p_retire: registered columns whose
-- fields are retired (Class 4; a registered column that is gone must be named here);
-- p_lifecycle: {"created_at","updated_at","deleted_at"} → column (NULL keeps the current
-- declaration; a changed one is Class 4). A pending (not yet staged) reconfiguration of the
-- relation is replaced. Returns the plan:
-- {"relation_id","generation","added":[{"field_id","column","type","nullable",
-- "has_values"}],"changed":[{"field_id","change"}],"retired":[field_id],"unchanged":n,
-- "scopes_holding_rows":n}.
CREATE FUNCTION synchro.synchro_reconfigure_relation(p_schema text, p_relation text,
    p_server_only text[] DEFAULT NULL, p_retire text[] DEFAULT '{}', p_lifecycle jsonb DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_server_only name[];
    v_generation bigint;
    v_col record;
    v_old synchro.fields%ROWTYPE;
    v_type record;
    v_field_id text;
    v_nullable boolean;
    v_writable boolean;
    v_has boolean;
    v_added jsonb := '[]';
    v_changed jsonb := '[]';
    v_retired text[] := '{}';
    v_added_ids text[] := '{}';
    v_lifecycle jsonb;
    v_without text[] := '{}';
    v_unchanged integer := 0;
BEGIN
    v_rel := synchro.synchro_relation_for_change(p_schema, p_relation, false, true);
    IF NOT pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = v_rel.physical_relation_oid), 'USAGE') THEN
        RAISE EXCEPTION 'reconfiguration needs synchro_owner to be granted the relation owner''s role'
            USING ERRCODE = '42501';
    END IF;
    -- The write gate: no writer of the relation commits until this transaction does, so the
    -- facts recorded below hold at its commit.
    EXECUTE format('LOCK TABLE ONLY %I.%I IN SHARE MODE', v_rel.physical_schema, v_rel.physical_relation);
    DELETE FROM synchro.registry_generations g WHERE g.relation_id = v_rel.relation_id AND g.state = 'pending';

    v_server_only := coalesce(p_server_only::name[], ARRAY(
        SELECT c FROM unnest(v_rel.server_only_columns) c
         WHERE EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = v_rel.physical_relation_oid
                          AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = c)));
    p_retire := coalesce(p_retire, '{}');
    IF v_rel.capture_key_column = ANY (v_server_only) OR v_rel.capture_key_column = ANY (p_retire::name[]) THEN
        RAISE EXCEPTION 'the primary key cannot be server-only or retired' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_retire) c(name)
                WHERE NOT EXISTS (SELECT 1 FROM synchro.fields f
                                   WHERE f.relation_id = v_rel.relation_id AND f.column_name = c.name)) THEN
        RAISE EXCEPTION 'only registered columns can be retired' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(v_server_only) c(name)
                WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = v_rel.physical_relation_oid
                                     AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = c.name)
                   OR (EXISTS (SELECT 1 FROM synchro.fields f
                                WHERE f.relation_id = v_rel.relation_id AND f.column_name = c.name)
                       AND NOT c.name = ANY (p_retire::name[]))) THEN
        RAISE EXCEPTION 'server-only columns must exist, and a synced column must be retired before it becomes server-only'
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM synchro.relation_indexes x JOIN synchro.fields f
                 ON f.relation_id = x.relation_id AND f.field_id = ANY (x.field_ids)
                WHERE x.relation_id = v_rel.relation_id AND f.column_name = ANY (p_retire::name[])) THEN
        RAISE EXCEPTION 'a declared local index uses a field to retire' USING ERRCODE = '22023';
    END IF;
    -- A registered column that is gone must be retired explicitly.
    SELECT f.* INTO v_old FROM synchro.fields f
     WHERE f.relation_id = v_rel.relation_id AND NOT f.column_name = ANY (p_retire::name[])
       AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = v_rel.physical_relation_oid
                          AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = f.column_name)
     LIMIT 1;
    IF FOUND THEN
        PERFORM synchro.synchro_registration_error('missing_field', v_rel.relation_id, v_old.field_id,
            jsonb_build_object('column', v_old.column_name));
    END IF;

    v_lifecycle := coalesce(p_lifecycle, v_rel.lifecycle);
    PERFORM synchro.synchro_check_lifecycle(v_rel.physical_relation_oid, v_lifecycle, v_server_only,
                                            v_rel.capture_key_column);
    IF EXISTS (SELECT 1 FROM jsonb_each_text(v_lifecycle) l WHERE l.value::name = ANY (p_retire::name[])) THEN
        RAISE EXCEPTION 'a lifecycle column cannot be retired' USING ERRCODE = '22023';
    END IF;
    v_generation := synchro.synchro_next_generation();
    INSERT INTO synchro.registry_generations (generation, relation_id, change, state, server_only_columns, lifecycle)
    VALUES (v_generation, v_rel.relation_id, 'reconfiguration', 'pending', v_server_only, v_lifecycle);

    FOR v_col IN SELECT a.* FROM pg_attribute a
                  WHERE a.attrelid = v_rel.physical_relation_oid AND a.attnum > 0 AND NOT a.attisdropped
                    AND NOT a.attname = ANY (v_server_only) AND NOT a.attname = ANY (p_retire::name[])
                  ORDER BY a.attnum LOOP
        SELECT f.* INTO v_old FROM synchro.fields f
         WHERE f.relation_id = v_rel.relation_id AND f.column_name = v_col.attname;
        IF v_col.attname = v_rel.capture_key_column THEN
            INSERT INTO synchro.pending_fields
            SELECT v_generation, f.relation_id, f.field_id, f.column_name, v_col.attnum, f.portable_type, f.nullable,
                   f.writable, f.is_key, f.decimal_precision, f.decimal_scale, v_col.atttypid, v_col.atttypmod
              FROM synchro.fields f WHERE f.relation_id = v_rel.relation_id AND f.field_id = v_old.field_id;
            v_unchanged := v_unchanged + 1;
            CONTINUE;
        END IF;
        SELECT t.* INTO v_type FROM synchro.synchro_field_type(v_col.atttypid, v_col.atttypmod,
            synchro.synchro_column_zone(v_rel.timestamp_zones, v_col.attname)) t;
        IF v_type.portable_type IS NULL THEN
            -- No portable type: declare it server-only (or retire it, when it was synced).
            PERFORM synchro.synchro_registration_error('unsupported_column_type', v_rel.relation_id, v_old.field_id,
                jsonb_build_object('column', v_col.attname, 'type', format_type(v_col.atttypid, v_col.atttypmod),
                    'hint', synchro.synchro_unsupported_type_hint(v_col.attname, v_col.atttypid, v_col.atttypmod)));
        END IF;
        v_nullable := NOT v_col.attnotnull;
        v_writable := v_col.attgenerated = '' AND v_col.attidentity <> 'a'
                      AND NOT EXISTS (SELECT 1 FROM jsonb_each_text(v_lifecycle) l WHERE l.value = v_col.attname);
        IF v_old.field_id IS NOT NULL AND v_old.portable_type <> v_type.portable_type THEN
            -- An in-place type change is Class 4 through a new field: add a column, migrate,
            -- retire the old one (the operator guide's expand, migrate, contract).
            PERFORM synchro.synchro_registration_error('unsupported_column_type', v_rel.relation_id, v_old.field_id,
                jsonb_build_object('column', v_col.attname, 'type', format_type(v_col.atttypid, v_col.atttypmod),
                    'hint', format('column %I changed to type %s, whose portable type is %s, not %s: a synced '
                                   'field keeps its type. Way out: add a new column of the new type, copy the '
                                   'values, and retire the old one (expand, migrate, contract)',
                                   v_col.attname, format_type(v_col.atttypid, v_col.atttypmod),
                                   v_type.portable_type, v_old.portable_type)));
        END IF;
        IF v_old.field_id IS NULL THEN
            -- Derived from what the plan sees too (the relation, the column, how many
            -- generations it has had), so `registry plan` shows the ID `reconfigure` assigns.
            v_field_id := 'fld_' || md5(format('%s/%s/%s/%s', v_rel.relation_id, v_col.attname, v_col.attnum,
                (SELECT count(*) FROM synchro.registry_generations g WHERE g.relation_id = v_rel.relation_id)));
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM ONLY %I.%I WHERE %I IS NOT NULL)',
                           v_rel.physical_schema, v_rel.physical_relation, v_col.attname) INTO v_has;
            v_added := v_added || jsonb_build_object('field_id', v_field_id, 'column', v_col.attname,
                'type', v_type.portable_type, 'nullable', v_nullable, 'has_values', v_has);
            v_added_ids := v_added_ids || v_field_id;
            IF NOT v_has THEN
                v_without := v_without || v_field_id;
            END IF;
        ELSE
            v_field_id := v_old.field_id;
            IF v_old.nullable <> v_nullable THEN
                v_changed := v_changed || jsonb_build_object('field_id', v_field_id, 'change',
                    CASE WHEN v_nullable THEN 'nullability_loosened' ELSE 'nullability_tightened' END);
            END IF;
            IF v_old.writable <> v_writable THEN
                v_changed := v_changed || jsonb_build_object('field_id', v_field_id, 'change',
                    CASE WHEN v_writable THEN 'writability_loosened' ELSE 'writability_removed' END);
            END IF;
            IF v_old.decimal_precision IS DISTINCT FROM v_type.decimal_precision
               OR v_old.decimal_scale IS DISTINCT FROM v_type.decimal_scale THEN
                v_changed := v_changed || jsonb_build_object('field_id', v_field_id, 'change',
                    CASE WHEN v_type.decimal_scale >= v_old.decimal_scale
                              AND v_type.decimal_precision - v_type.decimal_scale
                                  >= v_old.decimal_precision - v_old.decimal_scale
                         THEN 'decimal_widened' ELSE 'decimal_narrowed' END);
            END IF;
            IF v_old.nullable = v_nullable AND v_old.writable = v_writable
               AND v_old.decimal_precision IS NOT DISTINCT FROM v_type.decimal_precision
               AND v_old.decimal_scale IS NOT DISTINCT FROM v_type.decimal_scale THEN
                v_unchanged := v_unchanged + 1;
            END IF;
        END IF;
        INSERT INTO synchro.pending_fields (generation, relation_id, field_id, column_name, attnum, portable_type,
            nullable, writable, is_key, decimal_precision, decimal_scale, type_oid, type_modifier)
        VALUES (v_generation, v_rel.relation_id, v_field_id, v_col.attname, v_col.attnum, v_type.portable_type,
            v_nullable, v_writable, false, v_type.decimal_precision, v_type.decimal_scale, v_col.atttypid,
            v_col.atttypmod);
    END LOOP;
    SELECT coalesce(array_agg(f.field_id ORDER BY f.field_id), '{}') INTO v_retired FROM synchro.fields f
     WHERE f.relation_id = v_rel.relation_id
       AND NOT EXISTS (SELECT 1 FROM synchro.pending_fields p WHERE p.generation = v_generation
                          AND p.field_id = f.field_id);
    -- A retired field's column that still exists is server-only from now on (dropping it
    -- later changes nothing).
    UPDATE synchro.registry_generations
       SET added_fields = v_added_ids, added_without_history = v_without, retired_fields = v_retired,
           server_only_columns = server_only_columns || ARRAY(
               SELECT f.column_name FROM synchro.fields f
                WHERE f.relation_id = v_rel.relation_id AND f.field_id = ANY (v_retired)
                  AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = v_rel.physical_relation_oid
                                 AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = f.column_name)
                  AND NOT f.column_name = ANY (server_only_columns))
     WHERE generation = v_generation;
    RETURN jsonb_build_object('relation_id', v_rel.relation_id, 'table_id', v_rel.table_id,
        'generation', v_generation, 'added', v_added, 'changed', v_changed,
        'retired', to_jsonb(v_retired), 'unchanged', v_unchanged,
        'lifecycle_changed', v_lifecycle IS DISTINCT FROM v_rel.lifecycle,
        'scopes_holding_rows', (SELECT count(DISTINCT e.scope_id) FROM synchro.membership_edges e
                                 WHERE e.relation_id = v_rel.relation_id));
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_reconfigure_relation(text, text, text[], text[], jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_reconfigure_relation(text, text, text[], text[], jsonb) TO synchro_operator;

-- The pending generations the publisher classifies: {"generation","relation_id",
-- "added_without_history":[...]} each.
CREATE FUNCTION synchro.synchro_pending_generations() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('generation', g.generation, 'relation_id', g.relation_id,
                                                 'added_without_history', to_jsonb(g.added_without_history))
                              ORDER BY g.generation), '[]')
      FROM synchro.registry_generations g WHERE g.state = 'pending'
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_pending_generations() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_pending_generations() TO synchro_operator;

-- Records the pending retirement of a synced table (Class 4, its own explicit step): the next
-- publish removes it from the manifest, and capture removes the relation — projection, edges,
-- triggers, publication membership — at that boundary. A table others' membership depends
-- on must lose that dependency first. Returns {"relation_id","table_id","generation"}.
CREATE FUNCTION synchro.synchro_retire_relation(p_schema text, p_relation text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_generation bigint;
BEGIN
    -- (A dropped or recreated table is retired too: that is how an operator recovers from it.)
    v_rel := synchro.synchro_relation_for_change(p_schema, p_relation, true, false);
    IF EXISTS (SELECT 1 FROM synchro.membership_dependencies d
                WHERE d.dependency_relation_id = v_rel.relation_id AND d.target_relation_id <> v_rel.relation_id) THEN
        RAISE EXCEPTION 'another relation''s membership depends on this one' USING ERRCODE = '55000';
    END IF;
    v_generation := synchro.synchro_next_generation();
    INSERT INTO synchro.registry_generations (generation, relation_id, change, state, retired_fields)
    SELECT v_generation, v_rel.relation_id, 'retirement', 'pending', coalesce(array_agg(f.field_id), '{}')
      FROM synchro.fields f WHERE f.relation_id = v_rel.relation_id;
    RETURN jsonb_build_object('relation_id', v_rel.relation_id, 'table_id', v_rel.table_id,
                              'generation', v_generation);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_retire_relation(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_retire_relation(text, text) TO synchro_operator;

-- A pending generation with the relation's registered fields unchanged: a stream reset
-- (below), or a lineage reset's copy (35_lineage, change 'resync'). Its number.
CREATE FUNCTION synchro.synchro_record_fresh_copy(p_relation_id text, p_change text) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_generation bigint := synchro.synchro_next_generation();
BEGIN
    INSERT INTO synchro.registry_generations (generation, relation_id, change, state, server_only_columns, lifecycle)
    SELECT v_generation, r.relation_id, p_change, 'pending', r.server_only_columns, r.lifecycle
      FROM synchro.relations r WHERE r.relation_id = p_relation_id;
    INSERT INTO synchro.pending_fields (generation, relation_id, field_id, column_name, attnum, portable_type,
        nullable, writable, is_key, decimal_precision, decimal_scale, type_oid, type_modifier)
    SELECT v_generation, f.relation_id, f.field_id, f.column_name, f.attnum, f.portable_type, f.nullable, f.writable,
           f.is_key, f.decimal_precision, f.decimal_scale, f.type_oid, f.type_modifier
      FROM synchro.fields f WHERE f.relation_id = p_relation_id;
    RETURN v_generation;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_record_fresh_copy(text, text) FROM PUBLIC;

-- A stream reset of one synced relation (see the top of this file): a pending generation
-- with the registered fields, so the next publish stages a fresh copy and lifts a block found
-- at one of its changes (an unrepresentable value since fixed, a TRUNCATE, writes with the
-- triggers bypassed). Refused while the catalog no longer has the registered shape (then
-- reconfigure). Returns {"relation_id","table_id","generation"}.
CREATE FUNCTION synchro.synchro_reset_relation(p_schema text, p_relation text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
BEGIN
    v_rel := synchro.synchro_relation_for_change(p_schema, p_relation, false, false);
    RETURN jsonb_build_object('relation_id', v_rel.relation_id, 'table_id', v_rel.table_id,
                              'generation', synchro.synchro_record_fresh_copy(v_rel.relation_id, 'reset'));
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_reset_relation(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_reset_relation(text, text) TO synchro_operator;

-- Copies the rows of a pending generation's relation under its fields into
-- synchro.projection_stage, each with the version of its last fenced write as of this copy
-- (NULL: none since registration), as the caller's snapshot sees them (the stage's write
-- gate, or a lineage reset's exported snapshot, 35_lineage). Returns the rows copied.
CREATE FUNCTION synchro.synchro_copy_to_stage(p_generation bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp
SET TimeZone = 'UTC' SET DateStyle = 'ISO, YMD' SET IntervalStyle = 'postgres'
SET extra_float_digits = 1 SET bytea_output = 'hex' AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_cols text;
    v_rows bigint;
BEGIN
    SELECT r.* INTO v_rel FROM synchro.relations r JOIN synchro.registry_generations g USING (relation_id)
     WHERE g.generation = p_generation;
    SELECT string_agg(format('CASE WHEN %1$I IS NULL THEN NULL ELSE format(''%%s'', %1$I) END', p.column_name),
                      ', ' ORDER BY p.attnum)
      INTO v_cols FROM synchro.pending_fields p WHERE p.generation = p_generation;
    EXECUTE format('INSERT INTO synchro.projection_stage (generation, n, row_values, source_version) '
                   'SELECT %s, row_number() OVER (), ARRAY[%s]::text[], '
                   '(SELECT v.version::text FROM synchro.source_versions v '
                   '  WHERE v.relation_id = %L AND v.pk = to_jsonb(t) ->> %L) FROM ONLY %I.%I t',
                   p_generation, v_cols, v_rel.relation_id, v_rel.capture_key_column,
                   v_rel.physical_schema, v_rel.physical_relation);
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_copy_to_stage(bigint) FROM PUBLIC;

-- Stages a pending generation (see the top of this file): checks under the write gate that
-- the catalog still has its shape, copies the rows, marks the relation 'copied', binds the
-- manifest (NULL when the client-visible schema is unchanged), emits the message and clears
-- a capture block the relation's column drift caused.
CREATE FUNCTION synchro.synchro_stage_generation(p_generation bigint, p_schema_version bigint,
    p_record_scopes boolean) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, synchro, pg_temp
SET TimeZone = 'UTC' SET DateStyle = 'ISO, YMD' SET IntervalStyle = 'postgres'
SET extra_float_digits = 1 SET bytea_output = 'hex' AS $$
DECLARE
    v_gen synchro.registry_generations%ROWTYPE;
    v_rel synchro.relations%ROWTYPE;
    v_rows bigint;
    v_trigger name;
BEGIN
    SELECT * INTO v_gen FROM synchro.registry_generations WHERE generation = p_generation FOR UPDATE;
    IF NOT FOUND OR v_gen.state <> 'pending' THEN
        RAISE EXCEPTION 'no such pending reconfiguration' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v_rel FROM synchro.relations WHERE relation_id = v_gen.relation_id;
    IF v_gen.change = 'retirement' THEN
        -- Nothing to copy: at the boundary every projected row goes. Its triggers and
        -- publication membership go now, on the table its OID still names (a dropped table
        -- took them along): its later changes are not captured anyway.
        FOR v_trigger IN SELECT t.tgname FROM pg_trigger t
                          WHERE t.tgrelid = v_rel.physical_relation_oid
                            AND t.tgname IN ('synchro_reject_key_update', 'synchro_source_fence',
                                             'synchro_source_generated_values') LOOP
            EXECUTE format('DROP TRIGGER %I ON %s', v_trigger, v_rel.physical_relation_oid::regclass);
        END LOOP;
        IF EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
                    WHERE p.pubname = 'synchro_publication' AND pr.prrelid = v_rel.physical_relation_oid) THEN
            EXECUTE format('ALTER PUBLICATION synchro_publication DROP TABLE ONLY %s',
                           v_rel.physical_relation_oid::regclass);
        END IF;
        UPDATE synchro.registry_generations SET state = 'staged', staged_at = now(), schema_version = p_schema_version
         WHERE generation = p_generation;
        UPDATE synchro.relation_capture SET status = 'copied', rows_copied = 0, updated_at = now()
         WHERE relation_id = v_rel.relation_id;
        PERFORM pg_catalog.pg_logical_emit_message(true, 'synchro', 'reconfigure:' || p_generation);
        UPDATE synchro.capture_state
           SET blocked_reason = NULL, blocked_at = NULL, blocked_relation_id = NULL, blocked_detail = NULL,
               blocked_lsn = NULL, blocked_ordinal = NULL, blocked_sqlstate = NULL
         WHERE blocked_relation_id = v_rel.relation_id;
        RETURN 0;
    END IF;
    EXECUTE format('LOCK TABLE ONLY %I.%I IN SHARE MODE', v_rel.physical_schema, v_rel.physical_relation);
    -- The catalog must still have exactly the pending shape (columns, types, nullability).
    IF EXISTS (SELECT 1 FROM synchro.synchro_catalog_drift() d WHERE d.relation_id = v_rel.relation_id)
       OR EXISTS (SELECT 1 FROM synchro.pending_fields p
                   WHERE p.generation = p_generation
                     AND NOT EXISTS (SELECT 1 FROM pg_attribute a
                                      WHERE a.attrelid = v_rel.physical_relation_oid AND a.attnum = p.attnum
                                        AND NOT a.attisdropped AND a.attname = p.column_name
                                        AND a.atttypid = p.type_oid AND a.atttypmod = p.type_modifier
                                        AND a.attnotnull = NOT p.nullable))
       OR EXISTS (SELECT 1 FROM pg_attribute a
                   WHERE a.attrelid = v_rel.physical_relation_oid AND a.attnum > 0 AND NOT a.attisdropped
                     AND NOT a.attname = ANY (v_gen.server_only_columns)
                     AND NOT EXISTS (SELECT 1 FROM synchro.pending_fields p
                                      WHERE p.generation = p_generation AND p.column_name = a.attname)
                     AND NOT EXISTS (SELECT 1 FROM synchro.fields f
                                      WHERE f.relation_id = v_rel.relation_id AND f.column_name = a.attname
                                        AND f.field_id = ANY (v_gen.retired_fields))) THEN
        RAISE EXCEPTION 'the relation changed after it was reconfigured; reconfigure it again'
            USING ERRCODE = '40001';
    END IF;
    v_rows := synchro.synchro_copy_to_stage(p_generation);
    UPDATE synchro.registry_generations
       SET state = 'staged', staged_at = now(), schema_version = p_schema_version,
           scopes_recorded = coalesce(p_record_scopes, false)
     WHERE generation = p_generation;
    UPDATE synchro.relation_capture SET status = 'copied', rows_copied = v_rows, updated_at = now()
     WHERE relation_id = v_rel.relation_id;
    -- New columns' values are checked by the fence from now on.
    PERFORM synchro.synchro_create_fence(v_rel.relation_id);
    PERFORM pg_catalog.pg_logical_emit_message(true, 'synchro', 'reconfigure:' || p_generation);
    -- The copy covers every change of the relation before this boundary, so a block found
    -- at one of them is lifted (were its cause still there — a value, a failing rule — the
    -- activation blocks again).
    UPDATE synchro.capture_state
       SET blocked_reason = NULL, blocked_at = NULL, blocked_relation_id = NULL, blocked_detail = NULL,
           blocked_lsn = NULL, blocked_ordinal = NULL, blocked_sqlstate = NULL
     WHERE blocked_relation_id = v_rel.relation_id;
    RETURN v_rows;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_stage_generation(bigint, bigint, boolean) FROM PUBLIC;
-- The worker stages the copies of a lineage reset (35_lineage).
GRANT EXECUTE ON FUNCTION synchro.synchro_stage_generation(bigint, bigint, boolean) TO synchro_operator, synchro_worker;

-- Activates a staged generation when the stream reaches its message (the worker, inside the
-- materialization transaction of that source transaction, after it read the stage).
CREATE FUNCTION synchro.synchro_activate_generation(p_generation bigint, p_lsn pg_lsn) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_gen synchro.registry_generations%ROWTYPE;
    v_rel synchro.relations%ROWTYPE;
BEGIN
    SELECT * INTO v_gen FROM synchro.registry_generations WHERE generation = p_generation FOR UPDATE;
    IF NOT FOUND OR v_gen.state <> 'staged' THEN
        RAISE EXCEPTION 'no such staged reconfiguration' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v_rel FROM synchro.relations WHERE relation_id = v_gen.relation_id;
    IF v_gen.change = 'retirement' THEN
        -- The worker has deleted every projected row (with its effects) in this transaction:
        -- the relation goes with everything that hangs off it; a later registration of the
        -- same table is a new relation and table ID.
        DELETE FROM synchro.membership_staged_edges WHERE relation_id = v_rel.relation_id;
        DELETE FROM synchro.membership_staged_unscoped WHERE relation_id = v_rel.relation_id;
        DELETE FROM synchro.membership_edges WHERE relation_id = v_rel.relation_id;
        DELETE FROM synchro.membership_unscoped WHERE relation_id = v_rel.relation_id;
        DELETE FROM synchro.membership_functions WHERE relation_id = v_rel.relation_id;
        DELETE FROM synchro.membership_dependencies
         WHERE target_relation_id = v_rel.relation_id OR dependency_relation_id = v_rel.relation_id;
        DELETE FROM synchro.pending_fields WHERE relation_id = v_rel.relation_id;
        DELETE FROM synchro.relation_indexes WHERE relation_id = v_rel.relation_id;
        DELETE FROM synchro.projection_rows WHERE relation_id = v_rel.relation_id;
        DELETE FROM synchro.source_versions WHERE relation_id = v_rel.relation_id;
        DELETE FROM synchro.fields WHERE relation_id = v_rel.relation_id;
        DELETE FROM synchro.relation_capture WHERE relation_id = v_rel.relation_id;
        DELETE FROM synchro.relations WHERE relation_id = v_rel.relation_id;
        -- The projection's key index of this relation (40_membership) stays, empty: dropping
        -- it here took an ACCESS EXCLUSIVE lock on projection_rows inside capture's
        -- transaction, after its evaluations had read projection views, and deadlocked with a
        -- registration replacing one of those views (40P01). The next registration drops the
        -- key indexes of relations that are gone (synchro_drop_orphaned_projection_indexes).
        UPDATE synchro.registry_generations SET state = 'superseded'
         WHERE relation_id = v_gen.relation_id AND state = 'active';
        UPDATE synchro.registry_generations SET state = 'active', activated_at = now(), activated_lsn = p_lsn
         WHERE generation = p_generation;
        RETURN;
    END IF;
    -- Retained fields change in place, retired ones go (their view column reads NULL from
    -- now on), added ones are inserted (their insert trigger extends the view; the values and
    -- the fence were checked and made when the generation was recorded and staged, so no scan
    -- or trigger DDL on the application's table runs here, inside capture's transaction).
    PERFORM set_config('synchro.activating', 'on', true);
    DELETE FROM synchro.fields WHERE relation_id = v_gen.relation_id AND field_id = ANY (v_gen.retired_fields);
    UPDATE synchro.fields f
       SET column_name = p.column_name, attnum = p.attnum, nullable = p.nullable, writable = p.writable,
           decimal_precision = p.decimal_precision, decimal_scale = p.decimal_scale, type_oid = p.type_oid,
           type_modifier = p.type_modifier
      FROM synchro.pending_fields p
     WHERE p.generation = p_generation AND f.relation_id = p.relation_id AND f.field_id = p.field_id;
    INSERT INTO synchro.fields (relation_id, field_id, column_name, attnum, portable_type, nullable, writable,
        is_key, decimal_precision, decimal_scale, type_oid, type_modifier)
    SELECT p.relation_id, p.field_id, p.column_name, p.attnum, p.portable_type, p.nullable, p.writable, p.is_key,
           p.decimal_precision, p.decimal_scale, p.type_oid, p.type_modifier
      FROM synchro.pending_fields p
     WHERE p.generation = p_generation
       AND NOT EXISTS (SELECT 1 FROM synchro.fields f WHERE f.relation_id = p.relation_id AND f.field_id = p.field_id)
     ORDER BY p.attnum;
    PERFORM set_config('synchro.activating', '', true);
    PERFORM synchro.synchro_create_projection_view(v_gen.relation_id);
    UPDATE synchro.relations SET server_only_columns = v_gen.server_only_columns, lifecycle = v_gen.lifecycle
     WHERE relation_id = v_gen.relation_id;
    UPDATE synchro.registry_generations SET state = 'superseded'
     WHERE relation_id = v_gen.relation_id AND state = 'active';
    UPDATE synchro.registry_generations SET state = 'active', activated_at = now(), activated_lsn = p_lsn
     WHERE generation = p_generation;
    UPDATE synchro.relation_capture SET status = 'active', registry_generation = p_generation, updated_at = now()
     WHERE relation_id = v_gen.relation_id;
    DELETE FROM synchro.projection_stage WHERE generation = p_generation;
    DELETE FROM synchro.pending_fields WHERE generation = p_generation;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_activate_generation(bigint, pg_lsn) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_activate_generation(bigint, pg_lsn) TO synchro_worker;

-- Manifests whose registry generation is not active yet: never served (publish.rs).
CREATE FUNCTION synchro.synchro_unactivated_manifests() RETURNS SETOF bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT g.schema_version FROM synchro.registry_generations g
     WHERE g.state IN ('pending', 'staged') AND g.schema_version IS NOT NULL
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_unactivated_manifests() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_unactivated_manifests() TO synchro_adapter, synchro_operator;

-- The recorded affected scope sets of the given Class 3 manifests: (schema_version, scope_id),
-- with a NULL scope_id for a recorded empty set. A version not returned has none recorded.
CREATE FUNCTION synchro.synchro_transition_scopes(p_versions bigint[])
RETURNS TABLE (schema_version bigint, scope_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT g.schema_version, s.scope_id
      FROM synchro.registry_generations g
      LEFT JOIN synchro.manifest_affected_scopes s ON s.schema_version = g.schema_version
     WHERE g.state IN ('active', 'superseded') AND g.change = 'reconfiguration' AND g.scopes_recorded
       AND g.schema_version = ANY (p_versions)
       -- (every generation the manifest activates must have recorded its set)
       AND NOT EXISTS (SELECT 1 FROM synchro.registry_generations o
                        WHERE o.schema_version = g.schema_version AND NOT o.scopes_recorded)
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_transition_scopes(bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_transition_scopes(bigint[]) TO synchro_adapter, synchro_operator;


-- Operator-declared local indexes (client-side SQLite indexes; spec 000 Class 2 "add a
-- declared local index"). A unique one needs a unique index the source enforces on exactly
-- those columns, so no row the server sends can violate it.
CREATE TABLE synchro.relation_indexes (
    index_id text PRIMARY KEY,
    relation_id text NOT NULL REFERENCES synchro.relations,
    name text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_]{0,62}$'),
    field_ids text[] NOT NULL CHECK (cardinality(field_ids) BETWEEN 1 AND 16),
    is_unique boolean NOT NULL,
    declared_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON synchro.relation_indexes FROM PUBLIC;

-- Declares a local index on registered columns of a synced relation; the next publish makes
-- it a Class 2 manifest. Returns {"index_id","name","field_ids","unique"}.
CREATE FUNCTION synchro.synchro_declare_index(p_schema text, p_relation text, p_name text, p_columns text[],
    p_unique boolean DEFAULT false) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_fields text[];
    v_attnums smallint[];
    v_id text := synchro.synchro_new_id('idx_');
BEGIN
    v_rel := synchro.synchro_synced_relation(p_schema, p_relation);
    IF p_name IS NULL OR p_name !~ '^[A-Za-z_][A-Za-z0-9_]{0,62}$' OR p_name ILIKE '\_synchro%'
       OR EXISTS (SELECT 1 FROM synchro.relation_indexes WHERE name = p_name) THEN
        RAISE EXCEPTION 'an index name is a new SQL identifier of letters, digits and underscores, not starting with _synchro'
            USING ERRCODE = '22023';
    END IF;
    IF p_columns IS NULL OR cardinality(p_columns) NOT BETWEEN 1 AND 16
       OR (SELECT count(DISTINCT c) FROM unnest(p_columns) c) <> cardinality(p_columns) THEN
        RAISE EXCEPTION 'an index has 1 to 16 distinct columns' USING ERRCODE = '22023';
    END IF;
    SELECT array_agg(f.field_id ORDER BY c.ord), array_agg(f.attnum ORDER BY f.attnum)
      INTO v_fields, v_attnums
      FROM unnest(p_columns) WITH ORDINALITY c(name, ord)
      JOIN synchro.fields f ON f.relation_id = v_rel.relation_id AND f.column_name = c.name;
    IF coalesce(cardinality(v_fields), 0) <> cardinality(p_columns) THEN
        RAISE EXCEPTION 'every index column must be a synced field of the relation' USING ERRCODE = '22023';
    END IF;
    IF coalesce(p_unique, false) AND NOT EXISTS (
        SELECT 1 FROM pg_index i
         WHERE i.indrelid = v_rel.physical_relation_oid AND i.indisunique AND i.indimmediate
           AND i.indpred IS NULL AND i.indexprs IS NULL
           AND (SELECT array_agg(k ORDER BY k) FROM unnest(i.indkey::smallint[]) k) = v_attnums) THEN
        RAISE EXCEPTION 'a unique local index needs a unique index of the source table on exactly those columns'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO synchro.relation_indexes (index_id, relation_id, name, field_ids, is_unique)
    VALUES (v_id, v_rel.relation_id, p_name, v_fields, coalesce(p_unique, false));
    RETURN jsonb_build_object('index_id', v_id, 'name', p_name, 'field_ids', to_jsonb(v_fields),
                              'unique', coalesce(p_unique, false));
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_declare_index(text, text, text, text[], boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_declare_index(text, text, text, text[], boolean) TO synchro_operator;

-- The synced registry as the manifest builder reads it: a relation with a reconfiguration in
-- flight (pending, or staged and not yet activated) as that generation will make it, with
-- "generation" set; a relation being retired is left out.
CREATE FUNCTION synchro.synchro_registry_snapshot() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
        'relation_id', r.relation_id, 'table_id', r.table_id, 'name', r.table_name, 'composition', r.composition,
        'schema', r.physical_schema, 'relation', r.physical_relation, 'generation', g.generation,
        'lifecycle', (SELECT coalesce(jsonb_object_agg(l.key || '_field_id', coalesce(
                             (SELECT f.field_id FROM synchro.pending_fields f
                               WHERE f.generation = g.generation AND f.column_name = l.value),
                             (SELECT f.field_id FROM synchro.fields f
                               WHERE g.generation IS NULL AND f.relation_id = r.relation_id AND f.column_name = l.value)
                         )), '{}')
                        FROM jsonb_each_text(coalesce(g.lifecycle, r.lifecycle)) l),
        'indexes', coalesce((SELECT jsonb_agg(jsonb_build_object('index_id', x.index_id, 'name', x.name,
                                 'field_ids', to_jsonb(x.field_ids), 'unique', x.is_unique) ORDER BY x.index_id)
                               FROM synchro.relation_indexes x WHERE x.relation_id = r.relation_id), '[]'),
        'fields', CASE WHEN g.generation IS NULL THEN
                      (SELECT jsonb_agg(jsonb_build_object('field_id', f.field_id, 'name', f.column_name,
                           'type', f.portable_type, 'nullable', f.nullable, 'writable', f.writable, 'is_key', f.is_key,
                           'precision', f.decimal_precision, 'scale', f.decimal_scale) ORDER BY f.field_id)
                         FROM synchro.fields f WHERE f.relation_id = r.relation_id)
                  ELSE
                      (SELECT jsonb_agg(jsonb_build_object('field_id', f.field_id, 'name', f.column_name,
                           'type', f.portable_type, 'nullable', f.nullable, 'writable', f.writable, 'is_key', f.is_key,
                           'precision', f.decimal_precision, 'scale', f.decimal_scale) ORDER BY f.field_id)
                         FROM synchro.pending_fields f WHERE f.generation = g.generation) END)
        ORDER BY r.table_id), '[]'::jsonb)
      FROM synchro.relations r
      LEFT JOIN synchro.registry_generations g ON g.relation_id = r.relation_id AND g.state IN ('pending', 'staged')
     WHERE r.kind = 'synced' AND g.change IS DISTINCT FROM 'retirement'
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_registry_snapshot() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_registry_snapshot() TO synchro_operator;
