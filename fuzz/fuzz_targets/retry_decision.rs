//! Fuzzes the retry decision: random evidence × method × headers × budget × deadline.
//!
//! Two layers, one input:
//! 1. `DefaultStrategy::decide` on one random attempt (the table alone).
//! 2. The whole `RetryMiddleware` loop on a paused clock, over a scripted sequence of
//!    attempts served by a fake transport step, with a random budget, retry count,
//!    `Retry-After` cap and deadline.
//!
//! The safety property both must keep (DESIGN.md, "Retry decision"): a non-idempotent
//! request is never sent again after an attempt that may have been processed
//! (`SentNoResponse`/`Unknown`), unless the server proved it did not process it (up to the
//! cap of not-processed retries),
//! nor after a 408/5xx without `Retry-After`, nor after an attempt during which reqwest
//! followed a redirect (or one cannot be ruled out). On top, the loop never exceeds the retry
//! count (plus, outside it, the cap of not-processed retries), the budget or the deadline.
#![no_main]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Extensions, HeaderMap, Method, StatusCode};
use libfuzzer_sys::fuzz_target;
use reqwest::{Request, Response};
use reqwest_middleware::{ClientBuilder, Middleware, Next};
use reqwest_resilience::evidence::{
    FailureKind, NotProcessedProof, Redirects, RequestEvidence, Transmission,
};
use reqwest_resilience::retry::{
    AttemptContext, Deadline, DefaultStrategy, Idempotent, MaxRetries, RetryAfterPolicy,
    RetryReason, RetryStrategy, StopReason, Verdict,
};
use reqwest_resilience::{AttemptHistory, Backoff, Jitter, RetryBudget, RetryMiddleware};
use tokio::time::Instant;

/// Reads the input a byte at a time; zeros once it runs out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | (u16::from(self.u8()) << 8)
    }
    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
}

const KINDS: [FailureKind; 20] = [
    FailureKind::Connect,
    FailureKind::Dns,
    FailureKind::Tls,
    FailureKind::Certificate,
    FailureKind::ConnectPermanent,
    FailureKind::Timeout,
    FailureKind::Reset,
    FailureKind::Closed,
    FailureKind::Protocol,
    FailureKind::Body,
    FailureKind::Redirect,
    FailureKind::Builder,
    FailureKind::Decode,
    FailureKind::BreakerOpen,
    FailureKind::Paused,
    FailureKind::TokenUnavailable,
    FailureKind::ConcurrencyLimited,
    FailureKind::Other,
    FailureKind::Misconfigured,
    FailureKind::Cancelled,
];

const METHODS: [&str; 10] = [
    "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE", "POST", "PATCH", "CONNECT", "PURGE",
];

fn evidence(b: &mut Bytes<'_>) -> RequestEvidence {
    let transmission = match b.u8() % 4 {
        0 => Transmission::NotSent,
        1 => Transmission::SentNoResponse,
        2 => Transmission::Unknown,
        _ => {
            // Mostly the interesting statuses, sometimes any.
            const HOT: [u16; 10] = [200, 401, 404, 408, 429, 500, 501, 502, 503, 504];
            let pick = b.u8();
            let code = if pick < 200 {
                HOT[usize::from(pick) % HOT.len()]
            } else {
                100 + b.u16() % 500
            };
            Transmission::ResponseReceived(StatusCode::from_u16(code).unwrap())
        }
    };
    let mut e = RequestEvidence::new(transmission, None, 1);
    if !matches!(transmission, Transmission::ResponseReceived(_)) {
        let k = b.u8();
        e.failure = (k < 240).then(|| KINDS[usize::from(k) % KINDS.len()]);
        e.not_processed = match b.u8() % 4 {
            0 => Some(NotProcessedProof::RefusedStream),
            1 => Some(NotProcessedProof::GoAway),
            _ => None,
        };
    }
    e.retry_after = match b.u8() % 4 {
        0 => Some(Duration::from_millis(u64::from(b.u16()) * 37)),
        1 => Some(Duration::ZERO),
        _ => None,
    };
    // Through a proxy of a pool, the outcome charged to the proxy (a `407`, a status the
    // pool rotates on, a refused connection to it): decided as a `503` would be.
    e.charged_to_proxy = b.u8() % 8 == 0;
    // Redirects reqwest followed inside the attempt (issue 10): counted, seen only by the
    // response's URL, or impossible to rule out.
    e.redirects = match b.u8() % 8 {
        0 => Redirects::Followed {
            hops: Some(1 + u32::from(b.u8() % 10)),
        },
        1 => Redirects::Followed { hops: None },
        2 => Redirects::Unknown,
        _ => Redirects::None,
    };
    e
}

/// The property: may another attempt follow `e` for a request of this idempotency?
fn may_resend(e: &RequestEvidence, idempotent: bool, not_processed_retries: u32, cap: u32) -> bool {
    if idempotent {
        return true;
    }
    // After a followed redirect (or where one cannot be ruled out) the first hop was
    // answered: whatever the last hop says, a non-idempotent request is not sent again.
    if e.redirects.may_have_redirected() {
        return false;
    }
    match e.transmission {
        Transmission::NotSent => true,
        Transmission::SentNoResponse | Transmission::Unknown => {
            e.not_processed.is_some() && not_processed_retries < cap
        }
        Transmission::ResponseReceived(s) => {
            // A status charged to a pool's proxy is decided as a `503` (a `429` as itself).
            let s = match s {
                StatusCode::TOO_MANY_REQUESTS => s,
                _ if e.charged_to_proxy => StatusCode::SERVICE_UNAVAILABLE,
                _ => s,
            };
            s == StatusCode::TOO_MANY_REQUESTS
                || (matches!(s.as_u16(), 408 | 500 | 502 | 503 | 504) && e.retry_after.is_some())
        }
        _ => false,
    }
}

/// The documented rule (`retry::Idempotent`'s docs): idempotent by its method (RFC 9110
/// §9.2.2) or an `Idempotency-Key` header. The crate's own function is private.
fn is_idempotent(method: &Method, headers: &HeaderMap) -> bool {
    method.is_idempotent() || headers.contains_key("idempotency-key")
}

fn check_table(b: &mut Bytes<'_>) {
    let e = evidence(b);
    let method =
        Method::from_bytes(METHODS[usize::from(b.u8()) % METHODS.len()].as_bytes()).unwrap();
    let mut headers = HeaderMap::new();
    if b.bool() {
        headers.insert("idempotency-key", "k".parse().unwrap());
    }
    let idempotent = is_idempotent(&method, &headers);
    let not_processed_retries = u32::from(b.u8() % 8);
    let cap = u32::from(b.u8() % 8);
    let mut ctx = AttemptContext::new(&e, &method);
    ctx.max_not_processed_retries = cap;
    ctx.idempotent = idempotent;
    ctx.attempt = 1 + u32::from(b.u8() % 5);
    ctx.not_processed_retries = not_processed_retries;
    let verdict = DefaultStrategy.decide(&ctx);
    // A concurrency-limit rejection is never retried (the limiter's queue is the wait).
    // (Evidence of a local rejection never carries redirects; where the model draws both,
    // the redirect rule may stop it first.)
    if e.transmission == Transmission::NotSent && e.failure == Some(FailureKind::ConcurrencyLimited)
    {
        assert!(matches!(verdict, Verdict::Stop(_)), "{e:?}: {verdict:?}");
        if e.redirects == Redirects::None {
            assert_eq!(verdict, Verdict::Stop(StopReason::ConcurrencyLimited));
        }
    }
    if let Verdict::Retry(reason) = verdict {
        assert!(
            may_resend(&e, idempotent, not_processed_retries, cap),
            "{method} idempotent={idempotent} {e:?} retried: {reason:?}"
        );
        if let RetryReason::Status(s) = reason {
            assert_eq!(e.status(), Some(s));
        }
        if reason == RetryReason::NotProcessed {
            assert!(e.not_processed.is_some() && not_processed_retries < cap);
        }
    }
}

/// The fake transport step: serves the scripted attempts in order and records each call.
struct Scripted {
    attempts: Vec<RequestEvidence>,
    calls: Arc<Mutex<Vec<RequestEvidence>>>,
    /// At each call after the first, the previous attempt's evidence as the retry
    /// middleware recorded it in the history (what its decision read: the scripted
    /// answer as the crate describes it, not the script's own evidence).
    decided: Arc<Mutex<Vec<RequestEvidence>>>,
}

#[async_trait::async_trait]
impl Middleware for Scripted {
    async fn handle(
        &self,
        _req: Request,
        extensions: &mut Extensions,
        _next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        if let Some(last) = AttemptHistory::of(extensions).and_then(|h| h.attempts().last()) {
            self.decided.lock().unwrap().push(last.evidence.clone());
        }
        let mut calls = self.calls.lock().unwrap();
        let e = self
            .attempts
            .get(calls.len())
            .or(self.attempts.last())
            .unwrap()
            .clone();
        calls.push(e.clone());
        drop(calls);
        extensions.insert(e.clone());
        match e.transmission {
            Transmission::ResponseReceived(s) => {
                let mut r = http::Response::builder().status(s);
                if let Some(after) = e.retry_after {
                    r = r.header("retry-after", after.as_secs().to_string());
                }
                Ok(Response::from(r.body(Vec::<u8>::new()).unwrap()))
            }
            _ => Err(reqwest_middleware::Error::middleware(
                std::io::Error::other("scripted failure"),
            )),
        }
    }
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    static CLIENT: reqwest::Client = reqwest::Client::new();
}

fn check_loop(b: &mut Bytes<'_>) {
    let n = 1 + usize::from(b.u8() % 6);
    let attempts: Vec<RequestEvidence> = (0..n).map(|_| evidence(b)).collect();
    let method =
        Method::from_bytes(METHODS[usize::from(b.u8()) % METHODS.len()].as_bytes()).unwrap();
    let keyed = b.bool();
    let marker = match b.u8() % 4 {
        0 => Some(true),
        1 => Some(false),
        _ => None,
    };
    let max_retries = u32::from(b.u8() % 6);
    let per_request_max = b.bool().then(|| u32::from(b.u8() % 6));
    let cap = Duration::from_millis(u64::from(b.u16()) * 4);
    let policy = if b.bool() {
        RetryAfterPolicy::GiveUp
    } else {
        RetryAfterPolicy::Clamp
    };
    let window = Duration::from_secs(1 + u64::from(b.u8() % 60));
    let budget = match b.u8() % 3 {
        0 => None,
        _ => Some(
            RetryBudget::new(window, u32::from(b.u8() % 4), f64::from(b.u8() % 5) / 4.0).unwrap(),
        ),
    };
    let deadline = b
        .bool()
        .then(|| Duration::from_millis(u64::from(b.u16()) * 8));
    let base = Duration::from_millis(1 + u64::from(b.u8()) * 10);
    let np_cap = u32::from(b.u8() % 7);

    let idempotent = marker.unwrap_or_else(|| {
        let mut h = HeaderMap::new();
        if keyed {
            h.insert("idempotency-key", "k".parse().unwrap());
        }
        is_idempotent(&method, &h)
    });

    RUNTIME.with(|rt| {
        rt.block_on(async {
            let mut retry = RetryMiddleware::builder()
                .max_retries(max_retries)
                .backoff(
                    Backoff::builder()
                        .base(base)
                        .jitter(Jitter::Full)
                        .build()
                        .unwrap(),
                )
                .retry_after_cap(cap, policy)
                .max_not_processed_retries(np_cap);
            retry = match &budget {
                Some(budget) => retry.budget(budget.clone()),
                None => retry.no_budget(),
            };
            let retry = retry.build().unwrap();
            let calls = Arc::new(Mutex::new(Vec::new()));
            let decided = Arc::new(Mutex::new(Vec::new()));
            let client = ClientBuilder::new(CLIENT.with(Clone::clone))
                .with(retry)
                .with(Scripted {
                    attempts,
                    calls: calls.clone(),
                    decided: decided.clone(),
                })
                .build();
            let mut req = client
                .request(method.clone(), "http://127.0.0.1:9/x")
                .body("payload");
            if keyed {
                req = req.header("idempotency-key", "k");
            }
            if let Some(m) = marker {
                req = req.with_extension(Idempotent(m));
            }
            if let Some(m) = per_request_max {
                req = req.with_extension(MaxRetries(m));
            }
            let start = Instant::now();
            if let Some(d) = deadline {
                req = req.with_extension(Deadline(start + d));
            }
            let budget_before = budget.as_ref().map(RetryBudget::remaining);
            let _ = req.send().await;
            let elapsed = start.elapsed();
            let calls = calls.lock().unwrap();

            let counted = per_request_max.unwrap_or(max_retries) as usize;
            // Not-processed retries are outside the count (and off with a count of 0).
            let allowed = if counted == 0 { 0 } else { counted + np_cap as usize };
            assert!(
                calls.len() <= allowed + 1,
                "{} calls, max {allowed} retries",
                calls.len()
            );
            if let Some(d) = deadline {
                assert!(elapsed <= d, "slept {elapsed:?} past a {d:?} deadline");
            }
            // Within one window (less a slot of 1/10 that may expire early), the request's
            // own deposit adds at most one retry (ratios drawn are at most 1). A request
            // that outlives the window legitimately gets the floor of the next one.
            // A not-processed retry on a `GOAWAY` proof is outside the budget.
            let mut used = 0;
            let mut free = 0u64;
            for e in &calls[..calls.len() - 1] {
                let proven = matches!(
                    e.transmission,
                    Transmission::SentNoResponse | Transmission::Unknown
                ) && e.not_processed.is_some()
                    && used < np_cap;
                if proven {
                    used += 1;
                    free += u64::from(e.not_processed == Some(NotProcessedProof::GoAway));
                }
            }
            if let Some(before) = budget_before.filter(|_| elapsed < window * 8 / 10) {
                let ceiling = before + 1;
                assert!(
                    (calls.len() - 1) as u64 - free <= ceiling,
                    "{} retries ({free} free), budget {before}",
                    calls.len() - 1
                );
            }
            // Every retry was decided on the evidence the middleware recorded for the
            // attempt before it: that evidence must allow another attempt.
            let decided = decided.lock().unwrap();
            assert_eq!(decided.len(), calls.len() - 1);
            let mut not_processed_retries = 0;
            for e in decided.iter() {
                assert!(
                    may_resend(e, idempotent, not_processed_retries, np_cap),
                    "{method} idempotent={idempotent} resent after {e:?}"
                );
                if !idempotent
                    && matches!(
                        e.transmission,
                        Transmission::SentNoResponse | Transmission::Unknown
                    )
                {
                    not_processed_retries += 1;
                }
            }
        })
    });
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    check_table(&mut b);
    check_loop(&mut b);
});
