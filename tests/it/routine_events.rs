//! Routine server events are not sickness (issue 28): one event that fails every attempt
//! in flight at once (a graceful reload closing the pooled keep-alive connections requests
//! are being written on) is one piece of evidence for the breaker, not one per attempt; a
//! server that loses every connection still trips it after the policy's count of events.
//!
//! Real sockets on 127.0.0.1 under tokio's paused clock: the clients keep their pooled
//! connections with no idle timer (`pool_idle_timeout(None)`), so the only timers are the
//! retry's backoff and the tests' own bounds.

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::RetryMiddleware;
use reqwest_resilience::breaker::{
    BreakerConfig, BreakerEvent, BreakerRegistry, BreakerState, CircuitBreakerMiddleware,
    TripCause, TripPolicy,
};
use reqwest_resilience::{
    AttemptHistory, FailureKind, Origin, ResilienceError, Transmission, TransportEvidence,
};
use support::{Action, FaultServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Barrier;

const S: Duration = Duration::from_secs(1);
const IN_FLIGHT: usize = 50;

/// A keep-alive HTTP/1.1 server on 127.0.0.1 that "reloads": each `/warm/*` request waits
/// until [`IN_FLIGHT`] of them are in, so the client opens that many connections, then is
/// answered `200`; the first time a `/cut/*` path arrives it waits until [`IN_FLIGHT`] of
/// them are in and its connection is then closed without a byte of response (every
/// connection at once, as a graceful reload closes the connections requests were being
/// written on); any other request (and a `/cut/*` path seen before) is answered `200`.
struct ReloadingServer {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<HashMap<String, usize>>>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ReloadingServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ReloadingServer {
    async fn start() -> ReloadingServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (warm, cut) = (
            Arc::new(Barrier::new(IN_FLIGHT)),
            Arc::new(Barrier::new(IN_FLIGHT)),
        );
        let (s, c) = (seen.clone(), connections.clone());
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let (seen, warm, cut) = (s.clone(), warm.clone(), cut.clone());
                conns.spawn(async move {
                    let mut buf = Vec::new();
                    while let Some(path) = read_get(&mut stream, &mut buf).await {
                        let times = {
                            let mut seen = seen.lock().unwrap();
                            let n = seen.entry(path.clone()).or_default();
                            *n += 1;
                            *n
                        };
                        if path.starts_with("/warm/") {
                            warm.wait().await;
                        } else if path.starts_with("/cut/") && times == 1 {
                            cut.wait().await;
                            return;
                        }
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(ok).await.is_err() {
                            return;
                        }
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        });
        ReloadingServer {
            addr,
            seen,
            connections,
            task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    fn origin(&self) -> Origin {
        Origin::parse(&self.url("/")).unwrap()
    }

    /// How many times the server received `path`.
    fn seen(&self, path: &str) -> usize {
        self.seen.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Reads one GET's head (no body); its path, `None` at EOF.
async fn read_get(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 4);
            return head.split(' ').nth(1).map(str::to_owned);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A pooling client: keep-alive on, no idle timer for the paused clock to jump to.
fn pooling_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(None)
        .build()
        .unwrap()
}

/// A registry whose every transition is kept.
fn registry(config: BreakerConfig) -> (BreakerRegistry, Arc<Mutex<Vec<BreakerEvent>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let e = events.clone();
    let registry =
        BreakerRegistry::with_listener(config, move |event| e.lock().unwrap().push(event.clone()))
            .unwrap();
    (registry, events)
}

fn breaker_only(registry: &BreakerRegistry, client: reqwest::Client) -> ClientWithMiddleware {
    ClientBuilder::new(client)
        .with(CircuitBreakerMiddleware::new(registry.clone()))
        .with(TransportEvidence::new())
        .build()
}

/// Sends `GET {prefix}{i}` for every `i` in `0..n` at once; each result with its history.
async fn burst(
    client: &ClientWithMiddleware,
    url: impl Fn(usize) -> String,
    n: usize,
) -> Vec<(reqwest_middleware::Result<u16>, AttemptHistory)> {
    let requests = (0..n).map(|i| {
        let req = client.get(url(i)).build().unwrap();
        async move {
            let mut ext = Extensions::new();
            let result = match client.execute_with_extensions(req, &mut ext).await {
                // Read to its end: the connection goes back to the pool.
                Ok(r) => {
                    let status = r.status().as_u16();
                    r.bytes().await.map(|_| status).map_err(Into::into)
                }
                Err(e) => Err(e),
            };
            (
                result,
                AttemptHistory::of(&ext).cloned().unwrap_or_default(),
            )
        }
    });
    tokio::time::timeout(3600 * S, futures_util::future::join_all(requests))
        .await
        .expect("the burst finished")
}

/// Opens [`IN_FLIGHT`] pooled connections to `server` with one `/warm/*` burst, and lets
/// the client put them back in its pool.
async fn warm_up(client: &ClientWithMiddleware, server: &ReloadingServer) {
    for (result, _) in burst(client, |i| server.url(&format!("/warm/{i}")), IN_FLIGHT).await {
        assert_eq!(result.unwrap(), 200);
    }
    assert_eq!(server.connections(), IN_FLIGHT);
    // The idle runtime has returned every connection to the pool by then.
    tokio::time::sleep(Duration::from_millis(1)).await;
}

fn lost_connection(history: &AttemptHistory, attempt: usize) -> bool {
    let e = &history.attempts()[attempt].evidence;
    e.transmission == Transmission::SentNoResponse && e.failure == Some(FailureKind::Closed)
}

#[tokio::test(start_paused = true)]
async fn fifty_pooled_connections_closed_at_once_are_one_event_and_the_breaker_stays_closed() {
    let server = ReloadingServer::start().await;
    let (reg, events) = registry(BreakerConfig::default());
    let c = breaker_only(&reg, pooling_client());
    warm_up(&c, &server).await;

    // The reload: the 50 requests written on the 50 pooled connections all lose them.
    let results = burst(&c, |i| server.url(&format!("/cut/{i}")), IN_FLIGHT).await;
    for (i, (result, history)) in results.iter().enumerate() {
        assert!(result.is_err(), "request {i} was cut");
        assert_eq!(history.len(), 1, "request {i}: one attempt");
        assert!(lost_connection(history, 0), "request {i}: {history:?}");
        assert_eq!(server.seen(&format!("/cut/{i}")), 1);
    }
    // Written on the pooled connections: no new one.
    assert_eq!(server.connections(), IN_FLIGHT);
    let snap = &reg.snapshot()[0];
    assert_eq!(
        (snap.state, snap.consecutive_failures),
        (BreakerState::Closed, 1),
        "one event, one failure"
    );
    assert!(events.lock().unwrap().is_empty(), "no transition");

    // The origin answers the next burst on new connections; the count starts over.
    let results = burst(&c, |i| server.url(&format!("/after/{i}")), IN_FLIGHT).await;
    assert!(
        results
            .iter()
            .all(|(r, h)| r.as_ref().ok() == Some(&200) && h.len() == 1)
    );
    assert_eq!(server.connections(), 2 * IN_FLIGHT);
    assert_eq!(reg.snapshot()[0].consecutive_failures, 0);
    assert!(events.lock().unwrap().is_empty(), "no transition");
}

#[tokio::test(start_paused = true)]
async fn the_stack_rides_through_a_reload_every_get_delivered_once_more_on_a_new_connection() {
    let server = ReloadingServer::start().await;
    let (reg, events) = registry(BreakerConfig::default());
    // Exact 1 s delays: the 50 retries leave together, each on a new connection.
    let backoff = reqwest_resilience::Backoff::builder()
        .jitter(reqwest_resilience::Jitter::None)
        .build()
        .unwrap();
    let c = reqwest_resilience::Resilience::new()
        .breaker(reg.clone())
        .retry(RetryMiddleware::builder().backoff(backoff).no_budget())
        .build(pooling_client())
        .unwrap();
    warm_up(&c, &server).await;

    let results = burst(&c, |i| server.url(&format!("/cut/{i}")), IN_FLIGHT).await;
    for (i, (result, history)) in results.iter().enumerate() {
        assert_eq!(result.as_ref().ok(), Some(&200), "request {i} delivered");
        assert_eq!(history.len(), 2, "request {i}: cut, then answered");
        assert!(lost_connection(history, 0), "request {i}: {history:?}");
        assert_eq!(
            history.attempts()[1].evidence.transmission,
            Transmission::ResponseReceived(http::StatusCode::OK)
        );
        // Received twice: the cut attempt (not answered) and its retry.
        assert_eq!(server.seen(&format!("/cut/{i}")), 2);
    }
    // The retries went out on new connections.
    assert_eq!(server.connections(), 2 * IN_FLIGHT);
    assert!(events.lock().unwrap().is_empty(), "no transition");
    assert_eq!(reg.state(&server.origin()), Some(BreakerState::Closed));
}

#[tokio::test(start_paused = true)]
async fn a_server_that_resets_every_connection_trips_after_the_policys_count_of_events() {
    // Each request reaches the server on a connection of its own, which it resets.
    let server = FaultServer::always(Action::ReadThenReset).await;
    let (reg, events) = registry(BreakerConfig::default());
    let c = breaker_only(&reg, support::loopback_client());
    let origin = Origin::parse(&server.url("/")).unwrap();
    // Five rounds of 10 requests in flight together: each round is one event.
    for round in 1..=5usize {
        let results = burst(&c, |i| server.url(&format!("/{round}/{i}")), 10).await;
        for (result, history) in &results {
            assert!(result.is_err());
            let e = &history.attempts()[0].evidence;
            assert_eq!(e.failure, Some(FailureKind::Reset), "{e:?}");
            assert_eq!(history.len(), 1);
        }
        assert_eq!(server.requests_seen(), 10 * round);
        assert_eq!(server.connections(), 10 * round);
        let snap = &reg.snapshot()[0];
        if round < 5 {
            assert_eq!(
                (snap.state, snap.consecutive_failures),
                (BreakerState::Closed, round as u32)
            );
        } else {
            assert_eq!(snap.state, BreakerState::Open);
        }
    }
    let trips: Vec<_> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| (e.from, e.to, e.cause))
        .collect();
    assert_eq!(
        trips,
        [(
            BreakerState::Closed,
            BreakerState::Open,
            Some(TripCause::Failures)
        )]
    );
    // Open: the next request is turned away without touching the network.
    let results = burst(&c, |_| server.url("/rejected"), 1).await;
    let err = results[0].0.as_ref().unwrap_err();
    assert!(matches!(
        ResilienceError::from_middleware_error(err),
        Some(ResilienceError::BreakerOpen { .. })
    ));
    assert_eq!(server.requests_seen(), 50);
    assert_eq!(reg.state(&origin), Some(BreakerState::Open));
}

#[tokio::test(start_paused = true)]
async fn successive_resets_trip_as_fast_as_before_and_a_refused_connect_counts_in_full() {
    let server = FaultServer::always(Action::ReadThenReset).await;
    let (reg, events) =
        registry(BreakerConfig::default().policy(TripPolicy::consecutive_failures(3)));
    let c = breaker_only(&reg, support::loopback_client());
    for n in 1..=3usize {
        let results = burst(&c, |_| server.url("/"), 1).await;
        assert_eq!(
            results[0].1.attempts()[0].evidence.failure,
            Some(FailureKind::Reset)
        );
        assert_eq!(server.requests_seen(), n);
    }
    let origin = Origin::parse(&server.url("/")).unwrap();
    assert_eq!(reg.state(&origin), Some(BreakerState::Open));
    assert_eq!(events.lock().unwrap().len(), 1);

    // Refused connects are not connection losses: three in flight together count three.
    let port = support::refused_port();
    let url = format!("http://127.0.0.1:{port}/");
    let results = burst(&c, |_| url.clone(), 3).await;
    for (result, history) in &results {
        assert!(result.is_err());
        assert_eq!(
            history.attempts()[0].evidence.failure,
            Some(FailureKind::Connect)
        );
    }
    let refused = Origin::parse(&url).unwrap();
    assert_eq!(reg.state(&refused), Some(BreakerState::Open));
    assert_eq!(events.lock().unwrap().len(), 2);
}

// The caller's own limits are neutral (issue 28, point 2).

/// Retry (no retries; an attempt timeout when `attempt_timeout`) → breaker → transport.
fn with_retry(
    registry: &BreakerRegistry,
    attempt_timeout: Option<Duration>,
) -> ClientWithMiddleware {
    let retry = support::exact_retry().max_retries(0);
    let retry = match attempt_timeout {
        Some(t) => retry.attempt_timeout(t),
        None => retry,
    };
    ClientBuilder::new(support::loopback_client())
        .with(retry.build().unwrap())
        .with(CircuitBreakerMiddleware::new(registry.clone()))
        .with(TransportEvidence::new())
        .build()
}

/// Sends `n` GETs to `url` at once, each with `Deadline(now + deadline)` when given.
async fn cut_burst(
    client: &ClientWithMiddleware,
    url: &str,
    n: usize,
    deadline: Option<Duration>,
) -> Vec<AttemptHistory> {
    let requests = (0..n).map(|_| {
        let req = client.get(url).build().unwrap();
        async move {
            let mut ext = Extensions::new();
            if let Some(d) = deadline {
                ext.insert(reqwest_resilience::retry::Deadline(
                    tokio::time::Instant::now() + d,
                ));
            }
            let result = client.execute_with_extensions(req, &mut ext).await;
            assert!(result.is_err(), "cut");
            AttemptHistory::of(&ext).cloned().unwrap_or_default()
        }
    });
    tokio::time::timeout(3600 * S, futures_util::future::join_all(requests))
        .await
        .expect("the burst finished")
}

fn transitions(
    events: &Mutex<Vec<BreakerEvent>>,
) -> Vec<(BreakerState, BreakerState, Option<TripCause>)> {
    events
        .lock()
        .unwrap()
        .iter()
        .map(|e| (e.from, e.to, e.cause))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn five_attempts_cut_by_their_callers_deadline_trip_nothing() {
    let server = FaultServer::always(Action::Stall).await;
    let (reg, events) = registry(BreakerConfig::default());
    let c = with_retry(&reg, None);
    let t0 = tokio::time::Instant::now();
    for history in cut_burst(&c, &server.url("/"), 5, Some(2 * S)).await {
        assert_eq!(history.len(), 1);
        let e = &history.attempts()[0].evidence;
        assert_eq!(
            (e.transmission, e.failure, e.elapsed),
            (Transmission::Unknown, Some(FailureKind::Timeout), 2 * S)
        );
    }
    assert_eq!(t0.elapsed(), 2 * S);
    assert_eq!(server.requests_seen(), 5);
    let snap = &reg.snapshot()[0];
    assert_eq!(
        (snap.state, snap.consecutive_failures),
        (BreakerState::Closed, 0)
    );
    assert!(transitions(&events).is_empty());
}

#[tokio::test(start_paused = true)]
async fn five_attempts_cut_by_their_attempt_timeout_trip_the_breaker() {
    let server = FaultServer::always(Action::Stall).await;
    let (reg, events) = registry(BreakerConfig::default());
    let c = with_retry(&reg, Some(S));
    // A deadline later than the attempt timeout, or equal to it: the timeout's cut.
    for (n, deadline) in [(4usize, Some(10 * S)), (1, Some(S))] {
        for history in cut_burst(&c, &server.url("/"), n, deadline).await {
            assert_eq!(history.len(), 1);
            assert_eq!(
                history.attempts()[0].evidence.failure,
                Some(FailureKind::Timeout)
            );
        }
    }
    assert_eq!(server.requests_seen(), 5);
    assert_eq!(
        transitions(&events),
        [(
            BreakerState::Closed,
            BreakerState::Open,
            Some(TripCause::Failures)
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn a_probe_cut_by_its_callers_deadline_is_released_and_the_next_probe_closes_the_breaker() {
    // Trips on one 503; the probe hangs; then the origin answers.
    let server =
        FaultServer::sequence(vec![Action::status(503), Action::Stall], Action::ok("up")).await;
    let (reg, events) =
        registry(BreakerConfig::default().policy(TripPolicy::consecutive_failures(1)));
    // An attempt timeout longer than the probe's deadline: the deadline cuts it.
    let c = with_retry(&reg, Some(10 * S));
    let url = server.url("/");
    assert_eq!(c.get(&url).send().await.unwrap().status(), 503);
    tokio::time::sleep(30 * S).await;

    let probe = cut_burst(&c, &url, 1, Some(S)).await;
    assert_eq!(
        probe[0].attempts()[0].evidence.failure,
        Some(FailureKind::Timeout)
    );
    let snap = &reg.snapshot()[0];
    assert_eq!(
        (snap.state, snap.probes_in_flight),
        (BreakerState::HalfOpen, 0)
    );
    assert_eq!(c.get(&url).send().await.unwrap().status(), 200);
    assert_eq!(server.requests_seen(), 3);
    assert_eq!(
        transitions(&events),
        [
            (
                BreakerState::Closed,
                BreakerState::Open,
                Some(TripCause::Failures)
            ),
            (BreakerState::Open, BreakerState::HalfOpen, None),
            (BreakerState::HalfOpen, BreakerState::Closed, None),
        ]
    );
}
