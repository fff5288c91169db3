-- synchro schema, version 16: staged membership backfill (spec 003 "Staged membership
-- backfill") for membership rule changes. Re-registering a relation's membership function
-- records it as pending; the worker evaluates it over the projections in bounded batches
-- (setting backfill_batch_size) between source transactions, keeps the staged edges of
-- already-staged rows current as it applies later transactions, and when every row is
-- staged activates it in one transaction: diffs the live edge set against the staged one,
-- writes those edge changes and their effects, advances the membership generation of
-- exactly the scopes that changed, and makes the pending function the live one. No live
-- edge set is deleted and rebuilt in place; no client sees a partially staged rule.

ALTER TABLE synchro.membership_functions
    ADD COLUMN pending_function_oid oid,
    ADD COLUMN pending_signature text,
    ADD COLUMN pending_sha256 text,
    -- The last key staged, in byte order (NULL: nothing yet).
    ADD COLUMN staged_through text,
    ADD COLUMN staging_started_at timestamptz;

INSERT INTO synchro.settings (key, value) VALUES ('backfill_batch_size', '1000');

SET LOCAL ROLE synchro_owner;

CREATE TABLE synchro.membership_staged_edges (
    relation_id text NOT NULL REFERENCES synchro.relations,
    pk text NOT NULL,
    scope_id text NOT NULL CHECK (scope_id <> ''),
    PRIMARY KEY (relation_id, pk, scope_id)
);

CREATE OR REPLACE FUNCTION synchro.synchro_register_membership_function(p_schema text, p_relation text, p_function text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_oid oid;
    v_proc pg_proc%ROWTYPE;
BEGIN
    SELECT * INTO v_rel FROM synchro.relations
     WHERE physical_schema = p_schema AND physical_relation = p_relation AND kind = 'synced';
    IF NOT FOUND THEN
        PERFORM synchro.synchro_registration_error('ambiguous_physical_relation');
    END IF;
    BEGIN
        v_oid := to_regprocedure(p_function);
    EXCEPTION WHEN OTHERS THEN
        v_oid := NULL;
    END;
    IF v_oid IS NULL THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', v_rel.relation_id);
    END IF;
    SELECT * INTO v_proc FROM pg_proc WHERE oid = v_oid;
    IF v_proc.prolang <> (SELECT oid FROM pg_language WHERE lanname = 'sql') OR v_proc.prosqlbody IS NULL
       OR v_proc.pronargs <> 1 OR v_proc.proargtypes[0] <> v_rel.primary_key_type
       OR NOT v_proc.proretset OR v_proc.prorettype <> 'text'::regtype
       OR v_proc.provolatile <> 's' OR v_proc.prosecdef
       OR has_function_privilege('public', v_oid, 'EXECUTE')
       OR NOT has_function_privilege('synchro_worker', v_oid, 'EXECUTE') THEN
        PERFORM synchro.synchro_registration_error('invalid_scope_function', v_rel.relation_id);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_depend d JOIN pg_proc p ON p.oid = d.refobjid
                WHERE d.classid = 'pg_proc'::regclass AND d.objid = v_oid AND d.refclassid = 'pg_proc'::regclass
                  AND p.pronamespace <> 'pg_catalog'::regnamespace)
       OR EXISTS (SELECT 1 FROM pg_depend d JOIN pg_class c ON c.oid = d.refobjid
                   WHERE d.classid = 'pg_proc'::regclass AND d.objid = v_oid AND d.refclassid = 'pg_class'::regclass
                     AND c.relnamespace <> 'synchro_projection'::regnamespace) THEN
        PERFORM synchro.synchro_registration_error('undeclared_dependency', v_rel.relation_id);
    END IF;
    IF EXISTS (SELECT 1 FROM synchro.membership_functions WHERE relation_id = v_rel.relation_id) THEN
        -- A rule change is staged: the live rule keeps serving until the worker has evaluated
        -- the new one over every row and activates it atomically.
        UPDATE synchro.membership_functions
           SET pending_function_oid = v_oid, pending_signature = v_oid::regprocedure::text,
               pending_sha256 = synchro.synchro_function_definition_sha256(v_oid),
               staged_through = NULL, staging_started_at = now()
         WHERE relation_id = v_rel.relation_id;
        DELETE FROM synchro.membership_staged_edges WHERE relation_id = v_rel.relation_id;
    ELSE
        INSERT INTO synchro.membership_functions (relation_id, function_oid, function_signature, definition_sha256)
        VALUES (v_rel.relation_id, v_oid, v_oid::regprocedure::text, synchro.synchro_function_definition_sha256(v_oid));
    END IF;
END $$;

RESET ROLE;

REVOKE ALL ON synchro.membership_staged_edges FROM PUBLIC;
GRANT SELECT, INSERT, DELETE ON synchro.membership_staged_edges TO synchro_worker;
GRANT UPDATE ON synchro.membership_functions TO synchro_worker;
GRANT SELECT ON synchro.settings TO synchro_worker;
REVOKE EXECUTE ON FUNCTION synchro.synchro_register_membership_function(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_register_membership_function(text, text, text) TO synchro_operator;
