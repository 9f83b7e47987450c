//! [`FlightKey`]: what makes two GETs the same request.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, Version};
use reqwest::Request;

/// Whose requests may share: the identity of the clients and stacks a
/// [`CoalesceGets`](super::CoalesceGets) serves (a middleware sees neither a client's
/// default headers nor which client it serves).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum Partition {
    /// One value and the stack or client holding it (a clone is another).
    Own(u64),
    /// Every clone declared this identity ([`CoalesceGets::identity`](super::CoalesceGets::identity)).
    Named(Arc<str>),
}

impl Partition {
    /// A partition no other value has.
    pub(crate) fn own() -> Partition {
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Partition::Own(IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// Two requests with equal keys share one wire request: the same partition (identity),
/// method (GET or HEAD), HTTP version, URL, reqwest timeout, and the same request headers,
/// every one of them: each name with its values in order (fields of different names in
/// another order are the same request, RFC 9110 §5.3). Holds secrets (an
/// `Authorization` value): it has no `Debug`.
///
/// Hashed once, when it is made (with the flights' own random keys, so no URL chosen by
/// an attacker can aim at one bucket): the map of flights then hashes a `u64`
/// ([`PreHashed`]) on each of its operations instead of the URL and the headers.
///
/// Cheap to clone (the map of flights and the leader each hold one): the URL and the
/// headers are shared, not copied.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct FlightKey {
    hash: u64,
    partition: Partition,
    method: Method,
    version: Version,
    url: Arc<str>,
    /// Every header, sorted by name; a repeated header's values in the order sent (`None`:
    /// no header, nothing allocated).
    headers: Option<Arc<[(HeaderName, HeaderValue)]>>,
    timeout: Option<Duration>,
}

impl FlightKey {
    /// The key of `req` in `partition`, or `None` when it is never shared: not a GET or
    /// HEAD, or with a body.
    pub(crate) fn of(
        req: &Request,
        partition: &Partition,
        hasher: &impl BuildHasher,
    ) -> Option<FlightKey> {
        if !(req.method() == Method::GET || req.method() == Method::HEAD) || req.body().is_some() {
            return None;
        }
        let headers = (!req.headers().is_empty()).then(|| {
            let mut headers: Vec<(HeaderName, HeaderValue)> = req
                .headers()
                .iter()
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect();
            // Stable: a repeated header keeps the order of its values.
            headers.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
            Arc::from(headers)
        });
        let url: Arc<str> = Arc::from(req.url().as_str());
        let timeout = req.timeout().copied();
        let version = req.version();
        let hash = hash_of(
            hasher,
            partition,
            req.method() == Method::HEAD,
            version,
            &url,
            headers.as_deref().unwrap_or_default(),
            timeout,
        );
        Some(FlightKey {
            hash,
            partition: partition.clone(),
            method: req.method().clone(),
            version,
            url,
            headers,
            timeout,
        })
    }
}

/// A key's hash, in few writes: each write into the (SipHash) hasher has a fixed cost,
/// so the small fields go in as one block of bytes. Equal keys hash equal; unequal ones
/// that collide are still told apart by `Eq`.
fn hash_of(
    hasher: &impl BuildHasher,
    partition: &Partition,
    head: bool,
    version: Version,
    url: &str,
    headers: &[(HeaderName, HeaderValue)],
    timeout: Option<Duration>,
) -> u64 {
    let mut block = [0u8; 24];
    block[0] = u8::from(head);
    block[1] = [
        Version::HTTP_09,
        Version::HTTP_10,
        Version::HTTP_11,
        Version::HTTP_2,
        Version::HTTP_3,
    ]
    .iter()
    .position(|v| *v == version)
    .map_or(u8::MAX, |i| i as u8);
    if let Some(timeout) = timeout {
        block[2] = 1;
        block[3..11].copy_from_slice(&timeout.as_secs().to_le_bytes());
        block[11..15].copy_from_slice(&timeout.subsec_nanos().to_le_bytes());
    }
    let mut h = hasher.build_hasher();
    match partition {
        Partition::Own(id) => {
            block[16..24].copy_from_slice(&id.to_le_bytes());
            h.write(&block);
        }
        Partition::Named(name) => {
            block[15] = 1;
            h.write(&block);
            h.write(name.as_bytes());
            h.write_u8(0xff);
        }
    }
    h.write(url.as_bytes());
    for (name, value) in headers {
        h.write_u8(0xff);
        h.write(name.as_str().as_bytes());
        h.write_u8(0xff);
        h.write(value.as_bytes());
    }
    h.finish()
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
        FlightKey::of(r, &Partition::Own(0), &RANDOM.with(|s| s.clone()))
    }

    thread_local! {
        static RANDOM: std::hash::RandomState = std::hash::RandomState::new();
    }

    #[test]
    fn the_same_get_shares_and_any_difference_separates() {
        let base = || req(Method::GET, "http://a.test/x?q=1", &[("accept", "json")]);
        assert!(key(&base()) == key(&base()));
        // Every header separates: the server sees it.
        let traced = req(
            Method::GET,
            "http://a.test/x?q=1",
            &[("accept", "json"), ("x-trace", "9")],
        );
        assert!(key(&base()) != key(&traced));
        // Fields of different names in another order are the same request.
        let two = |a: (&'static str, &'static str), b: (&'static str, &'static str)| {
            key(&req(Method::GET, "http://a.test/", &[a, b]))
        };
        assert!(two(("accept", "json"), ("x-a", "1")) == two(("x-a", "1"), ("accept", "json")));
        // A repeated field's values in another order are not.
        assert!(
            two(("accept", "json"), ("accept", "xml"))
                != two(("accept", "xml"), ("accept", "json"))
        );
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
        let mut http2 = base();
        *http2.version_mut() = Version::HTTP_2;
        assert!(key(&base()) != key(&http2));
        // Another partition (client, stack, identity) never shares.
        let hasher = RANDOM.with(|s| s.clone());
        let in_partition = |p: Partition| FlightKey::of(&base(), &p, &hasher);
        assert!(in_partition(Partition::Own(1)) != in_partition(Partition::Own(2)));
        assert!(
            in_partition(Partition::Named("a".into()))
                != in_partition(Partition::Named("b".into()))
        );
        assert!(
            in_partition(Partition::Named("a".into()))
                == in_partition(Partition::Named("a".into()))
        );
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
