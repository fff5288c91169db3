-- The runtime logins of server-native/compose.yaml (psql, as the superuser, after
-- `synchro-server install`); idempotent, so the `logins` service can run at every `up`.
-- Passwords come in as psql variables (-v adapter_password=... and so on).
SELECT NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'app_adapter') AS create_adapter,
       NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'app_worker') AS create_worker,
       NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'app_operator') AS create_operator \gset
\if :create_adapter
CREATE ROLE app_adapter LOGIN;
\endif
\if :create_worker
-- The capture worker streams the slot: REPLICATION on this login only (spec 001).
CREATE ROLE app_worker LOGIN REPLICATION NOINHERIT;
\endif
\if :create_operator
CREATE ROLE app_operator LOGIN;
\endif
ALTER ROLE app_adapter PASSWORD :'adapter_password';
ALTER ROLE app_worker PASSWORD :'worker_password';
ALTER ROLE app_operator PASSWORD :'operator_password';
GRANT synchro_adapter TO app_adapter;
GRANT synchro_worker TO app_worker;
GRANT synchro_operator TO app_operator;
