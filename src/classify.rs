//! From an error chain to evidence: the rules are documented on [`classify_error`] (a
//! send's error) and [`classify`] (any chain, a response body's failures included).
//! Re-exported in [`crate::evidence`].
//!
//! Layer 4 (beside `backoff`, `metrics`, `stage`): pure logic over `chain`, `record` and
//! `error`, read by the transport step and by the retry loop's operations, neither of
//! which may import the other.

use std::error::Error as StdError;
use std::io;

use http::StatusCode;

use crate::chain;
use crate::error::BodyIncomplete;
use crate::record::{FailureKind, NotProcessedProof, Transmission};

/// What the error chain of a failed attempt proves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Classification {
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

/// Classifies a failed attempt from the error `reqwest` returned for it.
///
/// Conservative by construction: [`Transmission::NotSent`] only when a layer proves that no
/// request byte left.
///
/// The chain of a failed send is `reqwest::Error → hyper_util::client::legacy::Error →
/// hyper::Error → h2::Error | std::io::Error`, or, for a connect failure,
/// `reqwest::Error → hyper_util::client::legacy::Error (is_connect) → the connector's error`
/// (hyper-util's `ConnectError`, reqwest's DNS error, a TLS library's error inside an
/// `io::Error`). This function first collects what each layer says into `Facts`, then
/// `decide` applies the rules below in order. The first rule that matches wins.
///
/// | # | fact | transmission | kind | why |
/// |---|---|---|---|---|
/// | 1 | reqwest `is_builder` | `NotSent` | `Builder` | the request was never handed to a connection |
/// | 2 | reqwest `is_redirect` | `Unknown` | `Redirect` | a server answered (with a redirect), but this error carries no status |
/// | 3 | hyper-util `is_connect` | `NotSent` | see below | the connector failed, so no connection existed to write the request on |
/// | 4 | h2 `RST_STREAM(REFUSED_STREAM)` from the peer | `SentNoResponse` + [`NotProcessedProof::RefusedStream`] | `Protocol` | RFC 9113 §8.7: the stream was refused before any processing |
/// | 5 | h2 `GOAWAY` received from the peer | `Unknown` | `GoAway` | see "GOAWAY" below: through hyper it is no proof either way |
/// | 6 | hyper `is_canceled` | `NotSent` | from the inner error, else `Closed` | hyper hands a request back as canceled only when it never started writing it |
/// | 7 | a timeout (hyper `is_timeout`, io `TimedOut`, reqwest's own timer) | `Unknown` | `Timeout` | a timer says nothing about how far the request got |
/// | 8 | io `ConnectionReset` / `ConnectionAborted` / `BrokenPipe` | `SentNoResponse` | `Reset` | the connection existed and broke while the request was in flight |
/// | 9 | hyper `is_incomplete_message`, io `UnexpectedEof` | `SentNoResponse` | `Closed` | hyper wrote the request and met EOF before a complete response head |
/// | 10 | hyper `is_parse` (a malformed or oversized response head) | `SentNoResponse` | `Protocol` | hyper's HTTP/1 client parses a response head only once it has begun writing the request (`Conn::can_read_head` needs the writing state past `Init`); bytes on an idle connection are a different error |
/// | 11 | reqwest `is_body` | `Unknown` | `Body` | a body failed part way: part of the request may be out |
/// | 12 | any other h2 error | `SentNoResponse` if the peer sent it, else `Unknown` | `Protocol` | a stream the peer reset existed on the wire |
/// | 13 | reqwest `is_decode` | `Unknown` | `Decode` | only raised after a response, which the caller already has |
/// | 14 | anything else | `Unknown` | `Other` | no proof either way |
/// | 15 | hyper-util's error has no `connect_info` (and is not a connect error) | `SentNoResponse` of rules 4–12 becomes `Unknown` | unchanged | hyper-util attaches the connection's info to every error of an actual send; without it, the error came from setting the connection up (HTTP/1 readiness, HTTP/2 handshake), which hyper-util reports as a send error but which never carried the request |
/// | 16 | a TLS alert about a certificate from the peer after the handshake (TLS 1.3 judges a client certificate after the client's `Finished`), under an `InvalidData` I/O error | as rules 4–15 decided | `Certificate` | no retry changes a certificate; see `tls_alert` in the crate's source for which alerts count |
///
/// The kind of a connect failure (rule 3): reqwest's `is_dns` → `Dns`; a TLS peer
/// certificate rejected → `Certificate`; an "invalid URL" from the connector (a scheme the
/// connector cannot serve, e.g. `https` with no TLS backend built in, which reqwest 0.13.5
/// reports as `ConnectError("invalid URL, scheme is not http")`) → `ConnectPermanent`;
/// an `io::Error` of a TCP kind (refused, reset, unreachable, timed out) or hyper-util's
/// "tcp …" error → `Connect`; an `io::Error` of kind `InvalidData` (how rustls reports a
/// failed handshake) or a message naming TLS/SSL/a handshake → `Tls`; else `Other`.
///
/// # Why text is matched for certificates
///
/// The certificate error is a type of whichever TLS crate reqwest was built with (rustls's
/// `Error::InvalidCertificate`, openssl's verify error behind native-tls), and this crate
/// leaves the choice of backend to its users, so it cannot downcast to them. It matches the
/// chain's `Display`/`Debug` text instead: `invalid peer certificate` / `InvalidCertificate`
/// (rustls), `certificate verify failed` (OpenSSL, native-tls on Linux),
/// `peer sent no certificates`, and a peer's alert about a certificate (rustls's
/// `received fatal alert: CertificateExpired`, OpenSSL's `sslv3 alert certificate expired`;
/// `bad_certificate`, `unsupported_certificate`, `certificate_revoked`,
/// `certificate_expired`, `certificate_unknown`, `unknown_ca`, `access_denied`,
/// `certificate_required`, … but not `decrypt_error` or `handshake_failure`). The text only chooses the *kind*; the transmission of any
/// connect failure is `NotSent` whatever the text says, so a changed message can only
/// demote `Certificate` to `Tls`, never make a sent request look unsent.
///
/// # GOAWAY (rule 5)
///
/// RFC 9113 §6.8 makes a `GOAWAY` a proof for the streams above its last stream id, and
/// `h2` (0.4) fails exactly those with the remote `GOAWAY` error (`Streams::recv_go_away`),
/// and any stream opened after it arrived (`ensure_no_conn_error`). But hyper 1.x's HTTP/2
/// client task (`proto::h2::client::ClientTask::poll`), having opened a stream with
/// `send_request`, checks the connection again with `poll_ready` and, if the `GOAWAY` arrived
/// in between (the connection runs on another worker thread), fails the request with the
/// same connection error, although its `HEADERS` were queued and may have gone out below
/// the last stream id. Against nginx rotating connections (`keepalive_requests 3`) a POST so
/// failed was in nginx's access log as processed, once in about 800 rotations. The error
/// does not say which case it is, so a `GOAWAY` is `Unknown` (kind
/// [`FailureKind::GoAway`]): the retry sends an idempotent request again at once, a
/// non-idempotent one is not sent again, and the breaker counts none of them.
///
/// # Multi-address connects
///
/// hyper-util (0.1.21, `ConnectingTcpRemote::connect`) tries each resolved address in turn
/// and, when all fail, returns only the *first* address's error. The evidence therefore
/// cannot keep every address's failure; what it records is still true of every address:
/// `NotSent` (the connector returns an error only when no address produced a connection) and
/// `Connect`, a kind that does not claim *how* the addresses failed (refused, unreachable or
/// timed out are all `Connect`), so one address refusing and another timing out is never
/// reported as "refused".
///
/// # Example
///
/// ```no_run
/// # async fn demo() {
/// use reqwest_resilience::{FailureKind, Transmission, evidence::classify_error};
///
/// // Nothing listens on port 9 of the loopback interface here.
/// let err = reqwest::get("http://127.0.0.1:9/").await.unwrap_err();
/// let c = classify_error(&err);
/// assert_eq!(c.transmission, Transmission::NotSent);
/// assert_eq!(c.kind, FailureKind::Connect);
/// # }
/// ```
pub fn classify_error(err: &reqwest::Error) -> Classification {
    classify(err)
}

/// Classifies a failure from any error chain, with the rules of [`classify_error`]: a
/// `reqwest::Error` anywhere in it (behind a middleware's error, inside the `io::Error` a
/// `bytes_stream()` reader returns), `hyper`, `h2` and `std::io` errors, found through
/// [`chain::links`](crate::chain::links). An `io::Error` with no reqwest error inside is
/// classified by its kinds (rules 7–9).
///
/// # Body failures
///
/// A failure while reading a response body comes after the response head, so the server
/// received and answered the request. reqwest reports every body failure of `bytes()`,
/// `text()`, `json()`, `chunk()` and `bytes_stream()` as `is_decode()`, a cut body
/// included; what lies beneath tells them apart:
///
/// | # | fact | transmission | kind |
/// |---|---|---|---|
/// | B1 | a [`BodyIncomplete`] in the chain (the resumable body gave up) | `ResponseReceived(its status)` | [`FailureKind::BodyInterrupted`] |
/// | B2 | reqwest `is_decode` with a transport failure beneath (reqwest's body error or timer, a `hyper`/`h2` error, an `io` reset, timeout or EOF) | `Unknown` here, `ResponseReceived(status)` from [`classify_body`] | [`FailureKind::BodyInterrupted`] |
/// | B3 | reqwest `is_decode` with nothing of the transport beneath (invalid JSON in a complete body) | as rule 13 | [`FailureKind::Decode`] (never retried) |
///
/// B1 and B2 come before rules 4–12: the reset, the timeout or the EOF beneath describe the
/// body, not the request, and no HTTP/2 proof of "not processed" can follow a response head.
/// The chain of a cut body does not carry the status (reqwest drops it); a caller that
/// had the response head adds it with [`classify_body`].
///
/// ```
/// use std::io;
/// use reqwest_resilience::evidence::classify;
/// use reqwest_resilience::{FailureKind, Transmission};
///
/// // What a `tokio_util::io::StreamReader` over a reset body hands its reader.
/// let err = io::Error::other(io::Error::new(io::ErrorKind::ConnectionReset, "reset"));
/// let c = classify(&err);
/// assert_eq!((c.transmission, c.kind), (Transmission::SentNoResponse, FailureKind::Reset));
/// ```
pub fn classify(err: &(dyn StdError + 'static)) -> Classification {
    let c = decide(&Facts::collect(err));
    certificate_alert_after_handshake(c, err)
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
/// its body, or anything the caller did with it.
///
/// A transport failure anywhere in the chain (a cut, a reset, a timeout, any rule from
/// 4 to 12, and B2) is `ResponseReceived(status)` / [`FailureKind::BodyInterrupted`]; a
/// decode error of a complete body is `ResponseReceived(status)` / [`FailureKind::Decode`];
/// anything else (the caller's own error) is `ResponseReceived(status)` /
/// [`FailureKind::Other`]. A [`BodyIncomplete`] in the chain brings its own status.
///
/// ```
/// use std::io;
/// use http::StatusCode;
/// use reqwest_resilience::evidence::classify_body;
/// use reqwest_resilience::{FailureKind, Transmission};
///
/// let err = io::Error::new(io::ErrorKind::UnexpectedEof, "body cut");
/// let c = classify_body(&err, StatusCode::OK);
/// assert_eq!(c.transmission, Transmission::ResponseReceived(StatusCode::OK));
/// assert_eq!(c.kind, FailureKind::BodyInterrupted);
/// ```
pub fn classify_body(err: &(dyn StdError + 'static), status: StatusCode) -> Classification {
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
    let mut source = from.source();
    while let Some(e) = source {
        let display = e.to_string();
        let text = format!("{display} {e:?}");
        // A peer's alert about a certificate: see `crate::tls_alert`.
        c.certificate |=
            is_certificate_text(&text) || crate::tls_alert::is_certificate_alert(&text);
        // hyper-util's HttpConnector: "invalid URL, scheme is not http" and friends.
        c.invalid_url |= text.contains("invalid URL");
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
                | io::ErrorKind::NotConnected
                | io::ErrorKind::TimedOut => c.tcp = true,
                // rustls reports every handshake failure as `InvalidData`.
                io::ErrorKind::InvalidData => c.tls = true,
                _ => {}
            }
        }
        // hyper-util's ConnectError messages: "tcp connect error", "tcp open error", …
        c.tcp |= display.starts_with("tcp ");
        let lower = text.to_ascii_lowercase();
        c.tls |= ["tls", "ssl", "handshake"]
            .iter()
            .any(|w| lower.contains(w));
        source = e.source();
    }
    // reqwest's connect timeout wraps its private `TimedOut`, found by `is_timeout`.
    c.tcp |= top.is_some_and(reqwest::Error::is_timeout);
    c
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
