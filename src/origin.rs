//! [`Origin`]: the `scheme://host:port` key that breakers, tokens and evidence are filed under.
//!
//! Two URLs share an origin when their scheme, host and port are equal after normalisation:
//! the scheme and host are lower-cased, the default port of the scheme is made explicit
//! (`https://Example.COM/a` and `https://example.com:443/b` are one origin), and an IPv6
//! host is kept in brackets. This is the origin of RFC 6454 §4, which is also the key that
//! Envoy's outlier detection and the HTTP/2 connection pools use.

use std::fmt;
use std::sync::Arc;

/// The `scheme://host:port` an HTTP request is sent to.
///
/// Cheap to clone (one reference-counted string). Ordered and hashed by its normalised
/// text, so it can key maps.
///
/// ```
/// use reqwest_resilience::Origin;
///
/// let a = Origin::parse("https://API.Example.com/v1/users?id=7")?;
/// let b = Origin::parse("https://api.example.com:443")?;
/// assert_eq!(a, b);
/// assert_eq!(a.to_string(), "https://api.example.com:443");
/// assert_eq!(Origin::parse("http://[::1]:8080/")?.host(), "[::1]");
/// # Ok::<(), reqwest_resilience::origin::OriginError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Origin {
    // "scheme://host:port"; scheme_len and host_end index into it.
    text: Arc<str>,
    scheme_len: u16,
    host_end: u16,
    port: u16,
}

/// Why a URL has no [`Origin`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OriginError {
    /// The text is not a URL.
    InvalidUrl(String),
    /// The URL has no host (`file:///x`, `data:…`).
    NoHost,
    /// The scheme has no default port and the URL names none.
    NoPort,
    /// The origin is longer than this crate keeps (more than 64 KiB).
    TooLong,
}

impl fmt::Display for OriginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OriginError::InvalidUrl(e) => write!(f, "not a valid URL: {e}"),
            OriginError::NoHost => f.write_str("the URL has no host"),
            OriginError::NoPort => f.write_str("the URL has no port and its scheme has no default"),
            OriginError::TooLong => f.write_str("the origin is longer than 64 KiB"),
        }
    }
}

impl std::error::Error for OriginError {}

impl Origin {
    /// The origin of a parsed URL.
    pub fn from_url(url: &reqwest::Url) -> Result<Origin, OriginError> {
        let scheme = url.scheme().to_ascii_lowercase();
        let host = match url.host() {
            None => return Err(OriginError::NoHost),
            Some(url::Host::Domain(d)) => d.to_ascii_lowercase(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => format!("[{ip}]"),
        };
        if host.is_empty() {
            return Err(OriginError::NoHost);
        }
        let port = url.port_or_known_default().ok_or(OriginError::NoPort)?;
        let text = format!("{scheme}://{host}:{port}");
        if text.len() > u16::MAX as usize {
            return Err(OriginError::TooLong);
        }
        Ok(Origin {
            scheme_len: scheme.len() as u16,
            host_end: (scheme.len() + 3 + host.len()) as u16,
            port,
            text: text.into(),
        })
    }

    /// Parses a URL (or a bare `scheme://host[:port]`) and returns its origin.
    pub fn parse(url: &str) -> Result<Origin, OriginError> {
        let url = reqwest::Url::parse(url).map_err(|e| OriginError::InvalidUrl(e.to_string()))?;
        Origin::from_url(&url)
    }

    /// The lower-cased scheme, e.g. `https`.
    pub fn scheme(&self) -> &str {
        &self.text[..self.scheme_len as usize]
    }

    /// The lower-cased host; an IPv6 address keeps its brackets (`[::1]`).
    pub fn host(&self) -> &str {
        &self.text[self.scheme_len as usize + 3..self.host_end as usize]
    }

    /// The port, with the scheme's default made explicit.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The normalised `scheme://host:port` text.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Origin({})", self.text)
    }
}

impl std::str::FromStr for Origin {
    type Err = OriginError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Origin::parse(s)
    }
}

impl TryFrom<&reqwest::Url> for Origin {
    type Error = OriginError;
    fn try_from(url: &reqwest::Url) -> Result<Self, Self::Error> {
        Origin::from_url(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_ports_are_made_explicit() {
        assert_eq!(
            Origin::parse("http://a.example").unwrap().as_str(),
            "http://a.example:80"
        );
        assert_eq!(
            Origin::parse("https://a.example").unwrap().as_str(),
            "https://a.example:443"
        );
        assert_eq!(
            Origin::parse("https://a.example:8443/x").unwrap().port(),
            8443
        );
    }

    #[test]
    fn host_and_scheme_are_lower_cased() {
        let o = Origin::parse("HTTPS://WWW.Example.COM/Path").unwrap();
        assert_eq!(o.scheme(), "https");
        assert_eq!(o.host(), "www.example.com");
        assert_eq!(o.to_string(), "https://www.example.com:443");
    }

    #[test]
    fn ipv6_hosts_keep_brackets() {
        let o = Origin::parse("http://[::1]:3000/").unwrap();
        assert_eq!(o.host(), "[::1]");
        assert_eq!(o.to_string(), "http://[::1]:3000");
        let o = Origin::parse("https://[2001:DB8::1]/").unwrap();
        assert_eq!(o.to_string(), "https://[2001:db8::1]:443");
    }

    #[test]
    fn urls_without_a_host_or_port_are_typed_errors() {
        assert_eq!(Origin::parse("file:///etc/hosts"), Err(OriginError::NoHost));
        assert_eq!(Origin::parse("foo://host/"), Err(OriginError::NoPort));
        assert!(matches!(
            Origin::parse("not a url"),
            Err(OriginError::InvalidUrl(_))
        ));
    }
}
