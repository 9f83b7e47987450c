//! Bearer tokens: a [`TokenSource`] fetches an [`AccessToken`], a [`TokenManager`] caches
//! it and refreshes it with one fetch at a time, and the [`BearerAuth`] middleware attaches
//! it to the requests for the origins it is configured for, healing a `401` with one
//! refresh and one replay.
//!
//! What the best credential caches promise (Azure's bearer-token policy, the AWS SDKs'
//! identity cache, Google's auth libraries), as one middleware:
//!
//! - one fetch in flight whatever the load: 10 000 concurrent callers with an empty cache
//!   cause one fetch, and all of them get its token (or its error);
//! - no caller waits while a usable token exists: the refresh ahead of expiry runs in the
//!   background;
//! - an identity-provider outage is not hammered: after a failure callers get that error
//!   at once for a backoff, and a failed refresh ahead keeps the valid token;
//! - a token never goes where it does not belong: only to the configured origins, only
//!   over https unless told otherwise, never printed.
//!
//! ```
//! use std::time::Duration;
//! use reqwest_middleware::ClientBuilder;
//! use reqwest_resilience::{AccessToken, BearerAuth, Origin, TokenManager, TransportEvidence};
//! use reqwest_resilience::redirect::{self, ClientRedirects};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let tokens = TokenManager::builder(|| async {
//!     // Ask the identity provider; `expires_in` is what OAuth 2.0 servers send.
//!     Ok::<_, std::io::Error>(AccessToken::new("s3cr3t").expires_in(Duration::from_secs(3600)))
//! })
//! .fetch_timeout(Duration::from_secs(10))
//! .build();
//!
//! let recorded = redirect::recorded(reqwest::redirect::Policy::default()); // every hop seen
//! let client = ClientBuilder::new(reqwest::Client::builder().redirect(recorded).build()?)
//!     .with(
//!         BearerAuth::builder(tokens.clone())
//!             .origin(Origin::parse("https://api.example.com")?)
//!             .build()?,
//!     )
//!     .with(TransportEvidence::with_client_redirects(ClientRedirects::Recorded))
//!     .build();
//! # drop(client);
//! # Ok(()) }
//! ```
//!
//! With the `oauth2` feature, `OAuth2Source` is a ready source for the OAuth 2.0
//! client-credentials and refresh-token grants.

mod manager;
mod middleware;
#[cfg(feature = "oauth2")]
mod oauth2;

pub use crate::error::token::{TokenError, TokenErrorKind};
pub use crate::token::{AccessToken, TokenSource};
pub use manager::{TokenManager, TokenManagerBuilder};
pub(crate) use middleware::TokenFirst;
pub use middleware::{BearerAuth, BearerAuthBuilder, Challenge, ChallengeAction};
#[cfg(feature = "oauth2")]
#[cfg_attr(docsrs, doc(cfg(feature = "oauth2")))]
pub use oauth2::{ClientAuth, OAuth2Error, OAuth2ErrorCode, OAuth2Source, OAuth2SourceBuilder};
