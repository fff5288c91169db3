//! The server side as deployments run it: `synchro-server capture` (one worker per
//! database) and one or more `synchro-server serve` instances without a worker, each its own
//! process and its own adapter login (so the database's statistics tell them apart), all
//! behind the same PostgreSQL.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// A running `synchro-server` process; stopped (SIGTERM, then SIGKILL) on drop.
pub struct Process {
    child: Child,
}

/// A running `serve` instance.
pub struct Instance {
    process: Process,
    /// The loopback address it listens on.
    pub addr: std::net::SocketAddr,
}

/// Open connections and event streams one instance accepts: above the 10,000 streams of
/// the largest run, below the 20,000 open files a process may hold here.
const STREAM_CAP: &str = "15000";

impl Instance {
    /// Starts `bin serve` as the adapter login of `adapter_url` on a free loopback port,
    /// with the caps raised for the benchmark (no per-peer cap: every stream comes from
    /// 127.0.0.1), and waits until it listens. Output goes to `log`.
    pub fn start(bin: &Path, adapter_url: &str, secret: &[u8], log: &Path) -> Result<Instance> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let process = Process::spawn(
            Command::new(bin)
                .arg("serve")
                .args(["--listen", &addr.to_string()])
                .args(["--max-connections", STREAM_CAP])
                .args(["--max-connections-per-peer", "0"])
                .args(["--max-event-streams", STREAM_CAP])
                .env("DATABASE_URL", adapter_url)
                .env(
                    "SYNCHRO_JWT_SECRET",
                    String::from_utf8_lossy(secret).as_ref(),
                ),
            log,
        )?;
        let mut instance = Instance { process, addr };
        let started = Instant::now();
        while std::net::TcpStream::connect(addr).is_err() {
            if let Some(status) = instance.process.child.try_wait()? {
                anyhow::bail!("the server exited ({status}); log: {}", log.display());
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(60),
                "the server did not listen within 60 s; log: {}",
                log.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(instance)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The resident set of the process now, in MB (`VmRSS`; Linux).
    pub fn rss_mb(&self) -> Option<f64> {
        let pid = self.process.child.id();
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb / 1024.0)
    }
}

impl Process {
    /// Starts `bin capture` as the worker login of `worker_url` (it polls the slot every
    /// 25 ms, as `serve --worker-url` does). Output goes to `log`.
    pub fn capture(bin: &Path, worker_url: &str, log: &Path) -> Result<Process> {
        Process::spawn(
            Command::new(bin)
                .arg("capture")
                .env("DATABASE_URL", worker_url),
            log,
        )
    }

    fn spawn(command: &mut Command, log: &Path) -> Result<Process> {
        let out = std::fs::File::create(log)?;
        let child = command
            .env("SYNCHRO_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting the server binary (SYNCHRO_BENCH_SERVER_BIN)")?;
        Ok(Process { child })
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        // Graceful shutdown waits for in-flight responses; an events stream whose client
        // has gone is noticed at its next write, so do not wait long.
        for _ in 0..30 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
