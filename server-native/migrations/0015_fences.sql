-- synchro schema, version 15: source-trigger fences. Every registered relation gets a BEFORE
-- ROW trigger (named to fire after the key-update guard) that allocates the row's version
-- in the writer's transaction, before the row changes, and emits it as a transactional
-- logical message 'synchro.fence' carrying the relation ID, kind, operation, the key's text
-- form, the version and the DML ordinal within the transaction. The capture worker takes
-- each change's version from its fence; a change of an active relation without one (the
-- trigger disabled, or session_replication_role = replica) blocks capture.

SET LOCAL ROLE synchro_owner;

CREATE SEQUENCE synchro.row_version_seq;

CREATE FUNCTION synchro.synchro_fence() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_version bigint := nextval('synchro.row_version_seq');
    v_ordinal integer := coalesce(nullif(current_setting('synchro.dml_ordinal', true), '')::integer, 0) + 1;
    v_row record;
BEGIN
    PERFORM set_config('synchro.dml_ordinal', v_ordinal::text, true);
    IF TG_OP = 'DELETE' THEN v_row := OLD; ELSE v_row := NEW; END IF;
    PERFORM pg_catalog.pg_logical_emit_message(true, 'synchro.fence', jsonb_build_object(
        'relation_id', TG_ARGV[0], 'kind', TG_ARGV[1], 'op', lower(TG_OP),
        'key', to_jsonb(v_row) ->> TG_ARGV[2], 'version', v_version::text, 'ordinal', v_ordinal)::text);
    RETURN v_row;
END $$;

CREATE FUNCTION synchro.synchro_create_fence(p_relation_id text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
BEGIN
    SELECT * INTO v_rel FROM synchro.relations WHERE relation_id = p_relation_id;
    EXECUTE format('CREATE TRIGGER synchro_source_fence BEFORE INSERT OR UPDATE OR DELETE ON %I.%I '
                   'FOR EACH ROW EXECUTE FUNCTION synchro.synchro_fence(%L, %L, %L)',
                   v_rel.physical_schema, v_rel.physical_relation, v_rel.relation_id, v_rel.kind,
                   v_rel.capture_key_column);
END $$;

CREATE FUNCTION synchro.synchro_relation_fence_trigger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    PERFORM synchro.synchro_create_fence(NEW.relation_id);
    RETURN NULL;
END $$;
CREATE TRIGGER synchro_relation_fence AFTER INSERT ON synchro.relations
    FOR EACH ROW EXECUTE FUNCTION synchro.synchro_relation_fence_trigger();

-- Readiness: a disabled or missing fence trigger fails closed.
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
            THEN 'failed' ELSE 'ok' END,
        -- Every registered relation has its fence trigger, enabled.
        'capture_fences', CASE WHEN EXISTS (
            SELECT 1 FROM synchro.relations r
             WHERE NOT EXISTS (SELECT 1 FROM pg_trigger t
                                WHERE t.tgrelid = r.physical_relation_oid AND t.tgname = 'synchro_source_fence'
                                  AND t.tgenabled = 'O'))
            THEN 'failed' ELSE 'ok' END)
$$;

RESET ROLE;

-- Existing registrations (run as the installer, which may act for every owner).
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT relation_id FROM synchro.relations LOOP
        PERFORM synchro.synchro_create_fence(r.relation_id);
    END LOOP;
END $$;

ALTER TABLE synchro.capture_state DROP CONSTRAINT capture_state_blocked_reason_check;
ALTER TABLE synchro.capture_state ADD CONSTRAINT capture_state_blocked_reason_check CHECK (blocked_reason IN
    ('registered_relation_drift', 'unrepresentable_value', 'decode_error', 'truncate_unsupported',
     'scope_evaluation_failed', 'membership_evaluation_failed', 'membership_bound_exceeded', 'missing_fence'));

REVOKE ALL ON SEQUENCE synchro.row_version_seq FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_fence() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_create_fence(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_relation_fence_trigger() FROM PUBLIC;
