//! The no-progress bound ([`Network::no_progress`](super::Network::no_progress)) and the
//! cut of an attempt whose network changed: [`guarded`] around an attempt's future, a
//! request body that reports its progress ([`report_upload`]), and a response body that
//! ends when nothing comes for the bound ([`bound_body`]).
//!
//! Time is tokio's, so a paused test clock drives every bound. A bound is checked lazily:
//! its timer is armed once per attempt (and once per body wait), and when it fires the
//! last progress decides whether to cut or to wait the rest.

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

/// The largest piece of a request body handed to the connection at once: a buffered
/// body is handed on in pieces, so that its upload shows progress as the connection
/// takes each one.
const UPLOAD_PIECE: usize = 64 * 1024;

/// The error a response body ends with when nothing came for the bound, inside an
/// `io::Error` of kind `TimedOut` (so the body's failure is classified as an interrupted
/// body); the attempt's own cut is [`ResilienceError::NoProgress`](crate::ResilienceError::NoProgress).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoProgress {
    /// The bound that passed without a byte.
    pub after: Duration,
}

impl std::fmt::Display for NoProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no byte from the server for {:?}", self.after)
    }
}

impl std::error::Error for NoProgress {}

/// When an attempt last made progress: milliseconds after its start (a request body's
/// piece taken by the connection).
#[derive(Debug)]
pub(crate) struct Stamp {
    start: Instant,
    last_ms: AtomicU64,
}

impl Stamp {
    fn new() -> Arc<Stamp> {
        Arc::new(Stamp {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        })
    }

    fn mark(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// Why [`guarded`] cut an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// Nothing came for the bound.
    NoProgress(Duration),
    /// The network changed under it.
    NetworkChanged,
}

/// What [`guarded`] watches besides the attempt.
pub(crate) struct Watch {
    /// The bound, the attempt's start, and its upload's progress (for a request with a
    /// body handed on in pieces).
    pub(crate) no_progress: Option<(Duration, Instant, Option<Arc<Stamp>>)>,
    /// Later changes of the network, and the count at the attempt's start: only for an
    /// attempt harmless to repeat.
    pub(crate) changes: Option<(tokio::sync::watch::Receiver<u64>, u64)>,
}

/// `sent`, unless the bound passes without progress before it ends, or the network
/// changes under it.
///
/// # Cancel safety
///
/// Dropping it drops `sent` (the attempt) and its timer; nothing is left behind.
pub(crate) async fn guarded<F: Future>(sent: F, watch: Watch) -> Result<F::Output, Cut> {
    let Watch {
        no_progress,
        changes,
    } = watch;
    let mut sent = pin!(sent);
    let mut timer = pin!(
        no_progress
            .as_ref()
            .map(|(bound, start, _)| tokio::time::sleep_until(*start + *bound))
    );
    let mut changed = pin!(async move {
        if let Some((mut rx, at)) = changes {
            while rx.changed().await.is_ok() {
                if *rx.borrow_and_update() > at {
                    return;
                }
            }
        }
        std::future::pending::<()>().await
    });
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = sent.as_mut().poll(cx) {
            return Poll::Ready(Ok(out));
        }
        if changed.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(Cut::NetworkChanged));
        }
        if let (Some(mut sleep), Some((bound, start, upload))) =
            (timer.as_mut().as_pin_mut(), &no_progress)
        {
            while sleep.as_mut().poll(cx).is_ready() {
                let due = upload.as_ref().map_or(*start, |s| s.last()) + *bound;
                if due <= Instant::now() {
                    return Poll::Ready(Err(Cut::NoProgress(*bound)));
                }
                sleep.as_mut().reset(due);
            }
        }
        Poll::Pending
    })
    .await
}

pin_project_lite::pin_project! {
    /// An attempt's future, [`guarded`] when there is something to watch (in a box: its
    /// timers would size every attempt's future, watched or not).
    #[project = GuardedProj]
    pub(crate) enum Guarded<'a, F: Future> {
        Plain { #[pin] sent: F },
        Watched { guarded: Pin<Box<dyn Future<Output = Result<F::Output, Cut>> + Send + 'a>> },
    }
}

impl<'a, F: Future + Send + 'a> Guarded<'a, F> {
    pub(crate) fn new(sent: F, watch: Option<Watch>) -> Self {
        match watch {
            None => Guarded::Plain { sent },
            Some(watch) => Guarded::Watched {
                guarded: Box::pin(guarded(sent, watch)),
            },
        }
    }
}

impl<F: Future> Future for Guarded<'_, F> {
    type Output = Result<F::Output, Cut>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            GuardedProj::Plain { sent } => sent.poll(cx).map(Ok),
            GuardedProj::Watched { guarded } => guarded.as_mut().poll(cx),
        }
    }
}

pin_project_lite::pin_project! {
    /// A request body that marks `stamp` as the connection takes each piece of it.
    struct UploadBody {
        #[pin]
        inner: reqwest::Body,
        rest: Bytes,
        stamp: Arc<Stamp>,
    }
}

impl http_body::Body for UploadBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        if this.rest.is_empty() {
            match std::task::ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => *this.rest = data,
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    this.stamp.mark();
                    return Poll::Ready(None);
                }
            }
        }
        this.stamp.mark();
        let piece = this.rest.split_to(this.rest.len().min(UPLOAD_PIECE));
        Poll::Ready(Some(Ok(http_body::Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let mut hint = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        hint.set_lower(hint.lower().saturating_add(rest));
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

/// Hands `request`'s body on in pieces that mark the stamp returned as the connection
/// takes them (a request without a body, or with a small buffered one, is left as it is).
pub(crate) fn report_upload(request: &mut reqwest::Request) -> Option<Arc<Stamp>> {
    let body = request.body_mut().take()?;
    // A buffered body that fits one piece goes out at once, and stays replayable for
    // reqwest's own replays of a refused HTTP/2 stream.
    if body.as_bytes().is_some_and(|b| b.len() <= UPLOAD_PIECE) {
        *request.body_mut() = Some(body);
        return None;
    }
    let stamp = Stamp::new();
    *request.body_mut() = Some(reqwest::Body::wrap(UploadBody {
        inner: body,
        rest: Bytes::new(),
        stamp: stamp.clone(),
    }));
    Some(stamp)
}

pin_project_lite::pin_project! {
    /// A response body that fails with [`NoProgress`] when no frame comes for `bound`.
    struct BoundBody {
        #[pin]
        inner: reqwest::Body,
        bound: Duration,
        last: Instant,
        #[pin]
        timer: Option<tokio::time::Sleep>,
    }
}

impl http_body::Body for BoundBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        if let Poll::Ready(frame) = this.inner.as_mut().poll_frame(cx) {
            *this.last = Instant::now();
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let due = *this.last + *this.bound;
        if this.timer.as_mut().as_pin_mut().is_none() {
            this.timer.set(Some(tokio::time::sleep_until(due)));
        }
        let Some(mut timer) = this.timer.as_mut().as_pin_mut() else {
            return Poll::Pending;
        };
        while timer.as_mut().poll(cx).is_ready() {
            if due <= Instant::now() {
                let cut = NoProgress { after: *this.bound };
                return Poll::Ready(Some(Err(
                    io::Error::new(io::ErrorKind::TimedOut, cut).into()
                )));
            }
            timer.as_mut().reset(due);
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The largest body left unwatched: one this small that the server sends with its head
/// (a JSON answer, an error page) arrives in the same reads as the head. Watching every
/// body would cost each response a rebuild (three boxed bodies and a copy of its URL:
/// `benches/instructions.rs`), for a server that stalls inside a few KiB.
const SMALL_BODY: u64 = 16 * 1024;

/// Whether `response`'s body is empty or known to be at most [`SMALL_BODY`]: it is not
/// bounded.
pub(crate) fn comes_with_head(response: &reqwest::Response) -> bool {
    response.content_length().is_some_and(|n| n <= SMALL_BODY)
}

/// `response` whose body fails with [`NoProgress`] when no byte comes for `bound`.
pub(crate) fn bound_body(response: reqwest::Response, bound: Duration) -> reqwest::Response {
    crate::response_body::map_body(response, |inner| {
        reqwest::Body::wrap(BoundBody {
            inner,
            bound,
            last: Instant::now(),
            timer: None,
        })
    })
}
