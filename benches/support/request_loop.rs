//! A prototype of issue 43's request loop, to measure the floor of that design: one
//! logical request driven by ONE `async` block (the `async_trait` body of
//! [`RequestLoop::handle`]), with synchronous hooks around each attempt, as in smithy-rs's
//! orchestrator, Envoy's router and tower's retry `Policy`. Included through `#[path]` by
//! `benches/instructions.rs` (its "prototype loop" rows) and by `tests/it/request_loop.rs`
//! (a correctness check); not declared in `support/mod.rs`, which other benches compile.
//!
//! Per attempt:
//! - *admit*: the origin's breaker (optional). The origin is derived once per logical
//!   request with the public [`Origin::from_url`], which builds its text and hashes it
//!   every request ([`RequestLoop::origin_cached`]: through a per-thread cache of the
//!   last origin, as the crate does inside). Its state is found in one map shared by the
//!   middleware's requests, `RwLock<HashMap<Origin, Arc<OriginBreaker>>>` with std's
//!   SipHash (a read lock and an `Arc` clone per attempt; the write lock once per new
//!   origin); the state itself is atomics (failures in a row, open-until). An open
//!   breaker rejects with [`BreakerOpen`], not sent.
//! - the attempt: one call of `next.clone().run(request, extensions)`, the request cloned
//!   first (`try_clone`; [`RequestLoop::copied_by_hand`]: as the crate copies one) only
//!   when a retry may follow (retries left).
//! - *observe*: the outcome classified (`ResponseReceived(status)`, `NotSent` for a
//!   reqwest connect error, `Unknown` for any other error) and timed (two clock reads),
//!   appended to the request's one [`LoopRecord`]; the breaker counts it (5xx, 401, 429 and
//!   errors fail; other 4xx are neutral; 2xx and 3xx succeed: a Closed breaker with no
//!   failure counted writes nothing); 5 failures in a row open it for 30 s.
//! - *decide*: a connect error is retried for any method (proven not sent), a 500, 502,
//!   503 or 504 for an idempotent method (GET, HEAD, OPTIONS, TRACE, PUT, DELETE), up to 3
//!   retries; the delay is the crate's default [`Backoff`] (1 s × 2ⁿ, cap 30 s, ±10 %
//!   jitter), computed and slept only when a retry is decided.
//!
//! The record ([`LoopRecord`]: origin, last transmission, attempt count, a `Vec` of
//! per-attempt entries) is stored once, into the response's extensions (into the caller's
//! on an error or a rejection): two allocations (the `Vec`'s, the extension's box), and
//! the map's own when the response has no extension yet.
//!
//! Each hook can be left out to measure its share: [`RequestLoop::without_breaker`],
//! [`RequestLoop::without_evidence`] (with both off, retry alone: no origin, no record, no
//! clock read).
//!
//! Left out, against `Resilience::new()`: `Retry-After` (no header read), the retry budget,
//! the total deadline, the attempt timeout, hedging, the 401 replay, the `Idempotency-Key`
//! header and the per-request idempotency mark, refused-stream and `GOAWAY` retries outside
//! the count, redirect-aware evidence (final origin, hops), connect-address evidence, the
//! decision strategy trait and the per-attempt decisions in the history, the public
//! accessors (`RequestEvidence::of`, `AttemptHistory::of`) and the error's history, the
//! breaker's HalfOpen probe limit (once the open period is over every request goes
//! through until one succeeds), its failure-ratio and slow-call policies, server-directed
//! pauses, event listener, connection-loss de-duplication and bounded registry (this map
//! never forgets an origin), retries into an open breaker after its "retry in", metrics
//! and tracing, and the network settings of `build_from`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use http::{Method, StatusCode};
use reqwest_resilience::backoff::SeededRandom;
use reqwest_resilience::{Backoff, Origin, Transmission};
use tokio::time::Instant;

/// Failures in a row that open a breaker.
const FAILURE_THRESHOLD: u32 = 5;
/// How long an opened breaker rejects.
const OPEN_FOR: Duration = Duration::from_secs(30);
/// Retries after the first attempt.
const MAX_RETRIES: u32 = 3;

/// The prototype middleware: retry, optionally the breaker, and the evidence record.
pub struct RequestLoop {
    breakers: Option<Arc<Breakers>>,
    evidence: bool,
    origin_cached: bool,
    copied_by_hand: bool,
    backoff: Backoff,
    random: SeededRandom,
}

impl Default for RequestLoop {
    fn default() -> Self {
        RequestLoop::new()
    }
}

impl RequestLoop {
    /// Retry, breaker and evidence.
    pub fn new() -> Self {
        RequestLoop {
            breakers: Some(Arc::new(Breakers::new())),
            evidence: true,
            origin_cached: false,
            copied_by_hand: false,
            backoff: Backoff::builder().build().expect("the default backoff"),
            random: SeededRandom::new(43),
        }
    }

    /// Without the breaker hook (retry and evidence only).
    pub fn without_breaker(mut self) -> Self {
        self.breakers = None;
        self
    }

    /// Without the evidence record (with the breaker off too: retry alone, no origin).
    pub fn without_evidence(mut self) -> Self {
        self.evidence = false;
        self
    }

    /// The origin through a per-thread cache of the last one (what the crate does inside,
    /// with `Origin::cached`), built here from the public accessors: a hit compares the
    /// URL's scheme, host and port with the cached origin's and clones it; a miss (another
    /// origin, or one spelt differently) builds it with [`Origin::from_url`].
    pub fn origin_cached(mut self) -> Self {
        self.origin_cached = true;
        self
    }

    /// A request without a body copied for a retry by hand (method, URL, headers, version,
    /// timeout: what the crate's `stage::copy_request` does) instead of `try_clone`, which
    /// in reqwest 0.13 makes an extensions map for the timeout even when there is none.
    pub fn copied_by_hand(mut self) -> Self {
        self.copied_by_hand = true;
        self
    }

    /// Another backoff (a test's short delays).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }
}

/// One logical request's record: written during the loop, stored once at its end.
#[derive(Debug, Clone)]
pub struct LoopRecord {
    /// The request's origin (`None`: its URL has none).
    pub origin: Option<Origin>,
    /// The last attempt's transmission (`NotSent` when the breaker rejected it).
    pub transmission: Transmission,
    /// Attempts sent, the rejected one included.
    pub attempts: u32,
    /// Each attempt, in order.
    pub entries: Vec<AttemptEntry>,
}

/// One attempt of a [`LoopRecord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptEntry {
    /// How far it got.
    pub transmission: Transmission,
    /// From handing the request on to the outcome.
    pub elapsed: Duration,
}

impl LoopRecord {
    /// The record stored in a response.
    pub fn of_response(response: &reqwest::Response) -> Option<&LoopRecord> {
        response.extensions().get()
    }

    /// The record stored in the caller's extensions (after an error).
    pub fn of(extensions: &http::Extensions) -> Option<&LoopRecord> {
        extensions.get()
    }
}

/// The error of a request its origin's open breaker turned away.
#[derive(Debug)]
pub struct BreakerOpen {
    /// Whose breaker.
    pub origin: Origin,
    /// Until it lets a request through again.
    pub retry_in: Duration,
}

impl std::fmt::Display for BreakerOpen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "breaker of {} open, retry in {:?}",
            self.origin, self.retry_in
        )
    }
}

impl std::error::Error for BreakerOpen {}

/// What the breaker makes of an attempt's outcome.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Success,
    Failure,
    Neutral,
}

/// What *observe* tells *decide*.
#[derive(Clone, Copy)]
struct Seen {
    transmission: Transmission,
    connect_error: bool,
}

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for RequestLoop {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let origin = self.origin(request.url());
        let idempotent = is_idempotent(request.method());
        let mut record = self.evidence.then(|| LoopRecord {
            origin: origin.clone(),
            transmission: Transmission::Unknown,
            attempts: 0,
            entries: Vec::new(),
        });
        let mut request = request;
        let mut retries = 0;
        loop {
            let breaker = match self.admit(origin.as_ref()) {
                Ok(breaker) => breaker,
                Err(open) => return Err(rejected(open, record, extensions)),
            };
            let spare = if retries < MAX_RETRIES {
                self.copy(&request)
            } else {
                None
            };
            let started = record.is_some().then(Instant::now);
            let outcome = next.clone().run(request, extensions).await;
            let seen = observe(record.as_mut(), breaker.as_deref(), &outcome, started);
            match (self.decide(seen, idempotent, retries), spare) {
                (Some(delay), Some(spare)) => {
                    drop(outcome);
                    tokio::time::sleep(delay).await;
                    request = spare;
                    retries += 1;
                }
                _ => return store(outcome, record, extensions),
            }
        }
    }
}

impl RequestLoop {
    /// The request's origin, when a hook needs one.
    fn origin(&self, url: &reqwest::Url) -> Option<Origin> {
        if !self.evidence && self.breakers.is_none() {
            None
        } else if self.origin_cached {
            cached_origin(url)
        } else {
            Origin::from_url(url).ok()
        }
    }

    /// A copy of `request` for a retry (`None`: its body is a stream).
    fn copy(&self, request: &reqwest::Request) -> Option<reqwest::Request> {
        if !self.copied_by_hand || request.body().is_some() {
            return request.try_clone();
        }
        let mut copy = reqwest::Request::new(request.method().clone(), request.url().clone());
        *copy.headers_mut() = request.headers().clone();
        *copy.version_mut() = request.version();
        if let Some(timeout) = request.timeout() {
            *copy.timeout_mut() = Some(*timeout);
        }
        Some(copy)
    }

    /// *admit*: the origin's breaker state, or the rejection of an open one. `None` when
    /// the hook is off or the URL has no origin.
    fn admit(&self, origin: Option<&Origin>) -> Result<Option<Arc<OriginBreaker>>, BreakerOpen> {
        let (Some(breakers), Some(origin)) = (&self.breakers, origin) else {
            return Ok(None);
        };
        let state = breakers.get_or_insert(origin);
        let open_until = state.open_until.load(Ordering::Acquire);
        if open_until != 0 {
            let now = stamp(breakers.epoch, Instant::now());
            if now < open_until {
                return Err(BreakerOpen {
                    origin: origin.clone(),
                    retry_in: Duration::from_nanos(open_until - now),
                });
            }
        }
        Ok(Some(state))
    }

    /// *decide*: the delay before the next attempt, or `None` to stop here.
    fn decide(&self, seen: Seen, idempotent: bool, retries: u32) -> Option<Duration> {
        let retryable = match seen.transmission {
            _ if seen.connect_error => true,
            Transmission::ResponseReceived(status) => idempotent && retryable_status(status),
            _ => false,
        };
        (retryable && retries < MAX_RETRIES)
            .then(|| self.backoff.delay(retries, None, &self.random))
    }
}

/// *observe*: classifies and times the attempt, appends it to the record, and counts it
/// in the breaker.
fn observe(
    record: Option<&mut LoopRecord>,
    breaker: Option<&OriginBreaker>,
    outcome: &reqwest_middleware::Result<reqwest::Response>,
    started: Option<Instant>,
) -> Seen {
    let (transmission, connect_error, verdict) = match outcome {
        Ok(response) => {
            let status = response.status();
            (
                Transmission::ResponseReceived(status),
                false,
                verdict(status),
            )
        }
        Err(reqwest_middleware::Error::Reqwest(e)) if e.is_connect() => {
            (Transmission::NotSent, true, Verdict::Failure)
        }
        Err(_) => (Transmission::Unknown, false, Verdict::Failure),
    };
    if let (Some(record), Some(started)) = (record, started) {
        record.attempts += 1;
        record.transmission = transmission;
        record.entries.push(AttemptEntry {
            transmission,
            elapsed: started.elapsed(),
        });
    }
    if let Some(breaker) = breaker {
        breaker.record(verdict);
    }
    Seen {
        transmission,
        connect_error,
    }
}

/// Stores the record where the caller will find it, and hands the outcome back.
fn store(
    outcome: reqwest_middleware::Result<reqwest::Response>,
    record: Option<LoopRecord>,
    extensions: &mut http::Extensions,
) -> reqwest_middleware::Result<reqwest::Response> {
    let Some(record) = record else {
        return outcome;
    };
    match outcome {
        Ok(mut response) => {
            response.extensions_mut().insert(record);
            Ok(response)
        }
        Err(e) => {
            extensions.insert(record);
            Err(e)
        }
    }
}

/// The error of an attempt the breaker turned away, its record stored in the caller's
/// extensions.
fn rejected(
    open: BreakerOpen,
    record: Option<LoopRecord>,
    extensions: &mut http::Extensions,
) -> reqwest_middleware::Error {
    if let Some(mut record) = record {
        record.attempts += 1;
        record.transmission = Transmission::NotSent;
        extensions.insert(record);
    }
    reqwest_middleware::Error::middleware(open)
}

thread_local! {
    /// The origin this thread derived last, for [`RequestLoop::origin_cached`].
    static LAST_ORIGIN: std::cell::RefCell<Option<Origin>> =
        const { std::cell::RefCell::new(None) };
}

/// `url`'s origin: the thread's last one when the URL's scheme, host and port are its.
fn cached_origin(url: &reqwest::Url) -> Option<Origin> {
    LAST_ORIGIN.with(|last| {
        let mut last = last.borrow_mut();
        let hit = last.as_ref().filter(|o| {
            o.scheme() == url.scheme()
                && Some(o.host()) == url.host_str()
                && Some(o.port()) == url.port_or_known_default()
        });
        if let Some(origin) = hit {
            return Some(origin.clone());
        }
        let origin = Origin::from_url(url).ok()?;
        *last = Some(origin.clone());
        Some(origin)
    })
}

fn verdict(status: StatusCode) -> Verdict {
    match status.as_u16() {
        401 | 429 | 500..=599 => Verdict::Failure,
        400..=499 => Verdict::Neutral,
        _ => Verdict::Success,
    }
}

fn retryable_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 500 | 502 | 503 | 504)
}

fn is_idempotent(method: &Method) -> bool {
    [
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::TRACE,
        Method::PUT,
        Method::DELETE,
    ]
    .contains(method)
}

/// The breakers of every origin seen, shared by the clones of one [`RequestLoop`].
struct Breakers {
    map: RwLock<HashMap<Origin, Arc<OriginBreaker>>>,
    /// The origin of the open-until stamps.
    epoch: Instant,
}

impl Breakers {
    fn new() -> Self {
        Breakers {
            map: RwLock::new(HashMap::new()),
            epoch: Instant::now(),
        }
    }

    /// `origin`'s state, made on its first request.
    fn get_or_insert(&self, origin: &Origin) -> Arc<OriginBreaker> {
        let known = self.map.read().expect("breakers").get(origin).cloned();
        known.unwrap_or_else(|| {
            let mut map = self.map.write().expect("breakers");
            let state = map.entry(origin.clone()).or_insert_with(|| {
                Arc::new(OriginBreaker {
                    failures: AtomicU32::new(0),
                    open_until: AtomicU64::new(0),
                    epoch: self.epoch,
                })
            });
            Arc::clone(state)
        })
    }
}

/// `at` in nanoseconds from `epoch`, at least 1 (an open-until of 0 means Closed).
fn stamp(epoch: Instant, at: Instant) -> u64 {
    (at.saturating_duration_since(epoch).as_nanos() as u64).max(1)
}

/// One origin's breaker: failures in a row, and until when it is open (0: Closed).
struct OriginBreaker {
    failures: AtomicU32,
    open_until: AtomicU64,
    epoch: Instant,
}

impl OriginBreaker {
    fn record(&self, verdict: Verdict) {
        match verdict {
            Verdict::Neutral => {}
            Verdict::Success => {
                // A Closed breaker with nothing counted: nothing to write.
                if self.failures.load(Ordering::Relaxed) != 0 {
                    self.failures.store(0, Ordering::Relaxed);
                }
                if self.open_until.load(Ordering::Relaxed) != 0 {
                    self.open_until.store(0, Ordering::Release);
                }
            }
            Verdict::Failure => {
                let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
                if failures >= FAILURE_THRESHOLD {
                    let until = stamp(self.epoch, Instant::now() + OPEN_FOR);
                    self.open_until.store(until, Ordering::Release);
                }
            }
        }
    }
}
