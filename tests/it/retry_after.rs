//! Property tests for `retry_after::parse`: total on any input, and exact on every form it
//! accepts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use reqwest_resilience::retry_after;

/// The longest value `retry_after::parse` looks at (its docs: 64 bytes).
const MAX_LEN: usize = 64;

/// Any instant from 1970 to the end of 9999, whole seconds (HTTP-dates have no fraction).
fn instant() -> impl Strategy<Value = SystemTime> {
    (0u64..253_402_300_800).prop_map(|s| UNIX_EPOCH + Duration::from_secs(s))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn never_panics_on_any_string(s in any::<String>(), now in instant()) {
        let _ = retry_after::parse(&s, now);
    }

    #[test]
    fn never_panics_on_date_shaped_ascii(
        s in "[A-Za-z]{0,9},? {0,2}[0-9]{0,3}[ -]?[A-Za-z]{0,4}[ -]?[0-9]{0,5} [0-9:]{0,9} ?[+-]?[0-9A-Z]{0,5}",
        now in instant(),
    ) {
        let _ = retry_after::parse(&s, now);
    }

    #[test]
    fn delta_seconds_roundtrip(n in any::<u64>(), pad_l in "[ \t]{0,3}", pad_r in "[ \t]{0,3}") {
        let v = format!("{pad_l}{n}{pad_r}");
        prop_assert_eq!(retry_after::parse(&v, UNIX_EPOCH), Some(Duration::from_secs(n)));
    }

    #[test]
    fn signed_or_fractional_numbers_are_none(n in any::<u32>(), f in 0u32..1000) {
        prop_assert_eq!(retry_after::parse(&format!("-{n}"), UNIX_EPOCH), None);
        prop_assert_eq!(retry_after::parse(&format!("+{n}"), UNIX_EPOCH), None);
        prop_assert_eq!(retry_after::parse(&format!("{n}.{f}"), UNIX_EPOCH), None);
    }

    #[test]
    fn over_long_values_are_none(extra in 1usize..200, digit in 0u8..10) {
        let v = String::from(char::from(b'0' + digit)).repeat(MAX_LEN + extra);
        prop_assert_eq!(retry_after::parse(&v, UNIX_EPOCH), None);
    }

    #[test]
    fn imf_fixdate_roundtrips(now in instant(), ahead in 0u64..10_000_000) {
        let at = now + Duration::from_secs(ahead);
        prop_assume!(at < UNIX_EPOCH + Duration::from_secs(253_402_300_800));
        let v = httpdate::fmt_http_date(at);
        prop_assert_eq!(retry_after::parse(&v, now), Some(Duration::from_secs(ahead)));
    }

    #[test]
    fn past_dates_are_zero(now in instant(), behind in 1u64..10_000_000) {
        // Clamped to the epoch: `fmt_http_date` cannot write an earlier instant.
        let since_epoch = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let at = UNIX_EPOCH + Duration::from_secs(since_epoch.saturating_sub(behind));
        let v = httpdate::fmt_http_date(at);
        prop_assert_eq!(retry_after::parse(&v, now), Some(Duration::ZERO));
    }

    /// The same instant written with a numeric zone parses to the same delay as its
    /// IMF-fixdate, for every zone from -23:59 to +23:59.
    #[test]
    fn numeric_zone_agrees_with_imf_fixdate(
        secs in 86_400u64..253_402_214_400, // a day of margin at both ends for the zone shift
        zone_minutes in -1439i64..=1439, // -23:59 ..= +23:59
    ) {
        let at = UNIX_EPOCH + Duration::from_secs(secs);
        let local = UNIX_EPOCH
            + Duration::from_secs((secs as i64 + zone_minutes * 60) as u64);
        // "Wed, 21 Oct 2015 07:28:00 GMT" → replace "GMT" with the numeric zone.
        let shifted = httpdate::fmt_http_date(local);
        let sign = if zone_minutes < 0 { '-' } else { '+' };
        let z = zone_minutes.abs();
        let v = format!("{} {sign}{:02}{:02}", &shifted[..shifted.len() - 4], z / 60, z % 60);
        prop_assert_eq!(retry_after::parse(&v, UNIX_EPOCH), Some(at.duration_since(UNIX_EPOCH).unwrap()), "{}", v);
    }
}
