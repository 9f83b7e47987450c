//! Concurrent throughput: `cargo bench --bench throughput` (about 30 s).
//!
//! 64 tasks share one client and send sequential GETs to a keep-alive HTTP/1.1 server on
//! loopback (its own thread and runtime, `benches/support`), on a client runtime of two
//! worker threads: the contention a real service puts on the stack (its registries, its
//! budget, its atomics), which the one-at-a-time benches (`stack.rs`, `instructions.rs`)
//! do not see. Each round runs every stack for `PER_TASK` requests per task, the stacks
//! interleaved (their order rotates each round); a stack's ratio is the median over rounds
//! of the bare client's time divided by the stack's time in the same round (so that drift
//! in the machine's load cancels out). The line to read is the last one: the full stack's
//! ratio to bare reqwest next to reqwest-retry's (goal: ≥ 0.9×).
//!
//! Wall-clock figures move with the machine's load: compare ratios from one run, never
//! figures across machines. No test asserts them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::Resilience;

mod support;
use support::{bearer, reqwest_retry_middleware, start_server};

const TASKS: usize = 64;
const PER_TASK: usize = 100;
const ROUNDS: usize = 9;

#[derive(Clone)]
enum Client {
    Bare(reqwest::Client),
    Middleware(ClientWithMiddleware),
}

impl Client {
    async fn get(&self, url: &str) {
        let response = match self {
            Client::Bare(c) => c.get(url).send().await.expect("response"),
            Client::Middleware(c) => c.get(url).send().await.expect("response"),
        };
        assert_eq!(response.status(), 200);
        std::hint::black_box(response.bytes().await.expect("body"));
    }
}

struct Stack {
    name: &'static str,
    client: Client,
}

fn stacks(client: &reqwest::Client, url: &str) -> Vec<Stack> {
    vec![
        Stack {
            name: "bare reqwest::Client",
            client: Client::Bare(client.clone()),
        },
        Stack {
            name: "reqwest-retry 0.9",
            client: Client::Middleware(
                ClientBuilder::new(client.clone())
                    .with(reqwest_retry_middleware())
                    .build(),
            ),
        },
        Stack {
            name: "Resilience::new()",
            client: Client::Middleware(Resilience::new().build(client.clone()).expect("stack")),
        },
        Stack {
            name: "full stack (with BearerAuth)",
            client: Client::Middleware(
                Resilience::new()
                    .bearer(bearer(url))
                    .build(client.clone())
                    .expect("stack"),
            ),
        },
    ]
}

/// `TASKS` tasks × `n` sequential requests each through `client`: the time they took.
async fn run(client: &Client, url: &Arc<str>, n: usize) -> Duration {
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let client = client.clone();
            let url = url.clone();
            tokio::spawn(async move {
                for _ in 0..n {
                    client.get(&url).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    t0.elapsed()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let (addr, _server) = start_server();
    let url: Arc<str> = format!("http://{addr}/bench").into();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("client runtime");
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(TASKS)
            .build()
            .expect("client");
        let stacks = stacks(&client, &url);
        // Warm up: the connections, the token, the breaker's entries.
        for stack in &stacks {
            run(&stack.client, &url, 20).await;
        }
        println!(
            "throughput benchmark: {TASKS} tasks × {PER_TASK} sequential GETs, one client, \
             {ROUNDS} interleaved rounds, loopback HTTP/1.1 keep-alive, 2 client threads"
        );
        let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(ROUNDS); stacks.len()];
        for round in 0..ROUNDS {
            for k in 0..stacks.len() {
                let i = (round + k) % stacks.len();
                times[i].push(run(&stacks[i].client, &url, PER_TASK).await);
            }
        }
        let ratio = |i: usize| {
            median(
                times[0]
                    .iter()
                    .zip(&times[i])
                    .map(|(b, s)| b.as_secs_f64() / s.as_secs_f64())
                    .collect(),
            )
        };
        println!("\n{:<30} {:>12} {:>12}", "stack", "requests/s", "× bare");
        for (i, stack) in stacks.iter().enumerate() {
            let secs = median(times[i].iter().map(Duration::as_secs_f64).collect());
            let rps = (TASKS * PER_TASK) as f64 / secs;
            println!("{:<30} {rps:>12.0} {:>11.2}×", stack.name, ratio(i));
        }
        println!(
            "\nfull stack {:.2}× bare reqwest, reqwest-retry {:.2}× (goal: full stack ≥ 0.9×)",
            ratio(3),
            ratio(1)
        );
    });
}
