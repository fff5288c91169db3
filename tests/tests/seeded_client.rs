//! A client opened from a portable seed (issue 30), against the real server binary on real
//! PostgreSQL with a seed exported by the real exporter: it reads the seeded rows before any
//! request, presents its receipts on the first connect and continues from the seed's
//! boundary with a normal pull, ending with exactly the rows and digests of a client that
//! rebuilt everything; it writes offline at once and the write applies; a tampered or
//! corrupt seed is refused before anything is installed and the client rebuilds; a receipt
//! the server no longer honours rebuilds its scope, and a scope no longer assigned is taken
//! away with its pending intent kept.

mod common;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::{free_port, start_server, wait_ready, Env, Server};
use synchro_client::engine::{
    Client, ClientConfig, Response, SeedOutcome, SyncReport, Transport, TransportError,
};
use synchro_client::http::HttpTransport;
use synchro_client::queue::{LocalWrite, Operation};
use synchro_client::storage::Storage;
use synchro_protocol::value::{Scalar, TypedValue};
use synchro_server::auth::mint;
use synchro_server::capture::worker::{Failpoint, StepOutcome, Worker};

const SECRET: &str = "seeded-client-secret-0123456789abc";

/// The real HTTP transport, recording every request path and body.
#[derive(Clone)]
struct Recorded {
    inner: Rc<HttpTransport>,
    seen: Rc<RefCell<Vec<(String, String)>>>,
}

impl Transport for Recorded {
    async fn post(&self, path: &str, body: String) -> Result<Response, TransportError> {
        self.seen.borrow_mut().push((path.to_owned(), body.clone()));
        self.inner.post(path, body).await
    }
}

struct Stack {
    env: Env,
    _server: Server,
    base: String,
    dir: PathBuf,
    seed: PathBuf,
}

type Row = (i64, String, Option<String>);

impl Stack {
    /// `app.docs (id, team, title)`: 900 rows, each in `board:<team>`; the three boards are
    /// shared, `board:a` and `board:b` declared portable and exported as one seed (before
    /// the server starts, so the seed's boundary is behind what the server then serves).
    async fn start() -> Stack {
        let env = Env::installed().await;
        env.as_app_owner(
            "CREATE TABLE app.docs (id bigint PRIMARY KEY, team text NOT NULL, title text);
             INSERT INTO app.docs SELECT g, (ARRAY['a', 'b', 'c'])[1 + g % 3], 'doc ' || g
               FROM generate_series(1, 900) g",
        )
        .await;
        common::register_with_rule(
            &env,
            "docs",
            "CREATE FUNCTION rules.doc_scopes(p_id bigint) RETURNS SETOF text LANGUAGE sql STABLE
             BEGIN ATOMIC SELECT 'board:' || team FROM synchro_projection.\"app.docs\" WHERE id = p_id; END;
             REVOKE EXECUTE ON FUNCTION rules.doc_scopes(bigint) FROM PUBLIC;
             GRANT EXECUTE ON FUNCTION rules.doc_scopes(bigint) TO synchro_worker;
             SELECT synchro.synchro_register_membership_function('app', 'docs', 'rules.doc_scopes(bigint)');
             SELECT synchro.synchro_add_shared_scope(s) FROM unnest(ARRAY['board:a', 'board:b', 'board:c']) s;
             SELECT synchro.synchro_declare_portable_scope(s) FROM unnest(ARRAY['board:a', 'board:b']) s;",
        )
        .await;
        {
            let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
                .await
                .unwrap();
            while worker.step(Failpoint::None).await.unwrap() != StepOutcome::Applied(0) {}
        }
        let dir = std::env::temp_dir().join(format!(
            "synchro-seeded-client-{}-{}",
            std::process::id(),
            free_port()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let seed = dir.join("boards.seed.sqlite");
        let mut db = env.login("synchro_dev_seed").await;
        let verified = synchro_server::seed::export(
            &mut db,
            &["board:a".to_owned(), "board:b".to_owned()],
            250,
            |_| {},
        )
        .await
        .unwrap();
        synchro_server::seed::write_artifact(&verified, &seed).unwrap();
        let port = free_port();
        let server = start_server(&env, port, SECRET);
        let base = format!("http://127.0.0.1:{port}");
        wait_ready(&reqwest::Client::new(), &base).await;
        Stack {
            env,
            _server: server,
            base,
            dir,
            seed,
        }
    }

    fn transport(&self, user: &str) -> Recorded {
        let token = mint(SECRET.as_bytes(), user, 3600);
        Recorded {
            inner: Rc::new(HttpTransport::new(self.base.clone(), move || token.clone())),
            seen: Rc::default(),
        }
    }

    /// Alice's client over `file`, created from `seed`.
    fn seeded(&self, file: &str, seed: &Path) -> (Client<Recorded>, SeedOutcome, Recorded) {
        let t = self.transport("alice");
        let (c, outcome) = Client::open_from_seed(
            &self.dir.join(file),
            seed,
            t.clone(),
            random_for(file),
            ClientConfig::new(),
        )
        .unwrap();
        (c, outcome, t)
    }

    /// Alice's client over `file`, opened plainly.
    fn plain(&self, file: &str) -> (Client<Recorded>, Recorded) {
        let t = self.transport("alice");
        let storage = Storage::open(self.dir.join(file)).unwrap();
        let c = Client::open_with(storage, t.clone(), random_for(file), ClientConfig::new());
        (c.unwrap(), t)
    }

    async fn source_rows(&self) -> Vec<Row> {
        self.env
            .admin
            .query("SELECT id, team, title FROM app.docs ORDER BY id", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    /// Syncs `c` until it holds what the source holds (the server captures asynchronously);
    /// returns every report.
    async fn converge(&self, c: &mut Client<Recorded>) -> Vec<SyncReport> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut reports = Vec::new();
        loop {
            reports.push(c.sync_once().await.unwrap());
            let want = self.source_rows().await;
            if local_rows(c) == want {
                return reports;
            }
            if Instant::now() > deadline {
                let local = local_rows(c);
                let differ: Vec<_> = local
                    .iter()
                    .filter(|r| !want.contains(r))
                    .chain(want.iter().filter(|r| !local.contains(r)))
                    .take(6)
                    .collect();
                panic!(
                    "never converged after {} rounds (last {:?}): {differ:?} {:?}",
                    reports.len(),
                    reports.last(),
                    c.storage()
                        .mutations()
                        .unwrap()
                        .iter()
                        .map(|m| m.state.as_str())
                        .collect::<Vec<_>>()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Deterministic randomness per file: the client ID, then mutation and batch IDs.
fn random_for(file: &str) -> impl FnMut() -> [u8; 16] {
    let seed = file
        .bytes()
        .fold(0u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    let mut n = 0u8;
    move || {
        n = n.wrapping_add(1);
        let mut r = [seed; 16];
        r[15] = n;
        r
    }
}

fn local_rows<T: Transport>(c: &Client<T>) -> Vec<Row> {
    let conn = c.storage().connection();
    let exists: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'docs'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    if exists == 0 {
        return Vec::new();
    }
    let mut q = conn
        .prepare("SELECT id, team, title FROM docs ORDER BY id")
        .unwrap();
    q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The server layer of `c`: every row's key, version and digest.
fn server_layer<T: Transport>(c: &Client<T>) -> Vec<(String, String, Vec<u8>)> {
    let mut q = c
        .storage()
        .connection()
        .prepare(r#"SELECT "pk", "server_version", "digest" FROM "_synchro_rows" ORDER BY 1"#)
        .unwrap();
    q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn paths(t: &Recorded) -> Vec<String> {
    t.seen.borrow().iter().map(|(p, _)| p.clone()).collect()
}

/// The scopes of every rebuild request `t` sent.
fn rebuilt_scopes(t: &Recorded) -> BTreeSet<String> {
    t.seen
        .borrow()
        .iter()
        .filter(|(p, _)| p == "/sync/rebuild")
        .map(|(_, b)| {
            let v: serde_json::Value = serde_json::from_str(b).unwrap();
            v["scope_id"].as_str().unwrap().to_owned()
        })
        .collect()
}

fn set_title<T: Transport>(c: &mut Client<T>, id: i64, title: &str) -> String {
    let docs = c
        .manifest()
        .unwrap()
        .tables
        .iter()
        .find(|t| t.name == "docs")
        .unwrap()
        .clone();
    let title_id = docs
        .fields
        .iter()
        .find(|f| f.name == "title")
        .unwrap()
        .field_id
        .clone();
    let pk = TypedValue::from_scalar(Scalar::Int64(id)).unwrap();
    c.write(&LocalWrite {
        table_id: &docs.table_id,
        operation: Operation::Update,
        pk: &pk,
        columns: &[(
            title_id,
            TypedValue::from_scalar(Scalar::String(title.into())).unwrap(),
        )],
    })
    .unwrap()
}

fn state_of<T: Transport>(c: &Client<T>, mutation_id: &str) -> String {
    c.storage()
        .mutations()
        .unwrap()
        .into_iter()
        .find(|m| m.mutation.mutation_id == mutation_id)
        .unwrap()
        .state
        .as_str()
        .to_owned()
}

#[tokio::test]
async fn a_seeded_client_continues_from_the_boundary_and_ends_as_a_rebuilt_one() {
    let s = Stack::start().await;
    // Changes after the export, in both seeded scopes and the other one.
    s.env
        .admin
        .batch_execute(
            "INSERT INTO app.docs VALUES (9001, 'a', 'after the seed'), (9002, 'c', 'in c');
             UPDATE app.docs SET title = 'changed after' WHERE id = 2;
             DELETE FROM app.docs WHERE id = 3;",
        )
        .await
        .unwrap();

    let (mut seeded, outcome, t) = s.seeded("seeded.db", &s.seed);
    let SeedOutcome::Installed(summary) = outcome else {
        panic!("the seed was not installed: {outcome:?}");
    };
    let scopes: Vec<(&str, u64)> = summary
        .scopes
        .iter()
        .map(|(s, n, _)| (s.as_str(), *n))
        .collect();
    assert_eq!(scopes, [("board:a", 300), ("board:b", 300)]);
    // Readable at once, before any request: the seed's 600 rows.
    assert!(paths(&t).is_empty());
    assert_eq!(local_rows(&seeded).len(), 600);

    // The scope index the seed's check built is the opened database's: the first terminal
    // digests do not load it from the tables again.
    let builds = seeded.storage().scope_index_builds();
    let reports = s.converge(&mut seeded).await;
    assert_eq!(seeded.storage().scope_index_builds(), builds, "{reports:?}");
    // The first connect presented both receipts and took both cursors: only board:c was
    // rebuilt, and the changes after the boundary came by pull.
    let first_connect: serde_json::Value = serde_json::from_str(&t.seen.borrow()[0].1).unwrap();
    assert_eq!(t.seen.borrow()[0].0, "/sync/connect");
    assert_eq!(
        first_connect["seed_receipts"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["board:a", "board:b"]
    );
    assert_eq!(
        rebuilt_scopes(&t),
        BTreeSet::from(["board:c", "user:alice"].map(String::from)),
        "{reports:?}"
    );
    // (9001 inserted and 3 deleted in board:a; board:c's two changes came with its rebuild.)
    assert!(reports.iter().map(|r| r.pulled_changes).sum::<u64>() >= 2);
    assert!(seeded.storage().seed_receipts().unwrap().is_empty());
    // Later connects present no receipt.
    let before = t.seen.borrow().len();
    seeded.sync_once().await.unwrap();
    let again: serde_json::Value = serde_json::from_str(&t.seen.borrow()[before].1).unwrap();
    assert!(again
        .get("seed_receipts")
        .is_none_or(|r| r.as_object().unwrap().is_empty()));

    // A client that rebuilt everything holds the same rows, versions and digests, and
    // every scope of both verified against the server's terminal digest.
    let (mut rebuilt, t2) = s.plain("rebuilt.db");
    s.converge(&mut rebuilt).await;
    assert_eq!(
        rebuilt_scopes(&t2),
        BTreeSet::from(["board:a", "board:b", "board:c", "user:alice"].map(String::from))
    );
    assert_eq!(local_rows(&seeded), local_rows(&rebuilt));
    assert_eq!(server_layer(&seeded), server_layer(&rebuilt));
    let all = BTreeSet::from(["board:a", "board:b", "board:c", "user:alice"].map(String::from));
    assert_eq!(seeded.sync_once().await.unwrap().verified, all);
    assert_eq!(rebuilt.sync_once().await.unwrap().verified, all);

    // Opening again with the seed uses the database as it is.
    drop(seeded);
    let (again, outcome, _) = s.seeded("seeded.db", &s.seed);
    assert!(matches!(outcome, SeedOutcome::Skipped), "{outcome:?}");
    assert_eq!(local_rows(&again), local_rows(&rebuilt));
}

#[tokio::test]
async fn a_seeded_client_writes_offline_at_once_and_the_write_applies() {
    let s = Stack::start().await;
    let (mut c, outcome, t) = s.seeded("offline.db", &s.seed);
    assert!(matches!(outcome, SeedOutcome::Installed(_)), "{outcome:?}");
    // Offline: no request yet. The seeded row carries its verified version as the base.
    let id = set_title(&mut c, 4, "written offline from the seed");
    assert!(paths(&t).is_empty());
    assert_eq!(state_of(&c, &id), "pending");
    s.converge(&mut c).await;
    assert_eq!(state_of(&c, &id), "applied");
    let title: String = s
        .env
        .admin
        .query_one("SELECT title FROM app.docs WHERE id = 4", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(title, "written offline from the seed");
    assert_eq!(
        rebuilt_scopes(&t),
        BTreeSet::from(["board:c", "user:alice"].map(String::from))
    );
}

#[tokio::test]
async fn a_tampered_or_corrupt_seed_is_refused_and_the_client_rebuilds() {
    let s = Stack::start().await;
    // One value changed in a copy (its digest kept): the row no longer digests.
    let altered = s.dir.join("altered.seed.sqlite");
    std::fs::copy(&s.seed, &altered).unwrap();
    {
        let conn = rusqlite::Connection::open(&altered).unwrap();
        conn.execute("UPDATE docs SET title = 'forged' WHERE id = 1", [])
            .unwrap();
    }
    // Valid rows and digests, but a trigger that would rewrite the client's queued writes
    // (no digest covers the schema), or an application version that would skip the app's
    // local tables.
    let trigger = s.dir.join("trigger.seed.sqlite");
    std::fs::copy(&s.seed, &trigger).unwrap();
    rusqlite::Connection::open(&trigger)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER forge AFTER INSERT ON _synchro_mutations BEGIN SELECT 1; END;",
        )
        .unwrap();
    let versioned = s.dir.join("versioned.seed.sqlite");
    std::fs::copy(&s.seed, &versioned).unwrap();
    rusqlite::Connection::open(&versioned)
        .unwrap()
        .execute_batch("PRAGMA user_version = 7;")
        .unwrap();
    // Half a file.
    let truncated = s.dir.join("truncated.seed.sqlite");
    let bytes = std::fs::read(&s.seed).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    // Not there at all.
    let missing = s.dir.join("missing.seed.sqlite");

    // A tampered seed found in place of the database (a copy whose check was interrupted)
    // is checked again when opened, and removed.
    std::fs::copy(&altered, s.dir.join("placed.db")).unwrap();

    for (file, seed) in [
        ("placed.db", &s.seed),
        ("altered.db", &altered),
        ("trigger.db", &trigger),
        ("versioned.db", &versioned),
        ("truncated.db", &truncated),
        ("missing.db", &missing),
    ] {
        let (mut c, outcome, t) = s.seeded(file, seed);
        let SeedOutcome::Refused(e) = outcome else {
            panic!("{file}: the seed was not refused: {outcome:?}");
        };
        assert_eq!(e.code(), "seed_invalid", "{file}: {e}");
        // Nothing of it installed: a fresh database, no rows, no receipt.
        assert!(c.manifest().is_none(), "{file}");
        assert!(local_rows(&c).is_empty(), "{file}");
        assert!(c.storage().seed_receipts().unwrap().is_empty());
        let names: Vec<String> = std::fs::read_dir(&s.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("seed-tmp"))
            .collect();
        assert!(names.is_empty(), "no temporary file left: {names:?}");
        // The normal path: every scope rebuilt.
        s.converge(&mut c).await;
        assert_eq!(
            rebuilt_scopes(&t),
            BTreeSet::from(["board:a", "board:b", "board:c", "user:alice"].map(String::from)),
            "{file}"
        );
    }
}

#[tokio::test]
async fn a_receipt_no_longer_honoured_rebuilds_and_an_unassigned_scope_is_taken_away() {
    let s = Stack::start().await;
    // board:a is no longer portable (its receipt is refused: the scope rebuilds), board:b
    // no longer shared (so no longer assigned to alice: it is taken away).
    s.env
        .admin
        .batch_execute(
            "SELECT synchro.synchro_undeclare_portable_scope('board:a');
             SELECT synchro.synchro_remove_shared_scope('board:b');",
        )
        .await
        .unwrap();
    let (mut c, outcome, t) = s.seeded("stale.db", &s.seed);
    assert!(matches!(outcome, SeedOutcome::Installed(_)), "{outcome:?}");
    // Offline intent on a row of board:b, which the server will take away.
    let id = set_title(&mut c, 4, "kept while unassigned");
    let report = c.sync_once().await.unwrap();
    assert_eq!(
        rebuilt_scopes(&t),
        BTreeSet::from(["board:a", "board:c", "user:alice"].map(String::from)),
        "{report:?}"
    );
    assert!(c.storage().seed_receipts().unwrap().is_empty());
    assert_eq!(c.storage().scope_state("board:b").unwrap(), None);
    // The intent was kept and pushed (the server decided it: alice no longer has the
    // scope), and board:b's rows without intent are gone.
    assert_ne!(state_of(&c, &id), "pending");
    let b: Vec<i64> = local_rows(&c)
        .into_iter()
        .filter(|(_, t, _)| t == "b")
        .map(|(id, _, _)| id)
        .collect();
    assert!(b.iter().all(|id| *id == 4), "{b:?}");
    let a = local_rows(&c).iter().filter(|(_, t, _)| t == "a").count();
    assert_eq!(a, 300);
}

/// Schema evolution meets a seed: a client opened from a seed of schema v1 and holding an
/// offline write, and a client already on v2 holding one too, sync after the server moved to
/// v2. The seed's receipts are answered null (not the current schema): the seeded client
/// migrates as any v1 client does, its seeded scopes rebuild under v2, and both writes apply.
#[tokio::test]
async fn a_seed_of_an_older_schema_follows_connect_dispatch_beside_a_newer_client() {
    use synchro_client::engine::SchemaActionKind;
    use synchro_server::publish::publish;
    use synchro_server::registry::{register, RegisterRequest};
    let s = Stack::start().await;
    // The old app: opened from the v1 seed, writes offline before the server changes.
    let (mut old, outcome, t_old) = s.seeded("old.db", &s.seed);
    assert!(matches!(outcome, SeedOutcome::Installed(_)), "{outcome:?}");
    let v1 = old.manifest().unwrap().schema_version;
    let old_write = set_title(&mut old, 10, "offline on v1 from the seed");

    // The server moves to v2 (a new table: Class 2).
    s.env
        .as_app_owner("CREATE TABLE app.tags (id text PRIMARY KEY, label text)")
        .await;
    let mut op = s.env.login("synchro_dev_operator").await;
    register(&op, &RegisterRequest::synced("app", "tags", "multi_scope"))
        .await
        .unwrap();
    publish(&mut op).await.unwrap();

    // The new app: a plain client on v2, which then writes offline too.
    let (mut new, _) = s.plain("new.db");
    let deadline = Instant::now() + Duration::from_secs(30);
    while new.manifest().map(|m| m.schema_version) != Some(v1 + 1) {
        assert!(Instant::now() < deadline, "v2 was never served");
        new.sync_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let new_write = set_title(&mut new, 11, "offline on v2");

    // Both sync: the seeded client migrates (its receipts refused, its boards rebuilt).
    let reports = s.converge(&mut old).await;
    assert_eq!(reports[0].action, SchemaActionKind::Replace, "{reports:?}");
    assert_eq!(old.manifest().unwrap().schema_version, v1 + 1);
    let connect: serde_json::Value = serde_json::from_str(&t_old.seen.borrow()[0].1).unwrap();
    assert_eq!(connect["seed_receipts"].as_object().unwrap().len(), 2);
    assert!(old.storage().seed_receipts().unwrap().is_empty());
    assert_eq!(
        rebuilt_scopes(&t_old),
        BTreeSet::from(["board:a", "board:b", "board:c", "user:alice"].map(String::from))
    );
    s.converge(&mut new).await;
    assert_eq!(state_of(&old, &old_write), "applied");
    assert_eq!(state_of(&new, &new_write), "applied");
    // Both end with the same rows, versions and digests (the writes' own changes come back
    // by pull once captured).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        old.sync_once().await.unwrap();
        new.sync_once().await.unwrap();
        if local_rows(&old) == local_rows(&new) && server_layer(&old) == server_layer(&new) {
            break;
        }
        assert!(Instant::now() < deadline, "the two clients never agreed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(local_rows(&old), s.source_rows().await);
    let titles: Vec<String> = s
        .env
        .admin
        .query(
            "SELECT title FROM app.docs WHERE id IN (10, 11) ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(titles, ["offline on v1 from the seed", "offline on v2"]);
}
