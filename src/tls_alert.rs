//! TLS alerts that concern certificates, recognised in an error chain's text whichever TLS
//! backend reqwest was built with. Layer 2 (above [`crate::chain`], which it walks).
//!
//! A server that rejects the client's certificate, or a peer that rejects the other's,
//! ends the handshake with an alert (RFC 8446 §6.2). Retrying cannot change a certificate,
//! so these alerts make a failure `FailureKind::Certificate` (never retried), where any
//! other handshake failure stays `Tls` (retried while nothing was sent).
//!
//! | alert (RFC 8446 §6.2, RFC 5246 §7.2, RFC 6066 §8) | certificate? | why |
//! |---|---|---|
//! | `bad_certificate`, `unsupported_certificate`, `certificate_revoked`, `certificate_expired`, `certificate_unknown`, `unknown_ca` | yes | the peer judged a certificate |
//! | `certificate_required` (TLS 1.3), `no_certificate` (SSL 3) | yes | the server requires a client certificate that was not sent |
//! | `access_denied` | yes | a valid certificate was received and access control refused it: no retry changes that |
//! | `bad_certificate_status_response`, `bad_certificate_hash_value`, `certificate_unobtainable` | yes | an OCSP staple or a certificate URL failed |
//! | `decrypt_error` | no | a failed signature or `Finished` check: not a verdict on a certificate (uv makes it fatal; here it keeps the handshake rule) |
//! | `handshake_failure`, `protocol_version`, `insufficient_security`, … | no | no common parameters, or something else; the handshake rule applies |
//!
//! The alert is a type of the TLS crate (rustls's `Error::AlertReceived`, OpenSSL's
//! `SSL alert number` behind native-tls), which this crate does not depend on, so its
//! text is matched, the way the classifier (`classify.rs`) matches certificate errors: rustls's
//! `received fatal alert: CertificateExpired`, OpenSSL's `sslv3 alert certificate expired`
//! / `tlsv1 alert unknown ca`. A text that changes can only make such a failure `Tls`
//! again (retried while not sent), never make a sent request look unsent. The texts of
//! Apple's Security framework and of Windows' SChannel are not matched (native-tls on
//! those systems): there the alert stays `Tls`.

use std::error::Error as StdError;

/// rustls's `AlertDescription` names of the alerts that concern certificates.
const RUSTLS_NAMES: [&str; 12] = [
    "BadCertificate",
    "UnsupportedCertificate",
    "CertificateRevoked",
    "CertificateExpired",
    "CertificateUnknown",
    "UnknownCA",
    "AccessDenied",
    "CertificateRequired",
    "NoCertificate",
    "BadCertificateStatusResponse",
    "BadCertificateHashValue",
    "CertificateUnobtainable",
];

/// OpenSSL's reason texts (`SSL_R_SSLV3_ALERT_*`, `SSL_R_TLSV1_ALERT_*`, …) of the same
/// alerts, after the protocol prefix (`sslv3 `, `tlsv1 `, `tlsv13 `).
const OPENSSL_TEXTS: [&str; 12] = [
    "alert bad certificate",
    "alert unsupported certificate",
    "alert certificate revoked",
    "alert certificate expired",
    "alert certificate unknown",
    "alert unknown ca",
    "alert access denied",
    "alert certificate required",
    "alert no certificate",
    "bad certificate status response",
    "bad certificate hash value",
    "certificate unobtainable",
];

/// Whether `text` (an error's `Display` or `Debug` text) tells of a received alert that
/// concerns a certificate (see the module docs for which do).
pub(crate) fn is_certificate_alert(text: &str) -> bool {
    let named_after = |marker: &str| {
        text.match_indices(marker).any(|(at, _)| {
            let rest = &text[at + marker.len()..];
            let name_len = rest
                .find(|c: char| !c.is_ascii_alphanumeric())
                .unwrap_or(rest.len());
            RUSTLS_NAMES.contains(&&rest[..name_len])
        })
    };
    if named_after("received fatal alert: ") || named_after("AlertReceived(") {
        return true;
    }
    let lower = text.to_ascii_lowercase();
    OPENSSL_TEXTS.iter().any(|t| lower.contains(t))
}

/// Whether an error of `err`'s chain tells of a received certificate alert.
pub(crate) fn in_chain(err: &(dyn StdError + 'static)) -> bool {
    crate::chain::links(err).any(|e| is_certificate_alert(&e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[test]
    fn rustls_alert_texts_name_the_alert_exactly() {
        for name in RUSTLS_NAMES {
            assert!(is_certificate_alert(&format!(
                "received fatal alert: {name}"
            )));
            assert!(is_certificate_alert(&format!(
                "Custom {{ kind: InvalidData, error: AlertReceived({name}) }}"
            )));
        }
        for other in [
            "HandshakeFailure",
            "DecryptError",
            "ProtocolVersion",
            "InsufficientSecurity",
            "UnknownPSKIdentity",
            "Unknown(200)",
        ] {
            assert!(
                !is_certificate_alert(&format!("received fatal alert: {other}")),
                "{other}"
            );
            assert!(
                !is_certificate_alert(&format!("AlertReceived({other})")),
                "{other}"
            );
        }
        // A longer name that merely starts like a listed one is not it.
        assert!(!is_certificate_alert("received fatal alert: UnknownCAX"));
    }

    #[test]
    fn openssl_alert_texts_as_native_tls_prints_them() {
        assert!(is_certificate_alert(
            "error:0A000415:SSL routines:ssl3_read_bytes:sslv3 alert certificate expired:../ssl/record/rec_layer_s3.c:1605:SSL alert number 45"
        ));
        assert!(is_certificate_alert(
            "error:0A000418:SSL routines::tlsv1 alert unknown ca"
        ));
        assert!(is_certificate_alert(
            "error:0A00045C:SSL routines::tlsv13 alert certificate required"
        ));
        assert!(!is_certificate_alert(
            "error:0A000410:SSL routines::sslv3 alert handshake failure"
        ));
        assert!(!is_certificate_alert("connection reset by peer"));
    }

    #[test]
    fn an_alert_is_found_inside_nested_io_errors() {
        let inner = io::Error::new(
            io::ErrorKind::InvalidData,
            "received fatal alert: CertificateExpired",
        );
        let outer = io::Error::other(inner);
        assert!(in_chain(&outer));
        let other = io::Error::new(
            io::ErrorKind::InvalidData,
            "received fatal alert: HandshakeFailure",
        );
        assert!(!in_chain(&other));
    }
}
