//! Network weather, measured: bare reqwest against the default stack in network
//! namespaces (a plain binary: `cargo bench --bench weather`, about three minutes; root on
//! Linux with `ip` and `nft`, else it prints why and does nothing; figures in
//! BENCHMARKS.md).
//!
//! The rows of the table, each with reqwest's own and the stack's **default
//! timeouts, real ones** (no kernel timer shortened): a server that accepts and never
//! answers; the pooled connection's path dies while new connections work (the flow's
//! packets dropped before the request), GET and POST; a host whose SYNs are dropped; a name
//! with two addresses, the first dropping SYNs (two new connections); then two more: a GET
//! and a POST in flight when their connections' path dies and the client's address changes
//! (a VPN reconnect), and a POST sent while the client's link is down for 1 s.
//!
//! Shortened: every wait is capped at `WEATHER_CAP_SECS` (default 150 s) and the server
//! that never answers at `WEATHER_STUCK_SECS` (default 20 s): a cell that hits its cap
//! reads "still waiting after …". Each cell runs in a lab of its own, all at once (the
//! waits are the kernel's and the stack's timers, not CPU), so the run takes as long as
//! its longest cell.
//!
//! Printed per cell: the outcome, the wall-clock seconds from the request to it, the
//! attempts the stack made (`AttemptHistory`; bare reqwest has none) and how many times the
//! server executed the request.

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest_middleware::ClientWithMiddleware;
use reqwest_resilience::network::Network;
use reqwest_resilience::{Resilience, SendWithHistory};
use support::Action;
use support::netns::{Lab, LabServer, PORT};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Bare,
    Stack,
}

/// One cell of the table.
struct Cell {
    outcome: String,
    secs: f64,
    attempts: Option<usize>,
    executed: usize,
}

impl Cell {
    fn text(&self) -> String {
        let attempts = match self.attempts {
            Some(n) => format!(", {n} attempt{}", if n == 1 { "" } else { "s" }),
            None => String::new(),
        };
        format!(
            "{} {:.1} s{attempts}, executed {}",
            self.outcome, self.secs, self.executed
        )
    }
}

fn secs(var: &str, default: u64) -> Duration {
    let n = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Duration::from_secs(n)
}

fn bare() -> reqwest::ClientBuilder {
    reqwest::Client::builder().no_proxy()
}

fn client(
    kind: Kind,
    builder: fn() -> reqwest::ClientBuilder,
    network: Network,
) -> ClientWithMiddleware {
    match kind {
        Kind::Bare => reqwest_middleware::ClientBuilder::new(builder().build().unwrap()).build(),
        Kind::Stack => Resilience::new()
            .network(network)
            .build_from(builder)
            .unwrap(),
    }
}

/// Sends `request`, capped at `cap`.
async fn measure(
    request: reqwest_middleware::RequestBuilder,
    cap: Duration,
    kind: Kind,
) -> (String, f64, Option<usize>) {
    let start = Instant::now();
    let outcome = tokio::time::timeout(cap, request.send_with_history()).await;
    let secs = start.elapsed().as_secs_f64();
    match outcome {
        Err(_) => ("still waiting after".to_string(), secs, None),
        Ok(exchange) => {
            let attempts = (kind == Kind::Stack).then(|| exchange.history.len());
            let outcome = match exchange.result {
                Ok(r) if r.status() == 200 => "ok after",
                Ok(_) => "a status after",
                Err(_) => "error after",
            };
            (outcome.to_string(), secs, attempts)
        }
    }
}

fn cell((outcome, secs, attempts): (String, f64, Option<usize>), executed: usize) -> Cell {
    Cell {
        outcome,
        secs,
        attempts,
        executed,
    }
}

fn never_answers(lab: &Lab, kind: Kind) -> Cell {
    let server = lab.serve(|_, _| Action::Stall);
    let m = lab.client(|| async {
        let c = client(kind, bare, Network::new());
        measure(
            c.get(lab.url("/stuck")),
            secs("WEATHER_STUCK_SECS", 20),
            kind,
        )
        .await
    });
    cell(m, server.saw("GET", "/stuck"))
}

/// The pooled connection's packets dropped before `method` is sent on it.
fn path_dies(lab: &Lab, kind: Kind, method: reqwest::Method) -> Cell {
    let server = lab.serve(|_, _| Action::ok("fine"));
    let m = lab.client(|| async {
        let c = client(kind, bare, Network::new());
        c.get(lab.url("/warm")).send().await.expect("warm");
        let _dead = lab.drop_flow(server.connection(0).peer);
        let request = c.request(method.clone(), lab.url("/item")).body("1");
        measure(request, secs("WEATHER_CAP_SECS", 150), kind).await
    });
    cell(m, server.saw(method.as_str(), "/item"))
}

fn syns_dropped(lab: &Lab, kind: Kind) -> Cell {
    let server = lab.serve(|_, _| Action::ok("never"));
    let _rule = lab.drop_syns_to(lab.server_ip(), PORT);
    let m = lab.client(|| async {
        let c = client(kind, bare, Network::new());
        measure(c.get(lab.url("/x")), secs("WEATHER_CAP_SECS", 150), kind).await
    });
    cell(m, server.saw("GET", "/x"))
}

struct TwoAddresses([SocketAddr; 2]);

impl reqwest::dns::Resolve for TwoAddresses {
    fn resolve(&self, _: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let addrs = self.0;
        Box::pin(async move { Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs) })
    }
}

/// Two new connections to a name whose first address drops SYNs.
fn two_addresses(lab: &Lab, kind: Kind) -> Cell {
    let server = lab.serve(|_, _| Action::ok("live"));
    let _rule = lab.drop_syns_to(lab.server_ip(), PORT);
    let addrs = [
        SocketAddr::new(lab.server_ip(), PORT),
        SocketAddr::new(lab.second_server_ip(), PORT),
    ];
    let (first, second) = lab.client(|| async {
        let builder = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0);
        let c = match kind {
            Kind::Bare => reqwest_middleware::ClientBuilder::new(
                builder
                    .resolve_to_addrs("weather.test", &addrs)
                    .build()
                    .unwrap(),
            )
            .build(),
            Kind::Stack => Resilience::new()
                .network(Network::new().resolver(Arc::new(TwoAddresses(addrs))))
                .build_from(builder)
                .unwrap(),
        };
        let cap = secs("WEATHER_CAP_SECS", 150);
        let url = format!("http://weather.test:{PORT}/x");
        let first = measure(c.get(&url), cap, kind).await;
        let second = measure(c.get(&url), cap, kind).await;
        (first, second)
    });
    let attempts = match (first.2, second.2) {
        (Some(a), Some(b)) => Some(a + b),
        _ => None,
    };
    Cell {
        outcome: format!("{} {:.1} s, then {}", first.0, first.1, second.0),
        secs: second.1,
        attempts,
        executed: server.saw("GET", "/x"),
    }
}

/// A GET and a POST in flight (the server has them) when their connections' path dies
/// and the client's address changes.
fn in_flight_address_change(lab: &Lab, kind: Kind, method: reqwest::Method) -> Cell {
    let server = lab.serve(|_, req| match req.path.as_str() {
        "/item" if req.connection == 0 => Action::Stall,
        _ => Action::ok("fine"),
    });
    let m = lab.client(|| async {
        let c = client(kind, bare, Network::new());
        c.get(lab.url("/warm")).send().await.expect("warm");
        let request = c.request(method.clone(), lab.url("/item")).body("1");
        let weather = async {
            wait_for(&server, method.as_str()).await;
            let _dead = lab.drop_flow(server.connection(0).peer);
            tokio::time::sleep(Duration::from_millis(300)).await;
            lab.change_client_address();
        };
        let (m, ()) = tokio::join!(
            measure(request, secs("WEATHER_CAP_SECS", 150), kind),
            weather
        );
        m
    });
    cell(m, server.saw(method.as_str(), "/item"))
}

async fn wait_for(server: &LabServer, method: &str) {
    server
        .wait_for(method, "/item", 1, Duration::from_secs(30))
        .await;
}

/// A POST sent on the pooled connection while the client's link is down for 1 s.
fn link_flap(lab: &Lab, kind: Kind) -> Cell {
    let server = lab.serve(|_, _| Action::ok("fine"));
    let m = lab.client(|| async {
        let c = client(kind, bare, Network::new());
        c.get(lab.url("/warm")).send().await.expect("warm");
        lab.link_down();
        let weather = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            lab.link_up();
        };
        let request = c.post(lab.url("/pay")).body("1 EUR");
        let (m, ()) = tokio::join!(
            measure(request, secs("WEATHER_CAP_SECS", 150), kind),
            weather
        );
        m
    });
    cell(m, server.saw("POST", "/pay"))
}

type Row = (&'static str, fn(&Lab, Kind) -> Cell);

const ROWS: &[Row] = &[
    (
        "a server that accepts and never answers (GET)",
        never_answers,
    ),
    (
        "the pooled connection's path dies, new connections work: GET",
        |lab, k| path_dies(lab, k, reqwest::Method::GET),
    ),
    ("the same, POST", |lab, k| {
        path_dies(lab, k, reqwest::Method::POST)
    }),
    ("a host whose SYNs are dropped (GET)", syns_dropped),
    (
        "a name with two addresses, the first dropping SYNs: two new connections",
        two_addresses,
    ),
    (
        "a GET in flight when its path dies and the client's address changes",
        |lab, k| in_flight_address_change(lab, k, reqwest::Method::GET),
    ),
    ("the same, POST", |lab, k| {
        in_flight_address_change(lab, k, reqwest::Method::POST)
    }),
    (
        "a POST sent while the client's link is down for 1 s",
        link_flap,
    ),
];

fn main() {
    if let Some(filter) = std::env::args().nth(1).filter(|a| !a.starts_with('-')) {
        eprintln!("(no filter: every row runs; ignoring {filter:?})");
    }
    if Lab::new_or_skip().is_none() {
        return;
    }
    let start = Instant::now();
    let cells: Vec<(Cell, Cell)> = std::thread::scope(|scope| {
        let running: Vec<_> = ROWS
            .iter()
            .map(|(_, row)| {
                let run = move |kind| {
                    scope.spawn(move || {
                        let lab = Lab::new().expect("a lab");
                        row(&lab, kind)
                    })
                };
                (run(Kind::Bare), run(Kind::Stack))
            })
            .collect();
        running
            .into_iter()
            .map(|(b, s)| (b.join().unwrap(), s.join().unwrap()))
            .collect()
    });
    println!("| weather | bare reqwest 0.13 | default stack |");
    println!("|---|---|---|");
    for ((name, _), (bare, stack)) in ROWS.iter().zip(&cells) {
        println!("| {name} | {} | {} |", bare.text(), stack.text());
    }
    println!(
        "\n(all cells at once, {:.0} s in all; caps: {} s, a server that never answers {} s)",
        start.elapsed().as_secs_f64(),
        secs("WEATHER_CAP_SECS", 150).as_secs(),
        secs("WEATHER_STUCK_SECS", 20).as_secs()
    );
}
