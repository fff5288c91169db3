//! `synchro-server dev` end to end: throwaway PostgreSQL, install, demo schema, serving, a
//! printed development token that works, and a clean stop on SIGINT.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test]
async fn dev_serves_the_demo_schema_and_stops_cleanly() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_synchro-server"))
        .args(["dev", "--listen", &format!("127.0.0.1:{port}")])
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    // Whatever happens, stop the server (and with it its throwaway cluster).
    struct Interrupt(u32);
    impl Drop for Interrupt {
        fn drop(&mut self) {
            let _ = Command::new("kill")
                .args(["-INT", &self.0.to_string()])
                .status();
        }
    }
    let _guard = Interrupt(child.id());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut token = None;
    let mut saw_token_label = false;
    while token.is_none() && Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_secs(1)) {
            if saw_token_label {
                token = Some(line.trim().to_owned());
            }
            saw_token_label = line.contains("development token");
        }
    }
    let token = token.expect("dev printed a development token");
    let body = r#"{"protocol_version":3,"client_id":"c1","schema":{"version":0,"hash":""}}"#;
    let resp = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/sync/connect"))
        .header("authorization", format!("Bearer {token}"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["schema"]["action"], "replace");
    let tables: Vec<&str> = v["schema_definition"]["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["composition"].as_str().unwrap())
        .collect();
    assert_eq!(tables.len(), 2);
    assert!(tables.contains(&"multi_scope") && tables.contains(&"single_scope"));

    // SIGINT: graceful shutdown, which also stops and deletes the throwaway cluster.
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "dev exited with {status}");
            break;
        }
        assert!(Instant::now() < deadline, "dev did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
}
