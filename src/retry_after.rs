//! `Retry-After` parsing (RFC 9110 §10.2.3): pure, total, and never panicking.
//!
//! A server says how long to wait either as delta-seconds (`120`) or as an HTTP-date. This
//! parser accepts every form a real server sends:
//!
//! | form | example |
//! |---|---|
//! | delta-seconds | `120` |
//! | IMF-fixdate (RFC 9110 §5.6.7) | `Wed, 21 Oct 2015 07:28:00 GMT` |
//! | obsolete RFC 850 | `Wednesday, 21-Oct-15 07:28:00 GMT` |
//! | obsolete asctime | `Wed Oct 21 07:28:00 2015` |
//! | RFC 1123 / RFC 5322 with a numeric zone | `Wed, 21 Oct 2015 07:28:00 +0800` |
//!
//! The first four are what RFC 9110 allows (parsed by the `httpdate` crate). The numeric
//! zone is not an HTTP-date, but servers that format dates with a mail library send it
//! (RFC 5322 §3.3), and ignoring it would turn a server-directed pause into a retry storm.
//!
//! Anything else is `None`: negative (`-5`), fractional (`1.5`), signed (`+5`), overflowing
//! (more than `u64::MAX` seconds), empty, non-ASCII, or longer than 64 bytes (after trimming
//! surrounding whitespace). The caller then falls back to its own backoff. A date in the past is `Some(Duration::ZERO)`.
//!
//! The result is uncapped: capping (and whether to clamp or give up) is the retry policy's
//! job, not the parser's.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest value (after trimming surrounding whitespace) this parser looks at.
///
/// The longest valid form, RFC 850 with `Wednesday`, is 33 bytes; 64 leaves room for
/// optional spacing and still refuses a header stuffed with junk without scanning it.
pub(crate) const MAX_LEN: usize = 64;

/// Parses a `Retry-After` value into a delay from `now` (uncapped).
///
/// Returns `None` for anything that is not a valid value (see the [module docs](self)),
/// and `Some(Duration::ZERO)` for a date at or before `now`.
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use reqwest_resilience::retry_after;
///
/// // 2015-10-21T07:28:00Z
/// let now = UNIX_EPOCH + Duration::from_secs(1_445_412_480);
/// assert_eq!(retry_after::parse(" 120 ", now), Some(Duration::from_secs(120)));
/// assert_eq!(
///     retry_after::parse("Wed, 21 Oct 2015 07:29:00 GMT", now),
///     Some(Duration::from_secs(60))
/// );
/// // 07:28 at +0800 is 23:28 UTC the day before: in the past.
/// assert_eq!(retry_after::parse("Wed, 21 Oct 2015 07:28:00 +0800", now), Some(Duration::ZERO));
/// assert_eq!(retry_after::parse("-1", now), None);
/// assert_eq!(retry_after::parse("1.5", now), None);
/// ```
pub fn parse(value: &str, now: SystemTime) -> Option<Duration> {
    // Checked before trimming so `str::trim` never sees Unicode whitespace as "surrounding".
    if !value.is_ascii() {
        return None;
    }
    let v = value.trim();
    if v.is_empty() || v.len() > MAX_LEN {
        return None;
    }
    if v.bytes().all(|b| b.is_ascii_digit()) {
        // All digits, so the only possible failure is overflow.
        return v.parse::<u64>().ok().map(Duration::from_secs);
    }
    let at = match httpdate::parse_http_date(v) {
        Ok(at) => at,
        Err(_) => parse_numeric_zone_date(v)?,
    };
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `[day-name ","] day month year hour ":" minute [":" second] zone` where `zone` is
/// `+hhmm` or `-hhmm` (RFC 5322 §3.3), e.g. `Wed, 21 Oct 2015 07:28:00 +0800`.
///
/// Fields are separated by runs of spaces or tabs. When the day name is present it must be
/// the date's actual weekday, as `httpdate` also insists: a contradiction means the value
/// was not produced by a clock, and guessing which half is right would be a coin toss.
fn parse_numeric_zone_date(v: &str) -> Option<SystemTime> {
    let mut fields = v.split([' ', '\t']).filter(|f| !f.is_empty());
    let mut first = fields.next()?;
    let weekday = match first.strip_suffix(',') {
        Some(name) => {
            first = fields.next()?;
            Some(weekday_index(name)?)
        }
        None => None,
    };
    let day = number(first, 1, 2)?;
    let month = month_index(fields.next()?)?;
    let year = number(fields.next()?, 4, 4)?;
    let mut time = fields.next()?.split(':');
    let hour = number(time.next()?, 2, 2)?;
    let minute = number(time.next()?, 2, 2)?;
    let second = match time.next() {
        Some(s) => number(s, 2, 2)?,
        None => 0,
    };
    if time.next().is_some() {
        return None;
    }
    let zone = fields.next()?;
    if fields.next().is_some() {
        return None;
    }
    let offset_secs = zone_offset_secs(zone)?;

    // Leap seconds (60) are refused, as httpdate refuses them.
    if !(1970..=9999).contains(&year)
        || !(1..=days_in_month(year, month)).contains(&day)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    let days = days_from_civil(year, month, day);
    if let Some(w) = weekday {
        // 1970-01-01 was a Thursday (index 3 with Monday = 0).
        if (days + 3).rem_euclid(7) != i64::from(w) {
            return None;
        }
    }
    let local = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second);
    // A local time at +0800 is 8 hours ahead of UTC.
    let utc = local - offset_secs;
    // Before the epoch is "in the past" for any plausible clock: clamp to the epoch.
    let since_epoch = u64::try_from(utc).unwrap_or(0);
    UNIX_EPOCH.checked_add(Duration::from_secs(since_epoch))
}

/// A run of `min..=max` ASCII digits.
fn number(s: &str, min: usize, max: usize) -> Option<u32> {
    if !(min..=max).contains(&s.len()) || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `+hhmm` / `-hhmm` as signed seconds east of UTC.
fn zone_offset_secs(zone: &str) -> Option<i64> {
    let (sign, digits) = match zone.as_bytes().first()? {
        b'+' => (1, &zone[1..]),
        b'-' => (-1, &zone[1..]),
        _ => return None,
    };
    let hhmm = number(digits, 4, 4)?;
    let (hours, minutes) = (hhmm / 100, hhmm % 100);
    if hours > 23 || minutes > 59 {
        return None;
    }
    Some(sign * i64::from(hours * 3600 + minutes * 60))
}

fn weekday_index(name: &str) -> Option<u32> {
    const NAMES: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    NAMES
        .iter()
        .position(|n| n.eq_ignore_ascii_case(name))
        .map(|i| i as u32)
}

fn month_index(name: &str) -> Option<u32> {
    const NAMES: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    NAMES
        .iter()
        .position(|n| n.eq_ignore_ascii_case(name))
        .map(|i| i as u32 + 1)
}

fn is_leap(year: u32) -> bool {
    year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: u32, month: u32, day: u32) -> i64 {
    let y = i64::from(year) - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2015-10-21T07:28:00Z, the date RFC 9110 uses in its examples.
    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_445_412_480)
    }

    fn secs(n: u64) -> Option<Duration> {
        Some(Duration::from_secs(n))
    }

    #[test]
    fn delta_seconds_with_surrounding_whitespace() {
        assert_eq!(parse("0", now()), secs(0));
        assert_eq!(parse("120", now()), secs(120));
        assert_eq!(parse(" \t120 \t", now()), secs(120));
        assert_eq!(parse("007", now()), secs(7));
        assert_eq!(parse("18446744073709551615", now()), secs(u64::MAX));
    }

    #[test]
    fn malformed_delta_seconds_are_none() {
        for bad in [
            "",
            "   ",
            "-1",
            "+5",
            "1.5",
            "1e3",
            "12 3",
            "0x10",
            "١٢",
            "120s",
            "18446744073709551616", // u64::MAX + 1
        ] {
            assert_eq!(parse(bad, now()), None, "{bad:?}");
        }
    }

    #[test]
    fn over_long_and_non_ascii_values_are_none() {
        assert_eq!(parse(&"1".repeat(MAX_LEN + 1), now()), None);
        assert_eq!(parse(&"9".repeat(MAX_LEN), now()), None); // overflows first
        assert_eq!(parse("Wed, 21 Oct 2015 07:29:00 GMT\u{a0}", now()), None);
        assert_eq!(parse("\u{2003}5", now()), None);
    }

    #[test]
    fn the_three_http_date_forms() {
        assert_eq!(parse("Wed, 21 Oct 2015 07:29:00 GMT", now()), secs(60));
        assert_eq!(parse("Wednesday, 21-Oct-15 07:30:00 GMT", now()), secs(120));
        assert_eq!(parse("Wed Oct 21 07:28:30 2015", now()), secs(30));
        assert_eq!(
            parse("  Wed, 21 Oct 2015 08:28:00 GMT  ", now()),
            secs(3600)
        );
    }

    #[test]
    fn numeric_zones_are_converted_to_utc() {
        // 15:28 at +0800 is 07:28 UTC: now.
        assert_eq!(parse("Wed, 21 Oct 2015 15:28:00 +0800", now()), secs(0));
        assert_eq!(parse("Wed, 21 Oct 2015 15:29:00 +0800", now()), secs(60));
        // 03:30 at -0400 is 07:30 UTC.
        assert_eq!(parse("Wed, 21 Oct 2015 03:30:00 -0400", now()), secs(120));
        assert_eq!(parse("Wed, 21 Oct 2015 07:28:10 +0000", now()), secs(10));
        assert_eq!(parse("Wed, 21 Oct 2015 07:28:10 -0000", now()), secs(10));
        // Half-hour zone: 12:58:10 at +0530 is 07:28:10 UTC.
        assert_eq!(parse("Wed, 21 Oct 2015 12:58:10 +0530", now()), secs(10));
        // Day name optional, one-digit day, seconds optional, tabs and double spaces.
        assert_eq!(parse("21 Oct 2015 07:29 +0000", now()), secs(60));
        assert_eq!(parse("Thu,  1 Jan 1970 00:00:00 +0000", now()), secs(0));
        assert_eq!(parse("Wed,\t21 Oct 2015 07:29:00 +0000", now()), secs(60));
        // Crossing a day boundary backwards: 00:30 on the 22nd at +0900 is 15:30 on the 21st.
        assert_eq!(
            parse("Thu, 22 Oct 2015 00:30:00 +0900", now()),
            secs(8 * 3600 + 120)
        );
    }

    #[test]
    fn malformed_numeric_zone_dates_are_none() {
        for bad in [
            "Thu, 21 Oct 2015 07:29:00 +0800", // wrong weekday
            "Wed, 21 Oct 2015 07:29:00 +2400", // zone hours
            "Wed, 21 Oct 2015 07:29:00 +0860", // zone minutes
            "Wed, 21 Oct 2015 07:29:00 +080",  // short zone
            "Wed, 21 Oct 2015 07:29:00 0800",  // unsigned zone
            "Wed, 21 Oct 2015 07:29:00",       // no zone
            "Wed, 21 Oct 2015 24:00:00 +0000",
            "Wed, 21 Oct 2015 07:60:00 +0000",
            "Wed, 21 Oct 2015 07:29:60 +0000", // leap second
            "Wed, 21 Oct 2015 07:29:00:00 +0000",
            "Sat, 29 Feb 2015 07:29:00 +0000", // not a leap year
            "Wed, 32 Oct 2015 07:29:00 +0000",
            "Wed, 21 Foo 2015 07:29:00 +0000",
            "Wed, 21 Oct 15 07:29:00 +0000", // two-digit year
            "Wed, 21 Oct 1969 07:29:00 +0000",
            "Wed, 21 Oct 2015 07:29:00 +0000 extra",
            "Wed 21 Oct 2015 07:29:00 +0000", // day name without comma
            "Wed, 21 Oct 2015 7:29:00 +0000",
            "Wed, 21 Oct 2015 +0000",
            ",",
            "+",
            "Wed,",
        ] {
            assert_eq!(parse(bad, now()), None, "{bad:?}");
        }
    }

    #[test]
    fn leap_days_are_accepted() {
        // 2016-02-29 was a Monday; 2000-02-29 a Tuesday.
        let t = parse("Mon, 29 Feb 2016 00:00:00 +0000", UNIX_EPOCH).unwrap();
        assert_eq!(t.as_secs(), 1_456_704_000);
        let t = parse("Tue, 29 Feb 2000 00:00:00 +0000", UNIX_EPOCH).unwrap();
        assert_eq!(t.as_secs(), 951_782_400);
    }

    #[test]
    fn a_past_date_is_zero() {
        assert_eq!(parse("Wed, 21 Oct 2015 07:27:00 GMT", now()), secs(0));
        assert_eq!(parse("Thu, 01 Jan 1970 00:00:00 GMT", now()), secs(0));
        // Before the epoch once the zone is applied.
        assert_eq!(parse("Thu, 1 Jan 1970 00:00:00 +0100", now()), secs(0));
    }

    #[test]
    fn days_from_civil_matches_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(9999, 12, 31), 2_932_896);
    }
}
