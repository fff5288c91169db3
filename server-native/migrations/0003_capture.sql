-- synchro schema, version 3: capture state and synced projections (issue 5, first part).
-- The capture worker decodes the publication through a logical slot in commit order and,
-- per source transaction, applies the rows to these projections and records its progress
-- in the same transaction; only then does it advance the slot.

SET LOCAL ROLE synchro_owner;

CREATE TABLE synchro.capture_state (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    slot_name name NOT NULL,
    -- End LSN of the last applied source transaction (text form of pg_lsn).
    confirmed_lsn pg_lsn NOT NULL DEFAULT '0/0',
    stream_generation bigint NOT NULL DEFAULT 1 CHECK (stream_generation >= 1),
    applied_transactions bigint NOT NULL DEFAULT 0,
    heartbeat_at timestamptz,
    -- A bounded reason code when capture is blocked; never row data.
    blocked_reason text CHECK (blocked_reason IN
        ('registered_relation_drift', 'unrepresentable_value', 'decode_error', 'truncate_unsupported')),
    blocked_at timestamptz
);
INSERT INTO synchro.capture_state (slot_name) VALUES ('synchro_capture');

-- The latest captured state of every registered synced row: canonical wire JSON keyed by
-- field ID, and an opaque server version. Deleted rows are removed.
CREATE TABLE synchro.projection_rows (
    relation_id text NOT NULL REFERENCES synchro.relations,
    pk text NOT NULL,
    row_json text NOT NULL,
    server_version text NOT NULL,
    PRIMARY KEY (relation_id, pk)
);

-- Readiness now includes capture: not blocked and a recent heartbeat.
CREATE OR REPLACE FUNCTION synchro.synchro_health_detail() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
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
        'capture_heartbeat', (SELECT CASE WHEN heartbeat_at IS NULL THEN 'unknown'
                                          WHEN heartbeat_at > now() - interval '60 seconds' THEN 'ok'
                                          ELSE 'failed' END FROM synchro.capture_state),
        'capture_slot', CASE WHEN EXISTS (
            SELECT 1 FROM pg_replication_slots s JOIN synchro.capture_state c ON s.slot_name = c.slot_name
             WHERE s.plugin = 'pgoutput' AND s.slot_type = 'logical' AND s.database = current_database())
            THEN 'ok' ELSE 'failed' END)
$$;

RESET ROLE;

REVOKE ALL ON synchro.capture_state, synchro.projection_rows FROM PUBLIC;
-- The worker materializes projections and progress; nothing else writes them.
GRANT SELECT ON synchro.relations, synchro.fields TO synchro_worker;
GRANT SELECT, UPDATE ON synchro.capture_state TO synchro_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON synchro.projection_rows TO synchro_worker;
