//! [`TokenError`]: why `BearerAuth` could get no bearer token.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

/// A boxed error from a [`TokenSource`](crate::auth::TokenSource), shared by every caller
/// that waited for it ([`TokenError`]'s `source()`).
pub(crate) type SharedSourceError = Arc<dyn StdError + Send + Sync + 'static>;

/// Why no token could be had. Cheap to clone: every caller that waited for one failed
/// fetch gets the same error.
///
/// Its `Display` and `Debug` never contain a secret; the source's own error is kept
/// through [`std::error::Error::source`] (and not repeated in `Display`).
#[derive(Clone)]
pub struct TokenError {
    inner: Arc<TokenErrorInner>,
}

struct TokenErrorInner {
    kind: TokenErrorKind,
    source: Option<SharedSourceError>,
    retry_at: Option<Instant>,
}

/// What kind of failure a [`TokenError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenErrorKind {
    /// The [`TokenSource`](crate::auth::TokenSource) returned an error (see `source()`).
    Fetch,
    /// The fetch did not finish within the manager's fetch timeout.
    Timeout,
    /// The fetch ended without a result: its task panicked or the runtime shut down.
    Aborted,
    /// The token holds characters an `Authorization` header cannot carry.
    InvalidSecret,
}

impl TokenError {
    pub(crate) fn new(
        kind: TokenErrorKind,
        source: Option<SharedSourceError>,
        retry_at: Option<Instant>,
    ) -> TokenError {
        TokenError {
            inner: Arc::new(TokenErrorInner {
                kind,
                source,
                retry_at,
            }),
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> TokenErrorKind {
        self.inner.kind
    }

    /// When the manager will fetch again; until then callers that need a token get this
    /// error at once, so an identity-provider outage is not hammered.
    pub fn retry_at(&self) -> Option<Instant> {
        self.inner.retry_at
    }

    /// Whether `self` and `other` report the same failed fetch.
    pub fn same_failure(&self, other: &TokenError) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.inner.kind {
            TokenErrorKind::Fetch => f.write_str("the token source failed")?,
            TokenErrorKind::Timeout => f.write_str("the token fetch timed out")?,
            TokenErrorKind::Aborted => f.write_str("the token fetch ended without a result")?,
            TokenErrorKind::InvalidSecret => {
                f.write_str("the token cannot be carried in an Authorization header")?
            }
        }
        // The source's message is reached through `source()`, not repeated here, so
        // error reporters that walk the chain print it once.
        Ok(())
    }
}

impl fmt::Debug for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("TokenError");
        d.field("kind", &self.inner.kind);
        if let Some(source) = &self.inner.source {
            d.field("source", source);
        }
        if let Some(at) = self.inner.retry_at {
            d.field("retry_in", &at.saturating_duration_since(Instant::now()));
        }
        d.finish()
    }
}

impl StdError for TokenError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner
            .source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}
