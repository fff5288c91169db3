-- synchro schema, version 12: dependency relations and impact functions (spec 003
-- "Deterministic Scope Membership").
--
-- A capture_dependency relation is captured into its own projection (every column with a
-- portable type; its view exposes them) so membership functions can read it. Each
-- dependency of a synced target relation has a registered impact function
--   impact(p_old_row jsonb, p_new_row jsonb) RETURNS SETOF synchro.synchro_row_ref
-- that names every target row whose membership the dependency event can change (old and
-- new state, including deletion). The worker calls it with the dependency row's state at
-- the start and at the end of each source transaction (objects keyed by column name, with
-- canonical wire values; NULL for a row that did not or no longer exists) and re-evaluates
-- those targets against the transaction's final projections. A dependency whose relation
-- is the target itself is a self-impact declaration (sibling rows).

SET LOCAL ROLE synchro_owner;

CREATE TYPE synchro.synchro_row_ref AS (table_id text, pk_type text, pk_value text);

-- Fields of a capture_dependency relation: every column with a portable type.
CREATE FUNCTION synchro.synchro_record_dependency_fields(p_relation_id text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    NEW synchro.relations%ROWTYPE;
    v_col record;
    v_type record;
BEGIN
    SELECT * INTO NEW FROM synchro.relations WHERE relation_id = p_relation_id AND kind = 'capture_dependency';
    IF NOT FOUND OR EXISTS (SELECT 1 FROM synchro.fields WHERE relation_id = p_relation_id) THEN
        RETURN;
    END IF;
    FOR v_col IN SELECT a.* FROM pg_attribute a
                  WHERE a.attrelid = NEW.physical_relation_oid AND a.attnum > 0 AND NOT a.attisdropped
                  ORDER BY a.attnum LOOP
        IF v_col.attname = NEW.capture_key_column THEN
            SELECT CASE WHEN v_col.atttypid IN ('int2'::regtype, 'int4'::regtype) THEN 'int'
                        WHEN v_col.atttypid = 'int8'::regtype THEN 'int64' ELSE 'string' END AS portable_type,
                   NULL::integer AS decimal_precision, NULL::integer AS decimal_scale
              INTO v_type;
        ELSE
            SELECT t.portable_type, t.decimal_precision, t.decimal_scale INTO v_type
              FROM synchro.synchro_portable_type(v_col.atttypid, v_col.atttypmod) t;
        END IF;
        IF v_type.portable_type IS NOT NULL THEN
            INSERT INTO synchro.fields (relation_id, field_id, column_name, attnum, portable_type, nullable, writable,
                is_key, decimal_precision, decimal_scale)
            VALUES (NEW.relation_id, synchro.synchro_new_id('fld_'), v_col.attname, v_col.attnum,
                v_type.portable_type, NOT v_col.attnotnull, false, v_col.attname = NEW.capture_key_column,
                v_type.decimal_precision, v_type.decimal_scale);
        END IF;
    END LOOP;
END $$;

CREATE FUNCTION synchro.synchro_dependency_fields_trigger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    PERFORM synchro.synchro_record_dependency_fields(NEW.relation_id);
    RETURN NULL;
END $$;
CREATE TRIGGER synchro_dependency_fields AFTER INSERT ON synchro.relations
    FOR EACH ROW EXECUTE FUNCTION synchro.synchro_dependency_fields_trigger();

-- Projection views for every registered relation (synced and capture_dependency).
CREATE OR REPLACE FUNCTION synchro.synchro_create_projection_view(p_relation_id text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_cols text;
    v_key text;
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
    IF v_key IS NOT NULL THEN
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON synchro.projection_rows ((%s)) WHERE relation_id = %L',
                       'projection_key_' || md5(p_relation_id),
                       replace(v_key, 'r.row_json', 'row_json'), p_relation_id);
    END IF;
END $$;

DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT relation_id FROM synchro.relations WHERE kind = 'capture_dependency' LOOP
        PERFORM synchro.synchro_record_dependency_fields(r.relation_id);
    END LOOP;
END $$;

CREATE TABLE synchro.membership_dependencies (
    dependency_id text PRIMARY KEY,
    -- The synced relation whose membership the dependency affects.
    target_relation_id text NOT NULL REFERENCES synchro.relations,
    dependency_relation_id text NOT NULL REFERENCES synchro.relations,
    impact_function_oid oid NOT NULL,
    impact_function_signature text NOT NULL,
    definition_sha256 text NOT NULL,
    max_impact_rows integer NOT NULL CHECK (max_impact_rows >= 1),
    generation bigint NOT NULL DEFAULT 1 CHECK (generation >= 1),
    UNIQUE (target_relation_id, dependency_relation_id)
);

-- Registers (or replaces) the impact function of one dependency of a synced relation.
CREATE FUNCTION synchro.synchro_register_impact_function(p_target_schema text, p_target_relation text,
    p_dependency_schema text, p_dependency_relation text, p_function text, p_max_impact_rows integer DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_target synchro.relations%ROWTYPE;
    v_dep synchro.relations%ROWTYPE;
    v_oid oid;
    v_proc pg_proc%ROWTYPE;
    v_max integer := (SELECT value::integer FROM synchro.settings WHERE key = 'max_bound');
    v_bound integer;
    v_id text;
BEGIN
    SELECT * INTO v_target FROM synchro.relations
     WHERE physical_schema = p_target_schema AND physical_relation = p_target_relation AND kind = 'synced';
    IF NOT FOUND THEN
        PERFORM synchro.synchro_registration_error('ambiguous_physical_relation');
    END IF;
    SELECT * INTO v_dep FROM synchro.relations
     WHERE physical_schema = p_dependency_schema AND physical_relation = p_dependency_relation;
    IF NOT FOUND THEN
        PERFORM synchro.synchro_registration_error('undeclared_dependency', v_target.relation_id);
    END IF;
    v_bound := coalesce(p_max_impact_rows, v_dep.impact_bound);
    IF v_bound < 1 OR v_bound > v_max THEN
        PERFORM synchro.synchro_registration_error('invalid_limit', v_target.relation_id);
    END IF;
    BEGIN
        v_oid := to_regprocedure(p_function);
    EXCEPTION WHEN OTHERS THEN
        v_oid := NULL;
    END;
    IF v_oid IS NULL THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', v_target.relation_id);
    END IF;
    SELECT * INTO v_proc FROM pg_proc WHERE oid = v_oid;
    IF v_proc.prolang <> (SELECT oid FROM pg_language WHERE lanname = 'sql') OR v_proc.prosqlbody IS NULL
       OR v_proc.pronargs <> 2 OR v_proc.proargtypes[0] <> 'jsonb'::regtype OR v_proc.proargtypes[1] <> 'jsonb'::regtype
       OR NOT v_proc.proretset OR v_proc.prorettype <> 'synchro.synchro_row_ref'::regtype
       OR v_proc.provolatile <> 's' OR v_proc.prosecdef
       OR has_function_privilege('public', v_oid, 'EXECUTE')
       OR NOT has_function_privilege('synchro_worker', v_oid, 'EXECUTE') THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', v_target.relation_id);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_depend d JOIN pg_proc p ON p.oid = d.refobjid
                WHERE d.classid = 'pg_proc'::regclass AND d.objid = v_oid AND d.refclassid = 'pg_proc'::regclass
                  AND p.pronamespace <> 'pg_catalog'::regnamespace)
       OR EXISTS (SELECT 1 FROM pg_depend d JOIN pg_class c ON c.oid = d.refobjid
                   WHERE d.classid = 'pg_proc'::regclass AND d.objid = v_oid AND d.refclassid = 'pg_class'::regclass
                     AND c.relnamespace <> 'synchro_projection'::regnamespace) THEN
        PERFORM synchro.synchro_registration_error('undeclared_dependency', v_target.relation_id);
    END IF;
    INSERT INTO synchro.membership_dependencies (dependency_id, target_relation_id, dependency_relation_id,
        impact_function_oid, impact_function_signature, definition_sha256, max_impact_rows)
    VALUES (synchro.synchro_new_id('dep_'), v_target.relation_id, v_dep.relation_id, v_oid,
        v_oid::regprocedure::text, synchro.synchro_function_definition_sha256(v_oid), v_bound)
    ON CONFLICT (target_relation_id, dependency_relation_id) DO UPDATE
       SET impact_function_oid = EXCLUDED.impact_function_oid,
           impact_function_signature = EXCLUDED.impact_function_signature,
           definition_sha256 = EXCLUDED.definition_sha256, max_impact_rows = EXCLUDED.max_impact_rows,
           generation = synchro.membership_dependencies.generation + 1
    RETURNING dependency_id INTO v_id;
    RETURN v_id;
END $$;

-- A dependency change is a membership-contract change: it advances the membership
-- generation (coarse: every cursor, until staged backfill lands).
CREATE OR REPLACE FUNCTION synchro.synchro_stream_state()
RETURNS TABLE (stream_generation bigint, membership_generation bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT c.stream_generation,
           coalesce((SELECT sum(m.membership_generation) FROM synchro.membership_functions m), 0)::bigint
           + coalesce((SELECT sum(d.generation) FROM synchro.membership_dependencies d), 0)::bigint + 1
      FROM synchro.capture_state c
$$;

-- Readiness: dependency relations must be bootstrapped too, and every projection a
-- membership function reads must be a declared dependency.
CREATE OR REPLACE FUNCTION synchro.synchro_health_detail() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    WITH slot AS (
        SELECT s.* FROM pg_replication_slots s JOIN synchro.capture_state c ON s.slot_name = c.slot_name
         WHERE s.plugin = 'pgoutput' AND s.slot_type = 'logical' AND s.database = current_database()
    ), limits AS (
        SELECT synchro.synchro_positive_setting('capture_max_heartbeat_age_seconds') AS max_age,
               synchro.synchro_positive_setting('capture_max_wal_lag_bytes') AS max_lag
    )
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
        -- The leader's advisory lock (key 0x73796e6368726f) is held by a live session.
        'capture_worker', CASE WHEN EXISTS (
            SELECT 1 FROM pg_locks l
             WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database
                                                                           WHERE datname = current_database())
               AND ((l.classid::bigint << 32) | l.objid::bigint) = 32503137342878319 AND l.objsubid = 1)
            THEN 'ok' ELSE 'failed' END,
        'capture_heartbeat', (SELECT CASE WHEN c.heartbeat_at IS NULL OR l.max_age IS NULL THEN 'unknown'
                                          WHEN c.heartbeat_at > now() - make_interval(secs => l.max_age) THEN 'ok'
                                          ELSE 'failed' END FROM synchro.capture_state c, limits l),
        'capture_slot', CASE WHEN EXISTS (SELECT 1 FROM slot) THEN 'ok' ELSE 'failed' END,
        'capture_wal_lag', (SELECT CASE WHEN s.confirmed_flush_lsn IS NULL OR l.max_lag IS NULL THEN 'unknown'
                                        WHEN pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn) <= l.max_lag
                                        THEN 'ok' ELSE 'failed' END
                              FROM limits l LEFT JOIN slot s ON true),
        -- The publication holds exactly the registered relations and publishes every change.
        'capture_publication', CASE WHEN EXISTS (
            SELECT 1 FROM pg_publication p
             WHERE p.pubname = 'synchro_publication' AND p.pubinsert AND p.pubupdate AND p.pubdelete
               AND p.pubtruncate AND NOT p.puballtables AND NOT p.pubviaroot)
          AND NOT EXISTS (
            (SELECT physical_relation_oid FROM synchro.relations)
            EXCEPT (SELECT pr.prrelid FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
                     WHERE p.pubname = 'synchro_publication' AND pr.prqual IS NULL AND pr.prattrs IS NULL))
          AND NOT EXISTS (
            (SELECT pr.prrelid FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
              WHERE p.pubname = 'synchro_publication')
            EXCEPT (SELECT physical_relation_oid FROM synchro.relations))
            THEN 'ok' ELSE 'failed' END,
        'capture_bootstrap', CASE WHEN EXISTS (
            SELECT 1 FROM synchro.relation_capture rc JOIN synchro.relations r USING (relation_id)
             WHERE rc.status <> 'active')
            THEN 'unknown' ELSE 'ok' END,
        -- Every other relation's projection a membership function reads is a declared
        -- dependency (with its impact function); otherwise its changes would not re-evaluate.
        'membership_dependencies', CASE WHEN EXISTS (
            SELECT 1 FROM synchro.membership_functions m
              JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = m.function_oid
                              AND d.refclassid = 'pg_class'::regclass
              JOIN pg_class c ON c.oid = d.refobjid AND c.relnamespace = 'synchro_projection'::regnamespace
              JOIN synchro.relations r ON r.physical_schema || '.' || r.physical_relation = c.relname
             WHERE r.relation_id <> m.relation_id
               AND NOT EXISTS (SELECT 1 FROM synchro.membership_dependencies x
                                WHERE x.target_relation_id = m.relation_id
                                  AND x.dependency_relation_id = r.relation_id))
            THEN 'failed' ELSE 'ok' END)
$$;

-- Evaluation failures use the spec's durable reason.
ALTER TABLE synchro.capture_state DROP CONSTRAINT capture_state_blocked_reason_check;
ALTER TABLE synchro.capture_state ADD CONSTRAINT capture_state_blocked_reason_check CHECK (blocked_reason IN
    ('registered_relation_drift', 'unrepresentable_value', 'decode_error', 'truncate_unsupported',
     'scope_evaluation_failed', 'membership_evaluation_failed', 'membership_bound_exceeded'));

RESET ROLE;

REVOKE ALL ON synchro.membership_dependencies FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_dependency_fields_trigger() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_record_dependency_fields(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_register_impact_function(text, text, text, text, text, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_create_projection_view(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_register_impact_function(text, text, text, text, text, integer)
    TO synchro_operator;
GRANT SELECT ON synchro.membership_dependencies TO synchro_worker;
GRANT USAGE ON TYPE synchro.synchro_row_ref TO synchro_operator, synchro_worker;
