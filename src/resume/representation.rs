//! When a response body can be resumed, and whether a `206` continues it: pure checks on
//! headers, no I/O.
//!
//! A resumed body is spliced from two responses, so both must be byte ranges of one
//! representation, counted in the bytes the wire carries:
//!
//! - the request is a `GET` without a `Range` of its own, answered `200`;
//! - `Accept-Ranges: bytes` (RFC 9110 §14.3): the server serves byte ranges;
//! - a strong validator for `If-Range` (§13.1.5): a strong `ETag`; or, when the response
//!   has no `ETag` at all (a client holding an entity tag, even a weak one, must not send
//!   a date in `If-Range`), a `Last-Modified` at least 60 seconds older than the
//!   response's `Date` (§8.8.2.2: a client may use it as strong only then; one second is
//!   the origin server's own rule, and 60 guards against `Date` and `Last-Modified` coming
//!   from different clocks); with `If-Range`, a server whose representation changed
//!   answers `200` with the new one instead of a range of it;
//! - a `Content-Length`: the offset to resume from and the length to check at the end;
//! - no `Content-Encoding`: reqwest's automatic decompression (features `gzip`, `brotli`,
//!   `zstd`, `deflate`) removes both headers and counts *decoded* bytes, so an offset taken
//!   from them would splice at the wrong place (and without `Content-Length` no resume is
//!   attempted at all).
//!
//! The answer to `Range: bytes=N-` continues the body only when it is `206` with
//! `Content-Range: bytes N-(len-1)/len` of the same `len`, no `Content-Encoding`, and the
//! first answer's validator: the same `ETag`, or (validated by date) the same
//! `Last-Modified`. A server may ignore `If-Range` and answer a range of whatever it holds
//! now: a `206` without the validator, or with another one, is never spliced.

use http::header::{
    ACCEPT_RANGES, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE, DATE, ETAG, LAST_MODIFIED,
    RANGE,
};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use std::time::{Duration, SystemTime};

/// A body that can be resumed: its length and the validator that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Representation {
    /// The body's length (`Content-Length`).
    pub(crate) total: u64,
    /// What `If-Range` carries: the strong `ETag`, else the `Last-Modified`.
    pub(crate) validator: HeaderValue,
    /// The strong `ETag`, when there is one.
    pub(crate) etag: Option<HeaderValue>,
    /// The `Last-Modified`, when it is the validator (no `ETag`).
    pub(crate) last_modified: Option<SystemTime>,
}

/// The representation a response to a request (`method`, `request` headers) answered
/// with `status` and `headers` is, when its body can be resumed (see the module docs).
pub(crate) fn resumable(
    method: &Method,
    request: &HeaderMap,
    status: StatusCode,
    headers: &HeaderMap,
) -> Option<Representation> {
    if *method != Method::GET || request.contains_key(RANGE) || status != StatusCode::OK {
        return None;
    }
    let ranges = headers.get(ACCEPT_RANGES)?.to_str().ok()?;
    if !ranges
        .split(',')
        .any(|unit| unit.trim().eq_ignore_ascii_case("bytes"))
    {
        return None;
    }
    if encoded(headers) {
        return None;
    }
    let total = content_length(headers).filter(|n| *n > 0)?;
    let (validator, etag, last_modified) = match headers.get(ETAG) {
        Some(etag) if is_strong_etag(etag) => (etag.clone(), Some(etag.clone()), None),
        // A weak tag: no `If-Range` may carry it, nor a date in its place (§13.1.5).
        Some(_) => return None,
        None => {
            let (value, at) = strong_last_modified(headers)?;
            (value, None, Some(at))
        }
    };
    Some(Representation {
        total,
        validator,
        etag,
        last_modified,
    })
}

/// Whether `status` and `headers`, the answer to `Range: bytes={from}-`, continue `repr`
/// at byte `from`.
pub(crate) fn continues(
    repr: &Representation,
    from: u64,
    status: StatusCode,
    headers: &HeaderMap,
) -> bool {
    if status != StatusCode::PARTIAL_CONTENT || encoded(headers) {
        return false;
    }
    let same_validator = match (&repr.etag, repr.last_modified) {
        (Some(etag), _) => headers.get(ETAG) == Some(etag),
        (None, Some(at)) => last_modified(headers) == Some(at),
        (None, None) => false,
    };
    if !same_validator {
        return false;
    }
    let expected = format!("bytes {from}-{}/{}", repr.total - 1, repr.total);
    let range_ok = headers
        .get(CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim() == expected);
    let length_ok = content_length(headers).is_none_or(|n| n == repr.total - from);
    range_ok && length_ok
}

/// The `Range` header that asks for the body from byte `from` on.
pub(crate) fn range_from(from: u64) -> HeaderValue {
    HeaderValue::from_str(&format!("bytes={from}-"))
        .unwrap_or_else(|_| unreachable!("digits are a valid header value"))
}

/// Whether the body is encoded (anything but `identity`).
fn encoded(headers: &HeaderMap) -> bool {
    headers.get_all(CONTENT_ENCODING).iter().any(|v| {
        v.to_str()
            .map_or(true, |v| !v.trim().eq_ignore_ascii_case("identity"))
    })
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A strong entity tag: `"…"`, not `W/"…"` (RFC 9110 §8.8.3).
fn is_strong_etag(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    bytes.len() >= 2 && bytes[0] == b'"' && bytes[bytes.len() - 1] == b'"'
}

/// How much older than `Date` a `Last-Modified` must be for a client to use it as a strong
/// validator (RFC 9110 §8.8.2.2).
const STRONG_LAST_MODIFIED_AGE: Duration = Duration::from_secs(60);

/// The `Last-Modified` (as sent, and as a time), when it is at least
/// [`STRONG_LAST_MODIFIED_AGE`] older than `Date`: then a client may use it as a strong
/// validator.
fn strong_last_modified(headers: &HeaderMap) -> Option<(HeaderValue, SystemTime)> {
    let modified = last_modified(headers)?;
    let date = httpdate::parse_http_date(headers.get(DATE)?.to_str().ok()?).ok()?;
    let age = date.duration_since(modified).ok()?;
    (age >= STRONG_LAST_MODIFIED_AGE).then(|| (headers[LAST_MODIFIED].clone(), modified))
}

/// The `Last-Modified`, parsed.
fn last_modified(headers: &HeaderMap) -> Option<SystemTime> {
    httpdate::parse_http_date(headers.get(LAST_MODIFIED)?.to_str().ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    const GOOD: &[(&str, &str)] = &[
        ("accept-ranges", "bytes"),
        ("etag", "\"v1\""),
        ("content-length", "100"),
    ];

    fn check(pairs: &[(&str, &str)]) -> Option<Representation> {
        resumable(
            &Method::GET,
            &HeaderMap::new(),
            StatusCode::OK,
            &headers(pairs),
        )
    }

    #[test]
    fn a_get_answered_200_with_ranges_a_strong_etag_and_a_length_is_resumable() {
        let repr = check(GOOD).unwrap();
        assert_eq!(repr.total, 100);
        assert_eq!(repr.validator, "\"v1\"");
        assert_eq!(
            repr.etag.as_ref().map(|v| v.as_bytes()),
            Some(&b"\"v1\""[..])
        );
    }

    #[test]
    fn each_missing_condition_makes_it_not_resumable() {
        let without = |name: &str| -> Vec<(&str, &str)> {
            GOOD.iter().copied().filter(|(n, _)| *n != name).collect()
        };
        assert_eq!(check(&without("accept-ranges")), None);
        assert_eq!(check(&without("etag")), None, "no validator");
        assert_eq!(check(&without("content-length")), None);
        let mut weak = without("etag");
        weak.push(("etag", "W/\"v1\""));
        assert_eq!(check(&weak), None, "a weak ETag");
        let mut none = without("accept-ranges");
        none.push(("accept-ranges", "none"));
        assert_eq!(check(&none), None);
        let mut gzip = GOOD.to_vec();
        gzip.push(("content-encoding", "gzip"));
        assert_eq!(check(&gzip), None, "an encoded body");
        let mut identity = GOOD.to_vec();
        identity.push(("content-encoding", "identity"));
        assert!(check(&identity).is_some());
        let h = headers(GOOD);
        assert_eq!(
            resumable(&Method::POST, &HeaderMap::new(), StatusCode::OK, &h),
            None
        );
        assert_eq!(
            resumable(
                &Method::GET,
                &HeaderMap::new(),
                StatusCode::PARTIAL_CONTENT,
                &h
            ),
            None
        );
        let ranged = headers(&[("range", "bytes=10-")]);
        assert_eq!(
            resumable(&Method::GET, &ranged, StatusCode::OK, &h),
            None,
            "the caller's own range"
        );
    }

    #[test]
    fn last_modified_is_strong_only_a_minute_before_date() {
        let mut pairs = vec![("accept-ranges", "bytes"), ("content-length", "100")];
        pairs.push(("last-modified", "Tue, 01 Dec 2026 10:00:00 GMT"));
        pairs.push(("date", "Tue, 01 Dec 2026 10:01:00 GMT"));
        let repr = check(&pairs).unwrap();
        assert_eq!(repr.validator, "Tue, 01 Dec 2026 10:00:00 GMT");
        assert_eq!(repr.etag, None);
        // One second is the origin server's rule; a client needs 60 (RFC 9110 §8.8.2.2).
        pairs[3] = ("date", "Tue, 01 Dec 2026 10:00:59 GMT");
        assert_eq!(check(&pairs), None, "modified 59 s before it was sent");
        pairs[3] = ("date", "Tue, 01 Dec 2026 10:00:00 GMT");
        assert_eq!(check(&pairs), None, "modified in the same second as sent");
        pairs.pop();
        assert_eq!(check(&pairs), None, "no Date to compare with");
        // A weak ETag beside a strong date: If-Range may carry neither (§13.1.5).
        pairs.push(("date", "Tue, 01 Dec 2026 11:00:00 GMT"));
        pairs.push(("etag", "W/\"v1\""));
        assert_eq!(check(&pairs), None, "a weak ETag and a date");
    }

    #[test]
    fn a_206_validated_by_date_continues_only_with_the_same_last_modified() {
        let repr = check(&[
            ("accept-ranges", "bytes"),
            ("content-length", "100"),
            ("last-modified", "Tue, 01 Dec 2026 10:00:00 GMT"),
            ("date", "Tue, 01 Dec 2026 11:00:00 GMT"),
        ])
        .unwrap();
        let range = |last_modified: Option<&'static str>| {
            let mut pairs = vec![("content-range", "bytes 40-99/100")];
            pairs.extend(last_modified.map(|lm| ("last-modified", lm)));
            headers(&pairs)
        };
        let same = range(Some("Tue, 01 Dec 2026 10:00:00 GMT"));
        assert!(continues(&repr, 40, StatusCode::PARTIAL_CONTENT, &same));
        // The same instant in another of the three date forms is the same validator.
        let asctime = range(Some("Tue Dec  1 10:00:00 2026"));
        assert!(continues(&repr, 40, StatusCode::PARTIAL_CONTENT, &asctime));
        // A server that ignored If-Range: a range of the changed representation.
        let later = range(Some("Tue, 01 Dec 2026 10:30:00 GMT"));
        assert!(!continues(&repr, 40, StatusCode::PARTIAL_CONTENT, &later));
        assert!(!continues(
            &repr,
            40,
            StatusCode::PARTIAL_CONTENT,
            &range(None)
        ));
        let garbage = range(Some("yesterday"));
        assert!(!continues(&repr, 40, StatusCode::PARTIAL_CONTENT, &garbage));
    }

    #[test]
    fn only_a_206_with_the_exact_content_range_continues() {
        let repr = check(GOOD).unwrap();
        let ok = headers(&[
            ("content-range", "bytes 40-99/100"),
            ("etag", "\"v1\""),
            ("content-length", "60"),
        ]);
        assert!(continues(&repr, 40, StatusCode::PARTIAL_CONTENT, &ok));
        assert!(
            !continues(&repr, 40, StatusCode::OK, &ok),
            "never splice a 200"
        );
        assert!(
            !continues(&repr, 41, StatusCode::PARTIAL_CONTENT, &ok),
            "another offset"
        );
        let other_len = headers(&[("content-range", "bytes 40-119/120"), ("etag", "\"v1\"")]);
        assert!(!continues(
            &repr,
            40,
            StatusCode::PARTIAL_CONTENT,
            &other_len
        ));
        let other_tag = headers(&[("content-range", "bytes 40-99/100"), ("etag", "\"v2\"")]);
        assert!(!continues(
            &repr,
            40,
            StatusCode::PARTIAL_CONTENT,
            &other_tag
        ));
        let short = headers(&[
            ("content-range", "bytes 40-99/100"),
            ("etag", "\"v1\""),
            ("content-length", "10"),
        ]);
        assert!(!continues(&repr, 40, StatusCode::PARTIAL_CONTENT, &short));
        let garbage = headers(&[("content-range", "bytes */100"), ("etag", "\"v1\"")]);
        assert!(!continues(&repr, 40, StatusCode::PARTIAL_CONTENT, &garbage));
        assert_eq!(range_from(40), "bytes=40-");
    }
}
