//! Model-based property tests (proptest) on a paused clock:
//!
//! - the `TokenManager` against a reference model of its documented rules (single fetch,
//!   refresh ahead, spacing after a failed refresh ahead, backoff after a failure without a
//!   token, invalidation by identity), under random calls, invalidations, source failures
//!   and clock steps;
//! - (the `BreakerRegistry`'s permits, held across operations, have their model in
//!   `src/breaker/tests.rs`: the permit API is crate-private.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use reqwest_resilience::auth::TokenErrorKind;
use reqwest_resilience::{AccessToken, Origin, TokenManager};
use tokio::time::Instant;

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

// ---------------------------------------------------------------------------------------
// TokenManager

const REFRESH_AHEAD: Duration = Duration::from_millis(1000);
const SPACING: Duration = Duration::from_millis(500);
const BACKOFF_INITIAL: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_millis(800);
const LIFETIMES_MS: [u64; 4] = [0, 500, 2_000, 10_000];

#[derive(Debug, Clone)]
enum TokenOp {
    /// `token()`, awaited.
    Token,
    /// `invalidate_if_current` with the last token a call returned.
    InvalidateLast,
    /// Moves the clock.
    Advance(u64),
}

fn token_op() -> impl Strategy<Value = TokenOp> {
    prop_oneof![
        4 => Just(TokenOp::Token),
        1 => Just(TokenOp::InvalidateLast),
        2 => (0u64..300).prop_map(TokenOp::Advance),
        2 => (0u64..3_000).prop_map(TokenOp::Advance),
    ]
}

/// What the source answers on its n-th call: a token with a lifetime, or a failure.
#[derive(Debug, Clone, Copy)]
struct Answer {
    ok: bool,
    lifetime_ms: u64,
}

fn answer() -> impl Strategy<Value = Answer> {
    (prop::bool::weighted(0.7), 0..LIFETIMES_MS.len()).prop_map(|(ok, i)| Answer {
        ok,
        lifetime_ms: LIFETIMES_MS[i],
    })
}

/// The reference model: the documented rules, one field per rule.
#[derive(Debug, Default)]
struct ModelManager {
    fetches: usize,
    /// (secret id, received at, expiry, refresh at)
    current: Option<(usize, Instant, Instant, Instant)>,
    ahead_not_before: Option<Instant>,
    failure_until: Option<Instant>,
    consecutive_failures: u32,
}

impl ModelManager {
    /// One fetch at `now`; `Ok(id)` or `Err(())`.
    fn fetch(&mut self, script: &[Answer], now: Instant) -> Result<usize, ()> {
        let n = self.fetches;
        self.fetches += 1;
        let a = script[n % script.len()];
        if a.ok {
            let lifetime = Duration::from_millis(a.lifetime_ms);
            let expiry = now + lifetime;
            let window = REFRESH_AHEAD.min(lifetime / 2);
            self.current = Some((n, now, expiry, expiry - window));
            self.failure_until = None;
            self.ahead_not_before = None;
            self.consecutive_failures = 0;
            Ok(n)
        } else {
            self.consecutive_failures += 1;
            let valid = self.current.is_some_and(|c| now < c.2);
            if valid {
                self.ahead_not_before = Some(now + SPACING);
            } else {
                let mut backoff = BACKOFF_INITIAL;
                for _ in 1..self.consecutive_failures {
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
                self.failure_until = Some(now + backoff.min(BACKOFF_MAX));
            }
            Err(())
        }
    }

    /// `token()` at `now`; returns the answer and whether a refresh ahead starts.
    fn token(&mut self, script: &[Answer], now: Instant) -> (Result<usize, ()>, bool) {
        if let Some((id, _, expiry, refresh_at)) = self.current
            && now < expiry
        {
            let ahead = now >= refresh_at && self.ahead_not_before.is_none_or(|at| now >= at);
            return (Ok(id), ahead);
        }
        if self.failure_until.is_some_and(|at| now < at) {
            return (Err(()), false);
        }
        (self.fetch(script, now), false)
    }
}

fn run_token_model(script: Vec<Answer>, ops: Vec<TokenOp>) {
    paused_runtime().block_on(async {
        let calls = Arc::new(Mutex::new(0usize));
        let source_calls = calls.clone();
        let source_script = script.clone();
        let manager = TokenManager::builder(move || {
            let n = {
                let mut c = source_calls.lock().unwrap();
                *c += 1;
                *c - 1
            };
            let a = source_script[n % source_script.len()];
            async move {
                if a.ok {
                    Ok(AccessToken::new(format!("t{n}"))
                        .expires_in(Duration::from_millis(a.lifetime_ms)))
                } else {
                    Err(std::io::Error::other(format!("down {n}")))
                }
            }
        })
        .refresh_ahead(REFRESH_AHEAD)
        .refresh_jitter(0.0)
        .refresh_retry_spacing(SPACING)
        .failure_backoff(BACKOFF_INITIAL, BACKOFF_MAX)
        .build();

        let mut model = ModelManager::default();
        let mut last: Option<(AccessToken, usize)> = None;
        for (step, op) in ops.iter().enumerate() {
            let now = Instant::now();
            match op {
                TokenOp::Token => {
                    let got = manager.token().await;
                    let (want, ahead) = model.token(&script, now);
                    match (&got, want) {
                        (Ok(token), Ok(id)) => {
                            assert_eq!(token.secret(), format!("t{id}"), "step {step}: {op:?}");
                            last = Some((token.clone(), id));
                        }
                        (Err(e), Err(())) => assert_eq!(e.kind(), TokenErrorKind::Fetch),
                        _ => panic!("step {step}: got {got:?}, model {want:?}"),
                    }
                    settle().await;
                    if ahead {
                        let _ = model.fetch(&script, now);
                    }
                }
                TokenOp::InvalidateLast => {
                    if let Some((token, id)) = &last {
                        let forgot = manager.invalidate_if_current(token);
                        let is_current = model.current.is_some_and(|c| c.0 == *id);
                        assert_eq!(forgot, is_current, "step {step}");
                        if is_current {
                            model.current = None;
                        }
                    }
                }
                TokenOp::Advance(ms) => {
                    tokio::time::advance(Duration::from_millis(*ms)).await;
                    settle().await;
                }
            }
            assert_eq!(
                *calls.lock().unwrap(),
                model.fetches,
                "fetches after step {step}"
            );
            let valid = model
                .current
                .filter(|c| Instant::now() < c.2)
                .map(|c| format!("t{}", c.0));
            assert_eq!(
                manager.current().map(|t| t.secret().to_owned()),
                valid,
                "current() after step {step}"
            );
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn token_manager_matches_its_reference_model(
        script in prop::collection::vec(answer(), 1..8),
        ops in prop::collection::vec(token_op(), 1..80),
    ) {
        run_token_model(script, ops);
    }
}

// ---------------------------------------------------------------------------------------
// Extreme durations

/// `Duration::MAX` as "never again" for the refresh spacing and the failure backoff: the
/// manager must hold off (one fetch per failure), not panic in the fetch task and then
/// refetch on every call.
#[test]
fn token_manager_with_duration_max_spacing_and_backoff_holds_off_without_panicking() {
    paused_runtime().block_on(async {
        let calls = Arc::new(Mutex::new(0usize));
        let counter = calls.clone();
        let manager = TokenManager::builder(move || {
            let n = {
                let mut c = counter.lock().unwrap();
                *c += 1;
                *c - 1
            };
            async move {
                if n == 0 {
                    Ok(AccessToken::new("t0").expires_in(Duration::from_secs(10)))
                } else {
                    Err(std::io::Error::other("idp down"))
                }
            }
        })
        .refresh_ahead(Duration::from_secs(5))
        .refresh_jitter(0.0)
        .refresh_retry_spacing(Duration::MAX)
        .failure_backoff(Duration::MAX, Duration::MAX)
        .build();
        let fetches = || *calls.lock().unwrap();

        assert_eq!(manager.token().await.unwrap().secret(), "t0");
        tokio::time::advance(Duration::from_secs(6)).await;
        // Refresh ahead is due: the valid token is served and one background fetch fails.
        assert_eq!(manager.token().await.unwrap().secret(), "t0");
        settle().await;
        assert_eq!(fetches(), 2);
        for _ in 0..3 {
            assert_eq!(manager.token().await.unwrap().secret(), "t0");
            settle().await;
        }
        assert_eq!(
            fetches(),
            2,
            "the spacing holds off further refreshes ahead"
        );

        tokio::time::advance(Duration::from_secs(5)).await;
        // Expired: one fetch fails, then its error is returned without fetching again.
        let first = manager.token().await.unwrap_err();
        assert_eq!(first.kind(), TokenErrorKind::Fetch);
        assert_eq!(fetches(), 3);
        for _ in 0..3 {
            let again = manager.token().await.unwrap_err();
            assert!(again.same_failure(&first));
        }
        assert_eq!(fetches(), 3, "the backoff holds off further fetches");
    });
}

// ---------------------------------------------------------------------------------------
// The origin the transport step records, through its per-thread cache

/// A connector that refuses every connection at once: requests end without DNS or a
/// socket, after the transport step has named their origin.
#[derive(Clone)]
struct NoConnect;

impl<S> tower::Layer<S> for NoConnect {
    type Service = Refuse<S>;
    fn layer(&self, inner: S) -> Refuse<S> {
        Refuse(inner)
    }
}

#[derive(Clone)]
struct Refuse<S>(S);

impl<S, R> tower::Service<R> for Refuse<S>
where
    S: tower::Service<R>,
    S::Error: From<std::io::Error>,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::future::Ready<Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: R) -> Self::Future {
        std::future::ready(Err(
            std::io::Error::other("no connections in this test").into()
        ))
    }
}

/// Shared by the cases: building a client per case would dominate the test's time. The
/// runtime is current-thread, so every case runs on the thread whose cache is tested.
static NO_CONNECT_CLIENT: std::sync::LazyLock<reqwest_middleware::ClientWithMiddleware> =
    std::sync::LazyLock::new(|| {
        reqwest_middleware::ClientBuilder::new(
            reqwest::Client::builder()
                .no_proxy()
                .connector_layer(NoConnect)
                .build()
                .unwrap(),
        )
        .with(reqwest_resilience::TransportEvidence::new())
        .build()
    });

static NO_CONNECT_RUNTIME: std::sync::LazyLock<tokio::runtime::Runtime> =
    std::sync::LazyLock::new(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    });

fn url_text() -> impl Strategy<Value = String> {
    let scheme = prop::sample::select(vec!["http", "https", "HTTP", "hTTps", "ws", "foo"]);
    let host = prop::sample::select(vec![
        "a.example",
        "A.Example",
        "a.example.",
        "A.EXAMPLE.",
        "bücher.example",
        "xn--bcher-kva.example",
        "[::1]",
        "[0:0::1]",
        "[::FFFF:7f00:1]",
        "[::ffff:127.0.0.1]",
        "127.0.0.1",
        "0x7f.1",
        "%41",
        "a%2Eexample",
        "A%2eexample",
    ]);
    let port = prop::sample::select(vec!["", ":80", ":443", ":8080", ":0", ":00443"]);
    let path = prop::sample::select(vec!["", "/", "/x?y=1", "#f"]);
    (scheme, host, port, path).prop_map(|(s, h, p, q)| format!("{s}://{h}{p}{q}"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever sequence of URLs one thread sends, the origin in each attempt's evidence
    /// is `Origin::from_url` of its URL: the per-thread origin cache never hands one URL
    /// another's origin (a wrong origin would file failures under another server's breaker).
    #[test]
    fn evidence_origin_is_the_urls_origin_for_any_sequence_of_urls(
        urls in prop::collection::vec(url_text(), 1..24),
    ) {
        let client = &*NO_CONNECT_CLIENT;
        NO_CONNECT_RUNTIME.block_on(async {
            for text in &urls {
                let Ok(url) = reqwest::Url::parse(text) else { continue };
                let request = reqwest::Request::new(http::Method::GET, url.clone());
                let mut extensions = http::Extensions::new();
                let result = client.execute_with_extensions(request, &mut extensions).await;
                assert!(result.is_err(), "{text}: nothing can connect");
                let evidence = reqwest_resilience::RequestEvidence::of(&extensions)
                    .expect("the transport step recorded the attempt");
                assert_eq!(evidence.origin, Origin::from_url(&url).ok(), "{text} after {urls:?}");
            }
        });
    }
}
