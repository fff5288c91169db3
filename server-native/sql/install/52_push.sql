-- synchro install 52: POST /sync/push.
-- Spec 003 "Exact Current Schema Gate and Authored Mutation Schema"; spec 000
-- "Authored-Schema Queued Mutations", "Primary Key And Replica Identity" (the key is not
-- writable).
--
-- push_batches / push_mutations are the idempotency ledger: a completed batch keeps its
-- fingerprint and outcomes; an exact replay returns them without writing.
-- synchro_push_write_batch makes a batch's compare-and-swap writes in one call, returning
-- each row's text images before and after; synchro_push_scopes evaluates written rows'
-- scopes for authorization, as the worker login, in one call (src/api/push/apply.rs).

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

-- The stored outcomes of those of these mutations already executed in an earlier batch.
CREATE FUNCTION synchro.synchro_push_mutation_outcomes(p_user_id text, p_client_id text, p_mutation_ids text[])
RETURNS TABLE (mutation_id text, outcome text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT m.mutation_id, m.outcome FROM synchro.push_mutations m
     WHERE m.user_id = p_user_id AND m.client_id = p_client_id AND m.mutation_id = ANY (p_mutation_ids)
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_mutation_outcomes(text, text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_push_mutation_outcomes(text, text, text[]) TO synchro_adapter;

-- Records a completed batch (in the transaction of its writes); false when the same batch
-- was recorded first by a concurrent request (the caller then rolls its writes back and
-- answers that batch's stored outcomes). ON CONFLICT waits for the other request's
-- transaction instead of failing, so the race writes no error into the server's log.
CREATE FUNCTION synchro.synchro_push_record(p_user_id text, p_client_id text, p_batch_id text,
    p_fingerprint text, p_outcomes text, p_mutation_ids text[], p_mutation_outcomes text[])
RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    WITH batch AS (
        INSERT INTO synchro.push_batches (user_id, client_id, batch_id, fingerprint, outcomes)
        VALUES (p_user_id, p_client_id, p_batch_id, p_fingerprint, p_outcomes)
        ON CONFLICT DO NOTHING
        RETURNING 1
    ), mutations AS (
        INSERT INTO synchro.push_mutations
        SELECT p_user_id, p_client_id, m.id, p_batch_id, m.outcome
          FROM unnest(p_mutation_ids, p_mutation_outcomes) AS m(id, outcome)
         WHERE EXISTS (SELECT 1 FROM batch)
        ON CONFLICT DO NOTHING
    )
    SELECT EXISTS (SELECT 1 FROM batch);
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_record(text, text, text, text, text, text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_push_record(text, text, text, text, text, text[], text[]) TO synchro_adapter;

-- The batch's plan: for each mutation, how many written fields the mutations before it
-- have (its offset into p_columns and p_values), and for the first mutation of a run the
-- last mutation of that run (0 for every other mutation).
CREATE FUNCTION synchro.synchro_push_runs(p_relation_ids text[], p_ops text[], p_keys text[],
    p_counts integer[], p_columns text[], p_discard boolean[])
RETURNS TABLE (before integer[], run_end integer[])
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, synchro, pg_temp AS $$
    WITH m AS (
        SELECT u.i::integer AS i, u.rel, u.op, u.key, coalesce(u.d, false) AS d, u.cnt,
               (sum(u.cnt) OVER (ORDER BY u.i) - u.cnt)::integer AS before
          FROM unnest(p_relation_ids, p_ops, p_keys, p_counts, p_discard) WITH ORDINALITY AS u(rel, op, key, cnt, d, i)
    ), f AS (
        SELECT m.*, p_columns[m.before + 1 : m.before + m.cnt] AS cols FROM m
    ), c AS (
        SELECT f.*, f.i = 1 OR f.d OR lag(f.d) OVER w OR f.rel IS DISTINCT FROM lag(f.rel) OVER w
                    OR f.op IS DISTINCT FROM lag(f.op) OVER w OR f.cols IS DISTINCT FROM lag(f.cols) OVER w
                    AS starts
          FROM f WINDOW w AS (ORDER BY f.i)
    ), b AS (
        SELECT c.*, count(*) FILTER (WHERE c.starts) OVER (ORDER BY c.i) AS run FROM c
    ), r AS (
        SELECT b.run, min(b.i) AS first, max(b.i) AS last,
               count(*) >= 2 AND count(DISTINCT b.key) = count(*) AND NOT bool_or(b.d)
               AND min(b.op) IN ('insert', 'update', 'delete') AND (min(b.op) = 'delete' OR min(b.cnt) > 0) AS bulk
          FROM b GROUP BY b.run
    )
    SELECT array_agg(b.before ORDER BY b.i),
           array_agg(CASE WHEN r.bulk AND b.i = r.first THEN r.last ELSE 0 END ORDER BY b.i)
      FROM b JOIN r USING (run);
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_runs(text[], text[], text[], integer[], text[], boolean[]) FROM PUBLIC;

-- What a batch's writes of one registered relation need, built once per relation: its
-- table, key column and type, the key predicate, the synced fields' text image (attnum
-- order), the statements reading it (and locking the row), and the writable fields' IDs,
-- quoted column names and value expressions (a format() template whose %s is the value's
-- text parameter: a cast to the column's type, through synchro_array_input for an array).
-- NULL for a relation not synced or not open to push.
CREATE TYPE synchro.push_target AS (
    table_name text, key_col text, key_type text, where_clause text, image text,
    read_sql text, lock_sql text, ids text[], names text[], exprs text[]);

-- The array literal of a pushed json array value: elements in the wire form of the element's
-- portable type (p_element), nested arrays as dimensions, JSON null as NULL. Any other shape,
-- or an element of another JSON type, raises 22023 (a data exception: the write's
-- invalid_value); PostgreSQL's own cast judges the rest (dimensions, element values).
CREATE FUNCTION synchro.synchro_array_input(p_value text, p_element text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_json jsonb := p_value::jsonb;
BEGIN
    IF jsonb_typeof(v_json) <> 'array' THEN
        RAISE EXCEPTION 'an array field''s value is not a JSON array' USING ERRCODE = '22023';
    END IF;
    RETURN synchro.synchro_array_literal(v_json, p_element, 1);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_array_input(text, text) FROM PUBLIC;

-- synchro_array_input of one JSON value (an array at dimension p_depth, or an element).
-- PostgreSQL arrays have at most 6 dimensions: a deeper one raises 22023 here rather than
-- program_limit_exceeded in the cast.
CREATE FUNCTION synchro.synchro_array_literal(p_value jsonb, p_element text, p_depth integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_kind text := jsonb_typeof(p_value);
    v_text text;
BEGIN
    IF v_kind = 'array' AND p_depth > 6 THEN
        RAISE EXCEPTION 'an array has more than 6 dimensions' USING ERRCODE = '22023';
    ELSIF v_kind = 'array' THEN
        RETURN '{' || coalesce((SELECT string_agg(synchro.synchro_array_literal(e.value, p_element, p_depth + 1), ','
                                                  ORDER BY e.n)
                                  FROM jsonb_array_elements(p_value) WITH ORDINALITY AS e(value, n)), '') || '}';
    ELSIF v_kind = 'null' THEN
        RETURN 'NULL';
    ELSIF v_kind IS DISTINCT FROM (CASE WHEN p_element IN ('int', 'float') THEN 'number'
                                       WHEN p_element = 'boolean' THEN 'boolean' ELSE 'string' END) THEN
        RAISE EXCEPTION 'an array element is not a wire value of its type' USING ERRCODE = '22023';
    END IF;
    v_text := p_value #>> '{}';
    IF p_element = 'bytes' THEN
        v_text := '\x' || encode(decode(translate(v_text, '-_', '+/') || repeat('=', (4 - length(v_text) % 4) % 4),
                                        'base64'), 'hex');
    END IF;
    RETURN '"' || replace(replace(v_text, '\', '\\'), '"', '\"') || '"';
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_array_literal(jsonb, text, integer) FROM PUBLIC;

CREATE FUNCTION synchro.synchro_push_target(p_relation_id text) RETURNS synchro.push_target
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    t synchro.push_target;
BEGIN
    SELECT * INTO v_rel FROM synchro.relations r WHERE r.relation_id = p_relation_id AND r.kind = 'synced';
    IF NOT FOUND OR NOT v_rel.push_enabled THEN
        RETURN NULL;
    END IF;
    t.table_name := format('%I.%I', v_rel.physical_schema, v_rel.physical_relation);
    SELECT quote_ident(f.column_name), format_type(a.atttypid, a.atttypmod)
      INTO t.key_col, t.key_type
      FROM synchro.fields f JOIN pg_catalog.pg_attribute a
        ON a.attrelid = v_rel.physical_relation_oid AND a.attnum = f.attnum
     WHERE f.relation_id = p_relation_id AND f.is_key;
    t.where_clause := format('%s = $1::%s', t.key_col, t.key_type);
    -- Each value through its type's output function, as pgoutput and the bootstrap copy read it
    -- (a cast to text differs: char(n) loses its padding, a boolean is spelled out).
    SELECT 'ARRAY[' || string_agg(format('CASE WHEN t.%1$I IS NULL THEN NULL ELSE format(''%%s'', t.%1$I) END',
                                         f.column_name), ', ' ORDER BY f.attnum) || ']::text[]'
      INTO t.image FROM synchro.fields f WHERE f.relation_id = p_relation_id;
    t.read_sql := 'SELECT ' || t.image || ' FROM ' || t.table_name || ' t WHERE t.' || t.where_clause;
    t.lock_sql := t.read_sql || ' FOR UPDATE';
    SELECT array_agg(f.field_id), array_agg(quote_ident(f.column_name)),
           array_agg(CASE WHEN v.source LIKE 'array %'
                          THEN format('synchro.synchro_array_input(%%s, %L)::%s', split_part(v.source, ' ', 2),
                                      replace(format_type(a.atttypid, a.atttypmod), '%', '%%'))
                          -- A timestamp read in a zone: the pushed UTC instant's local time there.
                          WHEN v.source LIKE '% %'
                          THEN format('((%%s)::timestamptz AT TIME ZONE %L)::%s',
                                      replace(split_part(v.source, ' ', 2), '%', '%%'),
                                      replace(format_type(a.atttypid, a.atttypmod), '%', '%%'))
                          ELSE format('(%%s)::%s', replace(format_type(a.atttypid, a.atttypmod), '%', '%%')) END)
      INTO t.ids, t.names, t.exprs
      FROM synchro.fields f JOIN pg_catalog.pg_attribute a
        ON a.attrelid = v_rel.physical_relation_oid AND a.attnum = f.attnum
     CROSS JOIN LATERAL (SELECT synchro.synchro_value_source(a.atttypid, a.atttypmod,
                             synchro.synchro_column_zone(v_rel.timestamp_zones, f.column_name)) AS source) v
     WHERE f.relation_id = p_relation_id AND f.writable;
    RETURN t;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_target(text) FROM PUBLIC;

-- The status of a write the database refused: 'invalid_value:<field IDs>' when values of
-- the write are refused by their column's type or domain on their own (a label outside an
-- enum, a domain's CHECK, text no array or interval reads), naming those fields; else
-- p_status. Each value is cast alone in a subtransaction of its own.
CREATE FUNCTION synchro.synchro_push_refusal(p_status text, t synchro.push_target, p_columns text[],
    p_values text[]) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_refused text[] := '{}';
    v_j integer;
BEGIN
    FOR v_k IN 1 .. coalesce(cardinality(p_columns), 0) LOOP
        v_j := array_position(t.ids, p_columns[v_k]);
        CONTINUE WHEN v_j IS NULL OR p_values[v_k] IS NULL;
        BEGIN
            EXECUTE 'SELECT ' || format(t.exprs[v_j], '$1') USING p_values[v_k];
        EXCEPTION WHEN data_exception OR integrity_constraint_violation THEN
            v_refused := v_refused || p_columns[v_k];
        END;
    END LOOP;
    RETURN CASE WHEN cardinality(v_refused) > 0
                THEN 'invalid_value:' || array_to_string(v_refused, ',') ELSE p_status END;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_refusal(text, synchro.push_target, text[], text[]) FROM PUBLIC;

-- One run of a batch executed set-based (see synchro_push_write_batch) in a subtransaction:
-- the run's keys, key wires, base versions and value offsets, its shared operation and
-- written fields (p_columns, p_count of them) and the batch's values. One row per mutation
-- of the run, in order; no row when a statement of the run failed (the run is undone, and
-- the caller executes it one mutation at a time).
CREATE FUNCTION synchro.synchro_push_write_run(t synchro.push_target, p_relation_id text,
    p_op text, p_keys text[], p_key_wires text[], p_base_versions text[], p_offsets integer[],
    p_count integer, p_columns text[], p_values text[])
RETURNS TABLE (status text, version text, pre_image text[], post_image text[])
LANGUAGE plpgsql
SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_len integer := cardinality(p_keys);
    v_j integer;
    v_sets text := '';
    v_cols text := '';
    v_vals text := '';
    -- The run's results by position in the run (images as array text).
    v_statuses text[];
    v_versions text[];
    v_pres text[];
    v_posts text[];
    v_ok_keys text[] := '{}';
    v_ok_offsets integer[] := '{}';
    v_ok_ords integer[] := '{}';
    v_count integer := 0;
    v_query text;
    v_r record;
BEGIN
    BEGIN
        FOR v_k IN 1 .. p_count LOOP
            v_j := array_position(t.ids, p_columns[v_k]);
            IF v_j IS NULL THEN
                -- A field not writable: each mutation gets its own outcome.
                RAISE SQLSTATE 'SYRB2';
            END IF;
            v_sets := v_sets || CASE WHEN v_k > 1 THEN ', ' ELSE '' END
                      || format('%s = %s', t.names[v_j], format(t.exprs[v_j], format('$3[u.o + %s]', v_k)));
            v_cols := v_cols || ', ' || t.names[v_j];
            v_vals := v_vals || ', ' || format(t.exprs[v_j], format('$3[u.o + %s]', v_k));
        END LOOP;
        v_statuses := array_fill(NULL::text, ARRAY[v_len]);
        v_pres := v_statuses;
        v_posts := v_statuses;
        -- Lock the rows that exist and read their images.
        FOR v_r IN EXECUTE format(
            'SELECT u.i::integer AS i, x.img
               FROM (SELECT t.%s AS k, %s::text AS img FROM %s t
                      WHERE t.%s = ANY ($1::%s[]) FOR UPDATE) AS x
               JOIN unnest($1::text[]) WITH ORDINALITY AS u(k, i) ON x.k = u.k::%s',
            t.key_col, t.image, t.table_name, t.key_col, t.key_type, t.key_type)
          USING p_keys LOOP
            v_pres[v_r.i] := v_r.img;
        END LOOP;
        -- Key lookups (a join could hash every version of the relation).
        SELECT array_agg(coalesce(
                   (SELECT s.version::text FROM synchro.source_versions s
                     WHERE s.relation_id = p_relation_id AND s.pk = u.k),
                   (SELECT p.server_version FROM synchro.projection_rows p
                     WHERE p.relation_id = p_relation_id AND p.pk = u.kw)) ORDER BY u.i)
          INTO v_versions
          FROM unnest(p_keys, p_key_wires) WITH ORDINALITY AS u(k, kw, i);
        FOR v_k IN 1 .. v_len LOOP
            -- The compare of the one-at-a-time path, word for word.
            IF (p_op = 'insert' AND v_pres[v_k] IS NOT NULL)
               OR (p_op <> 'insert' AND (v_pres[v_k] IS NULL OR v_versions[v_k] IS NULL
                   OR v_versions[v_k] <> p_base_versions[v_k])) THEN
                v_statuses[v_k] := 'conflict';
                IF v_pres[v_k] IS NULL THEN v_versions[v_k] := NULL; END IF;
                v_posts[v_k] := v_pres[v_k];
            ELSE
                v_statuses[v_k] := 'applied';
                v_ok_keys := v_ok_keys || p_keys[v_k];
                v_ok_offsets := v_ok_offsets || p_offsets[v_k];
                v_ok_ords := v_ok_ords || v_k;
            END IF;
        END LOOP;
        IF cardinality(v_ok_keys) > 0 THEN
            v_query := CASE p_op
                WHEN 'update' THEN format(
                    'UPDATE %s t SET %s FROM unnest($1::text[], $2::integer[], $4::integer[]) AS u(k, o, i)
                      WHERE t.%s = u.k::%s RETURNING u.i, %s::text AS img',
                    t.table_name, v_sets, t.key_col, t.key_type, t.image)
                WHEN 'insert' THEN format(
                    'WITH w AS (INSERT INTO %s AS t (%s%s)
                                SELECT u.k::%s%s FROM unnest($1::text[], $2::integer[]) AS u(k, o)
                                RETURNING t.%s AS k, %s::text AS img)
                     SELECT u.i, w.img FROM w JOIN unnest($1::text[], $4::integer[]) AS u(k, i)
                         ON w.k = u.k::%s',
                    t.table_name, t.key_col, v_cols, t.key_type, v_vals, t.key_col, t.image, t.key_type)
                ELSE format(
                    'DELETE FROM %s t USING unnest($1::text[], $4::integer[]) AS u(k, i)
                      WHERE t.%s = u.k::%s RETURNING u.i, NULL::text AS img',
                    t.table_name, t.key_col, t.key_type)
                END;
            FOR v_r IN EXECUTE v_query USING v_ok_keys, v_ok_offsets, p_values, v_ok_ords LOOP
                v_posts[v_r.i] := v_r.img;
                v_count := v_count + 1;
            END LOOP;
            IF v_count <> cardinality(v_ok_keys) THEN
                RAISE SQLSTATE 'SYRB2';
            END IF;
            FOR v_r IN SELECT u.i, (SELECT s.version::text FROM synchro.source_versions s
                                     WHERE s.relation_id = p_relation_id AND s.pk = u.k) AS v
                         FROM unnest(v_ok_keys, v_ok_ords) AS u(k, i) LOOP
                v_versions[v_r.i] := v_r.v;
            END LOOP;
        END IF;
    EXCEPTION
        WHEN SQLSTATE 'SYRB2' OR SQLSTATE '22SY1' OR data_exception OR integrity_constraint_violation THEN
            RETURN;
    END;
    -- (Rows are returned only once the run's subtransaction succeeded.)
    FOR v_k IN 1 .. v_len LOOP
        status := v_statuses[v_k];
        version := v_versions[v_k];
        pre_image := v_pres[v_k]::text[];
        post_image := v_posts[v_k]::text[];
        RETURN NEXT;
    END LOOP;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_write_run(synchro.push_target, text, text, text[], text[], text[], integer[], integer, text[], text[]) FROM PUBLIC;

-- A batch's compare-and-swap writes of registered relations against source_versions
-- (31_fences), in order, as synchro_owner (which may act for the table owner). For mutation
-- i: p_keys[i] is the key's text form, p_key_wires[i] its wire JSON text (the projection's
-- key), and its written fields' IDs and text input forms (NULL for null) are the next
-- p_counts[i] entries of p_columns and p_values. One row per mutation, in order: status
-- 'applied', 'conflict', 'not_writable', 'invalid_value' or 'constraint_violation', the
-- row's version after (or the current one on conflict), and the text images of the synced
-- fields (in attnum order) before and after, under the capture session's output settings, so
-- the server builds the same canonical row capture will. A write refused as unrepresentable
-- (12_values), or failing with another data exception caused by a pushed value (jsonb's
-- \u0000, a float4 overflow, a too long varchar), is invalid_value; integrity violations are
-- constraint_violation; an error before the write (reading the row) is raised. A mutation
-- not applied, or applied with p_discard[i] true, is rolled back with its row lock, as a
-- savepoint would be; its result row is still returned. The caller decides afterwards (push
-- authorization) which applied writes it keeps, and calls again with its decision when that
-- differs (src/api/push/apply.rs).
--
-- Each mutation runs in a subtransaction of its own, except a run: two or more consecutive
-- mutations of one relation with the same operation and written fields, distinct keys and
-- none to discard, which is executed set-based in one subtransaction (synchro_push_write_run:
-- one locking read, one version read, one INSERT, UPDATE or DELETE of the rows that pass the
-- compare, one version read after). Its outcomes are those of its mutations one at a time: the keys are
-- distinct, so no mutation of the run reads another's row. If any statement of the run
-- fails (a pushed value refused, a constraint), the run is undone and executed one mutation
-- at a time, which gives each its own outcome. The one difference: a conflicting
-- mutation's row lock taken by the run's read is kept until the batch ends. set_based
-- says which way a mutation went (for tests and diagnosis).
CREATE FUNCTION synchro.synchro_push_write_batch(p_relation_ids text[], p_ops text[], p_keys text[],
    p_key_wires text[], p_base_versions text[], p_counts integer[], p_columns text[], p_values text[],
    p_discard boolean[])
RETURNS TABLE (status text, version text, pre_image text[], post_image text[], set_based boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, synchro, pg_temp
SET TimeZone = 'UTC' SET DateStyle = 'ISO, YMD' SET IntervalStyle = 'postgres'
SET extra_float_digits = 1 SET bytea_output = 'hex' AS $$
DECLARE
    v_n integer := coalesce(array_length(p_ops, 1), 0);
    -- The fields of the mutations before each one, and the last mutation of the run each
    -- first mutation of a run starts (0 for every other mutation).
    v_before integer[];
    v_run_end integer[];
    v_relation text;
    v_t synchro.push_target;
    v_found boolean;
    v_i integer := 1;
    v_e integer;
    v_from integer;
    v_to integer;
    v_j integer;
    v_key text;
    v_op text;
    v_current text;
    v_pre text[];
    v_post text[];
    v_status text;
    v_sets text;
    v_cols text;
    v_vals text;
    v_writing boolean;
    v_detail text;
    v_done boolean;
    v_r record;
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    SELECT r.before, r.run_end INTO v_before, v_run_end
      FROM synchro.synchro_push_runs(p_relation_ids, p_ops, p_keys, p_counts, p_columns, p_discard) r;

    WHILE v_i <= v_n LOOP
        IF v_i = 1 OR p_relation_ids[v_i] IS DISTINCT FROM v_relation THEN
            -- The relation's statements, once per run of its mutations.
            v_relation := p_relation_ids[v_i];
            v_t := synchro.synchro_push_target(v_relation);
            v_found := v_t.table_name IS NOT NULL;
        END IF;
        v_e := v_run_end[v_i];
        v_done := false;
        IF v_found AND v_e > v_i THEN
            FOR v_r IN SELECT * FROM synchro.synchro_push_write_run(v_t, v_relation, p_ops[v_i],
                           p_keys[v_i:v_e], p_key_wires[v_i:v_e], p_base_versions[v_i:v_e],
                           v_before[v_i:v_e], p_counts[v_i],
                           p_columns[v_before[v_i] + 1 : v_before[v_i] + p_counts[v_i]], p_values) LOOP
                status := v_r.status;
                version := v_r.version;
                pre_image := v_r.pre_image;
                post_image := v_r.post_image;
                set_based := true;
                RETURN NEXT;
                v_done := true;
            END LOOP;
        END IF;
        IF v_done THEN
            v_i := v_e + 1;
            CONTINUE;
        END IF;
        -- One mutation in a subtransaction of its own.
        v_from := v_before[v_i] + 1;
        v_to := v_before[v_i] + p_counts[v_i];
        v_key := p_keys[v_i];
        v_op := p_ops[v_i];
        v_status := NULL;
        v_current := NULL;
        v_pre := NULL;
        v_post := NULL;
        v_writing := false;
        IF NOT v_found THEN
            v_status := 'not_writable';
        ELSE
            BEGIN
                -- Lock the source row (if any) and read its current image and version.
                EXECUTE v_t.lock_sql INTO v_pre USING v_key;
                SELECT s.version::text INTO v_current FROM synchro.source_versions s
                 WHERE s.relation_id = v_relation AND s.pk = v_key;
                IF v_current IS NULL THEN
                    SELECT p.server_version INTO v_current FROM synchro.projection_rows p
                     WHERE p.relation_id = v_relation AND p.pk = p_key_wires[v_i];
                END IF;
                IF (v_op = 'insert' AND v_pre IS NOT NULL)
                   OR (v_op <> 'insert' AND (v_pre IS NULL OR v_current IS NULL OR v_current <> p_base_versions[v_i])) THEN
                    v_status := 'conflict';
                    IF v_pre IS NULL THEN v_current := NULL; END IF;
                    v_post := v_pre;
                ELSE
                    v_sets := '';
                    v_cols := '';
                    v_vals := '';
                    FOR v_k IN v_from .. v_to LOOP
                        v_j := array_position(v_t.ids, p_columns[v_k]);
                        IF v_j IS NULL THEN
                            v_status := 'not_writable';
                            v_current := NULL;
                            v_post := v_pre;
                            EXIT;
                        END IF;
                        v_sets := v_sets || CASE WHEN v_k > v_from THEN ', ' ELSE '' END
                                  || format('%s = %s', v_t.names[v_j],
                                            format(v_t.exprs[v_j], format('$2[%s]', v_k - v_from + 1)));
                        v_cols := v_cols || ', ' || v_t.names[v_j];
                        v_vals := v_vals || ', ' || format(v_t.exprs[v_j], format('$2[%s]', v_k - v_from + 1));
                    END LOOP;
                    IF v_status IS NULL THEN
                        v_writing := true;
                        IF v_op = 'delete' THEN
                            EXECUTE 'DELETE FROM ' || v_t.table_name || ' WHERE ' || v_t.where_clause USING v_key;
                        ELSE
                            IF v_op = 'insert' THEN
                                EXECUTE format('INSERT INTO %s (%s%s) VALUES ($1::%s%s)', v_t.table_name,
                                               v_t.key_col, v_cols, v_t.key_type, v_vals)
                                  USING v_key, p_values[v_from:v_to];
                            ELSIF v_sets <> '' THEN
                                EXECUTE 'UPDATE ' || v_t.table_name || ' SET ' || v_sets || ' WHERE ' || v_t.where_clause
                                  USING v_key, p_values[v_from:v_to];
                            ELSE
                                -- An update that changes nothing still takes a new version.
                                EXECUTE format('UPDATE %s SET %s = %s WHERE %s', v_t.table_name, v_t.key_col,
                                               v_t.key_col, v_t.where_clause)
                                  USING v_key;
                            END IF;
                            EXECUTE v_t.read_sql INTO v_post USING v_key;
                        END IF;
                        SELECT s.version::text INTO v_current FROM synchro.source_versions s
                         WHERE s.relation_id = v_relation AND s.pk = v_key;
                        v_status := 'applied';
                    END IF;
                END IF;
                IF v_status <> 'applied' OR p_discard[v_i] THEN
                    RAISE SQLSTATE 'SYRB1';
                END IF;
            EXCEPTION
                WHEN SQLSTATE 'SYRB1' THEN
                    NULL;
                WHEN SQLSTATE '22SY1' THEN
                    IF NOT v_writing THEN RAISE; END IF;
                    -- The fence names the fields whose values no portable type holds.
                    GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
                    v_status := coalesce('unrepresentable:' || (SELECT string_agg(f, ',')
                        FROM jsonb_array_elements_text(v_detail::jsonb #> '{error,field_ids}') AS f), 'invalid_value');
                    v_current := NULL; v_post := v_pre;
                WHEN data_exception THEN
                    IF NOT v_writing THEN RAISE; END IF;
                    v_status := synchro.synchro_push_refusal('invalid_value', v_t, p_columns[v_from:v_to],
                                                             p_values[v_from:v_to]);
                    v_current := NULL; v_post := v_pre;
                WHEN integrity_constraint_violation THEN
                    IF NOT v_writing THEN RAISE; END IF;
                    v_status := synchro.synchro_push_refusal('constraint_violation', v_t, p_columns[v_from:v_to],
                                                             p_values[v_from:v_to]);
                    v_current := NULL; v_post := v_pre;
            END;
        END IF;
        status := v_status;
        version := v_current;
        pre_image := v_pre;
        post_image := v_post;
        set_based := false;
        RETURN NEXT;
        v_i := v_i + 1;
    END LOOP;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_write_batch(text[], text[], text[], text[], text[], integer[], text[], text[], boolean[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_push_write_batch(text[], text[], text[], text[], text[], integer[], text[], text[], boolean[]) TO synchro_adapter;

-- The fields of a relation's rows its membership function reads, from the dependencies
-- PostgreSQL records for its SQL-standard body (40_membership registers no other kind): the
-- columns of the relation's own projection view it names. NULL when it names the view as a
-- whole (every field may matter). Other projection views it reads are other relations'.
CREATE FUNCTION synchro.synchro_rule_read_fields(p_relation_id text, p_function oid)
RETURNS text[]
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    WITH v AS (
        SELECT to_regclass(format('synchro_projection.%I', r.physical_schema || '.' || r.physical_relation)) AS oid
          FROM synchro.relations r WHERE r.relation_id = p_relation_id
    ), d AS (
        SELECT d.refobjsubid FROM pg_depend d, v
         WHERE d.classid = 'pg_proc'::regclass AND d.objid = p_function
           AND d.refclassid = 'pg_class'::regclass AND d.refobjid = v.oid
    )
    SELECT CASE WHEN EXISTS (SELECT 1 FROM d WHERE d.refobjsubid = 0) OR (SELECT oid FROM v) IS NULL THEN NULL
                ELSE coalesce((SELECT array_agg(f.field_id ORDER BY f.field_id)
                                 FROM d, v, pg_attribute a, synchro.fields f
                                WHERE a.attrelid = v.oid AND a.attnum = d.refobjsubid
                                  AND f.relation_id = p_relation_id AND f.column_name = a.attname), '{}') END
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rule_read_fields(text, oid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rule_read_fields(text, oid) TO synchro_worker;

-- The fields the live membership function of a relation reads (synchro_rule_read_fields);
-- NULL without a live rule or when any field may matter. Push gives an after-image that
-- agrees with its before-image in all of them the before-image's scopes.
CREATE FUNCTION synchro.synchro_push_rule_reads(p_relation_id text)
RETURNS text[]
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT synchro.synchro_rule_read_fields(m.relation_id, m.function_oid)
      FROM synchro.membership_functions m WHERE m.relation_id = p_relation_id AND m.live
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_rule_reads(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_push_rule_reads(text) TO synchro_adapter;

-- The scopes the live membership function of each row's relation gives it (empty without a
-- rule), each row evaluated as if alone: placed in the projection, evaluated as the
-- function's owner (never synchro's roles, spec 003). A row equal to its projection row in
-- every field the function reads (synchro_rule_read_fields; every field when unknown) needs
-- no placement, so all such rows of a relation are evaluated in one query. Any other
-- row is placed (as synchro_worker) and evaluated in a subtransaction that is then rolled
-- back, so no projection row lock is held across rows (the capture worker cannot deadlock
-- with a push). A membership function reads its own row and its declared dependency
-- relations (41_dependencies; capture evaluates it the same way), so rows of a relation
-- without a self-impact declaration are placed together, each key once per round, and
-- evaluated in one query per round: each evaluation still sees only its own placed row. A
-- relation with a self-impact declaration (its function reads sibling rows) has each row
-- placed and evaluated alone. One result per row, as (ordinal, scopes), NULL scopes
-- omitted. The adapter calls it (spec 001: push is identity-bearing, and the worker login
-- has no client-facing grant) in a transaction it rolls back; each function runs as its
-- owner through its evaluator (synchro_eval, 40_membership), never as synchro_owner. The
-- caller gets 'function_unavailable', 'definition_changed' or 'insufficient_privilege'
-- (SQLSTATE 55000) for a rule capture would not evaluate either.
CREATE FUNCTION synchro.synchro_push_scopes(p_relation_ids text[], p_key_wires text[], p_keys text[],
    p_rows text[])
RETURNS TABLE (ord integer, scopes text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_relation text;
    v_function text;
    v_key_type text;
    v_unusable text;
    v_same integer[];
    v_same_keys text[];
    v_row record;
    v_scopes text[];
    v_round record;
    v_ords integer[];
    v_texts text[];
    v_function_oid oid;
    v_read text[];
    v_is integer[];
    v_kws text[];
    v_keys text[];
    v_rows text[];
    v_sames boolean[];
BEGIN
    FOR v_relation IN SELECT DISTINCT r FROM unnest(p_relation_ids) AS r LOOP
        v_function := NULL;
        SELECT m.function_oid, 'synchro_eval.m_' || m.function_oid, r.primary_key_type::regtype::text,
               -- (this function, SECURITY DEFINER, calls the evaluator as synchro_owner)
               synchro.synchro_rule_unusable(m.function_oid, m.definition_sha256, 'm', 'synchro_owner')
          INTO v_function_oid, v_function, v_key_type, v_unusable
          FROM synchro.membership_functions m JOIN synchro.relations r USING (relation_id)
         WHERE r.relation_id = v_relation AND m.live;
        IF v_unusable IS NOT NULL THEN
            -- (v_unusable holds why the rule may not be evaluated: never anything but its pinned
            -- definition, through the evaluator recorded with it.)
            RAISE EXCEPTION 'membership rule unusable: %', v_unusable USING ERRCODE = '55000';
        END IF;
        IF v_function IS NULL AND EXISTS (SELECT 1 FROM synchro.membership_functions m
                                           WHERE m.relation_id = v_relation AND NOT m.live) THEN
            -- A first rule still staging: the row's scopes are not known yet (a moment after
            -- registration). Retryable (push answers 503), never a row in no scope, which
            -- would refuse the write for good.
            RAISE EXCEPTION 'the membership rule is still staging' USING ERRCODE = '55000';
        END IF;
        IF v_function IS NULL THEN
            -- No membership rule: the row would be in no scope.
            RETURN QUERY SELECT u.i::integer, '{}'::text[]
                           FROM unnest(p_relation_ids) WITH ORDINALITY AS u(rel, i)
                          WHERE u.rel = v_relation;
            CONTINUE;
        END IF;
        -- The rows equal to their projection rows in every field the function reads (in
        -- every field, when that is not known), evaluated together, once per key: the
        -- function gives them what it gives the projection row.
        v_read := synchro.synchro_rule_read_fields(v_relation, v_function_oid);
        -- The relation's probes, in order, each with whether it needs a placement.
        SELECT coalesce(array_agg(x.i ORDER BY x.i), '{}'), coalesce(array_agg(x.kw ORDER BY x.i), '{}'),
               coalesce(array_agg(x.key ORDER BY x.i), '{}'), coalesce(array_agg(x.row ORDER BY x.i), '{}'),
               coalesce(array_agg(x.same ORDER BY x.i), '{}')
          INTO v_is, v_kws, v_keys, v_rows, v_sames
          FROM (SELECT u.i::integer AS i, u.kw, u.key, u.row,
                       -- A key lookup per row (a join could scan every projection row).
                       EXISTS (SELECT 1 FROM synchro.projection_rows x
                                WHERE x.relation_id = u.rel AND x.pk = u.kw
                                  AND (u.row = x.row_json
                                       OR (v_read IS NOT NULL AND coalesce(
                                           (SELECT bool_and((j.a -> f)::text IS NOT DISTINCT FROM (j.b -> f)::text)
                                              FROM (SELECT u.row::json AS a, x.row_json::json AS b) AS j,
                                                   unnest(v_read) AS f), true)))) AS same
                  FROM unnest(p_relation_ids, p_key_wires, p_keys, p_rows) WITH ORDINALITY AS u(rel, kw, key, row, i)
                 WHERE u.rel = v_relation) x;
        SELECT coalesce(array_agg(x.i), '{}'), coalesce(array_agg(x.key), '{}') INTO v_same, v_same_keys
          FROM unnest(v_is, v_keys, v_sames) AS x(i, key, same) WHERE x.same;
        RETURN QUERY EXECUTE format(
            -- One call of the batch evaluator for the distinct keys (it evaluates the rule
            -- once per key, results numbered by the key's position).
            'WITH k AS (SELECT array_agg(DISTINCT k) AS ks FROM unnest($2) AS k),
                  r AS (SELECT f.n, f.scope FROM k, %s(k.ks::%s[]) AS f),
                  e AS (SELECT u.k, coalesce(array_remove(array_agg(r.scope), NULL), ''{}'') AS s
                          FROM k, unnest(k.ks) WITH ORDINALITY AS u(k, n) LEFT JOIN r ON r.n = u.n
                         GROUP BY u.k)
             SELECT a.i, e.s FROM unnest($1, $2) AS a(i, k) JOIN e ON e.k = a.k', v_function, v_key_type)
          USING v_same, v_same_keys;
        IF NOT EXISTS (SELECT 1 FROM synchro.membership_dependencies d
                        WHERE d.target_relation_id = v_relation AND d.dependency_relation_id = v_relation) THEN
            -- Every other row placed with the others of its round, evaluated in one query.
            FOR v_round IN
                SELECT array_agg(x.i ORDER BY x.i) AS ords, array_agg(x.kw ORDER BY x.i) AS kws,
                       array_agg(x.key ORDER BY x.i) AS keys, array_agg(x.row ORDER BY x.i) AS rows
                  FROM (SELECT u.i, u.kw, u.key, u.row, row_number() OVER (PARTITION BY u.kw ORDER BY u.i) AS n
                          FROM unnest(v_is, v_kws, v_keys, v_rows, v_sames) AS u(i, kw, key, row, same)
                         WHERE NOT u.same) x
                 GROUP BY x.n ORDER BY x.n LOOP
                BEGIN
                    INSERT INTO synchro.projection_rows (relation_id, pk, row_json, server_version)
                    SELECT v_relation, r.kw, r.row, '0' FROM unnest(v_round.kws, v_round.rows) AS r(kw, row)
                    ON CONFLICT (relation_id, pk) DO UPDATE SET row_json = EXCLUDED.row_json;
                    EXECUTE format(
                        'SELECT array_agg(a.i), array_agg(a.s) FROM (
                           SELECT a.i, coalesce(array_remove(array_agg(r.scope), NULL), ''{}'')::text AS s
                             FROM unnest($1, $2) WITH ORDINALITY AS a(i, k, n)
                             LEFT JOIN %s($2::%s[]) AS r ON r.n = a.n
                            GROUP BY a.i) a', v_function, v_key_type)
                      INTO v_ords, v_texts USING v_round.ords, v_round.keys;
                    -- Undo the placement: the results survive the rollback.
                    RAISE SQLSTATE 'SYRB1';
                EXCEPTION WHEN SQLSTATE 'SYRB1' THEN
                    NULL;
                END;
                RETURN QUERY SELECT x.o, x.t::text[] FROM unnest(v_ords, v_texts) AS x(o, t);
            END LOOP;
            CONTINUE;
        END IF;
        -- Every other row placed and evaluated on its own.
        FOR v_row IN SELECT u.i, u.kw, u.key, u.row
                       FROM unnest(v_is, v_kws, v_keys, v_rows, v_sames) AS u(i, kw, key, row, same)
                      WHERE NOT u.same LOOP
            BEGIN
                INSERT INTO synchro.projection_rows (relation_id, pk, row_json, server_version)
                VALUES (v_relation, v_row.kw, v_row.row, '0')
                ON CONFLICT (relation_id, pk) DO UPDATE SET row_json = EXCLUDED.row_json;
                EXECUTE format('SELECT array_remove(array_agg(r.scope), NULL) FROM %s(ARRAY[$1::%s]) AS r',
                               v_function, v_key_type)
                  INTO v_scopes USING v_row.key;
                -- Undo the placement: v_scopes survives the rollback.
                RAISE SQLSTATE 'SYRB1';
            EXCEPTION WHEN SQLSTATE 'SYRB1' THEN
                NULL;
            END;
            ord := v_row.i;
            scopes := coalesce(v_scopes, '{}');
            RETURN NEXT;
        END LOOP;
    END LOOP;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_scopes(text[], text[], text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_push_scopes(text[], text[], text[], text[]) TO synchro_adapter;

-- The synced fields of a relation in attnum order (the order of synchro_push_write_batch's
-- images), with how their text is read (synchro_value_source).
CREATE FUNCTION synchro.synchro_push_fields(p_relation_id text)
RETURNS TABLE (field_id text, source text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT f.field_id, synchro.synchro_value_source(a.atttypid, a.atttypmod,
                                                    synchro.synchro_column_zone(r.timestamp_zones, f.column_name))
      FROM synchro.fields f JOIN synchro.relations r USING (relation_id)
      JOIN pg_catalog.pg_attribute a ON a.attrelid = r.physical_relation_oid AND a.attnum = f.attnum
     WHERE f.relation_id = p_relation_id
     ORDER BY f.attnum
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_fields(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_push_fields(text) TO synchro_adapter;
