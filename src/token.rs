//! [`AccessToken`] and the [`TokenSource`] trait that fetches one (public in
//! [`crate::auth`]): below the stages, so that a stage can hand a token inward.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::HeaderValue;
use tokio::time::Instant;

/// A bearer token and the moment it stops being valid.
///
/// Cheap to clone (one reference count). Its `Debug` never shows the secret, and the
/// `Authorization` header built from it is marked sensitive, so `http`'s `Debug` of the
/// header map prints `Sensitive` instead of the value.
///
/// # Why `expires_at` is a [`tokio::time::Instant`]
///
/// Expiry is decided against a monotonic clock: a wall clock that is stepped (NTP, a
/// suspended laptop) must not make a valid token look expired or an expired one look
/// valid. OAuth 2.0 servers say `expires_in` (seconds from now), which maps to an
/// `Instant` taken when the response is received ([`AccessToken::expires_in`]). Tokio's
/// `Instant` also follows a paused test clock. A source that only knows a wall-clock
/// expiry (a JWT `exp` claim) converts it with [`AccessToken::expires_at_system_time`].
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::AccessToken;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let token = AccessToken::new("s3cr3t").expires_in(Duration::from_secs(3600));
/// assert_eq!(token.secret(), "s3cr3t");
/// assert!(!format!("{token:?}").contains("s3cr3t"));
/// # }
/// ```
#[derive(Clone)]
pub struct AccessToken {
    inner: Arc<TokenInner>,
}

struct TokenInner {
    secret: Box<str>,
    // Built once per token so the warm path of `BearerAuth` only clones it; `None` when
    // the secret holds bytes a header cannot carry.
    header: Option<HeaderValue>,
    expires_at: Option<Instant>,
    received_at: Instant,
}

impl AccessToken {
    /// A token that never expires (until a `401` says otherwise).
    pub fn new(secret: impl Into<String>) -> AccessToken {
        let secret: Box<str> = secret.into().into_boxed_str();
        let header = HeaderValue::try_from(format!("Bearer {secret}"))
            .ok()
            .map(|mut v| {
                v.set_sensitive(true);
                v
            });
        AccessToken {
            inner: Arc::new(TokenInner {
                secret,
                header,
                expires_at: None,
                received_at: Instant::now(),
            }),
        }
    }

    /// The same token, valid for `lifetime` from now (OAuth 2.0's `expires_in`).
    ///
    /// A lifetime too large to represent is treated as "never expires".
    pub fn expires_in(self, lifetime: Duration) -> AccessToken {
        let at = Instant::now().checked_add(lifetime);
        self.with_expiry(at)
    }

    /// The same token, valid until `at`.
    pub fn expires_at(self, at: Instant) -> AccessToken {
        self.with_expiry(Some(at))
    }

    /// The same token, valid until the wall-clock time `at` (a JWT `exp`), converted to
    /// the monotonic clock now. A time in the past gives an already expired token.
    pub fn expires_at_system_time(self, at: SystemTime) -> AccessToken {
        match at.duration_since(SystemTime::now()) {
            Ok(left) => self.expires_in(left),
            Err(_) => {
                let now = Instant::now();
                self.with_expiry(Some(now))
            }
        }
    }

    fn with_expiry(self, expires_at: Option<Instant>) -> AccessToken {
        let inner = match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                inner.expires_at = expires_at;
                inner
            }
            Err(shared) => TokenInner {
                secret: shared.secret.clone(),
                header: shared.header.clone(),
                expires_at,
                received_at: shared.received_at,
            },
        };
        AccessToken {
            inner: Arc::new(inner),
        }
    }

    /// The secret itself. Handle with care: never log it.
    pub fn secret(&self) -> &str {
        &self.inner.secret
    }

    /// When the token stops being valid; `None` if it does not say.
    pub fn expiry(&self) -> Option<Instant> {
        self.inner.expires_at
    }

    /// When this token was created (its lifetime is `expiry - received_at`).
    pub fn received_at(&self) -> Instant {
        self.inner.received_at
    }

    /// Whether the token is still valid at `now`.
    pub fn is_valid_at(&self, now: Instant) -> bool {
        self.inner.expires_at.is_none_or(|at| now < at)
    }

    /// The `Authorization: Bearer …` value, marked sensitive; `None` if the secret holds
    /// characters a header cannot carry (control characters, non-visible bytes).
    pub fn authorization_header(&self) -> Option<&HeaderValue> {
        self.inner.header.as_ref()
    }

    /// Whether `self` and `other` are the same fetched token (not merely equal text):
    /// what [`TokenManager::invalidate_if_current`](crate::TokenManager::invalidate_if_current)
    /// compares.
    pub fn same_token(&self, other: &AccessToken) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let left = self
            .inner
            .expires_at
            .map(|at| at.saturating_duration_since(Instant::now()));
        f.debug_struct("AccessToken")
            .field("secret", &"<redacted>")
            .field("expires_in", &left)
            .finish()
    }
}

/// Something that fetches a fresh [`AccessToken`]: an identity provider, a metadata
/// endpoint, a file, a closure.
///
/// A [`TokenManager`](crate::TokenManager) calls `fetch` at most once at a time and shares
/// the result among every caller, so an implementation needs no caching or locking of
/// its own.
///
/// Closures returning a future work as sources, with any error that converts into
/// `Box<dyn Error + Send + Sync>`: `anyhow::Error`, a boxed error, any `std::error::Error`.
///
/// ```
/// use reqwest_resilience::{AccessToken, TokenManager};
/// use std::time::Duration;
///
/// let manager = TokenManager::new(|| async {
///     // Ask the identity provider here; `?` works on any error.
///     let secret = std::env::var("API_TOKEN")?;
///     anyhow::Ok(AccessToken::new(secret).expires_in(Duration::from_secs(3600)))
/// });
/// # drop(manager);
///
/// async fn fetch_token() -> Result<AccessToken, Box<dyn std::error::Error + Send + Sync>> {
///     Ok(AccessToken::new("s3cr3t"))
/// }
/// let manager = TokenManager::new(fetch_token);
/// # drop(manager);
/// ```
///
/// Or implement it for a type, with the [`async_trait`](crate::async_trait) attribute this
/// crate re-exports (no `async-trait` dependency of your own needed):
///
/// ```
/// use reqwest_resilience::{AccessToken, TokenSource};
///
/// struct FromEnv;
///
/// #[reqwest_resilience::async_trait]
/// impl TokenSource for FromEnv {
///     type Error = std::env::VarError;
///     async fn fetch(&self) -> Result<AccessToken, Self::Error> {
///         Ok(AccessToken::new(std::env::var("API_TOKEN")?))
///     }
/// }
/// ```
#[async_trait::async_trait]
pub trait TokenSource: Send + Sync + 'static {
    /// Why a fetch failed: any error convertible into `Box<dyn Error + Send + Sync>` (a
    /// `std::error::Error`, `anyhow::Error`, a boxed error). Its `Display` must not contain
    /// a secret: it reaches callers and logs through
    /// [`TokenError`](crate::auth::TokenError)'s `source()`.
    type Error: Into<Box<dyn StdError + Send + Sync>> + Send + 'static;

    /// Fetches a fresh token.
    ///
    /// # Cancel safety
    ///
    /// A [`TokenManager`](crate::TokenManager) drops this future when the fetch times out.
    async fn fetch(&self) -> Result<AccessToken, Self::Error>;
}

#[async_trait::async_trait]
impl<F, Fut, E> TokenSource for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<AccessToken, E>> + Send,
    E: Into<Box<dyn StdError + Send + Sync>> + Send + 'static,
{
    type Error = E;

    async fn fetch(&self) -> Result<AccessToken, E> {
        (self)().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_the_secret_and_header_is_sensitive() {
        let t = AccessToken::new("abc.def.ghi");
        let dbg = format!("{t:?}");
        assert!(!dbg.contains("abc.def.ghi"), "{dbg}");
        assert!(dbg.contains("<redacted>"));
        let header = t.authorization_header().unwrap();
        assert!(header.is_sensitive());
        assert_eq!(header.to_str().unwrap(), "Bearer abc.def.ghi");
        assert!(!format!("{header:?}").contains("abc.def.ghi"));
    }

    #[test]
    fn a_secret_with_a_newline_has_no_header() {
        assert!(AccessToken::new("a\nb").authorization_header().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn expiry_follows_the_tokio_clock() {
        let t = AccessToken::new("x").expires_in(Duration::from_secs(10));
        assert!(t.is_valid_at(Instant::now()));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(!t.is_valid_at(Instant::now()));
        assert!(AccessToken::new("y").is_valid_at(Instant::now() + Duration::from_secs(1 << 40)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_past_system_time_gives_an_expired_token() {
        let t = AccessToken::new("x").expires_at_system_time(SystemTime::UNIX_EPOCH);
        assert!(!t.is_valid_at(Instant::now()));
    }

    #[test]
    fn same_token_compares_identity_not_text() {
        let a = AccessToken::new("same");
        let b = AccessToken::new("same");
        assert!(a.same_token(&a.clone()));
        assert!(!a.same_token(&b));
    }
}
