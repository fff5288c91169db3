-- synchro schema, version 17: a (re)registered dependency of a relation that already has a
-- live membership rule is staged like a rule change: the live rule is re-staged as pending,
-- evaluated in batches and activated atomically, instead of re-evaluated in one transaction.

SET LOCAL ROLE synchro_owner;

CREATE FUNCTION synchro.synchro_dependency_staging_trigger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    UPDATE synchro.membership_functions
       SET pending_function_oid = coalesce(pending_function_oid, function_oid),
           pending_signature = coalesce(pending_signature, function_signature),
           pending_sha256 = coalesce(pending_sha256, definition_sha256),
           staged_through = NULL, staging_started_at = now()
     WHERE relation_id = NEW.target_relation_id;
    DELETE FROM synchro.membership_staged_edges WHERE relation_id = NEW.target_relation_id;
    RETURN NULL;
END $$;
CREATE TRIGGER synchro_dependency_staging AFTER INSERT OR UPDATE ON synchro.membership_dependencies
    FOR EACH ROW EXECUTE FUNCTION synchro.synchro_dependency_staging_trigger();

RESET ROLE;

REVOKE EXECUTE ON FUNCTION synchro.synchro_dependency_staging_trigger() FROM PUBLIC;
