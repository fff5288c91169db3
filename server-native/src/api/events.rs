//! Change notification: `POST /sync/events` answers with a server-sent-events stream that
//! tells a connected client, without any row data, which of its assigned scopes have new
//! effects, so it pulls right after a commit instead of polling on a timer. Pull itself is
//! unchanged.
//!
//! The [`Notifier`] (one per server, in the state) learns of commits and of changes of the
//! served manifest. A stream takes the dispatcher's answer when it continues where the stream
//! is; a stream that missed an answer runs its own query (`synchro_changed_scopes` and the
//! user's current assignment, also run to confirm an answer naming one of its scopes, and at
//! least every `Config::events_recheck` plus a random part of as much again, 30–60 s by
//! default, whatever the dispatcher says), which names its scopes of the *current* assignment
//! (a revoked scope is never named once the revocation committed), notices an assignment
//! change (then `changed` naming the scopes gained, possibly none: the client pulls, and the
//! pull takes a revoked scope away) and checks its generation (a replaced one ends the
//! stream within that bound). The per-stream random part keeps 10,000 streams from querying
//! at once (a 5 s tick restarted at every dispatcher answer fired for all of them together).
//! When the served manifest changes, every stream ends with `schema_changed`, each after a
//! random delay below [`schema_spread`] (the larger of 2 s and 1 ms per open stream of this
//! server, at most 30 s, so that the connects that follow do not all arrive at once), and its
//! client connects to learn its schema action (`replace`, `rebuild_local`, `unsupported`) at
//! once instead of at its next round. A stream opened after the change needs no notice: its
//! `ready` makes the client pull, and the pull's 422 makes it connect.
//!
//! Stream events (each `data` is a JSON object):
//! - `ready` `{}`: subscribed; pull once now to cover anything committed before it.
//! - `changed` `{"scopes": [...]}`: these assigned scopes have new effects; pull them.
//! - `end` `{"reason": "client_generation_expired" | "schema_changed" | "lifetime" |
//!   "token_expired" | "shutdown"}`: the stream closes; reconnect (after `connect` for an
//!   expired generation or a changed schema; with a fresh token after `token_expired`, sent
//!   when the bearer token is no longer accepted (its `exp` plus the 30 s clock-skew
//!   leeway), so no stream outlives its token). `shutdown`: the server is stopping ([`Notifier::stop`], at
//!   SIGTERM), so its graceful shutdown need not wait for the streams' lifetime.
//!
//! Comment lines (`: keepalive`) are sent when the stream has been quiet for a while.
//!
//! Open streams are capped server-wide (`Config::max_event_streams`), per user
//! (`Config::max_event_streams_per_user`: one token cannot take every slot with many client
//! IDs) and per (user, client ID) (`Config::max_event_streams_per_client`); over a cap the request is answered 503
//! `temporary_unavailable`, reason `too_many_event_streams`, before any database work. A
//! stream's slot is freed as soon as its client goes away.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::{mpsc, watch};

use synchro_protocol::wire::{EventsRequest, StreamEvent};

#[cfg(doc)]
use super::Notifier;
use super::{ApiError, AppState};

/// Quiet time after which a keepalive comment is sent.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// A stream's lifetime; the client reconnects (and re-authenticates) after it.
const LIFETIME: Duration = Duration::from_secs(300);
/// After the served manifest changed, each of `open` streams ends within this (at random):
/// the connects that follow reach this server at about 1,000 per second at most, up to
/// 30,000 streams.
fn schema_spread(open: usize) -> Duration {
    Duration::from_millis((open as u64).clamp(2_000, 30_000))
}

/// A random duration below `max` (std's per-map random keys: no RNG dependency needed).
fn jitter(max: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    Duration::from_millis(r % (max.as_millis() as u64).max(1))
}

fn event(e: &StreamEvent) -> Bytes {
    Bytes::from(e.to_sse())
}

/// The handler body after the shared preamble: checks the members and the client
/// generation, then streams.
pub(crate) async fn events(
    state: Arc<AppState>,
    user_id: String,
    expires_at: u64,
    req: EventsRequest,
) -> Result<Response, ApiError> {
    let client_id = req.client_id;
    let generation = req.client_generation as i64;
    let config = &state.config;
    let caps = super::notifier::StreamCaps {
        total: config.max_event_streams,
        per_user: config.max_event_streams_per_user,
        per_client: config.max_event_streams_per_client,
    };
    let Some(slot) = state.events.open_stream(&user_id, &client_id, &caps) else {
        return Err(ApiError::overloaded(
            "too_many_event_streams",
            config.retry_after_seconds,
        ));
    };
    let first = changed(&state, &user_id, &client_id, generation, i64::MAX).await?;
    if !first.current {
        let stored = state
            .db
            .get()
            .await?
            .query_opt(
                "SELECT client_generation FROM synchro.synchro_client_state($1, $2)",
                &[&user_id, &client_id],
            )
            .await?
            .map(|r| r.get::<_, i64>(0) as u64);
        return Err(ApiError::generation_expired(stored));
    }
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    let mut updates = state.events.updates(&state).await;
    updates.mark_unchanged();
    let mut stopping = state.events.stopping();
    let mut served = state.events.served(&state).await;
    served.mark_unchanged();
    tokio::spawn(async move {
        let _slot = slot;
        let deadline = tokio::time::Instant::now() + LIFETIME;
        // The stream ends when its token is no longer accepted (`token_expired`: its `exp`
        // plus the clock-skew leeway every request gets): the client opens the next one
        // with a fresh token, or not at all.
        let expiry = tokio::time::Instant::now()
            + until(expires_at.saturating_add(synchro_protocol::jwt::LEEWAY_SECS));
        let mut after = first.watermark;
        let mut assigned: std::collections::HashSet<String> = first.assigned.into_iter().collect();
        let mut last_sent = tokio::time::Instant::now();
        let recheck = state.config.events_recheck + jitter(state.config.events_recheck);
        let mut checked = last_sent;
        // Set when the served manifest changed: the stream ends then.
        let mut schema_end: Option<tokio::time::Instant> = None;
        if tx.send(event(&StreamEvent::Ready)).await.is_err() {
            return;
        }
        loop {
            // The dispatcher's answer when it continues where this stream is; otherwise (a
            // missed answer, a silent dispatcher) this client's own query.
            let shared = tokio::select! {
                r = updates.changed() => {
                    if r.is_err() { break }
                    let u = updates.borrow_and_update().clone();
                    (u.from <= after && u.to != i64::MAX).then_some(u)
                }
                _ = tokio::time::sleep_until(checked + recheck) => None,
                _ = tokio::time::sleep_until(last_sent + KEEPALIVE) => {
                    if tx.send(Bytes::from_static(b": keepalive\n\n")).await.is_err() {
                        break;
                    }
                    last_sent = tokio::time::Instant::now();
                    continue;
                }
                _ = tokio::time::sleep_until(deadline), if deadline <= expiry => {
                    let _ = tx.send(end("lifetime")).await;
                    break;
                }
                _ = tokio::time::sleep_until(expiry), if expiry < deadline => {
                    let _ = tx.send(end("token_expired")).await;
                    break;
                }
                _ = stopped(&mut stopping) => {
                    let _ = tx.send(end("shutdown")).await;
                    break;
                }
                _ = bumped(&mut served), if schema_end.is_none() => {
                    let spread = schema_spread(state.events.open_streams());
                    schema_end = Some(tokio::time::Instant::now() + jitter(spread));
                    continue;
                }
                _ = tokio::time::sleep_until(schema_end.unwrap_or(deadline)), if schema_end.is_some() => {
                    let _ = tx.send(end("schema_changed")).await;
                    break;
                }
                _ = tx.closed() => break, // the client went away
            };
            // A shared answer naming none of the client's scopes costs nothing; one naming
            // some is confirmed by the client's own query (which also checks its generation),
            // so the database work follows the clients a commit concerns.
            let c = match shared {
                Some(u) if u.to <= after => continue, // nothing new for this stream
                Some(u) if !u.scopes.iter().any(|s| assigned.contains(s)) => {
                    after = u.to;
                    continue;
                }
                _ => {
                    checked = tokio::time::Instant::now();
                    let Ok(mut c) = changed(&state, &user_id, &client_id, generation, after).await
                    else {
                        continue; // the database is unavailable: try again on the next wake
                    };
                    if !c.current {
                        let _ = tx.send(end("client_generation_expired")).await;
                        break;
                    }
                    // The user's assignment changed since the last look: the client pulls
                    // (`changed` naming the scopes it gained, possibly none), and the pull
                    // takes a revoked scope away.
                    let now: std::collections::HashSet<String> = c.assigned.drain(..).collect();
                    let gained: Vec<String> = now.difference(&assigned).cloned().collect();
                    let reassigned = now != assigned;
                    assigned = now;
                    if reassigned {
                        c.scopes.extend(gained);
                        c.scopes.sort();
                        c.scopes.dedup();
                        c.reassigned = true;
                    }
                    c
                }
            };
            after = c.watermark;
            if !c.scopes.is_empty() || c.reassigned {
                if tx
                    .send(event(&StreamEvent::Changed { scopes: c.scopes }))
                    .await
                    .is_err()
                {
                    break; // the client went away
                }
                last_sent = tokio::time::Instant::now();
            }
        }
    });
    let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    }));
    tracing::info!(status = 200, "events stream opened");
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
    headers.insert(header::CACHE_CONTROL, "no-store".parse().unwrap());
    Ok((StatusCode::OK, headers, body).into_response())
}

/// How long until the Unix time `secs` (zero once it passed).
fn until(secs: u64) -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Duration::from_secs(secs).saturating_sub(now)
}

/// Completes at the next change of `rx`.
async fn bumped<T>(rx: &mut watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await; // no notifier left to bump it
    }
}

/// Completes once [`Notifier::stop`] was called.
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    if stopping.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await; // no notifier left to stop us
    }
}

fn end(reason: &str) -> Bytes {
    event(&StreamEvent::End {
        reason: reason.to_owned(),
    })
}

struct Changed {
    watermark: i64,
    /// Scopes of the user's current assignment with effects past `after`.
    scopes: Vec<String>,
    current: bool,
    /// The user's current assignment (grants, shared scopes, the assignment function's):
    /// never the client's stored one, so a revoked scope is not named once the revocation
    /// committed.
    assigned: Vec<String>,
    /// Set by the stream when the assignment differs from its last look.
    reassigned: bool,
}

async fn changed(
    state: &AppState,
    user_id: &str,
    client_id: &str,
    generation: i64,
    after: i64,
) -> Result<Changed, ApiError> {
    // The changes and the current assignment go out together (one round trip).
    let db = state.db.get().await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
        [&user_id, &client_id, &generation, &after];
    let (r, assigned) = futures_util::join!(
        db.query_one(
            "SELECT watermark, scopes, current_generation FROM synchro.synchro_changed_scopes($1, $2, $3, $4)",
            &params,
        ),
        super::assigned_scopes(state, user_id)
    );
    let (r, assigned) = (r?, assigned?);
    let scopes: Vec<String> = r.get(1);
    Ok(Changed {
        watermark: r.get(0),
        scopes: scopes
            .into_iter()
            .filter(|s| assigned.contains(s))
            .collect(),
        current: r.get(2),
        assigned: assigned.into_iter().collect(),
        reassigned: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_spread_grows_with_the_open_streams_within_its_bounds() {
        assert_eq!(schema_spread(0), Duration::from_secs(2));
        assert_eq!(schema_spread(2_000), Duration::from_secs(2));
        assert_eq!(schema_spread(10_000), Duration::from_secs(10));
        assert_eq!(schema_spread(1_000_000), Duration::from_secs(30));
    }
}
