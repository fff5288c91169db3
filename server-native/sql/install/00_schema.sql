-- synchro install 00: the schema, its privileges by default, the migration ledger and the
-- settings table.
-- Spec 001 "PostgreSQL schema and authorization", "Installation and migration baseline".
--
-- `synchro-server install` (server-native/src/install.rs) runs the files of this directory
-- concatenated in name order, in one transaction, as a superuser, after the six group roles
-- exist, and records them as ledger version 1 (server-native/sql/README.md). Only the
-- statements above this file's SET LOCAL ROLE run as the installer; every object is created
-- by synchro_owner, which may grant on what it owns.

CREATE SCHEMA synchro AUTHORIZATION synchro_owner;
-- Functions are SECURITY DEFINER: revoke before anything can be created in the schema.
REVOKE ALL ON SCHEMA synchro FROM PUBLIC;
GRANT USAGE ON SCHEMA synchro TO synchro_adapter, synchro_seed, synchro_monitor, synchro_operator, synchro_worker;
-- No function synchro_owner creates is executable by PUBLIC: each file grants EXECUTE to the
-- roles that need it, and repeats the REVOKE beside each function so it reads on its own.
-- (A per-schema default can only add to this global one, so none is set for functions; tables
-- and sequences give PUBLIC nothing by default; types give PUBLIC USAGE, which is of no use
-- without USAGE on the schema.)
ALTER DEFAULT PRIVILEGES FOR ROLE synchro_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- PostgreSQL 15 lets PUBLIC emit logical messages: only synchro_owner may, through its
-- SECURITY DEFINER fence (31_fences) and bootstrap (32_bootstrap) functions, so no session
-- can forge a fence or a bootstrap marker.
REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) TO synchro_owner;

SET LOCAL ROLE synchro_owner;

-- The ledger: one row per applied step (version 1 is this install script; later versions are
-- the upgrade scripts of server-native/sql/upgrades), with the SHA-256 of the text applied.
CREATE TABLE synchro.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    sha256 text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON synchro.schema_migrations FROM PUBLIC;

-- Operator settings, one text value per key; each file inserts the keys it reads.
CREATE TABLE synchro.settings (
    key text PRIMARY KEY,
    value text NOT NULL
);
REVOKE ALL ON synchro.settings FROM PUBLIC;
GRANT SELECT ON synchro.settings TO synchro_worker;
-- The largest bound a registration or a compaction batch may ask for (spec 003 "Strict
-- Positive Limits").
INSERT INTO synchro.settings (key, value) VALUES ('max_bound', '100000');
