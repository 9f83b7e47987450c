//! A loopback HTTP/1.1 server that holds every answer until the test opens its gate: the
//! test decides when the request in flight lands, so callers that join it can be lined
//! up first. [`GatedServer::start_with`] answers each request from what it carried.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct GatedServer {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    closed_by_client: Arc<AtomicUsize>,
    gate: watch::Sender<bool>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Drop for GatedServer {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl GatedServer {
    /// Answers every request `200` with `body` (and `Content-Length`), once the gate is
    /// open.
    pub async fn start(body: &'static [u8]) -> GatedServer {
        GatedServer::start_with(move |_| Answer::ok(body)).await
    }

    /// Answers each request with `answer(request)`, once the gate is open.
    pub async fn start_with(
        answer: impl Fn(&GatedRequest) -> Answer + Send + Sync + 'static,
    ) -> GatedServer {
        let answer: Arc<AnswerFn> = Arc::new(answer);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let closed_by_client = Arc::new(AtomicUsize::new(0));
        let (gate, open) = watch::channel(false);
        let (r, c) = (requests.clone(), closed_by_client.clone());
        let accept_task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let answer = answer.clone();
                connections.spawn(serve(stream, answer, r.clone(), c.clone(), open.clone()));
            }
        });
        GatedServer {
            addr,
            requests,
            closed_by_client,
            gate,
            accept_task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Requests whose head was read.
    pub fn requests_seen(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Requests whose client closed the connection while the gate held the answer.
    pub fn closed_by_client(&self) -> usize {
        self.closed_by_client.load(Ordering::SeqCst)
    }

    /// Lets every held and later answer go.
    pub fn open(&self) {
        self.gate.send_replace(true);
    }
}

/// A request as the gated server read it.
pub struct GatedRequest {
    /// The 0-based index of the request over all connections.
    pub index: usize,
    /// The header lines, names lower-cased, in order received.
    pub headers: Vec<(String, String)>,
}

impl GatedRequest {
    /// The first value of a header (name lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the gated server answers.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// `false`: no `Content-Length`; the body goes as one chunk and the stream then stays
    /// open (an event stream) until the server is dropped.
    pub length_known: bool,
    /// `Some(n)`: only the first `n` bytes of the body are sent (its whole length
    /// announced), then the connection is closed: a body that breaks.
    pub cut_after: Option<usize>,
}

impl Answer {
    /// `200` with `body` and its `Content-Length`.
    pub fn ok(body: impl Into<Vec<u8>>) -> Answer {
        Answer {
            status: 200,
            headers: Vec::new(),
            body: body.into(),
            length_known: true,
            cut_after: None,
        }
    }

    pub fn status(mut self, status: u16) -> Answer {
        self.status = status;
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Answer {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The body announced whole, cut after `n` bytes.
    pub fn cut_after(mut self, n: usize) -> Answer {
        self.cut_after = Some(n);
        self
    }

    /// Chunked, held open after the body.
    pub fn streamed(mut self) -> Answer {
        self.length_known = false;
        self
    }

    /// The bytes on the wire; `head_only` for a `HEAD`. `304` and `204` carry no body.
    fn wire(&self, head_only: bool) -> Vec<u8> {
        let mut head = format!("HTTP/1.1 {} X\r\n", self.status);
        for (n, v) in &self.headers {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        let no_body = matches!(self.status, 204 | 304);
        if self.length_known && !no_body {
            head.push_str(&format!("content-length: {}\r\n", self.body.len()));
        } else if !no_body {
            head.push_str("transfer-encoding: chunked\r\n");
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        if head_only || no_body {
            return out;
        }
        if self.length_known {
            let sent = self
                .cut_after
                .unwrap_or(self.body.len())
                .min(self.body.len());
            out.extend_from_slice(&self.body[..sent]);
        } else {
            out.extend_from_slice(format!("{:x}\r\n", self.body.len()).as_bytes());
            out.extend_from_slice(&self.body);
            out.extend_from_slice(b"\r\n");
        }
        out
    }
}

type AnswerFn = dyn Fn(&GatedRequest) -> Answer + Send + Sync;

/// The header lines of a request head.
fn header_lines(head: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(head)
        .split("\r\n")
        .skip(1)
        .filter_map(|line| {
            let (n, v) = line.split_once(':')?;
            Some((n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        })
        .collect()
}

async fn serve(
    mut stream: TcpStream,
    answer: Arc<AnswerFn>,
    requests: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
    mut open: watch::Receiver<bool>,
) {
    let mut buf = Vec::new();
    loop {
        // One request head (the requests here have no body).
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head_only = buf.starts_with(b"HEAD ");
        let request = GatedRequest {
            index: 0,
            headers: header_lines(&buf[..end]),
        };
        buf.drain(..end);
        let request = GatedRequest {
            index: requests.fetch_add(1, Ordering::SeqCst),
            ..request
        };
        let mut probe = [0u8; 1];
        tokio::select! {
            _ = open.wait_for(|o| *o) => {}
            read = stream.read(&mut probe) => {
                if matches!(read, Ok(0) | Err(_)) {
                    closed.fetch_add(1, Ordering::SeqCst);
                }
                return;
            }
        }
        let answer = answer(&request);
        if stream.write_all(&answer.wire(head_only)).await.is_err() {
            return;
        }
        if answer.cut_after.is_some() {
            return;
        }
        if !answer.length_known && !head_only {
            // Held open, as an event stream between events, until the server is dropped.
            std::future::pending::<()>().await;
        }
    }
}
