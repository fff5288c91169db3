-- synchro install 34: the rollout advisor.
-- Spec 000 "Expand, Migrate, Contract Rollout" (contract "only after the old contract is no
-- longer served to active compatible clients"); spec 002 (version floors) and 004 (observing
-- that old writers have drained) for the idea.
--
-- What the server knows about each manifest's clients, as counts (never identities): active
-- clients on it (21_clients: not expired, within client_ttl_days), the last push authored under
-- it, the queued intents it has seen refused as a whole (a push answered 409, 422 or 503 before
-- any mutation ran) and not yet resolved by a later push, and the clients its connect holds at
-- upgrade_required (Class 4 unsupported, or a client runtime below the floor); holds and intents
-- count only for active clients (an expired or uninstalled client blocks nothing). Intents a
-- client has not sent are unknown to the server.

CREATE TABLE synchro.client_holds (
    user_id text NOT NULL,
    client_id text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('unsupported', 'client_runtime')),
    schema_version bigint,
    since timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, client_id)
);
REVOKE ALL ON synchro.client_holds FROM PUBLIC;

CREATE TABLE synchro.unresolved_intents (
    user_id text NOT NULL,
    client_id text NOT NULL,
    mutation_id text NOT NULL,
    authored_version bigint NOT NULL,
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, client_id, mutation_id)
);
REVOKE ALL ON synchro.unresolved_intents FROM PUBLIC;

CREATE TABLE synchro.authored_pushes (
    authored_version bigint PRIMARY KEY,
    last_push_at timestamptz NOT NULL
);
REVOKE ALL ON synchro.authored_pushes FROM PUBLIC;

-- A connect's outcome for the advisor: p_kind 'unsupported' or 'client_runtime' holds the
-- client, NULL releases it.
CREATE FUNCTION synchro.synchro_client_hold(p_user_id text, p_client_id text, p_kind text,
    p_schema_version bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    IF p_kind IS NULL THEN
        DELETE FROM synchro.client_holds WHERE user_id = p_user_id AND client_id = p_client_id;
    ELSE
        INSERT INTO synchro.client_holds (user_id, client_id, kind, schema_version)
        VALUES (p_user_id, p_client_id, p_kind, p_schema_version)
        ON CONFLICT (user_id, client_id) DO UPDATE
           SET kind = EXCLUDED.kind, schema_version = EXCLUDED.schema_version
         WHERE client_holds.kind IS DISTINCT FROM EXCLUDED.kind
            OR client_holds.schema_version IS DISTINCT FROM EXCLUDED.schema_version;
    END IF;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_client_hold(text, text, text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_client_hold(text, text, text, bigint) TO synchro_adapter;

-- The mutations of a push: refused as a whole (p_resolved false: they stay queued at the
-- client) or answered (p_resolved true: every one has its outcome, and the batch counts as a
-- push authored under each of their authored versions).
CREATE FUNCTION synchro.synchro_push_seen(p_user_id text, p_client_id text, p_mutation_ids text[],
    p_authored_versions bigint[], p_resolved boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    IF p_resolved THEN
        DELETE FROM synchro.unresolved_intents
         WHERE user_id = p_user_id AND client_id = p_client_id AND mutation_id = ANY (p_mutation_ids);
        INSERT INTO synchro.authored_pushes (authored_version, last_push_at)
        SELECT DISTINCT v, now() FROM unnest(p_authored_versions) v
        ON CONFLICT (authored_version) DO UPDATE SET last_push_at = EXCLUDED.last_push_at;
    ELSE
        INSERT INTO synchro.unresolved_intents (user_id, client_id, mutation_id, authored_version)
        SELECT p_user_id, p_client_id, m, v FROM unnest(p_mutation_ids, p_authored_versions) u(m, v)
        ON CONFLICT (user_id, client_id, mutation_id) DO UPDATE
           SET authored_version = EXCLUDED.authored_version, last_seen_at = now();
    END IF;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_push_seen(text, text, text[], bigint[], boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_push_seen(text, text, text[], bigint[], boolean) TO synchro_adapter;

-- The served current manifest version (a reconfiguration's manifest counts once active).
CREATE FUNCTION synchro.synchro_served_version() RETURNS bigint
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT max(m.schema_version) FROM synchro.manifests m
     WHERE NOT EXISTS (SELECT 1 FROM synchro.registry_generations g
                        WHERE g.schema_version = m.schema_version AND g.state IN ('pending', 'staged'))
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_served_version() FROM PUBLIC;

-- Active client generations (not expired, acknowledged or started within client_ttl_days); a
-- client held at upgrade_required has no installed schema (NULL).
CREATE FUNCTION synchro.synchro_active_clients()
RETURNS TABLE (user_id text, client_id text, schema_version bigint, schema_hash text, assigned_scopes text[])
LANGUAGE sql STABLE SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT c.user_id, c.client_id, c.schema_version, c.schema_hash, c.assigned_scopes FROM synchro.clients c
     WHERE c.expired_at IS NULL
       AND coalesce(c.last_acknowledged_at, c.generation_started_at)
           > now() - make_interval(days => coalesce((SELECT CASE WHEN value ~ '^[1-9][0-9]{0,5}$' THEN value::integer END
                                                        FROM synchro.settings WHERE key = 'client_ttl_days'), 30))
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_active_clients() FROM PUBLIC;

-- The installed schema and assigned scopes of every active client generation, for the
-- reconfiguration plan; no user or client identity.
CREATE FUNCTION synchro.synchro_active_client_schemas()
RETURNS TABLE (schema_version bigint, schema_hash text, assigned_scopes text[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT a.schema_version, a.schema_hash, a.assigned_scopes FROM synchro.synchro_active_clients() a
     WHERE a.schema_version IS NOT NULL
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_active_client_schemas() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_active_client_schemas() TO synchro_operator, synchro_monitor;

-- Per manifest: {"version","class","served","active_clients","last_push_authored_at",
-- "unresolved_intents","held_at_upgrade_required"}, and the totals of held clients by kind.
CREATE FUNCTION synchro.synchro_rollout_report() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    WITH active AS (SELECT * FROM synchro.synchro_active_clients())
    SELECT jsonb_build_object(
        'served_version', synchro.synchro_served_version(),
        'manifests', coalesce((SELECT jsonb_agg(jsonb_build_object(
            'version', m.schema_version, 'class', m.transition_class,
            'served', m.schema_version <= synchro.synchro_served_version(),
            'active_clients', (SELECT count(*) FROM active a WHERE a.schema_version = m.schema_version),
            'last_push_authored_at', (SELECT p.last_push_at FROM synchro.authored_pushes p
                                       WHERE p.authored_version = m.schema_version),
            'unresolved_intents', (SELECT count(*) FROM synchro.unresolved_intents u JOIN active a USING (user_id, client_id)
                                    WHERE u.authored_version = m.schema_version),
            'held_at_upgrade_required', (SELECT count(*) FROM synchro.client_holds h JOIN active a USING (user_id, client_id)
                                          WHERE h.schema_version = m.schema_version))
            ORDER BY m.schema_version) FROM synchro.manifests m), '[]'),
        'held_at_upgrade_required', jsonb_build_object(
            'unsupported', (SELECT count(*) FROM synchro.client_holds h JOIN active a USING (user_id, client_id)
                             WHERE h.kind = 'unsupported'),
            'client_runtime', (SELECT count(*) FROM synchro.client_holds h JOIN active a USING (user_id, client_id)
                                WHERE h.kind = 'client_runtime')))
      FROM (SELECT 1) one
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_rollout_report() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_rollout_report() TO synchro_monitor, synchro_operator;

-- Whether retiring these registered columns of a relation (a Class 4 contract) is safe now:
-- the old contract is no longer served to active clients when every active client is on the
-- served manifest (it has received the expand), no intent authored under an older manifest is
-- known unresolved, no client is held at upgrade_required, and no reconfiguration is in
-- flight. Returns {"safe", "fields":[field_id], "blocking":[{"reason","schema_version"?,
-- "count"}]}; an unknown column is an error.
CREATE FUNCTION synchro.synchro_contract_check(p_schema text, p_relation text, p_columns text[]) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_served bigint := synchro.synchro_served_version();
    v_fields text[];
    v_blocking jsonb;
BEGIN
    v_rel := synchro.synchro_synced_relation(p_schema, p_relation);
    SELECT array_agg(f.field_id ORDER BY f.field_id) INTO v_fields FROM synchro.fields f
     WHERE f.relation_id = v_rel.relation_id AND f.column_name = ANY (p_columns::name[]);
    IF coalesce(cardinality(v_fields), 0) <> cardinality(p_columns) OR p_columns IS NULL THEN
        RAISE EXCEPTION 'every column must be a registered field of the relation' USING ERRCODE = '22023';
    END IF;
    SELECT coalesce(jsonb_agg(b ORDER BY b ->> 'reason', (b ->> 'schema_version')::bigint), '[]') INTO v_blocking FROM (
        SELECT jsonb_build_object('reason', 'active_clients_on_older_manifest', 'schema_version', a.schema_version,
                                  'count', count(*)) AS b
          FROM synchro.synchro_active_clients() a WHERE a.schema_version < v_served GROUP BY a.schema_version
        UNION ALL
        SELECT jsonb_build_object('reason', 'unresolved_intents_authored_under_older_manifest',
                                  'schema_version', u.authored_version, 'count', count(*))
          FROM synchro.unresolved_intents u JOIN synchro.synchro_active_clients() a USING (user_id, client_id)
         WHERE u.authored_version < v_served GROUP BY u.authored_version
        UNION ALL
        SELECT jsonb_build_object('reason', 'clients_held_at_upgrade_required', 'count', count(*))
          FROM synchro.client_holds h JOIN synchro.synchro_active_clients() a USING (user_id, client_id)
        HAVING count(*) > 0
        UNION ALL
        SELECT jsonb_build_object('reason', 'reconfiguration_in_flight', 'count', count(*))
          FROM synchro.registry_generations WHERE state IN ('pending', 'staged') HAVING count(*) > 0) x;
    RETURN jsonb_build_object('safe', jsonb_array_length(v_blocking) = 0, 'fields', to_jsonb(v_fields),
                              'blocking', v_blocking);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_contract_check(text, text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_contract_check(text, text, text[]) TO synchro_monitor, synchro_operator;
