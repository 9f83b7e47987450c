//! Chaos for your own tests (feature `chaos`): a middleware that injects, at seeded rates,
//! the faults this crate classifies, each with the evidence the real fault produces, so
//! you can test your retry, breaker and timeout settings against them (Polly's chaos
//! strategies are the model: fault, outcome and latency injection at a rate).
//!
//! Layer 5 (beside the stages): a stage of its own, used alone or innermost in the stack.
//!
//! # How each fault is produced
//!
//! A `reqwest::Error` cannot be made outside reqwest, and a made-up error would not carry
//! the evidence a real one does. So the chaos layer sends the chosen attempt to a loopback
//! socket of its own (on 127.0.0.1, bound on first use) that misbehaves in the chosen
//! way, and reqwest meets the real fault:
//!
//! | [`Fault`] | the chaos socket | what the stack records |
//! |---|---|---|
//! | `RefusedConnect` | bound, never listening: the kernel refuses the connect (RST) | `NotSent`, `Connect` |
//! | `ResetAfterSend` | reads the whole request, then closes with zero linger (RST) | `SentNoResponse`, `Reset` |
//! | `Timeout` | reads the request, never answers; the attempt's reqwest timeout is lowered to [`timeout_after`](ChaosBuilder::timeout_after) | `Unknown`, `Timeout` |
//! | `Unavailable` | answers `503` with `Retry-After` ([`retry_after`](ChaosBuilder::retry_after)) | `ResponseReceived(503)`, its `Retry-After` |
//! | `TooManyRequests` | answers `429` | `ResponseReceived(429)` |
//! | `RefusedStream` | an HTTP/2 server (prior knowledge, through a client of the layer's own) that resets the stream with `REFUSED_STREAM` | `SentNoResponse`, `Protocol`, [`NotProcessedProof::RefusedStream`](crate::NotProcessedProof::RefusedStream) |
//! | latency | a tokio sleep before the attempt (a paused test clock applies) | the attempt's time |
//!
//! Every other attempt goes to its server untouched. A faulted attempt's error and
//! response carry the request's own URL back (the chaos socket's address never shows),
//! so the transport step sees no redirect and the breaker charges the request's origin.
//!
//! # Where it goes
//!
//! Innermost, where the network is: after the transport step, which then observes the
//! fault as it observes a real one. In [`Resilience`](crate::Resilience):
//! [`Resilience::chaos`](crate::Resilience::chaos). Alone:
//! `ClientBuilder::new(client).with(your_retry).with(TransportEvidence::new()).with(chaos)`.
//! Each attempt (each retry, each hedge) is one request for the chaos layer; a resumed
//! body's range requests ([`Resilience::resume_bodies`](crate::Resilience::resume_bodies))
//! go straight to the client and meet no chaos. In one builder the layer is the last
//! middleware ([`Resilience::into_middlewares`](crate::Resilience::into_middlewares) puts it
//! there), so it cannot be part of one middleware
//! ([`StackError::ChaosInOneMiddleware`](crate::StackError::ChaosInOneMiddleware)).
//!
//! # Deterministic
//!
//! The `n`-th request that reaches the layer (from 0) gets [`Chaos::injection`]`(n)`: a
//! function of the seed, `n` and the rates only, whatever the timing, so a seed replays
//! the same sequence of faults (concurrent requests take their numbers in the order they
//! arrive). [`ChaosBuilder::on_injection`] reports each injection.
//!
//! # Defaults and where they come from
//!
//! Every rate is 0: nothing is injected until you ask (Polly's `InjectionRate` defaults to
//! 0.001; a test wants to choose). [`timeout_after`](ChaosBuilder::timeout_after): 30 s,
//! Polly's `ChaosLatency` default, longer than a typical attempt timeout (your own
//! attempt timeout, when shorter, fires first, as against a real hung server).
//! [`retry_after`](ChaosBuilder::retry_after): 1 s, the smallest `Retry-After` in
//! delta-seconds. Seed: 0.
//!
//! ```
//! use std::time::Duration;
//! use reqwest_resilience::Resilience;
//! use reqwest_resilience::chaos::{Chaos, Fault};
//!
//! # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
//! let chaos = Chaos::builder()
//!     .seed(42)
//!     .fault(Fault::RefusedConnect, 0.05)
//!     .fault(Fault::Unavailable, 0.10)
//!     .latency(0.2, Duration::from_millis(50), Duration::from_millis(200))
//!     .build()?;
//! let client = Resilience::new().chaos(chaos).build_from(reqwest::Client::builder())?;
//! # drop(client); Ok(()) }
//! ```
//!
//! Never in production: it is a test tool behind a feature of its own.

mod plan;
mod sockets;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::Extensions;
use reqwest::Response;

use crate::error::ResilienceError;
use crate::stage::{HandedRequest, Handover, RestOfStack, Stage, standalone_middleware};
use plan::Rates;
pub use plan::{Fault, Injection};
use sockets::Sockets;

type InjectionHook = Arc<dyn Fn(&Injection) + Send + Sync>;

/// The chaos middleware: see the [module docs](self). Clones share their count of
/// requests and their sockets.
///
/// # Cancel safety
///
/// A request dropped at any point leaves nothing behind: its number is taken (the next
/// request gets the next one), a socket it was talking to sees the connection close.
#[derive(Clone)]
pub struct Chaos {
    inner: Arc<Inner>,
}

struct Inner {
    seed: u64,
    rates: Rates,
    timeout_after: Duration,
    retry_after: Duration,
    requests: AtomicU64,
    /// Bound on the first fault, again when the runtime they served ended.
    sockets: tokio::sync::Mutex<Option<Arc<Sockets>>>,
    on_injection: Option<InjectionHook>,
}

impl std::fmt::Debug for Chaos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chaos")
            .field("seed", &self.inner.seed)
            .field("rates", &self.inner.rates)
            .field("requests", &self.inner.requests.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Builds a [`Chaos`].
#[must_use]
pub struct ChaosBuilder {
    seed: u64,
    rates: Rates,
    timeout_after: Duration,
    retry_after: Duration,
    on_injection: Option<InjectionHook>,
}

impl Chaos {
    /// A builder with every rate 0.
    pub fn builder() -> ChaosBuilder {
        ChaosBuilder {
            seed: 0,
            rates: Rates {
                faults: Vec::new(),
                latency: 0.0,
                latency_range: (Duration::ZERO, Duration::ZERO),
            },
            timeout_after: Duration::from_secs(30),
            retry_after: Duration::from_secs(1),
            on_injection: None,
        }
    }

    /// What the `n`-th request (from 0) gets, without sending anything.
    pub fn injection(&self, n: u64) -> Injection {
        plan::injection(self.inner.seed, n, &self.inner.rates)
    }

    /// The requests that reached the layer so far.
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }
}

impl ChaosBuilder {
    /// The seed of the sequence (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Injects `fault` into a share `rate` of requests, in `[0, 1]`. The faults' rates
    /// add up (to at most 1); a fault named twice keeps the last rate.
    pub fn fault(mut self, fault: Fault, rate: f64) -> Self {
        self.rates.faults.retain(|&(f, _)| f != fault);
        self.rates.faults.push((fault, rate));
        self
    }

    /// Adds latency, uniform in `[min, max]`, to a share `rate` of requests (drawn apart
    /// from the fault: a delayed request may also be faulted).
    pub fn latency(mut self, rate: f64, min: Duration, max: Duration) -> Self {
        self.rates.latency = rate;
        self.rates.latency_range = (min, max);
        self
    }

    /// The reqwest timeout of an attempt given [`Fault::Timeout`] (default 30 s; a
    /// shorter timeout of the request's own is kept).
    pub fn timeout_after(mut self, after: Duration) -> Self {
        self.timeout_after = after;
        self
    }

    /// The `Retry-After` of [`Fault::Unavailable`], in whole seconds (default 1 s).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = after;
        self
    }

    /// Called with each injection (a fault or latency), as the request reaches the layer.
    pub fn on_injection(mut self, hook: impl Fn(&Injection) + Send + Sync + 'static) -> Self {
        self.on_injection = Some(Arc::new(hook));
        self
    }

    /// The layer; [`ResilienceError::InvalidConfig`] for a rate outside `[0, 1]`, faults
    /// whose rates add up past 1, a latency range whose `min` is above its `max`, or a
    /// zero `timeout_after`.
    pub fn build(self) -> Result<Chaos, ResilienceError> {
        self.check().map_err(ResilienceError::InvalidConfig)?;
        Ok(Chaos {
            inner: Arc::new(Inner {
                seed: self.seed,
                rates: self.rates,
                timeout_after: self.timeout_after,
                retry_after: self.retry_after,
                requests: AtomicU64::new(0),
                sockets: tokio::sync::Mutex::new(None),
                on_injection: self.on_injection,
            }),
        })
    }

    fn check(&self) -> Result<(), String> {
        let rates = self
            .rates
            .faults
            .iter()
            .map(|&(_, r)| r)
            .chain([self.rates.latency]);
        for rate in rates {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("chaos rate must be in [0, 1], got {rate}"));
            }
        }
        let total: f64 = self.rates.faults.iter().map(|&(_, r)| r).sum();
        if total > 1.0 {
            return Err(format!("chaos fault rates add up to {total}, above 1"));
        }
        let (min, max) = self.rates.latency_range;
        if min > max {
            return Err(format!("chaos latency range {min:?}..{max:?} is empty"));
        }
        if self.timeout_after.is_zero() {
            return Err("chaos timeout_after must be more than zero".into());
        }
        Ok(())
    }
}

impl Stage for Chaos {
    #[allow(clippy::manual_async_fn)]
    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl std::future::Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        async move {
            let inner = &self.inner;
            let injection = self.injection(inner.requests.fetch_add(1, Ordering::Relaxed));
            if let (Some(hook), true) = (
                &inner.on_injection,
                injection.fault.is_some() || injection.latency.is_some(),
            ) {
                hook(&injection);
            }
            if let Some(latency) = injection.latency {
                tokio::time::sleep(latency).await;
            }
            match injection.fault {
                None => next.run(req, extensions, handover).await,
                Some(fault) => self.inject(fault, req, extensions, handover, next).await,
            }
        }
    }
}

standalone_middleware!(Chaos);

impl Chaos {
    /// The chaos sockets, bound now if they are not serving.
    ///
    /// # Cancel safety
    ///
    /// Dropped while binding, nothing is kept: the next fault binds them.
    async fn sockets(&self) -> std::io::Result<Arc<Sockets>> {
        let mut sockets = self.inner.sockets.lock().await;
        if let Some(serving) = sockets.as_ref().filter(|s| s.serving()) {
            return Ok(serving.clone());
        }
        let bound = Arc::new(Sockets::bind(self.inner.retry_after).await?);
        *sockets = Some(bound.clone());
        Ok(bound)
    }

    /// Sends `req` to the socket that produces `fault`, and gives the result the
    /// request's own URL back.
    async fn inject<'a, N: RestOfStack + 'a>(
        &'a self,
        fault: Fault,
        mut req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> reqwest_middleware::Result<Response> {
        let inner = &self.inner;
        let sockets = self
            .sockets()
            .await
            .map_err(reqwest_middleware::Error::middleware)?;
        let url = req.url().clone();
        let addr = sockets.addr(fault);
        let mut to = url.clone();
        // Plain HTTP to the chaos socket: `Url` refuses no change of these on an http(s)
        // URL (the scheme of a URL with a host is special either way).
        let _ = to.set_scheme("http");
        let _ = to.set_ip_host(addr.ip());
        let _ = to.set_port(Some(addr.port()));
        *req.url_mut() = to;
        if fault == Fault::Timeout {
            let own = req.timeout().copied();
            *req.timeout_mut() =
                Some(own.map_or(inner.timeout_after, |t| t.min(inner.timeout_after)));
        }
        let result = if fault == Fault::RefusedStream {
            sockets
                .h2
                .execute(req.take())
                .await
                .map_err(reqwest_middleware::Error::from)
        } else {
            next.run(req, extensions, handover).await
        };
        match result {
            Ok(response) => Ok(crate::stage::with_url(response, url)),
            Err(reqwest_middleware::Error::Reqwest(e)) => {
                Err(reqwest_middleware::Error::Reqwest(e.with_url(url)))
            }
            Err(other) => Err(other),
        }
    }
}
