//! How a raced connection fails: [`ConnectFailed`] (no address connected) and
//! [`AddressRaced`] (another address answered first), and the outcome of one address
//! read from its error.

use std::error::Error as StdError;
use std::fmt;
use std::io;

use crate::record::{AddressOutcome, ConnectAttempts};

/// No address of the host connected: every address tried, with its outcome
/// ([`ConnectAttempts`], also in
/// [`RequestEvidence::connect`](crate::RequestEvidence::connect)). In the error chain of
/// a connect failure of a client [`build_from`](crate::Resilience::build_from) builds,
/// when the host has more than one address or its address timed out (a single address
/// that failed otherwise keeps reqwest's own error). Its `source()` is the error of the
/// first address, when that one ended with an error.
#[derive(Debug)]
pub struct ConnectFailed {
    host: String,
    attempts: ConnectAttempts,
    /// Every address timed out (also when the connector never said which it tried).
    timed_out: bool,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl ConnectFailed {
    pub(crate) fn new(
        host: String,
        attempts: ConnectAttempts,
        timed_out: bool,
        source: Option<Box<dyn StdError + Send + Sync>>,
    ) -> Self {
        ConnectFailed {
            host,
            attempts,
            timed_out,
            source,
        }
    }

    /// Every address tried, with its outcome.
    pub fn attempts(&self) -> &ConnectAttempts {
        &self.attempts
    }

    /// Whether every address timed out: the host, or the path to it, drops what is sent
    /// to it ([`FailureKind::ConnectTimeout`](crate::FailureKind::ConnectTimeout)).
    pub fn all_timed_out(&self) -> bool {
        self.timed_out
    }

    /// Whether an address failed at the TCP stage (refused, unreachable, timed out).
    pub(crate) fn tcp(&self) -> bool {
        self.timed_out
            || self.attempts.tried.iter().any(|t| {
                matches!(
                    t.outcome,
                    AddressOutcome::Refused
                        | AddressOutcome::TimedOut
                        | AddressOutcome::Unreachable
                )
            })
    }
}

impl fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no address of {} connected", self.host)?;
        if self.attempts.tried.is_empty() && self.timed_out {
            return f.write_str(" within the connect timeout");
        }
        for (i, t) in self.attempts.tried.iter().enumerate() {
            let sep = if i == 0 { ": " } else { ", " };
            write!(f, "{sep}{} {}", t.address, describe(t.outcome))?;
        }
        Ok(())
    }
}

impl StdError for ConnectFailed {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source.as_deref().map(|e| e as _)
    }
}

fn describe(outcome: AddressOutcome) -> &'static str {
    match outcome {
        AddressOutcome::Connected => "connected",
        AddressOutcome::Refused => "refused",
        AddressOutcome::TimedOut => "timed out",
        AddressOutcome::Unreachable => "unreachable",
        AddressOutcome::Handshake => "failed its handshake",
        AddressOutcome::Answered => "answered",
        AddressOutcome::Abandoned => "abandoned",
        _ => "failed",
    }
}

/// A connection that waited on one address while another answered first: reqwest sends
/// the request again at once (a replay of its own, below every middleware), and the new
/// connection tries the address that answered first. Seen only when that replay could not
/// be made (a body that cannot be copied): a connect failure, not sent.
#[derive(Debug)]
pub(crate) struct AddressRaced {
    pub(crate) to: std::net::SocketAddr,
}

impl fmt::Display for AddressRaced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} answered before the address this connection waited on: to be sent again on it",
            self.to
        )
    }
}

impl StdError for AddressRaced {}

/// How an address whose connection failed with `err` ended.
pub(crate) fn outcome_of(err: &(dyn StdError + 'static)) -> AddressOutcome {
    for e in crate::chain::links(err) {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            match io.kind() {
                io::ErrorKind::ConnectionRefused => return AddressOutcome::Refused,
                io::ErrorKind::TimedOut => return AddressOutcome::TimedOut,
                io::ErrorKind::HostUnreachable
                | io::ErrorKind::NetworkUnreachable
                | io::ErrorKind::NetworkDown
                | io::ErrorKind::AddrNotAvailable => return AddressOutcome::Unreachable,
                // rustls reports a failed handshake as `InvalidData`.
                io::ErrorKind::InvalidData => return AddressOutcome::Handshake,
                _ => {}
            }
        }
    }
    let text = crate::chain::messages(err).join(" ").to_ascii_lowercase();
    if ["tls", "ssl", "handshake", "certificate"]
        .iter()
        .any(|w| text.contains(w))
    {
        AddressOutcome::Handshake
    } else {
        AddressOutcome::Failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::AddressTried;
    use std::time::Duration;

    #[test]
    fn an_address_outcome_from_its_error() {
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(outcome_of(&refused), AddressOutcome::Refused);
        let unreachable = io::Error::other(io::Error::from(io::ErrorKind::HostUnreachable));
        assert_eq!(outcome_of(&unreachable), AddressOutcome::Unreachable);
        let tls = io::Error::other("tls handshake eof");
        assert_eq!(outcome_of(&tls), AddressOutcome::Handshake);
        assert_eq!(outcome_of(&io::Error::other("odd")), AddressOutcome::Failed);
    }

    #[test]
    fn connect_failed_names_every_address_with_its_outcome() {
        let tried = |port, outcome| AddressTried {
            address: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            outcome,
            started_after: Duration::ZERO,
        };
        let failed = ConnectFailed::new(
            "h.test".into(),
            ConnectAttempts {
                tried: vec![
                    tried(1, AddressOutcome::Refused),
                    tried(2, AddressOutcome::TimedOut),
                ],
            },
            false,
            None,
        );
        assert_eq!(
            failed.to_string(),
            "no address of h.test connected: 127.0.0.1:1 refused, 127.0.0.1:2 timed out"
        );
        assert!(failed.tcp() && !failed.all_timed_out() && failed.source().is_none());
        let unknown = ConnectFailed::new("h.test".into(), ConnectAttempts::default(), true, None);
        assert_eq!(
            unknown.to_string(),
            "no address of h.test connected within the connect timeout"
        );
    }
}
