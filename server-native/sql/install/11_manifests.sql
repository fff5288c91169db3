-- synchro install 11: immutable schema manifests.
-- Spec 003 "Immutable Schema Manifests"; spec 000 "Immutable Manifest Body, Hash, And
-- Lineage"; spec 001 "Immutable schema hash".
--
-- Which manifest is served while a Class 3 table is still materializing is decided by
-- synchro_unready_tables (50_pull).

-- Immutable manifest records: inserted once, never updated or deleted.
CREATE TABLE synchro.manifests (
    schema_version bigint PRIMARY KEY CHECK (schema_version BETWEEN 1 AND 9007199254740991),
    schema_hash text NOT NULL UNIQUE CHECK (schema_hash ~ '^[0-9a-f]{64}$'),
    body text NOT NULL,
    parent_version bigint REFERENCES synchro.manifests,
    parent_hash text,
    transition_class text NOT NULL CHECK (transition_class IN ('initial', 'class_2', 'class_3', 'class_4')),
    compatibility_floor bigint NOT NULL,
    published_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((parent_version IS NULL) = (transition_class = 'initial'))
);
REVOKE ALL ON synchro.manifests FROM PUBLIC;

CREATE FUNCTION synchro.synchro_manifest_immutable() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, synchro, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'published manifests are immutable' USING ERRCODE = '55000';
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_manifest_immutable() FROM PUBLIC;
CREATE TRIGGER synchro_manifests_immutable BEFORE UPDATE OR DELETE OR TRUNCATE ON synchro.manifests
    FOR EACH STATEMENT EXECUTE FUNCTION synchro.synchro_manifest_immutable();

-- Every manifest, in version order.
CREATE FUNCTION synchro.synchro_manifest_history() RETURNS TABLE (schema_version bigint, body text, schema_hash text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT m.schema_version, m.body, m.schema_hash FROM synchro.manifests m ORDER BY m.schema_version
$$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_manifest_history() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_manifest_history() TO synchro_adapter, synchro_seed, synchro_operator;

-- Inserts one immutable manifest record. The caller (the publisher) has validated body,
-- hash, lineage and class with the protocol core; the checks here keep the table honest.
CREATE FUNCTION synchro.synchro_insert_manifest(p_version bigint, p_hash text, p_body text,
    p_parent_version bigint, p_parent_hash text, p_class text, p_floor bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_current synchro.manifests%ROWTYPE;
BEGIN
    -- The body and hash must agree (SHA-256 of the domain-prefixed canonical body).
    IF p_hash IS DISTINCT FROM encode(sha256('\x73796e6368726f3a76333a736368656d612d6d616e69666573743a763100'::bytea
                                             || convert_to(p_body, 'UTF8')), 'hex') THEN
        RAISE EXCEPTION 'the manifest hash does not match its body' USING ERRCODE = '22023';
    END IF;
    LOCK TABLE synchro.manifests IN EXCLUSIVE MODE;
    SELECT * INTO v_current FROM synchro.manifests ORDER BY schema_version DESC LIMIT 1;
    IF FOUND AND (p_parent_version IS DISTINCT FROM v_current.schema_version
                  OR p_parent_hash IS DISTINCT FROM v_current.schema_hash) THEN
        RAISE EXCEPTION 'a new manifest must name the current manifest as its parent' USING ERRCODE = '40001';
    END IF;
    IF NOT FOUND AND p_parent_version IS NOT NULL THEN
        RAISE EXCEPTION 'the first manifest has no parent' USING ERRCODE = '22023';
    END IF;
    INSERT INTO synchro.manifests (schema_version, schema_hash, body, parent_version, parent_hash,
                                   transition_class, compatibility_floor)
    VALUES (p_version, p_hash, p_body, p_parent_version, p_parent_hash, p_class, p_floor);
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_insert_manifest(bigint, text, text, bigint, text, text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_insert_manifest(bigint, text, text, bigint, text, text, bigint)
    TO synchro_operator;

-- Facts a classification needs, read from the source rows under the caller's snapshot.
CREATE FUNCTION synchro.synchro_column_has_values(p_relation_id text, p_column name) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
DECLARE
    v_rel synchro.relations%ROWTYPE;
    v_found boolean;
BEGIN
    SELECT * INTO v_rel FROM synchro.relations WHERE relation_id = p_relation_id;
    IF NOT FOUND THEN RAISE EXCEPTION 'unknown relation' USING ERRCODE = '22023'; END IF;
    IF p_column IS NULL THEN
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM ONLY %I.%I)', v_rel.physical_schema, v_rel.physical_relation)
            INTO v_found;
    ELSE
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM ONLY %I.%I WHERE %I IS NOT NULL)',
                       v_rel.physical_schema, v_rel.physical_relation, p_column) INTO v_found;
    END IF;
    RETURN v_found;
END $$;
REVOKE EXECUTE ON FUNCTION synchro.synchro_column_has_values(text, name) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_column_has_values(text, name) TO synchro_operator;
