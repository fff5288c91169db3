//! A throwaway PostgreSQL cluster from the system binaries, for tests and `synchro-server dev`.
//!
//! `initdb` into a fresh directory, `pg_ctl start` on a free loopback port with
//! `wal_level=logical`, and on drop `pg_ctl stop` and removal of the directory. As root the
//! cluster runs as the `postgres` system user (initdb refuses root). See
//! shared/notes/postgres.md for the recipe's background.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{bail, Context, Result};

/// A running throwaway cluster; stopped and deleted on drop.
pub struct TempCluster {
    dir: PathBuf,
    bin: PathBuf,
    run_as: Option<String>,
    port: u16,
    stopped: bool,
    /// Kept on stop ([`TempCluster::persistent`]): only stopped, never deleted.
    keep: bool,
    /// A persistent cluster's lock file, held (locked) while this run uses the directory.
    _lock: Option<std::fs::File>,
    /// TCP takes only TLS ([`TempCluster::require_tls`]): the superuser comes in through the
    /// unix socket.
    tls_only: bool,
}

fn bindir() -> Result<PathBuf> {
    if let Ok(dir) = std::env::var("SYNCHRO_PG_BINDIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return Ok(dir);
        }
    }
    // Debian keeps server binaries out of PATH: take the newest installed major version.
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, p): &(u32, PathBuf)| p.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop().map(|(_, p)| p).context(
        "no PostgreSQL server binaries found (install postgresql, or set SYNCHRO_PG_BINDIR)",
    )
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Makes `user` (the server's, when this process runs as root: PostgreSQL refuses root)
/// the owner of `dir`.
fn hand_over(user: Option<&str>, dir: &Path) -> Result<()> {
    let Some(user) = user else { return Ok(()) };
    let ok = Command::new("chown").arg(user).arg(dir).status()?.success();
    if !ok {
        bail!("cannot hand {} to the {user} user", dir.display());
    }
    Ok(())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl TempCluster {
    /// Creates and starts a cluster. Superuser `postgres`, trust authentication on loopback.
    pub fn start() -> Result<TempCluster> {
        TempCluster::start_with(&[])
    }

    /// [`TempCluster::start`] with extra server settings (`name=value`, e.g.
    /// `log_min_messages=notice`).
    pub fn start_with(settings: &[&str]) -> Result<TempCluster> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let bin = bindir()?;
        let run_as = is_root().then(|| "postgres".to_owned());
        let dir = std::env::temp_dir().join(format!(
            "synchro-pg-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        hand_over(run_as.as_deref(), &dir)?;
        let mut cluster = TempCluster {
            dir,
            bin,
            run_as,
            port: 0,
            stopped: true,
            keep: false,
            _lock: None,
            tls_only: false,
        };
        cluster.initdb(&["--no-sync"])?;
        cluster.start_server(
            &format!(
                "-c unix_socket_directories={} -c fsync=off -c full_page_writes=off",
                cluster.dir.display()
            ),
            settings,
        )?;
        Ok(cluster)
    }

    /// A cluster kept in `dir` across runs (`synchro-server dev --data-dir`): created there
    /// the first time, started again on later runs (after stopping one an earlier run left
    /// running, say after a kill -9), and only stopped, never deleted, when dropped. Unlike
    /// [`TempCluster::start`] it syncs to disk. Refused when `dir` holds a cluster of another
    /// PostgreSQL major version than the binaries found.
    pub fn persistent(dir: &Path) -> Result<TempCluster> {
        let bin = bindir()?;
        let run_as = is_root().then(|| "postgres".to_owned());
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the data directory {}", dir.display()))?;
        let dir = dir
            .canonicalize()
            .with_context(|| format!("resolving {}", dir.display()))?;
        hand_over(run_as.as_deref(), &dir)?;
        // One run at a time: a second `dev` on the directory is refused (it would otherwise
        // take the first one's cluster for one an earlier run left behind, and stop it).
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("dev.lock"))
            .with_context(|| format!("opening {}", dir.join("dev.lock").display()))?;
        if lock.try_lock().is_err() {
            bail!(
                "another synchro-server dev is using {}: stop it first, or give this one another --data-dir",
                dir.display()
            );
        }
        let mut cluster = TempCluster {
            dir,
            bin,
            run_as,
            port: 0,
            stopped: true,
            keep: true,
            _lock: Some(lock),
            tls_only: false,
        };
        let data = cluster.data_dir();
        match std::fs::read_to_string(data.join("PG_VERSION")) {
            Ok(made_by) => {
                let made_by = made_by.trim().to_owned();
                let ours = cluster.major_version()?;
                if made_by != ours {
                    bail!(
                        "{} holds a PostgreSQL {made_by} cluster and this machine's binaries are PostgreSQL {ours}: \
                         start with --fresh, or remove the directory",
                        cluster.dir.display()
                    );
                }
                // An earlier run killed before it could stop its server left it running.
                if cluster
                    .run("pg_ctl", &["status", "-D"], Some(&data))
                    .is_ok()
                {
                    cluster.run("pg_ctl", &["-m", "fast", "-w", "stop", "-D"], Some(&data))?;
                }
            }
            Err(_) => cluster.initdb(&[]).map_err(|e| {
                let hint = if cluster.run_as.is_some() {
                    " (the PostgreSQL server runs as the postgres user here, since this process runs as \
                     root: give --data-dir a directory that user can reach, such as /var/tmp/synchro-dev)"
                } else {
                    ""
                };
                e.context(format!(
                    "creating a PostgreSQL cluster in {}{hint}",
                    cluster.dir.display()
                ))
            })?,
        }
        // No unix socket: a data directory's path may be longer than a socket path can be.
        cluster.start_server("-c unix_socket_directories=''", &[])?;
        Ok(cluster)
    }

    /// The major version of the PostgreSQL binaries (`PG_VERSION`'s form: "15", "17").
    fn major_version(&self) -> Result<String> {
        let out = Command::new(self.bin.join("postgres"))
            .arg("--version")
            .output()
            .context("running postgres --version")?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .last()
            .and_then(|v| v.split('.').next())
            .map(str::to_owned)
            .context("postgres --version printed no version")
    }

    /// `initdb` of the data directory: superuser `postgres`, trust authentication.
    fn initdb(&self, extra: &[&str]) -> Result<()> {
        let mut args = vec![
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
        ];
        args.extend_from_slice(extra);
        args.push("-D");
        self.run("initdb", &args, Some(&self.data_dir()))
    }

    /// Starts the server on a free loopback port with logical decoding and `base` and
    /// `settings` as options; the log goes to `server.log` beside the data.
    fn start_server(&mut self, base: &str, settings: &[&str]) -> Result<()> {
        let data = self.data_dir();
        let cluster = self;
        // A port can be taken between probing and binding: retry a few times.
        for attempt in 0..5 {
            cluster.port = free_port()?;
            let opts = format!(
                "-c listen_addresses=127.0.0.1 -c port={} -c wal_level=logical \
                 -c max_replication_slots=10 -c max_wal_senders=10 {base}",
                cluster.port,
            ) + &settings
                .iter()
                .map(|kv| format!(" -c {kv}"))
                .collect::<String>();
            let log = cluster.dir.join("server.log");
            let started = cluster.run(
                "pg_ctl",
                &[
                    "-w",
                    "-t",
                    "60",
                    "-l",
                    &log.to_string_lossy(),
                    "-o",
                    &opts,
                    "start",
                    "-D",
                ],
                Some(&data),
            );
            match started {
                Ok(()) => {
                    cluster.stopped = false;
                    return Ok(());
                }
                Err(e) if attempt == 4 => return Err(e),
                Err(_) => continue,
            }
        }
        unreachable!()
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn run(&self, tool: &str, args: &[&str], dir_arg: Option<&Path>) -> Result<()> {
        let exe = self.bin.join(tool);
        let mut cmd = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args(args);
        if let Some(d) = dir_arg {
            cmd.arg(d);
        }
        let out = cmd.output().with_context(|| format!("running {tool}"))?;
        if !out.status.success() {
            bail!(
                "{tool} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Everything the server has written to its log so far.
    pub fn server_log(&self) -> Result<String> {
        std::fs::read_to_string(self.dir.join("server.log")).context("reading the server log")
    }

    /// The port the cluster listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A tokio-postgres connection string for `user` on database `db`.
    pub fn url(&self, user: &str, db: &str) -> String {
        format!("host=127.0.0.1 port={} user={user} dbname={db}", self.port)
    }

    /// The superuser connection string for the `postgres` database (through the unix socket
    /// once the cluster takes only TLS over TCP).
    pub fn admin_url(&self) -> String {
        self.superuser_url("postgres")
    }

    /// The superuser connection string for database `db`.
    pub fn superuser_url(&self, db: &str) -> String {
        if self.tls_only {
            format!(
                "host={} port={} user=postgres dbname={db}",
                self.dir.display(),
                self.port
            )
        } else {
            self.url("postgres", db)
        }
    }

    /// Makes the cluster take TCP connections only over TLS, as a managed service or any
    /// database reached over a network does: `cert_pem`/`key_pem` are its certificate and
    /// key, `ca_pem` the roots it checks client certificates against, and `hostssl` the
    /// lines of pg_hba.conf (`hostssl <db> <user> 127.0.0.1/32 <method>`), the only ones
    /// besides the superuser's on the unix socket ([`TempCluster::admin_url`]).
    pub fn require_tls(
        &mut self,
        cert_pem: &str,
        key_pem: &str,
        ca_pem: &str,
        hostssl: &[&str],
    ) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let data = self.data_dir();
        for (name, text) in [
            ("server.crt", cert_pem),
            ("server.key", key_pem),
            ("client-ca.crt", ca_pem),
        ] {
            let path = data.join(name);
            std::fs::write(&path, text)?;
            // PostgreSQL refuses a key file others can read.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            hand_over(self.run_as.as_deref(), &path)?;
        }
        let hba = std::iter::once("local all postgres trust")
            .chain(hostssl.iter().copied())
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(data.join("pg_hba.conf"), hba + "\n")?;
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))?;
        std::io::Write::write_all(&mut conf, b"\nssl = on\nssl_ca_file = 'client-ca.crt'\n")?;
        let log = self.dir.join("server.log");
        let reloads = || -> Result<usize> {
            Ok(std::fs::read_to_string(&log)?
                .matches("reloading configuration files")
                .count())
        };
        let before = reloads()?;
        self.run("pg_ctl", &["reload", "-D"], Some(&data))?;
        self.tls_only = true;
        // A reload is asynchronous: wait until the postmaster has read the new files.
        for _ in 0..100 {
            if reloads()? > before {
                std::thread::sleep(std::time::Duration::from_millis(200));
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        bail!("the cluster did not reload its configuration")
    }

    /// Restarts the cluster with the same settings (a fast shutdown ends every session, as
    /// a database restart under running clients does).
    pub fn restart(&self) -> Result<()> {
        let log = self.dir.join("server.log");
        self.run(
            "pg_ctl",
            &[
                "-m",
                "fast",
                "-w",
                "-t",
                "60",
                "-l",
                &log.to_string_lossy(),
                "restart",
                "-D",
            ],
            Some(&self.data_dir()),
        )
    }

    /// Takes a physical base backup of the running cluster (`pg_basebackup`, its WAL streamed
    /// along; like every base backup, without replication slots); its directory.
    pub fn base_backup(&self) -> Result<PathBuf> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let backup = self
            .dir
            .join(format!("backup-{}", SEQ.fetch_add(1, Ordering::Relaxed)));
        if !self.bin.join("pg_basebackup").exists() {
            // The server-only packages the version matrix uses have no pg_basebackup.
            self.copy_backup(&backup)?;
            return Ok(backup);
        }
        let port = self.port.to_string();
        self.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-X",
                "stream",
                "--no-sync",
                "--checkpoint=fast",
                "-D",
            ],
            Some(&backup),
        )?;
        Ok(backup)
    }

    /// A base backup by PostgreSQL's low-level API, as pg_basebackup takes one: between
    /// `pg_backup_start` and `pg_backup_stop` (one session) the data directory is copied
    /// without the server's transient files and the slots' contents, then the WAL written
    /// meanwhile, and the backup label `pg_backup_stop` returns is written beside them.
    fn copy_backup(&self, backup: &Path) -> Result<()> {
        let data = self.data_dir();
        let to = backup.to_owned();
        in_own_session(self.admin_url(), move |client| {
            Box::pin(async move {
                client
                    .batch_execute("SELECT pg_backup_start('synchro-harness', true)")
                    .await?;
                copy_tree(&data, &to, &|rel: &Path| {
                    let top = rel.components().next().map(|c| c.as_os_str().to_owned());
                    let top = top.as_deref().and_then(|t| t.to_str()).unwrap_or("");
                    let transient = ["postmaster.pid", "postmaster.opts", "backup_label"];
                    let emptied = ["pg_wal", "pg_replslot", "pg_stat_tmp"];
                    let in_emptied_dir = emptied.contains(&top) && rel.components().count() > 1;
                    !(transient.contains(&top) || in_emptied_dir)
                })?;
                let label: String = client
                    .query_one("SELECT labelfile FROM pg_backup_stop(false)", &[])
                    .await?
                    .get(0);
                copy_tree(&data.join("pg_wal"), &to.join("pg_wal"), &|_| true)?;
                std::fs::write(to.join("backup_label"), label)?;
                Ok(())
            })
        })?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(backup, std::fs::Permissions::from_mode(0o700))?;
        if let Some(user) = &self.run_as {
            let ok = Command::new("chown")
                .args(["-R", user])
                .arg(backup)
                .status()?
                .success();
            if !ok {
                bail!("cannot hand {} to the {user} user", backup.display());
            }
        }
        Ok(())
    }

    /// Restores a [`TempCluster::base_backup`] in place, as an operator restores a database:
    /// the server stops, the backup becomes its data directory (the lost one is kept aside),
    /// and it starts again with the same settings on the same port.
    pub fn restore_in_place(&self, backup: &Path) -> Result<()> {
        let data = self.data_dir();
        self.end_walsenders();
        self.run("pg_ctl", &["-m", "fast", "-w", "stop", "-D"], Some(&data))?;
        let opts = std::fs::read(data.join("postmaster.opts"))?;
        std::fs::rename(&data, self.dir.join("data-lost"))?;
        std::fs::rename(backup, &data)?;
        // `pg_ctl restart` of a stopped server starts it with these options.
        std::fs::write(data.join("postmaster.opts"), opts)?;
        hand_over(self.run_as.as_deref(), &data.join("postmaster.opts"))?;
        self.restart().map_err(|e| {
            let log = self.server_log().unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            anyhow::anyhow!(
                "{e}\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
    }

    /// Ends every walsender session (best effort: a failure leaves the shutdown's wait). Over
    /// a tokio-postgres session on a thread of its own (a drop may run inside a runtime), so
    /// it needs no `psql`: the server-only packages the version matrix uses have none.
    fn end_walsenders(&self) {
        let _ = in_own_session(self.admin_url(), |client| {
            Box::pin(async move {
                client
                    .batch_execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                          WHERE backend_type = 'walsender'",
                    )
                    .await?;
                Ok(())
            })
        });
    }

    /// Stops the cluster and deletes its directory (a persistent one's is kept).
    pub fn stop(&mut self) -> Result<()> {
        if !self.stopped {
            let data = self.data_dir();
            // A fast shutdown waits for each logical walsender's client to confirm the
            // shutdown checkpoint, up to wal_sender_timeout: a capture stream of a test
            // whose runtime is blocked in this drop cannot. End those sessions first
            // (best effort: a failure leaves the wait).
            self.end_walsenders();
            self.run("pg_ctl", &["-m", "fast", "-w", "stop", "-D"], Some(&data))?;
            self.stopped = true;
        }
        if !self.keep && self.dir.exists() {
            std::fs::remove_dir_all(&self.dir)?;
        }
        Ok(())
    }
}

impl Drop for TempCluster {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("synchro: could not stop the throwaway PostgreSQL cluster: {e}");
        }
    }
}

/// Runs `work` with a session of `url` on a thread and runtime of its own (a drop may run
/// inside a runtime, where blocking on one is refused), and waits for it.
fn in_own_session<T: Send + 'static>(
    url: String,
    work: impl FnOnce(
            tokio_postgres::Client,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<T>> + Send>>
        + Send
        + 'static,
) -> Result<T> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            work(client).await
        })
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the session's thread panicked"))?
}

/// Copies the tree `from` to `to` (files whose path relative to `from` `keep` accepts; a file
/// that went away while copying is skipped, as a running server removes some).
fn copy_tree(from: &Path, to: &Path, keep: &dyn Fn(&Path) -> bool) -> Result<()> {
    fn walk(root: &Path, dir: &Path, to: &Path, keep: &dyn Fn(&Path) -> bool) -> Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let path = entry.path();
            let rel = path.strip_prefix(root)?;
            if !keep(rel) {
                continue;
            }
            let target = to.join(rel);
            match entry.file_type() {
                Ok(t) if t.is_dir() => {
                    std::fs::create_dir_all(&target)?;
                    walk(root, &path, to, keep)?;
                }
                Ok(_) => match std::fs::copy(&path, &target) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    r => {
                        r.with_context(|| format!("copying {}", path.display()))?;
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
    std::fs::create_dir_all(to)?;
    walk(from, from, to, keep)
}
