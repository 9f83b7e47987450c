//! A closure's stream as a body: the body of a
//! [`ReplayableBody::from_fn`](super::ReplayableBody::from_fn).

use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, ready};

use futures_core::Stream;
use http_body::Frame;
use hyper::body::Bytes;

use super::BoxError;
use crate::error::UploadBodyError;

/// A stream of chunks as an `http_body::Body`, its errors kept inside an
/// [`UploadBodyError`]. reqwest wants a `Sync` body and a user's
/// stream need only be `Send`: the mutex makes it `Sync` and is never locked (the body is
/// polled through `&mut`).
pub(super) struct StreamBody<S> {
    stream: Mutex<Pin<Box<S>>>,
}

impl<S> StreamBody<S> {
    pub(super) fn new(stream: S) -> Self {
        StreamBody {
            stream: Mutex::new(Box::pin(stream)),
        }
    }
}

impl<S, B, E> http_body::Body for StreamBody<S>
where
    S: Stream<Item = Result<B, E>>,
    B: Into<Bytes>,
    E: Into<BoxError>,
{
    type Data = Bytes;
    type Error = UploadBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UploadBodyError>>> {
        let stream = match self.get_mut().stream.get_mut() {
            Ok(stream) => stream,
            // Never locked, so never poisoned; a poisoned one still holds the stream.
            Err(poisoned) => poisoned.into_inner(),
        };
        Poll::Ready(ready!(stream.as_mut().poll_next(cx)).map(|item| {
            item.map(|chunk| Frame::data(chunk.into()))
                .map_err(|e| UploadBodyError::stream(e.into()))
        }))
    }
}
