//! The server as its own process: `synchro-server serve` (the binary named by
//! `SYNCHRO_BENCH_SERVER_BIN`) with the capture worker in it, as a deployment runs it, so its
//! resident memory is measured apart from the client's.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// A running `serve` process; stopped (SIGTERM, then SIGKILL) on drop.
pub struct ServerProcess {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
}

impl ServerProcess {
    /// Starts `bin serve` on a free loopback port and waits until it accepts connections.
    /// Its output goes to `log`.
    pub fn start(
        bin: &Path,
        adapter_url: &str,
        worker_url: &str,
        secret: &[u8],
        log: &Path,
        seeds: &Path,
    ) -> Result<ServerProcess> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let out = std::fs::File::create(log)?;
        let child = Command::new(bin)
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--seed-dir")
            .arg(seeds)
            .env("DATABASE_URL", adapter_url)
            .env("SYNCHRO_WORKER_DATABASE_URL", worker_url)
            .env(
                "SYNCHRO_JWT_SECRET",
                String::from_utf8_lossy(secret).as_ref(),
            )
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut server = ServerProcess {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = server.child.try_wait()? {
                anyhow::bail!("the server exited ({status}); log: {}", log.display());
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(60),
                "the server did not listen within 60 s; log: {}",
                log.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..50 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
