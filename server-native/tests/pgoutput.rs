//! The pgoutput decoder against PostgreSQL's real output, including commit order,
//! unchanged TOAST values, key changes, truncation and logical messages.

use proptest::prelude::*;
use synchro_server::capture::pgoutput::{decode, Message, Value};
use synchro_server::connect_db;
use synchro_server::pg_harness::TempCluster;

fn t(s: &str) -> Value {
    Value::Text(s.as_bytes().to_vec())
}

/// Long on purpose: one stream of real transactions, each decoded message checked in commit
/// order.
#[tokio::test]
async fn decodes_real_pgoutput_in_commit_order() {
    let cluster = TempCluster::start().unwrap();
    let db = connect_db(&cluster.admin_url()).await.unwrap();
    let other = connect_db(&cluster.admin_url()).await.unwrap();
    db.batch_execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text, big text);
         ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL;
         CREATE PUBLICATION p FOR TABLE t;",
    )
    .await
    .unwrap();
    // A slot cannot be created in a transaction that wrote.
    db.batch_execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        .await
        .unwrap();
    db.batch_execute(
        "BEGIN;
         INSERT INTO t VALUES (1, 'a', NULL), (2, 'b', repeat('x', 100000));
         SELECT pg_logical_emit_message(true, 'synchro', 'fence-1');
         UPDATE t SET v = 'c' WHERE id = 2;
         COMMIT;",
    )
    .await
    .unwrap();
    // A transaction that began first but commits last is decoded last.
    db.batch_execute("BEGIN; INSERT INTO t VALUES (10, 'late', NULL);")
        .await
        .unwrap();
    other
        .batch_execute("INSERT INTO t VALUES (20, 'early', NULL)")
        .await
        .unwrap();
    db.batch_execute("COMMIT").await.unwrap();
    db.batch_execute(
        "BEGIN; UPDATE t SET id = 3 WHERE id = 1; DELETE FROM t WHERE id = 2; COMMIT;",
    )
    .await
    .unwrap();
    db.batch_execute("TRUNCATE t").await.unwrap();

    let rows = db
        .query(
            "SELECT data FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL,
               'proto_version', '1', 'publication_names', 'p', 'messages', 'true')",
            &[],
        )
        .await
        .unwrap();
    let messages: Vec<Message> = rows
        .iter()
        .map(|r| decode(r.get::<_, &[u8]>(0)).unwrap())
        .filter(|m| !matches!(m, Message::Relation { .. } | Message::Type { .. }))
        .collect();
    let relation = rows
        .iter()
        .map(|r| decode(r.get::<_, &[u8]>(0)).unwrap())
        .find_map(|m| match m {
            Message::Relation {
                oid,
                namespace,
                name,
                replica_identity,
                columns,
            } => Some((oid, namespace, name, replica_identity, columns)),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        (relation.1.as_str(), relation.2.as_str(), relation.3),
        ("public", "t", b'd')
    );
    let cols: Vec<(&str, bool)> = relation
        .4
        .iter()
        .map(|c| (c.name.as_str(), c.key))
        .collect();
    assert_eq!(cols, [("id", true), ("v", false), ("big", false)]);
    let rel = relation.0;

    let mut it = messages.into_iter();
    let mut next = || it.next().expect("another message");
    assert!(matches!(next(), Message::Begin { .. }));
    assert_eq!(
        next(),
        Message::Insert {
            relation: rel,
            new: vec![t("1"), t("a"), Value::Null]
        }
    );
    let Message::Insert { new, .. } = next() else {
        panic!()
    };
    assert_eq!(new[0], t("2"));
    let Message::LogicalMessage {
        transactional,
        prefix,
        content,
        ..
    } = next()
    else {
        panic!()
    };
    assert_eq!(
        (transactional, prefix.as_str(), content.as_slice()),
        (true, "synchro", &b"fence-1"[..])
    );
    // The unmodified TOASTed column is not sent again.
    assert_eq!(
        next(),
        Message::Update {
            relation: rel,
            key: None,
            old: None,
            new: vec![t("2"), t("c"), Value::Unchanged]
        }
    );
    let Message::Commit {
        commit_lsn: first_commit,
        ..
    } = next()
    else {
        panic!()
    };
    // Commit order: 20 before 10.
    assert!(matches!(next(), Message::Begin { .. }));
    assert_eq!(
        next(),
        Message::Insert {
            relation: rel,
            new: vec![t("20"), t("early"), Value::Null]
        }
    );
    let Message::Commit {
        commit_lsn: second_commit,
        ..
    } = next()
    else {
        panic!()
    };
    assert!(second_commit > first_commit);
    assert!(matches!(next(), Message::Begin { .. }));
    assert_eq!(
        next(),
        Message::Insert {
            relation: rel,
            new: vec![t("10"), t("late"), Value::Null]
        }
    );
    assert!(matches!(next(), Message::Commit { .. }));
    // A key change carries the old key; a delete carries only the key.
    assert!(matches!(next(), Message::Begin { .. }));
    let Message::Update {
        key: Some(key),
        new,
        ..
    } = next()
    else {
        panic!()
    };
    assert_eq!((key[0].clone(), new[0].clone()), (t("1"), t("3")));
    let Message::Delete {
        key: Some(key),
        old: None,
        ..
    } = next()
    else {
        panic!()
    };
    assert_eq!(key[0], t("2"));
    assert!(matches!(next(), Message::Commit { .. }));
    assert!(matches!(next(), Message::Begin { .. }));
    assert_eq!(
        next(),
        Message::Truncate {
            options: 0,
            relations: vec![rel]
        }
    );
    assert!(matches!(next(), Message::Commit { .. }));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256), tag in prop::sample::select(b"BCORYIUDTMx".to_vec())) {
        let mut input = vec![tag];
        input.extend(bytes);
        let _ = decode(&input);
        // Every strict prefix of a valid message is an error, not a panic or a message.
        let valid = [b'I', 0, 0, 0, 1, b'N', 0, 2, b'n', b't', 0, 0, 0, 1, b'z'];
        prop_assert!(decode(&valid).is_ok());
        for n in 0..valid.len() {
            prop_assert!(decode(&valid[..n]).is_err());
        }
    }
}
