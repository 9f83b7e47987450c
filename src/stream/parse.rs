//! The event-stream parser: bytes in, [`Event`]s out, as the HTML standard's
//! "Server-sent events" section interprets `text/event-stream`.
//!
//! Every rule is the standard's (§9.2.6 "Interpreting an event stream"):
//!
//! - lines end with `\n`, `\r\n` or `\r`; a `\r\n` split between two chunks is one line
//!   end, and a `\r` at a chunk's end ends its line at once (not one chunk late);
//! - one leading byte order mark is stripped; bytes are decoded as UTF-8 with U+FFFD for
//!   invalid sequences (a sequence split between chunks decodes as if it were not);
//! - a line starting with `:` is a comment (a heartbeat); a line without a colon is a
//!   field name with an empty value; one space after the colon is stripped;
//! - `data` lines are joined with `\n`; `event` sets the type (default `message`); an
//!   `id` containing NUL is ignored, an empty one clears the last event id; `retry` sets
//!   the reconnection time when it is ASCII digits only; other fields are ignored;
//! - an event is dispatched only at its blank line: the last event id is taken then (an
//!   `id` in a block without data still sets it), a block without data dispatches
//!   nothing, and what a stream's end cuts is discarded ([`EventParser::end_of_stream`]).
//!
//! Parsing is linear in the input: a chunk is scanned once, complete lines are read in
//! place, and only the part of a line that a chunk's end cuts is copied.

use std::collections::VecDeque;
use std::time::Duration;

/// UTF-8's byte order mark, stripped once at the start of each stream.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One server-sent event, as the standard dispatches it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Event {
    /// The event type: the block's `event` field, else `message`.
    pub event: String,
    /// The block's `data` lines joined with `\n`.
    pub data: String,
    /// The last event id when the event was dispatched: its block's `id`, else the one
    /// before (the `lastEventId` of the standard's `MessageEvent`; empty when none).
    pub id: String,
    /// The `retry` field of the event's block, as sent (unclamped), when it had a valid
    /// one.
    pub retry: Option<Duration>,
}

impl Event {
    /// An event of type `message` with `data` and no id (for tests and examples).
    pub fn message(data: impl Into<String>) -> Event {
        Event {
            event: "message".to_owned(),
            data: data.into(),
            id: String::new(),
            retry: None,
        }
    }

    /// The same event with the id `id`.
    pub fn with_id(mut self, id: impl Into<String>) -> Event {
        self.id = id.into();
        self
    }

    /// The same event with the type `event`.
    pub fn with_type(mut self, event: impl Into<String>) -> Event {
        self.event = event.into();
        self
    }
}

/// The standard's stream interpretation, fed chunk by chunk.
///
/// ```
/// use reqwest_resilience::stream::{Event, EventParser};
///
/// let mut parser = EventParser::new();
/// parser.feed(b"id: 7\nevent: price\ndata: 1\r\ndata: 2\r");
/// assert_eq!(parser.next_event(), None); // not dispatched before its blank line
/// parser.feed(b"\n\r\n: heartbeat\n");
/// let event = parser.next_event().unwrap();
/// assert_eq!(event, Event::message("1\n2").with_type("price").with_id("7"));
/// assert_eq!(parser.last_event_id(), "7");
/// ```
#[derive(Debug, Default)]
pub struct EventParser {
    /// The part of a line a chunk's end cut.
    line: Vec<u8>,
    /// The last byte fed was a `\r`: a `\n` first in the next chunk belongs to it.
    after_cr: bool,
    /// No line of this stream was complete yet (the BOM is stripped from the first).
    first_line: bool,
    data: String,
    event_type: String,
    /// The standard's last event ID buffer (set by `id`, taken at dispatch).
    id_buffer: String,
    /// The standard's last event ID string (the one a reconnect sends).
    last_event_id: String,
    block_retry: Option<Duration>,
    reconnection_time: Option<Duration>,
    ready: VecDeque<Event>,
}

impl EventParser {
    /// A parser at the start of a stream.
    pub fn new() -> EventParser {
        EventParser {
            first_line: true,
            ..EventParser::default()
        }
    }

    /// Parses `chunk`; the events it completes are queued for [`next_event`](Self::next_event).
    pub fn feed(&mut self, chunk: &[u8]) {
        // An empty chunk (a body may yield one) changes nothing: a `\r` that ended the
        // last chunk still pairs with a `\n` that starts the next.
        if chunk.is_empty() {
            return;
        }
        let mut rest = chunk;
        if self.after_cr {
            self.after_cr = false;
            if let Some(b'\n') = rest.first() {
                rest = &rest[1..];
            }
        }
        while let Some(end) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            let (line, terminator) = (&rest[..end], rest[end]);
            rest = &rest[end + 1..];
            if terminator == b'\r' {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    None => self.after_cr = true,
                    Some(_) => {}
                }
            }
            if self.line.is_empty() {
                self.line_complete(line);
            } else {
                let mut cut = std::mem::take(&mut self.line);
                cut.extend_from_slice(line);
                self.line_complete(&cut);
                cut.clear();
                // The buffer's capacity is kept for the next cut line.
                self.line = cut;
            }
        }
        self.line.extend_from_slice(rest);
    }

    /// The next dispatched event, in the order the stream dispatched them.
    pub fn next_event(&mut self) -> Option<Event> {
        self.ready.pop_front()
    }

    /// The stream ended (cleanly or not): the event it cut is discarded, never delivered
    /// half; the parser then reads the next stream from its start (its BOM stripped),
    /// keeping the last event id, the reconnection time and the events already
    /// dispatched.
    pub fn end_of_stream(&mut self) {
        self.line.clear();
        self.after_cr = false;
        self.first_line = true;
        self.data.clear();
        self.event_type.clear();
        self.block_retry = None;
        // An `id` of the cut block was never dispatched: the next stream starts from the
        // last id that was (as a browser's new connection does).
        self.id_buffer.clone_from(&self.last_event_id);
    }

    /// The last event id: the one a reconnect sends as `Last-Event-ID` (empty: none).
    pub fn last_event_id(&self) -> &str {
        &self.last_event_id
    }

    /// Sets the last event id, e.g. to resume from an id kept from an earlier run.
    pub fn set_last_event_id(&mut self, id: impl Into<String>) {
        self.last_event_id = id.into();
        self.id_buffer.clone_from(&self.last_event_id);
    }

    /// The reconnection time the server last set with a valid `retry` field, as sent.
    pub fn reconnection_time(&self) -> Option<Duration> {
        self.reconnection_time
    }

    /// The events dispatched and not yet taken.
    pub fn pending(&self) -> usize {
        self.ready.len()
    }

    fn line_complete(&mut self, mut line: &[u8]) {
        if std::mem::take(&mut self.first_line) {
            line = line.strip_prefix(BOM).unwrap_or(line);
        }
        if line.is_empty() {
            return self.dispatch();
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(0) => return, // a comment
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        self.field(name, value);
    }

    fn field(&mut self, name: &[u8], value: &[u8]) {
        match name {
            b"data" => {
                self.data.push_str(&String::from_utf8_lossy(value));
                self.data.push('\n');
            }
            b"event" => {
                self.event_type.clear();
                self.event_type.push_str(&String::from_utf8_lossy(value));
            }
            b"id" if !value.contains(&0) => {
                self.id_buffer.clear();
                self.id_buffer.push_str(&String::from_utf8_lossy(value));
            }
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                // Digits past u64 saturate: the reconnect policy caps the time anyway.
                let ms = value.iter().fold(0u64, |ms, d| {
                    ms.saturating_mul(10).saturating_add(u64::from(d - b'0'))
                });
                let time = Duration::from_millis(ms);
                self.block_retry = Some(time);
                self.reconnection_time = Some(time);
            }
            _ => {}
        }
    }

    fn dispatch(&mut self) {
        self.last_event_id.clone_from(&self.id_buffer);
        let retry = self.block_retry.take();
        if self.data.is_empty() {
            self.event_type.clear();
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        data.pop(); // the `\n` after the last data line
        let event = match self.event_type.is_empty() {
            true => "message".to_owned(),
            false => std::mem::take(&mut self.event_type),
        };
        self.ready.push_back(Event {
            event,
            data,
            id: self.last_event_id.clone(),
            retry,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_chunks(chunks: &[&[u8]]) -> (Vec<Event>, EventParser) {
        let mut p = EventParser::new();
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c);
            out.extend(std::iter::from_fn(|| p.next_event()));
        }
        (out, p)
    }

    fn parse(input: &[u8]) -> Vec<Event> {
        parse_chunks(&[input]).0
    }

    fn m(data: &str) -> Event {
        Event::message(data)
    }

    /// Every rule of the standard's interpretation, one row each: the input, the events.
    #[test]
    fn the_standards_rules_as_a_table() {
        let retry = |ms| Some(Duration::from_millis(ms));
        let with_retry = |e: Event, ms| Event {
            retry: retry(ms),
            ..e
        };
        let rows: Vec<(&str, &[u8], Vec<Event>)> = vec![
            ("LF line ends", b"data: a\n\n", vec![m("a")]),
            ("CRLF line ends", b"data: a\r\n\r\n", vec![m("a")]),
            ("CR line ends", b"data: a\r\r", vec![m("a")]),
            (
                "mixed line ends",
                b"data: a\rdata: b\r\ndata: c\n\r\n",
                vec![m("a\nb\nc")],
            ),
            (
                "leading BOM stripped",
                b"\xEF\xBB\xBFdata: a\n\n",
                vec![m("a")],
            ),
            (
                "a second BOM is not stripped: the field is unknown",
                b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\n",
                vec![],
            ),
            ("comment ignored", b": heartbeat\ndata: a\n\n", vec![m("a")]),
            ("comment alone dispatches nothing", b":\n\n", vec![]),
            ("field without colon: empty value", b"data\n\n", vec![m("")]),
            ("one leading space stripped", b"data:  a\n\n", vec![m(" a")]),
            ("no space after colon", b"data:a\n\n", vec![m("a")]),
            (
                "multi-line data joined",
                b"data: a\ndata: b\n\n",
                vec![m("a\nb")],
            ),
            (
                "trailing empty data line",
                b"data: a\ndata\n\n",
                vec![m("a\n")],
            ),
            ("default type message", b"data: a\n\n", vec![m("a")]),
            (
                "event sets the type",
                b"event: tick\ndata: a\n\n",
                vec![m("a").with_type("tick")],
            ),
            (
                "the type resets after dispatch",
                b"event: tick\ndata: a\n\ndata: b\n\n",
                vec![m("a").with_type("tick"), m("b")],
            ),
            (
                "empty data block dispatches nothing",
                b"event: tick\n\n",
                vec![],
            ),
            (
                "an id in a data-less block still sets the last id",
                b"id: 1\n\ndata: a\n\n",
                vec![m("a").with_id("1")],
            ),
            (
                "the id sticks to later events",
                b"id: 1\ndata: a\n\ndata: b\n\n",
                vec![m("a").with_id("1"), m("b").with_id("1")],
            ),
            (
                "an id with NUL ignored",
                b"id: 1\n\nid: 2\0x\ndata: a\n\n",
                vec![m("a").with_id("1")],
            ),
            (
                "an empty id clears it",
                b"id: 1\n\nid\ndata: a\n\n",
                vec![m("a")],
            ),
            (
                "retry digits set the time",
                b"retry: 1500\ndata: a\n\n",
                vec![with_retry(m("a"), 1500)],
            ),
            (
                "retry with a sign ignored",
                b"retry: +5\ndata: a\n\n",
                vec![m("a")],
            ),
            (
                "retry with a space inside ignored",
                b"retry: 1 5\ndata: a\n\n",
                vec![m("a")],
            ),
            ("retry empty ignored", b"retry\ndata: a\n\n", vec![m("a")]),
            (
                "unknown field ignored",
                b"foo: bar\ndata: a\n\n",
                vec![m("a")],
            ),
            ("field names are case-sensitive", b"Data: a\n\n", vec![]),
            ("no dispatch without the blank line", b"data: a\n", vec![]),
            (
                "invalid UTF-8 replaced",
                b"data: a\xFFb\n\n",
                vec![m("a\u{FFFD}b")],
            ),
            (
                "a colon in the value kept",
                b"data: a: b\n\n",
                vec![m("a: b")],
            ),
        ];
        for (rule, input, want) in rows {
            assert_eq!(parse(input), want, "{rule}");
        }
    }

    #[test]
    fn the_reconnection_time_is_kept_even_when_its_block_dispatches_nothing() {
        let (events, p) = parse_chunks(&[b"retry: 0\n\nretry: x\n\n"]);
        assert!(events.is_empty());
        assert_eq!(p.reconnection_time(), Some(Duration::ZERO));
    }

    #[test]
    fn huge_retry_saturates_rather_than_overflowing() {
        let (_, p) = parse_chunks(&[b"retry: 99999999999999999999999999\n"]);
        assert_eq!(p.reconnection_time(), Some(Duration::from_millis(u64::MAX)));
    }

    #[test]
    fn a_crlf_split_across_chunks_is_one_line_end() {
        // Were the `\n` a second line end, the blank line would dispatch "a" alone.
        let (events, _) = parse_chunks(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]);
        assert_eq!(events, vec![m("a\nb")]);
    }

    /// Found by the fuzz target (`fuzz/fuzz_targets/event_stream.rs`): an empty chunk
    /// between a `\r` and its `\n` made the `\n` a blank line of its own, which dispatched
    /// the event half way.
    #[test]
    fn an_empty_chunk_between_a_cr_and_its_lf_keeps_them_one_line_end() {
        let (events, _) = parse_chunks(&[b"data: a\r", b"", b"\ndata: b\n\n"]);
        assert_eq!(events, vec![m("a\nb")]);
    }

    #[test]
    fn a_cr_at_a_chunks_end_dispatches_in_that_chunk() {
        let mut p = EventParser::new();
        p.feed(b"data: a\r\r");
        assert_eq!(p.next_event(), Some(m("a")));
    }

    #[test]
    fn a_utf8_sequence_split_across_chunks_decodes_whole() {
        let (events, _) = parse_chunks(&[b"data: \xE2\x82", b"\xAC\n\n"]);
        assert_eq!(events, vec![m("€")]);
    }

    #[test]
    fn a_bom_split_across_chunks_is_stripped() {
        let (events, _) = parse_chunks(&[b"\xEF", b"\xBB", b"\xBFdata: a\n\n"]);
        assert_eq!(events, vec![m("a")]);
    }

    #[test]
    fn a_cut_event_is_discarded_and_its_id_not_taken() {
        let mut p = EventParser::new();
        p.feed(b"id: 1\ndata: a\n\nid: 2\nevent: x\ndata: half");
        p.end_of_stream();
        p.feed(b"\xEF\xBB\xBFdata: b\n\n");
        let got: Vec<_> = std::iter::from_fn(|| p.next_event()).collect();
        assert_eq!(got, vec![m("a").with_id("1"), m("b").with_id("1")]);
        assert_eq!(p.last_event_id(), "1");
    }

    #[test]
    fn a_set_last_event_id_is_the_one_events_carry() {
        let mut p = EventParser::new();
        p.set_last_event_id("41");
        p.feed(b"data: a\n\n");
        assert_eq!(p.next_event(), Some(m("a").with_id("41")));
    }

    #[test]
    fn every_split_of_an_input_gives_the_same_events() {
        let input: &[u8] =
            b"\xEF\xBB\xBFid: 1\r\nevent: e\rdata: \xE2\x82\xAC\r\n\r\n: c\nretry: 7\ndata\n\n";
        let whole = parse(input);
        assert_eq!(whole.len(), 2);
        for i in 0..=input.len() {
            for j in i..=input.len() {
                let (events, _) = parse_chunks(&[&input[..i], &input[i..j], &input[j..]]);
                assert_eq!(events, whole, "split at {i}, {j}");
            }
        }
    }

    proptest::proptest! {
        /// The fuzz target's property on random streams of the bytes that matter.
        #[test]
        fn any_bytes_split_anywhere_give_the_same_events(
            input in proptest::collection::vec(proptest::sample::select(
                b"\r\n: adtiervynx01\0\xEF\xBB\xBF\xFF".to_vec()), 0..200),
            a in 0usize..200, b in 0usize..200,
        ) {
            let (a, b) = (a.min(input.len()), b.min(input.len()));
            let (a, b) = (a.min(b), a.max(b));
            let (whole, p) = parse_chunks(&[&input]);
            let (split, q) = parse_chunks(&[&input[..a], &input[a..b], &input[b..]]);
            proptest::prop_assert_eq!(&whole, &split);
            proptest::prop_assert_eq!(p.last_event_id(), q.last_event_id());
            proptest::prop_assert_eq!(p.reconnection_time(), q.reconnection_time());
        }
    }

    #[test]
    fn parsing_is_linear_one_big_chunk_of_many_lines() {
        // 200 000 events in one chunk: a parser that copies the rest of the buffer per
        // line (quadratic) would take minutes here; this one reads each byte once.
        let input = "data: x\n\n".repeat(200_000);
        let mut p = EventParser::new();
        p.feed(input.as_bytes());
        assert_eq!(p.pending(), 200_000);
    }
}
