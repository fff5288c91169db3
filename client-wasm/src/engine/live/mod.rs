//! The live session: [`Client::run_live`] connects once, holds the change-notification
//! stream (`POST /sync/events`) open and runs a round (push, rebuild, pull) whenever the
//! stream says an assigned scope changed, the application queued a write, or the slow
//! safety poll expires. Every round is the same verified round as in
//! [`Client::sync_once`]: each page applies atomically after its row checksums verify, and a
//! scope's cursor advances only after its terminal digest verifies.
//!
//! What it does on failure:
//! - a network failure, a retryable server error (503), a refused page or a 401 backs off
//!   exponentially with jitter ([`LiveConfig`]: bounded, reset by the next success), then
//!   retries; every request asks the transport's token provider again, so a 401 is retried
//!   with a fresh token;
//! - a dropped or silent stream (no byte for [`LiveConfig::stream_idle_ms`]) is reopened, and
//!   its `ready` event triggers a catch-up pull;
//! - a fresh connect happens only when the protocol requires one: 409
//!   `client_generation_expired`, 422 `schema_mismatch`, an `end` event for an expired
//!   generation or a changed schema (`schema_changed`: the server serves a new manifest, so
//!   the schema action is learnt at once), or a 426 on the stream (the connect records the
//!   refusal);
//! - HTTP 426 or the `unsupported` action ends the session with
//!   [`LiveEnd::UpgradeRequired`], the queue and local data kept;
//! - anything that blocks the engine (a local inconsistency, a contract failure) ends it
//!   with the error.
//!
//! The application reaches the client while the session runs through its [`LiveHandle`]:
//! [`LiveHandle::with_client`] runs a closure on the client (a local write, a query) as
//! soon as the session waits, between rounds or for any request of a round (the round does
//! not hold the application up), after which queued intent is pushed; [`LiveHandle::stop`]
//! ends the session cleanly between two requests (an in-flight page finishes or is not
//! applied at all). Statuses ([`LiveStatus`]) go to a callback. Nothing logged or reported carries a
//! row value, key, identifier or token: a [`LiveError`] is a code and a status.

mod config;
mod handle;
mod status;

use synchro_protocol::jcs::to_output_string;
use synchro_protocol::wire::{EventsRequest, Message, SseDecoder, StreamEvent};

pub use config::LiveConfig;
use handle::{first, First};
pub use handle::{LiveHandle, NotRunning};
pub use status::{LiveEnd, LiveError, LiveStatus};

use std::future::Future;
use std::pin::pin;

use super::{needs_reconnect, system_ms, Client, ClientError};
use crate::error::StorageError;
use crate::transport::{EventStream, EventTransport, Opened, Transport};

/// A stream that ends sooner than this after opening counts as a failure (backs off).
const SHORT_STREAM_MS: u64 = 1000;

/// An open events stream and its decoder.
struct Open<S> {
    body: S,
    decoder: SseDecoder,
    opened_ms: u64,
}

/// What reading the stream gave.
enum Heard {
    /// `ready` or `changed`: pull.
    Changed,
    /// The generation was replaced or the served schema changed: connect.
    Connect,
    /// The stream ended, failed or went silent; `failed` when it counts as a failure.
    Dropped { failed: bool },
}

/// What a failure asks the session to do.
enum Next {
    /// Wait (back off), then retry.
    Retry,
    /// Connect again, then retry.
    Reconnect,
    /// End the session with this outcome.
    End(LiveEnd),
    /// End the session with this error.
    Fail,
}

fn classify(e: &ClientError) -> Next {
    match e {
        ClientError::UpgradeRequired(r) => Next::End(LiveEnd::UpgradeRequired(*r)),
        // A 426 on the stream: connect, which records the refusal durably.
        e if needs_reconnect(e) || e.is_server("upgrade_required") => Next::Reconnect,
        e if e.retryable() || e.is_server("unauthorized") => Next::Retry,
        ClientError::Storage(StorageError::Verification(_)) => Next::Retry,
        _ => Next::Fail,
    }
}

impl<T: Transport> Client<T> {
    /// Awaits `request` (a request of a round, holding no borrow of the client). While a
    /// live session runs, its queued closures run meanwhile: an application's write or
    /// query waits for no round to finish. The round's own state is safe from them: no
    /// transaction is open across a request, and each page applies against the queue as it
    /// is then (rows with queued intent keep the local value). A closure that queued a
    /// write makes the session run another round after this one.
    pub(super) async fn awaiting<F: Future>(&mut self, request: F) -> F::Output {
        let running = self
            .live
            .as_ref()
            .filter(|(_, alive)| alive.strong_count() > 0)
            .map(|(handle, _)| handle.clone());
        let Some(handle) = running else {
            self.live = None; // (a session whose future was dropped)
            return request.await;
        };
        let mut request = pin!(request);
        loop {
            let heard = first(
                request.as_mut(),
                std::future::pending::<()>(),
                handle.job_queued(),
            )
            .await;
            match heard {
                First::A(out) => return out,
                First::B(()) | First::Woken => {
                    while let Some(job) = handle.next_job() {
                        job(self);
                        self.ran_while_waiting = true;
                    }
                }
            }
        }
    }
}

impl<T: EventTransport> Client<T> {
    /// Runs a live session until `handle` stops it, the server requires an upgrade, or an
    /// error blocks the engine (see the module documentation of `live` for what each
    /// failure does). `on_status` hears every change of [`LiveStatus`], ending with
    /// [`LiveStatus::Stopped`].
    ///
    /// The future is not `Send` (the client is single-threaded): natively, run it with
    /// `tokio::join!` or in a `LocalSet`; in the browser, `spawn_local`.
    pub async fn run_live(
        &mut self,
        handle: &LiveHandle<T>,
        config: &LiveConfig,
        mut on_status: impl FnMut(&LiveStatus),
    ) -> Result<LiveEnd, ClientError> {
        let mut last: Option<LiveStatus> = None;
        let mut status = |s: LiveStatus| {
            if last.as_ref() != Some(&s) {
                on_status(&s);
                last = Some(s);
            }
        };
        // Dropped with this future: a session dropped before its end leaves the client
        // running no more of its closures.
        let alive = std::rc::Rc::new(());
        self.live = Some((handle.clone(), std::rc::Rc::downgrade(&alive)));
        self.ran_while_waiting = false;
        let result = self.live_loop(handle, config, &mut status).await;
        self.live = None;
        // Closures queued before the end still run (a write is never dropped); later ones
        // resolve to NotRunning.
        while let Some(job) = handle.next_job() {
            job(self);
        }
        handle.end();
        status(LiveStatus::Stopped);
        result
    }

    async fn live_loop(
        &mut self,
        handle: &LiveHandle<T>,
        config: &LiveConfig,
        status: &mut impl FnMut(LiveStatus),
    ) -> Result<LiveEnd, ClientError> {
        let mut connect = true; // a connect is due
        let mut due = true; // a round is due
        let mut stream: Option<Open<T::Stream>> = None;
        let mut failures = 0u32;
        let mut last_round = system_ms();
        loop {
            // Between two requests: the application's closures, then its requests.
            let mut ran = false;
            while let Some(job) = handle.next_job() {
                job(self);
                ran = true;
            }
            // (Or while the stream was being opened.)
            ran |= std::mem::take(&mut self.ran_while_waiting);
            if handle.stopping() {
                return Ok(LiveEnd::Stopped);
            }
            // A closure that queued a write makes a round due (to push it); a read does not.
            due |= (ran && self.storage.pending_count()? > 0) | handle.take_sync_now();

            let mut failed: Option<ClientError> = None;
            if connect || due {
                status(if connect {
                    LiveStatus::Connecting
                } else {
                    LiveStatus::Syncing
                });
                let round = if connect {
                    self.sync_once().await
                } else {
                    self.connected_round().await
                };
                // A write made while the round's requests were in flight was not pushed
                // by it (or only in part): another round follows.
                let wrote = std::mem::take(&mut self.ran_while_waiting)
                    && self.storage.pending_count()? > 0;
                match round {
                    Ok(_) => {
                        connect = false;
                        due = wrote;
                        failures = 0;
                        last_round = system_ms();
                    }
                    Err(e) => failed = Some(e),
                }
            } else if stream.is_none() {
                match self.open_stream().await {
                    Ok(open) => {
                        stream = Some(open);
                        continue; // its `ready` makes a round due
                    }
                    Err(e) => failed = Some(e),
                }
            }
            if let Some(e) = failed {
                match classify(&e) {
                    Next::End(end) => return Ok(end),
                    Next::Fail => return Err(e),
                    Next::Reconnect => {
                        stream = None;
                        connect = true;
                        if failures == 0 {
                            failures = 1; // the first reconnect is at once
                            continue;
                        }
                    }
                    Next::Retry => {}
                }
                match self
                    .back_off(handle, config, &mut failures, LiveError::of(&e), status)
                    .await
                {
                    None => return Ok(LiveEnd::Stopped),
                    Some(ran) => due |= ran && self.storage.pending_count()? > 0,
                }
                continue;
            }
            let Some(open) = stream.as_mut() else {
                continue;
            };
            if failures == 0 {
                status(LiveStatus::Live);
            }
            let poll_in = (last_round + config.safety_poll_ms()).saturating_sub(system_ms());
            let heard = first(
                read_event(open, &*self.transport, config.stream_idle_ms()),
                self.transport.sleep(poll_in.max(1)),
                handle.woken(),
            )
            .await;
            match heard {
                First::A(Heard::Changed) => due = true,
                First::A(Heard::Connect) => {
                    stream = None;
                    connect = true;
                }
                First::A(Heard::Dropped { failed }) => {
                    stream = None;
                    due = true; // notifications may have been missed
                    let error = LiveError {
                        code: "stream_dropped".into(),
                        status: None,
                        retryable: true,
                    };
                    if failed
                        && self
                            .back_off(handle, config, &mut failures, error, status)
                            .await
                            .is_none()
                    {
                        return Ok(LiveEnd::Stopped);
                    }
                }
                First::B(()) => due = true, // the safety poll
                First::Woken => {}
            }
        }
    }

    /// Reports `error` and waits out the next back-off. The application's closures run
    /// meanwhile without cutting the wait short (a write while offline does not defeat the
    /// back-off); [`LiveHandle::sync_now`] does cut it short. Returns `None` to stop, else
    /// whether closures ran (a round is then due).
    async fn back_off(
        &mut self,
        handle: &LiveHandle<T>,
        config: &LiveConfig,
        failures: &mut u32,
        error: LiveError,
        status: &mut impl FnMut(LiveStatus),
    ) -> Option<bool> {
        let mut ran = false;
        let retry_in_ms = config.backoff(*failures, self.random_u64());
        *failures = failures.saturating_add(1);
        status(LiveStatus::Offline {
            error,
            retry_in_ms,
            failures: *failures,
        });
        let until = system_ms() + retry_in_ms;
        loop {
            let left = until.saturating_sub(system_ms());
            if left == 0 {
                return Some(ran);
            }
            let woke = first(
                self.transport.sleep(left),
                std::future::pending::<()>(),
                handle.woken(),
            )
            .await;
            while let Some(job) = handle.next_job() {
                job(self);
                ran = true;
            }
            if handle.stopping() {
                return None;
            }
            if !matches!(woke, First::Woken) || handle.take_sync_now() {
                return Some(ran);
            }
        }
    }

    /// Opens the events stream for the current generation.
    async fn open_stream(&mut self) -> Result<Open<T::Stream>, ClientError> {
        let request = EventsRequest {
            client_id: self.client_id.clone(),
            client_generation: self.connected_generation()?,
        };
        let transport = std::rc::Rc::clone(&self.transport);
        let body = to_output_string(&request.to_json());
        let opening = async move { transport.open_events(body).await };
        match self.awaiting(opening).await? {
            Opened::Stream(body) => Ok(Open {
                body,
                decoder: SseDecoder::new(),
                opened_ms: system_ms(),
            }),
            // A 426 here is `upgrade_required`, which makes the session connect: connect
            // records the refusal and ends the session.
            Opened::Refused(r) => Err(ClientError::from_response(&r)),
        }
    }

    fn random_u64(&mut self) -> u64 {
        let b = (self.random)();
        u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
    }
}

/// Reads the stream until an event that matters, its end, or `idle_ms` without a byte.
async fn read_event<T: EventTransport>(
    open: &mut Open<T::Stream>,
    transport: &T,
    idle_ms: u64,
) -> Heard {
    loop {
        if let Some(e) = open.decoder.next_event() {
            return match e {
                Ok(StreamEvent::Ready | StreamEvent::Changed { .. }) => Heard::Changed,
                Ok(StreamEvent::End { reason })
                    if reason == "client_generation_expired" || reason == "schema_changed" =>
                {
                    Heard::Connect
                }
                Ok(StreamEvent::End { .. }) => Heard::Dropped { failed: false },
                // A malformed event is the server's contract failure: drop the stream.
                Err(_) => Heard::Dropped { failed: true },
            };
        }
        let chunk = first(
            open.body.next_chunk(),
            transport.sleep(idle_ms),
            std::future::pending::<()>(),
        )
        .await;
        match chunk {
            First::A(Ok(Some(bytes))) => open.decoder.push(&bytes),
            First::A(Ok(None)) => {
                let short = system_ms().saturating_sub(open.opened_ms) < SHORT_STREAM_MS;
                return Heard::Dropped { failed: short };
            }
            First::A(Err(_)) | First::B(()) | First::Woken => {
                return Heard::Dropped { failed: true }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::UpgradeReason;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn failures_that_wait_reconnect_end_or_block() {
        let server = |status, code: &str, retryable| ClientError::Server {
            status,
            code: code.into(),
            retryable,
        };
        let retry = [
            ClientError::Transport(crate::transport::TransportError("x".into())),
            server(503, "temporary_unavailable", true),
            server(401, "unauthorized", false),
            ClientError::Storage(StorageError::Verification("x")),
        ];
        for e in retry {
            assert!(matches!(classify(&e), Next::Retry), "{e:?}");
        }
        for e in [
            server(409, "client_generation_expired", false),
            server(422, "schema_mismatch", false),
        ] {
            assert!(matches!(classify(&e), Next::Reconnect), "{e:?}");
        }
        assert!(matches!(
            classify(&ClientError::UpgradeRequired(UpgradeReason::ClientRuntime)),
            Next::End(LiveEnd::UpgradeRequired(UpgradeReason::ClientRuntime))
        ));
        for e in [
            server(400, "invalid_request", false),
            ClientError::Blocked("x"),
            ClientError::Malformed("x"),
        ] {
            assert!(matches!(classify(&e), Next::Fail), "{e:?}");
        }
    }
}
