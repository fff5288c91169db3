//! The database of the run: a throwaway cluster with synchro installed, and the synced table
//! `app.items (id bigint, owner text, val bigint, tag text)` in two kinds of scope: rows
//! whose owner is `shared` are in the shared scope `shared` every client holds, the others
//! in `user:<owner>` (each client is its own user `c<i>`).
//!
//! Every write a client makes sets `tag` to an identity of its own (`c<i>-<n>`, never used
//! twice), and an audit trigger records each application of a write to the table with it
//! (inserts and updates by the new tag, deletes by the row's ID): a write applied twice
//! leaves two audit rows, one never applied leaves none.

use anyhow::Result;
use synchro_server::pg_harness::TempCluster;
use synchro_server::registry::{register, RegisterRequest};
use synchro_server::{connect_db, dev, install, publish};

/// The database name.
pub const DB: &str = "app";
/// Rows in the shared scope before the run (tags `seed-<n>`).
pub const SEED_ROWS: i64 = 30;

/// Creates the cluster's database, synchro, the logins, the table with its audit trigger,
/// the seed rows, the registration, the membership rule, the shared scope, and publishes.
pub async fn database(cluster: &TempCluster) -> Result<()> {
    connect_db(&cluster.admin_url())
        .await?
        .batch_execute(&format!("CREATE DATABASE {DB}"))
        .await?;
    let url = |user: &str| cluster.url(user, DB);
    let mut admin = connect_db(&url("postgres")).await?;
    install::install(&mut admin).await?;
    for (login, group) in dev::DEV_LOGINS {
        dev::ensure_login(&admin, login, group).await?;
    }
    dev::ensure_worker_login(&admin, "synchro_dev_worker").await?;
    admin
        .batch_execute(&format!(
            "CREATE ROLE app_owner NOLOGIN; GRANT app_owner TO synchro_owner;
             CREATE SCHEMA app AUTHORIZATION app_owner;
             SET ROLE app_owner;
             CREATE TABLE app.items (id bigint PRIMARY KEY, owner text NOT NULL,
                                     val bigint NOT NULL, tag text NOT NULL);
             -- Not synced: one row per application of a write to app.items.
             CREATE TABLE app.items_audit (seq bigserial PRIMARY KEY, op text NOT NULL,
                                           id bigint NOT NULL, tag text NOT NULL,
                                           at timestamptz NOT NULL DEFAULT clock_timestamp());
             CREATE FUNCTION app.items_audit() RETURNS trigger LANGUAGE plpgsql
               SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
             BEGIN
               IF TG_OP = 'DELETE' THEN
                 INSERT INTO app.items_audit (op, id, tag) VALUES ('D', OLD.id, OLD.tag);
               ELSE
                 INSERT INTO app.items_audit (op, id, tag) VALUES (left(TG_OP, 1), NEW.id, NEW.tag);
               END IF;
               RETURN NULL;
             END $$;
             CREATE TRIGGER items_audit AFTER INSERT OR UPDATE OR DELETE ON app.items
               FOR EACH ROW EXECUTE FUNCTION app.items_audit();
             INSERT INTO app.items SELECT g, 'shared', 0, 'seed-' || g FROM generate_series(1, {SEED_ROWS}) g;
             RESET ROLE;
             CREATE SCHEMA rules AUTHORIZATION synchro_dev_operator;
             GRANT USAGE ON SCHEMA rules TO synchro_worker, synchro_owner;"
        ))
        .await?;
    let mut op = connect_db(&url("synchro_dev_operator")).await?;
    register(&op, &RegisterRequest::synced("app", "items", "multi_scope"))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    op.batch_execute(
        "CREATE FUNCTION rules.item_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC
           SELECT CASE WHEN owner = 'shared' THEN 'shared' ELSE 'user:' || owner END
             FROM synchro_projection.\"app.items\" WHERE id = p_id;
         END;
         REVOKE EXECUTE ON FUNCTION rules.item_scopes(bigint) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.item_scopes(bigint) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'items', 'rules.item_scopes(bigint)');
         SELECT synchro.synchro_add_shared_scope('shared');",
    )
    .await?;
    publish::publish(&mut op).await?;
    Ok(())
}
