//! The record of the attempt being polled on this thread: what reqwest's hooks (the
//! redirect policy, the connector layers) learn while the transport step polls an
//! attempt, left where that step reads it when the attempt ends ([`Recording`]).
//!
//! The hooks run synchronously inside the attempt's poll (reqwest consults its redirect
//! policy there; hyper-util starts and drives a new connection there), so a per-thread
//! stack of records, pushed around each poll, reaches them without any handle passed
//! through reqwest. Outside a transport step (a connection made for the pool after its
//! request took another one, a client used apart from the stack) the stack is empty and
//! the hooks record nothing.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::ConnectAttempts;

/// What the hooks saw during one attempt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HopCount {
    /// How often the redirect policy of `redirect::recorded` was consulted: each time a
    /// `3xx` with a usable `Location` came back, so the first hop was answered as soon as
    /// this is 1.
    pub(crate) consulted: u32,
    /// The origin of the last `Location` the policy was asked about: where the hop after
    /// it went, if it was followed.
    pub(crate) last_location: Option<crate::origin::Origin>,
    /// A connection was started by a client of `redirect::recorded_client`: that client's
    /// redirects are recorded, whatever the transport step was told.
    pub(crate) proven: bool,
    /// The addresses the attempt's new connections tried (`crate::network`'s race), and
    /// when the first of them started.
    pub(crate) connect: Option<(Arc<ConnectAttempts>, tokio::time::Instant)>,
}

impl HopCount {
    /// The addresses the attempt's new connections tried.
    pub(crate) fn connect(&self) -> Option<Arc<ConnectAttempts>> {
        self.connect.as_ref().map(|(a, _)| a.clone())
    }
}

thread_local! {
    /// One record per attempt being polled on this thread, innermost last (an attempt
    /// may, through a user's middleware, run another client's attempt inside its poll).
    static HOPS: RefCell<Vec<HopCount>> = const { RefCell::new(Vec::new()) };
}

/// Applies `f` to the record of the attempt being polled on this thread, if any.
fn with_current(f: impl FnOnce(&mut HopCount)) {
    HOPS.with(|hops| {
        if let Some(current) = hops.borrow_mut().last_mut() {
            f(current);
        }
    });
}

/// The redirect policy was consulted about a hop to `location`.
pub(crate) fn note_hop(location: Option<crate::origin::Origin>) {
    with_current(|current| {
        current.consulted = current.consulted.saturating_add(1);
        current.last_location = location;
    });
}

/// A client of `redirect::recorded_client` started a connection.
pub(crate) fn note_proven() {
    with_current(|current| current.proven = true);
}

/// Leaves the addresses a new connection tried, started at `started`, in the record of
/// the attempt being polled on this thread (none: the connection is being made for the
/// pool, outside any attempt). A second connection of the same attempt (reqwest sending
/// the request again at once after a connection lost the address race) adds to the
/// first's record: an address tried again keeps its place and takes its new outcome, a
/// new one comes after, its start counted from the first connection's.
pub(crate) fn record_connect(attempts: ConnectAttempts, started: tokio::time::Instant) {
    with_current(|current| {
        let merged = match current.connect.take() {
            None => (attempts, started),
            Some((earlier, first)) => (merge(&earlier, attempts, started - first), first),
        };
        current.connect = Some((Arc::new(merged.0), merged.1));
    });
}

/// `earlier`'s addresses with `later`'s outcomes, then `later`'s new ones (their starts
/// `offset` later).
fn merge(
    earlier: &ConnectAttempts,
    later: ConnectAttempts,
    offset: std::time::Duration,
) -> ConnectAttempts {
    let mut tried = earlier.tried.clone();
    for mut t in later.tried {
        match tried.iter_mut().find(|e| e.address == t.address) {
            Some(e) => e.outcome = t.outcome,
            None => {
                t.started_after += offset;
                tried.push(t);
            }
        }
    }
    ConnectAttempts { tried }
}

/// Pops this attempt's record even if its poll unwinds.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        HOPS.with(|hops| {
            hops.borrow_mut().pop();
        });
    }
}

pin_project_lite::pin_project! {
    /// An attempt's future with a record installed around each of its polls (when it
    /// records: a client whose redirects are off has no hops to count).
    pub(crate) struct Recording<F> {
        #[pin]
        inner: F,
        hops: Option<HopCount>,
    }
}

impl<F> Recording<F> {
    /// `inner`, its hops recorded when `records`.
    pub(crate) fn new(inner: F, records: bool) -> Self {
        Recording {
            inner,
            hops: records.then(HopCount::default),
        }
    }
}

impl<F: Future> Future for Recording<F> {
    type Output = (F::Output, Option<HopCount>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(hops) = this.hops.as_mut() else {
            return this.inner.poll(cx).map(|output| (output, None));
        };
        HOPS.with(|stack| stack.borrow_mut().push(std::mem::take(hops)));
        let installed = Installed;
        let polled = this.inner.poll(cx);
        // The record back and off the stack in one access; the guard pops only on unwind.
        *hops = HOPS
            .with(|stack| stack.borrow_mut().pop())
            .unwrap_or_default();
        std::mem::forget(installed);
        polled.map(|output| (output, this.hops.take()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{AddressOutcome, AddressTried};
    use std::net::SocketAddr;
    use std::time::Duration;

    fn consult() {
        note_hop(None);
    }

    #[tokio::test]
    async fn each_attempt_counts_only_its_own_hops_across_polls_and_nesting() {
        let (output, hops) = Recording::new(
            async {
                consult();
                tokio::task::yield_now().await;
                consult();
                // A nested attempt (another client inside a user's middleware) has its own.
                let ((), inner) = Recording::new(async { consult() }, true).await;
                let inner = inner.expect("recorded");
                assert_eq!(inner.consulted, 1);
                7
            },
            true,
        )
        .await;
        assert_eq!((output, hops.map(|h| h.consulted)), (7, Some(2)));
        // Outside any attempt the record is empty, and consulting does nothing.
        consult();
        assert!(HOPS.with(|h| h.borrow().is_empty()));
    }

    fn tried(port: u16, outcome: AddressOutcome, ms: u64) -> AddressTried {
        AddressTried {
            address: SocketAddr::from(([127, 0, 0, 1], port)),
            outcome,
            started_after: Duration::from_millis(ms),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_connection_of_one_attempt_adds_to_the_first_ones_record() {
        let ((), hops) = Recording::new(
            async {
                let first = tokio::time::Instant::now();
                record_connect(
                    ConnectAttempts {
                        tried: vec![
                            tried(1, AddressOutcome::Abandoned, 0),
                            tried(2, AddressOutcome::Abandoned, 250),
                        ],
                    },
                    first,
                );
                tokio::time::advance(Duration::from_millis(300)).await;
                record_connect(
                    ConnectAttempts {
                        tried: vec![
                            tried(2, AddressOutcome::Connected, 0),
                            tried(3, AddressOutcome::Abandoned, 250),
                        ],
                    },
                    tokio::time::Instant::now(),
                );
            },
            true,
        )
        .await;
        let connect = hops.and_then(|h| h.connect()).expect("recorded");
        assert_eq!(
            connect.tried,
            [
                tried(1, AddressOutcome::Abandoned, 0),
                tried(2, AddressOutcome::Connected, 250),
                tried(3, AddressOutcome::Abandoned, 550),
            ]
        );
        // Outside an attempt nothing is kept.
        record_connect(ConnectAttempts::default(), tokio::time::Instant::now());
        assert!(HOPS.with(|h| h.borrow().is_empty()));
    }
}
