-- The installed synchro catalog as normalized text: one line (a function: one entry) per
-- fact, sorted. Used by server-native/tests/install_and_roles.rs to hold a fresh install to
-- server-native/sql/catalog.expected.txt and an upgraded database to a fresh one; see
-- server-native/sql/README.md.
--
-- Covered: the six group roles and their memberships among each other, the database and
-- pg_logical_emit_message privileges the install grants, the schemas synchro and
-- synchro_projection with owners and ACLs, synchro_owner's default privileges, every
-- relation (table, index, sequence, view, composite type) with owner and ACL, columns
-- (order, type, nullability, default, identity, generation, collation), constraints,
-- indexes, sequences, views, types, functions (signature, owner, kind, security definer,
-- volatility, strictness, configuration, ACL and pg_get_functiondef), triggers, policies,
-- rules, comments, extensions, the publication and its tables, the settings and
-- capture_state rows and every other table's row count.
-- Left out: OIDs, database names, timestamps; the order of ACL items (each ACL is sorted);
-- the ledger's rows (an install records its own steps); pg_attribute.atthasmissing (set on
-- a column added by ALTER TABLE ... ADD COLUMN ... DEFAULT, which matters only for rows
-- stored before the ALTER).
WITH
ns AS (SELECT oid, nspname FROM pg_namespace WHERE nspname IN ('synchro', 'synchro_projection')),
groups AS (SELECT oid, rolname FROM pg_roles WHERE rolname IN ('synchro_owner', 'synchro_adapter', 'synchro_seed', 'synchro_monitor', 'synchro_operator', 'synchro_worker')),
facts(x) AS (
    -- Roles of spec 001 and their memberships among each other.
    SELECT format('role %s login=%s super=%s createdb=%s createrole=%s bypassrls=%s replication=%s inherit=%s connlimit=%s config=%s',
                  r.rolname, r.rolcanlogin, r.rolsuper, r.rolcreatedb, r.rolcreaterole, r.rolbypassrls,
                  r.rolreplication, r.rolinherit, r.rolconnlimit, r.rolconfig)
      FROM pg_roles r JOIN groups g ON g.oid = r.oid
    UNION ALL
    SELECT format('role-member %s in %s admin=%s', m.rolname, g.rolname, am.admin_option)
      FROM pg_auth_members am JOIN groups g ON g.oid = am.roleid JOIN groups m ON m.oid = am.member
    UNION ALL
    -- The database privileges the install grants (the database's name left out).
    SELECT format('database-acl grantee=%s privilege=%s grantable=%s', g.rolname, a.privilege_type, a.is_grantable)
      FROM pg_database d, aclexplode(d.datacl) a JOIN groups g ON g.oid = a.grantee
     WHERE d.datname = current_database()
    UNION ALL
    -- Schemas.
    SELECT format('schema %s owner=%s acl=%s', n.nspname, pg_get_userbyid(s.nspowner),
                  (SELECT string_agg(i::text, ',' ORDER BY i::text COLLATE "C") FROM unnest(s.nspacl) i))
      FROM ns n JOIN pg_namespace s ON s.oid = n.oid
    UNION ALL
    -- Default privileges of synchro_owner (global and per schema).
    SELECT format('default-acl role=%s schema=%s type=%s acl=%s', pg_get_userbyid(d.defaclrole),
                  coalesce(n.nspname, '-'), d.defaclobjtype,
                  (SELECT string_agg(i::text, ',' ORDER BY i::text COLLATE "C") FROM unnest(d.defaclacl) i))
      FROM pg_default_acl d LEFT JOIN pg_namespace n ON n.oid = d.defaclnamespace
     WHERE d.defaclrole IN (SELECT oid FROM groups)
    UNION ALL
    -- Relations: tables, indexes, sequences, views, composite types.
    SELECT format('relation %s.%s kind=%s owner=%s persistence=%s options=%s replident=%s rls=%s acl=%s',
                  n.nspname, c.relname, c.relkind, pg_get_userbyid(c.relowner), c.relpersistence,
                  c.reloptions, c.relreplident, c.relrowsecurity,
                  coalesce((SELECT string_agg(i::text, ',' ORDER BY i::text COLLATE "C") FROM unnest(c.relacl) i), 'NULL'))
      FROM pg_class c JOIN ns n ON n.oid = c.relnamespace
    UNION ALL
    -- Columns, in order, with type, nullability, default, identity, generation, collation.
    SELECT format('column %s.%s #%s %s type=%s notnull=%s default=%s identity=%s generated=%s collation=%s acl=%s',
                  n.nspname, c.relname, lpad(a.attnum::text, 3, '0'), a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                  pg_get_expr(ad.adbin, ad.adrelid), a.attidentity, a.attgenerated,
                  CASE WHEN a.attcollation = 0 THEN '-' ELSE (SELECT collname FROM pg_collation WHERE oid = a.attcollation) END,
                  (SELECT string_agg(i::text, ',' ORDER BY i::text COLLATE "C") FROM unnest(a.attacl) i))
      FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN ns n ON n.oid = c.relnamespace
      LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
     WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind <> 'i'
    UNION ALL
    -- Constraints (named as PostgreSQL names them).
    SELECT format('constraint %s.%s %s type=%s deferrable=%s deferred=%s validated=%s %s',
                  n.nspname, coalesce(c.relname, t.typname), k.conname, k.contype, k.condeferrable, k.condeferred,
                  k.convalidated, pg_get_constraintdef(k.oid))
      FROM pg_constraint k JOIN ns n ON n.oid = k.connamespace
      LEFT JOIN pg_class c ON c.oid = k.conrelid LEFT JOIN pg_type t ON t.oid = k.contypid
    UNION ALL
    -- Indexes.
    SELECT format('index %s', pg_get_indexdef(i.indexrelid))
      FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN ns n ON n.oid = c.relnamespace
    UNION ALL
    -- Sequences, and what owns them.
    SELECT format('sequence %s.%s type=%s start=%s inc=%s min=%s max=%s cache=%s cycle=%s owned_by=%s',
                  n.nspname, c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin,
                  s.seqmax, s.seqcache, s.seqcycle,
                  (SELECT string_agg(format('%s.%s(%s)', oc.relname, oa.attname, d.deptype), ',')
                     FROM pg_depend d JOIN pg_class oc ON oc.oid = d.refobjid
                     JOIN pg_attribute oa ON oa.attrelid = d.refobjid AND oa.attnum = d.refobjsubid
                    WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.refclassid = 'pg_class'::regclass))
      FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid JOIN ns n ON n.oid = c.relnamespace
    UNION ALL
    -- Views.
    SELECT format('view %s.%s %s', n.nspname, c.relname, pg_get_viewdef(c.oid))
      FROM pg_class c JOIN ns n ON n.oid = c.relnamespace WHERE c.relkind IN ('v', 'm')
    UNION ALL
    -- Types (composite, enum, domain, and their arrays).
    SELECT format('type %s.%s kind=%s owner=%s acl=%s', n.nspname, t.typname, t.typtype, pg_get_userbyid(t.typowner),
                  coalesce((SELECT string_agg(i::text, ',' ORDER BY i::text COLLATE "C") FROM unnest(t.typacl) i), 'NULL'))
      FROM pg_type t JOIN ns n ON n.oid = t.typnamespace
    UNION ALL
    -- Functions: signature, owner, security, configuration, ACL and the full definition.
    SELECT format(E'function %s owner=%s kind=%s secdef=%s volatile=%s strict=%s leakproof=%s parallel=%s cost=%s rows=%s config=%s acl=%s\n%s',
                  p.oid::regprocedure, pg_get_userbyid(p.proowner), p.prokind, p.prosecdef, p.provolatile,
                  p.proisstrict, p.proleakproof, p.proparallel, p.procost, p.prorows, p.proconfig,
                  coalesce((SELECT string_agg(i::text, ',' ORDER BY i::text COLLATE "C") FROM unnest(p.proacl) i), 'NULL'),
                  pg_get_functiondef(p.oid))
      FROM pg_proc p JOIN ns n ON n.oid = p.pronamespace
    UNION ALL
    -- The two pg_logical_emit_message overloads (PUBLIC revoked at install).
    SELECT format('function %s acl=%s', p.oid::regprocedure,
                  coalesce((SELECT string_agg(i::text, ',' ORDER BY i::text COLLATE "C") FROM unnest(p.proacl) i), 'NULL'))
      FROM pg_proc p WHERE p.proname = 'pg_logical_emit_message'
    UNION ALL
    -- Triggers on synchro tables.
    SELECT format('trigger %s enabled=%s', pg_get_triggerdef(t.oid), t.tgenabled)
      FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN ns n ON n.oid = c.relnamespace
     WHERE NOT t.tgisinternal
    UNION ALL
    -- Row-level security policies and rules (none expected; listed so one would show).
    SELECT format('policy %s.%s %s', n.nspname, c.relname, p.polname)
      FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid JOIN ns n ON n.oid = c.relnamespace
    UNION ALL
    SELECT format('rule %s.%s %s', n.nspname, c.relname, r.rulename)
      FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class JOIN ns n ON n.oid = c.relnamespace
     WHERE r.rulename <> '_RETURN'
    UNION ALL
    -- Comments on synchro objects.
    SELECT format('comment %s %s', pg_describe_object(d.classoid, d.objoid, d.objsubid), d.description)
      FROM pg_description d
     WHERE (d.classoid = 'pg_namespace'::regclass AND d.objoid IN (SELECT oid FROM ns))
        OR (d.classoid = 'pg_class'::regclass AND d.objoid IN (SELECT c.oid FROM pg_class c JOIN ns n ON n.oid = c.relnamespace))
        OR (d.classoid = 'pg_proc'::regclass AND d.objoid IN (SELECT p.oid FROM pg_proc p JOIN ns n ON n.oid = p.pronamespace))
    UNION ALL
    -- Extensions the install would depend on (none).
    SELECT format('extension %s', e.extname) FROM pg_extension e WHERE e.extname <> 'plpgsql'
    UNION ALL
    -- The publication capture decodes, and its tables.
    SELECT format('publication %s owner=%s alltables=%s insert=%s update=%s delete=%s truncate=%s viaroot=%s',
                  p.pubname, pg_get_userbyid(p.pubowner), p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete,
                  p.pubtruncate, p.pubviaroot)
      FROM pg_publication p
    UNION ALL
    SELECT format('publication-table %s %s.%s', p.pubname, t.schemaname, t.tablename)
      FROM pg_publication p JOIN pg_publication_tables t ON t.pubname = p.pubname
    UNION ALL
    -- The data an install writes.
    SELECT format('row synchro.settings %s=%s', s.key, s.value) FROM synchro.settings s
    UNION ALL
    -- Every other table an install leaves empty (the ledger aside).
    SELECT format('rows %s.%s %s', n.nspname, c.relname,
                  (xpath('/row/n/text()', query_to_xml(format('SELECT count(*) AS n FROM %I.%I', n.nspname, c.relname),
                                                       false, true, '')))[1]::text)
      FROM pg_class c JOIN ns n ON n.oid = c.relnamespace
     WHERE c.relkind IN ('r', 'p') AND c.relname NOT IN ('schema_migrations', 'settings', 'capture_state')
    UNION ALL
    SELECT format('row synchro.capture_state %s', to_jsonb(c) - 'heartbeat_at' - 'blocked_at')
      FROM synchro.capture_state c
)
SELECT string_agg(x, E'\n' ORDER BY x COLLATE "C") FROM facts
