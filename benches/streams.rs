//! Server-sent events: `cargo bench --bench streams` (about a minute).
//!
//! 1. **Parsing**: the same 200 000 events (≈ 20 MB in 16 KiB chunks) through
//!    `stream::EventParser` and through `eventsource-stream` (the parser of
//!    reqwest-eventsource, whose 0.6 needs reqwest 0.12 and so cannot run on this
//!    crate's reqwest 0.13: its parser over reqwest 0.13's `bytes_stream()` is what it
//!    would do), events per second and their ratio, median of 7 interleaved runs.
//! 2. **Delivered through the stack**: the same input served on loopback (chunked
//!    HTTP/1.1) and read through `Resilience::new()` as an `EventStream`, against
//!    `eventsource-stream` over the same client's `bytes_stream()`.
//! 3. **Memory**: the size of an `EventStream`, the heap one idle open stream holds on its
//!    side (its connection included: hyper's buffers), and that heap after 100 and after
//!    10 000 reconnects of one stream (goal: no growth).
//!
//! Wall-clock figures move with the machine's load: compare the ratios of one run. No
//! test asserts them.

#[path = "../tests/support/sse.rs"]
#[allow(dead_code)]
mod sse;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use bytes::Bytes;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use reqwest_middleware::ClientWithMiddleware;
use reqwest_resilience::stream::{EventParser, EventStream, ReconnectPolicy, StreamItem};
use reqwest_resilience::{Jitter, Resilience};
use sse::{SseServer, Step};

/// Live heap bytes allocated by the current thread (allocations minus frees on it).
struct Counting;

thread_local! {
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

fn add(n: usize, sign: i64) {
    let _ = LIVE.try_with(|c| c.set(c.get() + sign * n as i64));
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a
// thread-local `Cell` that never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size(), 1);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(layout.size(), -1);
        // SAFETY: as above, for `dealloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(layout.size(), -1);
        add(new_size, 1);
        // SAFETY: as above, for `realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> i64 {
    LIVE.with(Cell::get)
}

const EVENTS: usize = 200_000;
const CHUNK: usize = 16 * 1024;
const RUNS: usize = 7;

fn input() -> Vec<Bytes> {
    let payload = "x".repeat(64);
    let text: String = (0..EVENTS)
        .map(|i| format!("id: {i}\nevent: tick\ndata: {payload}\n\n"))
        .collect();
    text.as_bytes()
        .chunks(CHUNK)
        .map(Bytes::copy_from_slice)
        .collect()
}

fn ours(chunks: &[Bytes]) -> usize {
    let mut parser = EventParser::new();
    let mut n = 0;
    for c in chunks {
        parser.feed(c);
        while let Some(e) = parser.next_event() {
            n += usize::from(!e.data.is_empty());
        }
    }
    n
}

async fn theirs(chunks: &[Bytes]) -> usize {
    let bytes = futures_util::stream::iter(chunks.iter().cloned().map(Ok::<_, std::io::Error>));
    let mut events = bytes.eventsource();
    let mut n = 0;
    while let Some(e) = events.next().await {
        n += usize::from(!e.expect("parsed").data.is_empty());
    }
    n
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Events per second of `ours` and `theirs`, median of interleaved runs.
async fn race<A, B>(mut a: impl FnMut() -> A, mut b: impl FnMut() -> B) -> (f64, f64)
where
    A: Future<Output = usize>,
    B: Future<Output = usize>,
{
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let t = Instant::now();
        assert_eq!(a().await, EVENTS);
        x.push(EVENTS as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        assert_eq!(b().await, EVENTS);
        y.push(EVENTS as f64 / t.elapsed().as_secs_f64());
    }
    (median(x), median(y))
}

fn print(what: &str, (a, b): (f64, f64)) {
    println!(
        "{what}: EventParser {:.2} M events/s, eventsource-stream {:.2} M events/s, ratio {:.2}x",
        a / 1e6,
        b / 1e6,
        a / b
    );
}

/// A loopback origin on its own thread and runtime (its allocations not counted here).
fn origin(script: impl Fn(usize, &sse::Seen) -> Vec<Step> + Send + Sync + 'static) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let server = SseServer::start(script).await;
            tx.send(server.url("/")).unwrap();
            std::future::pending::<()>().await;
        });
    });
    rx.recv().unwrap()
}

async fn through_stack(client: &ClientWithMiddleware, url: &str) -> usize {
    let mut stream = EventStream::new(client.get(url)).unwrap();
    let mut n = 0;
    while let Some(item) = stream.next().await {
        match item.unwrap() {
            StreamItem::Event(_) => n += 1,
            StreamItem::Reconnecting(_) => break,
            _ => {}
        }
    }
    n
}

async fn through_bytes_stream(client: &ClientWithMiddleware, url: &str) -> usize {
    let response = client.get(url).send().await.unwrap();
    let mut events = response.bytes_stream().eventsource();
    let mut n = 0;
    while let Some(e) = events.next().await {
        e.unwrap();
        n += 1;
    }
    n
}

async fn memory() {
    println!(
        "size_of::<EventStream>() = {} bytes, size_of::<EventParser>() = {} bytes",
        std::mem::size_of::<EventStream>(),
        std::mem::size_of::<EventParser>()
    );
    let url = origin(|_, _| vec![Step::ok(), Step::send("id: 1\ndata: hello\n\n"), Step::Hang]);
    let client = Resilience::new()
        .build(reqwest::Client::builder().build().unwrap())
        .unwrap();
    const OPEN: usize = 1000;
    let before = live();
    let mut open = Vec::new();
    for _ in 0..OPEN {
        let mut s = EventStream::new(client.get(&url)).unwrap();
        s.next().await.unwrap().unwrap(); // Opened
        s.next().await.unwrap().unwrap(); // the event
        open.push(s);
    }
    let per = (live() - before) / OPEN as i64;
    println!("heap per idle open stream (its connection included): {per} bytes ({OPEN} open)");
    drop(open);
    drop(client);
    // The connections' tasks end on the runtime after their streams are dropped.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let url = origin(|_, _| vec![Step::ok(), Step::send("id: 1\ndata: hello\n\n"), Step::End]);
    let client = Resilience::new()
        .build(
            reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap(),
        )
        .unwrap();
    let policy = ReconnectPolicy::new()
        .jitter(Jitter::None)
        .floor(Duration::from_micros(100))
        .reconnection_time(Duration::ZERO)
        .stable_after(Duration::ZERO);
    let mut stream = EventStream::new(client.get(&url))
        .unwrap()
        .reconnect_policy(policy)
        .unwrap();
    let mut reconnects = 0;
    let mut at_100 = 0;
    let base = live();
    while reconnects < 10_000 {
        if let StreamItem::Reconnecting(_) = stream.next().await.unwrap().unwrap() {
            reconnects += 1;
            if reconnects == 100 {
                at_100 = live() - base;
            }
        }
    }
    let at_10_000 = live() - base;
    println!(
        "heap held by one stream after 100 reconnects: {at_100} bytes; after 10 000: \
         {at_10_000} bytes (growth {} bytes)",
        at_10_000 - at_100
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let chunks = input();
        let bytes: usize = chunks.iter().map(Bytes::len).sum();
        println!(
            "input: {EVENTS} events, {bytes} bytes in {} chunks",
            chunks.len()
        );
        let chunks = &chunks;
        print(
            "parse",
            race(|| async { ours(chunks) }, || theirs(chunks)).await,
        );

        let served = chunks.clone();
        let url = origin(move |_, _| {
            let mut steps = vec![Step::ok()];
            steps.extend(served.iter().map(|c| Step::Send(c.to_vec())));
            steps.push(Step::End);
            steps
        });
        let client = Resilience::new().build(reqwest::Client::new()).unwrap();
        let (client, url) = (&client, url.as_str());
        print(
            "through Resilience::new() on loopback",
            race(
                || through_stack(client, url),
                || through_bytes_stream(client, url),
            )
            .await,
        );
        memory().await;
    });
}
