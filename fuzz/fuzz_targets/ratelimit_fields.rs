//! Fuzzes `ratelimit_fields::parse`: whatever a server sends in the seven rate-limit
//! fields, it must never panic, and what it returns must be usable as it is: a quota of
//! at least one request per window of at least a second, and a wait only when nothing
//! remains.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use reqwest_resilience::ratelimit_fields;

const FIELDS: [&str; 7] = [
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
];

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    // One value per line, in the order of FIELDS; values a header cannot hold are skipped.
    for (name, value) in FIELDS.iter().zip(data.split(|&b| b == b'\n')) {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.insert(*name, value);
        }
    }
    let now = UNIX_EPOCH + Duration::from_secs(1_445_412_480);
    let Ok(fields) = ratelimit_fields::parse(&headers, now) else {
        return;
    };
    if let Some(q) = fields.quota {
        assert!(q.limit >= 1);
        assert!(q.window >= Duration::from_secs(1));
    }
    if let Some(wait) = fields.exhausted_for() {
        assert_eq!(fields.remaining, Some(0));
        assert!(!wait.is_zero());
    }
    // Parsing is deterministic.
    assert_eq!(ratelimit_fields::parse(&headers, now), Ok(fields));
});
