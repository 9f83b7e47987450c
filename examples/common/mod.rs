//! A tiny scripted HTTP/1.1 server on `127.0.0.1`, embedded in the examples so that they
//! run without any outside network. Each example includes it with `mod common;`.
//!
//! The script sees every request (its 0-based index over the server's life, and what was
//! received) and says how to answer: a status with headers and a body, or hanging up
//! after reading the request (the client's request went out and no answer came back).
//! Connections are kept alive, so consecutive requests reuse one connection the way a
//! real server lets them.

#![allow(dead_code)] // each example uses a different part

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// What the server received.
#[derive(Debug, Clone)]
pub struct Received {
    /// `GET`, `POST`, …
    pub method: String,
    /// The request target, e.g. `/orders?id=1`.
    pub path: String,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    /// The `Range` header, if any.
    pub range: Option<String>,
    /// The body's length (read in 8 KiB pieces and dropped, never kept).
    pub body_len: usize,
}

/// How the server answers one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A response, then the connection stays open for the next request.
    Respond {
        /// The status code.
        status: u16,
        /// Extra headers.
        headers: Vec<(&'static str, String)>,
        /// The body.
        body: String,
    },
    /// Close the connection having read the request, without a byte of answer.
    HangUp,
    /// Take this long (a slow handler), then reply.
    After(Duration, Box<Reply>),
    /// A download from byte `from` on (`200` from 0, else `206` with its `Content-Range`),
    /// with `Accept-Ranges: bytes` and a strong ETag, whose connection is closed after
    /// `cut_after` bytes of body when set.
    Download {
        /// The whole file.
        file: Arc<Vec<u8>>,
        /// Where this answer starts.
        from: usize,
        /// Close the connection after this many bytes of this answer.
        cut_after: Option<usize>,
    },
}

impl Reply {
    /// `200 OK` with a body.
    pub fn ok(body: &str) -> Reply {
        Reply::Respond {
            status: 200,
            headers: Vec::new(),
            body: body.to_owned(),
        }
    }

    /// An empty answer with this status.
    pub fn status(status: u16) -> Reply {
        Reply::Respond {
            status,
            headers: Vec::new(),
            body: String::new(),
        }
    }

    /// Adds a header to a response.
    pub fn header(mut self, name: &'static str, value: &str) -> Reply {
        if let Reply::Respond { headers, .. } = &mut self {
            headers.push((name, value.to_owned()));
        }
        self
    }
}

type Script = dyn Fn(usize, &Received) -> Reply + Send + Sync;

/// The server; it stops (and closes every connection) when dropped.
pub struct FlakyServer {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FlakyServer {
    fn drop(&mut self) {
        // The accept task owns the connection tasks (a JoinSet), so they end with it.
        self.task.abort();
    }
}

impl FlakyServer {
    /// Starts a server on a free port of `127.0.0.1`.
    pub async fn start<F>(script: F) -> io::Result<FlakyServer>
    where
        F: Fn(usize, &Received) -> Reply + Send + Sync + 'static,
    {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(AtomicUsize::new(0));
        let script: Arc<Script> = Arc::new(script);
        let counter = requests.clone();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                connections.spawn(serve(stream, counter.clone(), script.clone()));
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(FlakyServer {
            addr,
            requests,
            task,
        })
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Requests received so far (fully read, answered or not).
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// A loopback URL nobody listens on: connecting is refused. (A port just released is not
/// handed out again at once.)
pub fn refused_url(path: &str) -> io::Result<String> {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let addr = listener.local_addr()?;
    drop(listener);
    Ok(format!("http://{addr}{path}"))
}

async fn serve(mut stream: TcpStream, counter: Arc<AtomicUsize>, script: Arc<Script>) {
    let mut buf = Vec::with_capacity(4096);
    while let Ok(Some(received)) = read_request(&mut stream, &mut buf).await {
        let index = counter.fetch_add(1, Ordering::SeqCst);
        let mut reply = script(index, &received);
        while let Reply::After(delay, then) = reply {
            tokio::time::sleep(delay).await;
            reply = *then;
        }
        match reply {
            Reply::After(..) => unreachable!("waited out above"),
            Reply::HangUp => return,
            Reply::Download {
                file,
                from,
                cut_after,
            } => {
                if !download(&mut stream, &file, from, cut_after).await {
                    return;
                }
            }
            Reply::Respond {
                status,
                headers,
                body,
            } => {
                let reason = http::StatusCode::from_u16(status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("Status");
                let mut out = format!("HTTP/1.1 {status} {reason}\r\n");
                for (name, value) in headers {
                    out.push_str(&format!("{name}: {value}\r\n"));
                }
                out.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
                if stream.write_all(out.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Writes a [`Reply::Download`]; whether the connection lives on.
async fn download(stream: &mut TcpStream, file: &[u8], from: usize, cut: Option<usize>) -> bool {
    let len = file.len();
    let from = from.min(len);
    let mut head = if from == 0 {
        "HTTP/1.1 200 OK\r\n".to_owned()
    } else {
        format!(
            "HTTP/1.1 206 Partial Content\r\ncontent-range: bytes {from}-{}/{len}\r\n",
            len - 1
        )
    };
    head.push_str("accept-ranges: bytes\r\netag: \"tour-v1\"\r\n");
    head.push_str(&format!("content-length: {}\r\n\r\n", len - from));
    let end = cut.map_or(len, |n| (from + n).min(len));
    let whole = end == len;
    stream.write_all(head.as_bytes()).await.is_ok()
        && stream.write_all(&file[from..end]).await.is_ok()
        && whole
}

/// Reads one request (head and `Content-Length` body); `None` at a clean end of stream.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<Option<Received>> {
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if buf.len() > 64 * 1024 {
            return Err(io::Error::other("request head too large"));
        }
        if read_more(stream, buf).await? == 0 {
            return Ok(None);
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    buf.drain(..head_end);
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let method = first.next().unwrap_or("").to_owned();
    let path = first.next().unwrap_or("").to_owned();
    let mut content_length = 0usize;
    let mut authorization = None;
    let mut range = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            content_length = value
                .parse()
                .map_err(|_| io::Error::other("bad content-length"))?;
        } else if name.eq_ignore_ascii_case("authorization") {
            authorization = Some(value.to_owned());
        } else if name.eq_ignore_ascii_case("range") {
            range = Some(value.to_owned());
        }
    }
    // Read past and dropped as it comes: an upload is not held whole.
    let mut left = content_length;
    loop {
        let here = left.min(buf.len());
        buf.drain(..here);
        left -= here;
        if left == 0 {
            break;
        }
        if read_more(stream, buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(Some(Received {
        method,
        path,
        authorization,
        range,
        body_len: content_length,
    }))
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    let mut chunk = [0u8; 8192];
    let n = stream.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}
