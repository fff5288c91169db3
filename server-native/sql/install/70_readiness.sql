-- synchro install 70: fail-closed readiness.
-- Spec 001 "Fail-closed readiness"; spec 000 "Relation Drift".
--
-- synchro_health_detail gives each check 'ok', 'failed' or 'unknown', for the monitor and
-- the operator; synchro_readiness only whether every check is 'ok'. Capture is ready when
-- the leader holds its lock, the slot and the publication are exactly what capture needs,
-- the heartbeat age, the slot's WAL lag and the age of the oldest unmaterialized commit are
-- known and under the configured limits, the worker applied the current registry generation
-- and acknowledged nothing it had not recorded, every
-- relation is bootstrapped and has its enabled fence trigger, and every projection a
-- membership function reads is a declared dependency. A missing or invalid limit fails
-- closed.

INSERT INTO synchro.settings (key, value) VALUES
    ('capture_max_heartbeat_age_seconds', '60'),
    ('capture_max_wal_lag_bytes', '1073741824'),
    ('capture_max_lag_seconds', '300');

-- A readiness limit: a positive integer setting (a missing or invalid one fails closed).
CREATE FUNCTION synchro.synchro_positive_setting(p_key text) RETURNS bigint
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT CASE WHEN value ~ '^[1-9][0-9]{0,17}$' THEN value::bigint END
      FROM synchro.settings WHERE key = p_key
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_positive_setting(text) FROM PUBLIC;

-- Per relation whose membership rule is live and whose capture is active: how many projected
-- rows have neither a live edge nor an in-no-scope record (counts only; a cheap anti-join,
-- no rule is evaluated). A row so counted is in no scope although the rule was never asked.
CREATE FUNCTION synchro.synchro_membership_uncovered() RETURNS TABLE (relation_id text, rows bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT p.relation_id, count(*)
      FROM synchro.membership_functions m
      JOIN synchro.relation_capture rc ON rc.relation_id = m.relation_id AND rc.status = 'active'
      JOIN synchro.projection_rows p ON p.relation_id = m.relation_id
     WHERE m.live
       AND NOT EXISTS (SELECT 1 FROM synchro.membership_edges e WHERE e.relation_id = p.relation_id AND e.pk = p.pk)
       AND NOT EXISTS (SELECT 1 FROM synchro.membership_unscoped u WHERE u.relation_id = p.relation_id AND u.pk = p.pk)
     GROUP BY p.relation_id
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_membership_uncovered() FROM PUBLIC;

-- The worker's periodic coverage count (capture/step.rs; it reads every projected row of
-- the relations with a live rule, about 0.3 s per 100,000, so readiness, asked on every
-- probe, reads the recorded result instead): records each such relation's uncovered rows
-- and returns their total.
CREATE FUNCTION synchro.synchro_record_membership_coverage() RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    WITH counted AS (
        UPDATE synchro.relation_capture rc
           SET uncovered_rows = coalesce(u.rows, 0), coverage_checked_at = now()
          FROM synchro.membership_functions m
          LEFT JOIN synchro.synchro_membership_uncovered() u ON u.relation_id = m.relation_id
         WHERE m.relation_id = rc.relation_id AND m.live AND rc.status = 'active'
        RETURNING rc.uncovered_rows)
    SELECT coalesce(sum(uncovered_rows), 0)::bigint FROM counted
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_record_membership_coverage() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_record_membership_coverage() TO synchro_worker;

CREATE FUNCTION synchro.synchro_health_detail() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    WITH slot AS (
        SELECT s.* FROM pg_replication_slots s JOIN synchro.capture_state c ON s.slot_name = c.slot_name
         WHERE s.plugin = 'pgoutput' AND s.slot_type = 'logical' AND s.database = current_database()
    ), limits AS (
        SELECT synchro.synchro_positive_setting('capture_max_heartbeat_age_seconds') AS max_age,
               synchro.synchro_positive_setting('capture_max_wal_lag_bytes') AS max_lag,
               synchro.synchro_positive_setting('capture_max_lag_seconds') AS max_lag_seconds
    )
    SELECT jsonb_build_object(
        -- (`schema_installed`, the ledger equal to the running binary's install steps, is
        -- added by the binary: only it knows its steps; synchro_schema_ledger.)
        -- A manifest clients can be served: published, and not waiting for the activation of
        -- its registry generation (a first deployment's reconfiguration; publish.rs serves
        -- no manifest from the first unactivated one on).
        'current_manifest', CASE
            WHEN NOT EXISTS (SELECT 1 FROM synchro.manifests) THEN 'failed'
            WHEN NOT EXISTS (SELECT 1 FROM synchro.manifests m
                              WHERE m.schema_version < coalesce((SELECT min(u) FROM synchro.synchro_unactivated_manifests() u),
                                                                9223372036854775807)) THEN 'unknown'
            ELSE 'ok' END,
        -- Every registered relation matches its registration, as the catalog shows it now
        -- and as the worker last found it (a block on drift found in the stream).
        'registry_drift', CASE WHEN EXISTS (
            SELECT 1 FROM synchro.relations r
             WHERE NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                                WHERE c.oid = r.physical_relation_oid AND c.relname = r.physical_relation
                                  AND n.nspname = r.physical_schema AND c.relreplident = r.replica_identity))
          OR EXISTS (SELECT 1 FROM synchro.capture_state WHERE blocked_reason = 'registered_relation_drift')
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
        -- The login holding the leader lock is a worker login as spec 001 draws it (LOGIN,
        -- REPLICATION, NOINHERIT, NOSUPERUSER, NOCREATEDB, NOCREATEROLE, NOBYPASSRLS, a member
        -- of synchro_worker and of no other role) and the sole runtime replication principal
        -- (no other login that can act as a synchro group has REPLICATION; superusers are no
        -- runtime login). From PostgreSQL 16 on, the CREATEROLE login that created the groups
        -- (a managed service's database owner, often with REPLICATION) is their administrator
        -- without their privileges or SET ROLE to them: that membership does not count.
        -- Amazon RDS and Aurora let no one set REPLICATION: a login replicates there as a
        -- member of rds_replication, which counts as REPLICATION (for the worker and for any
        -- other login) and is the one other membership the worker may hold.
        -- Unknown while no worker leads.
        'capture_worker_login', (
            SELECT CASE WHEN w.oid IS NULL THEN 'unknown'
                        WHEN w.rolcanlogin AND NOT w.rolinherit AND NOT w.rolsuper
                             AND (w.rolreplication OR EXISTS (
                                     SELECT 1 FROM pg_auth_members m
                                      WHERE m.member = w.oid AND m.roleid = to_regrole('rds_replication')))
                             AND NOT w.rolcreatedb AND NOT w.rolcreaterole AND NOT w.rolbypassrls
                             AND ARRAY(SELECT DISTINCT m.roleid FROM pg_auth_members m
                                        WHERE m.member = w.oid
                                          AND m.roleid IS DISTINCT FROM to_regrole('rds_replication'))
                                 = ARRAY['synchro_worker'::regrole::oid]
                             AND NOT EXISTS (
                                 SELECT 1 FROM pg_roles r
                                  WHERE r.rolcanlogin AND NOT r.rolsuper AND r.oid <> w.oid
                                    AND (r.rolreplication OR EXISTS (
                                            SELECT 1 FROM pg_auth_members m
                                             WHERE m.member = r.oid AND m.roleid = to_regrole('rds_replication')))
                                    AND EXISTS (SELECT 1 FROM unnest(ARRAY['synchro_adapter', 'synchro_seed',
                                                    'synchro_monitor', 'synchro_operator', 'synchro_worker']) g
                                                 WHERE pg_has_role(r.oid, g, 'USAGE')
                                                    OR CASE WHEN current_setting('server_version_num')::int >= 160000
                                                            THEN pg_has_role(r.oid, g, 'SET')
                                                            ELSE pg_has_role(r.oid, g, 'MEMBER') END))
                        THEN 'ok' ELSE 'failed' END
              FROM (SELECT 1) AS one
              LEFT JOIN pg_roles w ON w.oid = (
                  SELECT a.usesysid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                   WHERE l.locktype = 'advisory' AND l.granted
                     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                     AND ((l.classid::bigint << 32) | l.objid::bigint) = 32503137342878319 AND l.objsubid = 1
                   LIMIT 1)),
        -- The worker's last step, or its heartbeat session while a long step runs.
        'capture_heartbeat', (SELECT CASE WHEN greatest(c.heartbeat_at, p.heartbeat_at) IS NULL OR l.max_age IS NULL
                                          THEN 'unknown'
                                          WHEN greatest(c.heartbeat_at, p.heartbeat_at) > now() - make_interval(secs => l.max_age)
                                          THEN 'ok'
                                          ELSE 'failed' END
                                FROM synchro.capture_state c CROSS JOIN limits l
                                LEFT JOIN synchro.capture_progress p ON true),
        'capture_slot', CASE WHEN EXISTS (SELECT 1 FROM slot WHERE wal_status IS DISTINCT FROM 'lost')
                             THEN 'ok' ELSE 'failed' END,
        -- The slot is the one whose stream was materialized (issue 38): not dropped, not
        -- invalidated, not made anew, on the same database system. Unknown until the worker
        -- first recorded it.
        'capture_lineage', (SELECT CASE WHEN blocked_reason IN ('slot_missing', 'slot_invalidated', 'lineage_changed')
                                        THEN 'failed'
                                        WHEN lineage_recorded_at IS NULL THEN 'unknown'
                                        ELSE 'ok' END
                              FROM synchro.capture_state),
        -- The oldest commit not yet materialized is younger than the later of the last
        -- applied commit and the moment the worker last found everything before it applied
        -- (an upper bound on its age; unknown until the worker has recorded either).
        'capture_lag_seconds', (SELECT CASE WHEN greatest(c.materialized_commit_at, c.caught_up_at) IS NULL
                                                 OR l.max_lag_seconds IS NULL THEN 'unknown'
                                            WHEN greatest(c.materialized_commit_at, c.caught_up_at)
                                                 >= now() - make_interval(secs => l.max_lag_seconds) THEN 'ok'
                                            ELSE 'failed' END
                                  FROM synchro.capture_state c CROSS JOIN limits l),
        -- The worker's last step ran with the current registry generation.
        'capture_registry_generation', (SELECT CASE WHEN c.applied_registry_generation IS NULL THEN 'unknown'
                                                    WHEN c.applied_registry_generation
                                                         >= coalesce((SELECT max(g.generation) FROM synchro.registry_generations g
                                                                       WHERE g.state = 'active'), 0) THEN 'ok'
                                                    ELSE 'failed' END
                                          FROM synchro.capture_state c),
        -- The slot is acknowledged no further than the worker recorded it could be (the end
        -- of an applied transaction, or an idle position recorded before it was confirmed),
        -- and that is no earlier than the last applied transaction's end: anything else
        -- means the slot was advanced past changes never materialized.
        'capture_progress_order', (SELECT CASE WHEN s.confirmed_flush_lsn IS NULL THEN 'unknown'
                                               WHEN s.confirmed_flush_lsn <= c.acknowledged_lsn
                                                    AND c.confirmed_lsn <= c.acknowledged_lsn THEN 'ok'
                                               ELSE 'failed' END
                                     FROM synchro.capture_state c LEFT JOIN slot s ON true),
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
        -- Every relation's first copy is activated: copied and caught up by the stream (a
        -- copy the worker has not reached yet is not served as complete). A reconfiguration's
        -- copy in flight does not count: the manifest before it keeps being served in full,
        -- and the report lists it (reconfigurations_staged).
        'capture_bootstrap', CASE WHEN EXISTS (
            SELECT 1 FROM synchro.relation_capture rc JOIN synchro.relations r USING (relation_id)
             WHERE rc.status <> 'active'
               AND NOT EXISTS (SELECT 1 FROM synchro.registry_generations g
                                WHERE g.relation_id = rc.relation_id AND g.state IN ('pending', 'staged')))
            THEN 'unknown' ELSE 'ok' END,
        -- Every other relation's projection a membership function reads is a declared
        -- dependency (with its impact function); otherwise its changes would not re-evaluate.
        -- (The check registration makes, by projection name: a table registered again while
        -- its retired registration waits for capture is one projection, its own.)
        'membership_dependencies', CASE WHEN EXISTS (
            SELECT 1 FROM synchro.membership_functions m
             WHERE synchro.synchro_undeclared_projection(m.function_oid, m.relation_id) IS NOT NULL
                OR synchro.synchro_undeclared_projection(m.pending_function_oid, m.relation_id) IS NOT NULL)
            THEN 'failed' ELSE 'ok' END,
        -- Every projected row of a relation whose rule is live was evaluated: it has a live
        -- edge or is recorded as in no scope. A row with neither was lost from every scope.
        -- As the worker last counted (at its start, every few minutes, at each activation);
        -- unknown until it has counted every such relation.
        'membership_coverage', (SELECT CASE WHEN bool_or(rc.uncovered_rows > 0) THEN 'failed'
                                            WHEN bool_or(rc.coverage_checked_at IS NULL) THEN 'unknown'
                                            ELSE 'ok' END
                                  FROM synchro.membership_functions m
                                  JOIN synchro.relation_capture rc USING (relation_id)
                                 WHERE m.live AND rc.status = 'active'),
        -- No staging stopped on a failed evaluation, and every membership rule is live (a
        -- first rule still staging serves nothing yet).
        'membership_staging', CASE
            WHEN EXISTS (SELECT 1 FROM synchro.membership_functions WHERE staging_failed_at IS NOT NULL) THEN 'failed'
            WHEN EXISTS (SELECT 1 FROM synchro.membership_functions WHERE NOT live) THEN 'unknown'
            ELSE 'ok' END,
        -- Every registered relation has its fence trigger, enabled.
        'capture_fences', CASE WHEN EXISTS (
            SELECT 1 FROM synchro.relations r
             WHERE NOT EXISTS (SELECT 1 FROM pg_trigger t
                                WHERE t.tgrelid = r.physical_relation_oid AND t.tgname = 'synchro_source_fence'
                                  AND t.tgenabled = 'O'))
            THEN 'failed' ELSE 'ok' END)
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_health_detail() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_health_detail() TO synchro_monitor, synchro_operator;

-- Every check ok (a check that is null, or anything but 'ok', is not).
CREATE FUNCTION synchro.synchro_readiness() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT NOT EXISTS (SELECT 1 FROM jsonb_each_text(synchro.synchro_health_detail())
                        WHERE value IS DISTINCT FROM 'ok')
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_readiness() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_readiness() TO synchro_adapter, synchro_monitor;

-- The install ledger (version, SHA-256 of each applied step): the serving binary and
-- `health` compare it with their own steps, so a server on another SQL contract is never
-- ready (check `schema_installed`).
CREATE FUNCTION synchro.synchro_schema_ledger() RETURNS TABLE (version integer, sha256 text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT m.version, m.sha256 FROM synchro.schema_migrations m ORDER BY m.version
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_schema_ledger() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_schema_ledger() TO synchro_adapter, synchro_monitor, synchro_operator;

-- Whether capture is durably blocked. While it is, pull, rebuild and push answer 503
-- temporary_unavailable with reason capture_blocked (spec 000 error table) rather than
-- serve a projection that no longer follows the source as verified.
CREATE FUNCTION synchro.synchro_capture_blocked() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT coalesce((SELECT blocked_reason IS NOT NULL FROM synchro.capture_state), false)
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_capture_blocked() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_capture_blocked() TO synchro_adapter;

-- What the operator needs beside the checks (counts and positions only, never row data):
-- the durable block and where it was found, the WAL the capture slot retains (everything
-- from its restart point: a blocked worker confirms nothing, so this grows with every write
-- to the database), how much more WAL PostgreSQL would keep for it (max_slot_wal_keep_size;
-- null when unlimited), and the registry generation with reconfigurations in flight.
CREATE FUNCTION synchro.synchro_capture_report() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT jsonb_build_object(
        'blocked', (SELECT CASE WHEN c.blocked_reason IS NULL THEN NULL ELSE jsonb_strip_nulls(jsonb_build_object(
                        'reason', c.blocked_reason, 'detail', c.blocked_detail,
                        'relation_id', c.blocked_relation_id, 'sqlstate', c.blocked_sqlstate, 'lsn', c.blocked_lsn::text,
                        'ordinal', c.blocked_ordinal, 'since', c.blocked_at)) END
                      FROM synchro.capture_state c),
        -- Observations beside the checks (spec 001 detailed health): seconds since the
        -- worker's last heartbeat (its step's or its heartbeat session's), and the WAL it has
        -- not confirmed (unconfirmed_wal_bytes below).
        'heartbeat_age_seconds', (SELECT floor(extract(epoch FROM now() - greatest(c.heartbeat_at, p.heartbeat_at)))::bigint
                                    FROM synchro.capture_state c LEFT JOIN synchro.capture_progress p ON true),
        -- An upper bound on the age of the oldest commit not materialized yet (check
        -- capture_lag_seconds); null until the worker has recorded it.
        'lag_seconds', (SELECT greatest(floor(extract(epoch FROM now() - greatest(c.materialized_commit_at, c.caught_up_at))), 0)::bigint
                          FROM synchro.capture_state c),
        'applied_registry_generation', (SELECT c.applied_registry_generation FROM synchro.capture_state c),
        'retained_wal_bytes', (SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint
                                 FROM pg_replication_slots s JOIN synchro.capture_state c ON s.slot_name = c.slot_name),
        'unconfirmed_wal_bytes', (SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint
                                    FROM pg_replication_slots s JOIN synchro.capture_state c ON s.slot_name = c.slot_name),
        'slot_safe_wal_bytes', (SELECT s.safe_wal_size FROM pg_replication_slots s
                                  JOIN synchro.capture_state c ON s.slot_name = c.slot_name),
        'slot_wal_status', (SELECT s.wal_status FROM pg_replication_slots s
                              JOIN synchro.capture_state c ON s.slot_name = c.slot_name),
        -- What newer versions tell about the slot, null where the version has no such column:
        -- why it was invalidated (17 on: wal_removed, rows_removed, wal_level_insufficient;
        -- 18: idle_timeout), since when no stream has used it (17 on), whether it conflicts
        -- with recovery (16 on, on a standby), and its failover flag (17 on).
        'slot_invalidation_reason', (SELECT to_jsonb(s) -> 'invalidation_reason' FROM pg_replication_slots s
                                       JOIN synchro.capture_state c ON s.slot_name = c.slot_name),
        'slot_inactive_since', (SELECT to_jsonb(s) -> 'inactive_since' FROM pg_replication_slots s
                                  JOIN synchro.capture_state c ON s.slot_name = c.slot_name),
        'slot_conflicting', (SELECT to_jsonb(s) -> 'conflicting' FROM pg_replication_slots s
                               JOIN synchro.capture_state c ON s.slot_name = c.slot_name),
        'slot_failover', (SELECT to_jsonb(s) -> 'failover' FROM pg_replication_slots s
                            JOIN synchro.capture_state c ON s.slot_name = c.slot_name),
        -- The slot's decoding statistics (pg_stat_replication_slots): transactions larger than
        -- logical_decoding_work_mem spill to disk on the server; many spilled bytes mean the
        -- setting is too small for the workload.
        'slot_stats', (SELECT jsonb_build_object('total_txns', st.total_txns, 'total_bytes', st.total_bytes,
                           'spill_txns', st.spill_txns, 'spill_bytes', st.spill_bytes,
                           'stream_txns', st.stream_txns, 'stream_bytes', st.stream_bytes,
                           'stats_reset', st.stats_reset)
                         FROM pg_stat_replication_slots st JOIN synchro.capture_state c ON st.slot_name = c.slot_name),
        'membership_uncovered_rows', (SELECT coalesce(jsonb_object_agg(relation_id, uncovered_rows), '{}'::jsonb)
                                        FROM synchro.relation_capture WHERE uncovered_rows > 0),
        'membership_coverage_checked_at', (SELECT min(coverage_checked_at) FROM synchro.relation_capture),
        'membership_staging', (SELECT coalesce(jsonb_object_agg(m.relation_id, jsonb_strip_nulls(jsonb_build_object(
                                   'first_rule', NOT m.live, 'since', m.staging_started_at,
                                   'failed', m.staging_failed_detail, 'sqlstate', m.staging_failed_sqlstate,
                                   'failed_at', m.staging_failed_at))), '{}'::jsonb)
                                 FROM synchro.membership_functions m WHERE m.pending_function_oid IS NOT NULL),
        'progress', (SELECT jsonb_strip_nulls(jsonb_build_object('phase', p.phase, 'relation_id', p.relation_id,
                         'done', p.done, 'total', p.total, 'since', p.phase_started_at, 'heartbeat_at', p.heartbeat_at))
                       FROM synchro.capture_progress p),
        'registry_generation', (SELECT max(generation) FROM synchro.registry_generations WHERE state = 'active'),
        'reconfigurations_pending', (SELECT count(*) FROM synchro.registry_generations WHERE state = 'pending'),
        'reconfigurations_staged', (SELECT count(*) FROM synchro.registry_generations WHERE state = 'staged'),
        -- A lineage reset asked for and not yet taken by the worker, and its copies not yet
        -- activated (35_lineage).
        'lineage_reset_requested_at', (SELECT lineage_reset_requested_at FROM synchro.capture_state),
        'lineage_reset_copies_pending', (SELECT count(*) FROM synchro.registry_generations
                                          WHERE change = 'resync' AND state IN ('pending', 'staged')),
        -- Retention: how many effects are kept (the planner's estimate, free to read), and
        -- the last acknowledgement of the least recent unexpired client: its acknowledged
        -- positions hold compaction of its scopes back until client_ttl_days from then.
        'retained_effects_estimate', (SELECT greatest(reltuples, 0)::bigint FROM pg_class
                                       WHERE oid = 'synchro.scope_effects'::regclass),
        'oldest_unexpired_client_since', (SELECT min(coalesce(c.last_acknowledged_at, c.generation_started_at))
                                            FROM synchro.clients c WHERE c.expired_at IS NULL),
        -- When the last compaction pass began (null: never; the operator schedules it).
        'last_compaction_at', (SELECT r.last_pass_at FROM synchro.retention_state r))
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_capture_report() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_capture_report() TO synchro_monitor, synchro_operator;

-- Lifts a durable block (the operator's way out once the cause is fixed: a rule or grant
-- repaired, drift reconfigured): the worker tries again from the last applied position and
-- blocks again, with the same reason, if the cause remains. Returns the block lifted (the
-- report's `blocked` object), or null when capture was not blocked.
CREATE FUNCTION synchro.synchro_capture_unblock() RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_state synchro.capture_state%ROWTYPE;
BEGIN
    SELECT * INTO v_state FROM synchro.capture_state FOR UPDATE;
    IF v_state.blocked_reason IS NULL THEN
        RETURN NULL;
    END IF;
    UPDATE synchro.capture_state
       SET blocked_reason = NULL, blocked_at = NULL, blocked_relation_id = NULL, blocked_detail = NULL,
           blocked_lsn = NULL, blocked_ordinal = NULL, blocked_sqlstate = NULL;
    IF v_state.blocked_reason IN ('slot_missing', 'slot_invalidated', 'lineage_changed') THEN
        -- Capture from a new slot alone would skip every change written while no usable
        -- slot existed: the way out is a lineage reset (35_lineage), which copies it.
        RAISE EXCEPTION 'capture is blocked on its lineage (%): a new slot alone would skip what was written meanwhile',
                        v_state.blocked_reason
            USING ERRCODE = '55000',
                  HINT = 'synchro-server lineage reset (docs/operator.md "When the capture slot is lost")';
    END IF;
    RETURN jsonb_strip_nulls(jsonb_build_object(
        'reason', v_state.blocked_reason, 'detail', v_state.blocked_detail,
        'relation_id', v_state.blocked_relation_id, 'sqlstate', v_state.blocked_sqlstate,
        'lsn', v_state.blocked_lsn::text, 'ordinal', v_state.blocked_ordinal, 'since', v_state.blocked_at));
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_capture_unblock() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_capture_unblock() TO synchro_operator;
