//! Streamed uploads that are retried: a request carries a way to re-open its body
//! ([`ReplayableBody`]: a file, or a closure making a fresh stream), and every attempt
//! sends a body opened for it.
//!
//! A streamed body (`reqwest::Body::wrap_stream`, a file) cannot be copied, so without
//! this a request with one is sent once and never retried (the stop is
//! [`StopReason::BodyNotClonable`](crate::retry::StopReason::BodyNotClonable)). With it
//! the request is retried under the same rules as a buffered body: a refused connection or
//! a `503` with `Retry-After` is retried for a POST too, a POST that may have been
//! processed (its connection reset mid-upload) is never sent again unless it is idempotent
//! (a PUT, an `Idempotency-Key`, [`Idempotent(true)`](crate::retry::Idempotent)).
//!
//! ```no_run
//! use reqwest_resilience::Resilience;
//! use reqwest_resilience::upload::ReplayableBody;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Resilience::new().build_from(reqwest::Client::builder())?;
//! let response = client
//!     .put("http://127.0.0.1:8080/dist/pkg-1.0.tar.gz")
//!     .with_extension(ReplayableBody::file("dist/pkg-1.0.tar.gz"))
//!     .send()
//!     .await?;
//! # drop(response); Ok(()) }
//! ```
//!
//! # What the stack does with it
//!
//! | stage | |
//! |---|---|
//! | retry loop | opens the body for every attempt (the first included) and drops the request's own body, if it had one: the extension is the body |
//! | hedging | never: a hedge would need two bodies at once |
//! | `BearerAuth` | its replay after a `401` opens the body again |
//! | `TransportEvidence` | opens the body when no retry loop outside did (a stack without one) |
//! | breaker, limiter, rate limit | see an attempt like any other |
//! | coalescing, resume | never touch the request |
//!
//! The body is read as it is sent, 64 KiB at a time, never buffered whole. A file's
//! length is read when it is opened and sent as `Content-Length` (a server that needs the
//! length up front, such as S3's `PutObject` or one answering `411 Length Required` to a
//! chunked body, takes it; nginx takes either); a closure's
//! stream is sent chunked, unless the request carries a `Content-Length` of its own, for
//! every method: the stack sets `Transfer-Encoding: chunked` on the request, without which
//! hyper would silently drop the body of a GET, HEAD or CONNECT.
//! A file that cannot be opened ends the attempt before it leaves:
//! [`ResilienceError::UploadBody`], `NotSent`, not
//! retried. A body that breaks on this side while it is sent (the closure's stream yields
//! an error, the file cannot be read) is the caller's failure:
//! [`FailureKind::UploadBody`], neutral for the origin's
//! breaker, not retried (the closure is not called again).
//!
//! Attach it with `.with_extension(..)` (reqwest-middleware's `RequestBuilder`, or the
//! astral fork's); the request needs no `.body(..)`. The body is opened by this crate's
//! stages, so a client with neither the retry middleware nor the transport step (every
//! [`Resilience`](crate::Resilience) stack has both) would send the request without one.

mod file;
mod stream;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use http::Extensions;
use hyper::body::Bytes;
use reqwest::Request;

use crate::error::ResilienceError;
pub use crate::error::upload::UploadBodyError;
use crate::origin::Origin;
use crate::record::{FailureKind, record_rejected_locally};

/// An error a closure's stream may yield, boxed.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A way to re-open a request's body for each attempt: a file, read as it is sent, or a
/// closure returning a fresh stream. Attached as a request extension
/// (`.with_extension(ReplayableBody::file(path))`); cheap to clone (one `Arc`).
///
/// See the [module](self) for what each stage does with it.
#[derive(Clone)]
pub struct ReplayableBody(Arc<Source>);

enum Source {
    File(PathBuf),
    Stream(Box<dyn Fn() -> reqwest::Body + Send + Sync>),
}

impl ReplayableBody {
    /// The file at `path`, opened afresh for each attempt and read 64 KiB at a time as it
    /// is sent, its length at that opening sent as `Content-Length`. A file that shrinks
    /// while it is read fails the attempt (a body error); one that grows is sent as long
    /// as it was when opened.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        ReplayableBody(Arc::new(Source::File(path.into())))
    }

    /// A body made by `make` for each attempt: a fresh stream of chunks (anything
    /// `Into<Bytes>`: `Vec<u8>`, `String`, `Bytes`…), sent chunked unless the request
    /// carries a `Content-Length` of its own, whatever the method (the stack sets
    /// `Transfer-Encoding: chunked`, without which hyper would drop the body of a GET). `make` is called once per attempt, the
    /// first included; the stream is polled as the body is sent, never collected.
    pub fn from_fn<F, S, B, E>(make: F) -> Self
    where
        F: Fn() -> S + Send + Sync + 'static,
        S: futures_core::Stream<Item = Result<B, E>> + Send + 'static,
        B: Into<Bytes>,
        E: Into<BoxError>,
    {
        let make = move || reqwest::Body::wrap(stream::StreamBody::new(make()));
        ReplayableBody(Arc::new(Source::Stream(Box::new(make))))
    }

    /// The body attached to a request, if it has one (what `extensions.get()` returns).
    pub fn of(extensions: &Extensions) -> Option<&ReplayableBody> {
        extensions.get::<ReplayableBody>()
    }

    /// A body for one attempt, and its length when known up front.
    async fn open(&self) -> Result<(reqwest::Body, Option<u64>), UploadBodyError> {
        match &*self.0 {
            Source::File(path) => {
                let (body, len) = file::FileBody::open(path).await?;
                Ok((reqwest::Body::wrap(body), Some(len)))
            }
            Source::Stream(make) => Ok((make(), None)),
        }
    }

    /// Gives `req` a body opened for this attempt (and a file's `Content-Length`). When it
    /// cannot be opened, leaves the attempt's `NotSent` evidence (at `origin`) and returns
    /// the error the attempt ends with.
    pub(crate) async fn open_into(
        &self,
        req: &mut Request,
        extensions: &mut Extensions,
        origin: Option<Origin>,
    ) -> reqwest_middleware::Result<()> {
        match self.open().await {
            Ok((body, len)) => {
                let headers = req.headers_mut();
                match len {
                    Some(len) => {
                        headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
                    }
                    // hyper sends a body of unknown length chunked for most methods but drops
                    // it, silently, from a GET, HEAD or CONNECT unless the request says
                    // `Transfer-Encoding: chunked` (HTTP/2 strips the header and sends the
                    // body as DATA frames).
                    None if !headers.contains_key(http::header::CONTENT_LENGTH) => {
                        headers
                            .entry(http::header::TRANSFER_ENCODING)
                            .or_insert(http::HeaderValue::from_static("chunked"));
                    }
                    None => {}
                }
                *req.body_mut() = Some(body);
                Ok(())
            }
            Err(e) => {
                record_rejected_locally(extensions, FailureKind::Builder, origin, None);
                Err(reqwest_middleware::Error::middleware(
                    ResilienceError::UploadBody(e),
                ))
            }
        }
    }
}

/// The body a stage is to open for `req` before it sends it: the request's
/// [`ReplayableBody`] when `req` has no body yet (none was opened for this attempt).
pub(crate) fn to_open(req: &Request, extensions: &Extensions) -> Option<ReplayableBody> {
    if req.body().is_some() {
        return None;
    }
    ReplayableBody::of(extensions).cloned()
}

impl fmt::Debug for ReplayableBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.0 {
            Source::File(path) => f.debug_tuple("ReplayableBody::File").field(path).finish(),
            Source::Stream(_) => f.write_str("ReplayableBody::Stream"),
        }
    }
}
