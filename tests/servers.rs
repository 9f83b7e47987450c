//! The stack against real servers from Debian's packages, on the routine events a client
//! meets (tests/support/servers): connections rotated by a per-connection request limit,
//! idle keep-alive connections closed between waves, and two graceful reloads during a
//! burst — over HTTP/1.1 keep-alive and over h2c where the server speaks it.
//!
//! Each test is one server, protocol and event: a burst of 200 requests (100 POSTs, 100
//! GETs, each with its own `x-request-id`) at concurrency 32 through the stack as users
//! deploy it (`Resilience::new().breaker(registry).build_from(reqwest::Client::builder())`,
//! the registry's listener recording transitions), then the same burst through reqwest
//! alone; executions are counted from the server's own access log. Asserted exactly:
//!
//! - no POST executed twice, and every delivered POST executed exactly once;
//! - every GET delivered (the caller got `200`) and executed at least once;
//! - no breaker transition at all (the listener, not the final state);
//! - never worse than reqwest alone, request by request: every request the stack did not
//!   deliver is a POST stopped `MayHaveBeenProcessed` whose last attempt may have been
//!   processed (its bytes went out, no response head came back). reqwest alone sends a
//!   request once, so it cannot deliver such a POST either without the risk of running it
//!   twice; the stack's delivered count is the total minus those. Both runs' counts are
//!   printed (a comparison of two counts measured on a loaded machine would flake).
//!
//! A missing server skips its tests (printed), except under `CI=true` where it fails them
//! (`.ci/run` installs the four packages). A scenario a server has no setting for (haproxy
//! 2.6 has no per-connection request limit over HTTP/2) is skipped, printed.
//! The clock is the real one: the servers are real processes.

mod support;

use std::sync::Arc;

use http::Method;
use reqwest_resilience::retry::StopReason;
use support::servers::burst::{self, Event, Run, Shape};
use support::servers::{self, Protocol, RealServer, Scenario};

type Start = fn(&Scenario) -> Option<Box<dyn RealServer>>;

/// Runs `event` over `protocol` against the server `start` starts, and asserts.
async fn check(start: Start, supports: fn(&Scenario) -> bool, event: Event, protocol: Protocol) {
    let shape = Shape::of(event, protocol);
    if !supports(&shape.scenario) {
        eprintln!("skipped: the server has no setting for {shape:?}");
        return;
    }
    let started = tokio::task::spawn_blocking(move || start(&shape.scenario))
        .await
        .expect("start the server");
    let Some(server) = started else { return };
    let server: Arc<dyn RealServer> = Arc::from(server);
    let name = server.name();
    let (stack, bare) = burst::both(&server, &shape).await;
    eprintln!("{name} {protocol:?} {event:?}: stack: {}", stack.summary());
    eprintln!("{name} {protocol:?} {event:?}: bare:  {}", bare.summary());
    // Stopped (its process group killed, its directory removed) off the runtime's threads.
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .expect("stop the server");
    assert_stack(&stack, name);
}

fn assert_stack(run: &Run, name: &str) {
    let twice: Vec<_> = run.executed_twice(&Method::POST);
    assert!(twice.is_empty(), "{name}: POSTs executed twice: {twice:?}");
    for o in &run.outcomes {
        let executed = run.executed.get(&o.id).copied().unwrap_or(0);
        if o.method == Method::GET {
            assert!(
                o.delivered && executed >= 1,
                "{name}: GET {} not delivered (executed {executed}): {o:?}",
                o.id
            );
        } else if o.delivered {
            assert_eq!(executed, 1, "{name}: delivered POST {}: {o:?}", o.id);
        } else {
            assert_eq!(
                o.stop,
                Some(StopReason::MayHaveBeenProcessed),
                "{name}: POST {} lost for another reason: {o:?}",
                o.id
            );
            assert!(
                o.last.is_some_and(|t| t.may_have_been_processed()),
                "{name}: POST {} lost though its last attempt was not sent: {o:?}",
                o.id
            );
        }
    }
    assert!(
        run.transitions.is_empty(),
        "{name}: the breaker left Closed: {:?}",
        run.transitions
    );
}

/// The six tests of one server module of `support::servers`.
macro_rules! server_tests {
    ($server:ident) => {
        mod $server {
            use super::*;

            async fn cell(event: Event, protocol: Protocol) {
                check(
                    servers::$server::start,
                    servers::$server::supports,
                    event,
                    protocol,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn http1_rotation() {
                cell(Event::Rotation, Protocol::Http1).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn http1_idle_close() {
                cell(Event::IdleClose, Protocol::Http1).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn http1_reload() {
                cell(Event::Reload, Protocol::Http1).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn h2c_rotation() {
                cell(Event::Rotation, Protocol::H2c).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn h2c_idle_close() {
                cell(Event::IdleClose, Protocol::H2c).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn h2c_reload() {
                cell(Event::Reload, Protocol::H2c).await;
            }
        }
    };
}

server_tests!(nginx);
server_tests!(haproxy);
