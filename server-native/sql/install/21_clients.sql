-- synchro install 21: clients, their explicit generations and expiry.
-- Spec 003 "Explicit client generation and expiry", "Per-Scope Retention and Client
-- Generations"; spec 000 "Scope Assignment" (the reconciled assigned set).
--
-- Each scope's acknowledged positions are kept by 60_retention, which also makes expiry
-- durable.

-- One record per (user, client), with an explicit generation and expiry.
CREATE TABLE synchro.clients (
    user_id text NOT NULL,
    client_id text NOT NULL,
    client_generation bigint NOT NULL CHECK (client_generation BETWEEN 1 AND 9007199254740991),
    scope_set_version bigint NOT NULL CHECK (scope_set_version BETWEEN 1 AND 9007199254740991),
    assigned_scopes text[] NOT NULL,
    schema_version bigint,
    schema_hash text,
    -- Expiry runs from the last cursor acknowledgement, or from the start of the generation
    -- before the first one; connect traffic alone does not refresh it (spec 003).
    generation_started_at timestamptz NOT NULL DEFAULT now(),
    last_acknowledged_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- Durable expiry: once set, a generation stays expired whatever the TTL setting becomes.
    expired_at timestamptz,
    PRIMARY KEY (user_id, client_id)
);
REVOKE ALL ON synchro.clients FROM PUBLIC;

INSERT INTO synchro.settings (key, value) VALUES ('client_ttl_days', '30');

-- A new generation clears the durable expiry (the old generation stays unusable: its
-- number is gone).
CREATE FUNCTION synchro.synchro_clients_generation_trigger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    IF NEW.client_generation <> OLD.client_generation THEN
        NEW.expired_at := NULL;
    END IF;
    RETURN NEW;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_clients_generation_trigger() FROM PUBLIC;
CREATE TRIGGER synchro_clients_generation BEFORE UPDATE ON synchro.clients
    FOR EACH ROW EXECUTE FUNCTION synchro.synchro_clients_generation_trigger();

-- A client's stored generation, assignment and schema, and whether its generation has
-- expired (durably, or by the TTL now).
CREATE FUNCTION synchro.synchro_client_state(p_user_id text, p_client_id text)
RETURNS TABLE (client_generation bigint, scope_set_version bigint, assigned_scopes text[],
               schema_version bigint, schema_hash text, expired boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT c.client_generation, c.scope_set_version, c.assigned_scopes, c.schema_version, c.schema_hash,
           c.expired_at IS NOT NULL
           OR coalesce(c.last_acknowledged_at, c.generation_started_at)
             + make_interval(days => (SELECT value::integer FROM synchro.settings WHERE key = 'client_ttl_days')) <= now()
      FROM synchro.clients c WHERE c.user_id = p_user_id AND c.client_id = p_client_id
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_client_state(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_client_state(text, text) TO synchro_adapter;

-- Records a connect: issues a new generation when asked (new, expired or stale client),
-- reconciles the assignment set (advancing scope_set_version by one only when it changed)
-- and records the installed schema. Returns the stored generation and scope_set_version.
-- A user holds at most p_max_clients client records: a new client ID at the cap deletes
-- the user's least recently active records (expired ones first) to make room, so made-up
-- client IDs cannot grow the table without bound; a deleted client's next request is 409
-- client_generation_expired and its connect starts it afresh (its cursors stay protected by
-- the scopes' resume floors, its push ledger is kept, so a replay is still answered).
CREATE FUNCTION synchro.synchro_client_connect(p_user_id text, p_client_id text, p_new_generation boolean,
    p_assigned text[], p_schema_version bigint, p_schema_hash text, p_max_clients integer)
RETURNS TABLE (client_generation bigint, scope_set_version bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_row synchro.clients%ROWTYPE;
BEGIN
    SELECT * INTO v_row FROM synchro.clients c WHERE c.user_id = p_user_id AND c.client_id = p_client_id FOR UPDATE;
    IF NOT FOUND THEN
        -- One user's new clients are recorded one at a time, so the cap is exact.
        PERFORM pg_advisory_xact_lock(hashtextextended('synchro.clients:' || p_user_id, 0));
        DELETE FROM synchro.clients c
         WHERE c.user_id = p_user_id
           AND c.client_id IN (
               SELECT o.client_id FROM synchro.clients o
                WHERE o.user_id = p_user_id
                ORDER BY o.expired_at IS NULL DESC,
                         greatest(o.updated_at, coalesce(o.last_acknowledged_at, o.generation_started_at)) DESC,
                         o.client_id
               OFFSET greatest(p_max_clients - 1, 0));
        INSERT INTO synchro.clients (user_id, client_id, client_generation, scope_set_version, assigned_scopes,
                                     schema_version, schema_hash)
        VALUES (p_user_id, p_client_id, 1, 1, p_assigned, p_schema_version, p_schema_hash)
        RETURNING * INTO v_row;
    ELSE
        UPDATE synchro.clients c SET
            client_generation = c.client_generation + CASE WHEN p_new_generation THEN 1 ELSE 0 END,
            generation_started_at = CASE WHEN p_new_generation THEN now() ELSE c.generation_started_at END,
            last_acknowledged_at = CASE WHEN p_new_generation THEN NULL ELSE c.last_acknowledged_at END,
            scope_set_version = c.scope_set_version + CASE WHEN c.assigned_scopes = p_assigned THEN 0 ELSE 1 END,
            assigned_scopes = p_assigned, schema_version = p_schema_version, schema_hash = p_schema_hash,
            updated_at = now()
         WHERE c.user_id = p_user_id AND c.client_id = p_client_id
        RETURNING * INTO v_row;
    END IF;
    client_generation := v_row.client_generation;
    scope_set_version := v_row.scope_set_version;
    RETURN NEXT;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_client_connect(text, text, boolean, text[], bigint, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_client_connect(text, text, boolean, text[], bigint, text, integer) TO synchro_adapter;
