//! A pool of proxies (`Resilience::proxies`) against real forward proxies: Debian's
//! tinyproxy, each test starting its own on `127.0.0.1` (its own config and temp dir, a
//! free port, stopped by its pid on drop) and counting the requests it carried from its
//! own log; a "proxy" that refuses (a bound port that never listens); and a loopback
//! origin (tests/support) answering `403`/`429` to its first request.
//!
//! Asserted exactly: the attempts, which proxy carried each one (the proxies' logs and the
//! evidence), the breaker of every origin (a refusing proxy's against the target's), the
//! evidence values. A missing tinyproxy skips these tests (printed), except under
//! `CI=true` where it fails them (`.ci/run` installs it). The clock is the real one: the
//! proxies are real processes; backoffs are a millisecond.

use crate::support;

use std::time::Duration;

use http::Extensions;
use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry, TripPolicy};
use reqwest_resilience::proxy::ProxyPool;
use reqwest_resilience::retry::StopReason;
use reqwest_resilience::{
    AttemptHistory, Backoff, BreakerState, FailureKind, Jitter, Origin, Resilience,
    ResilienceError, RetryMiddleware, StackError, Transmission,
};
use support::held_port::HeldRefusedPort;
use support::tinyproxy::Tinyproxy;
use support::{Action, FaultServer};

/// What a user's builder holds: loopback settings, no proxy of its own.
fn settings() -> reqwest::ClientBuilder {
    reqwest::Client::builder().pool_max_idle_per_host(0)
}

/// A retry with 1 ms between attempts, no jitter, no budget, and `max_retries`.
fn quick_retry(max_retries: u32) -> RetryMiddleware {
    RetryMiddleware::builder()
        .max_retries(max_retries)
        .backoff(
            Backoff::builder()
                .base(Duration::from_millis(1))
                .jitter(Jitter::None)
                .build()
                .unwrap(),
        )
        .no_budget()
        .build()
        .unwrap()
}

/// A retry built with the stack (so a pool can raise its limit).
fn quick_retry_builder(max_retries: u32) -> reqwest_resilience::retry::RetryMiddlewareBuilder {
    RetryMiddleware::builder()
        .max_retries(max_retries)
        .backoff(
            Backoff::builder()
                .base(Duration::from_millis(1))
                .jitter(Jitter::None)
                .build()
                .unwrap(),
        )
        .no_budget()
}

fn registry(threshold: u32) -> BreakerRegistry {
    BreakerRegistry::new(
        BreakerConfig::default().policy(TripPolicy::consecutive_failures(threshold)),
    )
    .unwrap()
}

fn origin(url: &str) -> Origin {
    Origin::from_url(&reqwest::Url::parse(url).unwrap()).unwrap()
}

/// Two tinyproxies (`None`: tinyproxy is missing, the test is skipped).
async fn two_proxies() -> Option<(Tinyproxy, Tinyproxy)> {
    tokio::task::spawn_blocking(|| Some((Tinyproxy::start(None)?, Tinyproxy::start(None)?)))
        .await
        .unwrap()
}

async fn requests(proxy: &Tinyproxy) -> Vec<String> {
    tokio::task::block_in_place(|| proxy.requests())
}

async fn get(
    client: &reqwest_middleware::ClientWithMiddleware,
    url: &str,
) -> (reqwest_middleware::Result<reqwest::Response>, Extensions) {
    let mut ext = Extensions::new();
    let request = client.get(url).build().unwrap();
    let result = client.execute_with_extensions(request, &mut ext).await;
    (result, ext)
}

/// Each attempt's (proxy, charged to the proxy, transmission).
fn route(history: &AttemptHistory) -> Vec<(Option<Origin>, bool, Transmission)> {
    history
        .attempts()
        .iter()
        .map(|r| {
            let e = &r.evidence;
            (e.proxy.clone(), e.charged_to_proxy, e.transmission)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_403_sends_the_retry_through_the_next_proxy() {
    let Some((p1, p2)) = two_proxies().await else {
        return;
    };
    let server = FaultServer::sequence(vec![Action::status(403)], Action::ok("in")).await;
    let breakers = registry(5);
    let client = Resilience::new()
        .retry(quick_retry(3))
        .breaker(breakers.clone())
        .proxies(ProxyPool::new([p1.url(), p2.url()]).rotate_on([403]))
        .build_from(settings)
        .unwrap();
    let url = server.url("/a");
    let (result, ext) = get(&client, &url).await;
    let response = result.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(server.requests_seen(), 2);
    assert_eq!(requests(&p1).await, vec![format!("GET {url}")]);
    assert_eq!(requests(&p2).await, vec![format!("GET {url}")]);
    let history = AttemptHistory::of(&ext).unwrap();
    let (o1, o2) = (origin(&p1.url()), origin(&p2.url()));
    assert_eq!(
        route(history),
        vec![
            (
                Some(o1.clone()),
                true,
                Transmission::ResponseReceived(http::StatusCode::FORBIDDEN)
            ),
            (
                Some(o2.clone()),
                false,
                Transmission::ResponseReceived(http::StatusCode::OK)
            ),
        ]
    );
    let first = &history.attempts()[0].evidence;
    assert_eq!(
        first.origin,
        Some(origin(&url)),
        "the evidence's origin is the target's"
    );
    assert_eq!(first.outcome_origin(), Some(&o1));
    // The 403 is charged to the first proxy, not the target.
    let snap = |o: &Origin| {
        breakers
            .snapshot()
            .into_iter()
            .find(|s| &s.origin == o)
            .unwrap()
    };
    assert_eq!(snap(&o1).consecutive_failures, 1);
    assert_eq!(snap(&origin(&url)).consecutive_failures, 0);
    assert_eq!(snap(&origin(&url)).state, BreakerState::Closed);
    // A later request starts from the proxy that worked.
    let (result, ext) = get(&client, &url).await;
    assert_eq!(result.unwrap().status(), 200);
    assert_eq!(AttemptHistory::of(&ext).unwrap().len(), 1);
    assert_eq!(requests(&p1).await.len(), 1);
    assert_eq!(requests(&p2).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_proxy_opens_its_own_breaker_not_the_targets() {
    let Some((p1, _unused)) = two_proxies().await else {
        return;
    };
    let refused = HeldRefusedPort::new();
    let server = FaultServer::always(Action::ok("in")).await;
    let breakers = registry(1);
    let client = Resilience::new()
        .retry(quick_retry(3))
        .breaker(breakers.clone())
        .proxies(ProxyPool::new([refused.url(""), p1.url()]))
        .build_from(settings)
        .unwrap();
    let url = server.url("/b");
    // A POST: the refused connection to the proxy is proven unsent, so it is retried.
    let mut ext = Extensions::new();
    let request = client.post(&url).body("once").build().unwrap();
    let response = client
        .execute_with_extensions(request, &mut ext)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(server.requests_seen(), 1);
    assert_eq!(requests(&p1).await, vec![format!("POST {url}")]);
    let history = AttemptHistory::of(&ext).unwrap();
    let (refusing, o1) = (origin(&refused.url("")), origin(&p1.url()));
    assert_eq!(
        route(history),
        vec![
            (Some(refusing.clone()), true, Transmission::NotSent),
            (
                Some(o1.clone()),
                false,
                Transmission::ResponseReceived(http::StatusCode::OK)
            ),
        ]
    );
    assert_eq!(
        history.attempts()[0].evidence.failure,
        Some(FailureKind::Connect)
    );
    assert_eq!(breakers.state(&refusing), Some(BreakerState::Open));
    assert_eq!(breakers.state(&origin(&url)), Some(BreakerState::Closed));
    let snapshot = breakers.snapshot();
    let working = snapshot.iter().find(|s| s.origin == o1).unwrap();
    assert_eq!(
        (working.state, working.consecutive_failures),
        (BreakerState::Closed, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotate_always_spreads_requests_and_passes_over_an_open_proxy() {
    let Some((p1, p2)) = two_proxies().await else {
        return;
    };
    let refused = HeldRefusedPort::new();
    let server = FaultServer::always(Action::ok("in")).await;
    let breakers = registry(1);
    let client = Resilience::new()
        .retry(quick_retry(3))
        .breaker(breakers.clone())
        .proxies(ProxyPool::new([p1.url(), refused.url(""), p2.url()]).rotate_always())
        .build_from(settings)
        .unwrap();
    let url = server.url("/c");
    let (o1, refusing, o2) = (
        origin(&p1.url()),
        origin(&refused.url("")),
        origin(&p2.url()),
    );
    let mut routes = Vec::new();
    for _ in 0..5 {
        let (result, ext) = get(&client, &url).await;
        assert_eq!(result.unwrap().status(), 200);
        let proxies: Vec<Option<Origin>> = route(AttemptHistory::of(&ext).unwrap())
            .into_iter()
            .map(|(p, _, _)| p)
            .collect();
        routes.push(proxies);
    }
    assert_eq!(
        routes,
        vec![
            vec![Some(o1.clone())],
            // Its turn: refused (the breaker opens at 1 failure), the retry takes the next.
            vec![Some(refusing.clone()), Some(o2.clone())],
            // Each request's first attempt takes the next turn; a retry, the proxy after
            // its previous attempt's.
            vec![Some(o2.clone())],
            vec![Some(o1.clone())],
            // The refusing proxy's turn again, its breaker open: passed over unsent.
            vec![Some(o2.clone())],
        ]
    );
    assert_eq!(server.requests_seen(), 5);
    assert_eq!(requests(&p1).await.len(), 2);
    assert_eq!(requests(&p2).await.len(), 3);
    assert_eq!(breakers.state(&refusing), Some(BreakerState::Open));
    assert_eq!(breakers.state(&origin(&url)), Some(BreakerState::Closed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_proxy_refusing_leaves_the_target_closed() {
    let (a, b) = (HeldRefusedPort::new(), HeldRefusedPort::new());
    let server = FaultServer::always(Action::ok("in")).await;
    let breakers = registry(1);
    let client = Resilience::new()
        .retry(quick_retry_builder(3).total_deadline(Duration::from_secs(5)))
        .breaker(breakers.clone())
        .proxies(ProxyPool::new([a.url(""), b.url("")]))
        .build_from(settings)
        .unwrap();
    let url = server.url("/d");
    let (result, ext) = get(&client, &url).await;
    let err = result.unwrap_err();
    let (oa, ob) = (origin(&a.url("")), origin(&b.url("")));
    let history = AttemptHistory::of(&ext).unwrap();
    // Both proxies refused; the third attempt finds both breakers open and is refused
    // unsent, with the breaker's 30 s "retry in": an open breaker fails fast, returned at
    // once (issue 42).
    let evidence: Vec<_> = history.attempts().iter().map(|r| &r.evidence).collect();
    assert_eq!(
        route(history)[..2],
        [
            (Some(oa.clone()), true, Transmission::NotSent),
            (Some(ob.clone()), true, Transmission::NotSent),
        ]
    );
    assert!(evidence.iter().all(|e| e.origin == Some(origin(&url))));
    assert_eq!(server.requests_seen(), 0);
    assert_eq!(breakers.state(&oa), Some(BreakerState::Open));
    assert_eq!(breakers.state(&ob), Some(BreakerState::Open));
    assert_eq!(breakers.state(&origin(&url)), Some(BreakerState::Closed));
    let snapshot = breakers.snapshot();
    let target = snapshot.iter().find(|s| s.origin == origin(&url)).unwrap();
    assert_eq!(target.consecutive_failures, 0);
    assert_eq!(history.len(), 3, "{evidence:#?}");
    assert_eq!(evidence[2].failure, Some(FailureKind::BreakerOpen));
    assert_eq!(evidence[2].transmission, Transmission::NotSent);
    assert_eq!(evidence[2].proxy, Some(oa.clone()));
    match ResilienceError::find(&err) {
        Some(ResilienceError::BreakerOpen { origin: o, .. }) => assert_eq!(o, &oa),
        other => panic!("{other:?} / {err:?}"),
    }
    let outcome = reqwest_resilience::retry::RetryOutcome::of(&ext).unwrap();
    assert_eq!(
        (outcome.attempts, outcome.stop),
        (3, StopReason::BreakerRejected)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_raises_the_retry_limit_to_try_every_proxy_capped_at_ten() {
    let Some((p1, _unused)) = two_proxies().await else {
        return;
    };
    let server = FaultServer::always(Action::ok("in")).await;
    let url = server.url("/e");
    // Four refusing proxies, then a working one: max_retries 1 is raised to 4.
    let refused: Vec<HeldRefusedPort> = (0..4).map(|_| HeldRefusedPort::new()).collect();
    let mut urls: Vec<String> = refused.iter().map(|r| r.url("")).collect();
    urls.push(p1.url());
    let client = Resilience::new()
        .retry(quick_retry_builder(1))
        .no_breaker()
        .proxies(ProxyPool::new(urls.clone()))
        .build_from(settings)
        .unwrap();
    let (result, ext) = get(&client, &url).await;
    assert_eq!(result.unwrap().status(), 200);
    let proxies: Vec<Option<Origin>> = route(AttemptHistory::of(&ext).unwrap())
        .into_iter()
        .map(|(p, _, _)| p)
        .collect();
    let expected: Vec<Option<Origin>> = urls.iter().map(|u| Some(origin(u))).collect();
    assert_eq!(proxies, expected);
    assert_eq!(requests(&p1).await, vec![format!("GET {url}")]);

    // Twelve refusing proxies: 11 retries would try them all, the cap gives 10.
    let refused: Vec<HeldRefusedPort> = (0..12).map(|_| HeldRefusedPort::new()).collect();
    let client = Resilience::new()
        .retry(quick_retry_builder(1))
        .no_breaker()
        .proxies(ProxyPool::new(refused.iter().map(|r| r.url(""))))
        .build_from(settings)
        .unwrap();
    let (result, ext) = get(&client, &url).await;
    assert!(result.is_err());
    assert_eq!(AttemptHistory::of(&ext).unwrap().len(), 11);
    assert_eq!(server.requests_seen(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_407_is_the_proxys_and_credentials_stay_hidden() {
    let Some(guarded) =
        tokio::task::spawn_blocking(|| Tinyproxy::start(Some(("alice", "s3cr3t-pw"))))
            .await
            .unwrap()
    else {
        return;
    };
    let server = FaultServer::always(Action::ok("in")).await;
    let breakers = registry(5);
    // The same proxy twice: without credentials (407), then with them.
    let pool = ProxyPool::new([guarded.url(), guarded.url_with("alice", "s3cr3t-pw")]);
    let stack = Resilience::new()
        .retry(quick_retry(3))
        .breaker(breakers.clone())
        .proxies(pool);
    let shown = format!("{stack:?}");
    assert!(
        !shown.contains("s3cr3t-pw") && !shown.contains("alice"),
        "{shown}"
    );
    let client = stack.build_from(settings).unwrap();
    let url = server.url("/f");
    let (result, ext) = get(&client, &url).await;
    assert_eq!(result.unwrap().status(), 200);
    let history = AttemptHistory::of(&ext).unwrap();
    let o = origin(&guarded.url());
    assert_eq!(
        route(history),
        vec![
            (
                Some(o.clone()),
                true,
                Transmission::ResponseReceived(http::StatusCode::PROXY_AUTHENTICATION_REQUIRED)
            ),
            (
                Some(o.clone()),
                false,
                Transmission::ResponseReceived(http::StatusCode::OK)
            ),
        ]
    );
    assert_eq!(
        requests(&guarded).await,
        vec![format!("GET {url}"), format!("GET {url}")]
    );
    assert_eq!(server.requests_seen(), 1);
    let shown = format!("{history:?}");
    assert!(!shown.contains("s3cr3t-pw"), "{shown}");
    let snapshot = breakers.snapshot();
    // One origin for both entries (the proxy's): its failure then its success.
    let proxy = snapshot.iter().find(|s| s.origin == o).unwrap();
    assert_eq!(proxy.consecutive_failures, 0);
    let target = snapshot.iter().find(|s| s.origin == origin(&url)).unwrap();
    assert_eq!(target.consecutive_failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_pauses_the_proxy_not_the_target() {
    let Some((p1, p2)) = two_proxies().await else {
        return;
    };
    let server = FaultServer::sequence(
        vec![Action::status(429).header("retry-after", "1")],
        Action::ok("in"),
    )
    .await;
    let breakers = registry(5);
    let client = Resilience::new()
        .retry(quick_retry(3))
        .breaker(breakers.clone())
        .proxies(ProxyPool::new([p1.url(), p2.url()]).rotate_on([429]))
        .build_from(settings)
        .unwrap();
    let url = server.url("/g");
    // A POST: a 429 is retried whatever the method.
    let mut ext = Extensions::new();
    let request = client.post(&url).body("x").build().unwrap();
    let response = client
        .execute_with_extensions(request, &mut ext)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let history = AttemptHistory::of(&ext).unwrap();
    let (o1, o2) = (origin(&p1.url()), origin(&p2.url()));
    let proxies: Vec<_> = route(history).into_iter().map(|(p, c, _)| (p, c)).collect();
    assert_eq!(proxies, vec![(Some(o1.clone()), true), (Some(o2), false)]);
    assert_eq!(
        history.attempts()[0].evidence.retry_after,
        Some(Duration::from_secs(1))
    );
    assert_eq!(requests(&p1).await, vec![format!("POST {url}")]);
    assert_eq!(requests(&p2).await, vec![format!("POST {url}")]);
    let snapshot = breakers.snapshot();
    let target = snapshot.iter().find(|s| s.origin == origin(&url)).unwrap();
    assert_eq!(target.paused_for, None);
    assert_eq!(target.consecutive_failures, 0);
    let proxy = snapshot.iter().find(|s| s.origin == o1).unwrap();
    assert_eq!(proxy.consecutive_failures, 1);
}

#[test]
fn bad_pools_fail_the_build_with_a_typed_error() {
    let stack_error = |r: Result<reqwest_middleware::ClientWithMiddleware, ResilienceError>| match r
    {
        Err(ResilienceError::InvalidStack(e)) => e,
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("built"),
    };
    let pool = |urls: &[&str]| Resilience::new().proxies(ProxyPool::new(urls.to_vec()));
    assert_eq!(
        stack_error(pool(&[]).build_from(settings)),
        StackError::NoProxies
    );
    let err =
        stack_error(pool(&["http://127.0.0.1:1", "not a url, pw=hunter2"]).build_from(settings));
    assert_eq!(err, StackError::InvalidProxy { index: 1 });
    assert!(!err.to_string().contains("hunter2"));
    assert_eq!(
        stack_error(
            Resilience::new()
                .proxies(ProxyPool::new(["http://127.0.0.1:1"]).rotate_on([42]))
                .build_from(settings)
        ),
        StackError::InvalidRotateStatus { status: 42 }
    );
    // One builder cannot be cloned into a client per proxy.
    assert_eq!(
        stack_error(pool(&["http://127.0.0.1:1"]).build_from(settings())),
        StackError::ProxiesNeedBuildFrom {
            with: "a single ClientBuilder"
        }
    );
    assert!(matches!(
        stack_error(pool(&["http://127.0.0.1:1"]).build(settings().build().unwrap())),
        StackError::ProxiesNeedBuildFrom { .. }
    ));
    assert!(matches!(
        pool(&["http://127.0.0.1:1"]).into_middlewares(),
        Err(ResilienceError::InvalidStack(
            StackError::ProxiesNeedBuildFrom { .. }
        ))
    ));
    assert_eq!(
        stack_error(
            pool(&["http://127.0.0.1:1"])
                .resume_bodies(true)
                .build_from(settings)
        ),
        StackError::ProxiesNeedBuildFrom {
            with: "resume_bodies"
        }
    );
}

/// The fork's client through a pool: no tinyproxy needed, the second "proxy" is a loopback
/// server answering the proxied (absolute-form) request itself.
#[cfg(feature = "astral")]
#[tokio::test]
async fn the_forks_client_goes_through_the_pool_too() {
    use reqwest_resilience::stack::astral::AstralResilience;

    let refused = HeldRefusedPort::new();
    let proxy = FaultServer::always(Action::ok("relayed")).await;
    let breakers = registry(1);
    let client = Resilience::new()
        .retry(quick_retry(3))
        .breaker(breakers.clone())
        .proxies(ProxyPool::new([refused.url(""), proxy.url("")]))
        .build_from_astral(settings)
        .unwrap();
    let target = "http://api.example.test/items";
    let mut ext = Extensions::new();
    let request = client.post(target).body("x").build().unwrap();
    let response = client
        .execute_with_extensions(request, &mut ext)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let seen = proxy.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("POST", target)
    );
    let history = AttemptHistory::of(&ext).unwrap();
    let (refusing, relaying) = (origin(&refused.url("")), origin(&proxy.url("")));
    assert_eq!(
        route(history),
        vec![
            (Some(refusing.clone()), true, Transmission::NotSent),
            (
                Some(relaying),
                false,
                Transmission::ResponseReceived(http::StatusCode::OK)
            ),
        ]
    );
    assert_eq!(breakers.state(&refusing), Some(BreakerState::Open));
    assert_eq!(breakers.state(&origin(target)), Some(BreakerState::Closed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_tunnel_the_proxy_cannot_open_is_the_targets() {
    let Some((p1, p2)) = two_proxies().await else {
        return;
    };
    // Nobody listens at the target: tinyproxy answers the CONNECT `500 Unable to connect`,
    // which reqwest reports as a failed connect (the status is not handed out), before any
    // byte of the request went to the target. The proxy answered: the target's failure,
    // and a success for the proxy, so the retries stay on it (issue 42).
    let down = HeldRefusedPort::new();
    let breakers = registry(5);
    let client = Resilience::new()
        .retry(quick_retry(3))
        .breaker(breakers.clone())
        .proxies(ProxyPool::new([p1.url(), p2.url()]))
        .build_from(settings)
        .unwrap();
    let target = format!("https://127.0.0.1:{}/t", down.port());
    let (result, ext) = get(&client, &target).await;
    assert!(result.unwrap_err().is_connect());
    let history = AttemptHistory::of(&ext).unwrap();
    let (o1, o2) = (origin(&p1.url()), origin(&p2.url()));
    assert_eq!(
        route(history),
        vec![(Some(o1.clone()), false, Transmission::NotSent); 4]
    );
    assert!(
        history
            .attempts()
            .iter()
            .all(|r| r.evidence.failure == Some(FailureKind::Connect))
    );
    let connect = format!("CONNECT 127.0.0.1:{}", down.port());
    assert_eq!(requests(&p1).await, vec![connect; 4]);
    assert_eq!(requests(&p2).await, Vec::<String>::new());
    let snapshot = breakers.snapshot();
    let failures = |o: &Origin| {
        snapshot
            .iter()
            .find(|s| &s.origin == o)
            .map(|s| (s.state, s.consecutive_failures))
    };
    assert_eq!(failures(&o1), Some((BreakerState::Closed, 0)));
    assert_eq!(failures(&o2), None, "never used");
    assert_eq!(failures(&origin(&target)), Some((BreakerState::Closed, 4)));
}

/// One dead https target does not shut the proxies for every target: three requests to it
/// through two working proxies open the target's breaker (its failures, reported by the
/// proxy that answered the `CONNECT`), not the proxies', and a request to a healthy target
/// through them passes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_https_target_opens_its_own_breaker_not_the_proxies() {
    let Some((p1, p2)) = two_proxies().await else {
        return;
    };
    let down = HeldRefusedPort::new();
    let healthy = FaultServer::always(Action::ok("up")).await;
    let breakers = registry(2);
    let client = Resilience::new()
        .retry(quick_retry(1))
        .breaker(breakers.clone())
        .proxies(ProxyPool::new([p1.url(), p2.url()]))
        .build_from(settings)
        .unwrap();
    let dead = format!("https://127.0.0.1:{}/t", down.port());
    let (o1, o2) = (origin(&p1.url()), origin(&p2.url()));
    let mut attempts = Vec::new();
    for _ in 0..3 {
        let (result, ext) = get(&client, &dead).await;
        assert!(result.is_err());
        let history = AttemptHistory::of(&ext).unwrap();
        attempts.push(
            history
                .attempts()
                .iter()
                .map(|r| (r.evidence.proxy.clone(), r.evidence.failure))
                .collect::<Vec<_>>(),
        );
    }
    // The first request's two attempts went through p1 (a success for it each time) and
    // opened the target's breaker; the next two were refused by it at once.
    let tunnel = (Some(o1.clone()), Some(FailureKind::Connect));
    let refused = (None, Some(FailureKind::BreakerOpen));
    assert_eq!(
        attempts,
        vec![
            vec![tunnel.clone(), tunnel],
            vec![refused.clone()],
            vec![refused]
        ]
    );
    let connect = format!("CONNECT 127.0.0.1:{}", down.port());
    assert_eq!(requests(&p1).await, vec![connect; 2]);
    assert_eq!(requests(&p2).await, Vec::<String>::new());
    assert_eq!(breakers.state(&o1), Some(BreakerState::Closed));
    assert_eq!(breakers.state(&o2), None);
    assert_eq!(breakers.state(&origin(&dead)), Some(BreakerState::Open));
    let p1_failures = breakers
        .snapshot()
        .into_iter()
        .find(|s| s.origin == o1)
        .map(|s| s.consecutive_failures);
    assert_eq!(p1_failures, Some(0));

    let url = healthy.url("/h");
    let (result, ext) = get(&client, &url).await;
    assert_eq!(result.unwrap().status(), 200);
    let history = AttemptHistory::of(&ext).unwrap();
    assert_eq!(
        route(history),
        vec![(
            Some(o1.clone()),
            false,
            Transmission::ResponseReceived(http::StatusCode::OK)
        )]
    );
    assert_eq!(healthy.requests_seen(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_targets_bad_certificate_through_a_tunnel_is_the_targets() {
    let Some((p1, _unused)) = two_proxies().await else {
        return;
    };
    // A TLS server with a self-signed certificate: the tunnel opens, the handshake with
    // the target (through it) fails: the target's failure, not the proxy's.
    let server = support::tls::TlsServer::start().await;
    let breakers = registry(5);
    let client = Resilience::new()
        .retry(quick_retry(3))
        .breaker(breakers.clone())
        .proxies(ProxyPool::new([p1.url()]))
        .build_from(settings)
        .unwrap();
    let target = server.url("/t");
    let (result, ext) = get(&client, &target).await;
    assert!(result.is_err());
    let history = AttemptHistory::of(&ext).unwrap();
    let o1 = origin(&p1.url());
    assert_eq!(
        route(history),
        vec![(Some(o1.clone()), false, Transmission::NotSent)]
    );
    assert_eq!(
        history.attempts()[0].evidence.failure,
        Some(FailureKind::Certificate)
    );
    assert_eq!((server.connections(), server.handshakes()), (1, 0));
    assert_eq!(server.requests_seen(), 0);
    let host_port = target.trim_start_matches("https://").trim_end_matches("/t");
    assert_eq!(requests(&p1).await, vec![format!("CONNECT {host_port}")]);
    let snapshot = breakers.snapshot();
    let entry = |o: &Origin| snapshot.iter().find(|s| &s.origin == o).unwrap().clone();
    // The certificate error is a failure of the target; the proxy relayed the handshake.
    assert_eq!(entry(&origin(&target)).consecutive_failures, 1);
    assert_eq!(entry(&o1).consecutive_failures, 0);
}

/// `BreakerRegistry::isolate` takes a proxy out of the pool by hand; `reset` puts it back.
/// No tinyproxy needed: the "proxies" are loopback servers answering the proxied request.
#[tokio::test]
async fn an_isolated_proxy_is_taken_out_of_the_pool() {
    let (a, b) = (
        FaultServer::always(Action::ok("a")).await,
        FaultServer::always(Action::ok("b")).await,
    );
    let breakers = registry(5);
    let client = Resilience::new()
        .retry(quick_retry(3))
        .breaker(breakers.clone())
        .proxies(ProxyPool::new([a.url(""), b.url("")]))
        .build_from(settings)
        .unwrap();
    let target = "http://api.example.test/x";
    let body = |r: reqwest::Response| async move { r.text().await.unwrap() };
    assert_eq!(body(client.get(target).send().await.unwrap()).await, "a");
    assert!(breakers.isolate(&origin(&a.url(""))));
    assert_eq!(body(client.get(target).send().await.unwrap()).await, "b");
    assert_eq!(body(client.get(target).send().await.unwrap()).await, "b");
    breakers.reset(&origin(&a.url("")));
    assert_eq!(body(client.get(target).send().await.unwrap()).await, "a");
    assert_eq!((a.requests_seen(), b.requests_seen()), (2, 2));
}

/// An attempt cut by the attempt timeout through a proxy keeps its proxy: the evidence
/// names it (not charged to it), the timeout counts for the target, and the proxy, which
/// took the request, has a success. No tinyproxy needed: the "proxy" is a loopback server
/// that reads the proxied request and never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_cut_by_its_timeout_through_a_proxy_keeps_the_proxy() {
    let stalling = FaultServer::always(Action::Stall).await;
    // A failure ratio, so that the window counts each outcome (a success too).
    let breakers =
        BreakerRegistry::new(BreakerConfig::default().policy(TripPolicy::failure_ratio(
            0.5,
            Duration::from_secs(60),
            100,
        )))
        .unwrap();
    let client = Resilience::new()
        .retry(quick_retry_builder(0).attempt_timeout(Duration::from_millis(300)))
        .breaker(breakers.clone())
        .proxies(ProxyPool::new([stalling.url("")]))
        .build_from(settings)
        .unwrap();
    let target = "http://api.example.test/slow";
    let (result, ext) = get(&client, target).await;
    assert!(result.is_err());
    let history = AttemptHistory::of(&ext).unwrap();
    let proxy = origin(&stalling.url(""));
    assert_eq!(
        route(history),
        vec![(Some(proxy.clone()), false, Transmission::Unknown)]
    );
    let evidence = &history.attempts()[0].evidence;
    assert_eq!(evidence.failure, Some(FailureKind::Timeout));
    assert_eq!(evidence.origin, Some(origin(target)));
    assert_eq!(evidence.outcome_origin(), Some(&origin(target)));
    assert_eq!(
        reqwest_resilience::RequestEvidence::of(&ext).map(|e| e.proxy.clone()),
        Some(Some(proxy.clone()))
    );
    assert_eq!(stalling.requests_seen(), 1);
    let snapshot = breakers.snapshot();
    let window = |o: &Origin| {
        snapshot
            .iter()
            .find(|s| &s.origin == o)
            .map(|s| (s.state, s.window_attempts, s.window_failures))
    };
    assert_eq!(window(&proxy), Some((BreakerState::Closed, 1, 0)));
    assert_eq!(window(&origin(target)), Some((BreakerState::Closed, 1, 1)));
}

/// A proxy whose SYNs go unanswered (a dead host: a loopback listener with a full accept
/// queue) times out its connect; the retry goes through the next proxy, which answers.
/// The dead proxy's breaker counts the failure, the target's nothing. No tinyproxy: the
/// live "proxy" is a loopback server answering the proxied request.
#[tokio::test(start_paused = true)]
async fn a_proxy_that_drops_syns_is_passed_over_for_the_next() {
    let dead = support::FullBacklog::start().await;
    let live = FaultServer::always(Action::ok("via the live proxy")).await;
    let dead_url = format!("http://{}", dead.addr());
    let breakers = registry(5);
    let client = Resilience::new()
        .retry(quick_retry_builder(1))
        .breaker(breakers.clone())
        .proxies(ProxyPool::new([dead_url.clone(), live.url("")]))
        .build_from(settings)
        .unwrap();
    let target = "http://api.example.test/x";
    let (result, ext) = get(&client, target).await;
    let history = AttemptHistory::of(&ext).unwrap();
    let (dead_proxy, live_proxy) = (origin(&dead_url), origin(&live.url("")));
    assert_eq!(
        route(history),
        vec![
            (Some(dead_proxy.clone()), true, Transmission::NotSent),
            (
                Some(live_proxy.clone()),
                false,
                Transmission::ResponseReceived(200.try_into().unwrap())
            ),
        ]
    );
    assert_eq!(
        history.attempts()[0].evidence.failure,
        Some(FailureKind::ConnectTimeout)
    );
    assert_eq!(result.expect("through the live proxy").status(), 200);
    assert_eq!(live.requests_seen(), 1);
    let failures = |o: &Origin| {
        let snapshot = breakers.snapshot();
        snapshot
            .iter()
            .find(|s| &s.origin == o)
            .map(|s| s.consecutive_failures)
    };
    assert_eq!(failures(&dead_proxy), Some(1));
    assert_eq!(failures(&live_proxy), Some(0));
    assert_eq!(failures(&origin(target)).unwrap_or(0), 0);
}

/// Every proxy of the pool drops SYNs: each is tried once, then the request stops,
/// `ConnectTimedOut`: two connect timeouts (and the 1 ms backoff), not four. A pool of one
/// such proxy stops after its one timeout, as a single dead host does.
#[tokio::test(start_paused = true)]
async fn every_proxy_dropping_syns_is_tried_once_then_the_request_stops() {
    let timeout = reqwest_resilience::network::Network::DEFAULT_CONNECT_TIMEOUT;
    for proxies in [1, 2] {
        let mut dead = Vec::new();
        for _ in 0..proxies {
            dead.push(support::FullBacklog::start().await);
        }
        let urls: Vec<String> = dead
            .iter()
            .map(|d| format!("http://{}", d.addr()))
            .collect();
        let client = Resilience::new()
            .retry(quick_retry_builder(3))
            .breaker(registry(5))
            .proxies(ProxyPool::new(urls.clone()))
            .build_from(settings)
            .unwrap();
        let started = tokio::time::Instant::now();
        let (result, ext) = get(&client, "http://api.example.test/x").await;
        let elapsed = started.elapsed();
        let history = AttemptHistory::of(&ext).unwrap();
        let want: Vec<_> = urls
            .iter()
            .map(|u| (Some(origin(u)), true, Transmission::NotSent))
            .collect();
        assert_eq!(route(history), want, "{proxies} proxies");
        assert!(
            history
                .attempts()
                .iter()
                .all(|r| r.evidence.failure == Some(FailureKind::ConnectTimeout))
        );
        assert!(matches!(
            history.attempts().last().unwrap().decision,
            Some(reqwest_resilience::AttemptDecision::Stop {
                reason: StopReason::ConnectTimedOut,
                ..
            })
        ));
        assert!(result.is_err());
        let backoffs = Duration::from_millis(1) * (proxies - 1);
        assert_eq!(elapsed, timeout * proxies + backoffs, "{proxies} proxies");
    }
}

/// A proxy whose connect timed out is not waited on twice in one request: with the
/// proxy between the two dead ones isolated, the rotation comes back to the first, and
/// its second timeout stops the request (three attempts, not the retry limit's four).
#[tokio::test(start_paused = true)]
async fn a_proxy_timing_out_twice_in_one_request_stops_it() {
    let (a, c) = (
        support::FullBacklog::start().await,
        support::FullBacklog::start().await,
    );
    let b = FaultServer::always(Action::ok("isolated")).await;
    let urls = [
        format!("http://{}", a.addr()),
        b.url(""),
        format!("http://{}", c.addr()),
    ];
    let breakers = registry(5);
    assert!(breakers.isolate(&origin(&urls[1])));
    let client = Resilience::new()
        .retry(quick_retry_builder(3))
        .breaker(breakers.clone())
        .proxies(ProxyPool::new(urls.clone()))
        .build_from(settings)
        .unwrap();
    let (result, ext) = get(&client, "http://api.example.test/x").await;
    let history = AttemptHistory::of(&ext).unwrap();
    let (a, c) = (origin(&urls[0]), origin(&urls[2]));
    assert_eq!(
        route(history),
        vec![
            (Some(a.clone()), true, Transmission::NotSent),
            (Some(c), true, Transmission::NotSent),
            (Some(a), true, Transmission::NotSent),
        ]
    );
    assert!(matches!(
        history.attempts().last().unwrap().decision,
        Some(reqwest_resilience::AttemptDecision::Stop {
            reason: StopReason::ConnectTimedOut,
            ..
        })
    ));
    assert!(result.is_err());
    assert_eq!(b.requests_seen(), 0);
}
