-- synchro install 52: POST /sync/push.
-- Spec 003 "Exact Current Schema Gate and Authored Mutation Schema"; spec 000
-- "Authored-Schema Queued Mutations", "Primary Key And Replica Identity" (the key is not
-- writable).
--
-- push_batches / push_mutations are the idempotency ledger: a completed batch keeps its
-- fingerprint and outcomes; an exact replay returns them without writing. synchro_push_write
-- is one compare-and-swap write of a registered relation against source_versions
-- (31_fences), as synchro_owner (which may act for the table owner), returning the row's
-- text images before and after under the capture session's output settings, so the server
-- builds the same canonical row capture will.

CREATE TABLE synchro.push_batches (
    user_id text NOT NULL,
    client_id text NOT NULL,
    batch_id text NOT NULL,
    fingerprint text NOT NULL,
    outcomes text NOT NULL,
    completed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, client_id, batch_id)
);
REVOKE ALL ON synchro.push_batches FROM PUBLIC;

CREATE TABLE synchro.push_mutations (
    user_id text NOT NULL,
    client_id text NOT NULL,
    mutation_id text NOT NULL,
    batch_id text NOT NULL,
    outcome text NOT NULL,
    PRIMARY KEY (user_id, client_id, mutation_id)
);
REVOKE ALL ON synchro.push_mutations FROM PUBLIC;

-- The stored outcomes of a completed batch and its fingerprint, if any.
CREATE FUNCTION synchro.synchro_push_lookup(p_user_id text, p_client_id text, p_batch_id text)
RETURNS TABLE (fingerprint text, outcomes text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT fingerprint, outcomes FROM synchro.push_batches
     WHERE user_id = p_user_id AND client_id = p_client_id AND batch_id = p_batch_id
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_lookup(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_push_lookup(text, text, text) TO synchro_adapter;

-- The stored outcome of one mutation already executed in an earlier batch, if any.
CREATE FUNCTION synchro.synchro_push_mutation_outcome(p_user_id text, p_client_id text, p_mutation_id text)
RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT outcome FROM synchro.push_mutations
     WHERE user_id = p_user_id AND client_id = p_client_id AND mutation_id = p_mutation_id
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_mutation_outcome(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_push_mutation_outcome(text, text, text) TO synchro_adapter;

-- Records a completed batch (in the transaction of its writes).
CREATE FUNCTION synchro.synchro_push_record(p_user_id text, p_client_id text, p_batch_id text,
    p_fingerprint text, p_outcomes text, p_mutation_ids text[], p_mutation_outcomes text[])
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    INSERT INTO synchro.push_batches (user_id, client_id, batch_id, fingerprint, outcomes)
    VALUES (p_user_id, p_client_id, p_batch_id, p_fingerprint, p_outcomes);
    INSERT INTO synchro.push_mutations
    SELECT p_user_id, p_client_id, m.id, p_batch_id, m.outcome
      FROM unnest(p_mutation_ids, p_mutation_outcomes) AS m(id, outcome)
    ON CONFLICT DO NOTHING;
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_record(text, text, text, text, text, text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_push_record(text, text, text, text, text, text[], text[]) TO synchro_adapter;

-- One write. p_key is the key's text form, p_key_wire its wire JSON text (the projection's
-- key), p_columns the written fields' IDs and p_values their text input forms (NULL for
-- null). Returns status 'applied', 'conflict', 'not_writable', 'invalid_value' or
-- 'constraint_violation', the row's version after (or the current one on conflict), and the
-- text images of the synced fields (in attnum order) before and after. A write refused as
-- unrepresentable (12_values), or failing with another data exception caused by a pushed
-- value (jsonb's \u0000, a float4 overflow, a too long varchar), is invalid_value; integrity
-- violations are constraint_violation.
CREATE FUNCTION synchro.synchro_push_write(p_relation_id text, p_op text, p_key text, p_key_wire text,
    p_base_version text, p_columns text[], p_values text[])
RETURNS TABLE (status text, version text, pre_image text[], post_image text[])
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, synchro, pg_temp
SET TimeZone = 'UTC' SET DateStyle = 'ISO, YMD' SET IntervalStyle = 'postgres'
SET extra_float_digits = 1 SET bytea_output = 'hex' AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_key_col text;
    v_key_type text;
    v_image text;
    v_current text;
    v_pre text[];
    v_post text[];
    v_sets text := '';
    v_names text := '';
    v_vals text := '';
    v_i integer;
    v_col record;
BEGIN
    SELECT * INTO v_rel FROM synchro.relations WHERE relation_id = p_relation_id AND kind = 'synced';
    IF NOT FOUND OR NOT v_rel.push_enabled THEN
        RETURN QUERY SELECT 'not_writable'::text, NULL::text, NULL::text[], NULL::text[];
        RETURN;
    END IF;
    SELECT quote_ident(f.column_name), format_type(a.atttypid, a.atttypmod)
      INTO v_key_col, v_key_type
      FROM synchro.fields f JOIN pg_catalog.pg_attribute a
        ON a.attrelid = v_rel.physical_relation_oid AND a.attnum = f.attnum
     WHERE f.relation_id = p_relation_id AND f.is_key;
    SELECT 'ARRAY[' || string_agg(format('%I::text', f.column_name), ', ' ORDER BY f.attnum) || ']::text[]'
      INTO v_image FROM synchro.fields f WHERE f.relation_id = p_relation_id;
    -- Lock the source row (if any) and read its current image and version.
    EXECUTE format('SELECT %s FROM %I.%I WHERE %s = $1::%s FOR UPDATE', v_image,
                   v_rel.physical_schema, v_rel.physical_relation, v_key_col, v_key_type)
       INTO v_pre USING p_key;
    SELECT s.version::text INTO v_current FROM synchro.source_versions s
     WHERE s.relation_id = p_relation_id AND s.pk = p_key;
    IF v_current IS NULL THEN
        SELECT p.server_version INTO v_current FROM synchro.projection_rows p
         WHERE p.relation_id = p_relation_id AND p.pk = p_key_wire;
    END IF;
    IF (p_op = 'insert' AND v_pre IS NOT NULL)
       OR (p_op <> 'insert' AND (v_pre IS NULL OR v_current IS NULL OR v_current <> p_base_version)) THEN
        RETURN QUERY SELECT 'conflict'::text, CASE WHEN v_pre IS NULL THEN NULL ELSE v_current END, v_pre, v_pre;
        RETURN;
    END IF;
    BEGIN
        IF p_op = 'delete' THEN
            EXECUTE format('DELETE FROM %I.%I WHERE %s = $1::%s', v_rel.physical_schema,
                           v_rel.physical_relation, v_key_col, v_key_type) USING p_key;
        ELSE
            FOR v_i IN 1 .. coalesce(array_length(p_columns, 1), 0) LOOP
                SELECT quote_ident(f.column_name) AS name, format_type(a.atttypid, a.atttypmod) AS type
                  INTO v_col
                  FROM synchro.fields f JOIN pg_catalog.pg_attribute a
                    ON a.attrelid = v_rel.physical_relation_oid AND a.attnum = f.attnum
                 WHERE f.relation_id = p_relation_id AND f.field_id = p_columns[v_i] AND f.writable;
                IF NOT FOUND THEN
                    RETURN QUERY SELECT 'not_writable'::text, NULL::text, v_pre, v_pre;
                    RETURN;
                END IF;
                v_sets := v_sets || CASE WHEN v_i > 1 THEN ', ' ELSE '' END
                          || format('%s = ($2[%s])::%s', v_col.name, v_i, v_col.type);
                v_names := v_names || ', ' || v_col.name;
                v_vals := v_vals || format(', ($2[%s])::%s', v_i, v_col.type);
            END LOOP;
            IF p_op = 'insert' THEN
                EXECUTE format('INSERT INTO %I.%I (%s%s) VALUES ($1::%s%s)', v_rel.physical_schema,
                               v_rel.physical_relation, v_key_col, v_names, v_key_type, v_vals)
                  USING p_key, p_values;
            ELSIF v_sets <> '' THEN
                EXECUTE format('UPDATE %I.%I SET %s WHERE %s = $1::%s', v_rel.physical_schema,
                               v_rel.physical_relation, v_sets, v_key_col, v_key_type)
                  USING p_key, p_values;
            ELSE
                -- An update that changes nothing still takes a new version.
                EXECUTE format('UPDATE %I.%I SET %s = %s WHERE %s = $1::%s', v_rel.physical_schema,
                               v_rel.physical_relation, v_key_col, v_key_col, v_key_col, v_key_type)
                  USING p_key;
            END IF;
            EXECUTE format('SELECT %s FROM %I.%I WHERE %s = $1::%s', v_image,
                           v_rel.physical_schema, v_rel.physical_relation, v_key_col, v_key_type)
               INTO v_post USING p_key;
        END IF;
    EXCEPTION
        WHEN SQLSTATE '22SY1' OR data_exception THEN
            RETURN QUERY SELECT 'invalid_value'::text, NULL::text, v_pre, v_pre;
            RETURN;
        WHEN integrity_constraint_violation THEN
            RETURN QUERY SELECT 'constraint_violation'::text, NULL::text, v_pre, v_pre;
            RETURN;
    END;
    SELECT s.version::text INTO v_current FROM synchro.source_versions s
     WHERE s.relation_id = p_relation_id AND s.pk = p_key;
    RETURN QUERY SELECT 'applied'::text, v_current, v_pre, v_post;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_write(text, text, text, text, text, text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_push_write(text, text, text, text, text, text[], text[]) TO synchro_adapter;

-- The synced fields of a relation in attnum order, with their source type OIDs (the order
-- of synchro_push_write's images).
CREATE FUNCTION synchro.synchro_push_fields(p_relation_id text)
RETURNS TABLE (field_id text, type_oid oid)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT f.field_id, a.atttypid
      FROM synchro.fields f JOIN synchro.relations r USING (relation_id)
      JOIN pg_catalog.pg_attribute a ON a.attrelid = r.physical_relation_oid AND a.attnum = f.attnum
     WHERE f.relation_id = p_relation_id
     ORDER BY f.attnum
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_fields(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_push_fields(text) TO synchro_adapter;
