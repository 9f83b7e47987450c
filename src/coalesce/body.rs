//! Reading the leader's body whole, up to the bound, and handing back an unshared
//! response whole when it cannot be shared.

use std::pin::Pin;
use std::task::{Context, Poll};

use http::header;
use http_body::Frame;
use hyper::body::Bytes;
use reqwest::Response;

/// The leader's response, read.
pub(crate) enum Read {
    /// The whole body, within the bound.
    Whole {
        head: http::response::Parts,
        url: reqwest::Url,
        body: Bytes,
    },
    /// Not shareable (over the bound, or broken while read): the leader's own response,
    /// its body as it came (what was read first, then the rest or the failure).
    Unshared(Response),
}

/// Whether `response` may be read for the callers that joined it: its length is known
/// (`Content-Length`, not a stream that may stay open) and within `max_body`, and it is
/// not the caller's own: no `Set-Cookie`, no `Cache-Control` `private` or `no-store` (a
/// `Cache-Control` that is not text counts as both).
pub(crate) fn shareable(response: &Response, max_body: usize) -> bool {
    let headers = response.headers();
    response
        .content_length()
        .is_some_and(|n| n <= max_body as u64)
        && !headers.contains_key(header::SET_COOKIE)
        && !headers
            .get_all(header::CACHE_CONTROL)
            .iter()
            .any(|value| value.to_str().map_or(true, forbids_sharing))
}

/// Whether a `Cache-Control` value holds `private` or `no-store` (RFC 9111 §5.2.2: a
/// directive's name is case-insensitive; `private="field"` is `private` too).
fn forbids_sharing(cache_control: &str) -> bool {
    cache_control.split(',').any(|directive| {
        let name = directive.split('=').next().unwrap_or_default().trim();
        name.eq_ignore_ascii_case("private") || name.eq_ignore_ascii_case("no-store")
    })
}

/// Reads `response`'s body up to `max_body` bytes. A body announced larger
/// (`Content-Length`) is not read at all.
///
/// # Cancel safety
///
/// Dropped while reading, the response (and what was read of it) is dropped: as a caller
/// dropping its response does.
pub(crate) async fn read(mut response: Response, max_body: usize) -> Read {
    if response
        .content_length()
        .is_some_and(|n| n > max_body as u64)
    {
        return Read::Unshared(response);
    }
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk);
                if body.len() > max_body {
                    return Read::Unshared(rebuilt(response, body.into(), None));
                }
            }
            Ok(None) => break,
            Err(e) => return Read::Unshared(rebuilt(response, body.into(), Some(e))),
        }
    }
    let url = response.url().clone();
    let (head, _) = http::Response::from(response).into_parts();
    Read::Whole {
        head,
        url,
        body: body.into(),
    }
}

/// `response` with what was read of its body put back in front of the rest (or of the
/// failure that ended it).
fn rebuilt(response: Response, read: Bytes, failure: Option<reqwest::Error>) -> Response {
    let url = response.url().clone();
    let (head, rest) = http::Response::from(response).into_parts();
    let body = Prefixed {
        read: (!read.is_empty()).then_some(read),
        rest: match failure {
            None => Rest::Body(rest),
            Some(e) => Rest::Failed(Some(e)),
        },
    };
    let response = Response::from(http::Response::from_parts(head, reqwest::Body::wrap(body)));
    crate::stage::with_url(response, url)
}

/// A body that yields what was read of it first.
struct Prefixed {
    read: Option<Bytes>,
    rest: Rest,
}

enum Rest {
    Body(reqwest::Body),
    Failed(Option<reqwest::Error>),
}

impl http_body::Body for Prefixed {
    type Data = Bytes;
    type Error = reqwest::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, reqwest::Error>>> {
        let this = self.get_mut();
        if let Some(read) = this.read.take() {
            return Poll::Ready(Some(Ok(Frame::data(read))));
        }
        match &mut this.rest {
            Rest::Body(body) => Pin::new(body).poll_frame(cx),
            Rest::Failed(failure) => Poll::Ready(failure.take().map(Err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::ResponseBuilderExt;

    /// A body of `chunks` with no size announced (as a chunked one), then `failure`.
    struct Chunked(Vec<&'static [u8]>, bool);

    impl http_body::Body for Chunked {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            let this = self.get_mut();
            if this.0.is_empty() {
                let failed = std::mem::take(&mut this.1);
                return Poll::Ready(failed.then(|| Err(std::io::Error::other("cut"))));
            }
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(this.0.remove(0))))))
        }
    }

    fn response(chunks: Vec<&'static [u8]>, fails: bool) -> Response {
        let url: reqwest::Url = "http://a.test/x".parse().unwrap();
        http::Response::builder()
            .status(203)
            .header("x-kept", "1")
            .url(url)
            .body(reqwest::Body::wrap(Chunked(chunks, fails)))
            .unwrap()
            .into()
    }

    #[test]
    fn only_a_known_length_within_the_bound_and_no_answer_of_the_callers_own_is_shareable() {
        let with = |length: Option<usize>, headers: &[(&str, &[u8])]| {
            let mut b = http::Response::builder();
            for (n, v) in headers {
                b = b.header(*n, *v);
            }
            let body = match length {
                Some(n) => reqwest::Body::from(vec![b'x'; n]),
                None => reqwest::Body::wrap(Chunked(vec![b"x"], false)),
            };
            shareable(&Response::from(b.body(body).unwrap()), 10)
        };
        assert!(with(Some(10), &[]));
        assert!(with(Some(0), &[("cache-control", b"public, max-age=60")]));
        assert!(with(Some(0), &[("cache-control", b"no-cache")]));
        assert!(!with(Some(11), &[]));
        assert!(!with(None, &[]));
        for own in [
            ("cache-control", &b"private"[..]),
            ("cache-control", b"max-age=5, PRIVATE=\"set-cookie\""),
            ("cache-control", b" No-Store "),
            ("cache-control", b"\xff"),
            ("set-cookie", b"s=1"),
        ] {
            assert!(!with(Some(1), &[own]), "{own:?}");
        }
    }

    #[tokio::test]
    async fn a_body_within_the_bound_is_read_whole_with_its_head_and_url() {
        let Read::Whole { head, url, body } = read(response(vec![b"abc", b"def"], false), 6).await
        else {
            panic!("not read whole");
        };
        assert_eq!((head.status.as_u16(), &body[..]), (203, &b"abcdef"[..]));
        assert_eq!(head.headers["x-kept"], "1");
        assert_eq!(url.as_str(), "http://a.test/x");
    }

    #[tokio::test]
    async fn a_body_that_grows_past_the_bound_comes_back_whole_and_in_order() {
        let Read::Unshared(r) = read(response(vec![b"abc", b"def", b"ghi"], false), 5).await else {
            panic!("shared a body over the bound");
        };
        assert_eq!(
            (r.status().as_u16(), r.url().as_str()),
            (203, "http://a.test/x")
        );
        assert_eq!(r.headers()["x-kept"], "1");
        assert_eq!(&r.bytes().await.unwrap()[..], b"abcdefghi");
    }

    #[tokio::test]
    async fn a_body_that_breaks_comes_back_with_what_was_read_then_the_failure() {
        let Read::Unshared(mut r) = read(response(vec![b"abc"], true), 100).await else {
            panic!("shared a broken body");
        };
        assert_eq!(&r.chunk().await.unwrap().unwrap()[..], b"abc");
        let failure = r.chunk().await.unwrap_err();
        assert!(failure.is_body() || failure.is_decode(), "{failure:?}");
        assert!(crate::chain::find::<std::io::Error>(&failure).is_some());
    }
}
