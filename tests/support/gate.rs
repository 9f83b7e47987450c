//! A loopback HTTP/1.1 server that holds every answer until the test opens its gate: the
//! test decides when the request in flight lands, so callers that join it can be lined
//! up first.

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
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let closed_by_client = Arc::new(AtomicUsize::new(0));
        let (gate, open) = watch::channel(false);
        let (r, c) = (requests.clone(), closed_by_client.clone());
        let accept_task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                connections.spawn(serve(stream, body, r.clone(), c.clone(), open.clone()));
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

async fn serve(
    mut stream: TcpStream,
    body: &'static [u8],
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
        buf.drain(..end);
        requests.fetch_add(1, Ordering::SeqCst);
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
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
        let mut out = head.into_bytes();
        if !head_only {
            out.extend_from_slice(body);
        }
        if stream.write_all(&out).await.is_err() {
            return;
        }
    }
}
