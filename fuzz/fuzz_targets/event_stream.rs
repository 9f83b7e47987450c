//! Fuzzes the event-stream parser (`stream::EventParser`): no panic on any bytes, and
//! chunking invariance: the same bytes fed whole, byte by byte, or split at the points
//! the input's first bytes choose give the same events, the same last event id and the
//! same reconnection time.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reqwest_resilience::stream::{Event, EventParser};

fn run(chunks: &[&[u8]]) -> (Vec<Event>, String, Option<std::time::Duration>) {
    let mut parser = EventParser::new();
    let mut events = Vec::new();
    for chunk in chunks {
        parser.feed(chunk);
        events.extend(std::iter::from_fn(|| parser.next_event()));
    }
    (events, parser.last_event_id().to_owned(), parser.reconnection_time())
}

fuzz_target!(|data: &[u8]| {
    // The first two bytes choose two split points; the rest is the stream.
    let (points, input) = data.split_at(data.len().min(2));
    let whole = run(&[input]);
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    assert_eq!(run(&bytes), whole, "byte by byte");
    let mut cut: Vec<usize> = points
        .iter()
        .map(|&p| usize::from(p) % (input.len() + 1))
        .collect();
    cut.sort_unstable();
    let (a, b) = (cut.first().copied().unwrap_or(0), cut.last().copied().unwrap_or(0));
    assert_eq!(run(&[&input[..a], &input[a..b], &input[b..]]), whole, "split at {a}, {b}");
    for event in &whole.0 {
        assert!(!event.id.contains('\0'), "an id with NUL is ignored");
        assert!(!event.data.contains('\r'), "lines end at CR");
    }
});
