//! Who owns a request's state, and where a stage stands in the request it runs.
//!
//! The per-request state lives in the caller's `http::Extensions` ([`crate::record`]). A
//! caller may reuse one `Extensions` for several requests, and a request's future may be
//! dropped half-way, so that state must belong to one request and end with it. The first
//! middleware of this crate that runs a request (the whole stack, or one middleware used
//! alone) owns it: on entry it clears what an earlier request left behind
//! ([`clear_earlier_request`](crate::record::clear_earlier_request)). The middlewares it
//! polls see that the request is owned and leave its state alone.
//!
//! Ownership is found without allocating, through what this thread is polling
//! ([`Polling`]). reqwest-middleware hands the same `&mut Extensions` down the chain and
//! polls the inner middlewares inside the outer one's poll, so the address of the
//! request's `Extensions` identifies the request. For the duration of each poll of the
//! rest of the stack, the owner records that address as the request it polls as owner,
//! and puts back what it found when the poll returns. The retry middleware and the
//! transport step record their place the same way, for the placement checks
//! ([`misplaced`]): a retry inside a retry, or any stage inside the transport step, for
//! the same request.
//!
//! Only the innermost owner being polled needs to be known: a request's middlewares never
//! run inside another request's poll, except through a second request a user's middleware
//! makes, whose own owner then records itself (and puts the first back when its poll
//! returns). A record lasts only as long as its poll, so a dropped or finished request
//! leaves nothing behind.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Extensions;

use crate::error::ResilienceError;
use crate::misconfig::Misconfiguration;
use crate::record::{FailureKind, record_rejected_locally};
use crate::stage::RestOfStack;

/// The requests (by the address of their `Extensions`, 0 for none) whose rest of the
/// stack this thread is polling: as their owner, under a retry middleware, under the
/// transport step.
#[derive(Clone, Copy, Default)]
pub(crate) struct Polling {
    pub(crate) owner: usize,
    pub(crate) under_retry: usize,
    pub(crate) under_transport: usize,
}

thread_local! {
    static POLLING: Cell<Polling> = const {
        Cell::new(Polling { owner: 0, under_retry: 0, under_transport: 0 })
    };
}

/// What this thread is polling now.
pub(crate) fn polling() -> Polling {
    POLLING.try_with(Cell::get).unwrap_or_default()
}

/// The key of the request whose middlewares are handed `extensions`.
pub(crate) fn key(extensions: &Extensions) -> usize {
    std::ptr::from_ref::<Extensions>(extensions) as usize
}

/// A middleware's place in the request it runs: the request's key, and whether this
/// middleware owns it; see the [module docs](self).
#[derive(Clone, Copy)]
#[must_use]
pub(crate) struct Ownership {
    key: usize,
    owner: bool,
}

/// [`enter`] without the placement checks, for a stage that cannot be misplaced.
pub(crate) fn enter_unchecked(extensions: &mut Extensions) -> Ownership {
    enter_at(extensions, polling())
}

/// How every middleware of this crate starts: refused (with its `NotSent` evidence left)
/// when it stands where it cannot work ([`misplaced`]); else, when no middleware of this
/// crate outside it is running the request, it owns it, and what an earlier request left
/// in `extensions` is removed.
pub(crate) fn enter(
    extensions: &mut Extensions,
    middleware: &'static str,
    is_retry: bool,
    url: &reqwest::Url,
) -> Result<Ownership, reqwest_middleware::Error> {
    let now = polling();
    match misplaced(now, key(extensions), middleware, is_retry) {
        Some(m) => Err(refuse(extensions, m, url)),
        None => Ok(enter_at(extensions, now)),
    }
}

fn enter_at(extensions: &mut Extensions, now: Polling) -> Ownership {
    let key = key(extensions);
    if now.owner == key {
        return Ownership { key, owner: false };
    }
    crate::record::clear_earlier_request(extensions);
    Ownership { key, owner: true }
}

/// The ownership of a copy of a request with extensions of its own (a hedge), run by the
/// middleware that owns the request: nothing to clear, and owned.
pub(crate) fn owner_of_copy(extensions: &Extensions) -> Ownership {
    Ownership {
        key: key(extensions),
        owner: true,
    }
}

impl Ownership {
    /// The place of a stage nested inside the composed stack, which entered the request
    /// of `extensions` for it: not its owner.
    pub(crate) fn inside_stack(extensions: &Extensions) -> Ownership {
        Ownership {
            key: key(extensions),
            owner: false,
        }
    }

    /// The rest of the stack's future, `next`'s made by `make`, polled as the request's
    /// owner when this middleware owns it. When making it may do work of this crate
    /// ([`RestOfStack::MAKING_DOES_WORK`]: the composed stack checks its place as its
    /// future is made), it is made as it will be polled, so that work sees what a poll
    /// would.
    pub(crate) fn poll_as<N: RestOfStack, F: Future>(
        self,
        next: N,
        make: impl FnOnce(N) -> F,
    ) -> PolledAs<F> {
        PolledAs::make(self.key, self.owner, Role::None, next, make)
    }

    /// As [`poll_as`](Self::poll_as), for an inside already made (one whose making does no
    /// work of this crate: the composed stack's own stages).
    pub(crate) fn poll_made_as<F: Future>(self, inner: F) -> PolledAs<F> {
        PolledAs {
            inner,
            key: self.key,
            owner: self.owner,
            role: Role::None,
        }
    }

    /// As [`poll_as`](Self::poll_as), and polled as running under a retry middleware.
    pub(crate) fn poll_as_retry<N: RestOfStack, F: Future>(
        self,
        next: N,
        make: impl FnOnce(N) -> F,
    ) -> PolledAs<F> {
        PolledAs::make(self.key, self.owner, Role::Retry, next, make)
    }

    /// As [`poll_as_retry`](Self::poll_as_retry), for an inside already made.
    #[cfg(test)]
    pub(crate) fn poll_made_as_retry<F: Future>(self, inner: F) -> PolledAs<F> {
        PolledAs {
            inner,
            key: self.key,
            owner: self.owner,
            role: Role::Retry,
        }
    }
}

/// The rest of the stack's future inside the transport step, made and polled as such.
pub(crate) fn poll_as_transport<N: RestOfStack, F: Future>(
    key: usize,
    next: N,
    make: impl FnOnce(N) -> F,
) -> PolledAs<F> {
    PolledAs::make(key, false, Role::Transport, next, make)
}

/// As [`poll_as_transport`], for an inside already made.
#[cfg(test)]
pub(crate) fn poll_made_as_transport<F: Future>(key: usize, inner: F) -> PolledAs<F> {
    PolledAs {
        inner,
        key,
        owner: false,
        role: Role::Transport,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    None,
    Retry,
    Transport,
}

pin_project_lite::pin_project! {
    /// The future of the rest of the stack, polled as the owner of its request or in a
    /// role (under a retry, under the transport step): see [`Polling`].
    pub(crate) struct PolledAs<F> {
        #[pin]
        inner: F,
        key: usize,
        owner: bool,
        role: Role,
    }
}

impl<F> PolledAs<F> {
    /// Makes the inner future as it will be polled: as owner or in `role`.
    fn make<N: RestOfStack>(
        key: usize,
        owner: bool,
        role: Role,
        next: N,
        make: impl FnOnce(N) -> F,
    ) -> Self {
        let inner = if N::MAKING_DOES_WORK {
            let _restore = Polling::record(key, owner, role);
            make(next)
        } else {
            make(next)
        };
        PolledAs {
            inner,
            key,
            owner,
            role,
        }
    }
}

impl Polling {
    /// Records that this thread polls the request of `key` as its owner (`owner`) or in
    /// `role`, until the returned guard is dropped; `None` when there is nothing to record
    /// (a stage that neither owns the request nor has a role).
    fn record(key: usize, owner: bool, role: Role) -> Option<RestorePolling> {
        if !owner && role == Role::None {
            return None;
        }
        let before = polling();
        let mut now = before;
        if owner {
            now.owner = key;
        }
        match role {
            Role::None => {}
            Role::Retry => now.under_retry = key,
            Role::Transport => now.under_transport = key,
        }
        let _ = POLLING.try_with(|p| p.set(now));
        Some(RestorePolling(before))
    }
}

/// Puts back what this thread was polling before, even if the poll unwinds.
struct RestorePolling(Polling);

impl Drop for RestorePolling {
    fn drop(&mut self) {
        let _ = POLLING.try_with(|p| p.set(self.0));
    }
}

impl<F: Future> Future for PolledAs<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _restore = Polling::record(*this.key, *this.owner, *this.role);
        this.inner.poll(cx)
    }
}

/// What is wrong with a `middleware` (`is_retry`: a retry loop) starting for the request
/// of `key` while this thread polls `now`, if anything.
pub(crate) fn misplaced(
    now: Polling,
    key: usize,
    middleware: &'static str,
    is_retry: bool,
) -> Option<Misconfiguration> {
    if now.under_transport == key {
        Some(Misconfiguration::InsideTransportStep { middleware })
    } else if is_retry && now.under_retry == key {
        Some(Misconfiguration::NestedRetry)
    } else {
        None
    }
}

/// The error for a misconfiguration found before the request was sent, with its
/// `NotSent` evidence left where the middlewares outside look.
pub(crate) fn refuse(
    extensions: &mut Extensions,
    m: Misconfiguration,
    url: &reqwest::Url,
) -> reqwest_middleware::Error {
    let origin = crate::origin::Origin::cached(url);
    record_rejected_locally(extensions, FailureKind::Misconfigured, origin, None);
    reqwest_middleware::Error::middleware(ResilienceError::Misconfigured(m))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{AttemptHistory, RequestEvidence, Transmission};

    #[tokio::test]
    async fn the_first_middleware_owns_the_request_and_the_inner_ones_leave_its_state() {
        let mut ext = Extensions::new();
        let mut history = AttemptHistory::default();
        history.push(RequestEvidence::new(Transmission::NotSent, None, 1));
        history.insert_into(&mut ext);
        let outer = enter_unchecked(&mut ext);
        assert!(outer.owner);
        assert!(AttemptHistory::of(&ext).is_none(), "an earlier request's");
        AttemptHistory::default().insert_into(&mut ext);
        let ext_ref = &mut ext;
        outer
            .poll_made_as(async move {
                let inner = enter_unchecked(ext_ref);
                assert!(!inner.owner, "nested inside its owner");
                assert!(AttemptHistory::of(ext_ref).is_some(), "kept");
            })
            .await;
        // Its owner done, the next request owns the same extensions anew.
        assert!(enter_unchecked(&mut ext).owner);
        assert_eq!(polling().owner, 0);
    }
}

#[cfg(test)]
mod placement_tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;

    /// What is wrong with `middleware` starting here for the request of `extensions`, if
    /// anything.
    fn check(
        extensions: &Extensions,
        middleware: &'static str,
        is_retry: bool,
    ) -> Option<Misconfiguration> {
        misplaced(polling(), key(extensions), middleware, is_retry)
    }

    /// Polls `check` from inside a scope, as a middleware starting under a layer would.
    struct Probe<'a> {
        extensions: &'a Extensions,
        is_retry: bool,
    }

    impl Future for Probe<'_> {
        type Output = Option<Misconfiguration>;
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
            Poll::Ready(check(self.extensions, "Probe", self.is_retry))
        }
    }

    fn poll_once<F: Future + Unpin>(mut f: F) -> F::Output {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match Pin::new(&mut f).poll(&mut cx) {
            Poll::Ready(v) => v,
            Poll::Pending => unreachable!("the probe is ready at once"),
        }
    }

    #[test]
    fn only_the_same_requests_extensions_under_a_layer_are_misplaced() {
        let (ours, other) = (Extensions::new(), Extensions::new());
        let probe = |extensions, is_retry| Probe {
            extensions,
            is_retry,
        };
        // Under a transport step: any middleware of the same request is inside it.
        let poll_as_transport = |inner| poll_made_as_transport(key(&ours), inner);
        assert_eq!(
            poll_once(poll_as_transport(probe(&ours, false))),
            Some(Misconfiguration::InsideTransportStep {
                middleware: "Probe"
            })
        );
        // Another request polled meanwhile is not.
        assert_eq!(poll_once(poll_as_transport(probe(&other, true))), None);
        // Under a retry: only another retry is misplaced.
        let under_retry = |inner| owner_of_copy(&ours).poll_made_as_retry(inner);
        assert_eq!(poll_once(under_retry(probe(&ours, false))), None);
        assert_eq!(
            poll_once(under_retry(probe(&ours, true))),
            Some(Misconfiguration::NestedRetry)
        );
        // The slot is put back after each poll.
        assert_eq!(check(&ours, "Probe", true), None);
    }

    #[test]
    fn a_panic_inside_a_scope_puts_the_slot_back() {
        let ours = Extensions::new();
        struct Panics;
        impl Future for Panics {
            type Output = ();
            fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
                panic!("inside the scope")
            }
        }
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            poll_once(poll_made_as_transport(key(&ours), Panics))
        }));
        assert!(caught.is_err());
        assert_eq!(check(&ours, "Probe", false), None);
    }
}
