//! Certificates for TLS to PostgreSQL in tests: a certificate authority made on the spot, and
//! the server and client certificates it issues (rcgen).

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// A certificate authority: its certificate (PEM), and what it needs to sign.
pub struct Authority {
    /// The authority's certificate, PEM.
    pub pem: String,
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Authority {
    /// A new self-signed authority with common name `name`.
    pub fn new(name: &str) -> Authority {
        let key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("a self-signed certificate");
        Authority {
            pem: cert.pem(),
            cert,
            key,
        }
    }

    /// A certificate this authority signs for `names` (subject alternative names: DNS names
    /// or IP addresses) with common name `cn`: (certificate PEM, key PEM).
    pub fn issue(&self, cn: &str, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().expect("a key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("parameters");
        params.distinguished_name.push(DnType::CommonName, cn);
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("a signed certificate");
        (cert.pem(), key.serialize_pem())
    }
}

/// A fresh directory for one test's certificate files (under the system's temporary one).
pub fn scratch_dir(label: &str) -> std::path::PathBuf {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "synchro-{label}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}
