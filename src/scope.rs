//! The per-request state's one owner and one lifetime.
//!
//! The crate keeps what it learns about a logical request in the caller's
//! `http::Extensions`: the [`AttemptHistory`], the last [`RequestEvidence`], the
//! [`RetryOutcome`], a breaker's [`RetryIn`], and a [`Deadline`] the retry middleware hands
//! inward. A caller may reuse one `Extensions` for several requests, and a request's
//! future may be dropped half-way, so that state must belong to one request and end with
//! it. The first middleware of this crate that runs a request (whichever it is: the whole
//! stack, or one middleware used alone) owns it: on entry it clears what an earlier
//! request left behind, and while it polls the middlewares inside it, they see that a
//! request is already owned and leave its state alone.
//!
//! Ownership is found without allocating: an owner marks the address of the request's
//! `Extensions` as the one being run on this thread for the duration of each poll of the
//! rest of the stack (reqwest-middleware hands the same `&mut Extensions` down the chain,
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
use crate::retry::RetryOutcome;

thread_local! {
    /// The address of the `Extensions` whose owner is being polled on this thread, 0 for
    /// none.
    static OWNED: Cell<usize> = const { Cell::new(0) };
}

/// Marks a [`Deadline`] a middleware of this crate put in the caller's extensions for the
/// middlewares inside it (the retry middleware's `total_deadline`), so that one left
/// behind by a dropped request is recognised and removed by the next request's owner.
#[derive(Clone, Copy)]
pub(crate) struct HandedOn(pub(crate) Deadline);

/// Whether a middleware owns the request it runs; see the [module docs](self).
#[derive(Clone, Copy)]
#[must_use]
pub(crate) struct Ownership(Option<usize>);

/// Called first by every middleware of this crate. When no middleware of this crate
/// outside it is running the request, this one owns it, and what an earlier request left
/// in `extensions` is removed.
pub(crate) fn begin(extensions: &mut Extensions) -> Ownership {
    let key = std::ptr::from_ref::<Extensions>(extensions) as usize;
    if OWNED.get() == key {
        return Ownership(None);
    }
    // A fresh request's extensions (every `send()`) hold nothing to clear.
    if extensions.is_empty() {
        return Ownership(Some(key));
    }
    if let Some(HandedOn(stale)) = extensions.remove::<HandedOn>()
        && extensions.get::<Deadline>() == Some(&stale)
    {
        extensions.remove::<Deadline>();
    }
    extensions.remove::<AttemptHistory>();
    extensions.remove::<RequestEvidence>();
    extensions.remove::<RetryOutcome>();
    extensions.remove::<RetryIn>();
    Ownership(Some(key))
}

impl Ownership {
    /// The rest of the stack's future, polled with this request marked as owned when this
    /// middleware is its owner.
    pub(crate) fn wrap<F: Future>(self, inner: F) -> Owned<F> {
        Owned { inner, key: self.0 }
    }
}

pin_project_lite::pin_project! {
    /// A future of the middlewares inside an owner.
    pub(crate) struct Owned<F> {
        #[pin]
        inner: F,
        key: Option<usize>,
    }
}

/// Puts back the mark found before a poll, even if the poll unwinds.
struct Restore(usize);

impl Drop for Restore {
    fn drop(&mut self) {
        OWNED.set(self.0);
    }
}

impl<F: Future> Future for Owned<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let Some(key) = *this.key else {
            return this.inner.poll(cx);
        };
        let _restore = Restore(OWNED.replace(key));
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
        assert!(outer.0.is_some());
        assert!(
            ext.get::<AttemptHistory>().is_none(),
            "an earlier request's"
        );
        ext.insert(AttemptHistory::default());
        let ext_ref = &mut ext;
        outer
            .wrap(async move {
                let inner = begin(ext_ref);
                assert!(inner.0.is_none(), "nested inside its owner");
                assert!(ext_ref.get::<AttemptHistory>().is_some(), "kept");
            })
            .await;
        // Its owner done, the next request owns the same extensions anew.
        assert!(begin(&mut ext).0.is_some());
        assert_eq!(OWNED.get(), 0);
    }
}
