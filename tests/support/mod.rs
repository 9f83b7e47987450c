//! Shared fault servers for the integration tests (include with `mod support;`).
//!
//! Everything listens on loopback only (`127.0.0.1`, or `[::1]` where the host has it) and
//! every task a server spawns ends when the server value is dropped.
//!
//! # HTTP/1.1: [`FaultServer`]
//!
//! ```ignore
//! mod support;
//! use support::{Action, FaultServer};
//!
//! // Every request gets a 503 with Retry-After, then (from the third on) a 200.
//! let server = FaultServer::start(|i, _req| {
//!     if i < 2 { Action::status(503).header("retry-after", "1") } else { Action::ok("done") }
//! }).await;
//! let res = reqwest::get(server.url("/x")).await?;
//! assert_eq!(server.requests_seen(), 3);
//! ```
//!
//! - The script `Fn(usize, &RecordedRequest) -> Action` is called once per request whose
//!   head and body were fully read; the `usize` is the 0-based index of that request over
//!   all connections (the same number `requests_seen()` had before it). A request is
//!   counted in [`FaultServer::requests_seen`] *before* the script runs, so a request the
//!   server reads and then drops (`ReadThenClose`, `ReadThenReset`, `Stall`, …) is counted:
//!   the count is "requests that reached the server", which is what retry tests assert.
//! - Connections are HTTP/1.1 keep-alive: after a `Respond`, the next request on the same
//!   connection is read (unless the client sent `Connection: close`). Bodies are read by
//!   `Content-Length` or `Transfer-Encoding: chunked`.
//! - [`FaultServer::start_with_accept`] also takes an accept hook `Fn(usize) -> Option<Action>`
//!   (the 0-based connection index) that runs *before anything is read*; `Some(action)`
//!   applies it to the fresh connection (that is how `CloseWithoutReading` and `Garbage`
//!   right after accept are produced), `None` serves requests with the script.
//! - [`FaultServer::sequence`] answers from a queue, then repeats a fallback.
//! - [`FaultServer::max_concurrent`]: the most requests handled at once (script called,
//!   answer not yet started; a `Delay` counts), for concurrency-limit tests.
//!
//! # Other helpers
//! - [`refused_port`]: a loopback port with no listener (connect is refused).
//! - [`held_port::HeldRefusedPort`]: the same, held by a bound socket that never listens,
//!   so no other test's server can be handed the port during a long retry sequence.
//! - [`FullBacklog`]: a loopback listener whose connects time out (SYN dropped).
//! - [`h2`]: an HTTP/2 (h2c prior-knowledge) server that answers `RST_STREAM(REFUSED_STREAM)`
//!   and `GOAWAY` with a chosen last-stream-id; use the client with `.http2_prior_knowledge()`.
//! - [`tls`]: a TLS server with a self-signed certificate (not trusted by any client).

#![allow(dead_code)] // each test binary uses a different part of the support code

pub mod gate;
pub mod h2;
pub mod held_port;
pub mod netns;
pub mod nginx;
pub mod nginx_files;
pub mod ranged;
pub mod servers;
pub mod sse;
pub mod tinyproxy;
pub mod tls;
pub mod tls_faults;
#[cfg(feature = "tracing")]
pub mod tracing_scope;
pub mod upload;

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// What the server does with a connection or a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Answer with this status, headers and body (`Content-Length` is added), then keep
    /// the connection alive for the next request.
    Respond {
        /// The status code.
        status: u16,
        /// Extra headers, in order.
        headers: Vec<(String, String)>,
        /// The body.
        body: Vec<u8>,
    },
    /// Close the connection without reading anything (only meaningful from the accept hook;
    /// from the script, the request was already read, so it acts as `ReadThenClose`).
    CloseWithoutReading,
    /// Wait until the first request bytes arrive, then close without reading them. Closing
    /// a socket with unread data makes the kernel send RST (RFC 1122 §4.2.2.13), so the
    /// client deterministically sees its request go out and the connection reset, and the
    /// server never counts a request. (`CloseWithoutReading` from the accept hook races the
    /// client's write instead.)
    CloseWhenDataArrives,
    /// Having read the request, close the connection (FIN) without a byte of response.
    ReadThenClose,
    /// Having read the request, reset the connection (`SO_LINGER` 0, so close sends RST).
    ReadThenReset,
    /// Write half a response head (`HTTP/1.1 200 OK\r\nContent-Le`), then close.
    HalfHead,
    /// Write half a response head, then reset the connection (`SO_LINGER` 0): a reset in
    /// the middle of the response head.
    HalfHeadThenReset,
    /// Never answer; hold the socket open until the server is dropped.
    Stall,
    /// Write these bytes, then close. From the accept hook, the server first reads the
    /// client's first bytes (e.g. a TLS ClientHello) so the garbage *answers* them, and after
    /// writing it waits for the client to close, so no RST overtakes the garbage.
    Garbage(Vec<u8>),
    /// Wait (on tokio's clock, so a paused clock applies), then do the inner action.
    Delay(Duration, Box<Action>),
    /// Like `Delay`, but watching the connection: if the client closes it first (a hedge
    /// loser dropped), count it in [`FaultServer::closed_by_client`] and stop.
    DelayUnlessClosed(Duration, Box<Action>),
    /// `200 OK` with its head (and `Content-Length`) at once and the body after the delay:
    /// a response head that is quick and a body that is slow.
    BodyAfter(Duration, Vec<u8>),
}

impl Action {
    /// `200 OK` with a text body.
    pub fn ok(body: &str) -> Action {
        Action::Respond {
            status: 200,
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
        }
    }

    /// An empty response with this status.
    pub fn status(status: u16) -> Action {
        Action::Respond {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Adds a header to a `Respond` (other actions are returned unchanged).
    pub fn header(mut self, name: &str, value: &str) -> Action {
        if let Action::Respond { headers, .. } = &mut self {
            headers.push((name.to_string(), value.to_string()));
        }
        self
    }

    /// Replaces the body of a `Respond`.
    pub fn body(mut self, bytes: &[u8]) -> Action {
        if let Action::Respond { body, .. } = &mut self {
            *body = bytes.to_vec();
        }
        self
    }
}

/// A request as the server received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// The method, e.g. `GET`.
    pub method: String,
    /// The request target, e.g. `/a?b=1`.
    pub path: String,
    /// Header names lower-cased, in order received.
    pub headers: Vec<(String, String)>,
    /// The body (chunked bodies decoded).
    pub body: Vec<u8>,
    /// The 0-based index of the connection it came on.
    pub connection: usize,
}

impl RecordedRequest {
    /// The first value of a header (name case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

type Script = dyn Fn(usize, &RecordedRequest) -> Action + Send + Sync;
type AcceptHook = dyn Fn(usize) -> Option<Action> + Send + Sync;

#[derive(Default)]
struct Counters {
    requests: Mutex<Vec<RecordedRequest>>,
    requests_seen: AtomicUsize,
    connections: AtomicUsize,
    /// Requests being handled (script called, answer not yet written).
    handling: AtomicUsize,
    /// The most requests handled at once.
    max_handling: AtomicUsize,
    closed_by_client: AtomicUsize,
}

/// Counts a request as handled from the script's call until the guard drops (answer
/// written, connection ended, or the server dropped).
struct Handling<'a>(&'a Counters);

impl<'a> Handling<'a> {
    fn start(c: &'a Counters) -> Self {
        let now = c.handling.fetch_add(1, Ordering::SeqCst) + 1;
        c.max_handling.fetch_max(now, Ordering::SeqCst);
        Handling(c)
    }
}

impl Drop for Handling<'_> {
    fn drop(&mut self) {
        self.0.handling.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A scripted HTTP/1.1 server on loopback; see the module docs.
pub struct FaultServer {
    addr: SocketAddr,
    counters: Arc<Counters>,
    // Dropping the accept task drops its JoinSet, which aborts every connection task.
    accept_task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl FaultServer {
    /// Starts a server on `127.0.0.1` that answers every request with `script`.
    pub async fn start<F>(script: F) -> FaultServer
    where
        F: Fn(usize, &RecordedRequest) -> Action + Send + Sync + 'static,
    {
        Self::start_with_accept(|_| None, script).await
    }

    /// Starts a server that answers every request with the same action.
    pub async fn always(action: Action) -> FaultServer {
        Self::start(move |_, _| action.clone()).await
    }

    /// Starts a server that answers request `i` with `actions[i]`, and with `fallback`
    /// once the queue is used up.
    pub async fn sequence(actions: Vec<Action>, fallback: Action) -> FaultServer {
        Self::start(move |i, _| actions.get(i).cloned().unwrap_or_else(|| fallback.clone())).await
    }

    /// Starts a server on `127.0.0.1` with an accept hook (see the module docs).
    pub async fn start_with_accept<A, F>(on_accept: A, script: F) -> FaultServer
    where
        A: Fn(usize) -> Option<Action> + Send + Sync + 'static,
        F: Fn(usize, &RecordedRequest) -> Action + Send + Sync + 'static,
    {
        Self::try_start_on(IpAddr::V4(Ipv4Addr::LOCALHOST), 0, on_accept, script)
            .await
            .expect("bind 127.0.0.1")
    }

    /// Starts a server on `[::1]`, or `None` when this host has no IPv6 loopback.
    pub async fn start_v6<F>(script: F) -> Option<FaultServer>
    where
        F: Fn(usize, &RecordedRequest) -> Action + Send + Sync + 'static,
    {
        Self::try_start_on(IpAddr::V6(Ipv6Addr::LOCALHOST), 0, |_| None, script)
            .await
            .ok()
    }

    /// Starts a server on a given loopback address and port (0 = any free port).
    pub async fn try_start_on<A, F>(
        ip: IpAddr,
        port: u16,
        on_accept: A,
        script: F,
    ) -> io::Result<FaultServer>
    where
        A: Fn(usize) -> Option<Action> + Send + Sync + 'static,
        F: Fn(usize, &RecordedRequest) -> Action + Send + Sync + 'static,
    {
        assert!(ip.is_loopback(), "test servers listen on loopback only");
        let listener = TcpListener::bind(SocketAddr::new(ip, port)).await?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let script: Arc<Script> = Arc::new(script);
        let on_accept: Arc<AcceptHook> = Arc::new(on_accept);
        let c = counters.clone();
        let accept_task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    // A failed accept (e.g. out of file descriptors) must not spin.
                    tokio::task::yield_now().await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let index = c.connections.fetch_add(1, Ordering::SeqCst);
                let (c, script, on_accept) = (c.clone(), script.clone(), on_accept.clone());
                conns.spawn(async move {
                    let mut stream = stream;
                    match on_accept(index) {
                        Some(Action::Garbage(bytes)) => answer_first_bytes(stream, &bytes).await,
                        Some(action) => apply_terminal(&mut stream, action).await,
                        None => serve_http1(stream, index, &c, &*script).await,
                    }
                });
                // Reap finished connections so a long benchmark does not grow the set.
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(FaultServer {
            addr,
            counters,
            accept_task,
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// How many requests were fully received (head and body).
    pub fn requests_seen(&self) -> usize {
        self.counters.requests_seen.load(Ordering::SeqCst)
    }

    /// Every fully received request, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.counters.requests.lock().unwrap().clone()
    }

    /// How many connections were accepted.
    pub fn connections(&self) -> usize {
        self.counters.connections.load(Ordering::SeqCst)
    }

    /// How many requests are being handled now: the script was called for them and
    /// their answer (or terminal action, a `Delay` included) is not finished.
    pub fn handling(&self) -> usize {
        self.counters.handling.load(Ordering::SeqCst)
    }

    /// The most requests handled at once so far (see [`handling`](Self::handling)).
    pub fn max_concurrent(&self) -> usize {
        self.counters.max_handling.load(Ordering::SeqCst)
    }

    /// How many requests answered with `DelayUnlessClosed` saw the client close their
    /// connection before the delay was over.
    pub fn closed_by_client(&self) -> usize {
        self.counters.closed_by_client.load(Ordering::SeqCst)
    }
}

/// Lets every origin have a metrics label of its own from now on, in this process. The
/// bound on labelled origins (1 000 by default) is process-wide, and in the shared test
/// binary (`tests/it`) the other tests' loopback origins can use it up before a test that
/// asserts its own origin's label runs (that origin would then be labelled `other`).
#[cfg(feature = "metrics")]
pub fn label_every_origin() {
    reqwest_resilience::metrics::set_max_origin_labels(usize::MAX);
}

/// A loopback port with no listener: connecting to it is refused.
///
/// Binds a listener on an ephemeral port and drops it; the kernel does not hand that port
/// out again at once, so a test that connects right away is refused.
pub fn refused_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A listener on `127.0.0.1` whose accept queue is full and never drained.
///
/// Linux drops a SYN that arrives while a listener's accept queue is full, so a new
/// connection to [`FullBacklog::addr`] neither completes nor is refused: the client's connect
/// times out. That is a connect timeout on loopback, where a SYN is otherwise always
/// answered.
pub struct FullBacklog {
    addr: SocketAddr,
    _listener: tokio::net::TcpListener,
    _fillers: Vec<std::net::TcpStream>,
}

impl FullBacklog {
    /// Listens with the smallest backlog and connects until a connect no longer completes.
    pub async fn start() -> FullBacklog {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
        let listener = socket.listen(1).expect("listen");
        let addr = listener.local_addr().expect("addr");
        let fillers = tokio::task::spawn_blocking(move || {
            let mut fillers = Vec::new();
            // Linux queues backlog + 1 connections; a few more attempts bound the loop.
            for _ in 0..16 {
                match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                    Ok(s) => fillers.push(s),
                    Err(_) => return fillers,
                }
            }
            panic!("the accept queue of a backlog-1 listener never filled");
        })
        .await
        .expect("fill the backlog");
        FullBacklog {
            addr,
            _listener: listener,
            _fillers: fillers,
        }
    }

    /// The address whose connects time out.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

async fn serve_http1(mut stream: TcpStream, conn: usize, c: &Counters, script: &Script) {
    let mut buf = Vec::with_capacity(4096);
    loop {
        let req = match read_request(&mut stream, &mut buf, conn).await {
            Ok(Some(req)) => req,
            // Clean EOF between requests, or a broken request: the connection is done.
            Ok(None) | Err(_) => return,
        };
        let close = req
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let index = {
            // Recording and counting under one lock keeps `requests()` and the index in order.
            let mut all = c.requests.lock().unwrap();
            all.push(req.clone());
            c.requests_seen.fetch_add(1, Ordering::SeqCst)
        };
        let handling = Handling::start(c);
        let mut action = script(index, &req);
        let action = loop {
            action = match action {
                Action::Delay(d, inner) => {
                    tokio::time::sleep(d).await;
                    *inner
                }
                Action::DelayUnlessClosed(d, inner) => {
                    let mut probe = [0u8; 1];
                    tokio::select! {
                        _ = tokio::time::sleep(d) => *inner,
                        // The client sends nothing more while it waits for this answer: EOF
                        // or an error is the client closing the connection.
                        _ = stream.read(&mut probe) => {
                            c.closed_by_client.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    }
                }
                other => break other,
            };
        };
        match action {
            Action::BodyAfter(d, body) => {
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let _ = stream.flush().await;
                tokio::time::sleep(d).await;
                if stream.write_all(&body).await.is_err() || close {
                    return;
                }
            }
            Action::Respond {
                status,
                headers,
                body,
            } => {
                let reason = http::StatusCode::from_u16(status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("Status");
                let mut head = format!("HTTP/1.1 {status} {reason}\r\n");
                for (n, v) in &headers {
                    head.push_str(&format!("{n}: {v}\r\n"));
                }
                head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
                let mut out = head.into_bytes();
                out.extend_from_slice(&body);
                // Done before the client can read the answer, so a client that sends its
                // next request on receiving it never sees this one still counted.
                drop(handling);
                if stream.write_all(&out).await.is_err() || close {
                    return;
                }
            }
            other => return apply_terminal(&mut stream, other).await,
        }
    }
}

/// Applies an action that ends the connection (anything but `Respond`).
async fn apply_terminal(stream: &mut TcpStream, action: Action) {
    match action {
        Action::Respond { .. } | Action::BodyAfter(..) => {
            unreachable!("Respond is only valid after a request was read")
        }
        Action::CloseWithoutReading | Action::ReadThenClose => {}
        Action::CloseWhenDataArrives => {
            let mut probe = [0u8; 1];
            let _ = stream.peek(&mut probe).await;
        }
        Action::ReadThenReset => {
            // Zero linger turns the close into an RST.
            let _ = stream.set_zero_linger();
        }
        Action::HalfHead => {
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Le").await;
            let _ = stream.flush().await;
        }
        Action::HalfHeadThenReset => {
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Le").await;
            let _ = stream.flush().await;
            let _ = stream.set_zero_linger();
        }
        Action::Stall => std::future::pending::<()>().await,
        Action::Garbage(bytes) => {
            let _ = stream.write_all(&bytes).await;
            let _ = stream.flush().await;
        }
        Action::Delay(d, inner) | Action::DelayUnlessClosed(d, inner) => {
            tokio::time::sleep(d).await;
            Box::pin(apply_terminal(stream, *inner)).await
        }
    }
}

/// Reads the client's first bytes, answers them with `bytes`, and closes gracefully.
async fn answer_first_bytes(mut stream: TcpStream, bytes: &[u8]) {
    let mut buf = [0u8; 16 * 1024];
    if !matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {
        return;
    }
    let _ = stream.write_all(bytes).await;
    let _ = stream.shutdown().await;
    // Drain until the client closes: unread data at close would turn the FIN into an RST.
    while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// Reads one request. `Ok(None)` on EOF before any byte of a new request.
async fn read_request(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    conn: usize,
) -> io::Result<Option<RecordedRequest>> {
    // Head: read until the blank line.
    let head_len = loop {
        if let Some(pos) = find(buf, b"\r\n\r\n") {
            break pos + 4;
        }
        if buf.len() > 64 * 1024 {
            return Err(io::Error::other("request head too large"));
        }
        if read_more(stream, buf).await? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
    };
    let mut header_storage = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Request::new(&mut header_storage);
    parsed
        .parse(&buf[..head_len])
        .map_err(|e| io::Error::other(e.to_string()))?;
    let method = parsed.method.unwrap_or("").to_string();
    let path = parsed.path.unwrap_or("").to_string();
    let headers: Vec<(String, String)> = parsed
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    buf.drain(..head_len);

    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.trim().to_ascii_lowercase())
    };
    let body = if get("transfer-encoding").is_some_and(|v| v.ends_with("chunked")) {
        read_chunked(stream, buf).await?
    } else {
        let len: usize = match get("content-length") {
            Some(v) => v
                .parse()
                .map_err(|_| io::Error::other("bad content-length"))?,
            None => 0,
        };
        while buf.len() < len {
            if read_more(stream, buf).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        buf.drain(..len).collect()
    };
    Ok(Some(RecordedRequest {
        method,
        path,
        headers,
        body,
        connection: conn,
    }))
}

async fn read_chunked(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(pos) = find(buf, b"\r\n") {
                break pos;
            }
            if read_more(stream, buf).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        };
        let size_text = String::from_utf8_lossy(&buf[..line_end]).into_owned();
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size =
            usize::from_str_radix(size_text, 16).map_err(|_| io::Error::other("bad chunk size"))?;
        buf.drain(..line_end + 2);
        if size == 0 {
            // Trailers end with an empty line; no test sends trailers.
            while find(buf, b"\r\n").is_none() {
                if read_more(stream, buf).await? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
            }
            let end = find(buf, b"\r\n").unwrap_or(0);
            buf.drain(..end + 2);
            return Ok(body);
        }
        while buf.len() < size + 2 {
            if read_more(stream, buf).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        body.extend_from_slice(&buf[..size]);
        buf.drain(..size + 2);
    }
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    let mut chunk = [0u8; 8192];
    let n = stream.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A client for these servers: no proxy, and no idle pool, whose timer a paused clock
/// would jump to.
pub fn loopback_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .pool_idle_timeout(None)
        .build()
        .unwrap()
}

/// A retry middleware with exact delays (1 s, 2 s, 4 s … without jitter) and no budget.
pub fn exact_retry() -> reqwest_resilience::retry::RetryMiddlewareBuilder {
    reqwest_resilience::RetryMiddleware::builder()
        .backoff(
            reqwest_resilience::Backoff::builder()
                .jitter(reqwest_resilience::Jitter::None)
                .build()
                .unwrap(),
        )
        .no_budget()
}

/// The display text of every error of `err`'s chain, outermost first, without repeats: many
/// wrappers print their inner error's text as their own. Walks the chain as the crate does
/// (`chain::find`'s docs): into the error an `io::Error` or a `reqwest_middleware::Error`
/// wraps, at most 32 links.
pub fn chain_messages(err: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut next = Some(err);
    for _ in 0..32 {
        let Some(e) = next else { break };
        let text = e.to_string();
        if out.last() != Some(&text) {
            out.push(text);
        }
        next = below(e);
    }
    out
}

/// The error below `e` in its chain, the wrapped one included (see [`chain_messages`]).
type DynError = dyn std::error::Error + 'static;

fn below(e: &DynError) -> Option<&DynError> {
    if let Some(inner) = e
        .downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
    {
        return Some(inner as &DynError);
    }
    match e.downcast_ref::<reqwest_middleware::Error>() {
        Some(reqwest_middleware::Error::Reqwest(inner)) => return Some(inner as &DynError),
        Some(reqwest_middleware::Error::Middleware(inner)) => return Some(inner.as_ref()),
        None => {}
    }
    #[cfg(feature = "astral")]
    match e.downcast_ref::<astral_reqwest_middleware::Error>() {
        Some(astral_reqwest_middleware::Error::Reqwest(inner)) => return Some(inner as &DynError),
        Some(astral_reqwest_middleware::Error::Middleware(inner)) => return Some(inner.as_ref()),
        None => {}
    }
    e.source()
}
