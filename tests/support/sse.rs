//! A scripted server-sent events origin on `127.0.0.1`: each connection's request is
//! recorded (method, `Last-Event-ID`, `Idempotency-Key`, tokio's instant), then answered
//! with the [`Step`]s the script returns for it. A `200` is sent chunked, one chunk per
//! [`Step::Send`]; any other status with an empty body. Every connection is closed after
//! its answer. Its tasks end when the server is dropped.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// One request the server read.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub last_event_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub authorization: Option<String>,
    pub at: Instant,
}

/// What the server does on a connection, in order.
#[derive(Debug, Clone)]
pub enum Step {
    /// The response head: status and extra headers.
    Head(u16, Vec<(&'static str, String)>),
    /// One chunk of the body.
    Send(Vec<u8>),
    /// A pause on tokio's clock.
    Wait(Duration),
    /// A pause until an instant of tokio's clock.
    Until(Instant),
    /// The body's clean end (the last chunk), then the connection closed.
    End,
    /// The connection closed with no last chunk: the body is cut.
    Cut,
    /// Nothing more, connection held open until the server is dropped.
    Hang,
    /// Reads until the client closes the connection, then counts it ([`SseServer::closed`]).
    AwaitClose,
}

impl Step {
    /// `200` with `text/event-stream`.
    pub fn ok() -> Step {
        Step::Head(200, vec![("content-type", "text/event-stream".to_owned())])
    }

    pub fn send(text: &str) -> Step {
        Step::Send(text.as_bytes().to_vec())
    }
}

type Script = dyn Fn(usize, &Seen) -> Vec<Step> + Send + Sync;

/// The server; dropping it ends every connection.
pub struct SseServer {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    closed: Arc<AtomicUsize>,
    _tasks: Arc<Mutex<JoinSet<()>>>,
}

impl SseServer {
    /// Serves each connection `i` (0-based) with `script(i, request)`.
    pub async fn start(script: impl Fn(usize, &Seen) -> Vec<Step> + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tasks = Arc::new(Mutex::new(JoinSet::new()));
        let script: Arc<Script> = Arc::new(script);
        let closed = Arc::new(AtomicUsize::new(0));
        let (s, t, c) = (seen.clone(), tasks.clone(), closed.clone());
        tasks.lock().unwrap().spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let (seen, script, closed) = (s.clone(), script.clone(), c.clone());
                t.lock().unwrap().spawn(serve(conn, seen, script, closed));
            }
        });
        SseServer {
            addr,
            seen,
            closed,
            _tasks: tasks,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The requests read so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Connections the client closed while the server waited on them ([`Step::AwaitClose`]).
    pub fn closed(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }

    /// The `Last-Event-ID` of each request so far (`None`: not sent).
    pub fn last_event_ids(&self) -> Vec<Option<String>> {
        self.seen().into_iter().map(|s| s.last_event_id).collect()
    }
}

impl Drop for SseServer {
    fn drop(&mut self) {
        if let Ok(mut tasks) = self._tasks.lock() {
            tasks.abort_all();
        }
    }
}

async fn read_head(conn: &mut TcpStream) -> Option<Seen> {
    let mut buf = Vec::new();
    let mut piece = [0u8; 4096];
    loop {
        let n = conn.read(&mut piece).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&piece[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        if let Ok(httparse::Status::Complete(_)) = req.parse(&buf) {
            let header = |name: &str| {
                req.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .map(|h| String::from_utf8_lossy(h.value).into_owned())
            };
            return Some(Seen {
                method: req.method?.to_owned(),
                path: req.path?.to_owned(),
                last_event_id: header("last-event-id"),
                idempotency_key: header("idempotency-key"),
                authorization: header("authorization"),
                at: Instant::now(),
            });
        }
    }
}

async fn serve(
    mut conn: TcpStream,
    seen: Arc<Mutex<Vec<Seen>>>,
    script: Arc<Script>,
    closed: Arc<AtomicUsize>,
) {
    let Some(request) = read_head(&mut conn).await else {
        return;
    };
    let steps = {
        let mut all = seen.lock().unwrap();
        all.push(request.clone());
        script(all.len() - 1, &request)
    };
    let mut chunked = false;
    for step in steps {
        let written = match step {
            Step::Head(status, headers) => {
                chunked = status == 200;
                let mut head = format!("HTTP/1.1 {status} X\r\nconnection: close\r\n");
                for (name, value) in headers {
                    head.push_str(&format!("{name}: {value}\r\n"));
                }
                head.push_str(match chunked {
                    true => "transfer-encoding: chunked\r\n\r\n",
                    false => "content-length: 0\r\n\r\n",
                });
                conn.write_all(head.as_bytes()).await
            }
            Step::Send(bytes) if chunked => {
                let mut chunk = format!("{:x}\r\n", bytes.len()).into_bytes();
                chunk.extend_from_slice(&bytes);
                chunk.extend_from_slice(b"\r\n");
                conn.write_all(&chunk).await
            }
            Step::Send(bytes) => conn.write_all(&bytes).await,
            Step::Wait(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            Step::Until(at) => {
                tokio::time::sleep_until(at).await;
                Ok(())
            }
            Step::End => {
                if chunked {
                    let _ = conn.write_all(b"0\r\n\r\n").await;
                }
                return;
            }
            Step::Cut => return,
            Step::Hang => return std::future::pending().await,
            Step::AwaitClose => {
                let mut sink = [0u8; 1024];
                while conn.read(&mut sink).await.is_ok_and(|n| n > 0) {}
                closed.fetch_add(1, Ordering::SeqCst);
                return;
            }
        };
        if written.is_err() {
            return;
        }
    }
}
