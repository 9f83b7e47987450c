//! Servers for the upload tests: [`UploadServer`], an HTTP/1.1 loopback server that reads
//! request bodies as they arrive (never held whole: a digest and a length are kept) and
//! answers each connection from a script, which can refuse its first connections (a port
//! bound but not yet listening), reset a connection mid-upload, answer once the body is
//! read, or forward the connection to another server (nginx); and [`nginx_dav`], a real
//! nginx storing `PUT` bodies (its WebDAV module) under its directory.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

use super::nginx::Nginx;

/// What the server does with one connection (one request per connection).
#[derive(Debug, Clone)]
pub enum Step {
    /// Read the whole body, then answer with this status and headers (no body).
    Respond(u16, Vec<(&'static str, &'static str)>),
    /// Read this many bytes of the body, then reset the connection (`SO_LINGER` 0).
    ResetAfter(u64),
    /// Pass the connection through to this address (its answer goes back as it is).
    Forward(SocketAddr),
    /// Read the whole body, wait this long (tokio's clock), then answer with this status.
    Slow(std::time::Duration, u16),
}

/// A request body as the server read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub method: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    /// Body bytes read (chunked bodies decoded).
    pub len: u64,
    /// [`digest`] of those bytes.
    pub digest: u64,
    /// Whether the whole body was read (its `Content-Length`, or a chunked body's end).
    pub complete: bool,
}

impl Received {
    /// The first value of a header (name lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// FNV-1a over a byte stream, chunk by chunk (the same for any split).
#[derive(Debug, Clone, Copy)]
pub struct Digest(u64);

impl Default for Digest {
    fn default() -> Self {
        Digest(0xcbf2_9ce4_8422_2325)
    }
}

impl Digest {
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub fn value(self) -> u64 {
        self.0
    }
}

/// The digest of `bytes` ([`Digest`]).
pub fn digest(bytes: &[u8]) -> u64 {
    let mut d = Digest::default();
    d.update(bytes);
    d.value()
}

/// Writes a file of `len` bytes of a fixed pattern at `path`, 1 MiB at a time; returns
/// its [`digest`].
pub fn write_pattern_file(path: &std::path::Path, len: usize) -> u64 {
    use std::io::Write;
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    let mut d = Digest::default();
    let mut chunk = vec![0u8; 1 << 20];
    let mut written = 0;
    while written < len {
        let n = chunk.len().min(len - written);
        for (i, b) in chunk[..n].iter_mut().enumerate() {
            let at = written + i;
            *b = (at * 7 + at / 251) as u8;
        }
        d.update(&chunk[..n]);
        file.write_all(&chunk[..n]).expect("write");
        written += n;
    }
    file.flush().expect("flush");
    d.value()
}

#[derive(Default)]
struct Shared {
    steps: Mutex<VecDeque<Step>>,
    received: Mutex<Vec<Received>>,
    connections: AtomicUsize,
}

/// See the module docs. Every task ends when the server is dropped.
pub struct UploadServer {
    addr: SocketAddr,
    socket: Mutex<Option<TcpSocket>>,
    shared: Arc<Shared>,
    fallback: Step,
    tasks: Mutex<JoinSet<()>>,
}

impl UploadServer {
    /// A server that refuses connections until [`open`](Self::open) (its port bound, not
    /// listening), then answers connection `i` with `steps[i]`, and `fallback` after.
    pub fn refusing(steps: Vec<Step>, fallback: Step) -> Arc<UploadServer> {
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .expect("bind");
        let addr = socket.local_addr().expect("addr");
        Arc::new(UploadServer {
            addr,
            socket: Mutex::new(Some(socket)),
            shared: Arc::new(Shared {
                steps: Mutex::new(steps.into()),
                ..Shared::default()
            }),
            fallback,
            tasks: Mutex::new(JoinSet::new()),
        })
    }

    /// A server listening at once ([`refusing`](Self::refusing), then [`open`](Self::open)).
    pub fn start(steps: Vec<Step>, fallback: Step) -> Arc<UploadServer> {
        let server = UploadServer::refusing(steps, fallback);
        server.open();
        server
    }

    /// Starts listening (once; later calls do nothing). Call on a tokio runtime.
    pub fn open(&self) {
        let Some(socket) = self.socket.lock().unwrap().take() else {
            return;
        };
        let listener = socket.listen(64).expect("listen");
        let shared = self.shared.clone();
        let fallback = self.fallback.clone();
        self.tasks.lock().unwrap().spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                // A connection reset while it waited in the backlog fails its accept only.
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                shared.connections.fetch_add(1, Ordering::SeqCst);
                let step = shared.steps.lock().unwrap().pop_front();
                let step = step.unwrap_or_else(|| fallback.clone());
                connections.spawn(serve(stream, step, shared.clone()));
            }
        });
    }

    /// `http://127.0.0.1:PORT<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Connections accepted.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// The requests whose head was read, in order (a forwarded one is not read).
    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap().clone()
    }
}

async fn serve(stream: TcpStream, step: Step, shared: Arc<Shared>) {
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let mut head = Vec::new();
    loop {
        let before = head.len();
        match reader.read_until(b'\n', &mut head).await {
            Ok(0) | Err(_) => return,
            Ok(_) if head[before..] == *b"\r\n" => break,
            Ok(_) => {}
        }
    }
    if let Step::Forward(to) = step {
        let Ok(mut upstream) = TcpStream::connect(to).await else {
            return;
        };
        let buffered = reader.buffer().to_vec();
        if upstream.write_all(&head).await.is_err() || upstream.write_all(&buffered).await.is_err()
        {
            return;
        }
        let mut client = reader.into_inner();
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        return;
    }
    let mut received = parse_head(&head);
    let limit = match step {
        Step::ResetAfter(n) => Some(n),
        _ => None,
    };
    let complete = read_body(&mut reader, &mut received, limit).await;
    received.complete = complete;
    shared.received.lock().unwrap().push(received);
    let mut stream = reader.into_inner();
    let step = match step {
        Step::Slow(wait, status) => {
            tokio::time::sleep(wait).await;
            Step::Respond(status, vec![])
        }
        step => step,
    };
    match step {
        Step::Respond(status, headers) if complete => {
            let mut answer =
                format!("HTTP/1.1 {status} Scripted\r\ncontent-length: 0\r\nconnection: close\r\n");
            for (n, v) in headers {
                answer.push_str(&format!("{n}: {v}\r\n"));
            }
            answer.push_str("\r\n");
            let _ = stream.write_all(answer.as_bytes()).await;
            let _ = stream.shutdown().await;
            // Until the client closes, so no reset overtakes the answer.
            let mut rest = [0u8; 1024];
            while let Ok(n) = stream.read(&mut rest).await {
                if n == 0 {
                    break;
                }
            }
        }
        _ => {
            let _ = stream.set_zero_linger();
            drop(stream);
        }
    }
}

fn parse_head(head: &[u8]) -> Received {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let _ = req.parse(head).expect("a request head");
    Received {
        method: req.method.unwrap_or_default().to_owned(),
        headers: req
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect(),
        len: 0,
        digest: Digest::default().value(),
        complete: false,
    }
}

/// Reads the body (up to `limit` bytes), digesting it; whether it was read whole.
async fn read_body(
    reader: &mut BufReader<TcpStream>,
    received: &mut Received,
    limit: Option<u64>,
) -> bool {
    let mut d = Digest::default();
    let limit = limit.unwrap_or(u64::MAX);
    let chunked = received
        .header("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"));
    let complete = if chunked {
        read_chunked(reader, received, &mut d, limit).await
    } else {
        let len: u64 = received
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        read_exact_len(reader, received, &mut d, len.min(limit)).await && len <= limit
    };
    received.digest = d.value();
    complete
}

async fn read_exact_len(
    reader: &mut BufReader<TcpStream>,
    received: &mut Received,
    d: &mut Digest,
    len: u64,
) -> bool {
    let mut buf = vec![0u8; 64 * 1024];
    while received.len < len {
        let want = buf.len().min((len - received.len) as usize);
        match reader.read(&mut buf[..want]).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => {
                d.update(&buf[..n]);
                received.len += n as u64;
            }
        }
    }
    true
}

async fn read_chunked(
    reader: &mut BufReader<TcpStream>,
    received: &mut Received,
    d: &mut Digest,
    limit: u64,
) -> bool {
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            return false;
        }
        let size = line.trim().split(';').next().unwrap_or("");
        let Ok(size) = u64::from_str_radix(size, 16) else {
            return false;
        };
        if size == 0 {
            let mut end = String::new();
            let _ = reader.read_line(&mut end).await;
            return true;
        }
        let end = received.len + size;
        let until = end.min(limit);
        if !read_exact_len(reader, received, d, until).await || until < end {
            return false;
        }
        let mut crlf = [0u8; 2];
        if reader.read_exact(&mut crlf).await.is_err() {
            return false;
        }
    }
}

/// A real nginx (HTTP/1.1) storing `PUT /files/NAME` bodies at `dir/www/files/NAME`
/// (WebDAV `dav_methods PUT`, no size limit, bodies buffered in its own temp directory),
/// logging `METHOD STATUS CONTENT_LENGTH` per request. `None` (printed) without nginx.
pub fn nginx_dav() -> Option<Nginx> {
    Nginx::start_with(|dir, port| {
        std::fs::create_dir_all(dir.join("www/files")).expect("nginx www dir");
        let d = dir.display();
        format!(
            r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 64; }}
http {{
    log_format up '$request_method $status $content_length';
    access_log {d}/access.log up;
    client_body_temp_path {d}/body;
    client_max_body_size 0;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location /files/ {{
            root {d}/www;
            dav_methods PUT;
        }}
    }}
}}
"#
        )
    })
}
