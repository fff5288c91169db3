-- synchro install 40: projection views, membership functions and membership edges.
-- Spec 003 "Deterministic Scope Membership", "Function signatures", "Function restrictions";
-- spec 000 "Deterministic Membership Registration".
--
-- Membership functions read only the typed projection views in synchro_projection (never
-- live application tables); the capture worker evaluates them, as their owner, inside its
-- materialization transaction, after applying the source transaction, and records edge
-- diffs and scope effects (50_pull) in that same transaction. A rule is staged before it is
-- live (42_staging); dependencies declare which other projections it reads (41_dependencies).

-- One typed view per registered relation, named "<schema>.<relation>" after its source.
-- Only the operator and the worker may read them (spec 001).
CREATE SCHEMA synchro_projection;
REVOKE ALL ON SCHEMA synchro_projection FROM PUBLIC;
GRANT USAGE ON SCHEMA synchro_projection TO synchro_operator, synchro_worker;
ALTER DEFAULT PRIVILEGES FOR ROLE synchro_owner IN SCHEMA synchro_projection
    GRANT SELECT ON TABLES TO synchro_operator, synchro_worker;

-- The SQL type a portable type reads back as in a projection view.
CREATE FUNCTION synchro.synchro_projection_expression(p_field_id text, p_type text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT CASE p_type
        WHEN 'string' THEN format('(r.row_json::jsonb ->> %L)', p_field_id)
        WHEN 'int' THEN format('(r.row_json::jsonb ->> %L)::integer', p_field_id)
        WHEN 'int64' THEN format('(r.row_json::jsonb ->> %L)::bigint', p_field_id)
        WHEN 'decimal' THEN format('(r.row_json::jsonb ->> %L)::numeric', p_field_id)
        WHEN 'float' THEN format('(r.row_json::jsonb ->> %L)::double precision', p_field_id)
        WHEN 'boolean' THEN format('(r.row_json::jsonb ->> %L)::boolean', p_field_id)
        WHEN 'datetime' THEN format('(r.row_json::jsonb ->> %L)::timestamptz', p_field_id)
        WHEN 'date' THEN format('(r.row_json::jsonb ->> %L)::date', p_field_id)
        WHEN 'time' THEN format('(r.row_json::jsonb ->> %L)::time', p_field_id)
        WHEN 'json' THEN format('(r.row_json::jsonb ->> %L)::jsonb', p_field_id)
        ELSE format('(r.row_json::jsonb ->> %L)', p_field_id) -- bytes stay base64url text
    END
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_projection_expression(text, text) FROM PUBLIC;

-- (Re)creates the typed view of one registered relation (synced or capture_dependency):
-- synchro_projection."<schema>.<relation>", columns named after the source columns, and an
-- expression index on its key as the view exposes it, so a membership function's
-- `WHERE <key> = p_row_key` lookup is an index probe instead of a scan that parses every
-- projected row. The index is created only when the catalog does not have it (CREATE INDEX
-- IF NOT EXISTS would emit a NOTICE for every field after the first).
CREATE FUNCTION synchro.synchro_create_projection_view(p_relation_id text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_cols text;
    v_key text;
    v_index text := 'projection_key_' || md5(p_relation_id);
    v_view regclass;
    v_attempt integer;
BEGIN
    SELECT * INTO v_rel FROM synchro.relations WHERE relation_id = p_relation_id;
    IF NOT FOUND THEN RETURN; END IF;
    -- Twice at most: a view of the same name left by a retired relation whose columns have
    -- other types (the table was dropped and recreated differently) cannot be replaced; it
    -- is renamed aside (functions that read it keep working and see no rows) and this
    -- relation gets a view of its own. A view of the same name with compatible columns is
    -- replaced in place, so a rule that read it reads the new relation's rows.
    FOR v_attempt IN 1..2 LOOP
        v_view := to_regclass(format('synchro_projection.%I', v_rel.physical_schema || '.' || v_rel.physical_relation));
        -- The view's existing columns keep their positions (CREATE OR REPLACE VIEW can only
        -- append); one whose field was retired (33_reconfigure) reads as NULL of its type.
        SELECT string_agg(c.expr, ', ' ORDER BY c.ord) INTO v_cols FROM (
            SELECT a.attnum::integer AS ord,
                   coalesce(synchro.synchro_projection_expression(f.field_id, f.portable_type),
                            'NULL::' || format_type(a.atttypid, a.atttypmod)) || ' AS ' || quote_ident(a.attname) AS expr
              FROM pg_attribute a
              LEFT JOIN synchro.fields f ON f.relation_id = p_relation_id AND f.column_name = a.attname
             WHERE a.attrelid = v_view AND a.attnum > 0
            UNION ALL
            SELECT 100000 + f.attnum, synchro.synchro_projection_expression(f.field_id, f.portable_type) || ' AS '
                                      || quote_ident(f.column_name)
              FROM synchro.fields f
             WHERE f.relation_id = p_relation_id
               AND NOT EXISTS (SELECT 1 FROM pg_attribute a
                                WHERE a.attrelid = v_view AND a.attnum > 0 AND a.attname = f.column_name)) c;
        IF v_cols IS NULL THEN RETURN; END IF;
        BEGIN
            EXECUTE format('CREATE OR REPLACE VIEW synchro_projection.%I AS SELECT %s FROM synchro.projection_rows r '
                           'WHERE r.relation_id = %L',
                           v_rel.physical_schema || '.' || v_rel.physical_relation, v_cols, p_relation_id);
            EXIT;
        EXCEPTION WHEN invalid_table_definition THEN
            IF v_attempt = 2 OR v_view IS NULL
               OR position(quote_literal(p_relation_id) IN pg_get_viewdef(v_view)) > 0 THEN
                RAISE;
            END IF;
            EXECUTE format('ALTER VIEW %s RENAME TO %I', v_view, 'retired_' || v_view::oid);
        END;
    END LOOP;
    SELECT synchro.synchro_projection_expression(f.field_id, f.portable_type)
      INTO v_key FROM synchro.fields f WHERE f.relation_id = p_relation_id AND f.is_key;
    IF v_key IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM pg_class c WHERE c.relname = v_index AND c.relnamespace = 'synchro'::regnamespace) THEN
        EXECUTE format('CREATE INDEX %I ON synchro.projection_rows ((%s)) WHERE relation_id = %L',
                       v_index, replace(v_key, 'r.row_json', 'row_json'), p_relation_id);
    END IF;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_create_projection_view(text) FROM PUBLIC;

-- Operator-declared indexes on a registered relation's projection (synchro-server registry
-- projection-index): an expression index on projection_rows over exactly the expressions the
-- relation's view exposes, partial to the relation, so a membership or impact function that
-- filters or joins on those view columns ("the items of order X") probes an index instead of
-- parsing every projected row of the relation. Only types whose view expression PostgreSQL
-- can index (immutable casts): string, int, int64, decimal, float, boolean, bytes; datetime,
-- date, time and json are refused (their casts depend on session settings or have no btree).
-- Creating one locks projection_rows against the worker's writes while it builds (about a
-- second per 100,000 projected rows of the relation), then refreshes its statistics.
-- Returns {"index","relation_id","columns","created"}.
CREATE FUNCTION synchro.synchro_index_projection(p_schema text, p_relation text, p_columns text[])
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_exprs text[];
    v_bad text;
    v_name text;
BEGIN
    v_rel := synchro.synchro_named_relation(p_schema, p_relation, false);
    IF v_rel.relation_id IS NULL THEN
        PERFORM synchro.synchro_registration_error('ambiguous_physical_relation');
    END IF;
    IF p_columns IS NULL OR cardinality(p_columns) NOT BETWEEN 1 AND 8
       OR (SELECT count(DISTINCT c) FROM unnest(p_columns) c) <> cardinality(p_columns) THEN
        PERFORM synchro.synchro_registration_error('invalid_limit', v_rel.relation_id, NULL,
            jsonb_build_object('problem', 'an index has 1 to 8 distinct columns'));
    END IF;
    SELECT c.name INTO v_bad FROM unnest(p_columns) c(name)
     WHERE NOT EXISTS (SELECT 1 FROM synchro.fields f WHERE f.relation_id = v_rel.relation_id AND f.column_name = c.name)
     LIMIT 1;
    IF v_bad IS NOT NULL THEN
        PERFORM synchro.synchro_registration_error('missing_field', v_rel.relation_id, NULL,
            jsonb_build_object('column', v_bad, 'problem', 'not_projected'));
    END IF;
    SELECT f.column_name || ' ' || f.portable_type INTO v_bad
      FROM unnest(p_columns) c(name) JOIN synchro.fields f ON f.relation_id = v_rel.relation_id AND f.column_name = c.name
     WHERE f.portable_type NOT IN ('string', 'int', 'int64', 'decimal', 'float', 'boolean', 'bytes')
     LIMIT 1;
    IF v_bad IS NOT NULL THEN
        PERFORM synchro.synchro_registration_error('unsupported_column_type', v_rel.relation_id, NULL,
            jsonb_build_object('column', split_part(v_bad, ' ', 1), 'type', split_part(v_bad, ' ', 2),
                               'problem', 'not_indexable'));
    END IF;
    SELECT array_agg('(' || replace(synchro.synchro_projection_expression(f.field_id, f.portable_type), 'r.row_json', 'row_json')
                     || ')' ORDER BY c.ord)
      INTO v_exprs
      FROM unnest(p_columns) WITH ORDINALITY c(name, ord)
      JOIN synchro.fields f ON f.relation_id = v_rel.relation_id AND f.column_name = c.name;
    v_name := 'projection_idx_' || md5(v_rel.relation_id || '/' || array_to_string(v_exprs, ','));
    IF EXISTS (SELECT 1 FROM pg_class c WHERE c.relname = v_name AND c.relnamespace = 'synchro'::regnamespace) THEN
        RETURN jsonb_build_object('index', v_name, 'relation_id', v_rel.relation_id, 'columns', to_jsonb(p_columns),
                                  'created', false);
    END IF;
    EXECUTE format('CREATE INDEX %I ON synchro.projection_rows (%s) WHERE relation_id = %L',
                   v_name, array_to_string(v_exprs, ', '), v_rel.relation_id);
    -- Statistics of the new expressions, so the planner knows their selectivity at once.
    ANALYZE synchro.projection_rows;
    RETURN jsonb_build_object('index', v_name, 'relation_id', v_rel.relation_id, 'columns', to_jsonb(p_columns),
                              'created', true);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_index_projection(text, text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_index_projection(text, text, text[]) TO synchro_operator;

-- Drops an operator-declared projection index (by the name synchro_index_projection
-- returned). Returns whether there was one.
CREATE FUNCTION synchro.synchro_drop_projection_index(p_index text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    IF p_index IS NULL OR p_index !~ '^projection_idx_[0-9a-f]{32}$'
       OR NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.relname = p_index AND c.relnamespace = 'synchro'::regnamespace) THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP INDEX synchro.%I', p_index);
    RETURN true;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_drop_projection_index(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_drop_projection_index(text) TO synchro_operator;

-- Drops the projection indexes (key and operator-declared) of relations that no longer exist
-- (retired: the worker's activation leaves them, empty, see synchro_activate_generation).
-- Takes an ACCESS EXCLUSIVE lock on projection_rows only when there is one to drop.
CREATE FUNCTION synchro.synchro_drop_orphaned_projection_indexes() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_index regclass;
    v_dropped integer := 0;
BEGIN
    FOR v_index IN
        SELECT i.indexrelid::regclass FROM pg_index i
         WHERE i.indrelid = 'synchro.projection_rows'::regclass AND i.indpred IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM synchro.relations r
                            WHERE pg_get_expr(i.indpred, i.indrelid) = format('(relation_id = %L::text)', r.relation_id))
    LOOP
        EXECUTE format('DROP INDEX %s', v_index);
        v_dropped := v_dropped + 1;
    END LOOP;
    RETURN v_dropped;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_drop_orphaned_projection_indexes() FROM PUBLIC;

CREATE FUNCTION synchro.synchro_fields_view_trigger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    PERFORM synchro.synchro_create_projection_view(NEW.relation_id);
    RETURN NULL;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_fields_view_trigger() FROM PUBLIC;
-- Registration inserts fields after the relation row: each insert refreshes the view.
CREATE TRIGGER synchro_fields_projection_view AFTER INSERT ON synchro.fields
    FOR EACH ROW EXECUTE FUNCTION synchro.synchro_fields_view_trigger();

-- The membership rule of each synced relation: the live function, and a pending one while a
-- change (or the first rule) is staged (42_staging). live is false until the first rule has
-- been activated.
CREATE TABLE synchro.membership_functions (
    relation_id text PRIMARY KEY REFERENCES synchro.relations,
    function_oid oid NOT NULL,
    function_signature text NOT NULL,
    definition_sha256 text NOT NULL,
    membership_generation bigint NOT NULL DEFAULT 1 CHECK (membership_generation >= 1),
    pending_function_oid oid,
    pending_signature text,
    pending_sha256 text,
    -- The last key staged, in byte order (NULL: nothing yet).
    staged_through text,
    staging_started_at timestamptz,
    live boolean NOT NULL DEFAULT true,
    -- Raised by every (re)registration that restarts staging (here and 42_staging): the
    -- worker stages a batch only under the epoch it loaded, with this row locked, so a batch
    -- in flight can never record its progress over a restart.
    staging_epoch bigint NOT NULL DEFAULT 1,
    -- Why the staging of the pending rule stopped (a blocked_detail code of 30_capture and
    -- the SQLSTATE behind it): a rule that is not live never blocks capture, its staging
    -- stops here until `synchro_retry_staging`, a re-registration or `synchro_skip_staging`.
    staging_failed_detail text,
    staging_failed_sqlstate text CHECK (staging_failed_sqlstate ~ '^[0-9A-Z]{5}$'),
    staging_failed_at timestamptz
);
REVOKE ALL ON synchro.membership_functions FROM PUBLIC;
GRANT SELECT, UPDATE ON synchro.membership_functions TO synchro_worker;

-- The live edge set: which scopes each row is in.
CREATE TABLE synchro.membership_edges (
    scope_id text NOT NULL CHECK (scope_id <> ''),
    -- No foreign key to synchro.relations here: this is one of the worker's high-volume
    -- tables, and its session plans every statement afresh (plan_cache_mode =
    -- force_custom_plan, capture/mod.rs), under which PostgreSQL re-plans the referential
    -- check of every inserted row (43% of a bootstrap copy's time in a profile). Rows of a
    -- relation are deleted with it (a retirement, synchro_activate_generation, 33_reconfigure).
    relation_id text NOT NULL,
    pk text NOT NULL,
    PRIMARY KEY (scope_id, relation_id, pk)
);
CREATE INDEX membership_edges_row ON synchro.membership_edges (relation_id, pk);
REVOKE ALL ON synchro.membership_edges FROM PUBLIC;
GRANT SELECT, INSERT, DELETE ON synchro.membership_edges TO synchro_worker;

-- Rows the live rule evaluated to no scope at all. Together with the edges they account for
-- every projected row of a relation whose rule is live: a projected row with neither was
-- never evaluated (health check membership_coverage, 70_readiness).
CREATE TABLE synchro.membership_unscoped (
    relation_id text NOT NULL,
    pk text NOT NULL,
    PRIMARY KEY (relation_id, pk)
);
REVOKE ALL ON synchro.membership_unscoped FROM PUBLIC;
GRANT SELECT, INSERT, DELETE ON synchro.membership_unscoped TO synchro_worker;

-- Evaluators (spec 003: a rule is evaluated as its owner, never with the privileges of the
-- worker or of synchro_owner, and its body cannot change role). For each registered
-- membership or impact function, one SECURITY DEFINER function that calls it and nothing
-- else, created by the registration actor (who owns the rule, and so owns the evaluator):
-- synchro_eval.m_<rule oid>(key), synchro_eval.i_<rule oid>(old, new) and, for the
-- scope-assignment function, synchro_eval.a_<oid>(user). The worker and push (as
-- synchro_owner), and connect and pull for assignment, call the evaluator, which runs as the rule's owner, so no login
-- needs membership in the owner's role; inside a security-definer function PostgreSQL
-- refuses SET ROLE. An evaluator is checked at registration (owner, shape, only the call)
-- and pinned like its rule (the SHA-256 of its definition, compared at every evaluation).
CREATE SCHEMA synchro_eval;
REVOKE ALL ON SCHEMA synchro_eval FROM PUBLIC;
GRANT USAGE ON SCHEMA synchro_eval TO synchro_worker;
GRANT USAGE, CREATE ON SCHEMA synchro_eval TO synchro_operator;

-- The evaluator of each registered rule and the hash of its definition.
CREATE TABLE synchro.rule_evaluators (
    function_oid oid PRIMARY KEY,
    evaluator_oid oid NOT NULL,
    definition_sha256 text NOT NULL
);
REVOKE ALL ON synchro.rule_evaluators FROM PUBLIC;
GRANT SELECT ON synchro.rule_evaluators TO synchro_worker;

-- Drops every function in synchro_eval named p_name (an evaluator's name for rule p_rule)
-- that is not owned by the rule's owner: synchro_operator may create functions there, so
-- another operator could take the name of a rule's evaluator first, which its owner cannot
-- drop. synchro_owner owns synchro_eval, and a schema's owner may drop what is in it.
-- Nothing such a function could be is usable: an evaluator is checked to be the rule owner's.
CREATE FUNCTION synchro.synchro_clear_evaluator_name(p_name text, p_rule oid) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_squatter regprocedure;
BEGIN
    IF p_name IS NULL OR p_rule IS NULL OR p_name !~ '^[mia]_[0-9]{1,10}$' OR substr(p_name, 3) <> p_rule::text THEN
        RAISE EXCEPTION 'not the evaluator name of this rule' USING ERRCODE = '22023';
    END IF;
    FOR v_squatter IN
        SELECT e.oid FROM pg_proc e
         WHERE e.pronamespace = 'synchro_eval'::regnamespace AND e.proname = p_name
           AND e.proowner IS DISTINCT FROM (SELECT r.proowner FROM pg_proc r WHERE r.oid = p_rule)
    LOOP
        EXECUTE format('DROP FUNCTION %s', v_squatter);
    END LOOP;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_clear_evaluator_name(text, oid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_clear_evaluator_name(text, oid) TO synchro_operator;

-- Creates (or replaces) the evaluator of rule p_function (p_kind 'm': membership, 'i':
-- impact, 'a': the scope-assignment function, 20_assignment) as the caller, the
-- registration actor; returns its OID. A function of the evaluator's name that someone
-- else made is dropped first, and one the caller altered is replaced, so registering again
-- always repairs the evaluator (a replacement is atomic: a concurrent evaluation sees the
-- old or the new definition). NULL when p_function names no function the caller owns with
-- the kind's shape: the registration then refuses it with the precise problem. SECURITY
-- INVOKER (the evaluator must be the rule owner's), so it does nothing the caller could not
-- do: synchro_operator may create functions in synchro_eval, which nothing uses unless
-- registered and checked.
CREATE FUNCTION synchro.synchro_rule_evaluator(p_function text, p_kind text) RETURNS oid
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_oid oid;
    v_proc pg_proc%ROWTYPE;
    v_signature text;
    v_create text;
    v_eval oid;
BEGIN
    BEGIN
        -- (an assignment function may be named without its argument list)
        v_oid := CASE WHEN strpos(p_function, '(') > 0 THEN to_regprocedure(p_function) ELSE to_regproc(p_function) END;
    EXCEPTION WHEN OTHERS THEN
        RETURN NULL;
    END;
    SELECT * INTO v_proc FROM pg_proc WHERE oid = v_oid;
    -- (A function of the kind's shape that the caller owns; conditions as plain booleans:
    -- PL/pgSQL's IF stops at the first THEN, a CASE's included.)
    IF NOT FOUND OR v_proc.proowner <> (SELECT oid FROM pg_roles WHERE rolname = current_user)
       OR NOT v_proc.proretset OR p_kind NOT IN ('m', 'i', 'a')
       OR (p_kind IN ('m', 'a') AND (v_proc.pronargs <> 1 OR v_proc.prorettype <> 'text'::regtype))
       OR (p_kind = 'i' AND (ARRAY(SELECT unnest(v_proc.proargtypes::oid[])) <> ARRAY['jsonb'::regtype, 'jsonb'::regtype]::oid[]
                             OR v_proc.prorettype <> 'synchro.synchro_row_ref'::regtype)) THEN
        RETURN NULL;
    END IF;
    v_signature := format('synchro_eval.%I(%s)', p_kind || '_' || v_oid,
                          CASE p_kind WHEN 'i' THEN 'jsonb[], jsonb[]'
                                      WHEN 'm' THEN format_type(v_proc.proargtypes[0], NULL) || '[]'
                                      ELSE format_type(v_proc.proargtypes[0], NULL) END);
    PERFORM synchro.synchro_clear_evaluator_name(p_kind || '_' || v_oid, v_oid);
    -- A membership or impact evaluator takes a batch (one call, one security-definer
    -- context, per batch: a call per key cost ~8 us more than the rule itself) and calls the
    -- rule once per element (OFFSET '0', a bigint constant, no cast call, keeps each call a
    -- parameterized loop rather than a join
    -- the planner could turn into a scan of the whole projection), numbering the results
    -- by the element's position; the assignment evaluator takes the one user.
    v_create := format(
        'CREATE OR REPLACE FUNCTION synchro_eval.%I(%s) RETURNS %s LANGUAGE sql STABLE SECURITY DEFINER
         SET search_path = pg_catalog, pg_temp BEGIN ATOMIC %s; END',
        p_kind || '_' || v_oid,
        CASE p_kind WHEN 'i' THEN 'p_olds jsonb[], p_news jsonb[]'
                    WHEN 'm' THEN 'p_keys ' || format_type(v_proc.proargtypes[0], NULL) || '[]'
                    ELSE 'p_key ' || format_type(v_proc.proargtypes[0], NULL) END,
        CASE p_kind WHEN 'i' THEN 'TABLE (n bigint, table_id text, pk_type text, pk_value text)'
                    WHEN 'm' THEN 'TABLE (n bigint, scope text)'
                    ELSE 'SETOF text' END,
        CASE p_kind
            WHEN 'i' THEN format('SELECT a.n, r.table_id, r.pk_type, r.pk_value
                                    FROM unnest(p_olds, p_news) WITH ORDINALITY AS a(o, nw, n),
                                         LATERAL (SELECT x.table_id, x.pk_type, x.pk_value
                                                    FROM %s(a.o, a.nw) AS x OFFSET ''0'') AS r', v_oid::regproc)
            WHEN 'm' THEN format('SELECT a.n, f.s FROM unnest(p_keys) WITH ORDINALITY AS a(k, n),
                                         LATERAL (SELECT s FROM %s(a.k) AS s OFFSET ''0'') AS f', v_oid::regproc)
            ELSE format('SELECT s FROM %s(p_key) AS s', v_oid::regproc) END);
    BEGIN
        EXECUTE v_create;
    EXCEPTION WHEN invalid_function_definition THEN
        -- The caller's own evaluator, altered to another result type: replace it whole.
        EXECUTE format('DROP FUNCTION %s', v_signature);
        EXECUTE v_create;
    END;
    v_eval := to_regprocedure(v_signature);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_eval::regprocedure);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO synchro_worker, synchro_owner', v_eval::regprocedure);
    RETURN v_eval;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rule_evaluator(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rule_evaluator(text, text) TO synchro_operator;

-- Checks rule p_rule's evaluator p_evaluator (from synchro_rule_evaluator) and records it
-- with its hash: in synchro_eval under its name, owned by the rule's owner, STABLE SQL
-- SECURITY DEFINER with the fixed search_path, executable by synchro_worker and
-- synchro_owner and not PUBLIC, and a body that calls the rule once and reads nothing else.
-- Refused as invalid_scope_function: problem not_owned_by_registrant (no evaluator: the
-- rule is not the registration actor's own) or evaluator_altered (drop it and register
-- again).
CREATE FUNCTION synchro.synchro_record_evaluator(p_evaluator oid, p_rule oid, p_kind text, p_relation_id text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_ok boolean;
BEGIN
    IF p_evaluator IS NULL THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', p_relation_id, NULL,
            jsonb_build_object('problem', 'not_owned_by_registrant'));
    END IF;
    SELECT e.pronamespace = 'synchro_eval'::regnamespace AND e.proname = p_kind || '_' || p_rule
           AND e.proowner = r.proowner AND e.prosecdef AND e.provolatile = 's' AND e.proretset
           AND e.prolang = (SELECT oid FROM pg_language WHERE lanname = 'sql') AND e.prosqlbody IS NOT NULL
           AND e.proconfig = ARRAY['search_path=pg_catalog, pg_temp']
           AND NOT has_function_privilege('public', e.oid, 'EXECUTE')
           AND has_function_privilege('synchro_worker', e.oid, 'EXECUTE')
           AND has_function_privilege('synchro_owner', e.oid, 'EXECUTE')
           -- calls: the rule, once, and for a batch evaluator unnest(anyarray), nothing else
           AND ARRAY(SELECT m[1] FROM regexp_matches(e.prosqlbody::text,
                                                     ':(?:funcid|opfuncid|aggfnoid|winfnoid) ([0-9]+)', 'g') AS m
                      WHERE p_kind = 'a' OR m[1] <> 'pg_catalog.unnest(anyarray)'::regprocedure::oid::text)
               = ARRAY[p_rule::text]
           -- no subquery or session value (a batch evaluator's one constant is its OFFSET '0')
           AND e.prosqlbody::text !~ '[{](SUBLINK|SQLVALUEFUNCTION) '
           AND (p_kind = 'a' AND e.prosqlbody::text !~ '[{]CONST '
                OR p_kind <> 'a' AND e.prosqlbody::text ~ ':limitOffset [{]CONST :consttype 20 .*:constvalue 8 \[ 0 0 0 0 0 0 0 0 \]'
                   AND (SELECT count(*) FROM regexp_matches(e.prosqlbody::text, '[{]CONST ', 'g')) = 1)
           -- (no relation read: a composite type's columns, synchro_row_ref's, are no read)
           AND NOT EXISTS (SELECT 1 FROM pg_depend d JOIN pg_class c ON c.oid = d.refobjid
                            WHERE d.classid = 'pg_proc'::regclass AND d.objid = e.oid
                              AND d.refclassid = 'pg_class'::regclass AND c.relkind <> 'c')
      INTO v_ok
      FROM pg_proc e, pg_proc r WHERE e.oid = p_evaluator AND r.oid = p_rule;
    IF v_ok IS NOT TRUE THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', p_relation_id, NULL,
            jsonb_build_object('problem', 'evaluator_altered',
                'drop', format('DROP FUNCTION %s', p_evaluator::regprocedure)));
    END IF;
    INSERT INTO synchro.rule_evaluators (function_oid, evaluator_oid, definition_sha256)
    VALUES (p_rule, p_evaluator, synchro.synchro_function_definition_sha256(p_evaluator))
    ON CONFLICT (function_oid) DO UPDATE
       SET evaluator_oid = EXCLUDED.evaluator_oid, definition_sha256 = EXCLUDED.definition_sha256;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_record_evaluator(oid, oid, text, text) FROM PUBLIC;

-- Why registered rule p_rule (p_sha256: the hash of the definition it was registered with;
-- p_kind 'm' membership, 'i' impact, 'a' assignment) must not be evaluated now, or NULL:
-- 'function_unavailable' (it or its recorded evaluator is gone), 'definition_changed'
-- (either definition is no longer the one registered), 'insufficient_privilege' (p_caller,
-- the role that calls the evaluator, may not execute it, or, for a membership or impact
-- function, synchro_worker lost USAGE on its schema or EXECUTE on it). The one check that
-- capture (in the transaction that evaluates), push and connect make.
CREATE FUNCTION synchro.synchro_rule_unusable(p_rule oid, p_sha256 text, p_kind text, p_caller text)
RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT CASE WHEN p.oid IS NULL OR e.oid IS NULL THEN 'function_unavailable'
                WHEN p_sha256 IS DISTINCT FROM synchro.synchro_function_definition_sha256(p.oid)
                     OR v.definition_sha256 IS DISTINCT FROM synchro.synchro_function_definition_sha256(e.oid)
                THEN 'definition_changed'
                WHEN NOT has_function_privilege(p_caller, e.oid, 'EXECUTE')
                     OR (p_kind <> 'a' AND NOT (has_schema_privilege('synchro_worker', p.pronamespace, 'USAGE')
                                                AND has_function_privilege('synchro_worker', p.oid, 'EXECUTE')))
                THEN 'insufficient_privilege' END
      FROM (SELECT 1) AS one
      LEFT JOIN pg_proc p ON p.oid = p_rule
      LEFT JOIN synchro.rule_evaluators v ON v.function_oid = p_rule
      LEFT JOIN pg_proc e ON e.oid = v.evaluator_oid AND e.pronamespace = 'synchro_eval'::regnamespace
                         AND e.proname = p_kind || '_' || p_rule
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rule_unusable(oid, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rule_unusable(oid, text, text, text) TO synchro_worker;

-- For connect (20_assignment): the registered assignment function, and whether it and its
-- evaluator still exist with their checked definitions. No row when none is registered.
CREATE FUNCTION synchro.synchro_assignment_function_check()
RETURNS TABLE (function_schema name, function_name name, max_scopes integer, intact boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT a.function_schema, a.function_name, a.max_scopes,
           -- (synchro_assignment_scopes, SECURITY DEFINER, calls the evaluator as synchro_owner)
           synchro.synchro_rule_unusable(a.function_oid, a.definition_sha256, 'a', 'synchro_owner') IS NULL
      FROM synchro.assignment_function a
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_assignment_function_check() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_assignment_function_check() TO synchro_adapter, synchro_monitor;

-- The scopes the registered assignment function gives p_user_id (spec 003), distinct, at
-- most max_scopes + 1 of them (the caller refuses more than max_scopes), through its
-- evaluator: the function runs as its owner, never as synchro_owner. Nothing when none is
-- registered; the caller checks synchro_assignment_function_check first.
CREATE FUNCTION synchro.synchro_assignment_scopes(p_user_id text) RETURNS SETOF text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_oid oid;
    v_max integer;
BEGIN
    SELECT a.function_oid, a.max_scopes INTO v_oid, v_max FROM synchro.assignment_function a;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE format('SELECT DISTINCT s FROM synchro_eval.%I($1) AS s%s', 'a_' || v_oid,
                                CASE WHEN v_max IS NULL THEN '' ELSE ' LIMIT ' || (v_max + 1) END)
        USING p_user_id;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_assignment_scopes(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_assignment_scopes(text) TO synchro_adapter;


-- Resolves and checks a membership or impact function (spec 003 "Function signatures",
-- "Function restrictions"): LANGUAGE sql with a SQL-standard body, exactly the given argument
-- types, RETURNS SETOF p_returns, STABLE, SECURITY INVOKER, executable by synchro_worker and
-- not PUBLIC, reading only projection views (else undeclared_dependency) its owner may read
-- (the worker evaluates it as that owner). A refusal is invalid_registration with the spec's
-- reason and, beside it, what exactly is wrong ("problem") and, for a missing privilege, the
-- statement that grants it ("missing_grant"). Runs as synchro_owner (the registration
-- functions are SECURITY DEFINER), which must be able to look the function up.
CREATE FUNCTION synchro.synchro_rule_function(p_function text, p_relation_id text, p_arg_types oid[], p_returns oid)
RETURNS oid
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_name text[];
    v_oid oid;
    v_proc pg_proc%ROWTYPE;
    v_schema text;
    v_view text;
    v_problem text;
    v_grant text;
BEGIN
    BEGIN
        v_name := parse_ident(split_part(coalesce(p_function, ''), '(', 1));
    EXCEPTION WHEN OTHERS THEN
        v_name := NULL;
    END;
    IF cardinality(v_name) = 2 AND EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = v_name[1])
       AND NOT has_schema_privilege('synchro_owner', v_name[1], 'USAGE') THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', p_relation_id, NULL,
            jsonb_build_object('problem', 'schema_not_usable',
                'missing_grant', format('GRANT USAGE ON SCHEMA %I TO synchro_owner, synchro_worker', v_name[1])));
    END IF;
    BEGIN
        v_oid := to_regprocedure(p_function);
    EXCEPTION WHEN OTHERS THEN
        v_oid := NULL;
    END;
    IF v_oid IS NULL THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', p_relation_id, NULL,
            jsonb_build_object('problem', 'not_found', 'expected_arguments',
                (SELECT array_agg(format_type(t, NULL) ORDER BY n) FROM unnest(p_arg_types) WITH ORDINALITY a(t, n))));
    END IF;
    SELECT * INTO v_proc FROM pg_proc WHERE oid = v_oid;
    v_schema := v_proc.pronamespace::regnamespace::text;
    v_problem := CASE
        WHEN v_proc.prolang <> (SELECT oid FROM pg_language WHERE lanname = 'sql') OR v_proc.prosqlbody IS NULL
            THEN 'not_sql_standard_body'
        WHEN v_proc.pronargs <> cardinality(p_arg_types) OR ARRAY(SELECT unnest(v_proc.proargtypes::oid[])) <> p_arg_types
            THEN 'wrong_arguments'
        WHEN NOT v_proc.proretset OR v_proc.prorettype <> p_returns THEN 'wrong_return_type'
        WHEN v_proc.provolatile <> 's' THEN 'not_stable'
        WHEN v_proc.prosecdef THEN 'security_definer'
        WHEN has_function_privilege('public', v_oid, 'EXECUTE') THEN 'executable_by_public' END;
    IF v_problem IS NOT NULL THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', p_relation_id, NULL,
            jsonb_build_object('problem', v_problem));
    END IF;
    v_grant := CASE
        WHEN NOT has_schema_privilege('synchro_worker', v_proc.pronamespace, 'USAGE')
            THEN format('GRANT USAGE ON SCHEMA %s TO synchro_worker', v_schema)
        WHEN NOT has_function_privilege('synchro_worker', v_oid, 'EXECUTE')
            THEN format('GRANT EXECUTE ON FUNCTION %s TO synchro_worker', v_oid::regprocedure) END;
    IF v_grant IS NOT NULL THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', p_relation_id, NULL,
            jsonb_build_object('problem', 'worker_cannot_call', 'missing_grant', v_grant));
    END IF;
    IF EXISTS (SELECT 1 FROM pg_depend d JOIN pg_proc p ON p.oid = d.refobjid
                WHERE d.classid = 'pg_proc'::regclass AND d.objid = v_oid AND d.refclassid = 'pg_proc'::regclass
                  AND p.pronamespace <> 'pg_catalog'::regnamespace)
       OR EXISTS (SELECT 1 FROM pg_depend d JOIN pg_class c ON c.oid = d.refobjid
                   WHERE d.classid = 'pg_proc'::regclass AND d.objid = v_oid AND d.refclassid = 'pg_class'::regclass
                     AND c.relnamespace <> 'synchro_projection'::regnamespace)
       -- (An operator records a dependency on itself, not on its function: the calls are
       -- read from the stored body too.)
       OR EXISTS (SELECT 1 FROM regexp_matches(v_proc.prosqlbody::text,
                                               ':(?:funcid|opfuncid|aggfnoid|winfnoid) ([0-9]+)', 'g') AS m(a)
                    JOIN pg_proc p ON p.oid = m.a[1]::oid
                   WHERE p.pronamespace <> 'pg_catalog'::regnamespace) THEN
        PERFORM synchro.synchro_registration_error('undeclared_dependency', p_relation_id, NULL,
            jsonb_build_object('problem', 'reads_outside_projection_views'));
    END IF;
    -- Deterministic over the projections it reads: no volatile function (random,
    -- clock_timestamp, set_config, nextval, pg_sleep, the file and XML-query functions), none
    -- of the stable ones that read the session, the clock or anything but their arguments
    -- (current_setting, now, query_to_xml and the like), and no CURRENT_USER, CURRENT_DATE
    -- or similar (spec 003 "Function restrictions"). Built-in functions are pinned, so no
    -- dependency records them: the calls are read from the stored SQL-standard body.
    IF v_proc.prosqlbody::text ~ '[{]SQLVALUEFUNCTION ' OR EXISTS (
        SELECT 1 FROM regexp_matches(v_proc.prosqlbody::text, ':(?:funcid|opfuncid|aggfnoid|winfnoid) ([0-9]+)', 'g') AS m(a)
          JOIN pg_proc p ON p.oid = m.a[1]::oid
         WHERE p.provolatile = 'v'
            OR p.proname IN ('now', 'statement_timestamp', 'transaction_timestamp', 'timeofday', 'current_setting',
                             'current_database', 'current_schema', 'current_schemas', 'current_query',
                             'pg_backend_pid', 'inet_client_addr', 'inet_client_port', 'inet_server_addr',
                             'inet_server_port', 'pg_postmaster_start_time', 'pg_conf_load_time', 'txid_current',
                             'txid_current_if_assigned', 'pg_current_xact_id', 'pg_current_xact_id_if_assigned',
                             'query_to_xml', 'query_to_xmlschema', 'query_to_xml_and_xmlschema', 'cursor_to_xml',
                             'cursor_to_xmlschema', 'table_to_xml', 'table_to_xmlschema', 'table_to_xml_and_xmlschema',
                             'schema_to_xml', 'schema_to_xmlschema', 'schema_to_xml_and_xmlschema', 'database_to_xml',
                             'database_to_xmlschema', 'database_to_xml_and_xmlschema', 'to_regclass', 'to_regproc',
                             'to_regprocedure', 'to_regtype', 'to_regrole', 'to_regnamespace')) THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', p_relation_id, NULL,
            jsonb_build_object('problem', 'nondeterministic_function'));
    END IF;
    SELECT c.oid::regclass::text INTO v_view FROM pg_depend d JOIN pg_class c ON c.oid = d.refobjid
     WHERE d.classid = 'pg_proc'::regclass AND d.objid = v_oid AND d.refclassid = 'pg_class'::regclass
       AND NOT has_table_privilege(v_proc.proowner, c.oid, 'SELECT')
     LIMIT 1;
    IF NOT has_schema_privilege(v_proc.proowner, 'synchro_projection', 'USAGE') OR v_view IS NOT NULL THEN
        -- The projection views are readable by synchro_operator (and the worker).
        PERFORM synchro.synchro_registration_error('invalid_scope_function', p_relation_id, NULL,
            jsonb_build_object('problem', 'owner_cannot_read',
                'missing_grant', format('GRANT synchro_operator TO %I', v_proc.proowner::regrole::text)));
    END IF;
    RETURN v_oid;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rule_function(text, text, oid[], oid) FROM PUBLIC;

-- Registers the membership function of a synced relation (spec 000/003): LANGUAGE sql with
-- a SQL-standard body, STABLE, SECURITY INVOKER, exactly one argument of the key's SQL type,
-- RETURNS SETOF text, executable by synchro_worker and not by PUBLIC, reading only projection
-- views its owner may read (no live relation, no function outside pg_catalog). A first rule
-- and every change are staged: recorded as pending, evaluated by the worker in batches and
-- activated atomically (42_staging).
CREATE FUNCTION synchro.synchro_register_membership_rule(p_schema text, p_relation text, p_function text,
    p_evaluator oid)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_oid oid;
    v_undeclared text;
BEGIN
    v_rel := synchro.synchro_synced_relation(p_schema, p_relation);
    v_oid := synchro.synchro_rule_function(p_function, v_rel.relation_id, ARRAY[v_rel.primary_key_type]::oid[],
                                           'text'::regtype);
    PERFORM synchro.synchro_record_evaluator(p_evaluator, v_oid, 'm', v_rel.relation_id);
    -- Every other relation's projection it reads is a declared dependency, with the impact
    -- function that says which rows a change of it moves (spec 003 "Function
    -- restrictions"): register those first. Otherwise a change there would never
    -- re-evaluate these rows.
    v_undeclared := synchro.synchro_undeclared_projection(v_oid, v_rel.relation_id);
    IF v_undeclared IS NOT NULL THEN
        PERFORM synchro.synchro_registration_error('undeclared_dependency', v_rel.relation_id, NULL,
            jsonb_build_object('problem', 'no_impact_function', 'dependency', v_undeclared,
                'register_first', 'synchro_register_impact_function'));
    END IF;
    IF EXISTS (SELECT 1 FROM synchro.membership_functions WHERE relation_id = v_rel.relation_id) THEN
        -- A rule change is staged: the live rule keeps serving until the worker has evaluated
        -- the new one over every row and activates it atomically.
        -- Re-registering the live function itself after replacing it in place (the way out of
        -- `definition_changed`) also records its new definition as the live one: its old body
        -- is gone, so the new one serves at once, visibly, while staging re-evaluates every
        -- row with it.
        UPDATE synchro.membership_functions
           SET pending_function_oid = v_oid, pending_signature = v_oid::regprocedure::text,
               pending_sha256 = synchro.synchro_function_definition_sha256(v_oid),
               definition_sha256 = CASE WHEN function_oid = v_oid
                                        THEN synchro.synchro_function_definition_sha256(v_oid)
                                        ELSE definition_sha256 END
         WHERE relation_id = v_rel.relation_id;
        PERFORM synchro.synchro_restart_staging(v_rel.relation_id);
    ELSE
        -- A first rule is staged too and becomes live only at activation, so no client sees
        -- a partially evaluated relation.
        INSERT INTO synchro.membership_functions (relation_id, function_oid, function_signature, definition_sha256,
            live, pending_function_oid, pending_signature, pending_sha256, staging_started_at)
        VALUES (v_rel.relation_id, v_oid, v_oid::regprocedure::text, synchro.synchro_function_definition_sha256(v_oid),
            false, v_oid, v_oid::regprocedure::text, synchro.synchro_function_definition_sha256(v_oid), now());
    END IF;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_register_membership_rule(text, text, text, oid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_register_membership_rule(text, text, text, oid) TO synchro_operator;

-- The operator's entry point: creates the rule's evaluator as the registration actor
-- (SECURITY INVOKER), then registers both (synchro_register_membership_rule checks them).
CREATE FUNCTION synchro.synchro_register_membership_function(p_schema text, p_relation text, p_function text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    PERFORM synchro.synchro_register_membership_rule(p_schema, p_relation, p_function,
                                                     synchro.synchro_rule_evaluator(p_function, 'm'));
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_register_membership_function(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_register_membership_function(text, text, text) TO synchro_operator;
