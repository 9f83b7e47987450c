//! [`RangedServer`]: one representation served over HTTP/1.1 with `Range` support, whose
//! responses break where a script says (a FIN, an RST or a stall after so many body
//! bytes), for the body-failure tests. It counts every body byte it writes.
//!
//! `Range: bytes=N-` is answered `206` with `Content-Range: bytes N-(len-1)/len` when the
//! `If-Range` (if any) matches the current ETag or Last-Modified; otherwise the whole
//! body is sent with `200`, as RFC 9110 §13.1.5 says.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::{RecordedRequest, read_request};

/// What the server does with one response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The whole (ranged) answer.
    None,
    /// Close the connection (FIN) after this many body bytes.
    Close(usize),
    /// Reset the connection (RST) after this many body bytes.
    Reset(usize),
    /// Stop writing (the connection stays open) after this many body bytes.
    Stall(usize),
    /// Ignore `Range`: the whole body with `200` (then cut after this many bytes, if some).
    IgnoreRange(Option<usize>),
    /// Answer with this ETag from now on (the representation changed): an `If-Range`
    /// with the old one gets the whole body with `200`.
    ChangeEtag(String),
    /// An empty answer with this status.
    Status(u16),
    /// The representation is this one from now on, and the server ignores `If-Range`
    /// (as servers that do not implement it do): a `Range` is answered `206` from the new
    /// representation, whatever `If-Range` says.
    ChangeIgnoringIfRange(Representation),
}

/// The representation: its bytes and the headers that describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Representation {
    /// Shared, so an answer costs no copy of a large body.
    pub body: Arc<Vec<u8>>,
    /// Sent with every answer (`etag`, `last-modified`, `date`, `accept-ranges`,
    /// `content-encoding`, …), in order.
    pub headers: Vec<(String, String)>,
    /// Whether answers carry `Content-Length` (else the body ends at the close).
    pub content_length: bool,
    /// The size of each write of the body.
    pub write_chunk: usize,
}

impl Representation {
    /// `body` with `Accept-Ranges: bytes`, a strong ETag and `Content-Length`: resumable.
    pub fn resumable(body: Vec<u8>) -> Self {
        Representation {
            body: Arc::new(body),
            headers: vec![
                ("accept-ranges".into(), "bytes".into()),
                ("etag".into(), "\"v1\"".into()),
            ],
            content_length: true,
            write_chunk: 16 * 1024,
        }
    }

    /// Replaces (or adds) a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.retain(|(n, _)| n != name);
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Removes a header.
    pub fn without(mut self, name: &str) -> Self {
        self.headers.retain(|(n, _)| n != name);
        self
    }
}

type Script = dyn Fn(usize, &RecordedRequest) -> Fault + Send + Sync;

struct State {
    repr: Mutex<Representation>,
    requests: Mutex<Vec<RecordedRequest>>,
    seen: AtomicUsize,
    body_bytes: AtomicU64,
}

/// The server; dropping it ends every task.
pub struct RangedServer {
    addr: std::net::SocketAddr,
    state: Arc<State>,
    _tasks: JoinSet<()>,
}

impl RangedServer {
    pub async fn start<F>(repr: Representation, script: F) -> RangedServer
    where
        F: Fn(usize, &RecordedRequest) -> Fault + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            repr: Mutex::new(repr),
            requests: Mutex::new(Vec::new()),
            seen: AtomicUsize::new(0),
            body_bytes: AtomicU64::new(0),
        });
        let script: Arc<Script> = Arc::new(script);
        let mut tasks = JoinSet::new();
        let s = state.clone();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            let mut index = 0;
            while let Ok((stream, _)) = listener.accept().await {
                // The head and the first body bytes go out as written, as a server's do.
                let _ = stream.set_nodelay(true);
                let (s, script) = (s.clone(), script.clone());
                conns.spawn(serve(stream, index, s, script));
                index += 1;
            }
        });
        RangedServer {
            addr,
            state,
            _tasks: tasks,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.requests.lock().unwrap().clone()
    }

    /// The `Range` header of each request, in order (`None`: no `Range`).
    pub fn ranges(&self) -> Vec<Option<String>> {
        self.requests()
            .iter()
            .map(|r| r.header("range").map(str::to_owned))
            .collect()
    }

    /// Body bytes written, over every response.
    pub fn body_bytes_sent(&self) -> u64 {
        self.state.body_bytes.load(Ordering::SeqCst)
    }
}

async fn serve(mut stream: TcpStream, conn: usize, state: Arc<State>, script: Arc<Script>) {
    let mut buf = Vec::new();
    while let Ok(Some(req)) = read_request(&mut stream, &mut buf, conn).await {
        let index = {
            let mut all = state.requests.lock().unwrap();
            all.push(req.clone());
            state.seen.fetch_add(1, Ordering::SeqCst)
        };
        let fault = script(index, &req);
        match &fault {
            Fault::ChangeEtag(etag) => {
                let mut repr = state.repr.lock().unwrap();
                *repr = repr.clone().header("etag", etag);
            }
            Fault::ChangeIgnoringIfRange(new) => *state.repr.lock().unwrap() = new.clone(),
            _ => {}
        }
        let repr = state.repr.lock().unwrap().clone();
        if !answer(&mut stream, &req, &repr, &fault, &state).await {
            return;
        }
    }
}

/// Writes one answer; whether the connection lives on.
async fn answer(
    stream: &mut TcpStream,
    req: &RecordedRequest,
    repr: &Representation,
    fault: &Fault,
    state: &State,
) -> bool {
    if let Fault::Status(code) = fault {
        let head = format!("HTTP/1.1 {code} Status\r\ncontent-length: 0\r\n\r\n");
        return stream.write_all(head.as_bytes()).await.is_ok();
    }
    let len = repr.body.len();
    let start = match fault {
        Fault::IgnoreRange(_) => None,
        Fault::ChangeIgnoringIfRange(_) => range_start(req, None).filter(|s| *s < len),
        _ => range_start(req, Some(repr)).filter(|s| *s < len),
    };
    let mut head = match start {
        Some(s) => format!(
            "HTTP/1.1 206 Partial Content\r\ncontent-range: bytes {s}-{}/{len}\r\n",
            len - 1
        ),
        None => "HTTP/1.1 200 OK\r\n".to_owned(),
    };
    for (n, v) in &repr.headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    let body = &repr.body[start.unwrap_or(0)..];
    if repr.content_length {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    } else {
        head.push_str("connection: close\r\n");
    }
    head.push_str("\r\n");
    if stream.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    let limit = match fault {
        Fault::Close(n) | Fault::Reset(n) | Fault::Stall(n) | Fault::IgnoreRange(Some(n)) => *n,
        _ => usize::MAX,
    }
    .min(body.len());
    for piece in body[..limit].chunks(repr.write_chunk.max(1)) {
        if stream.write_all(piece).await.is_err() {
            return false;
        }
        let _ = stream.flush().await;
        state
            .body_bytes
            .fetch_add(piece.len() as u64, Ordering::SeqCst);
    }
    match fault {
        Fault::Reset(_) => {
            let _ = stream.set_zero_linger();
            false
        }
        Fault::Stall(_) => {
            // Held open until the client gives up (or the server is dropped).
            tokio::time::sleep(Duration::from_secs(24 * 3600)).await;
            false
        }
        _ if limit < body.len() => false,
        _ => repr.content_length,
    }
}

/// `N` of a `Range: bytes=N-` whose `If-Range` (if any) matches the representation
/// (`None`: `If-Range` is ignored).
fn range_start(req: &RecordedRequest, repr: Option<&Representation>) -> Option<usize> {
    let range = req.header("range")?;
    let start = range
        .strip_prefix("bytes=")?
        .strip_suffix('-')?
        .parse()
        .ok()?;
    if let (Some(if_range), Some(repr)) = (req.header("if-range"), repr) {
        let current = |name: &str| {
            repr.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        if Some(if_range) != current("etag") && Some(if_range) != current("last-modified") {
            return None;
        }
    }
    Some(start)
}
