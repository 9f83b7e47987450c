//! A real nginx serving one static file over HTTP/1.1 (`Accept-Ranges: bytes`, a strong
//! ETag, `Last-Modified`, `Content-Length`, ranges answered `206` by nginx itself), and
//! [`CuttingProxy`]: a loopback TCP proxy in front of it that closes the first connections
//! after so many bytes of the answer, for the resume tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::nginx::Nginx;

/// nginx serving `/file.bin` with `bytes`; `None` (printed) without nginx, as [`Nginx::start`].
pub fn serve_file(bytes: &[u8]) -> Option<Nginx> {
    let bytes = bytes.to_vec();
    Nginx::start_with(move |dir, port| {
        let www = dir.join("www");
        std::fs::create_dir_all(&www).expect("nginx www dir");
        std::fs::write(www.join("file.bin"), &bytes).expect("write the served file");
        let d = dir.display();
        format!(
            r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 64; }}
http {{
    log_format ranges '$request_method $status "$http_range" "$http_if_range" $body_bytes_sent';
    access_log {d}/access.log ranges;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location / {{ root {d}/www; }}
    }}
}}
"#
        )
    })
}

/// A loopback proxy to `upstream` whose first `cuts.len()` connections are closed after
/// `cuts[i]` bytes of the upstream's answer (head included).
pub struct CuttingProxy {
    addr: std::net::SocketAddr,
    forwarded: Arc<Mutex<Vec<usize>>>,
    _tasks: JoinSet<()>,
}

impl CuttingProxy {
    pub async fn start(upstream: std::net::SocketAddr, cuts: Vec<usize>) -> CuttingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let forwarded = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = JoinSet::new();
        let seen = forwarded.clone();
        let index = Arc::new(AtomicUsize::new(0));
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let i = index.fetch_add(1, Ordering::SeqCst);
                let limit = cuts.get(i).copied().unwrap_or(usize::MAX);
                conns.spawn(relay(client, upstream, limit, seen.clone()));
            }
        });
        CuttingProxy {
            addr,
            forwarded,
            _tasks: tasks,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Answer bytes forwarded on each finished connection, in the order they ended.
    pub fn forwarded(&self) -> Vec<usize> {
        self.forwarded.lock().unwrap().clone()
    }
}

async fn relay(
    mut client: TcpStream,
    upstream: std::net::SocketAddr,
    limit: usize,
    seen: Arc<Mutex<Vec<usize>>>,
) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let up = tokio::io::copy(&mut client_read, &mut server_write);
    let mut sent = 0;
    {
        let down = async {
            let mut buf = vec![0u8; 16 * 1024];
            while sent < limit {
                let n = match server_read.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n.min(limit - sent),
                };
                if client_write.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                sent += n;
            }
        };
        // The answer's end (or its cut), or the client's close, ends the connection.
        tokio::select! {
            _ = down => {}
            _ = up => {}
        }
    }
    seen.lock().unwrap().push(sent);
}
