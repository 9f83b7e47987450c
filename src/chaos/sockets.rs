//! The chaos layer's own loopback sockets, each misbehaving one way, so that reqwest
//! meets the real fault and reports its real error.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;

use super::plan::Fault;

/// The sockets, bound on 127.0.0.1 when the layer first injects a fault.
pub(crate) struct Sockets {
    /// Bound and never listening: a connect to it is refused (RST), and the port stays
    /// ours, so no other program can take it meanwhile.
    refused: (TcpSocket, SocketAddr),
    reset: SocketAddr,
    stall: SocketAddr,
    unavailable: SocketAddr,
    too_many: SocketAddr,
    refused_stream: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
    /// Speaks HTTP/2 with prior knowledge to the `REFUSED_STREAM` socket (the user's
    /// client may speak only HTTP/1); made with the sockets, on their runtime.
    pub(crate) h2: reqwest::Client,
}

impl Drop for Sockets {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// How an HTTP/1 chaos socket answers a request it has read.
#[derive(Clone, Copy)]
enum Answer {
    Reset,
    Stall,
    Status(u16, Option<Duration>),
}

impl Sockets {
    pub(crate) async fn bind(retry_after: Duration) -> io::Result<Sockets> {
        let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let refused = TcpSocket::new_v4()?;
        refused.bind(loopback)?;
        let refused_addr = refused.local_addr()?;
        let mut tasks = Vec::new();
        let mut http1 = Vec::new();
        for answer in [
            Answer::Reset,
            Answer::Stall,
            Answer::Status(503, Some(retry_after)),
            Answer::Status(429, None),
        ] {
            let listener = TcpListener::bind(loopback).await?;
            http1.push(listener.local_addr()?);
            tasks.push(tokio::spawn(accept(listener, answer)));
        }
        let [reset, stall, unavailable, too_many] = http1[..] else {
            unreachable!("four listeners were bound")
        };
        let h2 = TcpListener::bind(loopback).await?;
        let refused_stream = h2.local_addr()?;
        tasks.push(tokio::spawn(accept_h2(h2)));
        let h2 = reqwest::Client::builder()
            .http2_prior_knowledge()
            .no_proxy()
            .build()
            .map_err(io::Error::other)?;
        Ok(Sockets {
            refused: (refused, refused_addr),
            reset,
            stall,
            unavailable,
            too_many,
            refused_stream,
            tasks,
            h2,
        })
    }

    /// Whether the sockets still serve: their tasks end with the runtime they were bound
    /// on (a test's runtime), and a layer used on a later one binds them again.
    pub(crate) fn serving(&self) -> bool {
        !self.tasks.iter().any(JoinHandle::is_finished)
    }

    /// Where a request meets `fault`.
    pub(crate) fn addr(&self, fault: Fault) -> SocketAddr {
        match fault {
            Fault::RefusedConnect => self.refused.1,
            Fault::ResetAfterSend => self.reset,
            Fault::Timeout => self.stall,
            Fault::Unavailable => self.unavailable,
            Fault::TooManyRequests => self.too_many,
            Fault::RefusedStream => self.refused_stream,
        }
    }
}

async fn accept(listener: TcpListener, answer: Answer) {
    let mut connections = tokio::task::JoinSet::new();
    while let Ok((stream, _)) = listener.accept().await {
        connections.spawn(answer_http1(stream, answer));
        // Reap the finished ones so the set does not grow with every fault.
        while connections.try_join_next().is_some() {}
    }
}

async fn answer_http1(mut stream: TcpStream, answer: Answer) {
    if read_request(&mut stream).await.is_err() {
        return;
    }
    match answer {
        Answer::Reset => {
            // Zero linger turns the close into an RST; with zero it does not block on
            // drop (the reason tokio deprecates `set_linger`).
            #[allow(deprecated)]
            let _ = stream.set_linger(Some(Duration::ZERO));
        }
        Answer::Stall => {
            // Hold the request unanswered until the client gives up and closes.
            let mut rest = [0u8; 1024];
            while matches!(stream.read(&mut rest).await, Ok(n) if n > 0) {}
        }
        Answer::Status(status, retry_after) => {
            let reason = if status == 503 {
                "Service Unavailable"
            } else {
                "Too Many Requests"
            };
            let retry_after = retry_after
                .map(|d| format!("retry-after: {}\r\n", d.as_secs()))
                .unwrap_or_default();
            let head = format!(
                "HTTP/1.1 {status} {reason}\r\n{retry_after}content-length: 0\r\nconnection: close\r\n\r\n"
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
    }
}

/// Reads one request: its head, then a body of `Content-Length` bytes or chunked up to
/// its last chunk (so the client has sent all of it before the socket misbehaves).
async fn read_request(stream: &mut TcpStream) -> io::Result<()> {
    const MAX_HEAD: usize = 64 * 1024;
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD || read_more(stream, &mut buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let field = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
    };
    if field("transfer-encoding:").is_some_and(|v| v.contains("chunked")) {
        while !buf[head_end..].windows(5).any(|w| w == b"0\r\n\r\n") {
            if read_more(stream, &mut buf).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    } else if let Some(len) = field("content-length:").and_then(|v| v.parse::<usize>().ok()) {
        while buf.len() < head_end.saturating_add(len) {
            if read_more(stream, &mut buf).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
    Ok(())
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    let mut chunk = [0u8; 8192];
    let n = stream.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

/// An HTTP/2 server (prior knowledge) that resets every stream with `REFUSED_STREAM`
/// once its request has arrived: the server's word that it did not process it.
async fn accept_h2(listener: TcpListener) {
    let mut connections = tokio::task::JoinSet::new();
    while let Ok((stream, _)) = listener.accept().await {
        connections.spawn(async move {
            let Ok(mut connection) = h2::server::handshake(stream).await else {
                return;
            };
            while let Some(Ok((_, mut respond))) = connection.accept().await {
                respond.send_reset(h2::Reason::REFUSED_STREAM);
            }
        });
        while connections.try_join_next().is_some() {}
    }
}
