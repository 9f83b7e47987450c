//! The per-request state's one owner and one lifetime.
//!
//! The crate keeps what it learns about a logical request in the caller's
//! `http::Extensions`: the [`AttemptHistory`], the last [`RequestEvidence`], the
//! [`RetryOutcome`], a breaker's [`RetryIn`], a [`Deadline`] the retry middleware hands
//! inward, and an attempt's own cut ([`AttemptScope`]). A caller may reuse one `Extensions`
//! for several requests, and a request's future may be dropped half-way, so that state must
//! belong to one request and end with it. The first middleware of this crate that runs a
//! request (whichever it is: the whole stack, or one middleware used alone) owns it: on
//! entry it clears what an earlier request left behind, and while it polls the middlewares
//! inside it, they see that a request is already owned and leave its state alone.
//!
//! Ownership is found without allocating: an owner marks the address of the request's
//! `Extensions` as the one being run on this thread for the duration of each poll of the
//! rest of the stack (the retry middleware and the transport step mark their place the same
//! way, for the [misconfiguration](crate::misconfig) checks) (reqwest-middleware hands the
//! same `&mut Extensions` down the chain, and polls the inner middlewares inside the outer
//! one's poll), and puts back the mark it found afterwards. Only the innermost owner being
//! polled needs to be known: a request's middlewares never run inside another request's
//! poll, except through a second request a user's middleware makes, whose own owner then
//! marks it (and unmarks it when its poll returns). A mark lasts only as long as its
//! owner's poll, so a dropped or finished request leaves nothing behind.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Extensions;

use crate::error::ResilienceError;
use crate::misconfig::Misconfiguration;
use crate::record::{FailureKind, record_rejected_locally};
use crate::stage::Inner;

/// The requests (by the address of their `Extensions`, 0 for none) that this thread is
/// polling the rest of, as their owner, under a retry middleware, and under the transport
/// step. The misconfiguration checks read the last two
/// ([`misconfig`](crate::misconfig)).
#[derive(Clone, Copy, Default)]
pub(crate) struct Active {
    pub(crate) owner: usize,
    pub(crate) retry: usize,
    pub(crate) transport: usize,
}

thread_local! {
    static ACTIVE: Cell<Active> = const {
        Cell::new(Active { owner: 0, retry: 0, transport: 0 })
    };
}

/// What this thread is polling now.
pub(crate) fn active() -> Active {
    ACTIVE.try_with(Cell::get).unwrap_or_default()
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

/// Called first by every middleware of this crate. When no middleware of this crate
/// outside it is running the request, this one owns it, and what an earlier request left
/// in `extensions` is removed.
pub(crate) fn begin(extensions: &mut Extensions) -> Ownership {
    begin_at(extensions, active())
}

/// How a middleware of this crate starts: refused (with its `NotSent` evidence left) when
/// it stands where it cannot work ([`misconfig`](crate::misconfig)), else [`begin`], on
/// one read of the marks.
pub(crate) fn enter(
    extensions: &mut Extensions,
    middleware: &'static str,
    is_retry: bool,
    url: &reqwest::Url,
) -> Result<Ownership, reqwest_middleware::Error> {
    let active = active();
    match misplaced(active, key(extensions), middleware, is_retry) {
        Some(m) => Err(refuse(extensions, m, url)),
        None => Ok(begin_at(extensions, active)),
    }
}

fn begin_at(extensions: &mut Extensions, active: Active) -> Ownership {
    let key = key(extensions);
    if active.owner == key {
        return Ownership { key, owner: false };
    }
    crate::record::clear_earlier_request(extensions);
    Ownership { key, owner: true }
}

/// The ownership of a copy of a request with extensions of its own (a hedge), run by the
/// middleware that owns the request: nothing to clear, and owned.
pub(crate) fn claim(extensions: &Extensions) -> Ownership {
    Ownership {
        key: key(extensions),
        owner: true,
    }
}

impl Ownership {
    /// The place of a stage nested inside the composed stack, which entered the request
    /// of `extensions` for it: not its owner.
    pub(crate) fn nested_in(extensions: &Extensions) -> Ownership {
        Ownership {
            key: key(extensions),
            owner: false,
        }
    }

    /// The rest of the stack's future, `next`'s made by `make`, polled with the request
    /// marked as owned when this middleware is its owner. When making it may do work of
    /// this crate ([`Inner::MAKES_WORK`]: the composed stack checks its place as its
    /// future is made), the marks are set while `make` runs too, so that work sees the
    /// same marks as a poll would.
    pub(crate) fn wrap<N: Inner, F: Future>(self, next: N, make: impl FnOnce(N) -> F) -> Marked<F> {
        Marked::make(self.key, self.owner, Role::None, next, make)
    }

    /// As [`wrap`](Self::wrap), for an inside already made (one whose making does no
    /// work of this crate: the composed stack's own stages).
    pub(crate) fn wrap_made<F: Future>(self, inner: F) -> Marked<F> {
        Marked {
            inner,
            key: self.key,
            owner: self.owner,
            role: Role::None,
        }
    }

    /// As [`wrap`](Self::wrap), and marked as running under a retry middleware.
    pub(crate) fn wrap_retry<N: Inner, F: Future>(
        self,
        next: N,
        make: impl FnOnce(N) -> F,
    ) -> Marked<F> {
        Marked::make(self.key, self.owner, Role::Retry, next, make)
    }

    /// As [`wrap_retry`](Self::wrap_retry), for an inside already made.
    #[cfg(test)]
    pub(crate) fn wrap_retry_made<F: Future>(self, inner: F) -> Marked<F> {
        Marked {
            inner,
            key: self.key,
            owner: self.owner,
            role: Role::Retry,
        }
    }
}

/// The rest of the stack's future inside the transport step, made and polled marked as
/// such.
pub(crate) fn under_transport<N: Inner, F: Future>(
    key: usize,
    next: N,
    make: impl FnOnce(N) -> F,
) -> Marked<F> {
    Marked::make(key, false, Role::Transport, next, make)
}

/// As [`under_transport`], for an inside already made.
#[cfg(test)]
pub(crate) fn under_transport_made<F: Future>(key: usize, inner: F) -> Marked<F> {
    Marked {
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
    /// A future of the middlewares inside one of this crate's, polled with its marks set.
    pub(crate) struct Marked<F> {
        #[pin]
        inner: F,
        key: usize,
        owner: bool,
        role: Role,
    }
}

impl<F> Marked<F> {
    /// Makes the inner future under the marks it will be polled with.
    fn make<N: Inner>(
        key: usize,
        owner: bool,
        role: Role,
        next: N,
        make: impl FnOnce(N) -> F,
    ) -> Self {
        let inner = if N::MAKES_WORK {
            let _restore = Marks::set(key, owner, role);
            make(next)
        } else {
            make(next)
        };
        Marked {
            inner,
            key,
            owner,
            role,
        }
    }
}

/// Setting the marks of one of this crate's middlewares for the duration of a call.
struct Marks;

impl Marks {
    /// Sets them, if this middleware has any (an owner, or a role), and returns what puts
    /// the earlier ones back.
    fn set(key: usize, owner: bool, role: Role) -> Option<Restore> {
        if !owner && role == Role::None {
            return None;
        }
        let before = active();
        let mut now = before;
        if owner {
            now.owner = key;
        }
        match role {
            Role::None => {}
            Role::Retry => now.retry = key,
            Role::Transport => now.transport = key,
        }
        let _ = ACTIVE.try_with(|a| a.set(now));
        Some(Restore(before))
    }
}

/// Puts back the marks found before a poll, even if the poll unwinds.
struct Restore(Active);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = ACTIVE.try_with(|a| a.set(self.0));
    }
}

impl<F: Future> Future for Marked<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _restore = Marks::set(*this.key, *this.owner, *this.role);
        this.inner.poll(cx)
    }
}

/// What is wrong with a `middleware` (`is_retry`: a retry loop) starting, for the request
/// of `key`, under the marks `active`, if anything.
pub(crate) fn misplaced(
    active: Active,
    key: usize,
    middleware: &'static str,
    is_retry: bool,
) -> Option<Misconfiguration> {
    if active.transport == key {
        Some(Misconfiguration::InsideTransportStep { middleware })
    } else if is_retry && active.retry == key {
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
        ext.insert(history);
        let outer = begin(&mut ext);
        assert!(outer.owner);
        assert!(
            ext.get::<AttemptHistory>().is_none(),
            "an earlier request's"
        );
        ext.insert(AttemptHistory::default());
        let ext_ref = &mut ext;
        outer
            .wrap_made(async move {
                let inner = begin(ext_ref);
                assert!(!inner.owner, "nested inside its owner");
                assert!(ext_ref.get::<AttemptHistory>().is_some(), "kept");
            })
            .await;
        // Its owner done, the next request owns the same extensions anew.
        assert!(begin(&mut ext).owner);
        assert_eq!(active().owner, 0);
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
        misplaced(active(), key(extensions), middleware, is_retry)
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
        let under_transport = |inner| under_transport_made(key(&ours), inner);
        assert_eq!(
            poll_once(under_transport(probe(&ours, false))),
            Some(Misconfiguration::InsideTransportStep {
                middleware: "Probe"
            })
        );
        // Another request polled meanwhile is not.
        assert_eq!(poll_once(under_transport(probe(&other, true))), None);
        // Under a retry: only another retry is misplaced.
        let under_retry = |inner| claim(&ours).wrap_retry_made(inner);
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
            poll_once(under_transport_made(key(&ours), Panics))
        }));
        assert!(caught.is_err());
        assert_eq!(check(&ours, "Probe", false), None);
    }
}
