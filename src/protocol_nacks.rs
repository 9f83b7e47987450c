//! reqwest's own replays of HTTP/2 protocol NACKs, kept where they are harmless.
//!
//! reqwest 0.13's `Client` sends again, below every middleware and by default, a request
//! whose HTTP/2 stream failed with the server's `REFUSED_STREAM` or `GOAWAY(NO_ERROR)`
//! (twice at most, any method). A refused stream was not processed (RFC 9113 §8.7), but
//! hyper can fail with that `GOAWAY` a stream the server had already taken (hyper#2500), so
//! sending it again is harmless only for a request harmless to repeat: reqwest's default
//! can run a `POST` twice where no evidence sees it.

use std::error::Error as StdError;

/// The retries of a client this crate builds without a retry part of its own (a stack
/// with one turns reqwest's off: `reqwest::retry::never()`), and of
/// [`recorded_client`](crate::redirect::recorded_client): reqwest's replays of a refused
/// stream for any method, of a `GOAWAY`'d stream only for an idempotent method, at most
/// twice, with no budget (reqwest's default has none either). An `Idempotency-Key`
/// header, which reqwest's classifier cannot see, does not count here: a retry part sends
/// such a `POST` again itself.
///
/// Both also replay, for any method, a request whose new connection gave way to another
/// address of the host that answered first ([`crate::network`]'s race): it was not sent.
pub(crate) fn harmless_replays() -> reqwest::retry::Builder {
    reqwest::retry::for_host(AnyHost)
        .no_budget()
        .max_retries_per_request(2)
        .classify_fn(|attempt| {
            let harmless = attempt.error().is_some_and(|e| {
                raced(e)
                    || nack(e).is_some_and(|nack| {
                        nack == Nack::RefusedStream
                            || crate::record::idempotent_method(attempt.method())
                    })
            });
            if harmless {
                attempt.retryable()
            } else {
                attempt.success()
            }
        })
}

/// The replays of a client whose stack retries by itself (instead of reqwest's
/// `retry::never()`): only a request whose connection gave way to another address
/// ([`crate::network`]'s race), at once, for any method: it was not sent.
pub(crate) fn race_replays() -> reqwest::retry::Builder {
    reqwest::retry::for_host(AnyHost)
        .no_budget()
        .max_retries_per_request(2)
        .classify_fn(|attempt| {
            if attempt.error().is_some_and(raced) {
                attempt.retryable()
            } else {
                attempt.success()
            }
        })
}

/// Whether `err` is a connection that gave way to another address of its host.
fn raced(err: &(dyn StdError + 'static)) -> bool {
    crate::chain::find::<crate::network::AddressRaced>(err).is_some()
}

/// The protocol NACKs reqwest would replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nack {
    /// `RST_STREAM(REFUSED_STREAM)` from the server: not processed.
    RefusedStream,
    /// `GOAWAY(NO_ERROR)` from the server: no proof either way through hyper.
    GoAway,
}

/// The NACK an attempt's error carries, as reqwest tells them (`is_retryable_error`): an
/// h2 error sent by the server.
fn nack(err: &(dyn StdError + 'static)) -> Option<Nack> {
    let h2 = crate::chain::find::<h2::Error>(err)?;
    let reason = h2.reason();
    if h2.is_reset() && h2.is_remote() && reason == Some(h2::Reason::REFUSED_STREAM) {
        Some(Nack::RefusedStream)
    } else if h2.is_go_away() && h2.is_remote() && reason == Some(h2::Reason::NO_ERROR) {
        Some(Nack::GoAway)
    } else {
        None
    }
}

/// A request scope of every host: reqwest's `for_host` compares the request's host with
/// it.
struct AnyHost;

impl PartialEq<&str> for AnyHost {
    fn eq(&self, _host: &&str) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_errors_sent_by_the_server_are_nacks() {
        let local = h2::Error::from(h2::Reason::REFUSED_STREAM);
        assert_eq!(nack(&local), None, "a reason of our own side");
        let io = std::io::Error::other("reset");
        assert_eq!(nack(&io), None);
        assert!(AnyHost == "example.test" && AnyHost == "");
    }
}
