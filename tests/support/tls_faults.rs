//! TLS servers on `127.0.0.1` (the certificate of [`super::tls`]) that fail in the ways a
//! client's TLS layer reports as an alert or as an early end of the stream.
//!
//! A client reaches them with `danger_accept_invalid_certs(true)` (the certificate is
//! self-signed), so the fault is the server's, not the client's verification.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};

use super::tls::{Answer, CERT_PEM, KEY_PEM, TlsServer, cert_and_key};

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
    let (cert, key) = cert_and_key();
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

/// Starts a server that fails with `fault`.
pub async fn start(fault: TlsFault) -> TlsServer {
    let answer = match fault {
        TlsFault::HalfHeadWithoutCloseNotify => {
            Answer::CutWithoutCloseNotify(b"HTTP/1.1 200 OK\r\nContent-Le")
        }
        // The handshake fails: no request head is ever read.
        TlsFault::RejectClientCertificate { .. } => Answer::Ok,
    };
    TlsServer::start_with(server_config(&fault), answer).await
}
