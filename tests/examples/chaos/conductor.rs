//! The conductor's hand on the processes: kills (SIGKILL) by victim, restarts, a process that
//! exited on its own started again, every event counted and timed; and the recovery time of
//! each restart from the clients' successful rounds.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, Result};
use synchro_server::pg_harness::TempCluster;

use crate::client::Shared;
use crate::procs::{self, Proc};

/// Who a kill event takes down.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Victim {
    /// The HTTP server.
    Serve,
    /// The capture worker.
    Capture,
    /// The postmaster and its children.
    Postgres,
    /// All three at once.
    All,
}

/// The processes under the conductor's hand.
pub struct Stack {
    /// The throwaway cluster.
    pub cluster: TempCluster,
    /// `synchro-server serve --no-capture`.
    pub serve: Proc,
    /// `synchro-server capture`.
    pub capture: Proc,
    /// Whether PostgreSQL runs.
    pub pg_up: bool,
    /// Kills by process.
    pub kills: BTreeMap<&'static str, u64>,
    /// Starts after a kill, by process.
    pub restarts: BTreeMap<&'static str, u64>,
    /// Exits on their own, by process.
    pub exits: BTreeMap<&'static str, u64>,
    /// (ms, what) of every start after a kill, for recovery times.
    pub restarted_at: Vec<(u64, &'static str)>,
    /// ms of every kill.
    pub killed_at: Vec<u64>,
}

pub fn say(shared: &Shared, what: &str) {
    println!("[{:7.1}s] {what}", shared.now_ms() as f64 / 1000.0);
}

impl Stack {
    /// Kills `victim` with SIGKILL.
    pub async fn kill(&mut self, victim: Victim, shared: &Shared) -> Result<()> {
        self.killed_at.push(shared.now_ms());
        if matches!(victim, Victim::Serve | Victim::All) && self.serve.running() {
            self.serve.kill_9();
            *self.kills.entry("serve").or_default() += 1;
        }
        if matches!(victim, Victim::Capture | Victim::All) && self.capture.running() {
            self.capture.kill_9();
            *self.kills.entry("capture").or_default() += 1;
        }
        if matches!(victim, Victim::Postgres | Victim::All) && self.pg_up {
            let pid = procs::postmaster_pid(&self.cluster.admin_url()).await?;
            let children = tokio::task::block_in_place(|| procs::kill_9_postgres(pid))?;
            self.pg_up = false;
            *self.kills.entry("postgres").or_default() += 1;
            say(
                shared,
                &format!("  postgres: postmaster {pid} and {children} children killed"),
            );
        }
        Ok(())
    }

    /// Starts whatever is down: PostgreSQL first, then capture, then the server.
    pub fn heal(&mut self, shared: &Shared) -> Result<()> {
        if !self.pg_up {
            let started = Instant::now();
            tokio::task::block_in_place(|| procs::restart_postgres(&self.cluster)).with_context(
                || {
                    format!(
                        "restarting PostgreSQL; its log ends: {}",
                        tail(&self.cluster.server_log().unwrap_or_default(), 20)
                    )
                },
            )?;
            self.pg_up = true;
            self.restart_done("postgres", shared);
            say(
                shared,
                &format!(
                    "  postgres restarted (crash recovery) in {} ms",
                    started.elapsed().as_millis()
                ),
            );
        }
        for p in [&mut self.capture, &mut self.serve] {
            if !p.running() {
                p.start()?;
                let name = p.name;
                *self.restarts.entry(name).or_default() += 1;
                self.restarted_at.push((shared.now_ms(), name));
            }
        }
        Ok(())
    }

    fn restart_done(&mut self, name: &'static str, shared: &Shared) {
        *self.restarts.entry(name).or_default() += 1;
        self.restarted_at.push((shared.now_ms(), name));
    }

    /// Starts again a server process that exited on its own (counted apart).
    pub fn supervise(&mut self, shared: &Shared) -> Result<()> {
        for p in [&mut self.capture, &mut self.serve] {
            if let Some(status) = p.exited() {
                *self.exits.entry(p.name).or_default() += 1;
                say(
                    shared,
                    &format!(
                        "  {} exited on its own ({status}); starting it again",
                        p.name
                    ),
                );
                p.start()?;
            }
        }
        Ok(())
    }
}

pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Recovery of each restart: until every client has finished a successful round it started
/// after the restart. Returns (measured, overlapped by the next kill, max ms, mean ms, the
/// worst restart).
pub fn recoveries(
    stack: &Stack,
    shared: &Shared,
) -> (usize, usize, u64, u64, Option<(u64, &'static str)>) {
    let rounds: Vec<Vec<(u64, u64)>> = shared
        .ok_rounds
        .iter()
        .map(|r| r.lock().unwrap().clone())
        .collect();
    let (mut measured, mut overlapped, mut max, mut sum, mut worst) = (0, 0, 0, 0, None);
    for &(t, what) in &stack.restarted_at {
        let next_kill = stack
            .killed_at
            .iter()
            .copied()
            .find(|&k| k > t)
            .unwrap_or(u64::MAX);
        let done = rounds
            .iter()
            .map(|r| {
                r.iter()
                    .find(|&&(start, _)| start >= t)
                    .map(|&(_, end)| end)
            })
            .collect::<Option<Vec<u64>>>()
            .and_then(|ends| ends.into_iter().max());
        match done {
            Some(end) if end <= next_kill => {
                measured += 1;
                let took = end - t;
                sum += took;
                if took >= max {
                    max = took;
                    worst = Some((t, what));
                }
            }
            _ => overlapped += 1,
        }
    }
    let mean = if measured > 0 {
        sum / measured as u64
    } else {
        0
    };
    (measured, overlapped, max, mean, worst)
}
