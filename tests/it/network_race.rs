//! The address race (`reqwest_resilience::network`, RFC 8305) through `build_from`'s
//! client: a name whose resolver (`Network::resolver`) answers several loopback
//! addresses, each on a port of its own (the URL names no port, so each address keeps its
//! own). A dead address is a listener whose accept queue is full (`FullBacklog`: Linux
//! drops the SYN), a refused one a port with no listener. Tokio's paused clock drives the
//! attempt delay and the connect timeout; the times printed are the paused clock's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry};
use reqwest_resilience::evidence::{AddressOutcome, AddressTried, ConnectAttempts};
use reqwest_resilience::network::{ConnectFailed, Network};
use reqwest_resilience::retry::{RetryReason, StopReason};
use reqwest_resilience::{
    AttemptDecision, BreakerState, FailureKind, Origin, RequestEvidence, Resilience,
    SendWithHistory, Transmission,
};
use tokio::time::Instant;

use crate::support::{self, Action, FaultServer, FullBacklog};

const HOST: &str = "race.test";
const DELAY: Duration = Network::DEFAULT_ATTEMPT_DELAY;
const TIMEOUT: Duration = Network::DEFAULT_CONNECT_TIMEOUT;

/// Answers every name with the same addresses, in this order.
struct Fixed(Vec<SocketAddr>);

impl reqwest::dns::Resolve for Fixed {
    fn resolve(&self, _: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let addrs = self.0.clone();
        Box::pin(async move { Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs) })
    }
}

fn url(path: &str) -> String {
    format!("http://{HOST}{path}")
}

/// The default stack over a client whose resolver answers `addrs`, its breakers in
/// `registry`, exact retries.
fn client(
    addrs: &[SocketAddr],
    registry: &BreakerRegistry,
) -> reqwest_middleware::ClientWithMiddleware {
    let network = Network::new()
        .resolver(Arc::new(Fixed(addrs.to_vec())))
        .no_progress(None);
    Resilience::new()
        .retry(support::exact_retry())
        .network(network)
        .breaker(registry.clone())
        .build_from(|| {
            reqwest::Client::builder()
                .no_proxy()
                .pool_max_idle_per_host(0)
        })
        .unwrap()
}

fn registry() -> BreakerRegistry {
    BreakerRegistry::new(BreakerConfig::default()).unwrap()
}

fn tried(address: SocketAddr, outcome: AddressOutcome, started_after: Duration) -> AddressTried {
    AddressTried {
        address,
        outcome,
        started_after,
    }
}

fn connect_of(evidence: &RequestEvidence) -> ConnectAttempts {
    (**evidence
        .connect
        .as_ref()
        .expect("a new connection's record"))
    .clone()
}

#[tokio::test(start_paused = true)]
async fn a_dead_first_address_the_race_connects_to_the_second_and_then_tries_it_first() {
    let live = FaultServer::always(Action::ok("live")).await;
    let dead = FullBacklog::start().await;
    let registry = registry();
    let client = client(&[dead.addr(), live.addr()], &registry);

    let started = Instant::now();
    let one = client.get(url("/one")).send_with_history().await;
    eprintln!(
        "race: two addresses, the first dead: first connection after {:?} (paused clock)",
        started.elapsed()
    );
    let response = one.result.expect("served by the live address");
    assert_eq!(response.status(), 200);
    assert_eq!(
        started.elapsed(),
        DELAY,
        "one attempt delay, then the live one"
    );
    // One attempt of the stack: reqwest sent it again below it, on the live address.
    assert_eq!(one.history.len(), 1);
    let evidence = &one.history.attempts()[0].evidence;
    assert_eq!(
        evidence.transmission,
        Transmission::ResponseReceived(200.try_into().unwrap())
    );
    let record = connect_of(evidence);
    assert_eq!(
        record.tried,
        [
            tried(dead.addr(), AddressOutcome::Abandoned, Duration::ZERO),
            tried(live.addr(), AddressOutcome::Connected, DELAY),
        ]
    );
    assert_eq!(record.used(), Some(live.addr()));
    // The probe that found the live address, then the connection that carried the request.
    assert_eq!((live.connections(), live.requests_seen()), (2, 1));

    let again = Instant::now();
    let two = client.get(url("/two")).send().await.unwrap();
    assert_eq!(
        again.elapsed(),
        Duration::ZERO,
        "no wait on the dead address"
    );
    let record = connect_of(RequestEvidence::of_response(&two).unwrap());
    assert_eq!(
        record.tried,
        [tried(
            live.addr(),
            AddressOutcome::Connected,
            Duration::ZERO
        )]
    );
    assert_eq!((live.connections(), live.requests_seen()), (3, 2));
    // A dead address of a live host is no failure of the origin.
    let origin = Origin::parse(&url("/")).unwrap();
    assert_eq!(registry.state(&origin), Some(BreakerState::Closed));
    let snapshot = registry.snapshot();
    assert_eq!(snapshot.len(), 1);
    assert_eq!(snapshot[0].consecutive_failures, 0);
}

#[tokio::test(start_paused = true)]
async fn a_live_first_address_connects_alone_and_the_dead_one_is_never_tried() {
    let live = FaultServer::always(Action::ok("live")).await;
    let dead = FullBacklog::start().await;
    let client = client(&[live.addr(), dead.addr()], &registry());
    let response = client.get(url("/x")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let record = connect_of(RequestEvidence::of_response(&response).unwrap());
    assert_eq!(
        record.tried,
        [tried(
            live.addr(),
            AddressOutcome::Connected,
            Duration::ZERO
        )]
    );
    assert_eq!((live.connections(), live.requests_seen()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn every_address_dead_is_one_attempt_of_one_connect_timeout_not_retried() {
    let (a, b) = (FullBacklog::start().await, FullBacklog::start().await);
    let registry = registry();
    let client = client(&[a.addr(), b.addr()], &registry);

    let started = Instant::now();
    let exchange = client.get(url("/x")).send_with_history().await;
    eprintln!(
        "race: two dead addresses: failed after {:?} (paused clock)",
        started.elapsed()
    );
    // The second address started one attempt delay later and had its own timeout.
    assert_eq!(started.elapsed(), DELAY + TIMEOUT);
    let err = exchange.result.expect_err("no address connects");
    assert_eq!(exchange.history.len(), 1);
    let attempt = &exchange.history.attempts()[0];
    assert_eq!(
        (attempt.evidence.transmission, attempt.evidence.failure),
        (Transmission::NotSent, Some(FailureKind::ConnectTimeout))
    );
    assert!(matches!(
        attempt.decision,
        Some(AttemptDecision::Stop {
            reason: StopReason::ConnectTimedOut,
            ..
        })
    ));
    let want = [
        tried(a.addr(), AddressOutcome::TimedOut, Duration::ZERO),
        tried(b.addr(), AddressOutcome::TimedOut, DELAY),
    ];
    assert_eq!(connect_of(&attempt.evidence).tried, want);
    let failed = reqwest_resilience::chain::find::<ConnectFailed>(&err).expect("in the chain");
    assert!(failed.all_timed_out());
    assert_eq!(failed.attempts().tried, want);
    let text = failed.to_string();
    assert_eq!(
        text,
        format!(
            "no address of {HOST} connected: {} timed out, {} timed out",
            a.addr(),
            b.addr()
        )
    );
    // One failure for the breaker, not four.
    let snapshot = registry.snapshot();
    assert_eq!(
        (snapshot[0].state, snapshot[0].consecutive_failures),
        (BreakerState::Closed, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn refused_addresses_are_refused_each_at_once_and_the_request_is_retried() {
    let (a, b) = (
        SocketAddr::from(([127, 0, 0, 1], support::refused_port())),
        SocketAddr::from(([127, 0, 0, 1], support::refused_port())),
    );
    let client = client(&[a, b], &registry());
    let exchange = client.get(url("/x")).send_with_history().await;
    assert!(exchange.result.is_err());
    // Refused costs nothing: retried as any connection not made (1 s, 2 s, 4 s).
    assert_eq!(exchange.history.len(), 4);
    for (i, attempt) in exchange.history.attempts().iter().enumerate() {
        assert_eq!(
            (attempt.evidence.transmission, attempt.evidence.failure),
            (Transmission::NotSent, Some(FailureKind::Connect)),
            "attempt {i}"
        );
        // The second address starts as soon as the first is refused.
        assert_eq!(
            connect_of(&attempt.evidence).tried,
            [
                tried(a, AddressOutcome::Refused, Duration::ZERO),
                tried(b, AddressOutcome::Refused, Duration::ZERO),
            ],
            "attempt {i}"
        );
        if i < 3 {
            assert!(
                matches!(
                    attempt.decision,
                    Some(AttemptDecision::Retry {
                        reason: RetryReason::NotSent,
                        ..
                    })
                ),
                "attempt {i}: {:?}",
                attempt.decision
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_single_refused_address_keeps_reqwests_error_and_is_recorded() {
    let a = SocketAddr::from(([127, 0, 0, 1], support::refused_port()));
    let client = client(&[a], &registry());
    let exchange = client
        .get(url("/x"))
        .with_extension(reqwest_resilience::retry::MaxRetries(0))
        .send_with_history()
        .await;
    let err = exchange.result.expect_err("refused");
    assert!(reqwest_resilience::chain::find::<ConnectFailed>(&err).is_none());
    let refused = reqwest_resilience::chain::find::<std::io::Error>(&err).map(std::io::Error::kind);
    assert_eq!(refused, Some(std::io::ErrorKind::ConnectionRefused));
    let evidence = &exchange.history.attempts()[0].evidence;
    assert_eq!(evidence.failure, Some(FailureKind::Connect));
    assert_eq!(
        connect_of(evidence).tried,
        [tried(a, AddressOutcome::Refused, Duration::ZERO)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_pooled_connection_carries_no_connect_record() {
    let live = FaultServer::always(Action::ok("live")).await;
    let network = Network::new()
        .resolver(Arc::new(Fixed(vec![live.addr()])))
        .no_progress(None);
    let client = Resilience::new()
        .network(network)
        .build_from(|| reqwest::Client::builder().no_proxy())
        .unwrap();
    let first = client.get(url("/1")).send().await.unwrap();
    assert!(
        RequestEvidence::of_response(&first)
            .unwrap()
            .connect
            .is_some()
    );
    first.bytes().await.unwrap();
    let second = client.get(url("/2")).send().await.unwrap();
    assert_eq!(RequestEvidence::of_response(&second).unwrap().connect, None);
    assert_eq!((live.connections(), live.requests_seen()), (1, 2));
}

/// The stack over the user's own client (`Resilience::build`: no race, the user's
/// `connect_timeout`): a host that drops SYNs costs that timeout once, for a `GET` and a
/// `POST` alike, not once per retry (before: 4 attempts and the backoff between them).
#[tokio::test(start_paused = true)]
async fn over_the_users_own_client_a_dead_host_costs_its_connect_timeout_once() {
    let dead = FullBacklog::start().await;
    let user_timeout = Duration::from_secs(2);
    let own = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .connect_timeout(user_timeout)
        .build()
        .unwrap();
    let registry = registry();
    let client = Resilience::new()
        .retry(support::exact_retry())
        .breaker(registry.clone())
        .build(own)
        .unwrap();
    let url = format!("http://{}/x", dead.addr());
    for method in [reqwest::Method::GET, reqwest::Method::POST] {
        let started = Instant::now();
        let exchange = client
            .request(method.clone(), &url)
            .send_with_history()
            .await;
        assert_eq!(started.elapsed(), user_timeout, "{method}");
        assert!(exchange.result.is_err());
        assert_eq!(exchange.history.len(), 1, "{method}");
        let attempt = &exchange.history.attempts()[0];
        // `Unknown`, not `NotSent`: the client's redirects are not recorded, so the
        // connect that failed may have been a later hop's.
        assert_eq!(
            (attempt.evidence.transmission, attempt.evidence.failure),
            (Transmission::Unknown, Some(FailureKind::ConnectTimeout)),
            "{method}"
        );
        assert!(matches!(
            attempt.decision,
            Some(AttemptDecision::Stop {
                reason: StopReason::ConnectTimedOut,
                ..
            })
        ));
        // No race ran: reqwest's own connector has no record of its addresses.
        assert!(attempt.evidence.connect.is_none());
    }
    let origin = Origin::parse(&url).unwrap();
    let snapshot = registry.snapshot();
    let breaker = snapshot.iter().find(|s| s.origin == origin).unwrap();
    assert_eq!(breaker.consecutive_failures, 2);
}

/// The default stack over a client trusting the test certificate (whose name is
/// `localhost`), its resolver answering `addrs`.
fn https_client(addrs: &[SocketAddr]) -> reqwest_middleware::ClientWithMiddleware {
    let cert = reqwest::Certificate::from_pem(support::tls::CERT_PEM).unwrap();
    let network = Network::new()
        .resolver(Arc::new(Fixed(addrs.to_vec())))
        .no_progress(None);
    Resilience::new()
        .retry(support::exact_retry())
        .network(network)
        .build_from(move || {
            reqwest::Client::builder()
                .no_proxy()
                .pool_max_idle_per_host(0)
                .tls_certs_only([cert.clone()])
        })
        .unwrap()
}

/// One `https` GET to `localhost` whose name answers `first`, then a live TLS server:
/// raced past `first` after one attempt delay, in one attempt, the live server seeing
/// the probe's connection (no handshake) and then the one that carried the request.
async fn raced_past_over_https(first: SocketAddr) {
    let live = support::tls::TlsServer::start().await;
    let live_addr: SocketAddr = live.url("").trim_start_matches("https://").parse().unwrap();
    let client = https_client(&[first, live_addr]);
    let started = Instant::now();
    let exchange = client
        .get("https://localhost/secure")
        .send_with_history()
        .await;
    let response = exchange.result.expect("served by the live address");
    assert_eq!(response.status(), 200);
    // On a paused clock the probes' round trips are 0, and so is the TLS grace they give.
    assert_eq!(started.elapsed(), DELAY);
    assert_eq!(exchange.history.len(), 1);
    let record = connect_of(&exchange.history.attempts()[0].evidence);
    assert_eq!(
        record.tried,
        [
            tried(first, AddressOutcome::Abandoned, Duration::ZERO),
            tried(live_addr, AddressOutcome::Connected, DELAY),
        ]
    );
    assert_eq!(
        (live.connections(), live.handshakes(), live.requests_seen()),
        (2, 1, 1)
    );
}

/// Over `https` (the test certificate trusted, its name `localhost`), a name whose first
/// address is dead: the race connects to the second, reqwest sends the request again on
/// a connection to it, and its TLS handshake completes there: one attempt, one handshake,
/// the request seen once.
#[tokio::test(start_paused = true)]
async fn over_https_a_dead_first_address_is_raced_past_and_the_handshake_is_made_on_the_second() {
    let dead = FullBacklog::start().await;
    raced_past_over_https(dead.addr()).await;
}

/// Over `https`, a first address that accepts the connection and never answers the TLS
/// handshake (a stalled listener) and a live second: the race connects to the second,
/// and the request is answered there once; the stalled address saw one connection and
/// no request.
#[tokio::test(start_paused = true)]
async fn over_https_a_first_address_stalling_its_handshake_is_raced_past() {
    let stalled = FaultServer::always(Action::Stall).await;
    raced_past_over_https(stalled.addr()).await;
    assert_eq!((stalled.connections(), stalled.requests_seen()), (1, 0));
}
