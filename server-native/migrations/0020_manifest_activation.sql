-- synchro schema, version 20: a Class 3 manifest whose tables are not yet materialized (the
-- relation's bootstrap copy not finished, or its first membership rule not yet live) is not
-- served: connect, pull and rebuild keep using the manifest before it until the worker's
-- commit that completes them, so no client is told to rebuild from projections that lack
-- the new table's rows.

SET LOCAL ROLE synchro_owner;

CREATE FUNCTION synchro.synchro_unready_tables() RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, synchro, pg_temp AS $$
    SELECT r.table_id FROM synchro.relations r
      JOIN synchro.relation_capture c USING (relation_id)
      LEFT JOIN synchro.membership_functions m USING (relation_id)
     WHERE r.kind = 'synced' AND (c.status <> 'active' OR m.live IS FALSE)
$$;

RESET ROLE;

REVOKE EXECUTE ON FUNCTION synchro.synchro_unready_tables() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION synchro.synchro_unready_tables() TO synchro_adapter, synchro_operator, synchro_monitor;
