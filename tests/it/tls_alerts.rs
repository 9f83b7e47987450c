//! TLS alerts about certificates, sent by a real rustls server on loopback: the evidence
//! calls them `Certificate` and nothing retries them; other handshake failures keep the
//! handshake rule.

use crate::support;

use reqwest_resilience::redirect::{self, ClientRedirects};

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::retry::strategies::UvTransient;
use reqwest_resilience::retry::{RetryReason, StopReason};
use reqwest_resilience::{
    AttemptDecision, FailureKind, RetryMiddleware, SendWithHistory, Transmission, TransportEvidence,
};
use rustls::CertificateError;
use support::exact_retry;
use support::tls::TlsServer;
use support::tls_faults::{TlsFault, client_identity};

fn reqwest_client(identity: bool) -> reqwest::Client {
    let builder = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .redirect(redirect::recorded(reqwest::redirect::Policy::default()))
        .tls_danger_accept_invalid_certs(true);
    let builder = if identity {
        builder.identity(client_identity())
    } else {
        builder
    };
    builder.build().unwrap()
}

fn client(retry: RetryMiddleware, identity: bool) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest_client(identity))
        .with(retry)
        .with(TransportEvidence::with_client_redirects(
            ClientRedirects::Recorded,
        ))
        .build()
}

/// A POST to a TLS 1.2 server that rejects the client certificate with `error`: the error
/// text, and the history as (transmission, kind, decision).
async fn rejected_post(
    error: CertificateError,
    identity: bool,
) -> (
    String,
    Vec<(Transmission, Option<FailureKind>, Option<AttemptDecision>)>,
    TlsServer,
) {
    let server =
        support::tls_faults::start(TlsFault::RejectClientCertificate { error, tls12: true }).await;
    let client = client(exact_retry().build().unwrap(), identity);
    let exchange = client
        .post(server.url("/upload"))
        .body("x")
        .send_with_history()
        .await;
    let err = exchange.result.expect_err("the handshake fails");
    let text = crate::support::chain_messages(&err).join(" / ");
    let rows = exchange
        .history
        .attempts()
        .iter()
        .map(|r| {
            (
                r.evidence.transmission,
                r.evidence.failure,
                r.decision.clone(),
            )
        })
        .collect();
    (text, rows, server)
}

fn certificate_stop() -> Vec<(Transmission, Option<FailureKind>, Option<AttemptDecision>)> {
    vec![(
        Transmission::NotSent,
        Some(FailureKind::Certificate),
        Some(AttemptDecision::Stop {
            reason: StopReason::Permanent(FailureKind::Certificate),
        }),
    )]
}

#[tokio::test(start_paused = true)]
async fn a_certificate_expired_alert_is_a_certificate_failure_sent_once() {
    let (text, rows, server) = rejected_post(CertificateError::Expired, true).await;
    assert!(
        text.contains("received fatal alert: CertificateExpired"),
        "{text}"
    );
    assert_eq!(rows, certificate_stop());
    // One handshake tried, none completed, no request read.
    assert_eq!(
        (
            server.connections(),
            server.handshakes(),
            server.requests_seen()
        ),
        (1, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn an_unknown_ca_alert_is_a_certificate_failure_sent_once() {
    let (text, rows, server) = rejected_post(CertificateError::UnknownIssuer, true).await;
    assert!(text.contains("received fatal alert: UnknownCA"), "{text}");
    assert_eq!(rows, certificate_stop());
    assert_eq!(server.connections(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_access_denied_alert_is_a_certificate_failure_sent_once() {
    let (text, rows, _server) =
        rejected_post(CertificateError::ApplicationVerificationFailure, true).await;
    assert!(
        text.contains("received fatal alert: AccessDenied"),
        "{text}"
    );
    assert_eq!(rows, certificate_stop());
}

#[tokio::test(start_paused = true)]
async fn a_certificate_required_alert_for_a_client_without_one_is_a_certificate_failure() {
    let (text, rows, server) = rejected_post(CertificateError::Expired, false).await;
    assert!(
        text.contains("received fatal alert: CertificateRequired"),
        "{text}"
    );
    assert_eq!(rows, certificate_stop());
    assert_eq!(server.connections(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_decrypt_error_alert_keeps_the_handshake_rule_and_is_retried_while_not_sent() {
    // A bad signature is answered with `decrypt_error`: not about the certificate itself.
    let (text, rows, server) = rejected_post(CertificateError::BadSignature, true).await;
    assert!(
        text.contains("received fatal alert: DecryptError"),
        "{text}"
    );
    let tls = (Transmission::NotSent, Some(FailureKind::Tls));
    let retry = |secs| {
        Some(AttemptDecision::Retry {
            delay: std::time::Duration::from_secs(secs),
            reason: RetryReason::NotSent,
        })
    };
    assert_eq!(
        rows,
        [
            (tls.0, tls.1, retry(1)),
            (tls.0, tls.1, retry(2)),
            (tls.0, tls.1, retry(4)),
            (
                tls.0,
                tls.1,
                Some(AttemptDecision::Stop {
                    reason: StopReason::RetriesExhausted
                })
            ),
        ]
    );
    assert_eq!((server.connections(), server.requests_seen()), (4, 0));
}

#[tokio::test(start_paused = true)]
async fn under_tls_1_3_a_late_certificate_alert_stops_uvs_rules_and_a_post_is_not_repeated() {
    // TLS 1.3: the client's handshake ends before the server judges its certificate, so
    // the request goes out and the alert answers it (no `NotSent` proof).
    let fault = TlsFault::RejectClientCertificate {
        error: CertificateError::Expired,
        tls12: false,
    };
    let server = support::tls_faults::start(fault).await;
    let uv = client(exact_retry().strategy(UvTransient).build().unwrap(), true);
    let get = uv.get(server.url("/simple/")).send_with_history().await;
    let err = get.result.expect_err("the server refuses the certificate");
    let text = crate::support::chain_messages(&err).join(" / ");
    assert!(
        text.contains("received fatal alert: CertificateExpired"),
        "{text}"
    );
    assert_eq!(
        get.outcome.map(|o| (o.attempts, o.stop)),
        Some((1, StopReason::Permanent(FailureKind::Certificate)))
    );
    assert_eq!(server.connections(), 1);

    // The default table stops too: the evidence's kind is `Certificate`, for any method.
    let default = client(exact_retry().build().unwrap(), true);
    for (i, method) in [reqwest::Method::GET, reqwest::Method::POST]
        .into_iter()
        .enumerate()
    {
        let exchange = default
            .request(method.clone(), server.url("/upload"))
            .send_with_history()
            .await;
        assert!(exchange.result.is_err());
        let rows: Vec<_> = exchange
            .history
            .attempts()
            .iter()
            .map(|r| (r.evidence.failure, r.decision.clone()))
            .collect();
        assert_eq!(
            rows,
            [(
                Some(FailureKind::Certificate),
                Some(AttemptDecision::Stop {
                    reason: StopReason::Permanent(FailureKind::Certificate)
                })
            )],
            "{method}"
        );
        // The request may be out (the client's handshake had ended): never `NotSent`.
        assert_eq!(
            exchange.history.attempts()[0].evidence.transmission,
            Transmission::Unknown
        );
        assert_eq!(server.connections(), 2 + i);
    }
}

#[tokio::test(start_paused = true)]
async fn a_server_certificate_the_client_does_not_trust_stops_uvs_rules_at_once() {
    // The other side of the handshake: the client rejects the server's self-signed
    // certificate (and sends the `unknown_ca` alert itself).
    let server = TlsServer::start().await;
    let reqwest = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .redirect(redirect::recorded(reqwest::redirect::Policy::default()))
        .build()
        .unwrap();
    let client = ClientBuilder::new(reqwest)
        .with(exact_retry().strategy(UvTransient).build().unwrap())
        .with(TransportEvidence::with_client_redirects(
            ClientRedirects::Recorded,
        ))
        .build();
    let exchange = client
        .post(server.url("/upload"))
        .body("x")
        .send_with_history()
        .await;
    let err = exchange.result.expect_err("the certificate is not trusted");
    let text = crate::support::chain_messages(&err).join(" / ");
    // (The verifier's reason depends on the system's roots; the kind does not.)
    assert!(text.contains("invalid peer certificate: "), "{text}");
    let rows: Vec<_> = exchange
        .history
        .attempts()
        .iter()
        .map(|r| {
            (
                r.evidence.transmission,
                r.evidence.failure,
                r.decision.clone(),
            )
        })
        .collect();
    assert_eq!(rows, certificate_stop());
    assert_eq!(
        (
            server.connections(),
            server.handshakes(),
            server.requests_seen()
        ),
        (1, 0, 0)
    );
}
