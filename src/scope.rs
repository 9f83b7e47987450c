//! The per-request state's one owner and one lifetime.
//!
//! The crate keeps what it learns about a logical request in the caller's
//! `http::Extensions`: the [`AttemptHistory`], the last [`RequestEvidence`], the
//! [`RetryOutcome`], a breaker's [`RetryIn`], a [`Deadline`] the retry middleware hands
//! inward, and an attempt's own cut ([`AttemptScope`]). A caller may reuse one `Extensions` for several requests, and a request's
//! future may be dropped half-way, so that state must belong to one request and end with
//! it. The first middleware of this crate that runs a request (whichever it is: the whole
//! stack, or one middleware used alone) owns it: on entry it clears what an earlier
//! request left behind, and while it polls the middlewares inside it, they see that a
//! request is already owned and leave its state alone.
//!
//! Ownership is found without allocating: an owner marks the address of the request's
//! `Extensions` as the one being run on this thread for the duration of each poll of the
//! rest of the stack (the retry middleware and the transport step mark their place the
//! same way, for the [misconfiguration](crate::misconfig) checks) (reqwest-middleware hands the same `&mut Extensions` down the chain,
//! and polls the inner middlewares inside the outer one's poll), and puts back the mark it
//! found afterwards. Only the innermost owner being polled needs to be known: a request's
//! middlewares never run inside another request's poll, except through a second request a
//! user's middleware makes, whose own owner then marks it (and unmarks it when its poll
//! returns). A mark lasts only as long as its owner's poll, so a dropped or finished
//! request leaves nothing behind.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Extensions;

use crate::breaker::{Deadline, RetryIn};
use crate::evidence::{AttemptHistory, RequestEvidence};
use crate::retry::{AttemptScope, RetryOutcome};

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

/// Marks a [`Deadline`] a middleware of this crate put in the caller's extensions for the
/// middlewares inside it (the retry middleware's `total_deadline`), so that one left
/// behind by a dropped request is recognised and removed by the next request's owner.
#[derive(Clone, Copy)]
pub(crate) struct HandedOn(pub(crate) Deadline);

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
    layer: Option<crate::misconfig::Layer>,
    url: &reqwest::Url,
) -> Result<Ownership, reqwest_middleware::Error> {
    let active = active();
    match crate::misconfig::misplaced(active, key(extensions), middleware, layer) {
        Some(m) => Err(crate::misconfig::refuse(extensions, m, url)),
        None => Ok(begin_at(extensions, active)),
    }
}

fn begin_at(extensions: &mut Extensions, active: Active) -> Ownership {
    let key = key(extensions);
    if active.owner == key {
        return Ownership { key, owner: false };
    }
    // A fresh request's extensions (every `send()`) hold nothing to clear.
    if !extensions.is_empty() {
        if let Some(HandedOn(stale)) = extensions.remove::<HandedOn>()
            && extensions.get::<Deadline>() == Some(&stale)
        {
            extensions.remove::<Deadline>();
        }
        extensions.remove::<AttemptHistory>();
        extensions.remove::<RequestEvidence>();
        extensions.remove::<RetryOutcome>();
        extensions.remove::<RetryIn>();
        // An attempt's own cut, left by a retry whose attempt was dropped with no breaker
        // inside to take it.
        extensions.remove::<AttemptScope>();
    }
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
    /// The rest of the stack's future, polled with the request marked as owned when this
    /// middleware is its owner.
    pub(crate) fn wrap<F: Future>(self, inner: F) -> Marked<F> {
        Marked::new(inner, self.key, self.owner, Role::None)
    }

    /// As [`wrap`](Self::wrap), and marked as running under a retry middleware.
    pub(crate) fn wrap_retry<F: Future>(self, inner: F) -> Marked<F> {
        Marked::new(inner, self.key, self.owner, Role::Retry)
    }
}

/// The rest of the stack's future inside the transport step, marked as such.
pub(crate) fn under_transport<F: Future>(key: usize, inner: F) -> Marked<F> {
    Marked::new(inner, key, false, Role::Transport)
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
    fn new(inner: F, key: usize, owner: bool, role: Role) -> Self {
        Marked {
            inner,
            key,
            owner,
            role,
        }
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
        if !*this.owner && *this.role == Role::None {
            return this.inner.poll(cx);
        }
        let before = active();
        let mut now = before;
        if *this.owner {
            now.owner = *this.key;
        }
        match *this.role {
            Role::None => {}
            Role::Retry => now.retry = *this.key,
            Role::Transport => now.transport = *this.key,
        }
        let _ = ACTIVE.try_with(|a| a.set(now));
        let _restore = Restore(before);
        this.inner.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::Transmission;

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
            .wrap(async move {
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
