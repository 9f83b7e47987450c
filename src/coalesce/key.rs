//! [`FlightKey`]: what makes two GETs the same request.

use std::hash::{BuildHasher, Hash, Hasher};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, header};
use reqwest::Request;

/// The request headers every key holds: the credentials (never shared across them) and
/// the ones that choose the representation a server sends back (RFC 9110 §12.5: the
/// content negotiation fields; `Range`, RFC 9110 §14.2, a part of it).
pub(crate) const KEYED_HEADERS: [HeaderName; 7] = [
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
    header::ACCEPT,
    header::ACCEPT_ENCODING,
    header::ACCEPT_LANGUAGE,
    header::RANGE,
];

/// Two requests with equal keys share one wire request: the same method (GET or HEAD),
/// the same URL, the same values of the [`KEYED_HEADERS`] and of the configured `Vary`
/// list (by position in it), and the same reqwest timeout. Holds secrets (an
/// `Authorization` value): it has no `Debug`.
///
/// Hashed once, when it is made (with the flights' own random keys, so no URL chosen by
/// an attacker can aim at one bucket): the map of flights then hashes a `u64`
/// ([`PreHashed`]) on each of its operations instead of the URL and the headers.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct FlightKey {
    hash: u64,
    method: Method,
    url: String,
    // (the header's position in KEYED_HEADERS then the Vary list, a value); every value
    // of a repeated header, in order.
    headers: Vec<(usize, HeaderValue)>,
    timeout: Option<Duration>,
}

impl FlightKey {
    /// The key of `req`, or `None` when it is never shared: not a GET or HEAD, or with
    /// a body.
    pub(crate) fn of(
        req: &Request,
        vary: &[HeaderName],
        hasher: &impl BuildHasher,
    ) -> Option<FlightKey> {
        if !(req.method() == Method::GET || req.method() == Method::HEAD) || req.body().is_some() {
            return None;
        }
        let mut headers = Vec::new();
        for (i, name) in KEYED_HEADERS.iter().chain(vary).enumerate() {
            headers.extend(req.headers().get_all(name).iter().map(|v| (i, v.clone())));
        }
        let url = req.url().as_str().to_owned();
        let timeout = req.timeout().copied();
        Some(FlightKey {
            hash: hasher.hash_one((req.method(), &url, &headers, timeout)),
            method: req.method().clone(),
            url,
            headers,
            timeout,
        })
    }
}

impl Hash for FlightKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// The map of flights' hasher: a [`FlightKey`] is hashed already.
#[derive(Clone, Copy, Default)]
pub(crate) struct PreHashed;

impl BuildHasher for PreHashed {
    type Hasher = PreHashedHasher;
    fn build_hasher(&self) -> PreHashedHasher {
        PreHashedHasher(0)
    }
}

pub(crate) struct PreHashedHasher(u64);

impl Hasher for PreHashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is called (by `FlightKey`); anything else is folded in.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: Method, url: &str, headers: &[(&str, &str)]) -> Request {
        let mut r = Request::new(method, url.parse().unwrap());
        for (n, v) in headers {
            r.headers_mut().append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        r
    }

    fn key(r: &Request) -> Option<FlightKey> {
        FlightKey::of(
            r,
            &[HeaderName::from_static("x-tenant")],
            &RANDOM.with(|s| s.clone()),
        )
    }

    thread_local! {
        static RANDOM: std::hash::RandomState = std::hash::RandomState::new();
    }

    #[test]
    fn the_same_get_shares_and_any_keyed_difference_separates() {
        let base = || req(Method::GET, "http://a.test/x?q=1", &[("accept", "json")]);
        assert!(key(&base()) == key(&base()));
        // An unkeyed header does not separate.
        let traced = req(
            Method::GET,
            "http://a.test/x?q=1",
            &[("accept", "json"), ("x-trace", "9")],
        );
        assert!(key(&base()) == key(&traced));
        for other in [
            req(Method::HEAD, "http://a.test/x?q=1", &[("accept", "json")]),
            req(Method::GET, "http://a.test/x?q=2", &[("accept", "json")]),
            req(Method::GET, "http://a.test/x?q=1", &[("accept", "xml")]),
            req(
                Method::GET,
                "http://a.test/x?q=1",
                &[("accept", "json"), ("authorization", "Bearer b")],
            ),
            req(
                Method::GET,
                "http://a.test/x?q=1",
                &[("accept", "json"), ("cookie", "s=1")],
            ),
            req(
                Method::GET,
                "http://a.test/x?q=1",
                &[("accept", "json"), ("range", "bytes=0-9")],
            ),
            req(
                Method::GET,
                "http://a.test/x?q=1",
                &[("accept", "json"), ("x-tenant", "7")],
            ),
            req(
                Method::GET,
                "http://a.test/x?q=1",
                &[("accept", "json"), ("accept", "xml")],
            ),
        ] {
            assert!(key(&base()) != key(&other));
        }
        let mut timed = base();
        *timed.timeout_mut() = Some(Duration::from_secs(1));
        assert!(key(&base()) != key(&timed));
        // Two credentials never share, whatever else is equal.
        let a = req(
            Method::GET,
            "http://a.test/",
            &[("authorization", "Bearer a")],
        );
        let b = req(
            Method::GET,
            "http://a.test/",
            &[("authorization", "Bearer b")],
        );
        assert!(key(&a) != key(&b));
    }

    #[test]
    fn other_methods_and_requests_with_a_body_are_never_keyed() {
        for m in [
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::OPTIONS,
            Method::PATCH,
        ] {
            assert!(key(&req(m, "http://a.test/", &[])).is_none());
        }
        let mut with_body = req(Method::GET, "http://a.test/", &[]);
        *with_body.body_mut() = Some(reqwest::Body::from("x"));
        assert!(key(&with_body).is_none());
    }
}
