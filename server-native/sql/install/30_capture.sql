-- synchro install 30: capture progress, each relation's capture state and the projections.
-- Spec 001 "Fail-closed readiness" (capture blocked); spec 000 "Relation Drift"; spec 003
-- "Relation drift and controlled reconfiguration".
--
-- The capture worker (server-native/src/capture/) decodes the publication through a logical
-- slot in commit order and, per source transaction, applies the rows to the projections and
-- records its progress in the same transaction; only then does it advance the slot.

-- The publication capture decodes; registration adds each relation.
CREATE PUBLICATION synchro_publication;

CREATE TABLE synchro.capture_state (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    slot_name name NOT NULL,
    -- End LSN of the last applied source transaction (text form of pg_lsn).
    confirmed_lsn pg_lsn NOT NULL DEFAULT '0/0',
    stream_generation bigint NOT NULL DEFAULT 1 CHECK (stream_generation >= 1),
    applied_transactions bigint NOT NULL DEFAULT 0,
    heartbeat_at timestamptz,
    -- What readiness compares (spec 001): the highest position the worker may acknowledge to
    -- the slot (the end of an applied transaction, or a position it received outside any
    -- transaction once everything before it was applied, recorded before the slot is told);
    -- the commit time of the last applied source transaction; when the worker last found
    -- everything committed before that moment applied; and the registry generation its last
    -- step ran with. The oldest unmaterialized commit is younger than the later of the two
    -- times.
    acknowledged_lsn pg_lsn NOT NULL DEFAULT '0/0',
    materialized_commit_at timestamptz,
    caught_up_at timestamptz,
    applied_registry_generation bigint,
    -- A bounded reason code when capture is blocked; never row data.
    blocked_reason text CHECK (blocked_reason IN
        ('registered_relation_drift', 'unrepresentable_value', 'decode_error', 'truncate_unsupported',
         'scope_evaluation_failed', 'membership_evaluation_failed', 'membership_bound_exceeded', 'missing_fence',
         'slot_missing', 'slot_invalidated', 'lineage_changed')),
    blocked_at timestamptz,
    -- Where the block was found: the relation (when one is to blame), a bounded detail code,
    -- the commit LSN of the source transaction (or the WAL position when the catalog showed
    -- it) and the change's ordinal within that transaction. Never row data.
    blocked_relation_id text,
    blocked_detail text CHECK (blocked_detail IN
        ('column_added', 'column_missing', 'column_type_changed', 'relation_renamed', 'relation_dropped',
         'replica_identity_changed', 'primary_key_changed',
         'function_error', 'insufficient_privilege', 'function_unavailable', 'invalid_scope',
         'fanout_exceeded', 'impact_invalid_row', 'impact_bound_exceeded', 'definition_changed')),
    blocked_lsn pg_lsn,
    blocked_ordinal integer,
    -- The SQLSTATE of the database error behind the block (a failed membership or impact
    -- function), when there was one: the operator's pointer into the PostgreSQL log.
    blocked_sqlstate text CHECK (blocked_sqlstate ~ '^[0-9A-Z]{5}$'),
    -- The lineage of the stream materialized here (issue 38, capture/lineage.rs): the database
    -- system identifier ('unknown' where pg_control_system() cannot be read), the timeline
    -- and where the slot began, recorded when the worker created the slot (at the first
    -- start after install, or in a lineage reset, 35_lineage). NULL until then.
    lineage_system_identifier text,
    lineage_timeline integer,
    lineage_slot_began_lsn pg_lsn,
    lineage_recorded_at timestamptz,
    -- When the operator asked for a lineage reset (synchro_lineage_reset, 35_lineage) that the
    -- worker has not carried out yet.
    lineage_reset_requested_at timestamptz
);
REVOKE ALL ON synchro.capture_state FROM PUBLIC;
GRANT SELECT, UPDATE ON synchro.capture_state TO synchro_worker;
INSERT INTO synchro.capture_state (slot_name) VALUES ('synchro_capture');

-- What the leading worker is doing, written by its own heartbeat session (capture/heartbeat.rs)
-- about once a second while a step runs, so a long evaluation (a rule staged over many
-- rows, a change whose impact function names thousands of rows) neither looks like a dead
-- worker to readiness nor goes unexplained: heartbeat_at advances only while the worker's
-- materialization session is running or between statements of its transaction, never
-- while it waits on a lock. Counts and IDs only.
CREATE TABLE synchro.capture_progress (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    heartbeat_at timestamptz,
    phase text NOT NULL DEFAULT 'idle' CHECK (phase IN
        ('idle', 'applying', 'staging', 'impacts', 'membership', 'activating', 'bootstrapping')),
    relation_id text,
    done bigint,
    total bigint,
    phase_started_at timestamptz
);
REVOKE ALL ON synchro.capture_progress FROM PUBLIC;
GRANT SELECT, UPDATE ON synchro.capture_progress TO synchro_worker;
INSERT INTO synchro.capture_progress DEFAULT VALUES;

-- The latest captured state of every registered row: canonical wire JSON keyed by field ID,
-- and an opaque server version. Deleted rows are removed. The worker materializes
-- projections and progress; nothing else writes them.
CREATE TABLE synchro.projection_rows (
    -- No foreign key to synchro.relations here: this is one of the worker's high-volume
    -- tables, and its session plans every statement afresh (plan_cache_mode =
    -- force_custom_plan, capture/mod.rs), under which PostgreSQL re-plans the referential
    -- check of every inserted row (43% of a bootstrap copy's time in a profile). Rows of a
    -- relation are deleted with it (a retirement, synchro_activate_generation, 33_reconfigure).
    relation_id text NOT NULL,
    pk text NOT NULL,
    row_json text NOT NULL,
    server_version text NOT NULL,
    PRIMARY KEY (relation_id, pk)
);
-- Rows of a relation in byte order of their keys: a staged membership rule walks them in
-- bounded batches after `staged_through` (42_staging; without it every batch sorted the
-- whole relation: O(rows^2 / batch)).
CREATE INDEX projection_rows_byte_order ON synchro.projection_rows (relation_id, (pk COLLATE "C"));
REVOKE ALL ON synchro.projection_rows FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON synchro.projection_rows TO synchro_worker;

-- Each relation's capture status (32_bootstrap): a newly registered relation is 'pending'
-- until its bootstrap copy is reached in the stream, and 'copied' again from a staged
-- reconfiguration until the stream reaches its message. membership_evaluated is the
-- membership contract generation last evaluated for it.
CREATE TABLE synchro.relation_capture (
    relation_id text PRIMARY KEY REFERENCES synchro.relations,
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'copied', 'active')),
    -- Commit LSN of the bootstrap transaction, once the worker has reached it.
    bootstrap_lsn pg_lsn,
    rows_copied bigint,
    updated_at timestamptz NOT NULL DEFAULT now(),
    membership_evaluated bigint NOT NULL DEFAULT 0,
    -- The registry generation (33_reconfigure) the worker applies the relation's changes with.
    registry_generation bigint,
    -- Projected rows found in no scope although the live rule was never asked about them, and
    -- when the worker last counted (synchro_record_membership_coverage, 70_readiness).
    uncovered_rows bigint,
    coverage_checked_at timestamptz
);
REVOKE ALL ON synchro.relation_capture FROM PUBLIC;
GRANT SELECT, UPDATE ON synchro.relation_capture TO synchro_worker;

CREATE FUNCTION synchro.synchro_relation_capture_trigger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    INSERT INTO synchro.relation_capture (relation_id) VALUES (NEW.relation_id);
    RETURN NULL;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_relation_capture_trigger() FROM PUBLIC;
CREATE TRIGGER synchro_relation_capture AFTER INSERT ON synchro.relations
    FOR EACH ROW EXECUTE FUNCTION synchro.synchro_relation_capture_trigger();
