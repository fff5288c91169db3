//! Access ends when it ends (issue 31): a scope revoked between a client's connect and its
//! rebuild gets no rebuild page after the revocation; the client connects again, which takes
//! the scope away, and its round ends without it (not blocked), against the real server on
//! real PostgreSQL.

mod common;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

use common::{free_port, start_server, wait_ready, Env};
use synchro_client::engine::{Client, Response, Transport, TransportError};
use synchro_client::http::HttpTransport;
use synchro_client::storage::Storage;
use synchro_protocol::state::ClientState;
use synchro_server::auth::mint;

const SECRET: &str = "revocation-test-secret-0123456789ab";

/// The real HTTP transport; before the first rebuild request it runs `sql` on PostgreSQL.
struct RevokeFirst {
    inner: HttpTransport,
    admin: Rc<tokio_postgres::Client>,
    sql: RefCell<Option<&'static str>>,
    paths: Rc<RefCell<Vec<String>>>,
}

impl Transport for RevokeFirst {
    async fn post(&self, path: &str, body: String) -> Result<Response, TransportError> {
        self.paths.borrow_mut().push(path.to_owned());
        if path == "/sync/rebuild" {
            let sql = self.sql.borrow_mut().take();
            if let Some(sql) = sql {
                self.admin.batch_execute(sql).await.unwrap();
            }
        }
        self.inner.post(path, body).await
    }
}

#[tokio::test]
async fn a_scope_revoked_before_its_rebuild_is_taken_away_and_the_round_goes_on() {
    let env = Env::installed().await;
    common::docs_with_owner_and_team(
        &env,
        "INSERT INTO app.docs SELECT g, (ARRAY['alice', 'bob'])[1 + g % 2], (ARRAY['red', 'blue', 'red'])[1 + g % 3], 'doc ' || g
           FROM generate_series(1, 40) g",
    )
    .await;
    let port = free_port();
    let _server = start_server(&env, port, SECRET);
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&reqwest::Client::new(), &base).await;
    let admin = Rc::new(env.login("postgres").await);
    let token = mint(SECRET.as_bytes(), "alice", 3600);
    let paths = Rc::new(RefCell::new(Vec::new()));
    let transport = RevokeFirst {
        inner: HttpTransport::new(base, move || token.clone()),
        admin,
        // alice holds user:alice and team:red (granted); team:red is revoked after her
        // connect assigned it and before its rebuild.
        sql: RefCell::new(Some(
            "SELECT synchro.synchro_revoke_user_scope('alice', 'team:red')",
        )),
        paths: paths.clone(),
    };
    let mut n = 0u8;
    let mut c = Client::open(Storage::open_in_memory().unwrap(), transport, move || {
        n += 1;
        [n; 16]
    })
    .unwrap();
    let report = c.sync_once().await.unwrap();
    assert_eq!(c.state(), ClientState::Idle);
    assert_eq!(
        report.verified,
        BTreeSet::from(["user:alice".to_owned()]),
        "{report:?}"
    );
    assert_eq!(c.storage().scope_state("team:red").unwrap(), None);
    // Only alice's own rows: the revoked team's other rows (bob's red ones) never arrived.
    let owners: Vec<String> = {
        let conn = c.storage().connection();
        let mut q = conn
            .prepare("SELECT DISTINCT owner FROM docs ORDER BY 1")
            .unwrap();
        q.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    assert_eq!(owners, ["alice"]);
    // It connected again after the refusal.
    let connects = paths
        .borrow()
        .iter()
        .filter(|p| *p == "/sync/connect")
        .count();
    assert_eq!(connects, 2, "{:?}", paths.borrow());
}
