//! [`map_body`]: a response with its body wrapped, everything else kept.

use reqwest::{Body, Response, ResponseBuilderExt};

/// `response` with its body replaced by `wrap(body)`.
///
/// reqwest rebuilds a `Response` from an `http::Response` whose body it wraps: status,
/// version, headers and extensions (the remote address, `Response::upgrade`'s handle, a
/// middleware's records) move across, the URL is put back, and the body keeps its
/// decoding and its timeouts (they are inside it). The price is three boxed bodies and a
/// copy of the URL per response; the URL goes into the response's own extensions (no map
/// of its own to build and merge).
pub(crate) fn map_body(response: Response, wrap: impl FnOnce(Body) -> Body) -> Response {
    let url = response.url().clone();
    let (mut parts, body) = http::Response::<Body>::from(response).into_parts();
    let body = wrap(body);
    // reqwest keeps the URL in an extension of its own, which only its builder sets: the
    // builder is given the response's extensions to set it in, and hands them back. A
    // builder that was only given an extension never fails.
    let mut with_url = http::Response::builder();
    if let Some(extensions) = with_url.extensions_mut() {
        std::mem::swap(extensions, &mut parts.extensions);
    }
    if let Ok(with_url) = with_url.url(url).body(()) {
        parts.extensions = with_url.into_parts().0.extensions;
    }
    Response::from(http::Response::from_parts(parts, body))
}
