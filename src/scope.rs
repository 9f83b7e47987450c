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
//! Ownership is found without allocating: an owner puts the address of the request's
//! `Extensions` on a per-thread list for the duration of each poll of the rest of the
//! stack (reqwest-middleware hands the same `&mut Extensions` down the chain, and polls
//! the inner middlewares inside the outer one's poll). An address can only be on the list
//! while its owner is being polled, so a dropped or finished request leaves nothing there.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Extensions;

use crate::breaker::{Deadline, RetryIn};
use crate::evidence::{AttemptHistory, RequestEvidence};
use crate::retry::RetryOutcome;

thread_local! {
    /// The `Extensions` of the requests whose owners are being polled on this thread.
    static OWNED: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
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
    if OWNED.with(|owned| owned.borrow().contains(&key)) {
        return Ownership(None);
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

/// Takes the request off the list even if its poll unwinds.
struct Marked;

impl Drop for Marked {
    fn drop(&mut self) {
        OWNED.with(|owned| {
            owned.borrow_mut().pop();
        });
    }
}

impl<F: Future> Future for Owned<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let Some(key) = *this.key else {
            return this.inner.poll(cx);
        };
        OWNED.with(|owned| owned.borrow_mut().push(key));
        let _marked = Marked;
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
        assert!(OWNED.with(|o| o.borrow().is_empty()));
    }
}
