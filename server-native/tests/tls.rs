//! TLS to PostgreSQL with libpq's parameters (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`),
//! for sessions and for the capture worker's replication stream, against a real cluster whose
//! pg_hba.conf takes TCP connections only over TLS (`hostssl`), with certificates this test
//! makes (a certificate authority, the server's for `localhost`, a client's).

use std::path::{Path, PathBuf};

use synchro_server::capture::worker::{Failpoint, Worker};
use synchro_server::connect_db;
use synchro_server::install;
use synchro_server::pg_harness::TempCluster;
use synchro_testkit::certs::{scratch_dir, Authority};

struct Setup {
    cluster: TempCluster,
    dir: PathBuf,
}

impl Setup {
    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// A connection string for `user` (password `pw`) on database `app` at `host`.
    fn url(&self, host: &str, user: &str, tls: &str) -> String {
        format!(
            "host={host} port={} user={user} password=pw dbname=app {tls}",
            self.cluster.port()
        )
    }
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

/// A cluster taking only TLS over TCP, with synchro installed in `app` by the superuser (on the
/// unix socket), a password login `app_user`, a REPLICATION worker login `app_worker`, and a
/// login `certuser` that authenticates with its client certificate alone.
async fn setup() -> Setup {
    let dir = scratch_dir("tls");
    let ca = Authority::new("synchro test CA");
    let other_ca = Authority::new("another CA");
    let (server_cert, server_key) = ca.issue("localhost", &["localhost"]);
    let (client_cert, client_key) = ca.issue("certuser", &[]);
    write(&dir, "ca.pem", &ca.pem);
    write(&dir, "other-ca.pem", &other_ca.pem);
    write(&dir, "client.pem", &client_cert);
    write(&dir, "client.key", &client_key);
    let mut cluster = TempCluster::start().unwrap();
    cluster
        .require_tls(
            &server_cert,
            &server_key,
            &ca.pem,
            &[
                "hostssl all certuser 127.0.0.1/32 cert",
                "hostssl all all 127.0.0.1/32 scram-sha-256",
                "hostssl replication all 127.0.0.1/32 scram-sha-256",
            ],
        )
        .unwrap();
    let boot = connect_db(&cluster.admin_url()).await.unwrap();
    boot.batch_execute("CREATE DATABASE app").await.unwrap();
    let mut admin = connect_db(&cluster.superuser_url("app")).await.unwrap();
    install::install(&mut admin).await.unwrap();
    admin
        .batch_execute(
            "CREATE ROLE app_user LOGIN PASSWORD 'pw';
             CREATE ROLE certuser LOGIN;
             CREATE ROLE app_worker LOGIN REPLICATION NOINHERIT PASSWORD 'pw';
             GRANT synchro_worker TO app_worker;",
        )
        .await
        .unwrap();
    Setup { cluster, dir }
}

/// Whether the session `db` is encrypted, as the server sees it.
async fn encrypted(db: &tokio_postgres::Client) -> bool {
    db.query_one(
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

async fn refused(url: &str) -> String {
    match connect_db(url).await {
        Ok(_) => panic!("connected with {url}"),
        Err(e) => format!("{e:#}"),
    }
}

#[tokio::test]
async fn sessions_follow_libpqs_sslmode_and_certificate_parameters() {
    let s = setup().await;
    let ca = format!("sslrootcert={}", s.file("ca.pem"));
    let other = format!("sslrootcert={}", s.file("other-ca.pem"));

    // verify-full: the right root and the certificate's host name.
    let db = connect_db(&s.url(
        "localhost",
        "app_user",
        &format!("sslmode=verify-full {ca}"),
    ))
    .await
    .unwrap();
    assert!(encrypted(&db).await);
    // The URL form reads the same parameters.
    let url = format!(
        "postgres://app_user:pw@localhost:{}/app?sslmode=verify-full&sslrootcert={}",
        s.cluster.port(),
        s.file("ca.pem")
    );
    assert!(encrypted(&connect_db(&url).await.unwrap()).await);

    // verify-full with a host the certificate does not name, or another root: refused.
    let err = refused(&s.url(
        "127.0.0.1",
        "app_user",
        &format!("sslmode=verify-full {ca}"),
    ))
    .await;
    assert!(err.contains("certificate"), "{err}");
    let err = refused(&s.url(
        "localhost",
        "app_user",
        &format!("sslmode=verify-full {other}"),
    ))
    .await;
    assert!(err.contains("certificate"), "{err}");

    // verify-ca checks the chain, not the name.
    let db = connect_db(&s.url("127.0.0.1", "app_user", &format!("sslmode=verify-ca {ca}")))
        .await
        .unwrap();
    assert!(encrypted(&db).await);
    let err = refused(&s.url(
        "127.0.0.1",
        "app_user",
        &format!("sslmode=verify-ca {other}"),
    ))
    .await;
    assert!(err.contains("certificate"), "{err}");

    // require encrypts without checking; with a root it checks the chain (libpq's rule).
    let db = connect_db(&s.url("127.0.0.1", "app_user", "sslmode=require"))
        .await
        .unwrap();
    assert!(encrypted(&db).await);
    let err = refused(&s.url("localhost", "app_user", &format!("sslmode=require {other}"))).await;
    assert!(err.contains("certificate"), "{err}");

    // prefer, the default: TLS when offered.
    let db = connect_db(&s.url("127.0.0.1", "app_user", ""))
        .await
        .unwrap();
    assert!(encrypted(&db).await);

    // disable: pg_hba.conf has no line for a plaintext connection.
    let err = refused(&s.url("127.0.0.1", "app_user", "sslmode=disable")).await;
    assert!(
        err.contains("no encryption") || err.contains("pg_hba.conf"),
        "{err}"
    );

    // A client certificate authenticates `certuser` (pg_hba `cert`): with it, in; without, out.
    let client = format!(
        "sslmode=verify-full {ca} sslcert={} sslkey={}",
        s.file("client.pem"),
        s.file("client.key")
    );
    let db = connect_db(&s.url("localhost", "certuser", &client))
        .await
        .unwrap();
    assert!(encrypted(&db).await);
    let err = refused(&s.url(
        "localhost",
        "certuser",
        &format!("sslmode=verify-full {ca}"),
    ))
    .await;
    assert!(err.contains("certificate"), "{err}");

    // A root file that cannot be read is refused before connecting, naming it.
    let err = refused(&s.url(
        "localhost",
        "app_user",
        "sslmode=verify-full sslrootcert=/nonexistent/ca.pem",
    ))
    .await;
    assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[tokio::test]
async fn the_capture_stream_runs_over_verified_tls() {
    let s = setup().await;
    let ca = format!("sslmode=verify-full sslrootcert={}", s.file("ca.pem"));
    let mut worker = Worker::connect(&s.url("localhost", "app_worker", &ca))
        .await
        .unwrap();
    let admin = connect_db(&s.cluster.superuser_url("app")).await.unwrap();
    // The stream's walsender is an encrypted session (pg_stat_ssl) once a step has run.
    let mut walsenders = Vec::new();
    for _ in 0..50 {
        worker.step(Failpoint::None).await.unwrap();
        walsenders = admin
            .query(
                "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
                  WHERE a.backend_type = 'walsender'",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, bool>(0))
            .collect();
        if !walsenders.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(walsenders, vec![true], "one walsender, encrypted");

    // A worker whose root does not vouch for the server never streams.
    let other = format!("sslmode=verify-full sslrootcert={}", s.file("other-ca.pem"));
    let outcome = match Worker::connect(&s.url("localhost", "app_worker", &other)).await {
        Err(e) => format!("{e:#}"),
        Ok(mut w) => match w.step(Failpoint::None).await {
            Err(e) => format!("{e:#}"),
            Ok(o) => panic!("a step ran over an unverified stream: {o:?}"),
        },
    };
    assert!(outcome.contains("certificate"), "{outcome}");
    let _ = std::fs::remove_dir_all(&s.dir);
}
