//! `GET /seeds/{name}` (issue 30): the seed artifacts of `serve --seed-dir` and their
//! evidence, by file name (`board.seed.sqlite`, `board.seed.json`).
//!
//! - Behind a valid bearer token (401 otherwise), unless `--public-seeds` (a seed holds only
//!   declared shared scopes' rows).
//! - Content-addressed: the artifact's ETag is the SHA-256 its evidence records (the
//!   evidence's own is the SHA-256 of its bytes); `If-None-Match` answers 304. With
//!   `?v=<that sha256>` the answer is immutable for a year; without, it is revalidated.
//!   A `v` that is not the current one is 404 (that version is gone).
//! - `Range: bytes=a-b` (one range, also `a-` and `-n`) answers 206 with `Content-Range`;
//!   a range outside the file is 416.
//! - Only a plain file name of letters, digits, `.`, `_` and `-` ending in `.sqlite` (with
//!   its evidence beside it) or `.json` is served, never a path; anything else is 404.
//!
//! The file is streamed from disk in 64 KiB chunks; nothing is held in memory whole.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::{ApiError, AppState};

const CHUNK: usize = 64 * 1024;

fn not_found() -> Response {
    StatusCode::NOT_FOUND.into_response()
}

/// Whether `name` is a servable seed file name.
fn servable(name: &str) -> bool {
    (1..=200).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && (name.ends_with(".sqlite") || name.ends_with(".json"))
}

/// The ETag of a servable file: the recorded SHA-256 of an artifact (from its evidence), the
/// SHA-256 of an evidence file's bytes.
async fn etag(dir: &std::path::Path, name: &str) -> Option<String> {
    if let Some(stem) = name.strip_suffix(".sqlite") {
        let evidence = tokio::fs::read(dir.join(format!("{stem}.json")))
            .await
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&evidence).ok()?;
        let sha = v.get("sha256")?.as_str()?;
        (sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit())).then(|| sha.to_owned())
    } else {
        let bytes = tokio::fs::read(dir.join(name)).await.ok()?;
        Some(hex::encode(Sha256::digest(&bytes)))
    }
}

/// A `Range: bytes=...` header against a file of `len` bytes: `Ok(None)` for no (or an
/// unsupported multi-) range, the inclusive bounds, or `Err` when it cannot be satisfied.
fn range(headers: &HeaderMap, len: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(value) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    let Some(spec) = value.strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let (a, b) = spec.split_once('-').ok_or(())?;
    let parse = |t: &str| t.trim().parse::<u64>().map_err(|_| ());
    let (first, last) = match (a.trim().is_empty(), b.trim().is_empty()) {
        (false, true) => (parse(a)?, len.saturating_sub(1)),
        (false, false) => (parse(a)?, parse(b)?.min(len.saturating_sub(1))),
        (true, false) => {
            let n = parse(b)?;
            if n == 0 {
                return Err(());
            }
            (len.saturating_sub(n), len.saturating_sub(1))
        }
        (true, true) => return Err(()),
    };
    if len == 0 || first > last || first >= len {
        return Err(());
    }
    Ok(Some((first, last)))
}

/// Serves one seed file (see the module docs).
pub(crate) async fn seed(
    state: &AppState,
    name: &str,
    version: Option<&str>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let Some(dir) = state.config.seed_dir.as_deref() else {
        return Ok(not_found());
    };
    if !state.config.public_seeds && state.auth.user_id(headers).await.is_none() {
        return Err(ApiError::unauthorized());
    }
    if !servable(name) {
        return Ok(not_found());
    }
    let Some(etag) = etag(dir, name).await else {
        return Ok(not_found());
    };
    if version.is_some_and(|v| v != etag) {
        return Ok(not_found());
    }
    let Ok(mut file) = tokio::fs::File::open(dir.join(name)).await else {
        return Ok(not_found());
    };
    let len = file
        .metadata()
        .await
        .map_err(|_| ApiError::unavailable())?
        .len();
    let quoted = format!("\"{etag}\"");
    let mut out = HeaderMap::new();
    out.insert(header::ETAG, HeaderValue::from_str(&quoted).expect("hex"));
    out.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    let visibility = if state.config.public_seeds {
        "public"
    } else {
        "private"
    };
    let cache = match version {
        Some(_) => format!("{visibility}, max-age=31536000, immutable"),
        None => format!("{visibility}, no-cache"),
    };
    out.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_str(&cache).expect("ASCII"),
    );
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(if name.ends_with(".json") {
            "application/json"
        } else {
            "application/vnd.sqlite3"
        }),
    );
    let matches = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim() == quoted || t.trim() == "*");
    if matches {
        return Ok((StatusCode::NOT_MODIFIED, out).into_response());
    }
    let (status, first, count) = match range(headers, len) {
        Ok(None) => (StatusCode::OK, 0, len),
        Ok(Some((first, last))) => {
            out.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes {first}-{last}/{len}")).expect("ASCII"),
            );
            (StatusCode::PARTIAL_CONTENT, first, last - first + 1)
        }
        Err(()) => {
            out.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes */{len}")).expect("ASCII"),
            );
            return Ok((StatusCode::RANGE_NOT_SATISFIABLE, out).into_response());
        }
    };
    file.seek(std::io::SeekFrom::Start(first))
        .await
        .map_err(|_| ApiError::unavailable())?;
    out.insert(
        header::CONTENT_LENGTH,
        HeaderValue::from_str(&count.to_string()).expect("digits"),
    );
    let body = Body::from_stream(futures_util::stream::unfold(
        (file, count),
        |(mut file, left)| async move {
            if left == 0 {
                return None;
            }
            let mut buf = vec![0; CHUNK.min(left as usize)];
            match file.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((
                        Ok::<_, std::io::Error>(axum::body::Bytes::from(buf)),
                        (file, left - n as u64),
                    ))
                }
                Err(e) => Some((Err(e), (file, 0))),
            }
        },
    ));
    tracing::info!(status = status.as_u16(), bytes = count, "seed");
    Ok((status, out, body).into_response())
}
