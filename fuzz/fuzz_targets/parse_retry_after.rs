//! Fuzzes `retry_after::parse`: it must never panic, and what it accepts must be consistent.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use reqwest_resilience::retry_after;

fuzz_target!(|data: &[u8]| {
    // The first 8 bytes choose "now" (any instant up to the year 9999), the rest is the value.
    if data.len() < 8 {
        return;
    }
    let (clock, value) = data.split_at(8);
    let secs = u64::from_le_bytes(clock.try_into().unwrap()) % 253_402_300_800;
    let now = UNIX_EPOCH + Duration::from_secs(secs);
    let Ok(value) = std::str::from_utf8(value) else {
        return;
    };
    let parsed = retry_after::parse(value, now);
    if let Some(delay) = parsed {
        // Accepted input is short ASCII, and trimming it does not change the answer.
        assert!(value.is_ascii());
        assert!(value.trim().len() <= 64); // the documented bound
        assert_eq!(retry_after::parse(value.trim(), now), Some(delay));
        // A date is never further away from a later "now".
        if !value.trim().bytes().all(|b| b.is_ascii_digit()) {
            let later = now + Duration::from_secs(1);
            let again = retry_after::parse(value, later).unwrap();
            assert!(again <= delay);
        }
    }
});
