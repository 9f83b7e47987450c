//! What the connector saw of one new connection: every address it tried, in the order it
//! started them, with each one's outcome ([`ConnectAttempts`], in
//! [`RequestEvidence::connect`](super::RequestEvidence::connect)).

use std::net::SocketAddr;
use std::time::Duration;

/// How one address of a connection attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AddressOutcome {
    /// The connection to this address was made and carried the attempt.
    Connected,
    /// The address answered the SYN with a reset (`ECONNREFUSED`): nothing listens there.
    Refused,
    /// No answer within the connect timeout per address (a dropped SYN, a dead path).
    TimedOut,
    /// The network or the host was unreachable (`ENETUNREACH`, `EHOSTUNREACH`, an ICMP
    /// error), or the address cannot be reached from this machine (`EADDRNOTAVAIL`).
    Unreachable,
    /// The connection was made but its TLS handshake (or a proxy's tunnel) failed.
    Handshake,
    /// Another failure of this address.
    Failed,
    /// The address accepted a connection first, but the race's connection to it was a
    /// probe that could not carry the request: reqwest sent the request again at once on
    /// a new connection, which tries this address first. Seen only when that second
    /// connection was not made (a request body that cannot be copied); otherwise the
    /// second connection's outcome replaces it.
    Answered,
    /// Not finished: another address connected first, so this one was abandoned.
    Abandoned,
}

/// One address of a connection attempt and how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressTried {
    /// The address.
    pub address: SocketAddr,
    /// How it ended.
    pub outcome: AddressOutcome,
    /// From the start of the connection attempt (the first address) to this address's
    /// start: `Duration::ZERO` for the first, the attempt delay for the second, …
    pub started_after: Duration,
}

/// Every address a new connection tried (RFC 8305: one after another, a new one each
/// attempt delay, families interleaved, an address that failed lately last).
///
/// Present in [`RequestEvidence::connect`](super::RequestEvidence::connect) when the
/// attempt opened a new connection through a client built by
/// [`Resilience::build_from`](crate::Resilience::build_from) or
/// [`redirect::recorded_client`](crate::redirect::recorded_client); `None` when it reused a
/// pooled one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnectAttempts {
    /// Every address started, in order.
    pub tried: Vec<AddressTried>,
}

impl ConnectAttempts {
    /// The address that carried the attempt, if one connected.
    pub fn used(&self) -> Option<SocketAddr> {
        self.tried
            .iter()
            .find(|t| t.outcome == AddressOutcome::Connected)
            .map(|t| t.address)
    }

    /// Whether every address tried timed out: the host (or the path to it) drops what is
    /// sent to it.
    pub fn all_timed_out(&self) -> bool {
        !self.tried.is_empty()
            && self
                .tried
                .iter()
                .all(|t| t.outcome == AddressOutcome::TimedOut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tried(port: u16, outcome: AddressOutcome) -> AddressTried {
        AddressTried {
            address: SocketAddr::from(([127, 0, 0, 1], port)),
            outcome,
            started_after: Duration::ZERO,
        }
    }

    #[test]
    fn the_used_address_is_the_one_that_connected() {
        let a = ConnectAttempts {
            tried: vec![
                tried(1, AddressOutcome::TimedOut),
                tried(2, AddressOutcome::Connected),
            ],
        };
        assert_eq!(a.used(), Some(SocketAddr::from(([127, 0, 0, 1], 2))));
        assert!(!a.all_timed_out());
        let dead = ConnectAttempts {
            tried: vec![
                tried(1, AddressOutcome::TimedOut),
                tried(2, AddressOutcome::TimedOut),
            ],
        };
        assert_eq!(dead.used(), None);
        assert!(dead.all_timed_out());
        assert!(!ConnectAttempts::default().all_timed_out());
    }
}
