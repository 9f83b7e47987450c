//! Resumed downloads (a plain binary: `cargo bench --bench resume`, about 15 s).
//!
//! A 64 MiB body served on loopback by `tests/support/ranged.rs` (`Accept-Ranges: bytes`,
//! a strong ETag, `Content-Length`), read with `chunk()` and compared with the original
//! as it arrives, through `Resilience` (no breaker; a zero backoff, so the waits a real
//! deployment chooses, 1 s by default, do not hide the cost of the transfer and the new
//! connections). Four configurations, run in turns so a stall of the
//! shared machine falls on all of them alike, each `RESUME_BENCH_ROUNDS` times (default 5):
//!
//! - `plain`: uninterrupted, `resume_bodies(false)`;
//! - `wrapped`: uninterrupted, `resume_bodies(true)` (the resumable body's cost);
//! - `resumed`: cut 3 times at random offsets (a seeded draw per round), `resume_bodies(true)`;
//! - `restarted`: the same cuts, no resume, the download run again from the start by an
//!   `Operation` (what a caller without resumes does).
//!
//! Reports the median throughput (MiB/s of body delivered to the caller) and the body
//! bytes the server sent per byte of body, and the ratios the issue asks for.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use reqwest_middleware::ClientWithMiddleware;
use reqwest_resilience::{Backoff, Jitter, Resilience, RetryMiddleware};
use support::ranged::{Fault, RangedServer, Representation};

const LEN: usize = 64 * 1024 * 1024;
const CUTS: usize = 3;

fn payload() -> Vec<u8> {
    (0..LEN).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// SplitMix64.
fn draw(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Three cut points in the body, in order, for `round`.
fn cuts(round: u64) -> Vec<usize> {
    let mut at: Vec<usize> = (0..CUTS as u64)
        .map(|i| (draw(round * 16 + i) % LEN as u64) as usize)
        .collect();
    at.sort_unstable();
    at
}

fn retry() -> RetryMiddleware {
    let backoff = Backoff::builder()
        .base(Duration::ZERO)
        .jitter(Jitter::None)
        .build()
        .unwrap();
    RetryMiddleware::builder()
        .backoff(backoff)
        .max_retries(CUTS as u32 + 1)
        .no_budget()
        .build()
        .unwrap()
}

fn client(retry: &RetryMiddleware, resume: bool) -> ClientWithMiddleware {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    Resilience::new()
        .retry(retry.clone())
        .no_breaker()
        .resume_bodies(resume)
        .build(client)
        .unwrap()
}

/// Reads the body at `url`, checking each chunk against `body`; the bytes delivered.
async fn read(
    client: &ClientWithMiddleware,
    url: &str,
    body: &[u8],
    attempt: Option<reqwest_resilience::retry::OperationAttempt>,
) -> Result<usize, reqwest_middleware::Error> {
    let mut request = client.get(url);
    if let Some(attempt) = attempt {
        request = request.with_extension(attempt);
    }
    let mut response = request.send().await?;
    let mut at = 0;
    while let Some(chunk) = response.chunk().await? {
        assert!(
            body[at..at + chunk.len()] == chunk[..],
            "wrong bytes at {at}"
        );
        at += chunk.len();
    }
    assert_eq!(at, body.len());
    Ok(at)
}

#[derive(Clone, Copy, PartialEq)]
enum Config {
    Plain,
    Wrapped,
    Resumed,
    Restarted,
}

/// One download: (seconds, body bytes the server sent).
async fn run(config: Config, round: u64, body: &std::sync::Arc<Vec<u8>>) -> (f64, u64) {
    let cut_at = cuts(round);
    let cut = !matches!(config, Config::Plain | Config::Wrapped);
    let restart = config == Config::Restarted;
    let mut repr = Representation::resumable(Vec::new());
    repr.body = body.clone();
    repr.write_chunk = 64 * 1024;
    let server = RangedServer::start(repr, move |i, req| {
        let from: usize = req
            .header("range")
            .and_then(|r| {
                r.trim_start_matches("bytes=")
                    .trim_end_matches('-')
                    .parse()
                    .ok()
            })
            .unwrap_or(0);
        match cut_at.get(i) {
            // Each cut is counted in the full body's offsets, from where this answer starts.
            Some(&at) if cut && !restart => Fault::Close(at.saturating_sub(from)),
            Some(&at) if cut => Fault::Close(at),
            _ => Fault::None,
        }
    })
    .await;
    let retry = retry();
    let client = client(&retry, config != Config::Plain && !restart);
    let url = server.url("/model.bin");
    let started = std::time::Instant::now();
    let delivered = if restart {
        let (client, url, body) = (&client, url.as_str(), &body[..]);
        retry
            .operation()
            .run(|attempt| read(client, url, body, Some(attempt)))
            .await
    } else {
        read(&client, &url, body, None).await
    };
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(delivered.unwrap(), LEN);
    (seconds, server.body_bytes_sent())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: u64 = std::env::var("RESUME_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let body = std::sync::Arc::new(payload());
    let configs = [
        Config::Plain,
        Config::Wrapped,
        Config::Resumed,
        Config::Restarted,
    ];
    let names = ["plain", "wrapped", "resumed", "restarted"];
    let mut seconds = vec![Vec::new(); configs.len()];
    let mut sent = vec![Vec::new(); configs.len()];
    for round in 0..rounds {
        for (i, config) in configs.iter().enumerate() {
            let (s, bytes) = run(*config, round, &body).await;
            seconds[i].push(s);
            sent[i].push(bytes as f64 / LEN as f64);
        }
    }
    let mib = LEN as f64 / (1024.0 * 1024.0);
    let throughput: Vec<f64> = seconds.iter().map(|s| mib / median(s.clone())).collect();
    println!("64 MiB body, {rounds} rounds, median of each");
    println!("| config | MiB/s | server bytes / body (median, max) |");
    println!("|---|---:|---:|");
    for (i, name) in names.iter().enumerate() {
        let most = sent[i].iter().copied().fold(0.0, f64::max);
        let mid = median(sent[i].clone());
        println!("| {name} | {:.0} | {mid:.3}, {most:.3} |", throughput[i]);
    }
    println!(
        "wrapped / plain throughput: {:.3}; resumed / plain: {:.3}; restarted / plain: {:.3}",
        throughput[1] / throughput[0],
        throughput[2] / throughput[0],
        throughput[3] / throughput[0]
    );
}
