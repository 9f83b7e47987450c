//! The built pool ([`Routes`]): which proxy an attempt takes, the attempt on that proxy's
//! client, and whether its outcome is the proxy's or the target's.

use std::sync::atomic::{AtomicUsize, Ordering};

use http::{Extensions, StatusCode};
use reqwest::{Request, Response};

use crate::breaker::{BreakerRegistry, BreakerState};
use crate::error::ResilienceError;
use crate::origin::Origin;
use crate::record::{
    AttemptHistory, FailureKind, Inward, ProxyUsed, RequestRecord, record_rejected_locally,
};
use crate::stage::{HandedRequest, Handled, Handover, RestOfStack};

/// One proxy: its client (built with `.proxy(..)`) and its origin.
struct Route {
    client: reqwest::Client,
    origin: Origin,
}

/// A [`ProxyPool`](super::ProxyPool) built into one client per proxy, the innermost call
/// of a composed stack that has one.
pub(crate) struct Routes {
    routes: Vec<Route>,
    rotate_on: Vec<StatusCode>,
    always: bool,
    /// The proxy a request's first attempt takes: in turn with `always`, else the one
    /// the last rotation moved to (so later requests start from a proxy that worked).
    next: AtomicUsize,
    /// The breakers, to pass over a proxy whose breaker is open.
    breakers: Option<BreakerRegistry>,
}

impl Routes {
    pub(super) fn new(
        clients: Vec<(reqwest::Client, Origin)>,
        rotate_on: Vec<StatusCode>,
        always: bool,
    ) -> Self {
        Routes {
            routes: clients
                .into_iter()
                .map(|(client, origin)| Route { client, origin })
                .collect(),
            rotate_on,
            always,
            next: AtomicUsize::new(0),
            breakers: None,
        }
    }

    /// How many proxies.
    pub(crate) fn len(&self) -> usize {
        self.routes.len()
    }

    /// The same pool, passing over the proxies whose breaker in `breakers` is open.
    pub(crate) fn with_breakers(mut self, breakers: Option<BreakerRegistry>) -> Self {
        self.breakers = breakers;
        self
    }

    /// The proxy this attempt is to take before the breakers are asked: after an
    /// earlier attempt through the pool, that proxy again, or the next one when its
    /// outcome was charged to it (or with `always`); else the pool's turn.
    fn turn(&self, extensions: &Extensions) -> usize {
        let n = self.routes.len();
        let last = AttemptHistory::of(extensions).and_then(|h| {
            h.attempts().iter().rev().find_map(|r| {
                let e = &r.evidence;
                Some((e.proxy.as_ref()?, e.charged_to_proxy))
            })
        });
        let at = match last {
            Some((proxy, charged)) => {
                // (Two entries of one origin share a breaker, and a turn: the first's.)
                let at = self.routes.iter().position(|r| &r.origin == proxy);
                let at = at.unwrap_or(0);
                if charged || self.always { at + 1 } else { at }
            }
            None if self.always => self.next.fetch_add(1, Ordering::Relaxed),
            None => self.next.load(Ordering::Relaxed),
        };
        at % n
    }

    /// The first proxy from `at` on whose breaker is not open (nor isolated: a proxy taken
    /// out of the pool by hand with `BreakerRegistry::isolate`), or the rejection of the
    /// one at `at` when every breaker is.
    fn admitted(&self, at: usize) -> Result<usize, ResilienceError> {
        let Some(breakers) = &self.breakers else {
            return Ok(at);
        };
        let n = self.routes.len();
        let open = |i: usize| {
            matches!(
                breakers.state(&self.routes[i].origin),
                Some(BreakerState::Open | BreakerState::Isolated)
            )
        };
        if let Some(i) = (0..n).map(|k| (at + k) % n).find(|&i| !open(i)) {
            return Ok(i);
        }
        match breakers.acquire(&self.routes[at].origin) {
            // Its open period ended between the two looks.
            Ok(_) => Ok(at),
            Err(rejection) => Err(ResilienceError::from(rejection)),
        }
    }

    /// Whether `result` is the proxy's outcome rather than the target's (see
    /// [`guide::proxies`](crate::guide::proxies)): a failed connection to the proxy (or a
    /// tunnel it broke off without an answer), a `407`, a status the pool rotates on. A
    /// `CONNECT` the proxy answered with an error status is the target's. A TLS failure is the
    /// target's when its handshake runs through the tunnel (`target_tls`: an `https`
    /// target), the proxy's only when the proxy's is the one handshake on the way.
    fn charged(&self, result: &Result<Response, reqwest::Error>, target_tls: bool) -> bool {
        match result {
            // The proxy answered the `CONNECT` with an error status: it could not reach the
            // target (tinyproxy's `500 Unable to connect`, a `502`/`503`/`504`), a failure
            // of the target reported by a working proxy.
            Err(e) if e.is_connect() && tunnel_refused_by_answer(e) => false,
            Err(e) if e.is_connect() => {
                let kind = crate::classify::classify_error(e).kind;
                !(target_tls && matches!(kind, FailureKind::Tls | FailureKind::Certificate))
            }
            Err(_) => false,
            Ok(r) => {
                r.status() == StatusCode::PROXY_AUTHENTICATION_REQUIRED
                    || self.rotate_on.contains(&r.status())
            }
        }
    }

    /// The attempt through the proxy whose turn it is, on that proxy's client; what it
    /// went through is left in `extensions` ([`ProxyUsed`]) for the transport step.
    fn send<'a>(&'a self, req: Request, extensions: &'a mut Extensions) -> Handled<'a> {
        let at = self.turn(extensions);
        let at = match self.admitted(at) {
            Ok(at) => at,
            Err(rejection) => {
                let origin = Origin::cached(req.url());
                let refused = self.reject(at, origin, rejection, extensions);
                return Box::pin(std::future::ready(Err(refused)));
            }
        };
        let route = &self.routes[at];
        let target_tls = req.url().scheme() == "https";
        // Left now, so that an attempt cut before it completes (an attempt timeout, the
        // deadline) keeps its proxy; replaced by the outcome's below.
        extensions.insert(ProxyUsed {
            origin: route.origin.clone(),
            charged: false,
        });
        // And on the attempt's clock, for the breaker counting a cut by its timeout: the
        // stage whose timer fires first may drop the breaker's future before it reads
        // the extensions. (A completed attempt is never cut: the stages between the
        // breaker and the pool return in the poll the pool's answer comes in.)
        if let Some(clock) = Inward::clock(extensions) {
            clock.carried_by(&route.origin);
        }
        let sent = route.client.execute(req);
        Box::pin(async move {
            let result = sent.await;
            let charged = self.charged(&result, target_tls);
            if charged && !self.always {
                // Later requests start from the next proxy (unless another request
                // moved the turn already).
                let n = self.routes.len();
                let _ = self.next.compare_exchange(
                    at,
                    (at + 1) % n,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            extensions.insert(ProxyUsed {
                origin: route.origin.clone(),
                charged,
            });
            result.map_err(reqwest_middleware::Error::Reqwest)
        })
    }

    /// Every proxy's breaker is open: the attempt is refused unsent, its evidence the
    /// proxy's (the transport step around passes this error on with it).
    #[cold]
    fn reject(
        &self,
        at: usize,
        origin: Option<Origin>,
        rejection: ResilienceError,
        extensions: &mut Extensions,
    ) -> reqwest_middleware::Error {
        let (kind, retry_in) = match &rejection {
            ResilienceError::Paused { retry_in, .. } => (FailureKind::Paused, Some(*retry_in)),
            other => (FailureKind::BreakerOpen, other.retry_in()),
        };
        record_rejected_locally(extensions, kind, origin, retry_in);
        // Stored once: in the history, as its last attempt.
        if let Some(e) = RequestRecord::get(extensions).evidence_mut() {
            e.proxy = Some(self.routes[at].origin.clone());
            e.charged_to_proxy = true;
        }
        if let Some(retry_in) = retry_in {
            crate::record::RetryIn(retry_in).insert_into(extensions);
        }
        reqwest_middleware::Error::middleware(rejection)
    }
}

/// Whether a failed connect is a `CONNECT` the proxy answered with an error status
/// ([`is_tunnel_refusal`](crate::classify::is_tunnel_refusal)).
fn tunnel_refused_by_answer(e: &reqwest::Error) -> bool {
    crate::chain::links(e).any(crate::classify::is_tunnel_refusal)
}

/// The innermost call of a composed stack: the rest of the client's chain (`Next`), or
/// the attempt on a proxy's client when the stack has a pool.
#[derive(Clone)]
pub(crate) enum Innermost<'p, N> {
    Next(N),
    Pool(&'p Routes),
}

impl<N: RestOfStack> RestOfStack for Innermost<'_, N> {
    const MAKING_DOES_WORK: bool = N::MAKING_DOES_WORK;

    fn routed(&self) -> bool {
        matches!(self, Innermost::Pool(_))
    }

    fn run<'a>(
        self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a
    where
        Self: 'a,
    {
        self.run_boxed(req.take(), extensions, handover)
    }

    fn run_boxed<'a>(
        self,
        req: Request,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
    ) -> Handled<'a>
    where
        Self: 'a,
    {
        match self {
            Innermost::Next(next) => next.run_boxed(req, extensions, handover),
            Innermost::Pool(routes) => routes.send(req, extensions),
        }
    }
}
