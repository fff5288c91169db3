//! The edge gateway (`edge-worker/`) under `wrangler dev` (real workerd, no account, no
//! network) in front of an origin: built once beforehand (`scripts/test-edge.sh` runs
//! `worker-build`; `SYNCHRO_EDGE_PREBUILT=1` makes wrangler's build step a no-op), started
//! per test on its own ports, its output kept in a file the canary test reads, and stopped
//! (its whole process group: wrangler and workerd) when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `wrangler dev` serving the gateway.
pub struct Edge {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// Where wrangler's and the worker's output goes.
    pub log: PathBuf,
    state: PathBuf,
}

/// The gateway's directory: `SYNCHRO_EDGE_DIR`, else `edge-worker/` of this checkout.
pub fn edge_dir() -> PathBuf {
    std::env::var_os("SYNCHRO_EDGE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../edge-worker")))
}

impl Edge {
    /// Starts the gateway in front of `origin` (a base URL) with the HS256 `secret`, and
    /// `vars` (`NAME`, value) beyond those; waits until it answers (up to 90 s).
    ///
    /// A port picked free can be taken by a parallel test's wrangler before this one binds
    /// it; then this wrangler exits and the port answers for the other test's gateway (and
    /// its server: a client saw `client_generation_expired` on its first pull). So the
    /// gateway counts as started only when its own output says it listens on its port, and
    /// is started again on other ports when it exits first.
    pub async fn start(origin: &str, secret: &str, vars: &[(&str, &str)]) -> Edge {
        let dir = edge_dir();
        let wrangler = dir.join("node_modules/.bin/wrangler");
        assert!(
            wrangler.exists() && dir.join("build/index.js").exists(),
            "the edge gateway is not built: run scripts/test-edge.sh (it installs wrangler and builds {})",
            dir.display()
        );
        let mut attempts = 0;
        loop {
            attempts += 1;
            let mut edge = Edge::spawn(&wrangler, &dir, origin, secret, vars);
            match edge.wait_listening().await {
                Ok(()) => {
                    edge.wait_answering().await;
                    return edge;
                }
                Err(output) if attempts < 5 => {
                    eprintln!("wrangler dev exited before listening; starting it again:\n{output}");
                }
                Err(output) => panic!("wrangler dev never listened; its output:\n{output}"),
            }
        }
    }

    fn spawn(
        wrangler: &std::path::Path,
        dir: &std::path::Path,
        origin: &str,
        secret: &str,
        vars: &[(&str, &str)],
    ) -> Edge {
        let port = crate::pg::free_port();
        let inspector = crate::pg::free_port();
        let base = format!("http://127.0.0.1:{port}");
        let logs = std::env::var_os("SYNCHRO_TEST_EDGE_LOGS")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        std::fs::create_dir_all(&logs).expect("the edge log directory");
        let log = logs.join(format!("edge-{port}.log"));
        let state = std::env::temp_dir().join(format!("synchro-edge-state-{port}"));
        let file = std::fs::File::create(&log).expect("the edge log file");
        // The secret goes in as a secret (an env file), so wrangler prints it hidden.
        std::fs::create_dir_all(&state).expect("the edge state directory");
        let secrets = state.join("secrets.env");
        std::fs::write(&secrets, format!("JWT_SECRET={secret}\n")).expect("the secrets file");
        let mut command = Command::new(wrangler);
        command
            .current_dir(dir)
            .args(["dev", "--ip", "127.0.0.1", "--port", &port.to_string()])
            .args(["--inspector-port", &inspector.to_string()])
            .args(["--persist-to", &state.to_string_lossy()])
            .args(["--var", &format!("ORIGIN_URL:{origin}")])
            .args(["--env-file", &secrets.to_string_lossy()]);
        for (name, value) in vars {
            command.args(["--var", &format!("{name}:{value}")]);
        }
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command
            .env("SYNCHRO_EDGE_PREBUILT", "1")
            .env("WRANGLER_SEND_METRICS", "false")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("the edge log file"))
            .stderr(file)
            .spawn()
            .expect("wrangler dev starts");
        Edge {
            child,
            base,
            log,
            state,
        }
    }

    /// Until this wrangler says it listens on its own port (up to 90 s); its output when it
    /// exits or fails to bind first.
    async fn wait_listening(&mut self) -> Result<(), String> {
        let ready = format!("Ready on {}", self.base);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let out = self.output();
            if out.contains(&ready) {
                return Ok(());
            }
            if out.contains("Address already in use")
                || matches!(self.child.try_wait(), Ok(Some(_)))
            {
                return Err(out);
            }
            assert!(
                Instant::now() < deadline,
                "wrangler dev never listened; its output:\n{out}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_answering(&self) {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if http
                .get(format!("{}/ready", self.base))
                .send()
                .await
                .is_ok()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "wrangler dev never answered; its output:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Everything wrangler and the worker printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The output once it contains `needle` (wrangler prints the worker's lines a little
    /// after the response), or whatever it is after 10 s.
    pub async fn output_containing(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = self.output();
            if out.contains(needle) || Instant::now() >= deadline {
                return out;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Edge {
    fn drop(&mut self) {
        // wrangler runs workerd as a child: stop the whole group.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.state);
    }
}
