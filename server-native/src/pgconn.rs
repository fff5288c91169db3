//! PostgreSQL connection strings as libpq reads them, TLS included, for every session the
//! server opens: tokio-postgres sessions (through tokio-postgres-rustls) and the capture
//! worker's replication stream (pgwire-replication), both with one rustls policy
//! (`pgwire_replication::tls::rustls::client_config`).
//!
//! Both forms libpq takes are read: `postgres://user@host/db?sslmode=verify-full&...` and
//! `host=... sslmode=verify-full ...`. The TLS parameters are libpq's:
//! - `sslmode`: `disable`, `prefer` (the default, as in libpq: TLS when the server offers it,
//!   so the same URL works with psql and with synchro, and a database on loopback or a
//!   socket without TLS still connects), `require` (TLS, the certificate not checked, unless
//!   a root certificate is given, when it is checked as for `verify-ca`, as libpq does),
//!   `verify-ca` (the chain is checked against the root certificates), `verify-full` (the
//!   chain, and the host name or IP address against the certificate's names);
//! - `sslrootcert`: a PEM file of root certificates, or `system` for the Mozilla roots
//!   (which then needs `verify-full`, as in libpq); without it `~/.postgresql/root.crt`
//!   when that exists, else the Mozilla roots;
//! - `sslcert` and `sslkey`: a client certificate and its key (PKCS#8, PKCS#1 or SEC1 PEM),
//!   both or neither.
//!
//! Unlike libpq, the `PG*` environment variables are not read: the URL says everything.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use pgwire_replication::{SslMode, TlsConfig};
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client, Config};

/// A parsed connection string: the tokio-postgres configuration and the TLS to use.
#[derive(Clone)]
pub struct Target {
    /// Everything but TLS (tokio-postgres's own `sslmode` set to what TLS needs).
    pub config: Config,
    /// The TLS settings, in the replication client's form.
    pub tls: TlsConfig,
    /// The same as a rustls configuration, for tokio-postgres; `None` when TLS is disabled.
    rustls: Option<rustls::ClientConfig>,
}

/// The libpq TLS parameters, taken out of a connection string before tokio-postgres reads it
/// (it knows only three of the five `sslmode` values and none of the certificate files).
#[derive(Default)]
struct TlsParams {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    sslcert: Option<String>,
    sslkey: Option<String>,
}

impl TlsParams {
    /// Takes `key = value` if it is a TLS parameter (true), else leaves it.
    fn take(&mut self, key: &str, value: String) -> bool {
        let slot = match key {
            "sslmode" => &mut self.sslmode,
            "sslrootcert" => &mut self.sslrootcert,
            "sslcert" => &mut self.sslcert,
            "sslkey" => &mut self.sslkey,
            _ => return false,
        };
        *slot = Some(value);
        true
    }
}

/// Parses a connection string (URL or `key=value` form).
pub fn parse(conn: &str) -> Result<Target> {
    let mut params = TlsParams::default();
    let rest = if conn.starts_with("postgres://") || conn.starts_with("postgresql://") {
        strip_url(conn, &mut params)
    } else {
        strip_key_values(conn, &mut params)?
    };
    let mut config: Config = rest.parse().map_err(|e: tokio_postgres::Error| {
        anyhow::anyhow!("the connection string: {}", crate::install::describe(&e))
    })?;
    let tls = tls_config(params)?;
    // Reads the files now: a missing or unreadable one is refused before any connection.
    let rustls = (tls.mode != SslMode::Disable)
        .then(|| pgwire_replication::tls::rustls::client_config(&tls))
        .transpose()
        .map_err(|e| anyhow::anyhow!("the connection string's TLS settings: {e}"))?;
    config.ssl_mode(match tls.mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    Ok(Target {
        config,
        tls,
        rustls,
    })
}

/// The TLS settings libpq would use for these parameters.
fn tls_config(params: TlsParams) -> Result<TlsConfig> {
    let explicit_mode = params.sslmode.is_some();
    let mut mode = match params.sslmode.as_deref().unwrap_or("prefer") {
        "disable" => SslMode::Disable,
        // libpq's `allow` tries without TLS first; `prefer` is the nearest that never
        // sends a password in the clear when the server offers TLS.
        "allow" | "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        other => bail!(
            "the connection string's sslmode is {other:?}: use disable, prefer, require, verify-ca or verify-full"
        ),
    };
    let root = match params.sslrootcert.as_deref() {
        Some("system") => {
            if !explicit_mode {
                mode = SslMode::VerifyFull;
            } else if mode != SslMode::VerifyFull {
                bail!("sslrootcert=system needs sslmode=verify-full (as in libpq): any certificate a public authority issued would pass a weaker check");
            }
            None
        }
        Some(path) => Some(PathBuf::from(path)),
        None => std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".postgresql/root.crt"))
            .filter(|p| p.is_file()),
    };
    // libpq: `require` with a root certificate checks the chain, as `verify-ca` does.
    if mode == SslMode::Require && root.is_some() {
        mode = SslMode::VerifyCa;
    }
    let mut tls = TlsConfig {
        mode,
        ca_pem_path: root,
        ..TlsConfig::disabled()
    };
    match (params.sslcert, params.sslkey) {
        (Some(cert), Some(key)) => tls = tls.with_client_cert(cert, key),
        (None, None) => {}
        _ => bail!("the connection string names only one of sslcert and sslkey: a client certificate needs both"),
    }
    Ok(tls)
}

/// The URL form without its TLS query parameters (taken into `params`, percent-decoded).
fn strip_url(conn: &str, params: &mut TlsParams) -> String {
    let Some((base, query)) = conn.split_once('?') else {
        return conn.to_owned();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_encoding::percent_decode_str(value)
                .decode_utf8_lossy()
                .into_owned();
            !params.take(key, value)
        })
        .collect();
    if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    }
}

/// The `key=value` form without its TLS parameters (taken into `params`). Values are read as
/// libpq reads them: unquoted up to white space, or in single quotes; `\` escapes a character.
fn strip_key_values(conn: &str, params: &mut TlsParams) -> Result<String> {
    let mut kept = Vec::new();
    let mut rest = conn.trim_start();
    while !rest.is_empty() {
        let start = rest;
        let eq = rest
            .find('=')
            .context("the connection string: a parameter without `=`")?;
        let key = rest[..eq].trim();
        rest = rest[eq + 1..].trim_start();
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let quoted = rest.starts_with('\'');
        if quoted {
            chars.next();
        }
        let mut end = rest.len();
        let mut closed = !quoted;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, next)) = chars.next() {
                        value.push(next);
                    }
                }
                '\'' if quoted => {
                    end = i + 1;
                    closed = true;
                    break;
                }
                c if !quoted && c.is_whitespace() => {
                    end = i;
                    break;
                }
                c => value.push(c),
            }
        }
        if !closed {
            bail!("the connection string: an unterminated quoted value");
        }
        let param = &start[..start.len() - rest.len() + end];
        rest = rest[end..].trim_start();
        if !params.take(key, value) {
            kept.push(param);
        }
    }
    Ok(kept.join(" "))
}

/// Opens a session and drives it on the runtime; the task ends with the session. Messages the
/// server sends on its own (notifications, notices) go to `messages` when given.
pub async fn open(
    target: &Target,
    messages: Option<tokio::sync::mpsc::UnboundedSender<AsyncMessage>>,
) -> Result<(Client, JoinHandle<Result<(), tokio_postgres::Error>>), tokio_postgres::Error> {
    let Some(rustls) = &target.rustls else {
        let (client, connection) = target.config.connect(tokio_postgres::NoTls).await?;
        return Ok((client, tokio::spawn(drive(connection, messages))));
    };
    let tls = tokio_postgres_rustls::MakeRustlsConnect::new(rustls.clone());
    let (client, connection) = target.config.connect(tls).await?;
    Ok((client, tokio::spawn(drive(connection, messages))))
}

async fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    messages: Option<tokio::sync::mpsc::UnboundedSender<AsyncMessage>>,
) -> Result<(), tokio_postgres::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(message)) => {
                if let Some(to) = &messages {
                    let _ = to.send(message);
                }
            }
            Some(Err(e)) => return Err(e),
            None => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_taken_out_of_both_forms() {
        let mut p = TlsParams::default();
        let rest = strip_url(
            "postgres://u:p@db.example.com:6543/app?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca%20x.pem",
            &mut p,
        );
        assert_eq!(
            rest,
            "postgres://u:p@db.example.com:6543/app?application_name=x"
        );
        assert_eq!(p.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(p.sslrootcert.as_deref(), Some("/etc/ca x.pem"));

        let mut p = TlsParams::default();
        let rest = strip_key_values(
            "host=db port = 5432 sslrootcert='/a b/c\\'s.pem' user=u sslmode=require password='x y'",
            &mut p,
        )
        .unwrap();
        assert_eq!(rest, "host=db port = 5432 user=u password='x y'");
        assert_eq!(p.sslrootcert.as_deref(), Some("/a b/c's.pem"));
        assert_eq!(p.sslmode.as_deref(), Some("require"));
        assert!(strip_key_values("host='db", &mut p).is_err());
    }

    #[test]
    fn modes_follow_libpq() {
        let mode = |s: &str| parse(s).map(|t| t.tls.mode);
        assert_eq!(mode("host=h user=u").unwrap(), SslMode::Prefer);
        assert_eq!(
            mode("host=h user=u sslmode=disable").unwrap(),
            SslMode::Disable
        );
        assert_eq!(
            mode("postgres://u@h/d?sslmode=require").unwrap(),
            SslMode::Require
        );
        assert_eq!(mode("host=h sslmode=verify-ca").unwrap(), SslMode::VerifyCa);
        assert_eq!(
            mode("host=h sslrootcert=system").unwrap(),
            SslMode::VerifyFull
        );
        let err = mode("host=h sslmode=require sslrootcert=system").unwrap_err();
        assert!(err.to_string().contains("verify-full"), "{err}");
        let err = mode("host=h sslmode=verify").unwrap_err();
        assert!(err.to_string().contains("verify-ca"), "{err}");
        let err = mode("host=h sslcert=/c.pem").unwrap_err();
        assert!(err.to_string().contains("both"), "{err}");
        let err = mode("host=h sslmode=verify-full sslrootcert=/nonexistent/ca.pem").unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
        // A connection string tokio-postgres refuses says so.
        assert!(parse("host=h nonsense=1").is_err());
    }
}
