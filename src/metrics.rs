//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`):
//! install any recorder (Prometheus, OpenTelemetry, StatsD exporters exist for it) and
//! the stack reports to it. Without the feature nothing here is compiled in.
//!
//! Names follow OpenTelemetry's semantic conventions where one exists
//! (`http.client.request.duration`), else `reqwest_resilience.<area>.<what>`. Labels
//! are of bounded cardinality: reasons and states come from fixed sets, and `origin` is
//! the [`Origin`] text (`scheme://host:port`, never a path or a query) of at most
//! 1 000 origins per process ([`set_max_origin_labels`] changes it), the first ones reported;
//! every later origin is reported as `origin="other"` (and `server.address="other"`
//! without `server.port` on the duration histogram), so a crawler, a webhook sender or a
//! package manager with many mirrors does not grow an exporter's series without end.
//! [`set_max_origin_labels`] changes the bound (process-wide, as the recorder is; origins
//! already labelled keep their label). The bound is the metrics' own: the breaker and
//! limiter registries bound the origins they hold separately (10 000 each).
//!
//! Counters are plain counts (no unit is registered for them); the histogram is in
//! seconds (`Unit::Seconds`), as OpenTelemetry's `http.client.request.duration` is.
//!
//! | instrument | kind, unit | labels | when |
//! |---|---|---|---|
//! | `http.client.request.duration` | histogram, seconds | `http.request.method` (`GET` … or `_OTHER`), `server.address`, `server.port`, `http.response.status_code` (a response), `error.type` (the [`FailureKind`] in snake case, or the status code for a 4xx/5xx response) | each attempt that reached the transport step, from handing the request on to the response head or the failure (the body is not timed; local rejections are not requests on the wire) |
//! | `reqwest_resilience.retry.retries` | counter | `origin`, `reason`: `not_sent`, `breaker_rejected`, `not_processed`, `go_away`, `transient`, `status`, `body_interrupted` | each retry decided (before its backoff), a resume of a broken body and an [operation](crate::retry::Operation) run again included |
//! | `reqwest_resilience.retry.stops` | counter | `origin`, `reason`: `final_response`, `status_not_safe`, `permanent`, `may_have_been_processed`, `not_processed_retry_used`, `retries_exhausted`, `budget_exhausted`, `deadline_exceeded`, `retry_after_too_long`, `breaker_rejected`, `body_not_clonable`, `redirect_followed`, `concurrency_limited`, `rate_limited`, `connect_timed_out` | each logical request the retry middleware ends (a success is `final_response`) |
//! | `reqwest_resilience.retry.budget_exhausted` | counter | `origin` | a retry the decision table allowed and the [`RetryBudget`](crate::RetryBudget) refused |
//! | `reqwest_resilience.breaker.transitions` | counter | `origin`, `from`, `to`: `closed`, `open`, `half_open`, `isolated` | each breaker state change |
//! | `reqwest_resilience.breaker.rejections` | counter | `origin`, `reason`: `open`, `probes_busy`, `isolated`, `paused` | each request a breaker or a pause turned away unsent |
//! | `reqwest_resilience.breaker.pauses` | counter | `origin` | each server `Retry-After` (or rate-limit fields saying nothing remains) that started or extended a pause of its origin |
//! | `reqwest_resilience.auth.token_fetches` | counter | — | each token fetch the [`TokenManager`](crate::TokenManager) made (successful or not) |
//! | `reqwest_resilience.auth.token_failures` | counter | `kind`: `fetch`, `timeout`, `aborted`, `invalid_secret` | each fetch that gave no usable token |
//! | `reqwest_resilience.hedge.sent` | counter | `origin` | each extra copy of a hedged request launched ([`Hedging`](crate::retry::Hedging)); those then refused on this side are also in `skipped` |
//! | `reqwest_resilience.hedge.won` | counter | `origin` | each hedged request whose answer came from an extra copy |
//! | `reqwest_resilience.hedge.skipped` | counter | `origin`, `reason`: `budget`, `breaker`, `limit`, `rate`, `token`, `local` | each hedge due but not sent: the hedge budget was spent, or it was refused on this side (its budget given back) by a breaker or a pause, the concurrency limit, for want of a bearer token, or by a misconfigured stack |
//! | `reqwest_resilience.limiter.limit` | gauge | `origin` | the origin's current concurrency limit, set on each change ([`limit`](crate::limit)) |
//! | `reqwest_resilience.limiter.in_flight` | gauge | `origin` | attempts holding a permit, set on each acquire and release |
//! | `reqwest_resilience.limiter.rejections` | counter | `origin` | each attempt the limiter turned away unsent |
//! | `reqwest_resilience.coalesce.shared` | counter | `origin`, `role`: `sent`, `joined` | each caller of a GET or HEAD shared with others ([`coalesce`](crate::coalesce)): once for the caller that sent it, once per caller that joined it (a request nobody joined is not counted) |
//! | `reqwest_resilience.rate.rejections` | counter | `origin` | each attempt the rate limit turned away unsent ([`rate`](crate::rate)) |
//!
//! `describe()` registers each instrument's unit and description with the recorder
//! installed at the time (call it once after installing one); the first report does it
//! too, for a recorder installed before it.
//!
//! [`Origin`]: crate::Origin
//! [`FailureKind`]: crate::FailureKind

#[cfg(feature = "metrics")]
pub(crate) use enabled::*;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use enabled::{describe, set_max_origin_labels};

#[cfg(not(feature = "metrics"))]
pub(crate) use disabled::*;

/// The method label taken when an attempt starts: an index into the labels' texts with
/// the feature, nothing without (a byte, not a `&str`, so the transport step's future
/// does not grow: see `stack::compose`'s test of the attempt future's size).
#[derive(Clone, Copy)]
pub(crate) struct MethodLabel(#[cfg(feature = "metrics")] u8);

#[cfg(feature = "metrics")]
mod enabled {
    use std::cell::RefCell;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, LazyLock, Once, RwLock};

    use ::metrics::{SharedString, Unit, counter, histogram};

    use super::MethodLabel;
    use crate::error::{BreakerState, RejectReason, TokenErrorKind};
    use crate::origin::Origin;
    use crate::record::{FailureKind, RequestEvidence, RetryReason, StopReason};
    use crate::sync;

    const DURATION: &str = "http.client.request.duration";
    const RETRIES: &str = "reqwest_resilience.retry.retries";
    const STOPS: &str = "reqwest_resilience.retry.stops";
    const BUDGET: &str = "reqwest_resilience.retry.budget_exhausted";
    const TRANSITIONS: &str = "reqwest_resilience.breaker.transitions";
    const REJECTIONS: &str = "reqwest_resilience.breaker.rejections";
    const PAUSES: &str = "reqwest_resilience.breaker.pauses";
    const FETCHES: &str = "reqwest_resilience.auth.token_fetches";
    const FAILURES: &str = "reqwest_resilience.auth.token_failures";
    const HEDGES_SENT: &str = "reqwest_resilience.hedge.sent";
    const HEDGES_WON: &str = "reqwest_resilience.hedge.won";
    const HEDGES_SKIPPED: &str = "reqwest_resilience.hedge.skipped";
    const COALESCED: &str = "reqwest_resilience.coalesce.shared";
    const RATE_REJECTIONS: &str = "reqwest_resilience.rate.rejections";

    /// Registers every instrument's unit and description with the current recorder.
    pub fn describe() {
        use ::metrics::{describe_counter, describe_histogram};
        describe_histogram!(
            DURATION,
            Unit::Seconds,
            "Duration of each HTTP request attempt on the wire"
        );
        describe_counter!(RETRIES, "Retries decided, by reason");
        describe_counter!(
            STOPS,
            "Logical requests ended by the retry middleware, by reason"
        );
        describe_counter!(BUDGET, "Retries refused by the retry budget");
        describe_counter!(TRANSITIONS, "Circuit breaker state changes");
        describe_counter!(
            REJECTIONS,
            "Requests turned away unsent by a breaker or a pause"
        );
        describe_counter!(PAUSES, "Server Retry-After pauses started or extended");
        describe_counter!(
            RATE_REJECTIONS,
            "Requests the rate limit turned away unsent"
        );
        describe_counter!(FETCHES, "Bearer token fetches");
        describe_counter!(FAILURES, "Bearer token fetches that gave no usable token");
        describe_counter!(HEDGES_SENT, "Extra copies of hedged requests sent");
        describe_counter!(HEDGES_WON, "Hedged requests answered by an extra copy");
        describe_counter!(
            HEDGES_SKIPPED,
            "Hedges due but not sent (hedge budget spent, or refused locally)"
        );
        describe_counter!(
            COALESCED,
            "Callers of GET or HEAD requests shared with others, by role"
        );
    }

    fn described() {
        static ONCE: Once = Once::new();
        ONCE.call_once(describe);
    }

    fn origin(origin: Option<&Origin>) -> SharedString {
        origin.map_or(SharedString::const_str(""), |o| labels_of(o).origin)
    }

    /// The methods with a label of their own (their names); any other is labelled
    /// `_OTHER`, OpenTelemetry's value for a method it does not know, which keeps the set
    /// bounded.
    static KNOWN_METHODS: [http::Method; 9] = [
        http::Method::GET,
        http::Method::HEAD,
        http::Method::POST,
        http::Method::PUT,
        http::Method::DELETE,
        http::Method::CONNECT,
        http::Method::OPTIONS,
        http::Method::TRACE,
        http::Method::PATCH,
    ];

    pub(crate) fn method_label(method: &http::Method) -> MethodLabel {
        let known = KNOWN_METHODS.iter().position(|m| m == method);
        // At most 9: fits the byte.
        MethodLabel(known.unwrap_or(KNOWN_METHODS.len()) as u8)
    }

    impl MethodLabel {
        fn text(self) -> &'static str {
            KNOWN_METHODS
                .get(usize::from(self.0))
                .map_or("_OTHER", http::Method::as_str)
        }
    }

    #[test]
    fn each_known_method_is_labelled_by_its_name_and_any_other_as_other() {
        use http::Method;
        let label = |m: Method| method_label(&m).text();
        assert_eq!(label(Method::GET), "GET");
        assert_eq!(label(Method::POST), "POST");
        assert_eq!(label(Method::PATCH), "PATCH");
        assert_eq!(label(Method::CONNECT), "CONNECT");
        let purge = Method::from_bytes(b"PURGE").expect("a method");
        assert_eq!(label(purge), "_OTHER");
    }

    /// How many origins get a label of their own (see the module docs).
    const DEFAULT_MAX_ORIGIN_LABELS: usize = 1_000;

    /// The `origin` (and `server.address`) label of every origin past the bound.
    pub(crate) const OTHER_ORIGIN: &str = "other";

    /// Sets how many distinct origins get a label of their own, process-wide (the default
    /// is 1 000). Origins already labelled keep their label; past
    /// the bound, new origins are reported as `origin="other"` (and
    /// `server.address="other"`). `0` labels none.
    pub fn set_max_origin_labels(max: usize) {
        ORIGIN_LABELS.max.store(max, Ordering::Relaxed);
    }

    static ORIGIN_LABELS: OriginLabels = OriginLabels::new(DEFAULT_MAX_ORIGIN_LABELS);

    /// The origins that have a label of their own: the first `max` reported.
    pub(super) struct OriginLabels {
        max: AtomicUsize,
        known: LazyLock<RwLock<HashSet<Arc<str>>>>,
    }

    impl OriginLabels {
        pub(super) const fn new(max: usize) -> Self {
            OriginLabels {
                max: AtomicUsize::new(max),
                known: LazyLock::new(|| RwLock::new(HashSet::new())),
            }
        }

        /// Whether `text` has a label of its own, admitting it while there is room.
        pub(super) fn admits(&self, text: &Arc<str>) -> bool {
            if sync::read(&self.known).contains(text) {
                return true;
            }
            let mut known = sync::write(&self.known);
            if known.contains(text) {
                return true;
            }
            let room = known.len() < self.max.load(Ordering::Relaxed);
            if room {
                known.insert(text.clone());
            }
            room
        }
    }

    /// An origin's labels: `origin`, `server.address` and `server.port` (none past the
    /// bound).
    #[derive(Clone)]
    struct Labelled {
        origin: SharedString,
        host: SharedString,
        port: Option<SharedString>,
    }

    /// The labels of `origin`, cached for the origin last reported on this thread: a steady
    /// stream of requests to one origin takes no lock and copies no text.
    fn labels_of(origin: &Origin) -> Labelled {
        thread_local! {
            static LAST: RefCell<Option<(Origin, Labelled)>> = const { RefCell::new(None) };
        }
        let make = || {
            let text = origin.shared_text();
            if !ORIGIN_LABELS.admits(&text) {
                let other = SharedString::const_str(OTHER_ORIGIN);
                return Labelled {
                    origin: other.clone(),
                    host: other,
                    port: None,
                };
            }
            let host: Arc<str> = origin.host().into();
            let port: Arc<str> = origin.port().to_string().into();
            Labelled {
                origin: SharedString::from(text),
                host: SharedString::from(host),
                port: Some(SharedString::from(port)),
            }
        };
        LAST.try_with(|last| {
            let mut last = last.borrow_mut();
            match &*last {
                Some((o, labels)) if o == origin => labels.clone(),
                _ => {
                    let labels = make();
                    *last = Some((origin.clone(), labels.clone()));
                    labels
                }
            }
        })
        .unwrap_or_else(|_| make())
    }

    /// The `origin` label for an instrument created once per origin (the limiter's).
    pub(crate) fn origin_label(at: &Origin) -> SharedString {
        labels_of(at).origin
    }

    pub(crate) fn attempt(method: MethodLabel, evidence: &RequestEvidence) {
        use ::metrics::Label;
        described();
        let mut labels = Vec::with_capacity(5);
        labels.push(Label::from_static_parts(
            "http.request.method",
            method.text(),
        ));
        if let Some(origin) = &evidence.origin {
            let Labelled { host, port, .. } = labels_of(origin);
            labels.push(Label::new("server.address", host));
            if let Some(port) = port {
                labels.push(Label::new("server.port", port));
            }
        }
        if let Some(status) = evidence.status() {
            let code = status_label(status);
            if status.is_client_error() || status.is_server_error() {
                labels.push(Label::new("error.type", code.clone()));
            }
            labels.push(Label::new("http.response.status_code", code));
        } else if let Some(kind) = evidence.failure {
            labels.push(Label::from_static_parts("error.type", failure(kind)));
        }
        histogram!(DURATION, labels).record(evidence.elapsed.as_secs_f64());
    }

    pub(crate) fn retry(reason: RetryReason, at: Option<&Origin>) {
        described();
        let reason = match reason {
            RetryReason::NotSent => "not_sent",
            RetryReason::BreakerRejected => "breaker_rejected",
            RetryReason::NotProcessed => "not_processed",
            RetryReason::GoAway => "go_away",
            RetryReason::NetworkChanged => "network_changed",
            RetryReason::Transient => "transient",
            RetryReason::Status(_) => "status",
            RetryReason::BodyInterrupted => "body_interrupted",
        };
        counter!(RETRIES, "origin" => origin(at), "reason" => reason).increment(1);
    }

    pub(crate) fn stop(reason: StopReason, at: Option<&Origin>) {
        described();
        let label = match reason {
            StopReason::FinalResponse(_) => "final_response",
            StopReason::StatusNotSafe(_) => "status_not_safe",
            StopReason::Permanent(_) => "permanent",
            StopReason::MayHaveBeenProcessed => "may_have_been_processed",
            StopReason::NotProcessedRetryUsed => "not_processed_retry_used",
            StopReason::RetriesExhausted => "retries_exhausted",
            StopReason::BudgetExhausted => "budget_exhausted",
            StopReason::DeadlineExceeded => "deadline_exceeded",
            StopReason::RetryAfterTooLong => "retry_after_too_long",
            StopReason::BreakerRejected => "breaker_rejected",
            StopReason::BodyNotClonable => "body_not_clonable",
            StopReason::RedirectFollowed => "redirect_followed",
            StopReason::ConcurrencyLimited => "concurrency_limited",
            StopReason::RateLimited => "rate_limited",
            StopReason::ConnectTimedOut => "connect_timed_out",
            StopReason::HandedBack => "handed_back",
        };
        counter!(STOPS, "origin" => origin(at), "reason" => label).increment(1);
        if reason == StopReason::BudgetExhausted {
            counter!(BUDGET, "origin" => origin(at)).increment(1);
        }
    }

    fn state(state: BreakerState) -> &'static str {
        match state {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Isolated => "isolated",
        }
    }

    pub(crate) fn breaker_transition(at: &Origin, from: BreakerState, to: BreakerState) {
        described();
        counter!(TRANSITIONS, "origin" => origin(Some(at)), "from" => state(from), "to" => state(to))
            .increment(1);
    }

    pub(crate) fn breaker_rejection(at: &Origin, reason: RejectReason) {
        described();
        let reason = match reason {
            RejectReason::Open => "open",
            RejectReason::ProbesBusy => "probes_busy",
            RejectReason::Isolated => "isolated",
            RejectReason::Paused => "paused",
        };
        counter!(REJECTIONS, "origin" => origin(Some(at)), "reason" => reason).increment(1);
    }

    pub(crate) fn pause(at: &Origin) {
        described();
        counter!(PAUSES, "origin" => origin(Some(at))).increment(1);
    }

    pub(crate) fn rate_rejection(at: &Origin) {
        described();
        counter!(RATE_REJECTIONS, "origin" => origin(Some(at))).increment(1);
    }

    pub(crate) fn hedge_sent(at: &Origin) {
        described();
        counter!(HEDGES_SENT, "origin" => origin(Some(at))).increment(1);
    }

    pub(crate) fn hedge_won(at: &Origin) {
        described();
        counter!(HEDGES_WON, "origin" => origin(Some(at))).increment(1);
    }

    /// `reason`: `budget` or `breaker`.
    pub(crate) fn hedge_skipped(at: &Origin, reason: &'static str) {
        described();
        counter!(HEDGES_SKIPPED, "origin" => origin(Some(at)), "reason" => reason).increment(1);
    }

    /// A caller of a shared request: `role` `sent` or `joined`.
    pub(crate) fn coalesced(at: Option<&Origin>, role: &'static str) {
        described();
        counter!(COALESCED, "origin" => origin(at), "role" => role).increment(1);
    }

    pub(crate) fn token_fetch(failure: Option<TokenErrorKind>) {
        described();
        counter!(FETCHES).increment(1);
        if let Some(kind) = failure {
            let kind = match kind {
                TokenErrorKind::Fetch => "fetch",
                TokenErrorKind::Timeout => "timeout",
                TokenErrorKind::Aborted => "aborted",
                TokenErrorKind::InvalidSecret => "invalid_secret",
            };
            counter!(FAILURES, "kind" => kind).increment(1);
        }
    }

    /// The status code as a label, without a copy for the common ones.
    fn status_label(status: http::StatusCode) -> SharedString {
        const COMMON: [&str; 18] = [
            "200", "201", "202", "204", "301", "302", "304", "400", "401", "403", "404", "408",
            "409", "429", "500", "502", "503", "504",
        ];
        COMMON.iter().find(|c| **c == status.as_str()).map_or_else(
            || status.as_str().to_owned().into(),
            |c| SharedString::const_str(c),
        )
    }

    /// The failure kind as `error.type` (snake case, a fixed set).
    fn failure(kind: FailureKind) -> &'static str {
        match kind {
            FailureKind::Connect => "connect",
            FailureKind::Dns => "dns",
            FailureKind::Tls => "tls",
            FailureKind::Certificate => "certificate",
            FailureKind::ConnectPermanent => "connect_permanent",
            FailureKind::Timeout => "timeout",
            FailureKind::Reset => "reset",
            FailureKind::Closed => "closed",
            FailureKind::Protocol => "protocol",
            FailureKind::GoAway => "go_away",
            FailureKind::Body => "body",
            FailureKind::BodyInterrupted => "body_interrupted",
            FailureKind::Redirect => "redirect",
            FailureKind::Builder => "builder",
            FailureKind::Decode => "decode",
            FailureKind::BreakerOpen => "breaker_open",
            FailureKind::Paused => "paused",
            FailureKind::TokenUnavailable => "token_unavailable",
            FailureKind::Other => "_OTHER",
            FailureKind::Misconfigured => "misconfigured",
            FailureKind::ConcurrencyLimited => "concurrency_limited",
            FailureKind::RateLimited => "rate_limited",
            FailureKind::Cancelled => "cancelled",
            FailureKind::ConnectTimeout => "connect_timeout",
            FailureKind::NoProgress => "no_progress",
            FailureKind::NetworkChanged => "network_changed",
            FailureKind::UploadBody => "upload_body",
        }
    }
}

/// The same functions, doing nothing: every call compiles away.
#[cfg(not(feature = "metrics"))]
mod disabled {
    use super::MethodLabel;
    use crate::error::{BreakerState, RejectReason, TokenErrorKind};
    use crate::origin::Origin;
    use crate::record::{RequestEvidence, RetryReason, StopReason};

    #[inline(always)]
    pub(crate) fn method_label(_: &http::Method) -> MethodLabel {
        MethodLabel()
    }
    #[inline(always)]
    pub(crate) fn attempt(_: MethodLabel, _: &RequestEvidence) {}
    #[inline(always)]
    pub(crate) fn retry(_: RetryReason, _: Option<&Origin>) {}
    #[inline(always)]
    pub(crate) fn stop(_: StopReason, _: Option<&Origin>) {}
    #[inline(always)]
    pub(crate) fn breaker_transition(_: &Origin, _: BreakerState, _: BreakerState) {}
    #[inline(always)]
    pub(crate) fn breaker_rejection(_: &Origin, _: RejectReason) {}
    #[inline(always)]
    pub(crate) fn pause(_: &Origin) {}

    pub(crate) fn rate_rejection(_: &Origin) {}

    pub(crate) fn hedge_sent(_: &Origin) {}

    pub(crate) fn hedge_won(_: &Origin) {}

    pub(crate) fn hedge_skipped(_: &Origin, _: &'static str) {}
    #[inline(always)]
    pub(crate) fn coalesced(_: Option<&Origin>, _: &'static str) {}

    pub(crate) fn token_fetch(_: Option<TokenErrorKind>) {}
}
