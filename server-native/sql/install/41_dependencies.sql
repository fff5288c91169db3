-- synchro install 41: dependency relations and impact functions.
-- Spec 003 "Deterministic Scope Membership", "Function signatures", "Function restrictions";
-- spec 000 "Deterministic Membership Registration".
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

CREATE TYPE synchro.synchro_row_ref AS (table_id text, pk_type text, pk_value text);
-- Impact functions return it: their authors (operator logins) and the worker use it.
GRANT USAGE ON TYPE synchro.synchro_row_ref TO synchro_operator, synchro_worker;

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
              FROM synchro.synchro_field_type(v_col.atttypid, v_col.atttypmod,
                  synchro.synchro_column_zone(NEW.timestamp_zones, v_col.attname)) t;
        END IF;
        IF v_type.portable_type IS NOT NULL THEN
            INSERT INTO synchro.fields (relation_id, field_id, column_name, attnum, portable_type, nullable, writable,
                is_key, decimal_precision, decimal_scale, type_oid, type_modifier)
            VALUES (NEW.relation_id, synchro.synchro_new_id('fld_'), v_col.attname, v_col.attnum,
                v_type.portable_type, NOT v_col.attnotnull, false, v_col.attname = NEW.capture_key_column,
                v_type.decimal_precision, v_type.decimal_scale, v_col.atttypid, v_col.atttypmod);
        END IF;
    END LOOP;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_record_dependency_fields(text) FROM PUBLIC;

CREATE FUNCTION synchro.synchro_dependency_fields_trigger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    PERFORM synchro.synchro_record_dependency_fields(NEW.relation_id);
    RETURN NULL;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_dependency_fields_trigger() FROM PUBLIC;
CREATE TRIGGER synchro_dependency_fields AFTER INSERT ON synchro.relations
    FOR EACH ROW EXECUTE FUNCTION synchro.synchro_dependency_fields_trigger();

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
REVOKE ALL ON synchro.membership_dependencies FROM PUBLIC;
GRANT SELECT ON synchro.membership_dependencies TO synchro_worker;

-- Registers (or replaces) the impact function of one dependency of a synced relation, under
-- the restrictions of a membership function (40_membership) with the signature
-- (jsonb, jsonb) RETURNS SETOF synchro.synchro_row_ref. A (re)registration re-stages the
-- target's rule (42_staging).
CREATE FUNCTION synchro.synchro_register_impact_rule(p_target_schema text, p_target_relation text,
    p_dependency_schema text, p_dependency_relation text, p_function text, p_max_impact_rows integer,
    p_evaluator oid)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_target synchro.relations%ROWTYPE;
    v_dep synchro.relations%ROWTYPE;
    v_oid oid;
    v_max integer := (SELECT value::integer FROM synchro.settings WHERE key = 'max_bound');
    v_bound integer;
    v_id text;
BEGIN
    v_target := synchro.synchro_synced_relation(p_target_schema, p_target_relation);
    v_dep := synchro.synchro_named_relation(p_dependency_schema, p_dependency_relation, false);
    IF v_dep.relation_id IS NULL THEN
        PERFORM synchro.synchro_registration_error('undeclared_dependency', v_target.relation_id);
    END IF;
    -- Required, never defaulted (spec 003 "Strict Positive Limits": max_impact_rows).
    v_bound := p_max_impact_rows;
    IF v_bound IS NULL OR v_bound < 1 OR v_bound > v_max THEN
        PERFORM synchro.synchro_registration_error('invalid_limit', v_target.relation_id);
    END IF;
    v_oid := synchro.synchro_rule_function(p_function, v_target.relation_id, ARRAY['jsonb'::regtype, 'jsonb'::regtype]::oid[],
                                           'synchro.synchro_row_ref'::regtype);
    PERFORM synchro.synchro_record_evaluator(p_evaluator, v_oid, 'i', v_target.relation_id);
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
REVOKE EXECUTE ON FUNCTION synchro.synchro_register_impact_rule(text, text, text, text, text, integer, oid)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_register_impact_rule(text, text, text, text, text, integer, oid)
    TO synchro_operator;

-- The operator's entry point: creates the impact function's evaluator as the registration
-- actor (SECURITY INVOKER, 40_membership), then registers both.
CREATE FUNCTION synchro.synchro_register_impact_function(p_target_schema text, p_target_relation text,
    p_dependency_schema text, p_dependency_relation text, p_function text, p_max_impact_rows integer)
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    RETURN synchro.synchro_register_impact_rule(p_target_schema, p_target_relation, p_dependency_schema,
        p_dependency_relation, p_function, p_max_impact_rows, synchro.synchro_rule_evaluator(p_function, 'i'));
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_register_impact_function(text, text, text, text, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_register_impact_function(text, text, text, text, text, integer)
    TO synchro_operator;

-- The first projection ("schema.relation") that function p_function reads which is neither
-- its target's own (whichever registration of the table: a retired one may wait for capture
-- beside the new one) nor that of a declared dependency of target p_target, or NULL.
-- Compared by name, as projections are named. Registration refuses such a rule
-- (undeclared_dependency, 40_membership), readiness reports one (membership_dependencies).
CREATE FUNCTION synchro.synchro_undeclared_projection(p_function oid, p_target text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT c.relname::text
      FROM pg_depend d
      JOIN pg_class c ON c.oid = d.refobjid AND c.relnamespace = 'synchro_projection'::regnamespace
      JOIN synchro.relations t ON t.relation_id = p_target
     WHERE d.classid = 'pg_proc'::regclass AND d.objid = p_function AND d.refclassid = 'pg_class'::regclass
       AND c.relname <> t.physical_schema || '.' || t.physical_relation
       AND EXISTS (SELECT 1 FROM synchro.relations r WHERE r.physical_schema || '.' || r.physical_relation = c.relname)
       AND NOT EXISTS (SELECT 1 FROM synchro.membership_dependencies x
                         JOIN synchro.relations r ON r.relation_id = x.dependency_relation_id
                        WHERE x.target_relation_id = p_target
                          AND r.physical_schema || '.' || r.physical_relation = c.relname)
     ORDER BY 1 LIMIT 1
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_undeclared_projection(oid, text) FROM PUBLIC;
