//! Bearer tokens: a [`TokenSource`] fetches an [`AccessToken`], a [`TokenManager`] caches
//! it and refreshes it with one fetch at a time, and the [`BearerAuth`] middleware attaches
//! it to the requests for the origins it is configured for, healing a `401` with one
//! refresh and one replay.

mod manager;
mod middleware;
#[cfg(feature = "oauth2")]
mod oauth2;
mod token;

pub use manager::{TokenManager, TokenManagerBuilder};
pub use middleware::{BearerAuth, BearerAuthBuilder, Challenge, ChallengeAction};
#[cfg(feature = "oauth2")]
pub use oauth2::{ClientAuth, OAuth2Error, OAuth2ErrorCode, OAuth2Source, OAuth2SourceBuilder};
pub use token::{AccessToken, SharedSourceError, TokenError, TokenErrorKind, TokenSource};
