//! One chaos client: the native client engine (`synchro-client`) on its own SQLite file,
//! in its own thread, as user `c<i>` through the fault proxy. While the run is in its chaos
//! phase it writes (inserts, updates and deletes in the shared scope and its own, and a few
//! writes the server must refuse) and syncs in a loop, writing on whether or not the server
//! answers (offline writes queue), and now and then it "crashes": a round is abandoned at a
//! random point and the engine reopened from its file. Then it drains its queue, syncs until
//! the sentinel rows written after every queue drained have arrived, and reports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use synchro_client::engine::{Client, ClientError};
use synchro_client::http::HttpTransport;
use synchro_client::queue::{LocalWrite, MutationState, Operation};
use synchro_client::storage::Storage;
use synchro_client::transport::{Response, Transport, TransportError};
use synchro_protocol::value::{Scalar, TypedValue};

use crate::rng::Rng;

/// The run's phases, in order.
pub const CHAOS: u8 = 0;
/// No more writes: push until the queue is empty.
pub const DRAIN: u8 = 1;
/// Sync until the sentinels arrived, then report.
pub const CONVERGE: u8 = 2;
/// Report now.
pub const STOP: u8 = 3;

/// Longest a request may take before the client gives up on it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// What the clients share with the conductor.
pub struct Shared {
    /// The current phase.
    pub phase: AtomicU8,
    /// Clients whose queue is empty in the drain phase.
    pub drained: AtomicUsize,
    /// Clients that saw their sentinels.
    pub converged: AtomicUsize,
    /// Clients that completed their first round (the schema installed).
    pub installed: AtomicUsize,
    /// Clients that ended early (a fatal error).
    pub gave_up: AtomicUsize,
    /// When the run started.
    pub t0: Instant,
    /// Per client, every successful round as (start, end) in ms since `t0`.
    pub ok_rounds: Vec<Mutex<Vec<(u64, u64)>>>,
}

impl Shared {
    /// Milliseconds since the run started.
    pub fn now_ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }
}

/// One write the client queued.
#[derive(Debug, Clone)]
pub struct Written {
    /// The mutation ID the engine returned.
    pub mutation_id: String,
    /// `I`, `U` or `D`.
    pub op: char,
    /// The row's key.
    pub id: i64,
    /// The tag an insert or update sets (a delete has none).
    pub tag: Option<String>,
    /// The write places a row in another user's scope: the server must refuse it.
    pub forbidden: bool,
    /// The row is in the client's own scope.
    pub private: bool,
}

/// What a client hands back at the end.
#[derive(Debug, Default)]
pub struct Report {
    /// `c<i>`.
    pub name: String,
    /// Every write queued, in order.
    pub writes: Vec<Written>,
    /// Writes the engine refused locally (not queued).
    pub refused_locally: u64,
    /// The queue as stored: mutation ID → (state, the stored outcome's status).
    pub queue: BTreeMap<String, (String, Option<String>)>,
    /// The local table: (id, owner, val, tag), by id.
    pub rows: Vec<(i64, String, i64, String)>,
    /// Scopes whose terminal digest the last round verified.
    pub verified: BTreeSet<String>,
    /// Successful and failed rounds.
    pub rounds_ok: u64,
    /// Failed rounds by error code.
    pub errors: BTreeMap<String, u64>,
    /// Failed rounds whose error was neither retryable nor a reconnect the protocol asks
    /// for, by code.
    pub unexpected: BTreeMap<String, u64>,
    /// Rounds abandoned at a random point, the engine reopened (a client crash).
    pub crashes: u64,
    /// The queue emptied in the drain phase.
    pub drained: bool,
    /// The sentinels arrived in the converge phase.
    pub converged: bool,
    /// An error that ended the client early.
    pub fatal: Option<String>,
}

/// The HTTP transport with a deadline on each request (the engine's own has none).
struct Timed(HttpTransport);

impl Transport for Timed {
    async fn post(&self, path: &str, body: String) -> Result<Response, TransportError> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.0.post(path, body))
            .await
            .unwrap_or_else(|_| Err(TransportError("timed out".into())))
    }
}

/// Where the client runs.
pub struct Setup {
    /// Client index.
    pub i: usize,
    /// Number of clients.
    pub n: usize,
    /// The proxy's base URL.
    pub base: String,
    /// A bearer token for `c<i>`.
    pub token: String,
    /// The SQLite file.
    pub path: PathBuf,
    /// The run's seed.
    pub seed: u64,
}

struct State {
    setup: Setup,
    rng: Rng,
    shared: Arc<Shared>,
    report: Report,
    counter: u64,
}

/// Runs client `setup.i` to the end of the run (on its own thread and runtime).
pub fn run(setup: Setup, shared: Arc<Shared>) -> Report {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let rng = Rng::new(setup.seed, 100 + setup.i as u64);
    let mut state = State {
        report: Report {
            name: format!("c{}", setup.i),
            ..Report::default()
        },
        setup,
        rng,
        shared,
        counter: 0,
    };
    if let Err(e) = rt.block_on(state.main()) {
        state.report.fatal = Some(format!("{e:#}"));
        state.shared.gave_up.fetch_add(1, Ordering::Relaxed);
    }
    state.report
}

fn int64(v: i64) -> TypedValue {
    TypedValue::from_scalar(Scalar::Int64(v)).expect("an int64")
}

fn text(v: &str) -> TypedValue {
    TypedValue::from_scalar(Scalar::String(v.to_owned())).expect("a string")
}

impl State {
    fn open(&mut self) -> Result<Client<Timed>> {
        let token = self.setup.token.clone();
        let transport = Timed(HttpTransport::new(self.setup.base.clone(), move || {
            token.clone()
        }));
        let mut ids = Rng::new(self.rng.next_u64(), 1);
        Ok(Client::open(
            Storage::open(&self.setup.path)?,
            transport,
            move || ids.bytes16(),
        )?)
    }

    fn phase(&self) -> u8 {
        self.shared.phase.load(Ordering::Relaxed)
    }

    async fn main(&mut self) -> Result<()> {
        let mut client = self.open()?;
        let mut installed = false;
        while self.phase() == CHAOS {
            if !installed && client.manifest().is_some() {
                installed = true;
                self.shared.installed.fetch_add(1, Ordering::Relaxed);
            }
            if client.manifest().is_some() {
                for _ in 0..self.rng.range(0, 4) {
                    self.write_one(&mut client)?;
                }
            }
            let crash_after = self.rng.chance(3).then(|| self.rng.range(0, 400));
            if !self.round(&mut client, crash_after).await {
                // A crash: the round's future is gone; open the engine again from its file.
                drop(client);
                client = self.open()?;
                continue;
            }
            let pause = self.rng.range(20, 200);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        while self.phase() == DRAIN && !self.report.drained {
            self.round(&mut client, None).await;
            if pending(&client)? == 0 {
                self.report.drained = true;
                self.shared.drained.fetch_add(1, Ordering::Relaxed);
            } else {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        while self.phase() == DRAIN {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        while self.phase() == CONVERGE && !self.report.converged {
            self.round(&mut client, None).await;
            anyhow::ensure!(
                client.manifest().is_some(),
                "never installed the schema (engine state {:?})",
                client.state()
            );
            let sentinels: i64 = client.storage().connection().query_row(
                "SELECT count(*) FROM items WHERE id IN (-1, ?)",
                [-100 - self.setup.i as i64],
                |r| r.get(0),
            )?;
            if sentinels == 2 {
                // One more round, which must verify both scopes.
                self.report.verified.clear();
                if self.round(&mut client, None).await {
                    self.report.converged = true;
                    self.shared.converged.fetch_add(1, Ordering::Relaxed);
                }
            } else {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        for m in client.storage().mutations()? {
            let id = m.mutation.mutation_id;
            // The stored outcome's own status and mutation ID, as received.
            let stored = match client.storage().outcome(&id)? {
                None => None,
                Some(text) => {
                    let o = synchro_protocol::json::Json::parse(&text)
                        .map_err(|_| anyhow::anyhow!("a stored outcome does not parse"))?;
                    let member = |name| o.get(name).and_then(|v| v.as_str()).map(str::to_owned);
                    Some((member("status"), member("mutation_id")))
                }
            };
            let outcome = match stored {
                None => None,
                Some((Some(status), Some(of))) if of == id => Some(status),
                Some(_) => Some("(an outcome of another mutation)".to_owned()),
            };
            self.report
                .queue
                .insert(id, (m.state.as_str().to_owned(), outcome));
        }
        let conn = client.storage().connection();
        let mut q = conn.prepare("SELECT id, owner, val, tag FROM items ORDER BY id")?;
        self.report.rows = q
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    /// One sync round, abandoned after `crash_after` ms when that comes first (then false).
    async fn round(&mut self, client: &mut Client<Timed>, crash_after: Option<u64>) -> bool {
        let start = self.shared.now_ms();
        let result = match crash_after {
            None => client.sync_once().await,
            Some(ms) => tokio::select! {
                r = client.sync_once() => r,
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {
                    self.report.crashes += 1;
                    return false;
                }
            },
        };
        match result {
            Ok(r) => {
                self.report.rounds_ok += 1;
                self.report.verified = r.verified;
                let end = self.shared.now_ms();
                self.shared.ok_rounds[self.setup.i]
                    .lock()
                    .unwrap()
                    .push((start, end));
            }
            Err(e) => {
                let code = e.code().to_owned();
                *self.report.errors.entry(code.clone()).or_default() += 1;
                if !expected(&e) {
                    *self.report.unexpected.entry(code).or_default() += 1;
                }
                let pause = self.rng.range(50, 300);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }
        true
    }

    /// One random local write (or none when the table gives nothing to act on).
    fn write_one(&mut self, client: &mut Client<Timed>) -> Result<()> {
        let manifest = client.manifest().expect("installed").clone();
        let table = manifest
            .tables
            .iter()
            .find(|t| t.name == "items")
            .expect("the items table");
        let field = |name: &str| {
            table
                .fields
                .iter()
                .find(|f| f.name == name)
                .expect("a field")
                .field_id
                .clone()
        };
        let (owner_f, val_f, tag_f) = (field("owner"), field("val"), field("tag"));
        let (i, n) = (self.setup.i, self.setup.n);
        let me = format!("c{i}");
        let other = format!("c{}", (i + 1) % n);
        self.counter += 1;
        let tag = format!("{me}-{}", self.counter);
        let new_id = (i as i64 + 1) * 1_000_000_000 + self.counter as i64;
        // The mix, in percent: 25 inserts into the client's own scope, 15 into the shared
        // scope, 32 updates and 12 deletes of a random local row, 3 inserts into the next
        // client's scope and 3 moves of an own row there (both must be refused), 10 nothing.
        let kind = match self.rng.range(0, 100) {
            0..=24 => Kind::Insert(&me),
            25..=39 => Kind::Insert("shared"),
            40..=71 => Kind::Update,
            72..=83 => Kind::Delete,
            84..=86 if n > 1 => Kind::Insert(&other),
            87..=89 if n > 1 => Kind::MoveAway,
            _ => return Ok(()),
        };
        let (op, id, columns, forbidden, private) = match kind {
            Kind::Insert(owner) => {
                let cols = vec![
                    (owner_f, text(owner)),
                    (val_f, int64(0)),
                    (tag_f, text(&tag)),
                ];
                let forbidden = owner != me && owner != "shared";
                (Operation::Insert, new_id, cols, forbidden, owner == me)
            }
            Kind::Update | Kind::Delete => {
                let Some((id, owner, val)) = self.pick(client, None)? else {
                    return Ok(());
                };
                if let Kind::Delete = kind {
                    (Operation::Delete, id, vec![], false, owner == me)
                } else {
                    let cols = vec![(val_f, int64(val + 1)), (tag_f, text(&tag))];
                    (Operation::Update, id, cols, false, owner == me)
                }
            }
            Kind::MoveAway => {
                let Some((id, _, val)) = self.pick(client, Some(&me))? else {
                    return Ok(());
                };
                let cols = vec![
                    (owner_f, text(&other)),
                    (val_f, int64(val + 1)),
                    (tag_f, text(&tag)),
                ];
                (Operation::Update, id, cols, true, true)
            }
        };
        let pk = int64(id);
        let written = client.write(&LocalWrite {
            table_id: &table.table_id,
            operation: op,
            pk: &pk,
            columns: &columns,
        });
        match written {
            Ok(mutation_id) => self.report.writes.push(Written {
                mutation_id,
                op: match op {
                    Operation::Insert => 'I',
                    Operation::Update => 'U',
                    _ => 'D',
                },
                id,
                tag: (op != Operation::Delete).then_some(tag),
                forbidden,
                private,
            }),
            Err(_) => self.report.refused_locally += 1,
        }
        Ok(())
    }

    /// A random local row (id, owner, val), of `owner` when given.
    fn pick(
        &mut self,
        client: &Client<Timed>,
        owner: Option<&str>,
    ) -> Result<Option<(i64, String, i64)>> {
        let conn = client.storage().connection();
        let filter = owner.unwrap_or("%");
        let count: i64 = conn.query_row(
            "SELECT count(*) FROM items WHERE id > 0 AND owner LIKE ?",
            [filter],
            |r| r.get(0),
        )?;
        if count == 0 {
            return Ok(None);
        }
        let offset = self.rng.range(0, count as u64) as i64;
        Ok(Some(conn.query_row(
            "SELECT id, owner, val FROM items WHERE id > 0 AND owner LIKE ?1 ORDER BY id LIMIT 1 OFFSET ?2",
            rusqlite::params![filter, offset],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?))
    }
}

/// What a write does.
enum Kind<'a> {
    /// Insert a new row owned by this owner (`shared`, the client's own, or another's).
    Insert(&'a str),
    /// Update a random local row.
    Update,
    /// Delete a random local row.
    Delete,
    /// Move one of the client's own rows into the next client's scope.
    MoveAway,
}

/// Mutations still waiting for their outcome.
fn pending(client: &Client<Timed>) -> Result<usize> {
    Ok(client
        .storage()
        .mutations()?
        .iter()
        .filter(|m| m.state == MutationState::Pending)
        .count())
}

/// Whether a failed round's error is one a client meets in normal operation under faults:
/// a network failure or a retryable server answer (503 during a database restart), or a
/// reconnect the protocol asks for.
fn expected(e: &ClientError) -> bool {
    e.retryable()
        || matches!(
            e.code(),
            "schema_mismatch" | "client_generation_expired" | "rebuild_restart_required"
        )
}
