//! Long-lived streams: server-sent events that reconnect under the stack's policy
//! ([`EventStream`]), and the reconnect loop itself for any stream ([`Reconnect`]).
//!
//! ```no_run
//! use futures_util::StreamExt;
//! use reqwest_resilience::Resilience;
//! use reqwest_resilience::stream::{EventStream, StreamItem};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Resilience::new().build_from(reqwest::Client::builder)?;
//! let mut prices = EventStream::new(client.get("https://api.example.com/v1/prices"))?;
//! while let Some(item) = prices.next().await {
//!     if let StreamItem::Event(event) = item? {
//!         println!("{}: {}", event.id, event.data);
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Each connection is one request through the client, so the stack does for it what it
//! does for any request: its retries answer a `503` / `429` with `Retry-After` (and the
//! origin's shared pause), [`BearerAuth`](crate::BearerAuth) refreshes once on `401`, the
//! breaker records the connection's *initial response*. The stream then decides the
//! reconnect from the outcome, as the HTML standard's `EventSource` does, with the rules
//! of [`Reconnect`] on top. The whole story, with the choices and their anchors:
//! [`guide::streams`](crate::guide::streams).
//!
//! | outcome of a connection | what the stream does |
//! |---|---|
//! | `200` with `text/event-stream` | [`StreamItem::Opened`], then events |
//! | the stream ends, or breaks part way | reconnect after the reconnection time, with `Last-Event-ID` |
//! | `204 No Content` | ends (`None`) |
//! | `5xx`, `429`, `408` (after the stack's own retries) | reconnect with backoff, `Retry-After` honoured |
//! | an open breaker, a pause, a rate limit | reconnect after the breaker's "retry in" |
//! | a transport failure | reconnect with backoff, unless no reconnect can change it (a certificate) |
//! | another status, a wrong `Content-Type` | ends with [`EventStreamError`] |
//!
//! A request that is not idempotent (a `POST` without `Idempotency-Key`) is never sent
//! again once a byte of its response came: see [`EventStream::resend_non_idempotent`].
//!
//! # Why a parser of its own
//!
//! [`EventParser`] is written here rather than taken from `eventsource-stream` (what
//! reqwest-eventsource uses), whose 0.2.3 departs from the standard where a reconnect
//! shows it: `retry` read by `u64::from_str` (takes `+5`), a `\r` at a chunk's end
//! waiting for the next chunk (dispatching one chunk late on a CR-only stream), the last
//! event id updated only by an event with data (an `id` in a data-less block is lost, and
//! a reconnect then sends a stale `Last-Event-ID`), invalid UTF-8 failing the stream
//! instead of decoding to U+FFFD, and a buffer split per line (quadratic on big chunks).

mod error;
mod events;
mod observe;
mod parse;
mod reconnect;

pub use error::EventStreamError;
pub use events::{EventStream, StreamItem};
pub use parse::{Event, EventParser};
pub use reconnect::{GaveUp, Reconnect, ReconnectCause, ReconnectPolicy, Reconnection};
