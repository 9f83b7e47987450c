//! [`Resilience`]: the whole stack, in the right order, with the design's defaults, in
//! one builder (the analogue of Polly's `AddStandardResilienceHandler`).
//!
//! The stages, their order and why, and where your own middleware goes (around the stack
//! with [`Resilience::install`], per attempt with [`Resilience::per_attempt`]):
//! [`guide::stack`](crate::guide::stack). The defaults:
//! [`guide::defaults`](crate::guide::defaults).
//!
//! The stack is installed as one middleware (`compose.rs`): the retry loop outermost, and
//! each attempt one function calling the breaker's, the rate limit's and the transport
//! step's hooks around the call (`attempt.rs`; the concurrency limit and `BearerAuth`
//! nested between them when present, over the stage vocabulary of `src/stage/`). A
//! middleware cannot be added with `.with()` *after* the stack (the [`StackBuilder`] has
//! no `.with()`): it would land inside the transport step.
//!
//! ```
//! use reqwest_resilience::Resilience;
//!
//! # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
//! // The client built with the redirect policy the stack watches (`build(client)` takes
//! // one you built; see `client_redirects`).
//! let client = Resilience::new().build_from(reqwest::Client::builder())?;
//! // use `client` exactly like a reqwest::Client: client.get(url).send().await
//! # drop(client); Ok(()) }
//! ```
//!
//! # The files, by idea
//!
//! Each file imports only the ones above it in this list:
//!
//! | file | what it holds |
//! |---|---|
//! | `observer.rs` | the outermost stage: the span per logical request and the [`on_attempt`](Resilience::on_attempt) hook |
//! | `attempt.rs` | one attempt through the stages inside the retry loop: the breaker's and the transport step's hooks around the call (`ComposedAttempt`) |
//! | `compose.rs` | the stages nested into one middleware (`Composed`) and a resumed body's range requests through them |
//! | `builder.rs` | [`Resilience`]: the choices for each part, one setter each, and the defaults |
//! | `clients.rs` | the clients [`build_from`](Resilience::build_from) builds ([`ClientBuilders`]): one, or one per proxy of a pool |
//! | `assemble.rs` | those choices built into stages and nested (the retry from its settings, the breaker, the limits) |
//! | `install.rs` | the assembled stack in a `reqwest_middleware::ClientBuilder` ([`StackBuilder`]), as one middleware ([`ResilienceMiddleware`]) or as a list |
//! | `astral.rs` | the same installation for the astral fork's builder ([`astral`], feature `astral`) |

mod assemble;
#[cfg(feature = "astral")]
#[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
pub mod astral;
mod attempt;
mod builder;
mod clients;
pub(crate) mod compose;
mod install;
mod observer;

pub use builder::{
    BreakerChoice, ConcurrencyLimitChoice, RateLimitChoice, Resilience, RetryChoice,
};
pub use clients::ClientBuilders;
pub use install::{ResilienceMiddleware, StackBuilder};

pub use crate::error::stack::{StackError, StackPart};
