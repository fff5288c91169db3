//! The column types of application schemas (`vectors/source-types-v1.json`: naive
//! timestamps, enums, domains, citext, interval and network types, `DECIMAL(65,30)` at its
//! limits, arrays) through the native client engine against the real server binary on real
//! PostgreSQL: a row written in SQL arrives with each vector's exact wire value (its row
//! digest verified by the client on the way), a row written offline from those values is
//! pushed back, and PostgreSQL holds exactly what SQL itself stored.

mod common;

use std::time::{Duration, Instant};

use common::{free_port, source_types_fixture, source_types_same, start_server, wait_ready, Env};
use synchro_client::engine::Client;
use synchro_client::http::HttpTransport;
use synchro_client::queue::{LocalWrite, Operation};
use synchro_client::storage::Storage;
use synchro_protocol::json::Json;
use synchro_protocol::value::{Scalar, TypedValue};
use synchro_server::auth::mint;

const SECRET: &str = "app-types-secret-0123456789abcdefg";

#[tokio::test]
async fn application_types_round_trip_through_the_native_client() {
    let env = Env::installed().await;
    let cases = source_types_fixture(&env).await;
    let port = free_port();
    let origin = format!("http://127.0.0.1:{port}");
    let _server = start_server(&env, port, SECRET);
    wait_ready(&reqwest::Client::new(), &origin).await;
    let (base, _edge) = common::client_base(&origin, SECRET).await;

    let dir = std::env::temp_dir().join(format!("synchro-app-types-{}-{port}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let token = mint(SECRET.as_bytes(), "alice", 3600);
    let transport = HttpTransport::new(base, move || token.clone());
    let mut n = 0u8;
    let random = move || {
        n = n.wrapping_add(1);
        [n; 16]
    };
    let mut client = Client::open_with(
        Storage::open(dir.join("alice.db")).unwrap(),
        transport,
        random,
        synchro_client::engine::ClientConfig::new(),
    )
    .unwrap();

    // Row 1 arrives (capture's bootstrap copy) with each vector's wire value.
    let key = |id: i32| TypedValue::from_scalar(Scalar::Int(id)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (manifest, row) = loop {
        client.sync_once().await.unwrap();
        let manifest = client.manifest().unwrap().clone();
        let table_id = manifest.tables[0].table_id.clone();
        if let Some(row) = client
            .storage()
            .get_row(&manifest, &table_id, &key(1))
            .unwrap()
        {
            break (manifest, row);
        }
        assert!(Instant::now() < deadline, "row 1 never arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let table = &manifest.tables[0];
    let field_id = |name: &str| {
        table
            .fields
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("no field {name}"))
            .field_id
            .clone()
    };
    let local = |row: &[(String, TypedValue)], name: &str| {
        let id = field_id(name);
        row.iter()
            .find(|(f, _)| *f == id)
            .map(|(_, v)| v.to_wire())
            .unwrap()
    };
    for (i, c) in cases.iter().enumerate() {
        assert_eq!(
            local(&row, &format!("c{i}")),
            Json::parse(&c["wire"].to_string()).unwrap(),
            "{}",
            c["name"]
        );
    }

    // Offline: a new row from those values, written locally, then pushed.
    let mut columns = vec![(
        field_id("owner"),
        TypedValue::from_scalar(Scalar::String("alice".into())).unwrap(),
    )];
    for (i, c) in cases.iter().enumerate() {
        let f = table.field(&field_id(&format!("c{i}"))).unwrap();
        let wire = Json::parse(&c["wire"].to_string()).unwrap();
        columns.push((
            f.field_id.clone(),
            TypedValue::from_wire(&f.spec, &wire).unwrap(),
        ));
    }
    client
        .write(&LocalWrite {
            table_id: &table.table_id,
            operation: Operation::Insert,
            pk: &key(2),
            columns: &columns,
        })
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        client.sync_once().await.unwrap();
        let pushed: bool = env
            .admin
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM app.source_types WHERE id = 2)",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if pushed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the offline row was never pushed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let same = source_types_same(&env, cases.len(), 2, 1).await;
    for (i, c) in cases.iter().enumerate() {
        assert!(same[i], "pushed {} differs from what SQL stored", c["name"]);
    }
    // And the row comes back as the server holds it: the values the client wrote.
    client.sync_once().await.unwrap();
    let back = client
        .storage()
        .get_row(&manifest, &table.table_id, &key(2))
        .unwrap()
        .unwrap();
    for (i, c) in cases.iter().enumerate() {
        assert_eq!(
            local(&back, &format!("c{i}")),
            Json::parse(&c["wire"].to_string()).unwrap(),
            "{}",
            c["name"]
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
