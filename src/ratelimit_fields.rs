//! Rate-limit response fields, parsed: pure, total, and never panicking (layer 1).
//!
//! Servers announce their quota and how much of it is left in response header fields. Two
//! families are in use, and this parser reads both, every form a server sends today:
//!
//! | family | fields | example |
//! |---|---|---|
//! | IETF, current (draft-ietf-httpapi-ratelimit-headers-08 and later) | `RateLimit-Policy`, `RateLimit` | `RateLimit-Policy: "default";q=100;w=60`, `RateLimit: "default";r=0;t=30` |
//! | IETF, draft 07 | `RateLimit-Policy`, `RateLimit` (a dictionary) | `RateLimit-Policy: 10;w=1`, `RateLimit: limit=10, remaining=0, reset=30` |
//! | IETF, drafts 00–06 | `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` | `RateLimit-Limit: 10, 10;w=1`, `RateLimit-Reset: 30` |
//! | GitHub style | `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` | `X-RateLimit-Remaining: 0`, `X-RateLimit-Reset: 1445412510` |
//!
//! The IETF values are Structured Fields (RFC 9651): lists of items with parameters
//! (`q` the quota, `w` its window in seconds, `r` what remains, `t` the seconds until the
//! quota resets) or, in draft 07, a dictionary. The IETF `reset` is delta-seconds.
//! `X-RateLimit-Reset` is the Unix time of the reset in GitHub's, Twitter's and Okta's
//! APIs and delta-seconds in others (Reddit's): a value of at least 10⁹ (September 2001)
//! is read as a Unix time, anything smaller as delta-seconds; a fraction (Discord's
//! `1470173023.123`) is kept to the millisecond, rounded up.
//!
//! When several families are present, each of the three facts (the quota, what remains,
//! the reset) is taken from the first family that states it, in the order of the table.
//! Of several quota policies, the one the `RateLimit` field names is used, else the one
//! with the lowest rate; of several `RateLimit` items, the one with the least remaining.
//! Quotas counted in other units than requests (`qu="content-bytes"`) are skipped.
//!
//! A value that is not one of these forms is a [`MalformedField`] naming the field and
//! the problem; the callers in this crate then ignore every rate-limit field of that
//! response (a half-understood answer is not a basis for pausing anyone). A value longer
//! than 1 024 bytes, or with more than 16 list members, is refused
//! without being scanned further.
//!
//! (The unit test `the_current_ietf_pair` below is this module's example.)

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName};

/// The longest field value (in bytes) this parser looks at.
pub(crate) const MAX_LEN: usize = 1024;

/// The most members of one field's list (or dictionary) this parser reads.
pub(crate) const MAX_MEMBERS: usize = 16;

/// An `X-RateLimit-Reset` value of at least this many seconds is a Unix time
/// (2001-09-09), a smaller one delta-seconds.
pub(crate) const UNIX_TIME_FROM: u64 = 1_000_000_000;

/// A server's quota: at most `limit` requests in any `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    /// Requests allowed per window (at least 1).
    pub limit: u64,
    /// The window (at least one second).
    pub window: Duration,
}

impl Quota {
    /// Whether `self` allows fewer requests per unit of time than `other`.
    fn is_slower_than(&self, other: &Quota) -> bool {
        // limit / window < other.limit / other.window, without division.
        u128::from(self.limit) * other.window.as_millis()
            < u128::from(other.limit) * self.window.as_millis()
    }
}

/// What a response's rate-limit fields say; every part is `None` when no field states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RateLimitFields {
    /// The quota the server enforces, when a field gives both the limit and its window.
    pub quota: Option<Quota>,
    /// Requests left in the current window.
    pub remaining: Option<u64>,
    /// Time until the quota resets, from the moment of parsing (zero for a past Unix time).
    pub reset: Option<Duration>,
}

impl RateLimitFields {
    /// Whether no rate-limit field was present.
    pub fn is_empty(&self) -> bool {
        *self == RateLimitFields::default()
    }

    /// The wait the server directs: the time to the reset when nothing remains (`None`
    /// when something remains, or no reset, or a reset of zero, is given).
    pub fn exhausted_for(&self) -> Option<Duration> {
        match (self.remaining, self.reset) {
            (Some(0), Some(reset)) if !reset.is_zero() => Some(reset),
            _ => None,
        }
    }
}

/// A rate-limit field whose value is none of the forms this parser knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MalformedField {
    /// The field's name, lower-case (`"ratelimit-policy"`).
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: Problem,
}

/// Why a rate-limit field's value was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Problem {
    /// Not visible ASCII (RFC 9110 allows more, no rate-limit value needs it).
    NotAscii,
    /// Longer than 1 024 bytes, or more than 16 members.
    TooLong,
    /// Not a structured field of the expected shape (or, for the `X-` fields, a number).
    Syntax,
    /// A number that is negative, has more than 15 digits, or a window or limit of zero.
    OutOfRange,
}

impl fmt::Display for MalformedField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.problem {
            Problem::NotAscii => "is not visible ASCII",
            Problem::TooLong => "is too long",
            Problem::Syntax => "has a syntax error",
            Problem::OutOfRange => "holds a number out of range",
        };
        write!(f, "rate-limit field {} {why}; ignored", self.field)
    }
}

impl std::error::Error for MalformedField {}

/// Whether `headers` may hold a rate-limit field that says what remains: the cheap test
/// before [`parse`] (see [`any_named`]), for the responses of servers that send none.
pub fn may_be_present(headers: &HeaderMap) -> bool {
    any_named(headers, &[&RATELIMIT, &LEGACY_IETF[1], &LEGACY_X[1]])
}

/// Whether `headers` hold any of the rate-limit fields [`parse`] reads (no clock read):
/// the cheap test for the answers of servers that send none.
pub(crate) fn any_present(headers: &HeaderMap) -> bool {
    any_named(
        headers,
        &[
            &RATELIMIT,
            &RATELIMIT_POLICY,
            &LEGACY_IETF[0],
            &LEGACY_IETF[1],
            &LEGACY_IETF[2],
            &LEGACY_X[0],
            &LEGACY_X[1],
            &LEGACY_X[2],
        ],
    )
}

/// Whether `headers` hold a field of one of these `names`, asked of every response. The
/// rate-limit fields are not standard names, so a lookup hashes the name's bytes (about
/// 150 instructions each, 460 for three on the instructions bench); comparing the names
/// a response holds with the wanted ones costs a few instructions per name (a standard
/// name differs from a custom one by its kind). A response with more names than
/// [`SCAN_NAMES`] is looked up instead, so neither way grows past a bound.
fn any_named(headers: &HeaderMap, names: &[&HeaderName]) -> bool {
    if headers.keys_len() > SCAN_NAMES {
        return names.iter().any(|name| headers.contains_key(*name));
    }
    headers.keys().any(|key| names.contains(&key))
}

/// How many distinct names a response may hold for [`any_named`] to walk them.
const SCAN_NAMES: usize = 32;

// The names as `HeaderName`s made once: a lookup by `&str` would parse and check the name
// on every call.
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// Parses the rate-limit fields of a response received at `now` (see the [module
/// docs](self) for the forms and their precedence).
///
/// `Ok` with [`RateLimitFields::is_empty`] when there are none.
pub fn parse(headers: &HeaderMap, now: SystemTime) -> Result<RateLimitFields, MalformedField> {
    let mut out = RateLimitFields::default();
    let mut named: Option<Name<'_>> = None;
    if let Some(value) = text(headers, &RATELIMIT)? {
        let current = current_field(value).map_err(at(&RATELIMIT))?;
        named = current.policy;
        out.remaining = current.remaining;
        out.reset = current.reset.map(Duration::from_secs);
        // Draft 07's dictionary states the limit; its window is in `RateLimit-Policy`.
        if let Some(limit) = current.limit {
            out.quota = Some(Quota {
                limit,
                window: Duration::ZERO,
            });
        }
    }
    if let Some(value) = text(headers, &RATELIMIT_POLICY)? {
        let policy = policy_field(value, named).map_err(at(&RATELIMIT_POLICY))?;
        out.quota = policy.or(out.quota.filter(|q| !q.window.is_zero()));
    }
    if out.quota.is_some_and(|q| q.window.is_zero()) {
        out.quota = None;
    }
    legacy_family(headers, &mut out, &LEGACY_IETF, reset_delta)?;
    legacy_family(headers, &mut out, &LEGACY_X, |v| reset_x(v, now))?;
    Ok(out)
}

/// The names of one family of single-valued fields: limit, remaining, reset.
type Family = [HeaderName; 3];

static LEGACY_IETF: Family = [
    HeaderName::from_static("ratelimit-limit"),
    HeaderName::from_static("ratelimit-remaining"),
    HeaderName::from_static("ratelimit-reset"),
];
static LEGACY_X: Family = [
    HeaderName::from_static("x-ratelimit-limit"),
    HeaderName::from_static("x-ratelimit-remaining"),
    HeaderName::from_static("x-ratelimit-reset"),
];

/// Fills what `out` still lacks from one family of single-valued fields.
fn legacy_family(
    headers: &HeaderMap,
    out: &mut RateLimitFields,
    [limit, remaining, reset]: &'static Family,
    read_reset: impl Fn(&str) -> Result<Duration, Problem>,
) -> Result<(), MalformedField> {
    if out.quota.is_none()
        && let Some(value) = text(headers, limit)?
    {
        out.quota = limit_field(value).map_err(at(limit))?;
    }
    if out.remaining.is_none()
        && let Some(value) = text(headers, remaining)?
    {
        out.remaining = Some(integer(value.trim()).map_err(at(remaining))?);
    }
    if out.reset.is_none()
        && let Some(value) = text(headers, reset)?
    {
        out.reset = Some(read_reset(value.trim()).map_err(at(reset))?);
    }
    Ok(())
}

fn at(field: &'static HeaderName) -> impl Fn(Problem) -> MalformedField {
    move |problem| MalformedField {
        field: field.as_str(),
        problem,
    }
}

/// The field's value as text, if present: visible ASCII, at most [`MAX_LEN`] (1 024) bytes.
/// Several lines of one field are read as the first (servers send these once).
fn text<'h>(
    headers: &'h HeaderMap,
    field: &'static HeaderName,
) -> Result<Option<&'h str>, MalformedField> {
    let Some(value) = headers.get(field) else {
        return Ok(None);
    };
    let problem = if value.len() > MAX_LEN {
        Problem::TooLong
    } else {
        match value.to_str() {
            Ok(v) => return Ok(Some(v)),
            Err(_) => Problem::NotAscii,
        }
    };
    Err(at(field)(problem))
}

/// A policy's name: a String item's raw text (escapes kept) or a token.
type Name<'a> = &'a str;

/// What the `RateLimit` field says.
#[derive(Default)]
struct Current<'a> {
    policy: Option<Name<'a>>,
    remaining: Option<u64>,
    reset: Option<u64>,
    /// Draft 07's `limit=`.
    limit: Option<u64>,
}

/// `RateLimit`: a list of named items with `r`/`t` (current), or draft 07's dictionary.
fn current_field(value: &str) -> Result<Current<'_>, Problem> {
    let mut out = Current::default();
    let mut least: Option<u64> = None;
    for_each_member(value, |m| {
        match (m.key, m.value) {
            (Some("limit"), Bare::Integer(n)) => out.limit = Some(n),
            (Some("remaining"), Bare::Integer(n)) => out.remaining = Some(n),
            (Some("reset"), Bare::Integer(n)) => out.reset = Some(n),
            (Some("limit" | "remaining" | "reset"), _) => return Err(Problem::Syntax),
            // A policy item (`"default";r=0;t=30`, or a token naming it).
            (key, value) => {
                let name = key.or(value.as_name());
                let Some(r) = m.params.r else {
                    return Err(Problem::Syntax);
                };
                if least.is_none_or(|l| r < l) {
                    least = Some(r);
                    out.policy = name;
                    out.remaining = Some(r);
                    out.reset = m.params.t;
                }
            }
        }
        Ok(())
    })?;
    Ok(out)
}

/// `RateLimit-Policy`: named items with `q`/`w` (current), or integers with `w` (draft
/// 07). The one `named` names, else the slowest.
fn policy_field(value: &str, named: Option<Name<'_>>) -> Result<Option<Quota>, Problem> {
    let mut slowest: Option<Quota> = None;
    let mut chosen: Option<Quota> = None;
    for_each_member(value, |m| {
        if m.params.qu.is_some_and(|u| u != "requests") {
            return Ok(());
        }
        let (name, limit) = match (m.key, m.value) {
            (None, Bare::Integer(n)) => (None, Some(n)),
            (key, value) => (key.or(value.as_name()), m.params.q),
        };
        let (Some(limit), Some(w)) = (limit, m.params.w) else {
            return Err(Problem::Syntax);
        };
        let quota = quota(limit, w)?;
        if name.is_some() && name == named {
            chosen = Some(quota);
        }
        if slowest.is_none_or(|s| quota.is_slower_than(&s)) {
            slowest = Some(quota);
        }
        Ok(())
    })?;
    Ok(chosen.or(slowest))
}

/// `RateLimit-Limit` / `X-RateLimit-Limit`: a number, optionally followed by quota
/// policies (`10, 10;w=1, 50;w=60`, drafts 00–03). A quota only with a window.
fn limit_field(value: &str) -> Result<Option<Quota>, Problem> {
    let mut slowest: Option<Quota> = None;
    for_each_member(value, |m| {
        let (None, Bare::Integer(limit)) = (m.key, m.value) else {
            return Err(Problem::Syntax);
        };
        if let Some(w) = m.params.w {
            let q = quota(limit, w)?;
            if slowest.is_none_or(|s| q.is_slower_than(&s)) {
                slowest = Some(q);
            }
        }
        Ok(())
    })?;
    Ok(slowest)
}

fn quota(limit: u64, window_secs: u64) -> Result<Quota, Problem> {
    if limit == 0 || window_secs == 0 {
        return Err(Problem::OutOfRange);
    }
    Ok(Quota {
        limit,
        window: Duration::from_secs(window_secs),
    })
}

/// An IETF reset: delta-seconds.
fn reset_delta(value: &str) -> Result<Duration, Problem> {
    integer(value).map(Duration::from_secs)
}

/// `X-RateLimit-Reset`: a Unix time from [`UNIX_TIME_FROM`] (10⁹ s, 2001-09-09) on, else delta-seconds; a
/// fraction of up to 9 digits kept to the millisecond, rounded up.
fn reset_x(value: &str, now: SystemTime) -> Result<Duration, Problem> {
    let (whole, fraction) = match value.split_once('.') {
        Some((w, f)) if (1..=9).contains(&f.len()) && f.bytes().all(|b| b.is_ascii_digit()) => {
            (w, f)
        }
        Some(_) => return Err(Problem::Syntax),
        None => (value, ""),
    };
    let secs = integer(whole)?;
    // `fraction` is 1–9 digits: padded to nanoseconds, it fits a u32.
    let nanos = if fraction.is_empty() {
        0
    } else {
        let digits: u32 = fraction.parse().map_err(|_| Problem::Syntax)?;
        digits * 10u32.pow(9 - fraction.len() as u32)
    };
    let nanos = nanos.div_ceil(1_000_000) * 1_000_000;
    let at = Duration::from_secs(secs) + Duration::from_nanos(u64::from(nanos));
    if secs < UNIX_TIME_FROM {
        return Ok(at);
    }
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    Ok(at.saturating_sub(since_epoch))
}

/// A non-negative integer of at most 15 digits (a Structured Field Integer's range).
fn integer(s: &str) -> Result<u64, Problem> {
    if s.starts_with('-') && s.len() > 1 && s[1..].bytes().all(|b| b.is_ascii_digit()) {
        return Err(Problem::OutOfRange);
    }
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Problem::Syntax);
    }
    if s.len() > 15 {
        return Err(Problem::OutOfRange);
    }
    s.parse().map_err(|_| Problem::OutOfRange)
}

// ---- A Structured Fields (RFC 9651) reader for the subset these fields use ----

/// A bare item, as far as these fields need it.
#[derive(Clone, Copy)]
enum Bare<'a> {
    Integer(u64),
    /// A String's raw text between the quotes (escapes kept).
    String(&'a str),
    Token(&'a str),
    /// A Boolean (a dictionary key without a value), Decimal or Byte Sequence.
    Other,
}

impl<'a> Bare<'a> {
    fn as_name(self) -> Option<Name<'a>> {
        match self {
            Bare::String(s) | Bare::Token(s) => Some(s),
            _ => None,
        }
    }
}

/// The parameters these fields define; others are skipped.
#[derive(Default)]
struct Params<'a> {
    q: Option<u64>,
    w: Option<u64>,
    r: Option<u64>,
    t: Option<u64>,
    qu: Option<&'a str>,
}

/// A list member (`key` `None`) or a dictionary member.
struct Member<'a> {
    key: Option<&'a str>,
    value: Bare<'a>,
    params: Params<'a>,
}

/// Calls `f` with each member of a List or Dictionary (both read alike: a member that
/// starts with a key and `=` is a dictionary member, a bare key a dictionary member
/// whose value is `true`, anything else a list item).
fn for_each_member<'a>(
    value: &'a str,
    mut f: impl FnMut(Member<'a>) -> Result<(), Problem>,
) -> Result<(), Problem> {
    let mut c = Cursor {
        s: value.as_bytes(),
        i: 0,
    };
    c.skip(b" \t");
    if c.at_end() {
        return Err(Problem::Syntax);
    }
    for n in 0.. {
        if n == MAX_MEMBERS {
            return Err(Problem::TooLong);
        }
        let member = c.member()?;
        f(member)?;
        c.skip(b" \t");
        if c.at_end() {
            return Ok(());
        }
        if !c.eat(b',') {
            return Err(Problem::Syntax);
        }
        c.skip(b" \t");
        if c.at_end() {
            return Err(Problem::Syntax);
        }
    }
    unreachable!("the loop returns")
}

struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    fn at_end(&self) -> bool {
        self.i >= self.s.len()
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, b: u8) -> bool {
        let hit = self.peek() == Some(b);
        self.i += usize::from(hit);
        hit
    }

    fn skip(&mut self, set: &[u8]) {
        while self.peek().is_some_and(|b| set.contains(&b)) {
            self.i += 1;
        }
    }

    /// The text from `start` to here (ASCII, so always on a char boundary).
    fn since(&self, start: usize) -> &'a str {
        std::str::from_utf8(&self.s[start..self.i]).unwrap_or_default()
    }

    fn member(&mut self) -> Result<Member<'a>, Problem> {
        let (key, value) = match self.peek() {
            Some(b'a'..=b'z' | b'*') => {
                let start = self.i;
                let key = self.key();
                if self.eat(b'=') {
                    (Some(key), self.bare()?)
                } else {
                    // A bare key: a dictionary member `true`, or a list's Token.
                    self.i = start;
                    match self.bare()? {
                        Bare::Token(t) if t == key => (Some(key), Bare::Other),
                        other => (None, other),
                    }
                }
            }
            _ => (None, self.bare()?),
        };
        Ok(Member {
            key,
            value,
            params: self.params()?,
        })
    }

    /// `key = ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" )`
    fn key(&mut self) -> &'a str {
        let start = self.i;
        while self
            .peek()
            .is_some_and(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*'))
        {
            self.i += 1;
        }
        self.since(start)
    }

    fn params(&mut self) -> Result<Params<'a>, Problem> {
        let mut p = Params::default();
        while self.eat(b';') {
            self.skip(b" ");
            if !matches!(self.peek(), Some(b'a'..=b'z' | b'*')) {
                return Err(Problem::Syntax);
            }
            let key = self.key();
            let value = if self.eat(b'=') {
                self.bare()?
            } else {
                Bare::Other
            };
            let slot = match key {
                "q" => &mut p.q,
                "w" => &mut p.w,
                "r" => &mut p.r,
                "t" => &mut p.t,
                "qu" => {
                    p.qu = value.as_name();
                    continue;
                }
                _ => continue,
            };
            let Bare::Integer(n) = value else {
                return Err(Problem::Syntax);
            };
            *slot = Some(n);
        }
        Ok(p)
    }

    fn bare(&mut self) -> Result<Bare<'a>, Problem> {
        match self.peek() {
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'"') => self.string(),
            Some(b'A'..=b'Z' | b'a'..=b'z' | b'*') => {
                let start = self.i;
                while self.peek().is_some_and(is_token_char) {
                    self.i += 1;
                }
                Ok(Bare::Token(self.since(start)))
            }
            Some(b':') => {
                self.i += 1;
                while self
                    .peek()
                    .is_some_and(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
                {
                    self.i += 1;
                }
                if self.eat(b':') {
                    Ok(Bare::Other)
                } else {
                    Err(Problem::Syntax)
                }
            }
            Some(b'?') => {
                self.i += 1;
                if self.eat(b'0') || self.eat(b'1') {
                    Ok(Bare::Other)
                } else {
                    Err(Problem::Syntax)
                }
            }
            _ => Err(Problem::Syntax),
        }
    }

    /// An Integer (at most 15 digits; negative ones are out of range here) or a Decimal.
    fn number(&mut self) -> Result<Bare<'a>, Problem> {
        let negative = self.eat(b'-');
        let start = self.i;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.i += 1;
        }
        let digits = self.since(start);
        if self.eat(b'.') {
            let frac = self.i;
            while self.peek().is_some_and(|b| b.is_ascii_digit()) {
                self.i += 1;
            }
            let ok = (1..=12).contains(&digits.len()) && (1..=3).contains(&(self.i - frac));
            return if ok {
                Ok(Bare::Other)
            } else {
                Err(Problem::Syntax)
            };
        }
        if digits.is_empty() {
            return Err(Problem::Syntax);
        }
        if negative || digits.len() > 15 {
            return Err(Problem::OutOfRange);
        }
        digits
            .parse()
            .map(Bare::Integer)
            .map_err(|_| Problem::OutOfRange)
    }

    fn string(&mut self) -> Result<Bare<'a>, Problem> {
        self.i += 1;
        let start = self.i;
        loop {
            match self.peek() {
                None => return Err(Problem::Syntax),
                Some(b'"') => {
                    let raw = self.since(start);
                    self.i += 1;
                    return Ok(Bare::String(raw));
                }
                Some(b'\\') => {
                    self.i += 1;
                    if !self.eat(b'"') && !self.eat(b'\\') {
                        return Err(Problem::Syntax);
                    }
                }
                Some(0x20..=0x7e) => self.i += 1,
                Some(_) => return Err(Problem::Syntax),
            }
        }
    }
}

/// `tchar / ":" / "/"` (RFC 9651 §3.3.4).
fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// 2015-10-21T07:28:00Z.
    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_445_412_480)
    }

    fn fields(pairs: &[(&'static str, &str)]) -> Result<RateLimitFields, MalformedField> {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, HeaderValue::from_str(value).unwrap());
        }
        parse(&h, now())
    }

    fn quota(limit: u64, secs: u64) -> Option<Quota> {
        Some(Quota {
            limit,
            window: Duration::from_secs(secs),
        })
    }

    fn secs(n: u64) -> Option<Duration> {
        Some(Duration::from_secs(n))
    }

    #[test]
    fn no_fields_is_empty() {
        let f = fields(&[("retry-after", "5")]).unwrap();
        assert!(f.is_empty());
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("5"));
        assert!(!any_present(&h) && !may_be_present(&h));
        h.insert("x-ratelimit-reset", HeaderValue::from_static("5"));
        assert!(any_present(&h) && !may_be_present(&h));
        h.insert("ratelimit", HeaderValue::from_static("x;r=1"));
        assert!(any_present(&h) && may_be_present(&h));
        assert_eq!(f.exhausted_for(), None);
    }

    /// The module's example (a doc test while the module was public).
    #[test]
    fn the_current_ietf_pair() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "ratelimit-policy",
            HeaderValue::from_static(r#""default";q=100;w=60"#),
        );
        headers.insert(
            "ratelimit",
            HeaderValue::from_static(r#""default";r=0;t=30"#),
        );
        let fields = parse(&headers, UNIX_EPOCH).unwrap();
        assert_eq!(fields.quota, quota(100, 60));
        assert_eq!(fields.remaining, Some(0));
        assert_eq!(fields.exhausted_for(), secs(30));
    }

    #[test]
    fn the_probes_see_a_field_whether_they_walk_the_names_or_look_them_up() {
        for others in [0, 3, SCAN_NAMES - 1, SCAN_NAMES, SCAN_NAMES + 1, 100] {
            let mut h = HeaderMap::new();
            h.insert(http::header::DATE, HeaderValue::from_static("now"));
            for i in 1..others {
                let name = HeaderName::from_bytes(format!("x-other-{i}").as_bytes()).unwrap();
                h.insert(name, HeaderValue::from_static("1"));
            }
            assert_eq!(h.keys_len(), others.max(1), "{others}");
            assert!(!any_present(&h) && !may_be_present(&h), "{others}");
            h.insert("x-ratelimit-limit", HeaderValue::from_static("5"));
            assert!(any_present(&h) && !may_be_present(&h), "{others}");
            h.insert("ratelimit-remaining", HeaderValue::from_static("0"));
            assert!(any_present(&h) && may_be_present(&h), "{others}");
            h.remove("x-ratelimit-limit");
            h.remove("ratelimit-remaining");
            h.insert("ratelimit-policy", HeaderValue::from_static("\"q\";q=1"));
            assert!(any_present(&h) && !may_be_present(&h), "{others}");
        }
    }

    #[test]
    fn the_current_ietf_form() {
        let f = fields(&[
            (
                "ratelimit-policy",
                r#""burst";q=100;w=60, "daily";q=1000;w=86400"#,
            ),
            ("ratelimit", r#""burst";r=0;t=30"#),
        ])
        .unwrap();
        // The policy the RateLimit field names, not the slowest.
        assert_eq!(f.quota, quota(100, 60));
        assert_eq!((f.remaining, f.reset), (Some(0), secs(30)));
        assert_eq!(f.exhausted_for(), secs(30));
        // Without a name: the slowest; of several items, the least remaining.
        let f = fields(&[
            (
                "ratelimit-policy",
                r#""burst";q=100;w=60, "daily";q=1000;w=86400"#,
            ),
            ("ratelimit", r#""burst";r=40;t=30, "daily";r=7;t=3600"#),
        ])
        .unwrap();
        assert_eq!(f.quota, quota(1000, 86_400));
        assert_eq!((f.remaining, f.reset), (Some(7), secs(3600)));
        assert_eq!(f.exhausted_for(), None);
        // Tokens as names, unknown parameters, a partition key and a byte-quota skipped.
        let f = fields(&[
            (
                "ratelimit-policy",
                r#"bytes;q=65535;qu="content-bytes";w=1, default;q=10;w=1;pk=:cHsdsRa894==:"#,
            ),
            ("ratelimit", "default;r=3;t=1;x=?1"),
        ])
        .unwrap();
        assert_eq!(
            (f.quota, f.remaining, f.reset),
            (quota(10, 1), Some(3), secs(1))
        );
    }

    #[test]
    fn the_draft_07_form() {
        let f = fields(&[
            ("ratelimit-policy", "10;w=1"),
            ("ratelimit", "limit=10, remaining=0, reset=30"),
        ])
        .unwrap();
        assert_eq!(
            (f.quota, f.remaining, f.reset),
            (quota(10, 1), Some(0), secs(30))
        );
        // A policy alone is enough for the quota; the limit alone has no window.
        // Of several, the slowest: 50 a minute is slower than 10 a second.
        let f = fields(&[("ratelimit-policy", "10;w=1, 50;w=60")]).unwrap();
        assert_eq!(f.quota, quota(50, 60));
        let f = fields(&[("ratelimit", "limit=10, remaining=4, reset=2")]).unwrap();
        assert_eq!((f.quota, f.remaining, f.reset), (None, Some(4), secs(2)));
    }

    #[test]
    fn the_early_draft_and_github_fields() {
        let f = fields(&[
            ("ratelimit-limit", "10, 10;w=1, 50;w=60"),
            ("ratelimit-remaining", "0"),
            ("ratelimit-reset", " 30 "),
        ])
        .unwrap();
        assert_eq!(
            (f.quota, f.remaining, f.reset),
            (quota(50, 60), Some(0), secs(30))
        );
        // GitHub: a Unix time 30 s after now; the limit has no window.
        let f = fields(&[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1445412510"),
        ])
        .unwrap();
        assert_eq!((f.quota, f.remaining, f.reset), (None, Some(0), secs(30)));
        // Reddit: delta-seconds; Discord: a fraction, rounded up to the millisecond.
        let f = fields(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "300")]).unwrap();
        assert_eq!(f.exhausted_for(), secs(300));
        let f = fields(&[("x-ratelimit-reset", "1445412481.0001")]).unwrap();
        assert_eq!(f.reset, Some(Duration::from_millis(1001)));
        // A Unix time in the past: zero, no wait.
        let f = fields(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1445412000"),
        ])
        .unwrap();
        assert_eq!((f.reset, f.exhausted_for()), (secs(0), None));
    }

    #[test]
    fn the_first_family_that_states_a_fact_wins() {
        let f = fields(&[
            ("ratelimit", r#""a";r=5;t=10"#),
            ("ratelimit-remaining", "0"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "99"),
            ("x-ratelimit-limit", "7, 7;w=2"),
        ])
        .unwrap();
        assert_eq!(
            (f.quota, f.remaining, f.reset),
            (quota(7, 2), Some(5), secs(10))
        );
    }

    #[test]
    fn malformed_values_are_typed_errors() {
        use Problem::*;
        let cases: [(&'static str, &str, Problem); 22] = [
            ("ratelimit", "", Syntax),
            ("ratelimit", r#""default";t=30"#, Syntax), // no r
            ("ratelimit", r#""default";r=-1"#, OutOfRange),
            ("ratelimit", r#""default";r=1.5"#, Syntax),
            ("ratelimit", r#""default;r=1"#, Syntax),
            ("ratelimit", "limit=ten", Syntax),
            ("ratelimit", r#""a";r=1,"#, Syntax),
            ("ratelimit", r#""a";r=1 "b";r=2"#, Syntax),
            ("ratelimit", r#""a";r=1234567890123456"#, OutOfRange),
            ("ratelimit-policy", r#""default";q=100"#, Syntax), // no window
            ("ratelimit-policy", r#""default";q=0;w=1"#, OutOfRange),
            ("ratelimit-policy", "10;w=0", OutOfRange),
            ("ratelimit-policy", "10;W=1", Syntax),
            ("ratelimit-policy", "(10 20);w=1", Syntax),
            ("ratelimit-limit", "ten", Syntax),
            ("ratelimit-remaining", "-1", OutOfRange),
            ("ratelimit-reset", "1e3", Syntax),
            ("x-ratelimit-remaining", "", Syntax),
            ("x-ratelimit-remaining", "0x10", Syntax),
            ("x-ratelimit-reset", "1.", Syntax),
            ("x-ratelimit-reset", "1.1234567890", Syntax),
            ("x-ratelimit-reset", "99999999999999999999", OutOfRange),
        ];
        for (field, value, problem) in cases {
            assert_eq!(
                fields(&[(field, value)]),
                Err(MalformedField { field, problem }),
                "{field}: {value:?}"
            );
        }
        let long = format!(r#""a";r=1{}"#, " ".repeat(MAX_LEN));
        assert_eq!(
            fields(&[("ratelimit", &long)]).unwrap_err().problem,
            TooLong
        );
        let many = vec!["1;w=1"; MAX_MEMBERS + 1].join(",");
        assert_eq!(
            fields(&[("ratelimit-policy", &many)]).unwrap_err().problem,
            TooLong
        );
        let mut h = HeaderMap::new();
        h.insert(
            "ratelimit",
            HeaderValue::from_bytes(b"\"\xe9\";r=0").unwrap(),
        );
        assert_eq!(parse(&h, now()).unwrap_err().problem, NotAscii);
        // Display names the field.
        let e = fields(&[("ratelimit", "")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "rate-limit field ratelimit has a syntax error; ignored"
        );
    }

    proptest::proptest! {
        /// Whatever a server sends (built from the characters these fields use), the
        /// parser answers, and an answer is usable as it is (the fuzz target's check).
        #[test]
        fn any_value_is_parsed_or_refused_never_a_panic(
            values in proptest::collection::vec("[0-9a-z\\\" ;=,.:*?+/-]{0,40}", 7)
        ) {
            let names = [
                "ratelimit", "ratelimit-policy", "ratelimit-limit", "ratelimit-remaining",
                "ratelimit-reset", "x-ratelimit-remaining", "x-ratelimit-reset",
            ];
            let mut h = HeaderMap::new();
            for (name, value) in names.iter().zip(&values) {
                h.insert(*name, HeaderValue::from_str(value).unwrap());
            }
            if let Ok(f) = parse(&h, now()) {
                if let Some(q) = f.quota {
                    proptest::prop_assert!(q.limit >= 1 && q.window >= Duration::from_secs(1));
                }
                if f.exhausted_for().is_some() {
                    proptest::prop_assert_eq!(f.remaining, Some(0));
                }
            }
        }
    }
}
