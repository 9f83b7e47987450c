//! The client's memory during a 64 MiB upload with retries (a plain binary: `cargo bench
//! --bench upload`, about 10 s). Not a timed test: it prints figures, and fails only when
//! the replayable upload's heap peak or resident-set growth reaches the goal of the issue
//! (8 MiB above its start).
//!
//! A loopback `tests/support/upload.rs` server in this process refuses the first
//! connection, reads the second request's whole body and answers `503` with
//! `Retry-After: 1`, and answers the third `201` once its body is read (digest checked):
//! three attempts, two bodies sent whole. Through `Resilience` (exact backoff, no budget):
//!
//! - `replayable`: `ReplayableBody::file(path)`, opened for each attempt and read 64 KiB
//!   at a time as it is sent;
//! - `buffered`: the file read into a `Vec<u8>` (`.body(bytes)`), what a caller without
//!   replayable bodies does to get retries (reqwest copies a buffered body per attempt).
//!
//! Figures, for each: the peak of live heap bytes above the heap at its start (a global
//! allocator counting bytes over every thread, the in-process server's buffers included:
//! two 64 KiB buffers per connection), and for `replayable`, run first, the process's
//! peak resident set (`VmHWM`) above its resident set (`VmRSS`) at the start, after a
//! warm-up upload of 64 KiB (so the code and the runtime's threads are resident already).

#[path = "../tests/support/mod.rs"]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::Extensions;
use reqwest_middleware::{Middleware, Next};
use reqwest_resilience::Resilience;
use reqwest_resilience::upload::ReplayableBody;
use support::upload::{Step, UploadServer, write_pattern_file};

const LEN: usize = 64 * 1024 * 1024;
const GOAL: usize = 8 * 1024 * 1024;

// ---------------------------------------------------------------------------------------
// A global allocator counting live bytes and their peak, over every thread.

struct Peak;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counters are
// atomics that never allocate.
unsafe impl GlobalAlloc for Peak {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as above, for `dealloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: as above, for `alloc_zeroed`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= layout.size() {
            grew(new_size - layout.size());
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        // SAFETY: as above, for `realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Peak = Peak;

/// Starts a phase: the peak is reset to the live bytes now, which are returned.
fn heap_start() -> usize {
    let now = LIVE.load(Ordering::Relaxed);
    PEAK.store(now, Ordering::Relaxed);
    now
}

/// A field of `/proc/self/status` in KiB (`VmRSS`, `VmHWM`).
fn status_kib(field: &str) -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

// ---------------------------------------------------------------------------------------
// The scenario.

/// Starts the server listening before the second attempt (the first is refused).
struct OpenOnSecondAttempt {
    server: Arc<UploadServer>,
    seen: AtomicUsize,
}

#[reqwest_resilience::async_trait]
impl Middleware for OpenOnSecondAttempt {
    async fn handle(
        &self,
        req: reqwest::Request,
        ext: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        if self.seen.fetch_add(1, Ordering::SeqCst) == 1 {
            self.server.open();
        }
        next.run(req, ext).await
    }
}

/// One upload through the scenario; the server, to read what it saw.
async fn upload(
    body: impl FnOnce(reqwest_middleware::RequestBuilder) -> reqwest_middleware::RequestBuilder,
) -> Arc<UploadServer> {
    let server = UploadServer::refusing(
        vec![Step::Respond(503, vec![("retry-after", "1")])],
        Step::Respond(201, vec![]),
    );
    let opener = Arc::new(OpenOnSecondAttempt {
        server: server.clone(),
        seen: AtomicUsize::new(0),
    });
    let client = Resilience::new()
        .retry(support::exact_retry())
        .per_attempt(opener)
        .build_from(reqwest::Client::builder().no_proxy())
        .unwrap();
    let response = body(client.post(server.url("/upload")))
        .send()
        .await
        .expect("uploaded");
    assert_eq!(response.status(), 201);
    server
}

fn check(server: &UploadServer, digest: u64) {
    let seen = server.received();
    assert_eq!(server.connections(), 2);
    assert_eq!(seen.len(), 2);
    for request in &seen {
        assert!(request.complete && request.len == LEN as u64 && request.digest == digest);
    }
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    let path = std::env::temp_dir().join(format!(
        "reqwest-resilience-bench-upload-{}",
        std::process::id()
    ));
    let digest = write_pattern_file(&path, LEN);

    // A warm-up upload of 64 KiB through the same scenario: the code, the runtime's
    // threads and the pools are in the resident set before the start is read.
    let small = path.with_extension("warm-up");
    write_pattern_file(&small, 64 * 1024);
    drop(upload(|b| b.with_extension(ReplayableBody::file(&small))).await);
    let _ = std::fs::remove_file(&small);

    let rss_start = status_kib("VmRSS:").unwrap_or(0);
    let heap_at = heap_start();
    let server = upload(|b| b.with_extension(ReplayableBody::file(&path))).await;
    let replayable_peak = PEAK.load(Ordering::Relaxed) - heap_at;
    let hwm = status_kib("VmHWM:").unwrap_or(0);
    check(&server, digest);
    drop(server);

    let heap_at = heap_start();
    let server = upload(|b| b.body(std::fs::read(&path).expect("read the file"))).await;
    let buffered_peak = PEAK.load(Ordering::Relaxed) - heap_at;
    check(&server, digest);
    let _ = std::fs::remove_file(&path);

    let kib = |b: usize| b / 1024;
    println!(
        "64 MiB POST: refused, then 503 with Retry-After: 1, then 201 (3 attempts, 2 bodies sent whole)"
    );
    println!("| body | heap peak above start | VmHWM above start VmRSS |");
    println!("|---|---:|---:|");
    println!(
        "| replayable file | {} KiB | {} KiB |",
        kib(replayable_peak),
        hwm.saturating_sub(rss_start)
    );
    println!(
        "| buffered Vec<u8> | {} KiB | (not measured: after the first) |",
        kib(buffered_peak)
    );
    println!("goal: replayable < {} KiB", kib(GOAL));
    assert!(
        hwm.saturating_sub(rss_start) * 1024 < GOAL,
        "the replayable upload's resident set grew past the goal"
    );
    assert!(
        replayable_peak < GOAL,
        "the replayable upload's heap peak reached the goal"
    );
}
