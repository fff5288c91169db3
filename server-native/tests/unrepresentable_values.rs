//! Source values the portable types cannot hold (NaN, infinities, dates outside years
//! 1–9999 in UTC, 24:00:00, JSON outside I-JSON) are refused where they are written, never
//! left in the slot to block capture for everyone: the fence trigger refuses the statement
//! with SQLSTATE 22SY1 naming the relation and field IDs (never the value), registration
//! refuses a table whose rows already hold one, and push turns such a write into that
//! mutation's `invalid_value`. The SQL checks are compared with `text_to_wire`, the
//! conversion capture itself uses, on boundary corpora.

mod common;

use common::{free_port, start_server, wait_ready, Env};
use serde_json::{json, Value};
use synchro_protocol::jcs;
use synchro_protocol::types::{FieldSpec, PortableType};
use synchro_server::auth::mint;
use synchro_server::capture::values::{text_to_wire, ValueSource, SESSION_SETTINGS};
use synchro_server::capture::worker::{Failpoint, StepOutcome, Worker};
use synchro_server::publish::load_lineage;
use synchro_server::registry::{register, RegisterRequest, RegistrationError};
use tokio_postgres::Client;

const SQLSTATE: &str = "22SY1";

/// The field ID of `column` of `relation` (by physical name).
async fn field_id(db: &Client, relation: &str, column: &str) -> String {
    db.query_one(
        "SELECT f.field_id FROM synchro.fields f JOIN synchro.relations r USING (relation_id)
          WHERE r.physical_relation = $1 AND f.column_name = $2",
        &[&relation, &column],
    )
    .await
    .unwrap()
    .get(0)
}

/// Runs `sql`, expecting the refusal: returns (message, detail).
async fn refused(db: &Client, sql: &str) -> (String, String) {
    let e = db
        .batch_execute(sql)
        .await
        .expect_err(&format!("{sql} was accepted"));
    let d = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
    assert_eq!(d.code().code(), SQLSTATE, "{sql}: {}", d.message());
    (d.message().to_owned(), d.detail().unwrap_or("").to_owned())
}

/// The refusal names the relation and exactly the field, and no value.
fn assert_names_field_not_value(
    (message, detail): &(String, String),
    relation_id: &str,
    field: &str,
    value: &str,
) {
    assert!(message.starts_with("unrepresentable_value: "), "{message}");
    assert!(
        message.contains(relation_id) && message.contains(field),
        "{message}"
    );
    let body: Value = serde_json::from_str(detail).unwrap();
    assert_eq!(
        body,
        json!({"error": {"code": "unrepresentable_value", "relation_id": relation_id, "field_ids": [field]}})
    );
    // The literal as written and every run of 3+ of its digits or letters.
    let mut fragments = vec![value.to_owned()];
    fragments.extend(
        value
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|f| f.len() >= 3 && !["fld", "rel"].contains(f))
            .map(str::to_owned),
    );
    for f in fragments {
        let lower = f.to_ascii_lowercase();
        let text = format!("{message} {detail}").to_ascii_lowercase();
        let named_ids = text
            .replace(&relation_id.to_ascii_lowercase(), "")
            .replace(&field.to_ascii_lowercase(), "");
        assert!(
            !named_ids.contains(&lower),
            "the refusal quotes {f:?}: {message} {detail}"
        );
    }
}

/// The projected wire value of `column` in the row with key `id` of app.vals.
async fn projected_value(env: &Env, relation_id: &str, column: &str, id: i64) -> String {
    let f = field_id(&env.admin, "vals", column).await;
    let key = field_id(&env.admin, "vals", "id").await;
    env.admin
        .query_one(
            "SELECT (row_json::jsonb -> $1)::text FROM synchro.projection_rows
              WHERE relation_id = $2 AND row_json::jsonb ->> $3 = $4",
            &[&f, &relation_id, &key, &id.to_string()],
        )
        .await
        .unwrap()
        .get(0)
}

async fn drain(worker: &mut Worker) {
    loop {
        match worker.step(Failpoint::None).await.unwrap() {
            StepOutcome::Applied(0) => return,
            StepOutcome::Applied(_) => {}
            other => panic!("capture stopped: {other:?}"),
        }
    }
}

/// Each column with its refused literals and accepted boundary neighbours.
const CASES: &[(&str, &[&str], &[&str])] = &[
    (
        "f8",
        &["'NaN'", "'Infinity'", "'-Infinity'"],
        &["'1.7976931348623157e308'", "'-4.9e-324'", "'-0'"],
    ),
    (
        "f4",
        &["'NaN'", "'Infinity'", "'-Infinity'"],
        &["'3.4028235e38'", "'-1.4e-45'"],
    ),
    ("n", &["'NaN'"], &["'99999999.9999'", "'-0.0001'"]),
    (
        "d",
        &[
            "'infinity'",
            "'-infinity'",
            "'0001-12-31 BC'",
            "'10000-01-01'",
        ],
        &["'9999-12-31'", "'0001-01-01'"],
    ),
    (
        "ts",
        &[
            "'infinity'",
            "'-infinity'",
            "'0044-03-15 12:00+00 BC'",
            // Year 1 in its own offset, year 0 (1 BC) in UTC.
            "'0001-01-01 00:30+01'",
            "'10000-01-01 00:00+00'",
            // Year 9999 in its own offset, 10000 in UTC.
            "'9999-12-31 23:30-01'",
        ],
        &[
            "'9999-12-31 23:59:59.999999+00'",
            "'0001-01-01 00:00:00+00'",
            "'0001-01-01 01:00+01'",
            // Year 10000 in the session's time zone (Asia/Kolkata), 9999 in UTC.
            "'9999-12-31 23:00+00'",
        ],
    ),
    (
        "tm",
        &["'24:00:00'", "'23:59:60'", "'23:59:59.9999999'"],
        &["'23:59:59.999999'", "'00:00:00'"],
    ),
    (
        "jb",
        &[
            "'{\"big\": 9007199254740993}'",
            "'[-9007199254740992]'",
            // jsonb keeps the value, its text is 1000000000000000000000.
            "'[1e21]'",
            // Nearest binary64 is 1e20, which serializes as an integer.
            "'[100000000000000000000.5]'",
            "'[9007199254740991.5]'",
            "'[1e400]'",
            "'{\"a\": [{\"deep\": 123456789012345678}]}'",
        ],
        &[
            "'{\"big\": 9007199254740991}'",
            "'[-9007199254740991]'",
            "'[9007199254740991.4]'",
            // Serializes as 1e+23.
            "'[100000000000000000000000.5]'",
            "'[1e-400]'",
        ],
    ),
    (
        "js",
        &[
            "'{\"a\": 1, \"a\": 2}'",
            "'{\"a\": 1, \"\\u0061\": 2}'",
            "'{\"\\u0000\": 1, \"\\u0000\": 2}'",
            "'[\"\\ud800\"]'",
            "'\"\\udc00\\ud800\"'",
            "'[9007199254740992]'",
            "'[1e20]'",
            "'[1e400]'",
            "'[-1.7976931348623159e308]'",
        ],
        &[
            "'[1e21]'",
            "'{\"a\": 1, \"b\": 2}'",
            "'{\"\\u0000\": 1, \"\\u0001\": 2}'",
            "'[\"\\ud83d\\ude00\", \"\\\\ud800\"]'",
            "'[9007199254740991, -9007199254740991]'",
            "'[1.7976931348623157e308]'",
            "'[\"\\u0000\"]'",
        ],
    ),
];

/// Long on purpose: one case per refused value class, then capture is checked once for all
/// of them.
#[tokio::test]
async fn writes_of_unrepresentable_values_are_refused_and_capture_keeps_flowing() {
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.vals (id bigint PRIMARY KEY, label text, f8 float8, f4 float4, n numeric(12, 4),
           d date, ts timestamptz, tm time, jb jsonb, js json);
         INSERT INTO app.vals (id, label) VALUES (1, 'seed')",
    )
    .await;
    let op = env.login("synchro_dev_operator").await;
    let reg = register(&op, &RegisterRequest::synced("app", "vals", "single_scope"))
        .await
        .unwrap();
    let relation_id = reg["relation_id"].as_str().unwrap().to_owned();
    let mut worker = Worker::connect(&env.cluster.url("synchro_dev_worker", "app"))
        .await
        .unwrap();
    drain(&mut worker).await;

    // A writer in a session whose settings differ from the capture session's.
    let writer = env.login("postgres").await;
    writer
        .batch_execute(
            "SET TimeZone = 'Asia/Kolkata'; SET DateStyle = 'SQL, DMY'; SET extra_float_digits = 0",
        )
        .await
        .unwrap();
    let deep = |n: usize| format!("'{}{}'", "[".repeat(n), "]".repeat(n));
    let (deep_ok, deep_bad) = (deep(128), deep(129));
    let mut next_id = 100;
    let mut accepted = vec![1i64];
    let mut id_of = std::collections::HashMap::new();
    let mut cases: Vec<(&str, Vec<&str>, Vec<&str>)> = CASES
        .iter()
        .map(|(c, bad, good)| (*c, bad.to_vec(), good.to_vec()))
        .collect();
    for (column, bad, good) in cases.iter_mut() {
        if *column == "jb" || *column == "js" {
            bad.push(&deep_bad);
            good.push(&deep_ok);
        }
    }
    for (column, bad, good) in &cases {
        let field = field_id(&env.admin, "vals", column).await;
        for value in bad {
            next_id += 1;
            let e = refused(
                &writer,
                &format!("INSERT INTO app.vals (id, {column}) VALUES ({next_id}, {value})"),
            )
            .await;
            assert_names_field_not_value(&e, &relation_id, &field, value);
            let e = refused(
                &writer,
                &format!("UPDATE app.vals SET {column} = {value} WHERE id = 1"),
            )
            .await;
            assert_names_field_not_value(&e, &relation_id, &field, value);
            // Also inside a multi-row statement next to a good row: the statement is refused.
            refused(
                &writer,
                &format!(
                    "INSERT INTO app.vals (id, {column}) VALUES ({}, {}), ({next_id}, {value})",
                    next_id + 100_000,
                    good[0]
                ),
            )
            .await;
        }
        for value in good {
            next_id += 1;
            writer
                .batch_execute(&format!(
                    "INSERT INTO app.vals (id, {column}) VALUES ({next_id}, {value})"
                ))
                .await
                .unwrap_or_else(|e| panic!("{column} = {value}: {e:?}"));
            accepted.push(next_id);
            id_of.insert((*column, *value), next_id);
        }
        writer
            .batch_execute(&format!(
                "UPDATE app.vals SET {column} = {} WHERE id = 1",
                good[0]
            ))
            .await
            .unwrap();
    }
    // Deletes are never checked; a representable ordinary row still flows.
    writer
        .batch_execute("INSERT INTO app.vals (id, label) VALUES (99, 'after'); DELETE FROM app.vals WHERE id = 99;
                        INSERT INTO app.vals (id, label) VALUES (98, 'after')")
        .await
        .unwrap();
    accepted.push(98);
    // Rows whose json holds escapes PostgreSQL's json functions cannot decode are updated and
    // deleted with the right key.
    let nul_row = id_of[&("js", "'[\"\\u0000\"]'")];
    writer
        .batch_execute(&format!(
            "UPDATE app.vals SET label = 'kept' WHERE id = {};
             DELETE FROM app.vals WHERE id = {nul_row}",
            id_of[&("js", "'{\"\\u0000\": 1, \"\\u0001\": 2}'")]
        ))
        .await
        .unwrap();
    accepted.retain(|id| *id != nul_row);

    drain(&mut worker).await;
    let blocked: Option<String> = env
        .admin
        .query_one("SELECT blocked_reason FROM synchro.capture_state", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(blocked, None);
    let mut projected: Vec<i64> = env
        .admin
        .query(
            "SELECT (row_json::jsonb ->> $1)::bigint FROM synchro.projection_rows WHERE relation_id = $2",
            &[&field_id(&env.admin, "vals", "id").await, &relation_id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    projected.sort();
    accepted.sort();
    assert_eq!(projected, accepted, "every accepted row, and only those");

    // The boundary values arrive as their canonical wire values.
    let wire = |column: &'static str, id: i64| projected_value(&env, &relation_id, column, id);
    let row_of = |column: &'static str, value: &'static str| id_of[&(column, value)];
    assert_eq!(
        wire("d", row_of("d", "'9999-12-31'")).await,
        "\"9999-12-31\""
    );
    assert_eq!(
        wire("ts", row_of("ts", "'0001-01-01 01:00+01'")).await,
        "\"0001-01-01T00:00:00.000000Z\""
    );
    assert_eq!(
        wire("ts", row_of("ts", "'9999-12-31 23:00+00'")).await,
        "\"9999-12-31T23:00:00.000000Z\""
    );
    assert_eq!(
        wire("jb", row_of("jb", "'{\"big\": 9007199254740991}'")).await,
        "\"{\\\"big\\\":9007199254740991}\""
    );
    assert_eq!(wire("js", row_of("js", "'[1e21]'")).await, "\"[1e+21]\"");
    assert_eq!(
        wire("js", row_of("js", "'{\"\\u0000\": 1, \"\\u0001\": 2}'")).await,
        "\"{\\\"\\\\u0000\\\":1,\\\"\\\\u0001\\\":2}\""
    );
}

/// Registers `app.<relation>` (already created), returning the refusal's error body.
async fn registration_refusal(env: &Env, r: &RegisterRequest) -> Value {
    let op = env.login("synchro_dev_operator").await;
    op.batch_execute("SET TimeZone = 'Pacific/Kiritimati'")
        .await
        .unwrap();
    match register(&op, r).await {
        Err(RegistrationError::Invalid(body, code, _)) => {
            assert_eq!(code, "42P17");
            body
        }
        other => panic!("{} registered: {other:?}", r.relation),
    }
}

#[tokio::test]
async fn registration_refuses_a_relation_whose_rows_hold_an_unrepresentable_value() {
    let env = Env::installed().await;
    let tables: &[(&str, &str, &str)] = &[
        ("float8", "'NaN'", "'1e308'"),
        ("float4", "'-Infinity'", "'1'"),
        ("numeric(10, 2)", "'NaN'", "'1.5'"),
        ("date", "'0001-01-01 BC'", "'0001-01-01'"),
        (
            "timestamptz",
            "'0001-01-01 00:30+01'",
            "'9999-12-31 20:00+00'",
        ),
        ("time", "'24:00'", "'23:59:59.999999'"),
        ("jsonb", "'{\"big\": 9007199254740993}'", "'{\"big\": 1}'"),
        ("json", "'{\"a\": 1, \"a\": 1}'", "'{\"a\": 1}'"),
    ];
    for (i, (ty, bad, good)) in tables.iter().enumerate() {
        let table = format!("t{i}");
        env.as_app_owner(&format!(
            "CREATE TABLE app.{table} (id int PRIMARY KEY, other text, v {ty});
             INSERT INTO app.{table} VALUES (1, 'x', {good}), (2, 'y', {bad}), (3, 'z', NULL)"
        ))
        .await;
        let body = registration_refusal(
            &env,
            &RegisterRequest::synced("app", &table, "single_scope"),
        )
        .await;
        // Not a reason of spec 000's closed list: invalid_column, naming the column and no
        // ID (the registration's IDs were rolled back with it).
        assert_eq!(
            body,
            json!({"error": {"code": "invalid_column", "reason": "unrepresentable_value", "column": "v"}}),
            "{ty}"
        );
        // Nothing was recorded; without the value the same table registers and gets the check.
        let recorded: i64 = env
            .admin
            .query_one(
                "SELECT count(*) FROM synchro.relations WHERE physical_relation = $1",
                &[&table],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(recorded, 0, "{ty}");
        env.as_app_owner(&format!("DELETE FROM app.{table} WHERE id = 2"))
            .await;
        let op = env.login("synchro_dev_operator").await;
        op.batch_execute("SET TimeZone = 'Pacific/Kiritimati'")
            .await
            .unwrap();
        register(&op, &RegisterRequest::synced("app", &table, "single_scope"))
            .await
            .unwrap_or_else(|e| panic!("{ty}: {e:?}"));
        let e = env
            .admin
            .batch_execute(&format!("INSERT INTO app.{table} VALUES (2, 'y', {bad})"))
            .await
            .unwrap_err();
        assert_eq!(e.as_db_error().unwrap().code().code(), SQLSTATE, "{ty}");
    }

    // A generated column, and a capture_dependency relation, are checked the same way.
    env.as_app_owner(
        "CREATE TABLE app.gen (id int PRIMARY KEY, n bigint,
           j jsonb GENERATED ALWAYS AS (('[' || (n * 1000)::text || ']')::jsonb) STORED);
         INSERT INTO app.gen (id, n) VALUES (1, 1), (2, 9007199254741);
         CREATE TABLE app.dep (id int PRIMARY KEY, at date);
         INSERT INTO app.dep VALUES (1, 'infinity')",
    )
    .await;
    let body =
        registration_refusal(&env, &RegisterRequest::synced("app", "gen", "single_scope")).await;
    assert_eq!(body["error"]["reason"], "unrepresentable_value", "{body}");
    // Computed after BEFORE triggers: checked by an AFTER trigger on insert and update.
    env.as_app_owner("UPDATE app.gen SET n = 9007199254740 WHERE id = 2")
        .await;
    let op = env.login("synchro_dev_operator").await;
    let reg = register(&op, &RegisterRequest::synced("app", "gen", "single_scope"))
        .await
        .unwrap();
    let relation_id = reg["relation_id"].as_str().unwrap();
    let field = field_id(&env.admin, "gen", "j").await;
    for sql in [
        "INSERT INTO app.gen (id, n) VALUES (3, 9007199254741)",
        "UPDATE app.gen SET n = -9007199254741 WHERE id = 1",
    ] {
        let e = refused(&env.admin, sql).await;
        assert_names_field_not_value(&e, relation_id, &field, "9007199254741000");
    }
    env.admin
        .batch_execute("INSERT INTO app.gen (id, n) VALUES (3, -9007199254740)")
        .await
        .unwrap();
    let mut dep = RegisterRequest::synced("app", "dep", "single_scope");
    dep.kind = "capture_dependency".into();
    let body = registration_refusal(&env, &dep).await;
    assert_eq!(body["error"]["reason"], "unrepresentable_value", "{body}");
    env.as_app_owner("UPDATE app.dep SET at = '9999-12-31'")
        .await;
    let op = env.login("synchro_dev_operator").await;
    register(&op, &dep).await.unwrap();
    let e = env
        .admin
        .batch_execute("UPDATE app.dep SET at = '-infinity'")
        .await
        .unwrap_err();
    assert_eq!(e.as_db_error().unwrap().code().code(), SQLSTATE);
}

// There was a test here, `an_upgraded_database_gives_existing_registrations_the_checks`: it
// installed the schema up to the version before the value checks (migration 0024), registered
// a relation, upgraded, and showed the upgrade had given the existing registration the
// checking fence. That upgrade path no longer exists: the 26 pre-release migrations were
// squashed into one install script (server-native/sql/install/) before any database outside
// the team had run them, so every registration is made with the checks in place, and the step
// that re-created the fences of existing registrations went with the path. The refusal itself
// is held by `writes_of_unrepresentable_values_are_refused_and_capture_keeps_flowing`. An
// upgrade script that changes the fence again needs its own test of this kind.

/// Number tokens around every threshold of the I-JSON domain, plus pseudo-random ones.
fn number_corpus() -> Vec<String> {
    let mut out: Vec<String> = [
        "0", "-0", "0.0", "1", "-1", "1e0", "1E+0", "0e999999", "1e-400", "5e-324", "2e-324",
        "9007199254740991", "-9007199254740991", "9007199254740992", "-9007199254740992",
        "9007199254740993", "12345678901234567890", "9007199254740991.0",
        "9007199254740991.4999999999999999999", "9007199254740991.5", "-9007199254740991.5",
        "9007199254740992.0", "9.007199254740991e15", "9.0071992547409915e15",
        "9.007199254740992e15", "1e15", "1e16", "1e20", "1e21", "1E21", "-1e21", "1.0e21",
        "999999999999999934463.99999", "999999999999999934464", "999999999999999934464.0",
        "999999999999999934464.00001", "999999999999999868928.0", "999999999999999999999.9",
        "1e22", "1.5e300", "1.7976931348623157e308", "-1.7976931348623157e308",
        "1.7976931348623158e308", "1.7976931348623159e308", "1e308", "1e309", "1e400",
        "-1e400", "179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497791.9",
        "179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792.0",
        "0.1e1", "100e-2", "0.000000000000000000000000000000000000001e330",
        "1e99999999999999999999999999999999999999", "1e-99999999999999999999999999999999999999",
        "0.00000000000000000000000000000000000000000000000000000000000000000000000001e90",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Long mantissas beyond the 400 digits the SQL check keeps.
    out.push(format!("9007199254740991.{}1", "4".repeat(500)));
    out.push(format!("9007199254740991.{}", "9".repeat(500)));
    out.push(format!("17976931348623158{}e292", "0".repeat(450)));
    out.push(format!("1{}", "0".repeat(1000)));
    // Pseudo-random tokens concentrated near 2^53, 1e21 and the binary64 maximum.
    let mut seed: u64 = 0x5eed_1234_abcd_9876;
    let mut next = |m: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % m
    };
    for _ in 0..3000 {
        let digits: String = (0..1 + next(24))
            .map(|_| char::from(b'0' + next(10) as u8))
            .collect();
        let digits = digits.trim_start_matches('0');
        let digits = if digits.is_empty() { "1" } else { digits };
        let anchor = [15i64, 16, 20, 21, 307, 308, 309, 0][next(8) as usize];
        let exp = anchor - digits.len() as i64 + next(3) as i64;
        let sign = if next(2) == 0 { "" } else { "-" };
        out.push(match next(3) {
            0 => format!("{sign}{digits}e{exp}"),
            1 if (0..30).contains(&exp) => format!("{sign}{digits}{}", "0".repeat(exp as usize)),
            _ => {
                let (a, b) = digits.split_at(1);
                format!("{sign}{a}.{b}0E{}", exp + digits.len() as i64 - 1)
            }
        });
    }
    out
}

#[tokio::test]
async fn the_sql_checks_refuse_exactly_what_capture_cannot_convert() {
    let env = Env::installed().await;
    let db = &env.admin;
    let json_spec = FieldSpec::new(PortableType::Json, true).unwrap();

    // Number tokens: the SQL rule against jcs.
    let tokens = number_corpus();
    let sql: Vec<bool> = db
        .query(
            "SELECT synchro.synchro_json_number_refused(t) FROM unnest($1::text[]) WITH ORDINALITY u(t, i) ORDER BY i",
            &[&tokens],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut refusals = 0;
    for (t, got) in tokens.iter().zip(&sql) {
        let want = jcs::canonical_json_number(t).is_err();
        assert_eq!(*got, want, "token {t}");
        refusals += usize::from(want);
    }
    assert!(
        refusals > 500 && refusals < tokens.len() - 500,
        "{refusals}"
    );

    // Whole json and jsonb values: the SQL checks against text_to_wire of PostgreSQL's text.
    let mut texts: Vec<String> = tokens.iter().map(|t| format!("[{t}]")).collect();
    for n in [1, 127, 128, 129, 200] {
        texts.push(format!("{}{}", "[".repeat(n), "]".repeat(n)));
        texts.push(format!("{}1{}", "{\"k\":".repeat(n), "}".repeat(n)));
        texts.push(format!(
            "[{}{}]",
            "{\"a\":[".repeat(n / 2),
            "]}".repeat(n / 2)
        ));
    }
    for t in [
        r#"{"a":1,"a":2}"#,
        r#"{"a":1,"b":{"c":1,"c":1}}"#,
        r#"{"a":1,"\u0061":2}"#,
        r#"{"é":1,"\u00e9":2}"#,
        r#"{"😀":1,"\ud83d\ude00":2}"#,
        r#"{"\u0000":1,"\u0000":2}"#,
        r#"{"\u0000":1,"\u0001":2}"#,
        r#"{"\u0000a":1,"\u0001a":2,"\u0002":[9007199254740992]}"#,
        r#"{"x\u0000":{"y":"\\u0000"},"x\u0001":1}"#,
        r#""\u0000""#,
        r#""\\u0000""#,
        r#""\ud800""#,
        r#""\udc00""#,
        r#""\ud800\u0041""#,
        r#""\ud800\ud800\udc00""#,
        r#""\\ud800""#,
        r#""\\\ud800""#,
        r#""\uD83D\uDE00""#,
        r#"{"\ud800":1}"#,
        r#"[1, "x", null, true, false, {"k": [1.5e300, -0.0]}]"#,
        "  [ 1e5 , 2 ]  ",
        "1",
        "\"s\"",
        "null",
        r#"{"k":12345678901234567}"#,
        r#"[1,2,3,4,5,6,7,8,9,10,11,120]"#,
    ] {
        texts.push(t.to_owned());
    }
    // jsonb refuses some of them on input (lone surrogates, \u0000, numbers numeric cannot hold).
    db.batch_execute(
        "CREATE FUNCTION pg_temp.try_jsonb(t text) RETURNS jsonb LANGUAGE plpgsql AS $$
         BEGIN RETURN t::jsonb; EXCEPTION WHEN data_exception THEN RETURN NULL; END $$",
    )
    .await
    .unwrap();
    let rows = db
        .query(
            "SELECT synchro.synchro_json_text_refused(t::json::text), t::json::text,
                    synchro.synchro_jsonb_refused(j), j::text
               FROM unnest($1::text[]) WITH ORDINALITY u(t, i), pg_temp.try_jsonb(t) j ORDER BY i",
            &[&texts],
        )
        .await
        .unwrap();
    let (mut json_refusals, mut jsonb_checked) = (0, 0);
    for (t, r) in texts.iter().zip(&rows) {
        let json_text: String = r.get(1);
        let want =
            text_to_wire(&json_spec, &ValueSource::Scalar(114), json_text.as_bytes()).is_err();
        assert_eq!(r.get::<_, bool>(0), want, "json {t}");
        json_refusals += usize::from(want);
        if let Some(jsonb_text) = r.get::<_, Option<String>>(3) {
            let want = text_to_wire(
                &json_spec,
                &ValueSource::Scalar(3802),
                jsonb_text.as_bytes(),
            )
            .is_err();
            assert_eq!(r.get::<_, Option<bool>>(2), Some(want), "jsonb {t}");
            jsonb_checked += 1;
        }
    }
    assert!(
        json_refusals > 500 && jsonb_checked > 3000,
        "{json_refusals} {jsonb_checked}"
    );

    // Scalars: to_jsonb's text (in UTC) against text_to_wire of the capture session's text.
    let scalars: &[(&str, PortableType, u32, &str)] = &[
        ("float8", PortableType::Float, 701, "NaN|Infinity|-Infinity|0|-0|1.7976931348623157e308|4.9e-324|0.1"),
        ("float4", PortableType::Float, 700, "NaN|Infinity|-Infinity|3.4028235e38|1.4e-45|-0"),
        ("numeric(8, 3)", PortableType::Decimal, 1700, "NaN|0|-99999.999|0.001"),
        ("date", PortableType::Date, 1082, "infinity|-infinity|0001-01-01|0001-12-31 BC|4713-01-01 BC|9999-12-31|10000-01-01|5874897-12-31|2024-02-29"),
        ("timestamptz", PortableType::Datetime, 1184, "infinity|-infinity|0001-01-01 00:00+00|0001-01-01 00:00+00:01|0001-01-01 00:00-00:01|9999-12-31 23:59:59.999999+00|9999-12-31 23:59:59.999999-00:01|10000-01-01 00:00+00|0044-03-15 BC|294276-12-31 23:59:59+00|2024-02-29 12:00:00.5+05:30"),
        ("time", PortableType::Time, 1083, "00:00|23:59:59.999999|24:00|23:59:60|12:00:00.5"),
        ("timestamp", PortableType::Datetime, 1114, "infinity|-infinity|0001-01-01 00:00|0044-03-15 BC|9999-12-31 23:59:59.999999|10000-01-01 00:00|294276-12-31 23:59:59|2024-02-29 12:00:00.5"),
    ];
    // In the capture session's settings (the trigger and registration set TimeZone to UTC
    // themselves; the other tests write from sessions in other time zones).
    db.batch_execute(SESSION_SETTINGS).await.unwrap();
    for (ty, portable, oid, literals) in scalars {
        let spec = match portable {
            PortableType::Decimal => FieldSpec::decimal(true, 8, 3).unwrap(),
            p => FieldSpec::new(*p, true).unwrap(),
        };
        let kind: String = db
            .query_one(
                &format!("SELECT synchro.synchro_value_check_kind($1, '{ty}'::regtype, NULL)"),
                &[&portable.as_str()],
            )
            .await
            .unwrap()
            .get(0);
        for lit in literals.split('|') {
            let r = db
                .query_one(
                    &format!(
                        "SELECT v::text, synchro.synchro_scalar_refused($1, to_jsonb(v) #>> '{{}}')
                           FROM (SELECT '{lit}'::{ty} AS v) s"
                    ),
                    &[&kind],
                )
                .await
                .unwrap();
            let text: String = r.get(0);
            let want = text_to_wire(&spec, &ValueSource::Scalar(*oid), text.as_bytes()).is_err();
            assert_eq!(r.get::<_, bool>(1), want, "{ty} {lit} ({text})");
        }
    }
}

/// A push stack on a table with json, jsonb and float4 columns.
///
/// Long on purpose: one case per value class, all in batches of the same client.
#[tokio::test]
async fn a_pushed_value_the_source_cannot_represent_is_that_mutations_invalid_value() {
    const SECRET: &str = "unrepresentable-secret-0123456789ab";
    let env = Env::installed().await;
    env.as_app_owner(
        "CREATE TABLE app.notes (id int PRIMARY KEY, title text, jb jsonb, js json, f4 float4)",
    )
    .await;
    common::register_with_rule(
        &env,
        "notes",
        "CREATE FUNCTION rules.note_scopes(p_id integer) RETURNS SETOF text LANGUAGE sql STABLE
         BEGIN ATOMIC SELECT 'shared' FROM synchro_projection.\"app.notes\" WHERE id = p_id; END;
         REVOKE EXECUTE ON FUNCTION rules.note_scopes(integer) FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION rules.note_scopes(integer) TO synchro_worker;
         SELECT synchro.synchro_register_membership_function('app', 'notes', 'rules.note_scopes(integer)');
         SELECT synchro.synchro_add_shared_scope('shared');",
    )
    .await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let _server = start_server(&env, port, SECRET);
    let http = reqwest::Client::new();
    wait_ready(&http, &base).await;
    let token = mint(SECRET.as_bytes(), "carol", 3600);
    let post = |path: &'static str, body: Value| {
        let (http, base, token) = (&http, &base, &token);
        async move {
            let r = http
                .post(format!("{base}{path}"))
                .header("authorization", format!("Bearer {token}"))
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (st, c) = post(
        "/sync/connect",
        json!({"protocol_version": 3, "client_id": "c1", "schema": {"version": 0, "hash": ""}}),
    )
    .await;
    assert_eq!(st, 200, "{c}");
    let schema = json!({"version": c["schema"]["version"], "hash": c["schema"]["hash"]});
    let generation = c["client_generation"].clone();
    let m = load_lineage(&env.login("synchro_dev_adapter").await)
        .await
        .unwrap()
        .current()
        .unwrap()
        .clone();
    let t = &m.tables[0];
    let fid = |name: &str| {
        t.fields
            .iter()
            .find(|f| f.name == name)
            .unwrap()
            .field_id
            .clone()
    };
    let mutation = |id: &str, op: &str, pk: i64, base: Value, columns: Vec<(&str, Value)>| {
        json!({
            "mutation_id": id, "table_id": t.table_id, "pk": pk, "operation": op,
            "base_version": base, "client_version": 1, "local_order": 1,
            "columns": columns.into_iter().map(|(f, v)| json!({"field_id": fid(f), "value": v})).collect::<Vec<_>>(),
            "authored_schema": {"version": m.schema_version, "hash": m.schema_hash_hex()},
        })
    };
    let push = |batch: &'static str, mutations: Vec<Value>| {
        let (schema, generation) = (schema.clone(), generation.clone());
        let post = &post;
        async move {
            let (st, v) = post(
                "/sync/push",
                json!({"protocol_version": 3, "client_id": "c1", "client_generation": generation,
                       "schema": schema, "batch_id": batch, "mutations": mutations}),
            )
            .await;
            assert_eq!(st, 200, "{v}");
            v
        }
    };
    // Canonical wire values all: 1e+21 and \u0000 are valid json, 1e+300 a valid float; the
    // source cannot keep them in jsonb or float4. A json integer beyond 2^53-1 is not even
    // a canonical wire value.
    let v = push(
        "b1",
        vec![
            mutation(
                "m1",
                "insert",
                1,
                Value::Null,
                vec![("jb", json!("[1e+21]"))],
            ),
            mutation(
                "m2",
                "insert",
                2,
                Value::Null,
                vec![("jb", json!("{\"a\":\"\\u0000\"}"))],
            ),
            mutation("m3", "insert", 3, Value::Null, vec![("f4", json!(1e300))]),
            mutation(
                "m4",
                "insert",
                4,
                Value::Null,
                vec![("jb", json!("{\"big\":9007199254740993}"))],
            ),
            mutation(
                "m5",
                "insert",
                5,
                Value::Null,
                vec![("js", json!("[1e+21]")), ("title", json!("kept"))],
            ),
            mutation(
                "m6",
                "insert",
                6,
                Value::Null,
                vec![("jb", json!("{\"big\":9007199254740991}"))],
            ),
        ],
    )
    .await;
    let outcomes = v["outcomes"].as_array().unwrap();
    let got: Vec<(&str, Option<&str>)> = outcomes
        .iter()
        .map(|o| (o["status"].as_str().unwrap(), o["code"].as_str()))
        .collect();
    let invalid = ("rejected_terminal", Some("invalid_value"));
    assert_eq!(
        got,
        [
            invalid,
            invalid,
            invalid,
            invalid,
            ("applied", None),
            ("applied", None)
        ],
        "{v}"
    );
    for o in &outcomes[..4] {
        assert_eq!(o["retryable"], false);
        let text = o.to_string();
        assert!(
            !text.contains("1e+21")
                && !text.contains("9007199254740993")
                && !text.contains("1e+300"),
            "{o}"
        );
    }
    // The fence's refusal (a value PostgreSQL holds that the portable type cannot) and a
    // value the column's type refuses on its own (float4's range) name the field.
    assert_eq!(
        outcomes[0]["message"],
        "the value of jb cannot be held by its portable type"
    );
    assert_eq!(
        outcomes[2]["message"],
        "the database refuses the value of f4 (outside its type, enum or domain)"
    );

    // An update to such a value is refused too, and leaves the row as it was.
    let base = outcomes[5]["server_version"].clone();
    let v = push(
        "b2",
        vec![
            mutation(
                "m7",
                "update",
                6,
                base.clone(),
                vec![("jb", json!("[-1.5e+300]"))],
            ),
            mutation(
                "m8",
                "update",
                5,
                outcomes[4]["server_version"].clone(),
                vec![("title", json!("edited"))],
            ),
        ],
    )
    .await;
    assert_eq!(v["outcomes"][0]["code"], "invalid_value", "{v}");
    assert_eq!(v["outcomes"][1]["status"], "applied", "{v}");
    let rows: Vec<(i32, Option<String>, Option<String>)> = env
        .admin
        .query("SELECT id, title, jb::text FROM app.notes ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        rows,
        [
            (5, Some("edited".to_owned()), None),
            (6, None, Some("{\"big\": 9007199254740991}".to_owned()))
        ]
    );

    // Capture keeps flowing: both rows arrive, nothing is blocked.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let r = env
            .admin
            .query_one(
                "SELECT (SELECT blocked_reason FROM synchro.capture_state),
                        (SELECT count(*) FROM synchro.projection_rows p JOIN synchro.relations r USING (relation_id)
                          WHERE r.physical_relation = 'notes' AND p.row_json LIKE '%edited%'),
                        (SELECT count(*) FROM synchro.projection_rows p JOIN synchro.relations r USING (relation_id)
                          WHERE r.physical_relation = 'notes')",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(r.get::<_, Option<String>>(0), None);
        if r.get::<_, i64>(1) == 1 && r.get::<_, i64>(2) == 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never captured");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
