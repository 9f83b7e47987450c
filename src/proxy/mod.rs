//! A pool of forward proxies ([`ProxyPool`], set with
//! [`Resilience::proxies`](crate::Resilience::proxies)): each attempt goes through one
//! proxy of the pool, a retry through the next one when the last proxy failed or refused
//! (a refused connection, a `407`, a status you name), or every attempt through the next
//! one ([`ProxyPool::rotate_always`]). Each proxy is an origin of its own for the breaker
//! and the evidence: a proxy refusing is not the target refusing. The whole story, with
//! which failure is charged to whom and why: [`guide::proxies`](crate::guide::proxies).
//!
//! A `reqwest::Client`'s proxy is fixed when it is built, so the pool holds one client per
//! proxy, each built from your settings: hand
//! [`build_from`](crate::Resilience::build_from) a closure returning your
//! `reqwest::ClientBuilder` (called once per proxy, and once for the client that builds
//! the requests).
//!
//! ```
//! use reqwest_resilience::Resilience;
//! use reqwest_resilience::proxy::ProxyPool;
//!
//! # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
//! let pool = ProxyPool::new(["http://10.0.0.1:3128", "http://user:secret@10.0.0.2:3128"])
//!     .rotate_on([403, 429]);
//! let client = Resilience::new()
//!     .proxies(pool)
//!     .build_from(|| reqwest::Client::builder().user_agent("mine/1.0"))?;
//! # drop(client); Ok(()) }
//! ```
//!
//! # The files, by idea
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | [`ProxyPool`]: the proxies and when to rotate, checked and built into clients |
//! | `route.rs` | the built pool: which proxy an attempt takes, the attempt on its client, what it is charged to |

use std::fmt;

use http::StatusCode;

use crate::error::{ResilienceError, StackError};
use crate::origin::Origin;

mod route;

pub(crate) use route::{Innermost, Routes};

/// Most retries a pool raises the retry limit to (as httpc does): a pool of 20 proxies
/// does not make a request try 20 times.
pub(crate) const MAX_ROTATION_RETRIES: u32 = 10;

/// The proxies a [`Resilience`](crate::Resilience) stack sends its attempts through, and
/// when a retry takes the next one. Built into one `reqwest::Client` per proxy by
/// [`build_from`](crate::Resilience::build_from).
///
/// By default a retry takes the next proxy after the proxy's own failure only (a refused
/// or failed connection to it, a tunnel it broke off without an answer, a `407`; a
/// `CONNECT` it answered with an error status is the target's failure); [`rotate_on`](Self::rotate_on)
/// adds the target's statuses that mean "not from this proxy" (403, 429…), and
/// [`rotate_always`](Self::rotate_always) sends every attempt through the next proxy.
/// A proxy whose breaker is open is passed over, and one isolated by hand
/// ([`BreakerRegistry::isolate`](crate::BreakerRegistry::isolate) with the proxy's origin).
///
/// Its `Debug` shows each proxy's origin only: credentials in a proxy URL never appear
/// in `Debug` output, logs or errors.
#[derive(Clone)]
pub struct ProxyPool {
    urls: Vec<String>,
    rotate_on: Vec<u16>,
    always: bool,
}

impl fmt::Debug for ProxyPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let origins: Vec<String> = self
            .urls
            .iter()
            .map(
                |u| match reqwest::Url::parse(u).ok().map(|u| Origin::from_url(&u)) {
                    Some(Ok(origin)) => origin.to_string(),
                    _ => "<invalid>".to_owned(),
                },
            )
            .collect();
        f.debug_struct("ProxyPool")
            .field("proxies", &origins)
            .field("rotate_on", &self.rotate_on)
            .field("always", &self.always)
            .finish()
    }
}

impl ProxyPool {
    /// A pool of these proxy URLs (`http://`, `https://`, `socks5://` or `socks5h://`,
    /// credentials as `user:password@`), tried in this order. Checked when the stack is
    /// built: no proxy, or one that is not a valid proxy URL, is a
    /// [`StackError`] then, never a panic.
    pub fn new<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ProxyPool {
            urls: urls.into_iter().map(Into::into).collect(),
            rotate_on: Vec::new(),
            always: false,
        }
    }

    /// The response statuses after which a retry takes the next proxy (none by default;
    /// a `407` always does). Such a response is charged to the proxy, not the target:
    /// the target refuses that proxy's address, and it stays open through the others. A
    /// request is retried after one when it is idempotent (a `429` always), as a `503`
    /// would be. A status outside 100–599 fails the build.
    pub fn rotate_on(mut self, statuses: impl IntoIterator<Item = u16>) -> Self {
        self.rotate_on = statuses.into_iter().collect();
        self
    }

    /// Every attempt (of every request) goes through the next proxy, whatever the
    /// previous one answered.
    pub fn rotate_always(mut self) -> Self {
        self.always = true;
        self
    }

    /// How many proxies.
    pub fn len(&self) -> usize {
        self.urls.len()
    }

    /// Whether the pool has no proxy (which fails the build).
    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    /// The retries a request needs to try every proxy once: one fewer than the proxies,
    /// at most 10 (as httpc: a pool of 20 proxies does not make a request try 20 times).
    /// The stack raises a retry limit below this.
    pub fn retries_to_try_all(&self) -> u32 {
        retries_to_try(self.urls.len())
    }

    /// Checks the pool: each proxy as a `reqwest::Proxy` and its origin, the statuses.
    pub(crate) fn check(&self) -> Result<Vec<(reqwest::Proxy, Origin)>, ResilienceError> {
        if self.urls.is_empty() {
            return Err(ResilienceError::InvalidStack(StackError::NoProxies));
        }
        if let Some(&status) = self
            .rotate_on
            .iter()
            .find(|s| !(100..=599).contains(*s) || StatusCode::from_u16(**s).is_err())
        {
            return Err(ResilienceError::InvalidStack(
                StackError::InvalidRotateStatus { status },
            ));
        }
        self.urls
            .iter()
            .enumerate()
            .map(|(index, url)| {
                proxy_of(url).ok_or(ResilienceError::InvalidStack(StackError::InvalidProxy {
                    index,
                }))
            })
            .collect()
    }

    /// The pool built over `clients`, one per proxy in order.
    pub(crate) fn into_routes(
        self,
        clients: Vec<(reqwest::Client, Origin)>,
    ) -> crate::proxy::Routes {
        let rotate_on = self
            .rotate_on
            .iter()
            .filter_map(|s| StatusCode::from_u16(*s).ok())
            .collect();
        Routes::new(clients, rotate_on, self.always)
    }
}

/// The retries a request needs to try each of `proxies` once: one fewer, at most
/// [`MAX_ROTATION_RETRIES`].
pub(crate) fn retries_to_try(proxies: usize) -> u32 {
    u32::try_from(proxies.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(MAX_ROTATION_RETRIES)
}

/// The proxy of `url` and its origin, when it is a proxy URL reqwest can use. No error
/// text: a parse error could quote the URL, and with it a password.
fn proxy_of(url: &str) -> Option<(reqwest::Proxy, Origin)> {
    let parsed = reqwest::Url::parse(url).ok()?;
    if !matches!(parsed.scheme(), "http" | "https" | "socks5" | "socks5h") {
        return None;
    }
    let origin = Origin::from_url(&parsed).ok()?;
    let proxy = reqwest::Proxy::all(parsed).ok()?;
    Some((proxy, origin))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_origins_without_credentials() {
        let pool = ProxyPool::new(["http://user:hunter2@127.0.0.1:3128", "nonsense"]);
        let shown = format!("{pool:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("user"), "{shown}");
        assert!(shown.contains("http://127.0.0.1:3128"), "{shown}");
        assert!(shown.contains("<invalid>"), "{shown}");
    }

    #[test]
    fn bad_pools_are_typed_errors() {
        let err = |pool: ProxyPool| match pool.check() {
            Err(ResilienceError::InvalidStack(e)) => e,
            other => panic!("{:?}", other.map(|v| v.len())),
        };
        assert_eq!(
            err(ProxyPool::new(Vec::<String>::new())),
            StackError::NoProxies
        );
        assert_eq!(
            err(ProxyPool::new(["http://127.0.0.1:1", "ftp://x:y@h:21"])),
            StackError::InvalidProxy { index: 1 }
        );
        assert_eq!(
            err(ProxyPool::new(["http://:pw@"])),
            StackError::InvalidProxy { index: 0 }
        );
        assert_eq!(
            err(ProxyPool::new(["http://127.0.0.1:1"]).rotate_on([403, 1000])),
            StackError::InvalidRotateStatus { status: 1000 }
        );
        assert_eq!(
            ProxyPool::new(["http://a:1"]).check().map(|v| v.len()).ok(),
            Some(1)
        );
    }

    #[test]
    fn retries_to_try_all_is_capped() {
        let pool = |n: usize| ProxyPool::new((0..n).map(|i| format!("http://p{i}:3128")));
        assert_eq!(pool(1).retries_to_try_all(), 0);
        assert_eq!(pool(3).retries_to_try_all(), 2);
        assert_eq!(pool(11).retries_to_try_all(), 10);
        assert_eq!(pool(40).retries_to_try_all(), 10);
    }
}
