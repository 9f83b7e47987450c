//! Redirects: what the transport step can prove about the hops reqwest followed.
//!
//! reqwest follows redirects *inside* `Client::execute`, below every middleware, under the
//! client's own [`reqwest::redirect::Policy`] (by default up to 10 hops). One attempt of
//! this crate can therefore be several requests on the wire: `POST /pay → 303 → GET
//! /receipt`. Once a redirect was followed, the request the transport step was handed was
//! received and answered, whatever the later hops did, so it must never be sent again
//! unless that is harmless. What the transport step can see of the hops:
//!
//! | outcome | what proves a redirect | what cannot be told |
//! |---|---|---|
//! | a response | `Response::url()` differs from the request's URL | a chain that ends at the URL it started from (`POST /orders → 303 → GET /orders`) |
//! | an error | nothing: reqwest 0.13 stamps the *first* URL on a later hop's transport error, so a refused connect on hop 2 reads exactly like one on hop 1 | whether any hop before the failing one was answered |
//!
//! [`ClientRedirects`] tells the transport step which case it is in:
//!
//! - [`ClientRedirects::Unobserved`] (the default, for any client): a response is judged by
//!   its URL; an error may come from a later hop, so no `NotSent` is claimed for it
//!   ([`Redirects::Unknown`](crate::Redirects::Unknown)). A refused connect is still
//!   retried for an idempotent request; a `POST` is not, because its first hop may have
//!   been processed.
//! - [`ClientRedirects::Recorded`]: the client was built with [`recorded`]`(policy)`. Every
//!   hop is then seen exactly (a redirect back to the same URL too), and an error with no
//!   hop before it is proven to be the first hop's.
//! - [`ClientRedirects::Off`]: the client does not follow redirects
//!   (`reqwest::redirect::Policy::none()`): every outcome is the first hop's.
//!
//! A client built by [`recorded_client`] needs no declaration: each connection it opens
//! during an attempt proves to the transport step that its hops are recorded, so that
//! attempt is judged as under `Recorded` (for a client built apart from its middlewares,
//! a list handed to `ClientWithMiddleware::new` later).
//!
//! [`Resilience::build_from`](crate::Resilience::build_from) builds the client with
//! [`recorded`] around the policy given to it and declares `Recorded`. A declaration that
//! a response proves false (one from another URL than the request's, with no hop recorded
//! under `Recorded`, at all under `Off`) turns that transport step `Unobserved` for the
//! rest of its life and is reported once as a
//! [`Misconfiguration`](crate::misconfig::Misconfiguration). An error alone cannot prove it
//! (it carries the first URL), so until such a response, a false declaration is believed.
//!
//! ```
//! use reqwest_resilience::Resilience;
//! use reqwest_resilience::redirect::{self, ClientRedirects};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let client = reqwest::Client::builder()
//!     .redirect(redirect::recorded(reqwest::redirect::Policy::default()))
//!     .build()?;
//! let client = Resilience::new()
//!     .client_redirects(ClientRedirects::Recorded)
//!     .build(client)?;
//! # drop(client); Ok(()) }
//! ```

use std::task::{Context, Poll};

/// What the transport step may assume about the redirects the `reqwest::Client` below it
/// follows. See the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ClientRedirects {
    /// Nothing is known about the client's redirect policy (reqwest's default follows up
    /// to 10 hops): responses are judged by their URL, errors prove nothing about earlier
    /// hops.
    #[default]
    Unobserved,
    /// The client's policy is wrapped in [`recorded`]: every hop is reported.
    Recorded,
    /// The client follows no redirects (`reqwest::redirect::Policy::none()`).
    Off,
}

/// A transport step's [`ClientRedirects`] declaration, and whether a response proved it
/// false: then the step treats its client as [`ClientRedirects::Unobserved`] for the rest
/// of its life. Clones share the proof (one flag per declaration, allocated only for a
/// declaration that can be proven false); reading it is one relaxed atomic load.
#[derive(Debug, Clone, Default)]
pub(crate) struct Declared {
    declared: ClientRedirects,
    disproved: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl Declared {
    pub(crate) fn new(declared: ClientRedirects) -> Self {
        let disproved = (declared != ClientRedirects::Unobserved).then(Default::default);
        Declared {
            declared,
            disproved,
        }
    }

    /// What may be assumed now: the declaration, or `Unobserved` once it was proven false.
    pub(crate) fn current(&self) -> ClientRedirects {
        match &self.disproved {
            Some(flag) if flag.load(std::sync::atomic::Ordering::Relaxed) => {
                ClientRedirects::Unobserved
            }
            _ => self.declared,
        }
    }

    /// Whether a response from another URL than the request's (`moved`) after `recorded`
    /// recorded hops proves the declaration `assumed` false: a redirect that `Recorded`
    /// would have recorded, or any under `Off`.
    pub(crate) fn disproved_by(assumed: ClientRedirects, moved: bool, recorded: u32) -> bool {
        assumed != ClientRedirects::Unobserved && moved && recorded == 0
    }

    /// Records that the declaration was proven false; `true` the first time.
    pub(crate) fn disprove(&self) -> bool {
        self.disproved
            .as_ref()
            .is_some_and(|flag| !flag.swap(true, std::sync::atomic::Ordering::Relaxed))
    }

    /// The declaration as made.
    pub(crate) fn declared(&self) -> ClientRedirects {
        self.declared
    }
}

/// Wraps a client's redirect `policy` so that every redirect reqwest meets is reported
/// to the transport step running the attempt ([`ClientRedirects::Recorded`]). The
/// decisions are `policy`'s own; the wrapper only watches.
///
/// It works through a per-thread record that the transport step installs while it polls
/// an attempt (reqwest consults the policy synchronously inside that poll), so it costs
/// nothing on a request that is not redirected, and outside a transport step (another
/// client sharing the policy) it does nothing.
pub fn recorded(policy: reqwest::redirect::Policy) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        crate::record::polled::note_hop(crate::origin::Origin::from_url(attempt.url()).ok());
        policy.redirect(attempt)
    })
}

/// Builds `builder`'s client so that every transport step sees its redirects exactly,
/// whatever that step was told: the redirect `policy` wrapped in [`recorded`], and a
/// connector that proves it. Each connection this client opens during an attempt tells the
/// transport step running it that the client records its hops, so a
/// [`TransportEvidence`](crate::TransportEvidence) declared
/// [`ClientRedirects::Unobserved`] (the default: `TransportEvidence::new()`, a stack
/// without [`client_redirects`](crate::Resilience::client_redirects)) treats that attempt as
/// [`ClientRedirects::Recorded`]: a `POST` whose connection was refused is retried. The one
/// call for a client built apart from its middlewares (a list handed to
/// `ClientWithMiddleware::new` when the client is first needed, rattler's `LazyClient`).
///
/// reqwest's own replays of HTTP/2 protocol NACKs (below every middleware, unseen by the
/// transport step) are kept only where harmless: a stream the server refused, for any
/// method, and one failed by its `GOAWAY`, only for an idempotent method (reqwest's
/// default sends that again for any method, and hyper can fail that way a stream the
/// server had taken: a `POST` run twice). This replaces a `.retry(..)` set on `builder`.
///
/// The client gets [`crate::network`]'s defaults ([`Network::new`](crate::network::Network::new):
/// the address race, a connect timeout per address, HTTP/2 keep-alive pings), as one from
/// [`Resilience::build_from`](crate::Resilience::build_from) does; they replace the same
/// settings of `builder` (its `dns_resolver`).
///
/// Nothing is assumed where nothing was proven: an attempt that opened no connection (a
/// pooled one was reused) is judged as the declaration says. A middleware that sends
/// requests of another such client from *inside* the transport step (where only a
/// stand-in for the network belongs) would lend this proof to the attempt it runs in.
///
/// ```
/// use reqwest_resilience::redirect;
///
/// # fn main() -> Result<(), reqwest::Error> {
/// let client = redirect::recorded_client(
///     reqwest::Client::builder(),
///     reqwest::redirect::Policy::default(),
/// )?;
/// # drop(client); Ok(()) }
/// ```
///
/// # Errors
///
/// reqwest's, when it cannot build the client.
pub fn recorded_client(
    builder: reqwest::ClientBuilder,
    policy: reqwest::redirect::Policy,
) -> Result<reqwest::Client, reqwest::Error> {
    crate::network::Network::new()
        .apply(builder)
        .redirect(recorded(policy))
        .connector_layer(ProvesRecorded)
        .retry(crate::protocol_nacks::harmless_replays())
        .build()
}

/// [`recorded_client`]'s connector layer.
#[derive(Debug, Clone, Copy)]
struct ProvesRecorded;

impl<S> tower_layer::Layer<S> for ProvesRecorded {
    type Service = Proving<S>;

    fn layer(&self, inner: S) -> Proving<S> {
        Proving(inner)
    }
}

/// A connector that, as it starts a connection, marks the attempt being polled on this
/// thread as one of a client whose redirects are recorded.
#[derive(Debug, Clone)]
struct Proving<S>(S);

impl<S: tower_service::Service<R>, R> tower_service::Service<R> for Proving<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        crate::record::polled::note_proven();
        self.0.call(request)
    }
}

/// The part of a URL a response's URL is compared on: reqwest rebuilds `Response::url()`
/// from the request's `http::Uri`, which has no fragment.
pub(crate) fn without_fragment(url: &reqwest::Url) -> &str {
    &url[..url::Position::AfterQuery]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declaration_proven_false_is_unobserved_from_then_on_for_every_clone() {
        let declared = Declared::new(ClientRedirects::Recorded);
        let clone = declared.clone();
        assert!(!Declared::disproved_by(ClientRedirects::Recorded, true, 1));
        assert!(!Declared::disproved_by(ClientRedirects::Recorded, false, 0));
        assert!(!Declared::disproved_by(
            ClientRedirects::Unobserved,
            true,
            0
        ));
        assert!(Declared::disproved_by(ClientRedirects::Recorded, true, 0));
        assert!(Declared::disproved_by(ClientRedirects::Off, true, 0));
        assert_eq!(clone.current(), ClientRedirects::Recorded);
        assert!(declared.disprove(), "the first proof");
        assert!(!clone.disprove(), "shared: proven once");
        assert_eq!(clone.current(), ClientRedirects::Unobserved);
        assert_eq!(clone.declared(), ClientRedirects::Recorded);
        // Unobserved cannot be proven false, and holds no flag.
        let unobserved = Declared::new(ClientRedirects::Unobserved);
        assert!(!unobserved.disprove());
        assert!(unobserved.disproved.is_none());
    }
}
