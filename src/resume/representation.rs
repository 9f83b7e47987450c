//! When a response body can be resumed, and whether a `206` continues it: pure checks on
//! headers, no I/O.
//!
//! A resumed body is spliced from two responses, so both must be byte ranges of one
//! representation, counted in the bytes the wire carries:
//!
//! - the request is a `GET` without a `Range` of its own, answered `200`;
//! - `Accept-Ranges: bytes` (RFC 9110 §14.3): the server serves byte ranges;
//! - a strong validator for `If-Range` (§13.1.5): a strong `ETag`, or a `Last-Modified` at
//!   least one second older than the response's `Date` (§8.8.2.2: then it is strong);
//!   with `If-Range`, a server whose representation changed answers `200` with the new
//!   one instead of a range of it;
//! - a `Content-Length`: the offset to resume from and the length to check at the end;
//! - no `Content-Encoding`: reqwest's automatic decompression (features `gzip`, `brotli`,
//!   `zstd`, `deflate`) removes both headers and counts *decoded* bytes, so an offset taken
//!   from them would splice at the wrong place (and without `Content-Length` no resume is
//!   attempted at all).
//!
//! The answer to `Range: bytes=N-` continues the body only when it is `206` with
//! `Content-Range: bytes N-(len-1)/len` of the same `len`, no `Content-Encoding`, and
//! (when the first had one) the same `ETag`.

use http::header::{
    ACCEPT_RANGES, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE, DATE, ETAG, LAST_MODIFIED,
    RANGE,
};
use http::{HeaderMap, HeaderValue, Method, StatusCode};

/// A body that can be resumed: its length and the validator that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Representation {
    /// The body's length (`Content-Length`).
    pub(crate) total: u64,
    /// What `If-Range` carries: the strong `ETag`, else the `Last-Modified`.
    pub(crate) validator: HeaderValue,
    /// The strong `ETag`, when there is one.
    pub(crate) etag: Option<HeaderValue>,
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
    let etag = headers.get(ETAG).filter(|v| is_strong_etag(v)).cloned();
    let validator = match &etag {
        Some(etag) => etag.clone(),
        None => strong_last_modified(headers)?,
    };
    Some(Representation {
        total,
        validator,
        etag,
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
    if repr.etag.is_some() && headers.get(ETAG) != repr.etag.as_ref() {
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

/// The `Last-Modified`, when it is at least one second older than `Date` (RFC 9110
/// §8.8.2.2: then it is a strong validator).
fn strong_last_modified(headers: &HeaderMap) -> Option<HeaderValue> {
    let value = headers.get(LAST_MODIFIED)?;
    let modified = httpdate::parse_http_date(value.to_str().ok()?).ok()?;
    let date = httpdate::parse_http_date(headers.get(DATE)?.to_str().ok()?).ok()?;
    let age = date.duration_since(modified).ok()?;
    (age >= std::time::Duration::from_secs(1)).then(|| value.clone())
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
    fn last_modified_is_strong_only_a_second_before_date() {
        let mut pairs = vec![("accept-ranges", "bytes"), ("content-length", "100")];
        pairs.push(("last-modified", "Tue, 01 Dec 2026 10:00:00 GMT"));
        pairs.push(("date", "Tue, 01 Dec 2026 10:00:01 GMT"));
        let repr = check(&pairs).unwrap();
        assert_eq!(repr.validator, "Tue, 01 Dec 2026 10:00:00 GMT");
        assert_eq!(repr.etag, None);
        pairs[3] = ("date", "Tue, 01 Dec 2026 10:00:00 GMT");
        assert_eq!(check(&pairs), None, "modified in the same second as sent");
        pairs.pop();
        assert_eq!(check(&pairs), None, "no Date to compare with");
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
