//! Fuzzes `Origin::parse`: it must never panic, and an origin it returns must be the
//! normalised `scheme://host:port` its accessors describe, stable under re-parsing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reqwest_resilience::Origin;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(origin) = Origin::parse(text) else {
        return;
    };
    // The text is exactly what the accessors say.
    assert_eq!(
        origin.as_str(),
        format!("{}://{}:{}", origin.scheme(), origin.host(), origin.port())
    );
    assert_eq!(origin.to_string(), origin.as_str());
    assert!(!origin.host().is_empty());
    assert_eq!(origin.scheme(), origin.scheme().to_ascii_lowercase());
    // Normalisation is idempotent: the origin's own text names the same origin, so a
    // breaker filed under it is found again.
    let again = Origin::parse(origin.as_str()).expect("an origin's text re-parses");
    assert_eq!(again, origin);
    assert_eq!(again.host(), origin.host());
    assert_eq!(again.port(), origin.port());
    // The same URL through `from_url` gives the same origin.
    let url = reqwest::Url::parse(text).expect("parsed once already");
    assert_eq!(Origin::from_url(&url).as_ref(), Ok(&origin));
});
