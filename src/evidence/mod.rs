//! What was observed about each attempt: [`RequestEvidence`] and the attempt history.
//!
//! The transport step ([`TransportEvidence`], the innermost middleware) writes one
//! [`RequestEvidence`] per attempt into the request's [`http::Extensions`]. Every other
//! middleware of this crate decides from it: a retry is safe when the server cannot have
//! acted on the attempt, or when acting twice is harmless, and only observed progress can
//! tell which. The error type alone cannot: a timeout may mean the request never left, or
//! that a payment went through and only the answer was lost.
//!
//! The rule that keeps this honest: [`Transmission::NotSent`] only when the failing stage
//! proves no request byte can have reached a server. Everything else is
//! [`Transmission::SentNoResponse`] or [`Transmission::Unknown`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), reqwest_resilience::ResilienceError> {
//! use reqwest_resilience::{FailureKind, RequestEvidence, Resilience, SendWithHistory};
//! use reqwest_resilience::Transmission;
//!
//! let client = Resilience::new().no_retry().build_from(reqwest::Client::builder())?;
//! // Nothing listens on port 9 of the loopback interface here.
//! let sent = client.get("http://127.0.0.1:9/").send_with_history().await;
//! let evidence: &RequestEvidence = &sent.history.last().unwrap().evidence;
//! assert_eq!(evidence.transmission, Transmission::NotSent);
//! assert_eq!(evidence.failure, Some(FailureKind::Connect));
//! # Ok(()) }
//! ```
//!
//! # What each failure proves
//!
//! The evidence of a failed attempt comes from the error `reqwest` returned for it, read
//! through its whole chain: a `reqwest::Error` anywhere in it (behind a middleware's error,
//! inside the `io::Error` a `bytes_stream()` reader returns), `hyper`, `h2` and `std::io`
//! errors (the links [`chain::find`](crate::chain::find) walks). An `io::Error` with no
//! reqwest error inside is judged by its kinds (rules 7–9).
//!
//! The chain of a failed send is `reqwest::Error → hyper_util::client::legacy::Error →
//! hyper::Error → h2::Error | std::io::Error`, or, for a connect failure,
//! `reqwest::Error → hyper_util::client::legacy::Error (is_connect) → the connector's error`
//! (hyper-util's `ConnectError`, reqwest's DNS error, a TLS library's error inside an
//! `io::Error`). The transport step reads what each layer of it says, then applies the rules
//! below in order: the first rule that matches wins.
//!
//! | # | fact | transmission | kind | why |
//! |---|---|---|---|---|
//! | 1 | reqwest `is_builder` | `NotSent` | `Builder` | the request was never handed to a connection |
//! | 2 | reqwest `is_redirect` | `Unknown` | `Redirect` | a server answered (with a redirect), but this error carries no status |
//! | 3 | hyper-util `is_connect` | `NotSent` | see below | the connector failed, so no connection existed to write the request on |
//! | 4 | h2 `RST_STREAM(REFUSED_STREAM)` from the peer | `SentNoResponse` + [`NotProcessedProof::RefusedStream`] | `Protocol` | RFC 9113 §8.7: the stream was refused before any processing |
//! | 5 | h2 `GOAWAY` received from the peer | `Unknown` | `GoAway` | see [GOAWAY](#goaway-rule-5) below: through hyper it is no proof either way |
//! | 6 | hyper `is_canceled` | `NotSent` | from the inner error, else `Closed` | hyper hands a request back as canceled only when it never started writing it |
//! | 7 | a timeout (hyper `is_timeout`, io `TimedOut`, reqwest's own timer) | `Unknown` | `Timeout` | a timer says nothing about how far the request got |
//! | 8 | io `ConnectionReset` / `ConnectionAborted` / `BrokenPipe` | `SentNoResponse` | `Reset` | the connection existed and broke while the request was in flight |
//! | 9 | hyper `is_incomplete_message`, io `UnexpectedEof` | `SentNoResponse` | `Closed` | hyper wrote the request and met EOF before a complete response head |
//! | 10 | hyper `is_parse` (a malformed or oversized response head) | `SentNoResponse` | `Protocol` | hyper's HTTP/1 client parses a response head only once it has begun writing the request (`Conn::can_read_head` needs the writing state past `Init`); bytes on an idle connection are a different error |
//! | 11 | reqwest `is_body` | `Unknown` | `Body` | a body failed part way: part of the request may be out |
//! | 12 | any other h2 error | `SentNoResponse` if the peer sent it, else `Unknown` | `Protocol` | a stream the peer reset existed on the wire |
//! | 13 | reqwest `is_decode` | `Unknown` | `Decode` | only raised after a response, which the caller already has |
//! | 14 | anything else | `Unknown` | `Other` | no proof either way |
//! | 15 | hyper-util's error has no `connect_info` (and is not a connect error) | `SentNoResponse` of rules 4–12 becomes `Unknown` | unchanged | hyper-util attaches the connection's info to every error of an actual send; without it, the error came from setting the connection up (HTTP/1 readiness, HTTP/2 handshake), which hyper-util reports as a send error but which never carried the request |
//! | 17 | the connect timed out: every address the connector tried (`crate::network`'s address race), or, without the race, reqwest's `connect_timeout` or the system's (`ETIMEDOUT`: the SYN retries, `TCP_USER_TIMEOUT`) | `NotSent` | `ConnectTimeout` | no SYN was answered: nothing reached a server; see [`RequestEvidence::connect`] for each address the race tried |
//! | 16 | a TLS alert about a certificate from the peer after the handshake (TLS 1.3 judges a client certificate after the client's `Finished`), under an `InvalidData` I/O error | as rules 4–15 decided | `Certificate` | no retry changes a certificate; see `tls_alert` in the crate's source for which alerts count |
//! | 18 | the stack's own [`UploadBodyError`](crate::upload::UploadBodyError) in the chain, no response head (a [`ReplayableBody`](crate::upload::ReplayableBody)'s stream yielded an error, its file could not be read, while the body was sent) | as rules 4–16 decided | `UploadBody` | the caller's source failed on this side: neutral for the breaker, never retried |
//!
//! The kind of a connect failure (rule 3): reqwest's `is_dns` → `Dns`; a TLS peer
//! certificate rejected → `Certificate`; an "invalid URL" from the connector (a scheme the
//! connector cannot serve, e.g. `https` with no TLS backend built in, which reqwest 0.13.5
//! reports as `ConnectError("invalid URL, scheme is not http")`) → `ConnectPermanent`;
//! an `io::Error` of a TCP kind (refused, reset, unreachable, timed out) or hyper-util's
//! "tcp …" error → `Connect`; an `io::Error` of kind `InvalidData` (how rustls reports a
//! failed handshake) or a message naming TLS/SSL/a handshake → `Tls`; else `Other`.
//!
//! ## Why text is matched for certificates
//!
//! The certificate error is a type of whichever TLS crate reqwest was built with (rustls's
//! `Error::InvalidCertificate`, openssl's verify error behind native-tls), and this crate
//! leaves the choice of backend to its users, so it cannot downcast to them. It matches the
//! chain's `Display`/`Debug` text instead: `invalid peer certificate` / `InvalidCertificate`
//! (rustls), `certificate verify failed` (OpenSSL, native-tls on Linux),
//! `peer sent no certificates`, and a peer's alert about a certificate (rustls's
//! `received fatal alert: CertificateExpired`, OpenSSL's `sslv3 alert certificate expired`;
//! `bad_certificate`, `unsupported_certificate`, `certificate_revoked`,
//! `certificate_expired`, `certificate_unknown`, `unknown_ca`, `access_denied`,
//! `certificate_required`, … but not `decrypt_error` or `handshake_failure`). The text only chooses the *kind*; the transmission of any
//! connect failure is `NotSent` whatever the text says, so a changed message can only
//! demote `Certificate` to `Tls`, never make a sent request look unsent.
//!
//! ## GOAWAY (rule 5)
//!
//! RFC 9113 §6.8 makes a `GOAWAY` a proof for the streams above its last stream id, and
//! `h2` (0.4) fails exactly those with the remote `GOAWAY` error (`Streams::recv_go_away`),
//! and any stream opened after it arrived (`ensure_no_conn_error`). But hyper 1.x's HTTP/2
//! client task (`proto::h2::client::ClientTask::poll`), having opened a stream with
//! `send_request`, checks the connection again with `poll_ready` and, if the `GOAWAY` arrived
//! in between (the connection runs on another worker thread), fails the request with the
//! same connection error, although its `HEADERS` were queued and may have gone out below
//! the last stream id. Against nginx rotating connections (`keepalive_requests 3`) a POST so
//! failed was in nginx's access log as processed, once in about 800 rotations. The error
//! does not say which case it is, so a `GOAWAY` is `Unknown` (kind
//! [`FailureKind::GoAway`]): the retry sends an idempotent request again at once, a
//! non-idempotent one is not sent again, and the breaker counts none of them.
//!
//! ## Multi-address connects
//!
//! hyper-util (0.1.21, `ConnectingTcpRemote::connect`) tries each resolved address in turn
//! and, when all fail, returns only the *first* address's error. The evidence therefore
//! cannot keep every address's failure; what it records is still true of every address:
//! `NotSent` (the connector returns an error only when no address produced a connection) and
//! `Connect`, a kind that does not claim *how* the addresses failed (refused, unreachable or
//! timed out are all `Connect`), so one address refusing and another timing out is never
//! reported as "refused".
//!
//! ## Body failures
//!
//! A failure while reading a response body comes after the response head, so the server
//! received and answered the request. reqwest reports every body failure of `bytes()`,
//! `text()`, `json()`, `chunk()` and `bytes_stream()` as `is_decode()`, a cut body
//! included; what lies beneath tells them apart:
//!
//! | # | fact | transmission | kind |
//! |---|---|---|---|
//! | B1 | a [`BodyIncomplete`](crate::error::BodyIncomplete) in the chain (the resumable body gave up) | `ResponseReceived(its status)` | [`FailureKind::BodyInterrupted`] |
//! | B2 | reqwest `is_decode` with a transport failure beneath (reqwest's body error or timer, a `hyper`/`h2` error, an `io` reset, timeout or EOF) | `Unknown` from the chain alone; `ResponseReceived(status)` where the response head is known (an [`Operation`](crate::retry::Operation) step on a response) | [`FailureKind::BodyInterrupted`] |
//! | B3 | reqwest `is_decode` with nothing of the transport beneath (invalid JSON in a complete body) | as rule 13 | [`FailureKind::Decode`] (never retried) |
//!
//! B1 and B2 come before rules 4–12: the reset, the timeout or the EOF beneath describe the
//! body, not the request, and no HTTP/2 proof of "not processed" can follow a response head.
//! The chain of a cut body does not carry the status (reqwest drops it).
//!
//! A failed [`Operation`](crate::retry::Operation) step that had a response (reading its
//! body, or anything the caller did with it) is recorded as `ResponseReceived(status)` with
//! the status of that response (a [`BodyIncomplete`](crate::error::BodyIncomplete) in the
//! chain brings its own): [`FailureKind::BodyInterrupted`] for a transport failure anywhere in
//! the chain (a cut, a reset, a timeout, any rule from 4 to 12, and B2),
//! [`FailureKind::Decode`] for a decode error of a complete body, [`FailureKind::Other`] for
//! anything else (the caller's own error). A step that had no response is judged by the rules
//! above.

mod middleware;
mod weather;

pub(crate) use crate::classify::classify_error;
pub use middleware::TransportEvidence;

pub use crate::record::{
    AddressOutcome, AddressTried, AttemptDecision, AttemptHistory, AttemptRecord, ConnectAttempts,
    FailureKind, NotProcessedProof, Redirects, RequestEvidence, Shared, SharedRole, Transmission,
};
