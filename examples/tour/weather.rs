//! The tour's network-weather scenes (`reqwest_resilience::network`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use reqwest_resilience::evidence::AddressOutcome;
use reqwest_resilience::network::Network;
use reqwest_resilience::{FailureKind, RequestEvidence, SendWithHistory};

use super::common::{FlakyServer, Reply};
use super::{BoxError, Tour, demo_stack, outcome, print_history};

/// A GET waits on a connection whose path died while the laptop slept; at the wake the
/// stack retires the connections opened before it and sends the GET again at once.
pub(super) async fn dropped_path(tour: &mut Tour) -> Result<(), BoxError> {
    println!(
        "\n24. A GET stuck on a connection whose path died in a sleep: at the wake, sent again at once"
    );
    // The first request is never answered (its path is gone); the others are.
    let server = FlakyServer::start(|i, _| match i {
        0 => Reply::After(Duration::from_secs(3600), Box::new(Reply::ok("late"))),
        _ => Reply::ok("fresh"),
    })
    .await?;
    // The stack's wall clock, made to jump an hour ahead: to the stack, a wake from sleep.
    let ahead = Arc::new(AtomicU64::new(0));
    let clock = {
        let ahead = ahead.clone();
        move || SystemTime::now() + Duration::from_secs(ahead.load(Ordering::SeqCst))
    };
    let client = demo_stack()?
        .network(Network::new().wall_clock(clock))
        .build_from(reqwest::Client::builder)?;
    let stuck = tokio::spawn({
        let (client, url) = (client.clone(), server.url("/feed"));
        async move { client.get(url).send_with_history().await }
    });
    while server.requests() < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ahead.store(3600, Ordering::SeqCst);
    let woke = Instant::now();
    // The first request after the wake notices it.
    let _ = client.get(server.url("/status")).send().await?;
    let exchange = stuck.await?;
    let answered_after = woke.elapsed();
    print_history(&exchange.history);
    let first = exchange
        .history
        .attempts()
        .first()
        .map(|r| r.evidence.failure);
    tour.check(
        "dropped path: cut at the wake",
        format!("{:?}", Some(FailureKind::NetworkChanged)),
        format!("{:?}", first.flatten()),
    );
    tour.check(
        "dropped path: sent again at once",
        "2 attempts, 200, < 2 s",
        format!(
            "{} attempts, {}, {}",
            exchange.history.len(),
            outcome(&exchange.result),
            if answered_after < Duration::from_secs(2) {
                "< 2 s".to_owned()
            } else {
                format!("{answered_after:.1?}")
            }
        ),
    );
    Ok(())
}

/// A name with two addresses, the first dead (its SYNs dropped): the first request
/// connects to the second after one attempt delay, the next one goes to it first.
pub(super) async fn dead_address(tour: &mut Tour) -> Result<(), BoxError> {
    println!("\n25. A name with two addresses, the first dead: connected in 250 ms, then at once");
    let live = FlakyServer::start(|_, _| Reply::ok("live")).await?;
    let dead = DeadAddress::start().await?;
    let live_addr: SocketAddr = live.url("").trim_start_matches("http://").parse()?;
    // The URL names no port: each address the resolver answers keeps its own.
    let addresses = Arc::new(TwoAddresses([dead.addr, live_addr]));
    // No pooling: each request opens a connection of its own, as after a reconnect.
    let client = demo_stack()?
        .network(Network::new().resolver(addresses))
        .build_from(|| {
            reqwest::Client::builder()
                .no_proxy()
                .pool_max_idle_per_host(0)
        })?;
    let mut seen = Vec::new();
    for path in ["/one", "/two"] {
        let started = Instant::now();
        let response = client
            .get(format!("http://two-addresses.test{path}"))
            .send()
            .await?;
        let took = started.elapsed();
        let tried = RequestEvidence::of_response(&response)
            .and_then(|e| e.connect.as_deref())
            .map(|c| c.tried.iter().map(|t| t.outcome).collect::<Vec<_>>())
            .unwrap_or_default();
        println!(
            "   {path}: {} after {took:.1?}, addresses tried: {tried:?}",
            response.status()
        );
        seen.push((response.status().as_u16(), tried, took));
    }
    let dead_then_live = vec![AddressOutcome::Abandoned, AddressOutcome::Connected];
    tour.check(
        "dead address: raced past it",
        format!("200, {dead_then_live:?}"),
        format!("{}, {:?}", seen[0].0, seen[0].1),
    );
    tour.check(
        "dead address: then tried last",
        format!("200, {:?}, < 1 s", [AddressOutcome::Connected]),
        format!(
            "{}, {:?}, {}",
            seen[1].0,
            seen[1].1,
            if seen[1].2 < Duration::from_secs(1) {
                "< 1 s".to_owned()
            } else {
                format!("{:.1?}", seen[1].2)
            }
        ),
    );
    Ok(())
}

/// Answers every name with the same two addresses, in this order.
struct TwoAddresses([SocketAddr; 2]);

impl reqwest::dns::Resolve for TwoAddresses {
    fn resolve(&self, _: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let addrs = self.0;
        Box::pin(async move { Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs) })
    }
}

/// A loopback address whose SYNs go unanswered, as a dead host's: a listener with the
/// smallest accept queue, filled, never accepting (Linux then drops further SYNs).
struct DeadAddress {
    addr: SocketAddr,
    _listener: tokio::net::TcpListener,
    _queued: Vec<std::net::TcpStream>,
}

impl DeadAddress {
    async fn start() -> Result<DeadAddress, BoxError> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind((std::net::Ipv4Addr::LOCALHOST, 0).into())?;
        let listener = socket.listen(1)?;
        let addr = listener.local_addr()?;
        let queued = tokio::task::spawn_blocking(move || {
            // Linux queues backlog + 1 connections; a few more connects bound the loop.
            let mut queued = Vec::new();
            for _ in 0..16 {
                match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                    Ok(stream) => queued.push(stream),
                    Err(_) => return Ok(queued),
                }
            }
            Err("the accept queue of a backlog-1 listener never filled")
        })
        .await??;
        Ok(DeadAddress {
            addr,
            _listener: listener,
            _queued: queued,
        })
    }
}
