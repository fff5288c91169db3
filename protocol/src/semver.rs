//! SemVer 2.0.0 parsing and precedence exactly as spec 001 lists: no leading `v`, no
//! leading zeros, ASCII identifiers, numeric identifiers compared by value without any
//! fixed-width limit, build metadata ignored. Malformed versions fail closed.

use core::cmp::Ordering;

use crate::error::{Error, Result};

/// A parsed SemVer 2.0.0 version. Numbers are kept as digit strings, so any size compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    core: [String; 3],
    pre: Vec<String>,
    build: Vec<String>,
}

fn bad(reason: &'static str) -> Error {
    Error::InvalidSemver { reason }
}

fn is_numeric(id: &str) -> bool {
    id.bytes().all(|b| b.is_ascii_digit())
}

fn check_identifiers(part: &str, numeric_no_leading_zero: bool) -> Result<Vec<String>> {
    part.split('.')
        .map(|id| {
            if id.is_empty() {
                return Err(bad("empty identifier"));
            }
            if !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(bad("identifier has a character other than [0-9A-Za-z-]"));
            }
            if numeric_no_leading_zero && is_numeric(id) && id.len() > 1 && id.starts_with('0') {
                return Err(bad("numeric prerelease identifier has a leading zero"));
            }
            Ok(id.to_owned())
        })
        .collect()
}

impl Version {
    /// Parses `MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]`.
    pub fn parse(text: &str) -> Result<Version> {
        let (rest, build) = match text.split_once('+') {
            Some((r, b)) => (r, check_identifiers(b, false)?),
            None => (text, Vec::new()),
        };
        let (core, pre) = match rest.split_once('-') {
            Some((c, p)) => (c, check_identifiers(p, true)?),
            None => (rest, Vec::new()),
        };
        let parts: Vec<&str> = core.split('.').collect();
        if parts.len() != 3 {
            return Err(bad("core must be MAJOR.MINOR.PATCH"));
        }
        for p in &parts {
            if p.is_empty() || !is_numeric(p) {
                return Err(bad("core components must be decimal digits"));
            }
            if p.len() > 1 && p.starts_with('0') {
                return Err(bad("core component has a leading zero"));
            }
        }
        Ok(Version {
            core: [parts[0].into(), parts[1].into(), parts[2].into()],
            pre,
            build,
        })
    }

    /// Build metadata identifiers (ignored for precedence).
    pub fn build(&self) -> &[String] {
        &self.build
    }

    /// SemVer 2.0.0 precedence.
    pub fn precedence(&self, other: &Version) -> Ordering {
        for (a, b) in self.core.iter().zip(&other.core) {
            match cmp_numeric(a, b) {
                Ordering::Equal => {}
                o => return o,
            }
        }
        match (self.pre.is_empty(), other.pre.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Greater,
            (false, true) => return Ordering::Less,
            (false, false) => {}
        }
        for (a, b) in self.pre.iter().zip(&other.pre) {
            let o = match (is_numeric(a), is_numeric(b)) {
                (true, true) => cmp_numeric(a, b),
                (true, false) => Ordering::Less,
                (false, true) => Ordering::Greater,
                (false, false) => a.as_bytes().cmp(b.as_bytes()),
            };
            if o != Ordering::Equal {
                return o;
            }
        }
        self.pre.len().cmp(&other.pre.len())
    }
}

/// Compares two digit strings without leading zeros by numeric value.
fn cmp_numeric(a: &str, b: &str) -> Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// Parses both versions and compares their precedence.
pub fn compare(a: &str, b: &str) -> Result<Ordering> {
    Ok(Version::parse(a)?.precedence(&Version::parse(b)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semver_spec_order() {
        // The chain from semver.org §11, strictly increasing.
        let chain = [
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
            "2.0.0",
            "2.1.0",
            "2.1.1",
            "18446744073709551616.0.0",
            "99999999999999999999999.0.0",
        ];
        for w in chain.windows(2) {
            assert_eq!(
                compare(w[0], w[1]).unwrap(),
                Ordering::Less,
                "{} < {}",
                w[0],
                w[1]
            );
            assert_eq!(compare(w[1], w[0]).unwrap(), Ordering::Greater);
        }
        assert_eq!(compare("1.2.3+one", "1.2.3+two").unwrap(), Ordering::Equal);
        assert_eq!(compare("1.2.3-beta", "1.2.3").unwrap(), Ordering::Less);
        assert_eq!(compare("1.0.0-0A", "1.0.0-0a").unwrap(), Ordering::Less);
        assert_eq!(
            compare("1.0.0-alpha-1", "1.0.0-alpha").unwrap(),
            Ordering::Greater
        );
    }

    #[test]
    fn malformed_fails_closed() {
        for bad in [
            "v1.0.0",
            "1.0",
            "1",
            "1.0.0.0",
            "01.0.0",
            "1.00.0",
            "1.0.0-01",
            "1.0.0-",
            "1.0.0+",
            "1.0.0-a..b",
            "1.0.0+a..b",
            " 1.0.0",
            "1.0.0 ",
            "+1.0.0",
            "-1.0.0",
            "1.0.0-é",
            "1.0.0+b_1",
            "",
            "1..0",
            "a.b.c",
            "1.0.0-alpha+",
            "1.0.0++b",
        ] {
            assert_eq!(
                Version::parse(bad).unwrap_err().code(),
                "invalid_semver",
                "{bad:?}"
            );
        }
        // Build metadata may have leading zeros.
        assert!(Version::parse("1.0.0+001").is_ok());
        assert!(Version::parse("1.0.0-x-y-z.--").is_ok());
    }
}
