//! Network weather (DESIGN.md, "Network weather"; `src/network/mod.rs`): the path's faults,
//! in network namespaces with a veth pair and `nft` rules (`tests/support/netns.rs`), for
//! bare reqwest and the default stack side by side.
//!
//! Needs root on Linux with `ip` and `nft`; elsewhere each test prints `skipped: <why>`
//! (under `CI=true` it fails instead). Real time throughout: the kernel's timers (SYN
//! retransmits, `TCP_USER_TIMEOUT`, keep-alive probes) do not follow tokio's clock. Every
//! wait on a kernel timeout is shortened by configuration on both sides compared, so each
//! test ends within about 15 s; the elapsed times are printed (`--nocapture`), never
//! asserted. What is asserted: how often the server saw each request and on which
//! connection, the attempts and their evidence, the breaker's state.
//!
//! Each fault is run for bare reqwest and for the stack: the bare test shows the wait the
//! stack's test removes (the no-progress bound, the network watch, the address race).

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration as S, Instant};

use reqwest_resilience::breaker::{BreakerConfig, BreakerRegistry};
use reqwest_resilience::evidence::AddressOutcome;
use reqwest_resilience::network::Network;
use reqwest_resilience::{
    AttemptDecision, BreakerState, Exchange, FailureKind, Origin, RequestEvidence, Resilience,
    SendWithHistory, Transmission,
};
use support::Action;
use support::netns::{Lab, LabServer, PORT};

/// Bare reqwest as a user builds it (no proxy: the lab has none).
fn bare() -> reqwest::ClientBuilder {
    reqwest::Client::builder().no_proxy()
}

/// Bare reqwest whose kernel waits are 3 s instead of 30 s and more: `TCP_USER_TIMEOUT`
/// 3 s, keep-alive probes after 1 s idle, 1 s apart.
fn short_kernel_waits(builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
    builder
        .tcp_user_timeout(S::from_secs(3))
        .tcp_keepalive(S::from_secs(1))
        .tcp_keepalive_interval(S::from_secs(1))
        .tcp_keepalive_retries(2)
}

/// The default stack with its breakers in `registry` (default config) and `network`.
fn stack(
    network: Network,
    builder: fn() -> reqwest::ClientBuilder,
    registry: &BreakerRegistry,
) -> reqwest_middleware::ClientWithMiddleware {
    Resilience::new()
        .network(network)
        .breaker(registry.clone())
        .build_from(builder)
        .unwrap()
}

fn registry() -> BreakerRegistry {
    BreakerRegistry::new(BreakerConfig::default()).unwrap()
}

/// Each attempt's transmission and failure.
fn attempts(exchange: &Exchange) -> Vec<(Transmission, Option<FailureKind>)> {
    exchange
        .history
        .attempts()
        .iter()
        .map(|r| (r.evidence.transmission, r.evidence.failure))
        .collect()
}

fn elapsed(what: &str, since: Instant) {
    eprintln!("weather: {what}: {:.1} s", since.elapsed().as_secs_f64());
}

/// Distinct connection indices, in order of first use.
fn distinct(mut connections: Vec<usize>) -> Vec<usize> {
    let mut seen = Vec::new();
    connections.retain(|c| {
        let new = !seen.contains(c);
        seen.push(*c);
        new
    });
    connections
}

// (a) A server that accepts and never answers.

#[test]
fn a_server_that_never_answers_holds_bare_reqwest() {
    let Some(lab) = Lab::new_or_skip() else {
        return;
    };
    let server = lab.serve(|_, _| Action::Stall);
    lab.client(|| async {
        let client = bare().build().unwrap();
        let start = Instant::now();
        let waited = tokio::time::timeout(S::from_secs(3), client.get(lab.url("/stuck")).send());
        assert!(waited.await.is_err(), "bare reqwest is still waiting");
        elapsed("never answers, bare reqwest (still waiting)", start);
    });
    assert_eq!(server.saw("GET", "/stuck"), 1);
    assert_eq!(server.connections(), 1);
}

#[test]
fn the_stack_does_not_cut_a_slow_answer() {
    let Some(lab) = Lab::new_or_skip() else {
        return;
    };
    let server = lab.serve(|_, _| Action::Delay(S::from_secs(2), Box::new(Action::ok("late"))));
    let registry = registry();
    let exchange = lab.client(|| async {
        let client = stack(Network::new(), bare, &registry);
        let start = Instant::now();
        let exchange = client.get(lab.url("/slow")).send_with_history().await;
        elapsed("a 2 s answer, default stack", start);
        exchange
    });
    assert_eq!(
        attempts(&exchange),
        [(
            Transmission::ResponseReceived(200.try_into().unwrap()),
            None
        )]
    );
    assert_eq!(exchange.result.unwrap().status(), 200);
    assert_eq!(server.saw("GET", "/slow"), 1);
}

#[test]
fn the_stack_cuts_a_stuck_get_after_no_progress_and_sends_it_again_but_never_a_post() {
    let Some(lab) = Lab::new_or_skip() else {
        return;
    };
    let server = lab.serve(|_, _| Action::Stall);
    let registry = registry();
    let (get, post) = lab.client(|| async {
        let network = Network::new().no_progress(Some(S::from_secs(1)));
        let client = stack(network, bare, &registry);
        let start = Instant::now();
        let get = client.get(lab.url("/stuck")).send_with_history().await;
        elapsed("never answers, stack (no progress 1 s), GET", start);
        let start = Instant::now();
        let post = client
            .post(lab.url("/pay"))
            .body("1 EUR")
            .send_with_history()
            .await;
        elapsed("never answers, stack (no progress 1 s), POST", start);
        (get, post)
    });
    assert!(get.result.is_err());
    assert_eq!(
        attempts(&get),
        vec![(Transmission::Unknown, Some(FailureKind::NoProgress)); 4]
    );
    // Each attempt on a connection of its own: a cut attempt's connection is not reused.
    assert_eq!(server.connections_of("GET", "/stuck"), [0, 1, 2, 3]);
    assert!(post.result.is_err());
    assert_eq!(
        attempts(&post),
        [(Transmission::Unknown, Some(FailureKind::NoProgress))]
    );
    assert_eq!(server.saw("POST", "/pay"), 1, "a POST is never sent twice");
}

// (b) The pooled connections' path dies, new connections work; then the client's address
// changes (a VPN reconnect).

/// `/warm` answers; the first `/item` and `/pay` (on the two warm connections) reach the
/// server and get no answer, later ones do.
fn dying_path_server(lab: &Lab) -> LabServer {
    lab.serve(|_, req| match req.path.as_str() {
        "/item" | "/pay" if req.connection < 2 => Action::Stall,
        _ => Action::ok("fine"),
    })
}

/// Two pooled connections, a GET and a POST in flight on them; once the server has both,
/// every packet of both connections is dropped and the client's address changes.
async fn path_dies_then_address_changes(
    lab: &Lab,
    server: &LabServer,
    client: &reqwest_middleware::ClientWithMiddleware,
) -> (Exchange, Exchange) {
    let warm = || client.get(lab.url("/warm")).send();
    let (a, b) = tokio::join!(warm(), warm());
    assert_eq!(a.unwrap().status(), 200);
    assert_eq!(b.unwrap().status(), 200);
    assert_eq!(server.connections(), 2, "two pooled connections");
    let start = Instant::now();
    let weather = async {
        server.wait_for("GET", "/item", 1, S::from_secs(10)).await;
        server.wait_for("POST", "/pay", 1, S::from_secs(10)).await;
        for c in 0..2 {
            let _dead = lab.drop_flow(server.connection(c).peer);
        }
        tokio::time::sleep(S::from_millis(300)).await;
        lab.change_client_address();
    };
    let get = client.get(lab.url("/item")).send_with_history();
    let post = client
        .post(lab.url("/pay"))
        .body("1 EUR")
        .send_with_history();
    let (get, post, ()) = tokio::join!(get, post, weather);
    elapsed("path dies, address changes: GET and POST", start);
    (get, post)
}

/// A client of the stack: reqwest-middleware's, or bare reqwest wrapped without middleware.
fn no_middleware(client: reqwest::Client) -> reqwest_middleware::ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(client).build()
}

#[test]
fn a_dead_pooled_path_fails_bare_reqwests_get_and_post_each_sent_once() {
    let Some(lab) = Lab::new_or_skip() else {
        return;
    };
    let server = dying_path_server(&lab);
    let after = lab.client(|| async {
        let client = no_middleware(short_kernel_waits(bare()).build().unwrap());
        let (get, post) = path_dies_then_address_changes(&lab, &server, &client).await;
        assert!(get.result.is_err() && post.result.is_err());
        client.get(lab.url("/after")).send().await.unwrap().status()
    });
    assert_eq!(after, 200, "a new connection from the new address works");
    assert_eq!(server.saw("GET", "/item"), 1, "bare reqwest does not retry");
    assert_eq!(server.saw("POST", "/pay"), 1);
    let last = server.connection(server.connections_of("GET", "/after")[0]);
    assert_eq!(last.peer.ip(), lab.changed_client_ip());
}

#[test]
fn a_dead_pooled_path_the_stack_sends_the_get_again_on_a_new_connection_and_the_post_once() {
    let Some(lab) = Lab::new_or_skip() else {
        return;
    };
    let server = dying_path_server(&lab);
    let registry = registry();
    let (get, post) = lab.client(|| async {
        let client = stack(Network::new(), || short_kernel_waits(bare()), &registry);
        path_dies_then_address_changes(&lab, &server, &client).await
    });
    assert_eq!(get.result.as_ref().unwrap().status(), 200);
    let history = get.history.attempts();
    assert_eq!(history.len(), 2);
    assert!(history[0].evidence.transmission.may_have_been_processed());
    assert!(matches!(
        history[0].decision,
        Some(AttemptDecision::Retry { .. })
    ));
    let seen = distinct(server.connections_of("GET", "/item"));
    assert_eq!(
        seen.len(),
        2,
        "the GET on the dead connection and on a new one"
    );
    assert_eq!(
        server.connection(seen[1]).peer.ip(),
        lab.changed_client_ip()
    );
    assert!(post.result.is_err());
    assert_eq!(
        post.history.len(),
        1,
        "a POST that may have been processed is not retried"
    );
    assert_eq!(server.saw("POST", "/pay"), 1);
}

#[test]
fn a_network_change_cuts_the_get_on_the_dead_path_at_once_and_leaves_the_post() {
    let Some(lab) = Lab::new_or_skip() else {
        return;
    };
    let server = dying_path_server(&lab);
    let registry = registry();
    let (get, post) = lab.client(|| async {
        // reqwest's own kernel waits (30 s, keep-alive after 15 s): the watch and the
        // no-progress bound end the waits, not the kernel.
        let network = Network::new().no_progress(Some(S::from_secs(4)));
        let client = stack(network, bare, &registry);
        path_dies_then_address_changes(&lab, &server, &client).await
    });
    assert_eq!(get.result.as_ref().unwrap().status(), 200);
    assert_eq!(
        attempts(&get),
        [
            (Transmission::Unknown, Some(FailureKind::NetworkChanged)),
            (
                Transmission::ResponseReceived(200.try_into().unwrap()),
                None
            )
        ]
    );
    let seen = distinct(server.connections_of("GET", "/item"));
    assert_eq!(seen.len(), 2);
    assert_eq!(
        server.connection(seen[1]).peer.ip(),
        lab.changed_client_ip()
    );
    assert!(post.result.is_err());
    assert_eq!(
        attempts(&post),
        [(Transmission::Unknown, Some(FailureKind::NoProgress))]
    );
    assert_eq!(server.saw("POST", "/pay"), 1, "a POST is never sent twice");
}

// (c) A host whose SYNs are dropped.

#[test]
fn a_host_that_drops_syns_fails_bare_reqwests_connect_at_its_connect_timeout() {
    let Some(lab) = Lab::new_or_skip() else {
        return;
    };
    let server = lab.serve(|_, _| Action::ok("never"));
    let _rule = lab.drop_syns_to(lab.server_ip(), PORT);
    let (get, post) = lab.client(|| async {
        let client = short_kernel_waits(bare())
            .connect_timeout(S::from_secs(2))
            .build()
            .unwrap();
        let start = Instant::now();
        let get = client.get(lab.url("/x")).send().await;
        elapsed("SYNs dropped, bare reqwest (connect timeout 2 s)", start);
        let post = client.post(lab.url("/pay")).body("1 EUR").send().await;
        (get.unwrap_err(), post.unwrap_err())
    });
    assert!(get.is_connect() && post.is_connect(), "{get:?} {post:?}");
    assert_eq!(server.connections(), 0);
}

#[test]
fn a_host_that_drops_syns_costs_the_stack_one_connect_timeout_not_retried() {
    let Some(lab) = Lab::new_or_skip() else {
        return;
    };
    let server = lab.serve(|_, _| Action::ok("never"));
    let _rule = lab.drop_syns_to(lab.server_ip(), PORT);
    let registry = registry();
    let get = lab.client(|| async {
        let network = Network::new().connect_timeout(Some(S::from_secs(2)));
        let client = stack(network, bare, &registry);
        let start = Instant::now();
        let get = client.get(lab.url("/x")).send_with_history().await;
        elapsed("SYNs dropped, stack (connect timeout 2 s)", start);
        get
    });
    assert!(get.result.is_err());
    assert_eq!(
        attempts(&get),
        [(Transmission::NotSent, Some(FailureKind::ConnectTimeout))]
    );
    let evidence = &get.history.attempts()[0].evidence;
    let connect = evidence.connect.as_ref().expect("the connect record");
    let tried: Vec<_> = connect
        .tried
        .iter()
        .map(|t| (t.address, t.outcome))
        .collect();
    let address = SocketAddr::new(lab.server_ip(), PORT);
    assert_eq!(tried, [(address, AddressOutcome::TimedOut)]);
    assert_eq!(server.connections(), 0);
}

/// The stack over the user's own client (`Resilience::build`: no race, no connect timeout
/// of the stack's), whose only bound is the system's (`TCP_USER_TIMEOUT` 3 s here, 30 s
/// by reqwest's default): its `ETIMEDOUT` is the request's connect budget, spent once
/// (before: 4 attempts of it and the backoff between them).
#[test]
fn a_host_that_drops_syns_costs_a_stack_over_the_users_client_the_systems_timeout_once() {
    let Some(lab) = Lab::new_or_skip() else {
        return;
    };
    let server = lab.serve(|_, _| Action::ok("never"));
    let _rule = lab.drop_syns_to(lab.server_ip(), PORT);
    let registry = registry();
    let get = lab.client(|| async {
        let own = short_kernel_waits(bare()).build().unwrap();
        let client = Resilience::new()
            .breaker(registry.clone())
            .build(own)
            .unwrap();
        let start = Instant::now();
        let get = client.get(lab.url("/x")).send_with_history().await;
        elapsed(
            "SYNs dropped, stack over the user's client (TCP_USER_TIMEOUT 3 s)",
            start,
        );
        get
    });
    assert!(get.result.is_err());
    // `Unknown`: the user's client does not record its redirects (a later hop's connect
    // cannot be told from the first's).
    assert_eq!(
        attempts(&get),
        [(Transmission::Unknown, Some(FailureKind::ConnectTimeout))]
    );
    assert!(matches!(
        get.history.attempts()[0].decision,
        Some(AttemptDecision::Stop {
            reason: reqwest_resilience::retry::StopReason::ConnectTimedOut,
            ..
        })
    ));
    assert_eq!(server.connections(), 0);
}

// (d) A name with two addresses, the first dropping SYNs.

const TWO: &str = "weather.test";

/// Resolves every name to the server's two addresses, the dead one first.
struct TwoAddresses([SocketAddr; 2]);

impl reqwest::dns::Resolve for TwoAddresses {
    fn resolve(&self, _: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let addrs = self.0;
        Box::pin(async move { Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs) })
    }
}

fn two_addresses(lab: &Lab) -> [SocketAddr; 2] {
    [
        SocketAddr::new(lab.server_ip(), PORT),
        SocketAddr::new(lab.second_server_ip(), PORT),
    ]
}

fn two_url(path: &str) -> String {
    format!("http://{TWO}:{PORT}{path}")
}

#[test]
fn two_addresses_the_first_dead_bare_reqwest_waits_on_it_for_every_connection() {
    let Some(lab) = Lab::new_or_skip() else {
        return;
    };
    let server = lab.serve(|_, _| Action::ok("live"));
    let _rule = lab.drop_syns_to(lab.server_ip(), PORT);
    let addrs = two_addresses(&lab);
    lab.client(|| async {
        let client = short_kernel_waits(bare())
            .pool_max_idle_per_host(0)
            .resolve_to_addrs(TWO, &addrs)
            .build()
            .unwrap();
        for path in ["/one", "/two"] {
            let start = Instant::now();
            assert_eq!(
                client.get(two_url(path)).send().await.unwrap().status(),
                200
            );
            elapsed(&format!("two addresses, bare reqwest, {path}"), start);
        }
    });
    let live = SocketAddr::new(lab.second_server_ip(), PORT);
    let locals: Vec<_> = server.accepted().iter().map(|a| a.local).collect();
    assert_eq!(locals, [live, live]);
    assert_eq!(
        (server.saw("GET", "/one"), server.saw("GET", "/two")),
        (1, 1)
    );
}

#[test]
fn two_addresses_the_first_dead_the_stack_races_to_the_second_and_then_tries_it_first() {
    let Some(lab) = Lab::new_or_skip() else {
        return;
    };
    let server = lab.serve(|_, _| Action::ok("live"));
    let _rule = lab.drop_syns_to(lab.server_ip(), PORT);
    let [dead, live] = two_addresses(&lab);
    let registry = registry();
    let (one, two) = lab.client(|| async {
        let network = Network::new().resolver(Arc::new(TwoAddresses([dead, live])));
        let client = stack(network, || bare().pool_max_idle_per_host(0), &registry);
        let mut out = Vec::new();
        for path in ["/one", "/two"] {
            let start = Instant::now();
            let response = client.get(two_url(path)).send().await.unwrap();
            elapsed(&format!("two addresses, stack, {path}"), start);
            let evidence = RequestEvidence::of_response(&response).unwrap().clone();
            out.push(evidence.connect.expect("a new connection's record"));
        }
        (out.remove(0), out.remove(0))
    });
    assert_eq!(one.used(), Some(live));
    assert_eq!(one.tried[0].address, dead);
    assert_ne!(one.tried[0].outcome, AddressOutcome::Connected);
    assert_eq!(one.tried.len(), 2);
    // The dead address is tried last now: the live one first, connected.
    assert_eq!(
        (two.tried[0].address, two.tried[0].outcome),
        (live, AddressOutcome::Connected)
    );
    // The race's probe that found the live address (closed unused), then one connection
    // per request.
    let locals: Vec<_> = server.accepted().iter().map(|a| a.local).collect();
    assert_eq!(locals, [live, live, live]);
    assert_eq!(
        (server.saw("GET", "/one"), server.saw("GET", "/two")),
        (1, 1)
    );
}

// (e) The client's link down, then up.

/// A pooled connection; the link goes down, a POST is sent into it, the link comes back
/// after 500 ms; then a GET.
async fn link_flap(lab: &Lab, client: &reqwest_middleware::ClientWithMiddleware) -> Exchange {
    let warm = client.get(lab.url("/warm")).send().await.unwrap();
    assert_eq!(warm.status(), 200);
    lab.link_down();
    let start = Instant::now();
    let post = client
        .post(lab.url("/pay"))
        .body("1 EUR")
        .send_with_history();
    let weather = async {
        tokio::time::sleep(S::from_millis(500)).await;
        lab.link_up();
    };
    let (post, ()) = tokio::join!(post, weather);
    elapsed("link down 500 ms, POST", start);
    assert_eq!(post.result.as_ref().unwrap().status(), 200);
    let after = client.get(lab.url("/after")).send().await.unwrap();
    assert_eq!(after.status(), 200);
    post
}

#[test]
fn a_link_down_then_up_bare_reqwest_finishes_the_post_and_reuses_the_connection() {
    let Some(lab) = Lab::new_or_skip() else {
        return;
    };
    let server = lab.serve(|_, _| Action::ok("fine"));
    lab.client(|| async {
        let client = no_middleware(bare().build().unwrap());
        link_flap(&lab, &client).await;
    });
    assert_eq!(server.connections_of("POST", "/pay"), [0], "sent once");
    assert_eq!(
        server.connections_of("GET", "/after"),
        [0],
        "TCP outlived the flap"
    );
    assert_eq!(server.connections(), 1);
}

#[test]
fn a_link_down_then_up_the_stack_leaves_the_post_and_retires_the_connection() {
    let Some(lab) = Lab::new_or_skip() else {
        return;
    };
    let server = lab.serve(|_, _| Action::ok("fine"));
    let registry = registry();
    let post = lab.client(|| async {
        let client = stack(Network::new(), bare, &registry);
        link_flap(&lab, &client).await
    });
    assert_eq!(
        attempts(&post),
        [(
            Transmission::ResponseReceived(200.try_into().unwrap()),
            None
        )]
    );
    assert_eq!(server.connections_of("POST", "/pay"), [0], "sent once");
    assert_eq!(
        server.connections_of("GET", "/after"),
        [1],
        "a fresh connection"
    );
    assert_eq!(server.connections(), 2);
}

// (f) The breaker opens on a dead host, then rejects at once.

#[test]
fn a_dead_host_opens_the_breaker_after_five_requests_of_one_attempt_each() {
    let Some(lab) = Lab::new_or_skip() else {
        return;
    };
    let server = lab.serve(|_, _| Action::ok("never"));
    let _rule = lab.drop_syns_to(lab.server_ip(), PORT);
    let registry = registry();
    let origin = Origin::parse(&lab.url("/")).unwrap();
    let rejected = lab.client(|| async {
        let network = Network::new().connect_timeout(Some(S::from_millis(500)));
        let client = stack(network, bare, &registry);
        for i in 1..=5 {
            let failed = client.get(lab.url("/x")).send_with_history().await;
            assert_eq!(
                attempts(&failed),
                [(Transmission::NotSent, Some(FailureKind::ConnectTimeout))]
            );
            let want = if i < 5 {
                BreakerState::Closed
            } else {
                BreakerState::Open
            };
            assert_eq!(registry.state(&origin), Some(want), "after request {i}");
        }
        let start = Instant::now();
        let rejected = client.get(lab.url("/x")).send_with_history().await;
        elapsed("breaker open, stack", start);
        rejected
    });
    let rejected = attempts(&rejected);
    assert_eq!(
        rejected[0],
        (Transmission::NotSent, Some(FailureKind::BreakerOpen))
    );
    assert!(rejected.iter().all(|(t, _)| *t == Transmission::NotSent));
    assert_eq!(server.connections(), 0);
}
