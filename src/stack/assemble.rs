//! The assembly: the stages [`Resilience`] chose, built (the retry middleware from its
//! settings, the breaker from its registry, the limits from theirs) and nested into the
//! composed stack of `compose`, with the transport step inside it or after the
//! per-attempt middlewares.

use std::sync::Arc;

use reqwest::Client;

use super::builder::{BreakerKind, Resilience, RetryKind};
use super::compose;
use super::observer::RequestObserver;
use crate::breaker::{BreakerConfig, BreakerRegistry, CircuitBreakerMiddleware};
use crate::error::{ResilienceError, StackError, StackPart};
use crate::evidence::TransportEvidence;
use crate::limit::LimitChoice;
use crate::redirect::ClientRedirects;
use crate::retry::{RetryMiddleware, RetryMiddlewareBuilder};

impl Resilience {
    /// The stack's parts ([`Assembled`]): the stages as one middleware, and the transport
    /// step as a middleware of its own when per-attempt middlewares run between
    /// `BearerAuth` and it or a chaos layer runs after it. `client` is the
    /// `reqwest::Client` below the stack when it is known (resumed bodies send their range
    /// requests over it).
    pub(super) fn assemble(self, client: Option<Client>) -> Result<Assembled, ResilienceError> {
        let proxies = self.parts_fit(client.is_some())?;
        let retry = build_retry(self.retry, proxies)?;
        let limit = self.concurrency_limit.map(LimitChoice::build).transpose()?;
        let rate = self
            .rate_limit
            .map(crate::rate::RateChoice::build)
            .transpose()?;
        let breaker =
            build_breaker(self.breaker)?.map(|breaker| beside_rate_limit(breaker, rate.as_ref()));

        // One middleware for the stages, one boxed future per request; a user's
        // per-attempt middleware runs between `BearerAuth` and the transport step, which
        // then follows it as a middleware of its own.
        let transport = TransportEvidence::with_client_redirects(
            self.client_redirects.unwrap_or(ClientRedirects::Unobserved),
        )
        .with_weather(self.weather);
        // A resumed body's range requests go through the stages over the client itself.
        let resume = client.map(|client| ResumeSetup {
            by_default: self.resume_bodies,
            client,
            transport: transport.clone(),
        });
        #[cfg(feature = "chaos")]
        let chaos = self.chaos;
        #[cfg(not(feature = "chaos"))]
        let chaos: Option<std::convert::Infallible> = None;
        let (inner_transport, outer_transport) = if self.per_attempt.is_empty() && chaos.is_none() {
            (Some(transport), None)
        } else {
            (None, Some(transport))
        };
        let composed = compose::Composed {
            // A proxy whose breaker is open is passed over.
            proxies: (self.routes)
                .map(|r| r.with_breakers(breaker.as_ref().map(|b| b.registry().clone()))),
            observer: crate::stage::BoxedWhenPresent(RequestObserver::new(
                self.on_attempt,
                self.span_url_query,
            )),
            coalesce: crate::stage::BoxedWhenPresent(self.coalesce),
            retry: crate::stage::RetrySlot(retry),
            token_first: crate::stage::Absent,
            breaker,
            rate,
            limit: crate::stage::Absent,
            bearer: crate::stage::Absent,
            has_bearer: false,
            transport: inner_transport,
            resume: None,
        };
        // Each optional stage whose future is large is there by type only when the stack
        // has it (see `Composed`).
        let stack: Arc<dyn compose::StackMiddleware> = match (self.bearer, limit) {
            (Some(bearer), Some(limit)) => Arc::new(ResumeSetup::onto(
                resume,
                composed.with_bearer(bearer).with_limit(limit),
            )),
            (Some(bearer), None) => {
                Arc::new(ResumeSetup::onto(resume, composed.with_bearer(bearer)))
            }
            (None, Some(limit)) => Arc::new(ResumeSetup::onto(resume, composed.with_limit(limit))),
            (None, None) => Arc::new(ResumeSetup::onto(resume, composed)),
        };
        Ok(Assembled {
            stack,
            transport: outer_transport,
            #[cfg(feature = "chaos")]
            chaos,
        })
    }
}

impl Resilience {
    /// The stack's retry middleware, for what retries outside the client: an
    /// [`Operation`](crate::retry::Operation) (a send, a read and a parse run again when
    /// the body breaks) or its [`Steps`](crate::retry::Steps) (a loop of your own, over
    /// mirrors, URLs or rebuilt requests), and the [budget](RetryMiddleware::budget).
    /// Built now from the preset or the builder [`retry`](Self::retry) was given (a
    /// prebuilt one is handed out as it is), and kept by the stack: the client built next
    /// and the handle are one middleware, so an operation retries under the client's
    /// policy, budget, deadline and retry limit, and shares its attempt count (the
    /// attempts the client's middleware makes inside an operation are the operation's,
    /// not 4 × 4 = 16).
    ///
    /// A later [`retry`](Self::retry) or [`no_retry`](Self::no_retry) replaces the part
    /// and the handle no longer is the client's: call this last, just before building.
    ///
    /// ```no_run
    /// use reqwest_resilience::Resilience;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut stack = Resilience::like_reqwest_retry(); // or Resilience::new(), .retry(..)
    /// let retry = stack.retry_middleware()?;
    /// let client = stack.build_from(reqwest::Client::builder())?;
    /// let client = &client;
    /// let body = retry
    ///     .operation()
    ///     .run(|attempt| async move {
    ///         let response = client.get("http://127.0.0.1:8080/").with_extension(attempt).send().await?;
    ///         Ok::<_, reqwest_middleware::Error>(response.error_for_status()?.bytes().await?)
    ///     })
    ///     .await?;
    /// # drop(body); Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Those building the stack would return for the retry part
    /// ([`StackError::DeadlineBeforeFirstRetry`], a [`ResilienceError::InvalidConfig`] of
    /// the builder), found now (the part is then left as it was); with
    /// [`no_retry`](Self::no_retry), [`StackError::Conflict`] (`retry_middleware` on the
    /// removed retry part).
    pub fn retry_middleware(&mut self) -> Result<RetryMiddleware, ResilienceError> {
        match &self.retry {
            RetryKind::Prebuilt(retry) => return Ok(retry.clone()),
            RetryKind::Off => {
                return Err(ResilienceError::InvalidStack(StackError::Conflict {
                    part: StackPart::Retry,
                    setting: "retry_middleware",
                }));
            }
            RetryKind::Builder(_) => {}
        }
        // A proxy pool set before this call raises the limit here as it would at build.
        let proxies = match (&self.proxies, &self.routes) {
            (Some(pool), _) => Some(pool.len()),
            (None, routes) => routes.as_ref().map(crate::proxy::Routes::len),
        };
        let RetryKind::Builder(builder) = std::mem::replace(&mut self.retry, RetryKind::Off) else {
            unreachable!("matched above")
        };
        let builder = raised(*builder, proxies);
        if let Err(e) = check_retry(&builder) {
            self.retry = RetryKind::Builder(Box::new(builder));
            return Err(e);
        }
        let retry = builder
            .build()
            .unwrap_or_else(|_| unreachable!("checked above"));
        self.retry = RetryKind::Prebuilt(retry.clone());
        Ok(retry)
    }

    /// Refuses resumed bodies without a retry stage or a client to send their range
    /// requests over (`has_client`), and a proxy pool the stack cannot serve: one whose
    /// clients `build_from` did not build, or one beside a stage that would send around
    /// it. Else the number of proxies of its pool, if there is one.
    fn parts_fit(&self, has_client: bool) -> Result<Option<usize>, ResilienceError> {
        if self.resume_bodies && matches!(self.retry, RetryKind::Off) {
            return Err(ResilienceError::InvalidStack(StackError::Conflict {
                part: StackPart::Retry,
                setting: "resume_bodies",
            }));
        }
        if self.resume_bodies && !has_client {
            return Err(ResilienceError::InvalidStack(
                StackError::ResumeWithoutClient,
            ));
        }
        #[cfg(feature = "chaos")]
        let chaos = self.chaos.is_some();
        #[cfg(not(feature = "chaos"))]
        let chaos = false;
        let with = if self.proxies.is_some() {
            "a prebuilt client (build, install, into_middleware, into_middlewares)"
        } else if self.routes.is_none() {
            return Ok(None);
        } else if !self.per_attempt.is_empty() {
            "per_attempt"
        } else if self.resume_bodies {
            "resume_bodies"
        } else if chaos {
            "chaos"
        } else {
            return Ok(self.routes.as_ref().map(crate::proxy::Routes::len));
        };
        Err(ResilienceError::InvalidStack(
            StackError::ProxiesNeedBuildFrom { with },
        ))
    }
}

/// The retry middleware chosen, set for the stack's pool of `proxies` (if any) when it
/// is built here.
fn build_retry(
    choice: RetryKind,
    proxies: Option<usize>,
) -> Result<Option<RetryMiddleware>, ResilienceError> {
    match choice {
        RetryKind::Prebuilt(retry) => Ok(Some(retry)),
        RetryKind::Off => Ok(None),
        RetryKind::Builder(builder) => {
            let builder = raised(*builder, proxies);
            check_retry(&builder)?;
            builder.build().map(Some)
        }
    }
}

/// `builder` in front of a pool of `proxies`, if given: its retry limit raised to try
/// every proxy once, a proxy whose connect timed out tried once per request.
fn raised(builder: RetryMiddlewareBuilder, proxies: Option<usize>) -> RetryMiddlewareBuilder {
    match proxies {
        Some(n) => builder.for_proxy_pool(n, crate::proxy::retries_to_try(n)),
        None => builder,
    }
}

/// What building the retry part checks: the builder's own settings, and a deadline that
/// leaves room for a retry.
fn check_retry(builder: &RetryMiddlewareBuilder) -> Result<(), ResilienceError> {
    if let Some((total_deadline, first_delay)) = builder.deadline_before_first_retry() {
        return Err(ResilienceError::InvalidStack(
            StackError::DeadlineBeforeFirstRetry {
                total_deadline,
                first_delay,
            },
        ));
    }
    builder.check()
}

/// The stack as [`Resilience::assemble`] builds it for a builder.
pub(super) struct Assembled {
    /// The stages, one middleware.
    pub(super) stack: Arc<dyn compose::StackMiddleware>,
    /// The transport step as a middleware of its own, after the per-attempt ones.
    pub(super) transport: Option<TransportEvidence>,
    /// Seeded faults, innermost: after the transport step, where the network is.
    #[cfg(feature = "chaos")]
    pub(super) chaos: Option<crate::chaos::Chaos>,
}

/// What a composed stack needs to resume bodies (`crate::resume`).
struct ResumeSetup {
    by_default: bool,
    client: Client,
    transport: TransportEvidence,
}

impl ResumeSetup {
    /// `composed`, able to resume bodies (when the client is known and the stack has a
    /// retry stage, whose limit the resumes count against), by default or per request.
    fn onto<T, B, L>(
        setup: Option<Self>,
        mut composed: compose::Composed<T, B, L>,
    ) -> compose::Composed<T, B, L>
    where
        T: crate::stage::Stage + Clone + 'static,
        B: crate::stage::Stage + Clone + 'static,
        L: crate::stage::Stage + Clone + 'static,
    {
        let (Some(setup), Some(retry)) = (setup, composed.retry.0.clone()) else {
            return composed;
        };
        let stages = compose::ResumeStages {
            observer: composed.observer.0.clone(),
            retry: retry.clone(),
            token_first: composed.token_first.clone(),
            breaker: composed.breaker.clone(),
            limit: composed.limit.clone(),
            rate: composed.rate.clone(),
            bearer: composed.bearer.clone(),
            transport: Some(setup.transport),
            client: setup.client,
        };
        composed.resume = Some(crate::resume::Resumer {
            by_default: setup.by_default,
            retry,
            stack: Arc::new(stages),
        });
        composed
    }
}

/// The breaker as it runs outside `rate`: a learning rate limit applies the servers'
/// rate-limit fields under its own bounds, and the breaker leaves them to it (one bound on
/// how long they hold a caller: `crate::rate`, "How long a server's fields hold a caller").
fn beside_rate_limit(
    breaker: CircuitBreakerMiddleware,
    rate: Option<&crate::rate::RateLimit>,
) -> CircuitBreakerMiddleware {
    match rate {
        Some(rate) if rate.registry().config().learn => breaker.leaving_rate_limit_fields(),
        _ => breaker,
    }
}

fn build_breaker(choice: BreakerKind) -> Result<Option<CircuitBreakerMiddleware>, ResilienceError> {
    let config = match choice {
        BreakerKind::Off => return Ok(None),
        BreakerKind::Registry(registry) => {
            return Ok(Some(CircuitBreakerMiddleware::new(registry)));
        }
        BreakerKind::Middleware(breaker) => return Ok(Some(breaker)),
        BreakerKind::Default => BreakerConfig::default(),
        BreakerKind::Config(config) => config,
    };
    if config.half_open_probes == 0 {
        return Err(ResilienceError::InvalidStack(StackError::NoHalfOpenProbes));
    }
    Ok(Some(CircuitBreakerMiddleware::new(BreakerRegistry::new(
        config,
    )?)))
}
