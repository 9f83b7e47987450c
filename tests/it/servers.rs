//! The stack against real servers from Debian's packages, on the routine events a client
//! meets (tests/support/servers): connections rotated by a per-connection request limit,
//! idle keep-alive connections closed between waves, and two graceful reloads during a
//! burst — over HTTP/1.1 keep-alive and over h2c where the server speaks it.
//!
//! Each test is one server, protocol and event: a burst of 200 requests (100 POSTs, 100
//! GETs, each with its own `x-request-id`) at concurrency 32 through the stack as users
//! deploy it (`Resilience::new()` with a 5 s attempt timeout and the breaker's registry,
//! `build_from(reqwest::Client::builder())`, the registry's listener recording
//! transitions), then the same burst through reqwest alone; executions are counted from
//! the server's own access log. The attempt timeout is the stack's bound on an h2c request
//! hyper leaves unanswered after a `GOAWAY` (reqwest#1323, hyper#2500; bare reqwest hangs
//! the same way): see `support::servers::burst::ATTEMPT_TIMEOUT`. The attempts it cut are
//! printed with each run's figures. Asserted exactly:
//!
//! - no POST executed twice, and every delivered POST executed exactly once;
//! - every GET delivered (the caller got `200`) and executed at least once;
//! - no breaker transition at all (the listener, not the final state);
//! - never worse than reqwest alone, request by request: every request the stack did not
//!   deliver is a POST stopped `MayHaveBeenProcessed` whose last attempt may have been
//!   processed (its bytes went out or may have, no response head came back: an attempt
//!   the attempt timeout cut is `Unknown`, never proven unsent). reqwest alone sends a
//!   request once, so it cannot deliver such a POST either without the risk of running it
//!   twice; the stack's delivered count is the total minus those. Both runs' counts are
//!   printed (a comparison of two counts measured on a loaded machine would flake).
//!
//! A missing server skips its tests (printed), except under `CI=true` where it fails them
//! (`.ci/run` installs the four packages). A scenario a server has no setting for (haproxy
//! 2.6 has no per-connection request limit over HTTP/2) is skipped, printed.
//! The clock is the real one: the servers are real processes.

use crate::support;

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
    for o in stack
        .outcomes
        .iter()
        .chain(&bare.outcomes)
        .filter(|o| !o.delivered)
    {
        eprintln!("  not delivered: {o:?}");
    }
    // Stopped (its process group killed, its directory removed) off the runtime's threads.
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .expect("stop the server");
    assert_stack(&stack, name);
}

fn assert_stack(run: &Run, name: &str) {
    let twice: Vec<_> = run.executed_twice(&Method::POST);
    // Their outcomes say who sent the second copy: the stack (`attempts` > 1), or reqwest's
    // own replay of a stream failed by a `GOAWAY` (one attempt; reqwest 0.13's default
    // retry replays any method, and hyper can fail a stream it had written, hyper#2500).
    let outcomes: Vec<_> = run
        .outcomes
        .iter()
        .filter(|o| twice.contains(&o.id.as_str()))
        .collect();
    assert!(
        twice.is_empty(),
        "{name}: POSTs executed twice: {twice:?}: {outcomes:?}"
    );
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
server_tests!(apache);
server_tests!(caddy);

/// The apache2 and caddy modules on their own, through a bare `reqwest::Client`: 50 POSTs
/// and 50 GETs (each with its own `x-request-id`, concurrency 8, one wave) while the
/// server is gracefully reloaded twice inside it; its access log holds exactly what the client got:
/// every id the client received a `200` for is logged once, with its method and `200`;
/// no id is logged twice; no id the client did not send. Also: their log parsing and the
/// scenarios they skip.
mod smoke {
    use std::collections::HashMap;
    use std::time::Duration;

    use support::servers::Execution;
    use support::servers::burst::Outcome;

    use super::*;

    /// Checks the log against what the client got; returns how many were delivered.
    fn check(name: &str, outcomes: &[Outcome], executions: &[Execution]) -> usize {
        let mut logged: HashMap<&str, Vec<&Execution>> = HashMap::new();
        for e in executions {
            logged.entry(e.request_id.as_str()).or_default().push(e);
        }
        for (id, lines) in &logged {
            assert!(
                outcomes.iter().any(|o| o.id == *id),
                "{name} logged {id}, which was never sent"
            );
            assert_eq!(
                lines.len(),
                1,
                "{name} logged {id} more than once: {lines:?}"
            );
        }
        for o in outcomes.iter().filter(|o| o.delivered) {
            let want = Execution {
                request_id: o.id.clone(),
                method: o.method.to_string(),
                status: 200,
            };
            let lines = logged.get(o.id.as_str()).map_or(&[][..], Vec::as_slice);
            assert_eq!(lines, [&want], "{name}: {} was delivered", o.id);
        }
        outcomes.iter().filter(|o| o.delivered).count()
    }

    async fn smoke(start: Start, protocol: Protocol) {
        let shape = Shape {
            event: Event::Reload,
            scenario: Scenario::plain(protocol),
            requests: 100,
            concurrency: 8,
            waves: 1,
            pause: Duration::ZERO,
            posts_only: false,
        };
        let started = tokio::task::spawn_blocking(move || start(&shape.scenario))
            .await
            .expect("start the server");
        let Some(server) = started else { return };
        let server: Arc<dyn RealServer> = Arc::from(server);
        let run = burst::burst(&server, &shape, &burst::bare(protocol), "smoke").await;
        assert_eq!(run.outcomes.len(), 100);
        let reader = server.clone();
        let executions = tokio::task::spawn_blocking(move || reader.executions())
            .await
            .expect("read the access log");
        let delivered = check(server.name(), &run.outcomes, &executions);
        eprintln!(
            "{} {protocol:?} smoke: {delivered}/100 delivered, {} logged",
            server.name(),
            executions.len()
        );
        tokio::task::spawn_blocking(move || drop(server))
            .await
            .expect("stop the server");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn apache_http1_logs_each_delivered_request_once_across_two_reloads() {
        smoke(servers::apache::start, Protocol::Http1).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn apache_h2c_logs_each_delivered_request_once_across_two_reloads() {
        smoke(servers::apache::start, Protocol::H2c).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn caddy_http1_logs_each_delivered_request_once_across_two_reloads() {
        smoke(servers::caddy::start, Protocol::Http1).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn caddy_h2c_logs_each_delivered_request_once_across_two_reloads() {
        smoke(servers::caddy::start, Protocol::H2c).await;
    }

    #[test]
    fn caddy_skips_a_per_connection_request_limit() {
        let mut scenario = Scenario::plain(Protocol::Http1);
        scenario.max_requests_per_connection = Some(5);
        assert!(!servers::caddy::supports(&scenario));
        assert!(servers::caddy::start(&scenario).is_none());
    }

    #[test]
    fn apache_skips_a_per_connection_request_limit_over_h2c_only() {
        let mut scenario = Scenario::plain(Protocol::H2c);
        scenario.max_requests_per_connection = Some(5);
        assert!(!servers::apache::supports(&scenario));
        assert!(servers::apache::start(&scenario).is_none());
        scenario.protocol = Protocol::Http1;
        assert!(servers::apache::supports(&scenario));
    }

    #[test]
    fn caddy_access_log_lines_become_executions_and_garbage_is_an_error() {
        let good = concat!(
            r#"{"logger":"http.log.access.rid","request":{"method":"POST","headers":{"X-Request-Id":["a-1"]}},"status":200}"#,
            "\n",
            r#"{"logger":"http.log.access.rid","request":{"method":"GET","headers":{}},"status":200}"#,
            "\n",
        );
        let want = Execution {
            request_id: "a-1".into(),
            method: "POST".into(),
            status: 200,
        };
        assert_eq!(servers::caddy::parse_access_log(good), Ok(vec![want]));
        for bad in [
            "not json",
            r#"{"request":{"method":"GET"}}"#,
            r#"{"request":{},"status":200}"#,
            r#"{"request":{"method":"GET"},"status":70000}"#,
        ] {
            let err = servers::caddy::parse_access_log(&format!("{good}{bad}\n")).unwrap_err();
            assert!(err.starts_with("line 3: "), "{err}");
        }
    }
}
