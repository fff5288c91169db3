//! The replication stream: `START_REPLICATION` of the capture slot over a replication
//! connection of the worker login (`pgwire-replication`), pgoutput protocol version 1 with
//! logical messages, publication `synchro_publication`.
//!
//! The walsender decodes each WAL record once and sends complete transactions in commit
//! order; nothing is logged per read (the SQL peek interface started a decoding session,
//! and logged two lines, on every poll). A position is confirmed to the server only after
//! everything before it was applied and committed: the end of an applied transaction, or a
//! keepalive's position received outside a transaction once every transaction before it was
//! applied (idle confirmation, so the slot does not retain unrelated WAL). Dropping the
//! stream (an error, a block, the failpoint) confirms nothing more: the next stream starts
//! again at the slot's confirmed position, and `capture_state.confirmed_lsn` skips what was
//! applied but not yet confirmed.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures_util::FutureExt as _;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent};
use tokio_postgres::config::Host;
use tokio_postgres::types::PgLsn;
use tokio_postgres::Client;

use super::block::{BlockReason, Blocked};
use super::pgoutput::{decode, Message};
use super::transaction::{Shapes, Transaction};

/// The publication the worker streams.
const PUBLICATION: &str = "synchro_publication";

/// Session settings of the walsender, so every output function is deterministic (the same
/// as [`super::values::SESSION_SETTINGS`], as startup options).
const STREAM_OPTIONS: &str = "-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=postgres \
    -c extra_float_digits=1 -c bytea_output=hex";

/// How soon a raised confirmation is sent to the server.
const STATUS_INTERVAL: Duration = Duration::from_millis(10);

/// How long the stream may stay silent before the client sends a status update anyway.
const IDLE_WAKEUP: Duration = Duration::from_secs(1);

/// How long opening a stream waits for the slot to be released by a previous session.
const SLOT_RELEASE_WAIT: Duration = Duration::from_secs(10);

/// How long an idle step waits for its confirmation to reach the slot.
const CONFIRM_WAIT: Duration = Duration::from_secs(2);

/// An open replication stream and what it has received but not yet handed out.
pub(super) struct Stream {
    /// Taken only by `drop`, which ends the session cleanly.
    client: Option<ReplicationClient>,
    /// The relation shapes this session described: pgoutput describes a relation once per
    /// session (and again after it changed), so they live as long as the stream.
    pub(super) shapes: Shapes,
    /// The transaction being received: its commit LSN, ID and messages so far.
    partial: Option<(u64, u32, Vec<Message>)>,
    /// Complete transactions received, in commit order.
    ready: VecDeque<Transaction>,
    /// Messages in `ready`.
    ready_messages: usize,
    /// Everything committed before this position has been received (a commit's end, or a
    /// keepalive outside a transaction).
    received: u64,
    /// The position last confirmed to the server.
    confirmed: u64,
}

impl Drop for Stream {
    /// Ends the replication session with CopyDone and Terminate (bounded to 2 s), on a task
    /// `close_connections` waits for before the process exits: a process that exited with
    /// the stream open (a `serve` or `capture` shutdown) left "unexpected EOF on standby
    /// connection" in the PostgreSQL log.
    fn drop(&mut self) {
        let Some(mut client) = self.client.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            crate::track_session(runtime.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(2), client.shutdown()).await;
            }));
        }
    }
}

impl Stream {
    fn client(&mut self) -> &mut ReplicationClient {
        self.client.as_mut().expect("open until dropped")
    }

    /// Opens the stream of `slot` for the worker login `url`, once no other session holds
    /// the slot (a previous stream of this worker releases it a few ms after it ended).
    pub(super) async fn open(url: &str, slot: &str, control: &Client) -> Result<Stream> {
        // START_REPLICATION takes the slot name unquoted.
        if slot.is_empty()
            || !slot
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            bail!("the capture slot name is not a plain identifier");
        }
        let waited = Instant::now();
        loop {
            let active: bool = control
                .query_opt(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                    &[&slot],
                )
                .await?
                .map(|r| r.get(0))
                .unwrap_or(false);
            if !active || waited.elapsed() > SLOT_RELEASE_WAIT {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut client = ReplicationClient::connect(config(url, slot)?)
            .await
            .map_err(|e| anyhow::anyhow!("starting the capture stream: {e}"))?;
        client
            .wait_started()
            .await
            .map_err(|e| anyhow::anyhow!("starting the capture stream: {e}"))?;
        Ok(Stream {
            client: Some(client),
            shapes: Shapes::new(),
            partial: None,
            ready: VecDeque::new(),
            ready_messages: 0,
            received: 0,
            confirmed: 0,
        })
    }

    /// The complete transactions received, waiting up to `wait` until everything committed
    /// before `horizon` has arrived; at most about `limit` messages at once (whole
    /// transactions). Empty when nothing committed before the horizon is left to apply.
    pub(super) async fn receive(
        &mut self,
        horizon: PgLsn,
        wait: Duration,
        limit: usize,
    ) -> Result<Vec<Transaction>> {
        let horizon = u64::from(horizon);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Everything already buffered, without waiting (unconstrained: tokio's
            // cooperative budget would otherwise make the channel look empty after 128
            // events, which capped a batch at about ten transactions).
            while self.ready_messages < limit {
                match tokio::task::unconstrained(self.client().recv()).now_or_never() {
                    Some(event) => self.push(event)?,
                    None => break,
                }
            }
            if !self.ready.is_empty() {
                return Ok(self.take(limit));
            }
            let pending_before_horizon =
                matches!(self.partial, Some((commit, _, _)) if commit < horizon);
            if self.received >= horizon && !pending_before_horizon {
                return Ok(Vec::new());
            }
            match tokio::time::timeout_at(deadline, self.client().recv()).await {
                Ok(event) => self.push(event)?,
                Err(_) => return Ok(self.take(limit)),
            }
        }
    }

    /// Waits up to `max` for the stream to deliver anything (an idle worker steps again as
    /// soon as a transaction starts arriving, instead of sleeping out a poll interval).
    pub(super) async fn wait(&mut self, max: Duration) -> Result<()> {
        if !self.ready.is_empty() || self.partial.is_some() {
            return Ok(());
        }
        match tokio::time::timeout(max, self.client().recv()).await {
            Ok(event) => self.push(event),
            Err(_) => Ok(()),
        }
    }

    /// Up to `limit` messages of complete transactions (at least one transaction).
    fn take(&mut self, limit: usize) -> Vec<Transaction> {
        let mut out = Vec::new();
        let mut messages = 0;
        while let Some(tx) = self.ready.front() {
            if !out.is_empty() && messages + tx.messages.len() > limit {
                break;
            }
            messages += tx.messages.len();
            out.push(self.ready.pop_front().expect("front"));
        }
        self.ready_messages -= messages;
        out
    }

    /// Takes one event of the stream.
    fn push(&mut self, event: pgwire_replication::Result<Option<ReplicationEvent>>) -> Result<()> {
        let event = event
            .map_err(|e| anyhow::anyhow!("the capture stream failed: {e}"))?
            .context("the capture stream ended")?;
        match event {
            ReplicationEvent::Begin { final_lsn, xid, .. } => {
                self.partial = Some((final_lsn.as_u64(), xid, Vec::new()));
            }
            ReplicationEvent::Commit {
                lsn,
                end_lsn,
                commit_time_micros,
            } => {
                if let Some((_, xid, messages)) = self.partial.take() {
                    self.ready_messages += messages.len();
                    self.ready.push_back(Transaction {
                        xid,
                        commit_lsn: PgLsn::from(lsn.as_u64()),
                        end_lsn: PgLsn::from(end_lsn.as_u64()),
                        commit_time: commit_time_micros,
                        messages,
                    });
                }
                self.received = self.received.max(end_lsn.as_u64());
            }
            ReplicationEvent::Message {
                transactional,
                lsn,
                prefix,
                content,
            } => {
                // (A message outside a transaction concerns no source transaction.)
                if let Some((_, _, messages)) = self.partial.as_mut() {
                    messages.push(Message::LogicalMessage {
                        transactional,
                        lsn: lsn.as_u64(),
                        prefix,
                        content: content.to_vec(),
                    });
                }
            }
            ReplicationEvent::XLogData { data, .. } => {
                let message = decode(&data).map_err(|_| Blocked(BlockReason::DecodeError))?;
                if let Some((_, _, messages)) = self.partial.as_mut() {
                    messages.push(message);
                }
            }
            ReplicationEvent::KeepAlive { wal_end, .. } => {
                // Inside a transaction the walsender's position is past its commit.
                if self.partial.is_none() {
                    self.received = self.received.max(wal_end.as_u64());
                }
            }
            ReplicationEvent::StoppedAt { .. } => {}
        }
        Ok(())
    }

    /// Confirms `lsn` (everything before it is applied and committed); the client sends it
    /// to the server within [`STATUS_INTERVAL`].
    pub(super) fn confirm(&mut self, lsn: PgLsn) {
        let lsn = u64::from(lsn);
        if lsn > self.confirmed {
            self.confirmed = lsn;
            self.client().update_applied_lsn(Lsn::from_u64(lsn));
        }
    }

    /// The position received, when nothing received is left to apply and it is past the
    /// position confirmed (with how far): what an idle worker may acknowledge once it has
    /// recorded it.
    pub(super) fn idle_position(&self) -> Option<(PgLsn, u64)> {
        (self.ready.is_empty() && self.partial.is_none() && self.received > self.confirmed)
            .then(|| (PgLsn::from(self.received), self.received - self.confirmed))
    }

    /// Confirms `target` (an [`Stream::idle_position`] the worker recorded), so the slot
    /// does not retain unrelated WAL, and waits until the slot shows it.
    pub(super) async fn confirm_idle(
        &mut self,
        target: PgLsn,
        control: &Client,
        slot: &str,
    ) -> Result<()> {
        self.confirm(target);
        let started = Instant::now();
        while started.elapsed() < CONFIRM_WAIT {
            let done = control
                .query_opt(
                    "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn >= $2",
                    &[&slot, &target],
                )
                .await?
                .is_some();
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }
}

/// The replication client's configuration for the worker login `url` (a connection string
/// or URL, as for tokio-postgres).
pub(super) fn config(url: &str, slot: &str) -> Result<ReplicationConfig> {
    let target = crate::pgconn::parse(url).context("the worker connection string")?;
    let pg = &target.config;
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let host = match pg.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.to_string_lossy().into_owned(),
        None => "/var/run/postgresql".to_owned(),
    };
    let user = pg
        .get_user()
        .context("the worker connection string names no user")?;
    let password = pg
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let database = pg.get_dbname().unwrap_or(user);
    Ok(
        ReplicationConfig::new(host, user, password, database, slot, PUBLICATION)
            .with_port(port)
            .with_tls(target.tls.clone())
            .with_start_lsn(Lsn::ZERO)
            .with_status_interval(STATUS_INTERVAL)
            .with_wakeup_interval(IDLE_WAKEUP)
            .with_options(STREAM_OPTIONS)
            .with_application_name("synchro-capture"),
    )
}
