//! The stack against real servers on routine events, next to reqwest alone (a plain
//! binary: `cargo bench --bench servers`, a few minutes; figures in BENCHMARKS.md).
//!
//! The scenarios of tests/it/servers.rs (tests/support/servers): per server (nginx, haproxy,
//! apache2, caddy) and protocol (HTTP/1.1 keep-alive, h2c), a rotation (5 requests per
//! connection), idle closes (200 ms keep-alive timeout, four waves 200 ms apart) and two
//! graceful reloads inside a burst (400 requests at concurrency 50; the others 200 at 32),
//! half POSTs, half GETs. Each cell runs the burst through the stack as users deploy it
//! (`Resilience::new().breaker(registry).build_from(reqwest::Client::builder())`) and
//! then through reqwest alone, and prints the requests each delivered, the POSTs and GETs
//! the server's access log shows executed twice, and the breaker's transitions.
//!
//! Then POSTs that meet an h2c rotation (GOAWAY): nginx with `keepalive_requests 3;
//! http2_max_concurrent_streams 2` and 60 concurrent POSTs, and `keepalive_requests 100`
//! with 300 concurrent POSTs, with the stop reasons of the POSTs each client lost.
//!
//! `SERVERS_BENCH_ROUNDS=n` repeats every cell `n` times (default 1);
//! `SERVERS_BENCH_H2C_POSTS=1` runs only the POSTs meeting nginx's h2c rotation;
//! `SERVERS_BARE_FIRST=1` runs reqwest alone before the stack on each server. A server
//! that is not installed is skipped (printed).

#[path = "../tests/support/servers/mod.rs"]
mod servers;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use servers::burst::{self, Event, Run, Shape};
use servers::{Protocol, RealServer, Scenario};

type Start = fn(&Scenario) -> Option<Box<dyn RealServer>>;
type Supports = fn(&Scenario) -> bool;

const SERVERS: &[(&str, Start, Supports)] = &[
    ("nginx", servers::nginx::start, servers::nginx::supports),
    (
        "haproxy",
        servers::haproxy::start,
        servers::haproxy::supports,
    ),
    ("apache2", servers::apache::start, servers::apache::supports),
    ("caddy", servers::caddy::start, servers::caddy::supports),
];

fn main() {
    let rounds: usize = std::env::var("SERVERS_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if std::env::var_os("SERVERS_BENCH_H2C_POSTS").is_some() {
        rotation_posts(&rt, rounds);
        return;
    }
    println!(
        "{:<8} {:<6} {:<10} | {:>17} {:>7} | {:>17} {:>7} | {:>5}",
        "server", "proto", "event", "stack POST/GET", "twice", "bare POST/GET", "twice", "trans"
    );
    for &(name, start, supports) in SERVERS {
        for protocol in [Protocol::Http1, Protocol::H2c] {
            for event in [Event::Rotation, Event::IdleClose, Event::Reload] {
                let shape = Shape::of(event, protocol);
                if !supports(&shape.scenario) {
                    println!(
                        "{name:<8} {:<6} {:<10} | no setting for it",
                        proto(protocol),
                        ev(event)
                    );
                    continue;
                }
                for _ in 0..rounds {
                    let Some(server) = start(&shape.scenario) else {
                        println!("{name:<8} skipped: not installed");
                        break;
                    };
                    let server: Arc<dyn RealServer> = Arc::from(server);
                    let (stack, bare) = rt.block_on(burst::both(&server, &shape));
                    drop(server);
                    row(name, protocol, event, &stack, &bare);
                }
            }
        }
    }
    println!();
    rotation_posts(&rt, rounds);
}

fn proto(p: Protocol) -> &'static str {
    match p {
        Protocol::Http1 => "http1",
        Protocol::H2c => "h2c",
    }
}

fn ev(e: Event) -> &'static str {
    match e {
        Event::Rotation => "rotation",
        Event::IdleClose => "idle-close",
        Event::Reload => "reload",
    }
}

fn delivered(run: &Run) -> String {
    format!(
        "{}/{} {}/{}",
        run.delivered(&Method::POST),
        run.sent(&Method::POST),
        run.delivered(&Method::GET),
        run.sent(&Method::GET)
    )
}

fn twice(run: &Run) -> String {
    format!(
        "{} {}",
        run.executed_twice(&Method::POST).len(),
        run.executed_twice(&Method::GET).len()
    )
}

fn row(name: &str, protocol: Protocol, event: Event, stack: &Run, bare: &Run) {
    let causes: Vec<String> = stack
        .transitions
        .iter()
        .map(|t| format!("{:?}->{:?}", t.from, t.to))
        .collect();
    println!(
        "{name:<8} {:<6} {:<10} | {:>17} {:>7} | {:>17} {:>7} | {:>5} {}",
        proto(protocol),
        ev(event),
        delivered(stack),
        twice(stack),
        delivered(bare),
        twice(bare),
        stack.transitions.len(),
        causes.join(" ")
    );
}

/// Point 4 of issue 28: POSTs that meet nginx's h2c rotation.
fn rotation_posts(rt: &tokio::runtime::Runtime, rounds: usize) {
    println!("POSTs meeting an h2c rotation (nginx), all concurrent:");
    for (requests, keepalive, streams) in [(60, 3, 2), (300, 100, 128)] {
        let mut scenario = Scenario::plain(Protocol::H2c);
        scenario.max_requests_per_connection = Some(keepalive);
        let shape = Shape {
            event: Event::Rotation,
            scenario,
            requests,
            concurrency: requests,
            waves: 1,
            pause: Duration::ZERO,
            posts_only: true,
        };
        for _ in 0..rounds {
            let Some(server) = servers::nginx::start_with_streams(&scenario, streams) else {
                return;
            };
            let server: Arc<dyn RealServer> = Arc::from(server);
            let (stack, bare) = rt.block_on(burst::both(&server, &shape));
            drop(server);
            println!(
                "  keepalive_requests {keepalive}, streams {streams}: {requests} POSTs: \
                 stack {} delivered, bare {} delivered; twice: stack {} bare {}; transitions {}",
                stack.delivered(&Method::POST),
                bare.delivered(&Method::POST),
                stack.executed_twice(&Method::POST).len(),
                bare.executed_twice(&Method::POST).len(),
                stack.transitions.len(),
            );
            println!("    stack lost: {:?}", lost(&stack));
            println!("    bare lost:  {:?}", lost(&bare));
        }
    }
}

/// The lost requests' errors, reduced to their kind, counted.
fn lost(run: &Run) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    for o in run.outcomes.iter().filter(|o| !o.delivered) {
        let text = o.error.as_deref().unwrap_or("-");
        let kind = [
            "GoAway",
            "DispatchGone",
            "connection closed",
            "Reset",
            "no outcome",
        ]
        .into_iter()
        .find(|k| text.contains(k))
        .unwrap_or("other");
        let executed = run.executed.get(&o.id).copied().unwrap_or(0);
        let key = format!("{kind}/{:?}/executed {executed}", o.last);
        *kinds.entry(key).or_insert(0) += 1;
    }
    kinds
}
