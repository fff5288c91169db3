//! Portable seeds (issue 30), against a real PostgreSQL: which scopes an operator may
//! declare portable, through the `synchro-server seed` commands an operator runs, and who
//! may do what.

mod common;

use std::process::Command;

use common::{sqlstate, Env};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_synchro-server");

/// `synchro-server <args>` as `login`: (exit code, the last JSON line of stdout).
fn cli(env: &Env, login: &str, args: &[&str]) -> (i32, Value) {
    let out = Command::new(BIN)
        .args(args)
        .env("DATABASE_URL", env.cluster.url(login, "app"))
        .env_remove("SYNCHRO_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), json)
}

#[tokio::test]
async fn only_shared_scopes_are_declared_portable_and_only_by_the_operator() {
    let env = Env::installed().await;
    let op = "synchro_dev_operator";
    env.admin
        .batch_execute("SELECT synchro.synchro_add_shared_scope('board:shared')")
        .await
        .unwrap();

    // Refused with a typed reason that names no scope, and nothing written.
    for (scope, reason) in [
        ("user:alice", "user_scope"),
        ("board:granted", "not_shared"),
        ("", "empty"),
    ] {
        env.admin
            .batch_execute("SELECT synchro.synchro_grant_user_scope('alice', 'board:granted')")
            .await
            .unwrap();
        let (code, out) = cli(&env, op, &["seed", "declare", "--scope", scope]);
        assert_eq!(code, 1, "{scope:?}: {out}");
        assert_eq!(
            out,
            json!({"error": {"code": "invalid_portable_scope", "reason": reason}}),
            "{scope:?}"
        );
    }
    let (code, out) = cli(&env, op, &["seed", "list"]);
    assert_eq!((code, out), (0, json!({"scopes": []})), "nothing declared");

    // A shared scope: declared once, a second time changes nothing.
    let (code, out) = cli(&env, op, &["seed", "declare", "--scope", "board:shared"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out,
        json!({"scope_id": "board:shared", "portable": true, "changed": true})
    );
    let (_, out) = cli(&env, op, &["seed", "declare", "--scope", "board:shared"]);
    assert_eq!(out["changed"], json!(false));
    let (_, out) = cli(&env, op, &["seed", "list"]);
    assert_eq!(out["scopes"].as_array().unwrap().len(), 1);
    assert_eq!(out["scopes"][0]["scope_id"], json!("board:shared"));
    assert_eq!(out["scopes"][0]["shared"], json!(true));

    // No longer shared: still declared, but listed as not shared (not portable).
    env.admin
        .batch_execute("SELECT synchro.synchro_remove_shared_scope('board:shared')")
        .await
        .unwrap();
    let (_, out) = cli(&env, op, &["seed", "list"]);
    assert_eq!(out["scopes"][0]["shared"], json!(false));

    // The seed login reads the declarations; only the operator changes them.
    let seed = env.login("synchro_dev_seed").await;
    let listed: i64 = seed
        .query_one(
            "SELECT count(*) FROM synchro.synchro_portable_scopes()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(listed, 1);
    for login in [
        "synchro_dev_seed",
        "synchro_dev_adapter",
        "synchro_dev_monitor",
    ] {
        let db = env.login(login).await;
        for sql in [
            "SELECT synchro.synchro_declare_portable_scope('board:shared')",
            "SELECT synchro.synchro_undeclare_portable_scope('board:shared')",
            "SELECT * FROM synchro.portable_scopes",
        ] {
            assert_eq!(sqlstate(&db, sql).await, "42501", "{login}: {sql}");
        }
    }
    for login in ["synchro_dev_adapter", "synchro_dev_monitor"] {
        let db = env.login(login).await;
        let sql = "SELECT * FROM synchro.synchro_portable_scopes()";
        assert_eq!(sqlstate(&db, sql).await, "42501", "{login}");
    }

    // Undeclared: once, then nothing to change.
    let (code, out) = cli(&env, op, &["seed", "undeclare", "--scope", "board:shared"]);
    assert_eq!(code, 0);
    assert_eq!(
        out,
        json!({"scope_id": "board:shared", "portable": false, "changed": true})
    );
    let (_, out) = cli(&env, op, &["seed", "undeclare", "--scope", "board:shared"]);
    assert_eq!(out["changed"], json!(false));
    let (_, out) = cli(&env, op, &["seed", "list"]);
    assert_eq!(out, json!({"scopes": []}));
}
