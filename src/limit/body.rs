//! A response body that holds its attempt's [`LimitPermit`] until it is read to its end,
//! fails, or is dropped: a body still streaming is load on the server.

use std::pin::Pin;
use std::task::{Context, Poll};

use reqwest::{Body, Response};

use super::registry::LimitPermit;

pin_project_lite::pin_project! {
    /// `inner`, with the permit given back at its last frame, its error, or its drop.
    struct PermitBody {
        #[pin]
        inner: Body,
        permit: Option<LimitPermit>,
        // `inner` said it had ended: it is not polled again (its end is three boxed
        // bodies away).
        ended: bool,
    }
}

impl http_body::Body for PermitBody {
    type Data = <Body as http_body::Body>::Data;
    type Error = <Body as http_body::Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        let frame = std::task::ready!(this.inner.as_mut().poll_frame(cx));
        // The end (or a failure) of the body ends the permit; a known length ends with
        // its last data frame, before the caller polls again.
        if !matches!(frame, Some(Ok(_))) {
            this.permit.take();
        } else if this.inner.is_end_stream() {
            *this.ended = true;
            this.permit.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        if self.ended {
            return http_body::SizeHint::with_exact(0);
        }
        self.inner.size_hint()
    }
}

/// `response`, its body holding `permit` until it ends or is dropped
/// ([`crate::response_body::map_body`]).
pub(super) fn hold_until_body_end(response: Response, permit: LimitPermit) -> Response {
    crate::response_body::map_body(response, |body| {
        Body::wrap(PermitBody {
            inner: body,
            permit: Some(permit),
            ended: false,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Origin;
    use crate::limit::LimiterConfig;
    use crate::limit::registry::{Admission, LimiterRegistry};
    use reqwest::ResponseBuilderExt;

    #[tokio::test]
    async fn a_body_that_says_it_ended_gives_the_permit_back_and_is_not_polled_again() {
        let registry = LimiterRegistry::new(LimiterConfig::fixed(1)).unwrap();
        let origin = Origin::parse("http://a.example").unwrap();
        let Admission::Admitted(permit) = registry.admit(&origin, None, true) else {
            panic!("a free limit admits");
        };
        let in_flight = || registry.get(&origin).unwrap().in_flight;
        let url = reqwest::Url::parse("http://a.example/x").unwrap();
        let response = http::Response::builder()
            .url(url.clone())
            .body("ok")
            .unwrap();
        let mut response = hold_until_body_end(Response::from(response), permit);
        assert_eq!(response.url(), &url);
        assert_eq!(response.content_length(), Some(2));
        assert_eq!(in_flight(), 1);
        // The last data frame gives the permit back; the end follows without a poll.
        assert_eq!(response.chunk().await.unwrap().as_deref(), Some(&b"ok"[..]));
        assert_eq!(in_flight(), 0);
        assert_eq!(response.chunk().await.unwrap(), None);
    }
}
