//! The browser's live session against a real server on real PostgreSQL, in a dedicated
//! worker of headless Chromium on OPFS: one `SynchroClient` goes live (`startLive`, the
//! events stream read through streaming `fetch`), another one writes and pushes a change,
//! and the live one receives the notification and applies the pulled page without polling
//! (its safety poll is 60 s).
//!
//! It needs a server: `scripts/test-live-browser.sh` starts one (PostgreSQL, the server
//! binary, fixture rows) and compiles this test with `SYNCHRO_LIVE_URL` and
//! `SYNCHRO_LIVE_TOKEN`; Chromium runs with `--disable-web-security` there because the test
//! page and the server are different origins and the server sends no CORS headers. Built
//! without those variables, the test says so and checks nothing.
#![cfg(target_arch = "wasm32")]

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Array, Function, Object, Promise, Reflect};
use synchro_client::wasm::SynchroClient;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::wasm_bindgen_test;

wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_dedicated_worker);

fn member(v: &JsValue, name: &str) -> JsValue {
    Reflect::get(v, &name.into()).unwrap()
}

async fn sleep(ms: i32) {
    let p = Promise::new(&mut |resolve, _| {
        let g: web_sys::WorkerGlobalScope = js_sys::global().unchecked_into();
        g.set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms)
            .unwrap();
    });
    JsFuture::from(p).await.unwrap();
}

async fn open(name: &str, url: &str, token: &str) -> SynchroClient {
    let token = Function::new_no_args(&format!("return Promise.resolve('{token}')"));
    SynchroClient::open(name.into(), url.into(), token, None, None)
        .await
        .unwrap()
}

#[wasm_bindgen_test]
async fn a_live_session_receives_a_notification_through_streaming_fetch_and_applies_it() {
    let (Some(url), Some(token)) = (
        option_env!("SYNCHRO_LIVE_URL"),
        option_env!("SYNCHRO_LIVE_TOKEN"),
    ) else {
        web_sys::console::log_1(
            &"live_browser: no SYNCHRO_LIVE_URL at build time; run scripts/test-live-browser.sh"
                .into(),
        );
        return;
    };
    let stamp = js_sys::Date::now() as u64;
    let live_db = open(&format!("/live-a-{stamp}.db"), url, token).await;
    let statuses: Rc<RefCell<Vec<String>>> = Rc::default();
    let sink = statuses.clone();
    let on_status = Closure::<dyn FnMut(JsValue)>::new(move |s: JsValue| {
        sink.borrow_mut()
            .push(member(&s, "status").as_string().unwrap());
    });
    let options = Object::new();
    Reflect::set(&options, &"safetyPollMs".into(), &60_000.into()).unwrap();
    let live = live_db
        .start_live(
            Some(options),
            Some(on_status.as_ref().clone().unchecked_into()),
        )
        .unwrap();
    let started = js_sys::Date::now();
    while !statuses.borrow().iter().any(|s| s == "live") {
        assert!(
            js_sys::Date::now() - started < 30_000.0,
            "{:?}",
            statuses.borrow()
        );
        sleep(20).await;
    }

    // Another client of the same user writes and pushes a change.
    let mut writer = open(&format!("/live-b-{stamp}.db"), url, token).await;
    writer.sync().await.unwrap();
    let title = format!("from the browser {stamp}");
    let columns = Object::new();
    Reflect::set(&columns, &"title".into(), &title.clone().into()).unwrap();
    writer
        .write(
            "docs".into(),
            "update".into(),
            "2".into(),
            columns.into(),
            None,
        )
        .unwrap();
    writer.sync().await.unwrap();
    let pushed = js_sys::Date::now();

    // The live session hears it and pulls; its database has the row.
    loop {
        let rows: Array =
            JsFuture::from(live.query("SELECT title FROM docs WHERE id = 2".into(), None))
                .await
                .unwrap()
                .unchecked_into();
        if rows.length() == 1 && member(&rows.get(0), "title") == title.as_str() {
            break;
        }
        assert!(
            js_sys::Date::now() - pushed < 15_000.0,
            "the change never arrived: {:?}",
            statuses.borrow()
        );
        sleep(20).await;
    }
    let latency = js_sys::Date::now() - pushed;
    web_sys::console::log_1(&format!("live_browser: push to visible {latency} ms").into());
    assert_eq!(
        statuses
            .borrow()
            .iter()
            .filter(|s| *s == "connecting")
            .count(),
        1,
        "connected once: {:?}",
        statuses.borrow()
    );

    live.stop();
    let done = JsFuture::from(live.done()).await.unwrap();
    assert_eq!(member(&done, "end"), "stopped");
    assert_eq!(
        statuses.borrow().last().map(String::as_str),
        Some("stopped")
    );
    // The database comes back as a SynchroClient.
    assert!(member(&done, "client").is_object());
}

/// The column types of application schemas (`vectors/source-types-v1.json`, row 1 of the
/// stack's `app.source_types` written in SQL) in the browser: each value arrives exactly as
/// its vector's wire value; a row written offline from those values is pushed and comes back
/// to another browser database the same (the stack then checks PostgreSQL holds exactly what
/// SQL stored, `tests/examples/live_stack.rs`).
#[wasm_bindgen_test]
async fn application_column_types_round_trip_in_the_browser() {
    let (Some(url), Some(token)) = (
        option_env!("SYNCHRO_LIVE_URL"),
        option_env!("SYNCHRO_LIVE_TOKEN"),
    ) else {
        return;
    };
    let vectors = js_sys::JSON::parse(include_str!("../../vectors/source-types-v1.json")).unwrap();
    let cases: Array = member(&vectors, "cases").unchecked_into();
    let stamp = js_sys::Date::now() as u64;
    let text = |v: &JsValue| js_sys::JSON::stringify(v).unwrap().as_string().unwrap();
    async fn row_of(client: &mut SynchroClient, id: i32) -> JsValue {
        let started = js_sys::Date::now();
        loop {
            client.sync().await.unwrap();
            let rows = client
                .query(format!("SELECT * FROM source_types WHERE id = {id}"), None)
                .unwrap();
            if rows.length() == 1 {
                return rows.get(0);
            }
            assert!(
                js_sys::Date::now() - started < 30_000.0,
                "row {id} never arrived"
            );
            sleep(50).await;
        }
    }
    let mut writer = open(&format!("/types-a-{stamp}.db"), url, token).await;
    let row = row_of(&mut writer, 1).await;
    for (i, case) in cases.iter().enumerate() {
        assert_eq!(
            text(&member(&row, &format!("c{i}"))),
            text(&member(&case, "wire")),
            "{}",
            text(&member(&case, "name"))
        );
    }
    // Offline: row 3 from the same values, then pushed.
    let columns = Object::new();
    Reflect::set(&columns, &"owner".into(), &"alice".into()).unwrap();
    for (i, case) in cases.iter().enumerate() {
        Reflect::set(&columns, &format!("c{i}").into(), &member(&case, "wire")).unwrap();
    }
    writer
        .write(
            "source_types".into(),
            "insert".into(),
            3.into(),
            columns.into(),
            None,
        )
        .unwrap();
    writer.sync().await.unwrap();
    let states: Vec<String> = writer
        .mutations()
        .unwrap()
        .iter()
        .map(|m| member(&m, "state").as_string().unwrap())
        .collect();
    assert_eq!(states, ["applied"]);
    // Another browser database receives it as the server holds it: the same values.
    let mut reader = open(&format!("/types-b-{stamp}.db"), url, token).await;
    let back = row_of(&mut reader, 3).await;
    for (i, case) in cases.iter().enumerate() {
        assert_eq!(
            text(&member(&back, &format!("c{i}"))),
            text(&member(&case, "wire")),
            "{}",
            text(&member(&case, "name"))
        );
    }
}
