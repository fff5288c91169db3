-- synchro install 42: staged membership backfill.
-- Spec 003 "Staged membership backfill", "Registry and Membership Generations"; spec 000
-- "Membership Generations And Controlled Reconfiguration" (partly: no registry generation,
-- no staging through an exported snapshot).
--
-- Registering a relation's first membership rule, or a changed one, records it as pending
-- (40_membership); so does (re)registering a dependency of a relation that has a rule. The
-- worker evaluates the pending rule over the projections in bounded batches (setting
-- backfill_batch_size) between source transactions, keeps the staged edges of
-- already-staged rows current as it applies later transactions, and when every row is
-- staged activates it in one transaction: diffs the live edge set against the staged one,
-- writes those edge changes and their effects, advances the membership generation of
-- exactly the scopes that changed (scope_retention, 50_pull), and makes the pending function
-- the live one. No live edge set is deleted and rebuilt in place; no client sees a
-- partially staged rule.

INSERT INTO synchro.settings (key, value) VALUES ('backfill_batch_size', '4000');

CREATE TABLE synchro.membership_staged_edges (
    -- No foreign key to synchro.relations here: this is one of the worker's high-volume
    -- tables, and its session plans every statement afresh (plan_cache_mode =
    -- force_custom_plan, capture/mod.rs), under which PostgreSQL re-plans the referential
    -- check of every inserted row (43% of a bootstrap copy's time in a profile). Rows of a
    -- relation are deleted with it (a retirement, synchro_activate_generation, 33_reconfigure).
    relation_id text NOT NULL,
    pk text NOT NULL,
    scope_id text NOT NULL CHECK (scope_id <> ''),
    PRIMARY KEY (relation_id, pk, scope_id)
);
REVOKE ALL ON synchro.membership_staged_edges FROM PUBLIC;
GRANT SELECT, INSERT, DELETE ON synchro.membership_staged_edges TO synchro_worker;

-- Rows the pending rule evaluated to no scope (membership_unscoped's staged twin). An
-- activation requires every projected row to have staged edges or a row here.
CREATE TABLE synchro.membership_staged_unscoped (
    relation_id text NOT NULL,
    pk text NOT NULL,
    PRIMARY KEY (relation_id, pk)
);
REVOKE ALL ON synchro.membership_staged_unscoped FROM PUBLIC;
GRANT SELECT, INSERT, DELETE ON synchro.membership_staged_unscoped TO synchro_worker;

-- Stages a relation's pending rule again from its first row, under a new staging epoch (a
-- batch of the old one in flight then records nothing: capture/staging.rs), with no
-- recorded failure. Every restart goes through here: a (re)registration of the rule or of a
-- dependency, the operator's retry, the worker finding rows unstaged at activation. Returns
-- false when nothing is pending.
CREATE FUNCTION synchro.synchro_restart_staging(p_relation_id text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    UPDATE synchro.membership_functions
       SET staged_through = NULL, staging_started_at = now(), staging_epoch = staging_epoch + 1,
           staging_failed_detail = NULL, staging_failed_sqlstate = NULL, staging_failed_at = NULL
     WHERE relation_id = p_relation_id AND pending_function_oid IS NOT NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM synchro.membership_staged_edges WHERE relation_id = p_relation_id;
    DELETE FROM synchro.membership_staged_unscoped WHERE relation_id = p_relation_id;
    RETURN true;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_restart_staging(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_restart_staging(text) TO synchro_worker;

-- A (re)registered dependency re-stages its target's rule: the live rule becomes pending
-- again (unless a change already is) and staging restarts.
CREATE FUNCTION synchro.synchro_dependency_staging_trigger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    UPDATE synchro.membership_functions
       SET pending_function_oid = coalesce(pending_function_oid, function_oid),
           pending_signature = coalesce(pending_signature, function_signature),
           pending_sha256 = coalesce(pending_sha256, definition_sha256)
     WHERE relation_id = NEW.target_relation_id;
    PERFORM synchro.synchro_restart_staging(NEW.target_relation_id);
    RETURN NULL;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_dependency_staging_trigger() FROM PUBLIC;
CREATE TRIGGER synchro_dependency_staging AFTER INSERT OR UPDATE ON synchro.membership_dependencies
    FOR EACH ROW EXECUTE FUNCTION synchro.synchro_dependency_staging_trigger();

-- Statistics for the worker's high-volume tables after it wrote many rows at once (a
-- bootstrap copy, a relation's activation, an activated or re-evaluated rule): autovacuum
-- analyzes them only at its next round (autovacuum_naptime, a minute by default), and until
-- then the planner estimates a 100,000-row scope at a few hundred rows and reads it with
-- one index probe per row (a rebuild's snapshot read: 390 ms instead of 170 ms). A table
-- autovacuum holds at that moment is skipped (it is being analyzed or vacuumed anyway); the
-- worker never waits for it nor cancels it.
-- Returns false, analyzing nothing, while another session holds a lock ANALYZE would wait
-- for (autovacuum, an index build): the worker then tries again at its next steps, so the
-- statistics are never left stale after a bulk write (a skipped ANALYZE left the planner
-- scanning a projection for every key). SKIP_LOCKED stays as the backstop for a lock taken
-- between the look and the ANALYZE.
CREATE FUNCTION synchro.synchro_analyze_materialized() RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_locks l
                WHERE l.relation IN ('synchro.projection_rows'::regclass, 'synchro.membership_edges'::regclass,
                                     'synchro.membership_staged_edges'::regclass, 'synchro.membership_unscoped'::regclass,
                                     'synchro.membership_staged_unscoped'::regclass)
                  AND l.granted AND l.pid <> pg_backend_pid()
                  AND l.mode IN ('ShareUpdateExclusiveLock', 'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock',
                                 'AccessExclusiveLock')) THEN
        RETURN false;
    END IF;
    ANALYZE (SKIP_LOCKED) synchro.projection_rows, synchro.membership_edges, synchro.membership_staged_edges,
        synchro.membership_unscoped, synchro.membership_staged_unscoped;
    RETURN true;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_analyze_materialized() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_analyze_materialized() TO synchro_worker;

-- The operator's ways out of a stopped staging (spec 001: every blocked state has one that
-- needs no superuser). Both name the relation as registered; both return what they did.

-- Stages the pending rule of a relation again from its first row (after fixing the rule or
-- a grant it lacked): clears a recorded failure. Returns false when nothing is pending.
-- The staging restarts from the first row with the pending function as it is now: a
-- pending function fixed in place (the usual way out of a failed staging) has its new
-- definition recorded, as a re-registration would (and so has the live one when it is the
-- same function), since nothing was served from its staging yet.
CREATE FUNCTION synchro.synchro_retry_staging(p_schema text, p_relation text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_relation_id text := (synchro.synchro_synced_relation(p_schema, p_relation)).relation_id;
BEGIN
    UPDATE synchro.membership_functions m
       SET pending_sha256 = synchro.synchro_function_definition_sha256(m.pending_function_oid),
           definition_sha256 = CASE WHEN m.function_oid = m.pending_function_oid
                                    THEN synchro.synchro_function_definition_sha256(m.pending_function_oid)
                                    ELSE m.definition_sha256 END
     WHERE m.relation_id = v_relation_id AND m.pending_function_oid IS NOT NULL
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_proc p WHERE p.oid = m.pending_function_oid);
    RETURN synchro.synchro_restart_staging(v_relation_id);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_retry_staging(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_retry_staging(text, text) TO synchro_operator;

-- Abandons the pending rule of a relation: a changed rule is dropped and the live one keeps
-- serving ('change_abandoned'); a first rule is removed, leaving the relation without a rule
-- ('first_rule_removed': its rows are in no scope until a rule is registered). 'none' when
-- nothing was pending.
CREATE FUNCTION synchro.synchro_skip_staging(p_schema text, p_relation text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_relation_id text := (synchro.synchro_synced_relation(p_schema, p_relation)).relation_id;
    v_live boolean;
BEGIN
    SELECT live INTO v_live FROM synchro.membership_functions
     WHERE relation_id = v_relation_id AND pending_function_oid IS NOT NULL FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'none';
    END IF;
    DELETE FROM synchro.membership_staged_edges WHERE relation_id = v_relation_id;
    DELETE FROM synchro.membership_staged_unscoped WHERE relation_id = v_relation_id;
    IF NOT v_live THEN
        DELETE FROM synchro.membership_functions WHERE relation_id = v_relation_id;
        RETURN 'first_rule_removed';
    END IF;
    UPDATE synchro.membership_functions
       SET pending_function_oid = NULL, pending_signature = NULL, pending_sha256 = NULL,
           staged_through = NULL, staging_started_at = NULL, staging_epoch = staging_epoch + 1,
           staging_failed_detail = NULL, staging_failed_sqlstate = NULL, staging_failed_at = NULL
     WHERE relation_id = v_relation_id;
    RETURN 'change_abandoned';
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_skip_staging(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_skip_staging(text, text) TO synchro_operator;
