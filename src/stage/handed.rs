//! [`HandedRequest`]: the request as the stages hand it inward, and the [`RequestSlot`] that owns it.

use std::ops::{Deref, DerefMut};

use reqwest::Request;

/// Where a request lives while the stages inside work on it: in the future of whoever
/// owns the request (an attempt's box, a middleware's own future, the composed stack's
/// request future), once. The stages inside get a [`HandedRequest`] on it.
pub(crate) struct RequestSlot(Option<Request>);

impl RequestSlot {
    pub(crate) fn new(req: Request) -> Self {
        RequestSlot(Some(req))
    }

    /// The handle the stages inside work on. Called once per slot: a slot whose request
    /// was taken hands on nothing.
    pub(crate) fn hand(&mut self) -> HandedRequest<'_> {
        HandedRequest(&mut self.0)
    }
}

/// The request as a stage hands it inward: a handle on its [`RequestSlot`], so that each
/// stage's future holds a pointer instead of its own copy of the 264-byte request (stage
/// cost rule 3). Read and changed through `Deref`; taken whole, to be sent, by the
/// innermost part ([`take`](Self::take)).
pub(crate) struct HandedRequest<'a>(&'a mut Option<Request>);

/// The slot is emptied only by [`HandedRequest::take`], which consumes the one handle on it.
const TAKEN: &str = "a handed request is taken once, by the handle that is consumed then";

impl HandedRequest<'_> {
    /// Takes the request out of its slot, to send it.
    pub(crate) fn take(self) -> Request {
        self.0.take().unwrap_or_else(|| unreachable!("{TAKEN}"))
    }
}

impl Deref for HandedRequest<'_> {
    type Target = Request;

    fn deref(&self) -> &Request {
        self.0.as_ref().unwrap_or_else(|| unreachable!("{TAKEN}"))
    }
}

impl DerefMut for HandedRequest<'_> {
    fn deref_mut(&mut self) -> &mut Request {
        self.0.as_mut().unwrap_or_else(|| unreachable!("{TAKEN}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handed_request_is_read_changed_and_taken_from_its_one_slot() {
        let url = reqwest::Url::parse("http://127.0.0.1:9/a").unwrap();
        let mut slot = RequestSlot::new(Request::new(reqwest::Method::GET, url));
        let mut handed = slot.hand();
        assert_eq!(handed.url().path(), "/a");
        handed.url_mut().set_path("/b");
        let req = handed.take();
        assert_eq!(req.url().path(), "/b");
        assert!(slot.0.is_none(), "the slot is empty once taken");
        assert_eq!(std::mem::size_of::<HandedRequest<'_>>(), 8);
    }
}
