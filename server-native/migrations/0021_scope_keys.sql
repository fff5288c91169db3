-- synchro schema, version 21: a scope's terminal checksum is computed from row digests the
-- server keeps in memory per (schema, table, key, server_version); these two functions let
-- it read only the keys and versions of a scope, and the rows of just the keys it has not
-- digested yet, inside the same snapshot.

SET LOCAL ROLE synchro_owner;

CREATE FUNCTION synchro.synchro_scope_keys(p_scope text)
RETURNS TABLE (table_id text, pk text, server_version text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT r.table_id, p.pk, p.server_version
      FROM synchro.membership_edges m
      JOIN synchro.projection_rows p ON p.relation_id = m.relation_id AND p.pk = m.pk
      JOIN synchro.relations r ON r.relation_id = m.relation_id
     WHERE m.scope_id = p_scope
$$;

CREATE FUNCTION synchro.synchro_scope_rows_of(p_scope text, p_table_ids text[], p_pks text[])
RETURNS TABLE (table_id text, pk text, row_json text, server_version text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT r.table_id, p.pk, p.row_json, p.server_version
      FROM unnest(p_table_ids, p_pks) AS k(table_id, pk)
      JOIN synchro.relations r ON r.table_id = k.table_id
      JOIN synchro.membership_edges m ON m.relation_id = r.relation_id AND m.pk = k.pk AND m.scope_id = p_scope
      JOIN synchro.projection_rows p ON p.relation_id = m.relation_id AND p.pk = m.pk
$$;

RESET ROLE;

REVOKE EXECUTE ON FUNCTION synchro.synchro_scope_keys(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION synchro.synchro_scope_rows_of(text, text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_scope_keys(text) TO synchro_adapter;
GRANT EXECUTE ON FUNCTION synchro.synchro_scope_rows_of(text, text[], text[]) TO synchro_adapter;
