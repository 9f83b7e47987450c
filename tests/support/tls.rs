//! A TLS server on `127.0.0.1` with a self-signed certificate that no client trusts.
//!
//! The certificate (`self-signed-cert.pem`, `CN=localhost`, SAN `localhost` and
//! `127.0.0.1`, P-256, valid for 100 years) and its key were generated once with
//!
//! ```text
//! openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 36500 \
//!   -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
//!   -addext "basicConstraints=critical,CA:FALSE" \
//!   -keyout self-signed-key.pem -out self-signed-cert.pem
//! ```
//!
//! `CA:FALSE` makes it a plain leaf, so a client rejects it because it chains to no trusted
//! root, as a real self-signed server certificate is rejected, and not because a CA
//! certificate was used as an end entity. Both files are checked in: a test key, worthless
//! outside these tests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// The self-signed certificate, PEM.
pub const CERT_PEM: &[u8] = include_bytes!("self-signed-cert.pem");
/// Its private key, PEM.
pub const KEY_PEM: &[u8] = include_bytes!("self-signed-key.pem");

/// What the server writes once it has read a request head.
#[derive(Debug, Clone, Copy)]
pub enum Answer {
    /// `200 OK` with no body, then `close_notify`.
    Ok,
    /// These bytes, then the TCP connection closed without a TLS `close_notify` (the
    /// client's TLS layer reports `io::ErrorKind::UnexpectedEof`).
    CutWithoutCloseNotify(&'static [u8]),
}

/// The certificate and key every server here presents.
pub fn cert_and_key() -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
    (
        CertificateDer::from_pem_slice(CERT_PEM).expect("cert pem"),
        PrivateKeyDer::from_pem_slice(KEY_PEM).expect("key pem"),
    )
}

/// A TLS server that answers each request (after a completed handshake) with `200 OK`,
/// or as [`TlsServer::start_with`] is told.
pub struct TlsServer {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    handshakes: Arc<AtomicUsize>,
    requests_seen: Arc<AtomicUsize>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl TlsServer {
    /// Starts the server.
    pub async fn start() -> TlsServer {
        let (cert, key) = cert_and_key();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .expect("server config");
        TlsServer::start_with(config, Answer::Ok).await
    }

    /// Starts a server with `config` that gives each request head `answer`.
    pub async fn start_with(config: rustls::ServerConfig, answer: Answer) -> TlsServer {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let handshakes = Arc::new(AtomicUsize::new(0));
        let requests_seen = Arc::new(AtomicUsize::new(0));
        let (c, h, r) = (
            connections.clone(),
            handshakes.clone(),
            requests_seen.clone(),
        );
        let accept_task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    // A failed accept (e.g. out of file descriptors) must not spin.
                    tokio::task::yield_now().await;
                    continue;
                };
                c.fetch_add(1, Ordering::SeqCst);
                let (acceptor, h, r) = (acceptor.clone(), h.clone(), r.clone());
                conns.spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    h.fetch_add(1, Ordering::SeqCst);
                    let mut head = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&chunk[..n]),
                        }
                    }
                    r.fetch_add(1, Ordering::SeqCst);
                    match answer {
                        Answer::Ok => {
                            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                            let _ = tls.write_all(ok).await;
                            let _ = tls.shutdown().await;
                        }
                        Answer::CutWithoutCloseNotify(bytes) => {
                            let _ = tls.write_all(bytes).await;
                            let _ = tls.flush().await;
                            // Dropped without `shutdown()`: no close_notify, just the TCP FIN.
                            let (tcp, _) = tls.into_inner();
                            drop(tcp);
                        }
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        });
        TlsServer {
            addr,
            connections,
            handshakes,
            requests_seen,
            accept_task,
        }
    }

    /// `https://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://{}{}", self.addr, path)
    }

    /// TCP connections accepted.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// TLS handshakes the server completed.
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }

    /// Requests read after a completed handshake.
    pub fn requests_seen(&self) -> usize {
        self.requests_seen.load(Ordering::SeqCst)
    }
}
