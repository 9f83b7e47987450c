//! From an error chain to evidence: [`classify_error`] (a send's error), [`classify`] (any
//! chain, a response body's failures included), [`classify_body`] (an operation's failure
//! on a response). The rules are documented for users in the `evidence` module's docs,
//! "What each failure proves"; `decide` applies them in order.
//!
//! Layer 4 (beside `backoff`, `metrics`, `stage`): pure logic over `chain`, `record` and
//! `error`, read by the transport step and by the retry loop's operations, neither of
//! which may import the other.

use std::error::Error as StdError;
use std::io;

use http::StatusCode;

use crate::chain;
use crate::error::{BodyIncomplete, UploadBodyError};
use crate::record::{FailureKind, NotProcessedProof, Transmission};

/// What the error chain of a failed attempt proves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) struct Classification {
    /// How far the attempt got.
    pub transmission: Transmission,
    /// The kind of failure.
    pub kind: FailureKind,
    /// The server's proof that it did not process the request.
    pub not_processed: Option<NotProcessedProof>,
}

impl Classification {
    fn new(transmission: Transmission, kind: FailureKind) -> Self {
        Classification {
            transmission,
            kind,
            not_processed: None,
        }
    }
}

/// Classifies a failed attempt from the error `reqwest` returned for it: the rules
/// documented in [the `evidence` module](crate::evidence#what-each-failure-proves).
pub(crate) fn classify_error(err: &reqwest::Error) -> Classification {
    classify(err)
}

/// Classifies a failure from any error chain, with the rules of [`classify_error`]: a
/// `reqwest::Error` anywhere in it, `hyper`, `h2` and `std::io` errors, found through
/// [`chain::links`](crate::chain::links); a response body's failures by rules B1–B3 (the
/// `evidence` module docs). An `io::Error` with no reqwest error inside is classified by
/// its kinds (rules 7–9).
pub(crate) fn classify(err: &(dyn StdError + 'static)) -> Classification {
    let c = decide(&Facts::collect(err));
    let c = certificate_alert_after_handshake(c, err);
    callers_own_body(c, err)
}

/// Rule 18: the stack's own [`UploadBodyError`] in the chain (a
/// [`ReplayableBody`](crate::upload::ReplayableBody)'s stream or file failed on this side
/// while the body was sent) makes the kind [`FailureKind::UploadBody`], the caller's
/// failure; the transmission stays as decided (part of the request may have gone out).
fn callers_own_body(c: Classification, err: &(dyn StdError + 'static)) -> Classification {
    if matches!(c.transmission, Transmission::ResponseReceived(_))
        || chain::find::<UploadBodyError>(err).is_none()
    {
        return c;
    }
    Classification {
        kind: FailureKind::UploadBody,
        not_processed: None,
        ..c
    }
}

/// Rule 16: a peer's alert about a certificate (`crate::tls_alert`) that came after the
/// client's side of the handshake ended (TLS 1.3 judges a client certificate then, so the
/// request may be out) makes the kind `Certificate`; the transmission stays as decided.
/// Looked for only under an `InvalidData` I/O error, as rustls reports it, so other
/// failures format no text.
fn certificate_alert_after_handshake(
    c: Classification,
    err: &(dyn StdError + 'static),
) -> Classification {
    if c.kind != FailureKind::Certificate
        && c.kind != FailureKind::BodyInterrupted
        && crate::chain::has_io_kind(err, &[io::ErrorKind::InvalidData])
        && crate::tls_alert::in_chain(err)
    {
        return Classification {
            kind: FailureKind::Certificate,
            ..c
        };
    }
    c
}

/// Classifies the failure of an operation on a response whose head had `status`: reading
/// its body, or anything the caller did with it (the `evidence` module docs, "Body
/// failures"). A [`BodyIncomplete`] in the chain brings its own status.
pub(crate) fn classify_body(err: &(dyn StdError + 'static), status: StatusCode) -> Classification {
    let f = Facts::collect(err);
    let received = Transmission::ResponseReceived(f.head_status.unwrap_or(status));
    let kind = if f.body_interrupted() || f.transport_failure() {
        FailureKind::BodyInterrupted
    } else if f.decode {
        FailureKind::Decode
    } else {
        FailureKind::Other
    };
    Classification::new(received, kind)
}

/// How a connect failure looked, as far as the chain tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ConnectFacts {
    dns: bool,
    certificate: bool,
    invalid_url: bool,
    tcp: bool,
    tls: bool,
    /// The connect timed out (rule 17): every address of `crate::network`'s race, or,
    /// without the race's record, reqwest's `connect_timeout` or the system's (an
    /// `ETIMEDOUT`: the SYN retries, `TCP_USER_TIMEOUT`).
    all_timed_out: bool,
}

/// What the layers of one error chain say, before any rule is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Facts {
    builder: bool,
    redirect: bool,
    body: bool,
    decode: bool,
    /// A transport failure (reqwest's body error or timer, a hyper, h2 or transport
    /// `io` error) below a decode error: a response body that broke (rule B2).
    below_decode: bool,
    /// The status a [`BodyIncomplete`] carries (rule B1).
    head_status: Option<http::StatusCode>,
    /// `Some` when hyper-util says the connector failed.
    connect: Option<ConnectFacts>,
    h2_refused_stream: bool,
    h2_remote_go_away: bool,
    h2_other: Option<bool>, // Some(remote?)
    canceled: bool,
    /// hyper-util raised a non-connect error before the request was handed to a
    /// connection (it attaches `connect_info` to every error of an actual send).
    setup_stage: bool,
    timeout: bool,
    reset: bool,
    closed: bool,
    parse: bool,
}

impl Facts {
    fn collect(err: &(dyn StdError + 'static)) -> Facts {
        let mut f = Facts::default();
        // The outermost reqwest error: whose `is_dns` and timer a connect failure reads.
        let top = chain::reqwest_error(err);
        for e in chain::links(err) {
            if let Some(r) = e.downcast_ref::<reqwest::Error>() {
                f.note_reqwest(r);
            } else if let Some(b) = e.downcast_ref::<BodyIncomplete>() {
                f.head_status = Some(b.status());
            } else if let Some(e) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
                if e.is_connect() {
                    f.connect = Some(connect_facts(top.map_or(err, |r| r as _), top));
                } else if e.connect_info().is_none() {
                    f.setup_stage = true;
                }
            } else if let Some(e) = e.downcast_ref::<hyper::Error>() {
                f.below_decode |= f.decode;
                f.canceled |= e.is_canceled();
                f.timeout |= e.is_timeout();
                f.closed |= e.is_incomplete_message();
                f.parse |= e.is_parse();
            } else if let Some(e) = e.downcast_ref::<h2::Error>() {
                f.below_decode |= f.decode;
                f.note_h2(e);
            } else if let Some(io) = e.downcast_ref::<io::Error>() {
                // The kinds of the `io::Error`s nested in this one are visited as links.
                f.note_io_kind(io.kind());
            }
        }
        f
    }

    fn note_reqwest(&mut self, r: &reqwest::Error) {
        // A body error or reqwest's own timer beneath a decode error is the body breaking.
        self.below_decode |= self.decode && (r.is_body() || r.is_timeout());
        self.builder |= r.is_builder();
        self.redirect |= r.is_redirect();
        self.body |= r.is_body();
        self.decode |= r.is_decode();
        // reqwest's own timer (`TimedOut`, a private type) and any timeout beneath it.
        self.timeout |= r.is_timeout();
    }

    fn note_h2(&mut self, e: &h2::Error) {
        let reason = e.reason();
        if e.is_reset() && e.is_remote() && reason == Some(h2::Reason::REFUSED_STREAM) {
            self.h2_refused_stream = true;
        } else if e.is_go_away() && e.is_remote() {
            self.h2_remote_go_away = true;
        } else if !e.is_io() {
            self.h2_other = Some(e.is_remote());
        }
        if let Some(io) = e.get_io() {
            for kind in chain::io_kinds(io) {
                self.note_io_kind(kind);
            }
        }
    }

    fn note_io_kind(&mut self, kind: io::ErrorKind) {
        let before = (self.timeout, self.reset, self.closed);
        match kind {
            io::ErrorKind::TimedOut => self.timeout = true,
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => self.reset = true,
            io::ErrorKind::UnexpectedEof => self.closed = true,
            _ => {}
        }
        self.below_decode |= self.decode && before != (self.timeout, self.reset, self.closed);
    }

    /// Rules B1 and B2: a response body that broke.
    fn body_interrupted(&self) -> bool {
        self.head_status.is_some() || (self.decode && self.below_decode)
    }

    /// Whether any layer reports a transport failure (rules 4–12).
    fn transport_failure(&self) -> bool {
        self.h2_refused_stream
            || self.h2_remote_go_away
            || self.h2_other.is_some()
            || self.canceled
            || self.timeout
            || self.reset
            || self.closed
            || self.parse
            || self.body
    }
}

/// Reads the kind of a connect failure from the chain below `from` (the outermost
/// reqwest error, `top`, when there is one; see the module docs).
fn connect_facts(from: &(dyn StdError + 'static), top: Option<&reqwest::Error>) -> ConnectFacts {
    let mut c = ConnectFacts {
        dns: top.is_some_and(reqwest::Error::is_dns),
        ..ConnectFacts::default()
    };
    // Without the race's record, a connect that timed out: reqwest's connect timeout
    // (its private `TimedOut`, found by `is_timeout`) or an `ETIMEDOUT` below.
    let mut raced = false;
    let mut timed_out = top.is_some_and(reqwest::Error::is_timeout);
    let mut source = from.source();
    while let Some(e) = source {
        let display = e.to_string();
        let text = format!("{display} {e:?}");
        // A peer's alert about a certificate: see `crate::tls_alert`.
        c.certificate |=
            is_certificate_text(&text) || crate::tls_alert::is_certificate_alert(&text);
        // hyper-util's HttpConnector: "invalid URL, scheme is not http" and friends.
        c.invalid_url |= text.contains("invalid URL");
        if let Some(failed) = e.downcast_ref::<crate::network::ConnectFailed>() {
            c.tcp |= failed.tcp();
            c.all_timed_out |= failed.all_timed_out();
            raced = true;
        }
        // A connection that gave way to another address, not replayed: a TCP-stage fact.
        c.tcp |= e.is::<crate::network::AddressRaced>();
        let kinds: Vec<io::ErrorKind> = e
            .downcast_ref::<io::Error>()
            .map(|io| chain::io_kinds(io).collect())
            .unwrap_or_default();
        for kind in kinds {
            match kind {
                io::ErrorKind::ConnectionRefused
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::HostUnreachable
                | io::ErrorKind::NetworkUnreachable
                | io::ErrorKind::NetworkDown
                | io::ErrorKind::AddrNotAvailable
                | io::ErrorKind::NotConnected => c.tcp = true,
                io::ErrorKind::TimedOut => {
                    c.tcp = true;
                    timed_out = true;
                }
                // rustls reports every handshake failure as `InvalidData`.
                io::ErrorKind::InvalidData => c.tls = true,
                _ => {}
            }
        }
        // hyper-util's ConnectError messages: "tcp connect error", "tcp open error", …
        c.tcp |= display.starts_with("tcp ");
        // A proxy that answered the `CONNECT` with an error status could not reach the
        // target: a failed connect to it, by the proxy.
        c.tcp |= is_tunnel_refusal(e);
        let lower = text.to_ascii_lowercase();
        c.tls |= ["tls", "ssl", "handshake"]
            .iter()
            .any(|w| lower.contains(w));
        source = e.source();
    }
    // reqwest's connect timeout (`timed_out` from the start) is a TCP-stage failure.
    c.tcp |= timed_out;
    // The race's record decides for its addresses (one timed out beside one refused is
    // not a host that drops everything); without it, the connect's own timeout does.
    c.all_timed_out |= timed_out && !raced;
    c
}

/// Whether `e` is a `CONNECT` a proxy answered with a status other than `200` and `407`:
/// hyper-util's tunnel (reqwest 0.13's, for every TLS backend) reports that as its private
/// `TunnelError::TunnelUnsuccessful` ("tunnel error: unsuccessful", no source) and hands
/// out no status.
/// Its other errors are not this: a connection to the proxy that failed (`ConnectFailed`,
/// with the I/O error beneath), an I/O error or an early close during the `CONNECT` (`Io`,
/// `TunnelUnexpectedEof`), a `407` (`ProxyAuthRequired`), headers too long. Matched by its
/// `Debug` and `Display` together, at the type's own link (no source), so an error of
/// another crate with the same text does not match.
pub(crate) fn is_tunnel_refusal(e: &(dyn StdError + 'static)) -> bool {
    e.source().is_none()
        && e.to_string() == "tunnel error: unsuccessful"
        && format!("{e:?}") == "TunnelUnsuccessful"
}

fn is_certificate_text(text: &str) -> bool {
    const NEEDLES: [&str; 5] = [
        "invalid peer certificate",  // rustls::Error::InvalidCertificate, Display
        "InvalidCertificate",        // rustls, Debug
        "certificate verify failed", // OpenSSL (native-tls on Linux)
        "peer sent no certificates", // rustls::Error::NoCertificatesPresented
        "NoCertificatesPresented",
    ];
    NEEDLES.iter().any(|n| text.contains(n))
}

/// Applies the rules of [`classify_error`]'s docs, in order.
pub(crate) fn decide(f: &Facts) -> Classification {
    let c = decide_by_layer(f);
    // Rule 15: a failure raised while the connection was being set up (the HTTP/1
    // readiness check, the HTTP/2 handshake) cannot have carried the request, but hyper-util
    // reports it as a send error and promises nothing more: "sent" is not claimed either.
    if f.setup_stage && c.transmission == Transmission::SentNoResponse {
        return Classification {
            transmission: Transmission::Unknown,
            ..c
        };
    }
    c
}

fn decide_by_layer(f: &Facts) -> Classification {
    use FailureKind as K;
    use Transmission as T;
    if f.builder {
        return Classification::new(T::NotSent, K::Builder);
    }
    if f.redirect {
        return Classification::new(T::Unknown, K::Redirect);
    }
    if f.body_interrupted() {
        // Rules B1, B2: after the response head, whatever broke beneath.
        let t = f.head_status.map_or(T::Unknown, T::ResponseReceived);
        return Classification::new(t, K::BodyInterrupted);
    }
    if let Some(c) = f.connect {
        let kind = if c.dns {
            K::Dns
        } else if c.certificate {
            K::Certificate
        } else if c.invalid_url {
            K::ConnectPermanent
        } else if c.all_timed_out {
            K::ConnectTimeout
        } else if c.tcp {
            K::Connect
        } else if c.tls {
            K::Tls
        } else {
            K::Other
        };
        return Classification::new(T::NotSent, kind);
    }
    if f.h2_refused_stream {
        return Classification {
            not_processed: Some(NotProcessedProof::RefusedStream),
            ..Classification::new(T::SentNoResponse, K::Protocol)
        };
    }
    if f.h2_remote_go_away {
        return Classification::new(T::Unknown, K::GoAway);
    }
    if f.canceled {
        let kind = if f.reset {
            K::Reset
        } else if f.timeout {
            K::Timeout
        } else {
            K::Closed
        };
        return Classification::new(T::NotSent, kind);
    }
    if f.timeout {
        return Classification::new(T::Unknown, K::Timeout);
    }
    if f.reset {
        return Classification::new(T::SentNoResponse, K::Reset);
    }
    if f.closed {
        return Classification::new(T::SentNoResponse, K::Closed);
    }
    if f.parse {
        return Classification::new(T::SentNoResponse, K::Protocol);
    }
    if f.body {
        return Classification::new(T::Unknown, K::Body);
    }
    if let Some(remote) = f.h2_other {
        let t = if remote {
            T::SentNoResponse
        } else {
            T::Unknown
        };
        return Classification::new(t, K::Protocol);
    }
    if f.decode {
        return Classification::new(T::Unknown, K::Decode);
    }
    Classification::new(T::Unknown, K::Other)
}

#[cfg(test)]
mod tests {
    use super::*;
    use FailureKind as K;
    use Transmission as T;

    fn c(t: Transmission, k: FailureKind) -> Classification {
        Classification::new(t, k)
    }

    /// `classify`'s former doc example: what a `tokio_util::io::StreamReader` over a reset
    /// body hands its reader.
    #[test]
    fn an_io_reset_inside_an_io_error() {
        let err = io::Error::other(io::Error::new(io::ErrorKind::ConnectionReset, "reset"));
        let c = classify(&err);
        assert_eq!((c.transmission, c.kind), (T::SentNoResponse, K::Reset));
    }

    /// `classify_body`'s former doc example.
    #[test]
    fn an_eof_on_a_body_is_an_interrupted_body() {
        let err = io::Error::new(io::ErrorKind::UnexpectedEof, "body cut");
        let c = classify_body(&err, StatusCode::OK);
        assert_eq!(c.transmission, T::ResponseReceived(StatusCode::OK));
        assert_eq!(c.kind, K::BodyInterrupted);
    }

    #[test]
    fn nothing_recognised_is_unknown_other() {
        assert_eq!(decide(&Facts::default()), c(T::Unknown, K::Other));
    }

    #[test]
    fn connect_failures_are_not_sent_with_a_refined_kind() {
        let connect = |cf: ConnectFacts| Facts {
            connect: Some(cf),
            // A connect timeout also sets the generic timeout fact: connect still wins.
            timeout: true,
            ..Facts::default()
        };
        let dns = ConnectFacts {
            dns: true,
            tcp: true,
            ..Default::default()
        };
        assert_eq!(decide(&connect(dns)), c(T::NotSent, K::Dns));
        let cert = ConnectFacts {
            certificate: true,
            tls: true,
            ..Default::default()
        };
        assert_eq!(decide(&connect(cert)), c(T::NotSent, K::Certificate));
        let url = ConnectFacts {
            invalid_url: true,
            ..Default::default()
        };
        assert_eq!(decide(&connect(url)), c(T::NotSent, K::ConnectPermanent));
        let tcp = ConnectFacts {
            tcp: true,
            tls: true,
            ..Default::default()
        };
        assert_eq!(decide(&connect(tcp)), c(T::NotSent, K::Connect));
        // Rule 17: every address of the race timed out.
        let dead = ConnectFacts {
            tcp: true,
            all_timed_out: true,
            ..Default::default()
        };
        assert_eq!(decide(&connect(dead)), c(T::NotSent, K::ConnectTimeout));
        let tls = ConnectFacts {
            tls: true,
            ..Default::default()
        };
        assert_eq!(decide(&connect(tls)), c(T::NotSent, K::Tls));
        assert_eq!(
            decide(&connect(ConnectFacts::default())),
            c(T::NotSent, K::Other)
        );
    }

    #[test]
    fn builder_errors_are_not_sent_and_redirects_unknown() {
        let f = Facts {
            builder: true,
            ..Facts::default()
        };
        assert_eq!(decide(&f), c(T::NotSent, K::Builder));
        let f = Facts {
            redirect: true,
            ..Facts::default()
        };
        assert_eq!(decide(&f), c(T::Unknown, K::Redirect));
    }

    #[test]
    fn h2_proofs_outrank_the_io_error_beside_them() {
        let f = Facts {
            h2_refused_stream: true,
            reset: true,
            ..Facts::default()
        };
        let got = decide(&f);
        assert_eq!(got.transmission, T::SentNoResponse);
        assert_eq!(got.not_processed, Some(NotProcessedProof::RefusedStream));
        // A `GOAWAY` is no proof through hyper (see "GOAWAY"), beside a reset or alone.
        for reset in [false, true] {
            let f = Facts {
                h2_remote_go_away: true,
                reset,
                ..Facts::default()
            };
            assert_eq!(decide(&f), c(T::Unknown, K::GoAway));
        }
    }

    #[test]
    fn other_h2_errors_carry_no_proof() {
        let f = Facts {
            h2_other: Some(true),
            ..Facts::default()
        };
        assert_eq!(decide(&f), c(T::SentNoResponse, K::Protocol));
        let f = Facts {
            h2_other: Some(false),
            ..Facts::default()
        };
        assert_eq!(decide(&f), c(T::Unknown, K::Protocol));
    }

    #[test]
    fn a_canceled_request_is_not_sent() {
        let f = Facts {
            canceled: true,
            closed: true,
            ..Facts::default()
        };
        assert_eq!(decide(&f), c(T::NotSent, K::Closed));
        let f = Facts {
            canceled: true,
            reset: true,
            ..Facts::default()
        };
        assert_eq!(decide(&f), c(T::NotSent, K::Reset));
    }

    #[test]
    fn timeouts_are_unknown_even_beside_a_reset() {
        let f = Facts {
            timeout: true,
            reset: true,
            closed: true,
            ..Facts::default()
        };
        assert_eq!(decide(&f), c(T::Unknown, K::Timeout));
    }

    #[test]
    fn resets_closes_and_parse_errors() {
        let f = Facts {
            reset: true,
            closed: true,
            ..Facts::default()
        };
        assert_eq!(decide(&f), c(T::SentNoResponse, K::Reset));
        let f = Facts {
            closed: true,
            ..Facts::default()
        };
        assert_eq!(decide(&f), c(T::SentNoResponse, K::Closed));
        let f = Facts {
            parse: true,
            ..Facts::default()
        };
        assert_eq!(decide(&f), c(T::SentNoResponse, K::Protocol));
    }

    #[test]
    fn a_failure_while_setting_up_the_connection_is_not_called_sent() {
        let f = Facts {
            closed: true,
            setup_stage: true,
            ..Facts::default()
        };
        assert_eq!(decide(&f), c(T::Unknown, K::Closed));
        // A hyper-canceled request is still proven unsent.
        let f = Facts {
            canceled: true,
            setup_stage: true,
            ..Facts::default()
        };
        assert_eq!(decide(&f), c(T::NotSent, K::Closed));
    }

    #[test]
    fn body_and_decode_errors_are_unknown() {
        let f = Facts {
            body: true,
            ..Facts::default()
        };
        assert_eq!(decide(&f), c(T::Unknown, K::Body));
        let f = Facts {
            decode: true,
            ..Facts::default()
        };
        assert_eq!(decide(&f), c(T::Unknown, K::Decode));
    }

    #[test]
    fn certificate_text_from_rustls_and_openssl() {
        assert!(is_certificate_text(
            "invalid peer certificate: UnknownIssuer"
        ));
        assert!(is_certificate_text(
            "Custom { kind: InvalidData, error: InvalidCertificate(Expired) }"
        ));
        assert!(is_certificate_text(
            "error:0A000086:SSL routines:tls_post_process_server_certificate:certificate verify failed"
        ));
        assert!(!is_certificate_text(
            "received corrupt message of type InvalidContentType"
        ));
    }
}
