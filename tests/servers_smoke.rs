//! Smoke tests of the apache2 and caddy modules of `support::servers`: each server starts,
//! answers 50 GETs and 50 POSTs (each with its own `x-request-id`) through a bare
//! `reqwest::Client` while it is gracefully reloaded twice, and its access log holds
//! exactly what the client got: every id the client received a `200` for is logged once,
//! with its method and `200`; no id is logged twice; no id the client did not send.
//!
//! The clock is the real one (real processes). Skipped (printed) when a server is not
//! installed, a failure under `CI=true`.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::Method;
use support::servers::{self, Execution, Protocol, RealServer, Scenario};
use tokio::task::JoinSet;

const REQUESTS: usize = 100;
const CONCURRENCY: usize = 8;
const WAVES: usize = 3;

type Start = fn(&Scenario) -> Option<Box<dyn RealServer>>;

fn client(protocol: Protocol) -> reqwest::Client {
    let builder = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10));
    match protocol {
        Protocol::Http1 => builder.http1_only(),
        Protocol::H2c => builder.http2_prior_knowledge(),
    }
    .build()
    .expect("client")
}

/// Request `i` (POST when even, GET when odd): its id, method and whether a `200` came.
async fn one(client: &reqwest::Client, url: &str, i: usize) -> (String, Method, bool) {
    let id = format!("smoke-{i:03}");
    let method = if i.is_multiple_of(2) {
        Method::POST
    } else {
        Method::GET
    };
    let mut req = client
        .request(method.clone(), url)
        .header("x-request-id", &id);
    if method == Method::POST {
        req = req.body(format!("order {id}"));
    }
    let delivered = match req.send().await {
        Ok(res) => res.status() == 200 && res.bytes().await.is_ok(),
        Err(_) => false,
    };
    (id, method, delivered)
}

/// Requests `range` at `CONCURRENCY`, each task taking the next index.
async fn wave(
    client: &reqwest::Client,
    url: &str,
    range: std::ops::Range<usize>,
) -> Vec<(String, Method, bool)> {
    let next = Arc::new(AtomicUsize::new(range.start));
    let mut tasks = JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (client, url, next, end) = (client.clone(), url.to_owned(), next.clone(), range.end);
        tasks.spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= end {
                    return done;
                }
                done.push(one(&client, &url, i).await);
            }
        });
    }
    let mut outcomes = Vec::new();
    while let Some(done) = tasks.join_next().await {
        outcomes.extend(done.expect("request task"));
    }
    outcomes
}

/// `WAVES` waves; a reload starts as each wave after the first starts.
async fn burst(server: &Arc<dyn RealServer>, protocol: Protocol) -> Vec<(String, Method, bool)> {
    let client = client(protocol);
    let url = format!("{}/smoke/path", server.base_url());
    let per_wave = REQUESTS.div_ceil(WAVES);
    let mut outcomes = Vec::new();
    for w in 0..WAVES {
        let range = w * per_wave..((w + 1) * per_wave).min(REQUESTS);
        if w == 0 {
            outcomes.extend(wave(&client, &url, range).await);
            continue;
        }
        let reloading = server.clone();
        let reload = tokio::task::spawn_blocking(move || reloading.reload());
        outcomes.extend(wave(&client, &url, range).await);
        reload.await.expect("reload");
    }
    outcomes
}

/// Checks the log against what the client got; returns how many were delivered.
fn check(name: &str, outcomes: &[(String, Method, bool)], executions: &[Execution]) -> usize {
    let mut logged: HashMap<&str, Vec<&Execution>> = HashMap::new();
    for e in executions {
        logged.entry(e.request_id.as_str()).or_default().push(e);
    }
    let sent: HashMap<&str, &Method> = outcomes.iter().map(|(id, m, _)| (id.as_str(), m)).collect();
    for (id, lines) in &logged {
        assert!(
            sent.contains_key(id),
            "{name} logged {id}, which was never sent"
        );
        assert_eq!(
            lines.len(),
            1,
            "{name} logged {id} more than once: {lines:?}"
        );
    }
    for (id, method, delivered) in outcomes {
        let lines = logged.get(id.as_str()).map_or(&[][..], Vec::as_slice);
        if *delivered {
            let want = Execution {
                request_id: id.clone(),
                method: method.to_string(),
                status: 200,
            };
            assert_eq!(lines, [&want], "{name}: {id} was delivered");
        }
    }
    outcomes.iter().filter(|(_, _, d)| *d).count()
}

async fn smoke(start: Start, protocol: Protocol) {
    let Some(server) = start(&Scenario::plain(protocol)) else {
        return;
    };
    let server: Arc<dyn RealServer> = Arc::from(server);
    let outcomes = burst(&server, protocol).await;
    assert_eq!(outcomes.len(), REQUESTS);
    let reader = server.clone();
    let executions = tokio::task::spawn_blocking(move || reader.executions())
        .await
        .expect("read the access log");
    let delivered = check(server.name(), &outcomes, &executions);
    println!(
        "{} {protocol:?}: {delivered}/{REQUESTS} delivered, {} logged",
        server.name(),
        executions.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_http1_answers_and_logs_each_request_once_across_two_reloads() {
    smoke(servers::apache::start, Protocol::Http1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_h2c_answers_and_logs_each_request_once_across_two_reloads() {
    smoke(servers::apache::start, Protocol::H2c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caddy_http1_answers_and_logs_each_request_once_across_two_reloads() {
    smoke(servers::caddy::start, Protocol::Http1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caddy_h2c_answers_and_logs_each_request_once_across_two_reloads() {
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
fn caddy_access_log_lines_become_executions_and_garbage_is_an_error() {
    let good = r#"{"level":"info","logger":"http.log.access.rid","request":{"method":"POST","headers":{"X-Request-Id":["a-1"]}},"status":200}
{"level":"info","request":{"method":"GET","headers":{"User-Agent":["x"]}},"status":200}
"#;
    assert_eq!(
        servers::caddy::parse_access_log(good),
        Ok(vec![Execution {
            request_id: "a-1".into(),
            method: "POST".into(),
            status: 200,
        }])
    );
    for bad in [
        "not json\n",
        "{\"request\":{\"method\":\"GET\"}}\n",
        "{\"request\":{},\"status\":200}\n",
        "{\"request\":{\"method\":\"GET\"},\"status\":70000}\n",
    ] {
        let err = servers::caddy::parse_access_log(&format!("{good}{bad}")).unwrap_err();
        assert!(err.starts_with("line 3: "), "{err}");
    }
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
