//! TLS servers on `127.0.0.1` (the certificate of [`super::tls`]) that fail in the ways a
//! client's TLS layer reports as an alert or as an early end of the stream.
//!
//! A client reaches them with `danger_accept_invalid_certs(true)` (the certificate is
//! self-signed), so the fault is the server's, not the client's verification.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::tls::CERT_PEM;

const KEY_PEM: &[u8] = include_bytes!("self-signed-key.pem");

/// How the server fails.
#[derive(Debug, Clone, PartialEq)]
pub enum TlsFault {
    /// Completes the handshake, reads the request head, writes half a response head and
    /// closes the TCP connection without a TLS `close_notify`: the client's TLS layer
    /// reports `io::ErrorKind::UnexpectedEof`.
    HalfHeadWithoutCloseNotify,
    /// Requires a client certificate and rejects the handshake with the alert rustls sends
    /// for `error` (`Expired` → `certificate_expired`, `UnknownIssuer` → `unknown_ca`, …),
    /// or with `certificate_required` when the client sends none. With `tls12`, only TLS 1.2
    /// is offered, so the alert ends the client's handshake; under TLS 1.3 the client's
    /// side of the handshake is over before the server judges its certificate, and the
    /// alert comes after the request was written.
    RejectClientCertificate {
        /// Why the presented certificate is rejected.
        error: CertificateError,
        /// TLS 1.2 only.
        tls12: bool,
    },
}

/// A faulty TLS server; see [`TlsFault`].
pub struct TlsFaultServer {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    handshakes: Arc<AtomicUsize>,
    requests_seen: Arc<AtomicUsize>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsFaultServer {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

/// Rejects every client certificate with one error; requires one.
#[derive(Debug)]
struct RejectEvery(CertificateError);

impl ClientCertVerifier for RejectEvery {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Err(rustls::Error::InvalidCertificate(self.0.clone()))
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        rustls::crypto::aws_lc_rs::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn server_config(fault: &TlsFault) -> rustls::ServerConfig {
    let cert = CertificateDer::from_pem_slice(CERT_PEM).expect("cert pem");
    let key = PrivateKeyDer::from_pem_slice(KEY_PEM).expect("key pem");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider);
    let builder = match fault {
        TlsFault::RejectClientCertificate { tls12: true, .. } => builder
            .with_protocol_versions(&[&rustls::version::TLS12])
            .expect("TLS 1.2"),
        _ => builder
            .with_safe_default_protocol_versions()
            .expect("protocol versions"),
    };
    let builder = match fault {
        TlsFault::RejectClientCertificate { error, .. } => {
            builder.with_client_cert_verifier(Arc::new(RejectEvery(error.clone())))
        }
        TlsFault::HalfHeadWithoutCloseNotify => builder.with_no_client_auth(),
    };
    builder
        .with_single_cert(vec![cert], key)
        .expect("server config")
}

/// The client identity (the test certificate and its key) for a server that asks for one.
pub fn client_identity() -> reqwest::Identity {
    let mut pem = CERT_PEM.to_vec();
    pem.extend_from_slice(KEY_PEM);
    reqwest::Identity::from_pem(&pem).expect("identity")
}

impl TlsFaultServer {
    /// Starts the server.
    pub async fn start(fault: TlsFault) -> TlsFaultServer {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(&fault)));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let counters = [
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        ];
        let [connections, handshakes, requests_seen] = counters.clone();
        let accept_task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    // A failed accept (e.g. out of file descriptors) must not spin.
                    tokio::task::yield_now().await;
                    continue;
                };
                counters[0].fetch_add(1, Ordering::SeqCst);
                let (acceptor, h, r) = (acceptor.clone(), counters[1].clone(), counters[2].clone());
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
                    let _ = tls.write_all(b"HTTP/1.1 200 OK\r\nContent-Le").await;
                    let _ = tls.flush().await;
                    // Dropped without `shutdown()`: no close_notify, just the TCP FIN.
                    let (tcp, _) = tls.into_inner();
                    drop(tcp);
                });
                while conns.try_join_next().is_some() {}
            }
        });
        TlsFaultServer {
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

    /// Request heads read after a completed handshake.
    pub fn requests_seen(&self) -> usize {
        self.requests_seen.load(Ordering::SeqCst)
    }
}
