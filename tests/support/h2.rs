//! An HTTP/2 fault server (h2c, prior knowledge) written at the frame level.
//!
//! A hand-written frame loop rather than the `h2` server: the faults these tests need
//! (a `GOAWAY` whose last-stream-id is *below* a stream the server already received) are
//! exactly what a correct server library refuses to produce.
//!
//! The client must use `reqwest::ClientBuilder::http2_prior_knowledge()` against
//! [`H2Server::url`]. A request is counted in [`H2Server::requests_seen`] once its HEADERS
//! (and DATA, if any) up to END_STREAM were received, before the script's action is applied.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// What the server does with one HTTP/2 request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum H2Action {
    /// Answer with this status and an empty body.
    Respond(u16),
    /// `RST_STREAM` with `REFUSED_STREAM` (0x7) on the request's stream (RFC 9113 §8.7).
    RefuseStream,
    /// `RST_STREAM` with this error code on the request's stream, after the request was
    /// received (e.g. `INTERNAL_ERROR`, 0x2: no proof the request was not processed).
    ResetStream(u32),
    /// `GOAWAY(NO_ERROR)` whose last-stream-id is below the request's stream (stream − 2,
    /// i.e. 0 for the first request), then close the connection once the client does.
    GoAwayBelow,
    /// `GOAWAY(NO_ERROR)` whose last-stream-id *is* the request's stream (so the server
    /// admits it may have processed it), then close the connection without answering.
    GoAwayIncludingThenClose,
    /// Nothing more on this connection, in either direction, the socket left open: a
    /// path that died under an HTTP/2 connection (its PINGs go unanswered too).
    Silence,
}

const FRAME_DATA: u8 = 0x0;
const FRAME_HEADERS: u8 = 0x1;
const FRAME_RST_STREAM: u8 = 0x3;
const FRAME_SETTINGS: u8 = 0x4;
const FRAME_PING: u8 = 0x6;
const FRAME_GOAWAY: u8 = 0x7;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_ACK: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A scripted HTTP/2 server on `127.0.0.1`.
pub struct H2Server {
    addr: SocketAddr,
    requests_seen: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Drop for H2Server {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

type H2Script = dyn Fn(usize) -> H2Action + Send + Sync;

impl H2Server {
    /// Starts a server that answers request `i` (0-based, over all connections) with
    /// `script(i)`.
    pub async fn start<F>(script: F) -> H2Server
    where
        F: Fn(usize) -> H2Action + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let requests_seen = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let script: Arc<H2Script> = Arc::new(script);
        let (seen, conns_count) = (requests_seen.clone(), connections.clone());
        let accept_task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    // A failed accept (e.g. out of file descriptors) must not spin.
                    tokio::task::yield_now().await;
                    continue;
                };
                conns_count.fetch_add(1, Ordering::SeqCst);
                let (seen, script) = (seen.clone(), script.clone());
                conns.spawn(async move {
                    let _ = serve(stream, &seen, &*script).await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        H2Server {
            addr,
            requests_seen,
            connections,
            accept_task,
        }
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// How many requests were fully received.
    pub fn requests_seen(&self) -> usize {
        self.requests_seen.load(Ordering::SeqCst)
    }

    /// How many connections were accepted.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

async fn read_frame(s: &mut TcpStream) -> std::io::Result<Frame> {
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await?;
    Ok(Frame {
        kind: head[3],
        flags: head[4],
        stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
        payload,
    })
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A HEADERS block for `:status` only: HPACK "literal without indexing, indexed name"
/// (RFC 7541 §6.2.2) with the static table's `:status` (index 8), no Huffman coding.
fn status_block(status: u16) -> Vec<u8> {
    let digits = status.to_string();
    let mut block = vec![0x08, digits.len() as u8];
    block.extend_from_slice(digits.as_bytes());
    block
}

async fn serve(mut s: TcpStream, seen: &AtomicUsize, script: &H2Script) -> std::io::Result<()> {
    let mut preface = [0u8; 24];
    s.read_exact(&mut preface).await?;
    if preface != PREFACE {
        return Ok(());
    }
    s.write_all(&frame(FRAME_SETTINGS, 0, 0, &[])).await?;
    // Streams whose HEADERS arrived but not END_STREAM yet.
    let mut open: Vec<u32> = Vec::new();
    let mut closing = false;
    loop {
        let f = match read_frame(&mut s).await {
            Ok(f) => f,
            // The client closed: after a GOAWAY that is the expected end.
            Err(_) => return Ok(()),
        };
        let complete = match f.kind {
            FRAME_SETTINGS if f.flags & FLAG_ACK == 0 => {
                s.write_all(&frame(FRAME_SETTINGS, FLAG_ACK, 0, &[]))
                    .await?;
                None
            }
            FRAME_PING if f.flags & FLAG_ACK == 0 => {
                s.write_all(&frame(FRAME_PING, FLAG_ACK, 0, &f.payload))
                    .await?;
                None
            }
            // The tests' requests fit one HEADERS frame; CONTINUATION is accepted and ignored.
            FRAME_HEADERS | FRAME_CONTINUATION | FRAME_DATA => {
                if f.kind == FRAME_HEADERS && !open.contains(&f.stream) {
                    open.push(f.stream);
                }
                (f.flags & FLAG_END_STREAM != 0).then_some(f.stream)
            }
            _ => None,
        };
        let Some(stream) = complete else { continue };
        open.retain(|&id| id != stream);
        if closing {
            continue;
        }
        let index = seen.fetch_add(1, Ordering::SeqCst);
        match script(index) {
            H2Action::Respond(status) => {
                let block = status_block(status);
                s.write_all(&frame(
                    FRAME_HEADERS,
                    FLAG_END_HEADERS | FLAG_END_STREAM,
                    stream,
                    &block,
                ))
                .await?;
            }
            H2Action::RefuseStream => {
                s.write_all(&frame(FRAME_RST_STREAM, 0, stream, &7u32.to_be_bytes()))
                    .await?;
            }
            H2Action::ResetStream(code) => {
                s.write_all(&frame(FRAME_RST_STREAM, 0, stream, &code.to_be_bytes()))
                    .await?;
            }
            H2Action::GoAwayBelow => {
                let mut payload = stream.saturating_sub(2).to_be_bytes().to_vec();
                payload.extend_from_slice(&0u32.to_be_bytes()); // NO_ERROR
                s.write_all(&frame(FRAME_GOAWAY, 0, 0, &payload)).await?;
                // Keep reading until the client closes, so the GOAWAY is not lost to an
                // RST caused by unread data.
                closing = true;
            }
            H2Action::Silence => {
                // Held open, never read again: the client's frames are lost as on a dead
                // path. Ends with the server (the connection task is aborted).
                std::future::pending::<()>().await;
            }
            H2Action::GoAwayIncludingThenClose => {
                let mut payload = stream.to_be_bytes().to_vec();
                payload.extend_from_slice(&0u32.to_be_bytes());
                s.write_all(&frame(FRAME_GOAWAY, 0, 0, &payload)).await?;
                s.flush().await?;
                // Give the client the GOAWAY before the FIN; both are in order on the wire.
                return Ok(());
            }
        }
    }
}
