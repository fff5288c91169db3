//! The container's health check without curl: `synchro-server probe` sends `GET /ready` to a
//! local `serve` over plain HTTP/1.1 and reports whether it answered 200.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the whole probe may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Why a probe failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// No answer within the timeout.
    #[error("no answer from /ready within {0:?}")]
    Timeout(Duration),
    /// The connection failed or broke.
    #[error("cannot reach /ready: {0}")]
    Io(#[from] std::io::Error),
    /// An answer other than 200 (the server is not ready, or it is not synchro).
    #[error("/ready answered {0:?}")]
    NotReady(String),
}

/// The address to probe for a server listening on `listen`: loopback of the same family for
/// an unspecified address (`0.0.0.0`, `::`).
pub fn target(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// `GET /ready` on the server listening on `listen`: `Ok` for a 200 answer.
pub async fn ready(listen: SocketAddr) -> Result<(), ProbeError> {
    tokio::time::timeout(TIMEOUT, ask(target(listen)))
        .await
        .map_err(|_| ProbeError::Timeout(TIMEOUT))?
}

async fn ask(addr: SocketAddr) -> Result<(), ProbeError> {
    let mut tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.write_all(b"GET /ready HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await?;
    // The status line is all we need; the body (check names) is not printed.
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    while !head.contains(&b'\n') && head.len() < 4096 {
        let n = tcp.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let status = line.lines().next().unwrap_or("").trim().to_owned();
    let mut parts = status.split(' ');
    match (parts.next(), parts.next()) {
        (Some(v), Some("200")) if v.starts_with("HTTP/1.") => Ok(()),
        _ => Err(ProbeError::NotReady(status)),
    }
}
