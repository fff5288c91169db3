//! The processes the chaos run kills: `synchro-server serve` (the HTTP adapter, without
//! capture), `synchro-server capture` (the capture worker, REPLICATION login) and the
//! PostgreSQL postmaster with its children. Each is killed with SIGKILL and started again on
//! the same port (PostgreSQL on the same data directory: crash recovery).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use synchro_server::pg_harness::TempCluster;

/// One server process, started again with the same arguments; killed on drop.
pub struct Proc {
    /// `serve` or `capture`.
    pub name: &'static str,
    bin: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    /// A process of `bin` with `args`, its output appended to `log`; not started yet.
    pub fn new(name: &'static str, bin: &Path, args: Vec<String>, log: PathBuf) -> Proc {
        Proc {
            name,
            bin: bin.to_owned(),
            args,
            log,
            child: None,
        }
    }

    /// Starts the process (it must not be running).
    pub fn start(&mut self) -> Result<()> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(&self.bin)
            .args(&self.args)
            .env(
                "SYNCHRO_LOG",
                std::env::var("SYNCHRO_CHAOS_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the process exited on its own since it was started (it is reaped, and
    /// counts as stopped).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status)
    }

    /// Whether a process is running (started and not killed or exited).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill_9();
    }
}

/// The parent process ID of `pid` and its state letter, from `/proc/<pid>/stat`.
fn stat(pid: i32) -> Option<(i32, char)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid ...: comm may hold spaces, so read after its last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state))
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) with a process ID this run started (the postmaster it found through
    // its own session, and that postmaster's children).
    unsafe {
        libc::kill(pid, sig);
    }
}

/// The throwaway cluster's postmaster, found from a session of ours: the parent of its
/// backend.
pub async fn postmaster_pid(admin_url: &str) -> Result<i32> {
    let db = synchro_server::connect_db(admin_url).await?;
    let backend: i32 = db.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
    let (ppid, _) = stat(backend).context("reading the backend's parent")?;
    Ok(ppid)
}

/// Kills the postmaster `pid` and every child of it with SIGKILL (it is stopped first, so it
/// forks no new child meanwhile), and waits until all of them are gone.
pub fn kill_9_postgres(pid: i32) -> Result<usize> {
    signal(pid, libc::SIGSTOP);
    let children: Vec<i32> = std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| stat(p).is_some_and(|(ppid, _)| ppid == pid))
        .collect();
    signal(pid, libc::SIGKILL);
    for &c in &children {
        signal(c, libc::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for p in std::iter::once(pid).chain(children.iter().copied()) {
        // Gone; a child may stay a zombie a little longer, but the postmaster must be reaped:
        // `pg_ctl` and the new postmaster take a zombie's PID in the lock file as alive.
        while stat(p).is_some_and(|(_, state)| p == pid || (state != 'Z' && state != 'X')) {
            if Instant::now() > deadline {
                bail!("PostgreSQL process {p} survived SIGKILL");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(children.len())
}

/// Starts the killed cluster again on its data directory and port (`pg_ctl restart` finds
/// the old postmaster gone and starts one with the options it recorded; crash recovery
/// replays the WAL).
pub fn restart_postgres(cluster: &TempCluster) -> Result<()> {
    cluster.restart()
}
