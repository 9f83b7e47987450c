//! Coalesced identical GETs (opt-in): concurrent GET or HEAD requests that ask for the
//! same thing share one request on the wire.
//!
//! [`CoalesceGets`] is a stage (layer 5: it imports only the layers below it, no other
//! stage), usable alone as a middleware and in [`Resilience`](crate::Resilience)
//! ([`Resilience::coalesce_gets`](crate::Resilience::coalesce_gets)).
//!
//! # What is shared
//!
//! A response is shared only between requests identical in everything the server can
//! see. Two requests share one wire request when they are both GET, or both HEAD,
//! without a body, and have:
//!
//! - the same **identity**: the same [`CoalesceGets`] value. A middleware sees neither a
//!   client's default headers (its credentials among them) nor which client it serves,
//!   so each value is an identity of its own and **a clone is a new one**: two clients or
//!   two stacks never share, even built with clones of one `CoalesceGets`, unless the
//!   clones were declared one identity ([`CoalesceGets::identity`]). One value is one
//!   identity wherever it is: do not hand one `Arc` of it, or of a stack holding it, to
//!   clients that send different default headers;
//! - the same URL (its query included), HTTP version and reqwest timeout;
//! - **every request header**, name and values, as the stage sees it (the order of
//!   fields of different names aside, RFC 9110 §5.3; a repeated field's values in the
//!   same order). There is no allow-list and nothing is left out: a trace id or a
//!   request id per request keeps every request apart. A conditional request
//!   (`If-None-Match`, `If-Modified-Since`, `If-Range`, …) is keyed by its conditions
//!   like any header: it shares only with the same conditions, so no caller receives a
//!   `304` or a `206` it did not ask for.
//!
//! What the stack adds below the stage is the identity's own: `BearerAuth`'s token is
//! the stack's (one token source for every caller of the stack). A
//! [`per_attempt`](crate::Resilience::per_attempt) middleware could add anything (a
//! tenant's key from the request's extensions), so [`Resilience`](crate::Resilience)
//! refuses it with coalescing
//! ([`StackError::CoalesceWithPerAttempt`](crate::StackError::CoalesceWithPerAttempt)):
//! install such a middleware around the stack, where the stage keys what it adds.
//!
//! The first caller (the leader) sends its request; the callers that come until its
//! response head arrives (followers) wait for it. A response nobody joined is handed to
//! the leader as it came, unread (coalescing then costs a key and a map entry). When
//! others joined, the flight closes at the head (a caller coming after it starts a
//! request of its own). A response that can be shared has its body read whole and every
//! caller gets its own [`Response`] with the same status, headers, URL and body bytes
//! (one copy of the bytes, shared), and in its [`AttemptHistory`](crate::AttemptHistory) a
//! [`Shared`](crate::evidence::Shared) record: whether it [sent](crate::evidence::SharedRole::Sent)
//! the request or [joined](crate::evidence::SharedRole::Joined) it, and how many callers
//! shared it. A follower's extensions get the leader's [`RequestEvidence`](crate::RequestEvidence), history and
//! [`RetryOutcome`].
//!
//! # When the body is not shared
//!
//! At the head, a response is shared only when its length is known (`Content-Length`)
//! and at most [`max_body`](CoalesceGets::max_body) (1 MiB by default), and it is not
//! the caller's own: **never** one with `Set-Cookie`, or with `Cache-Control` `private`
//! or `no-store` (RFC 9111 §5.2.2; a `Cache-Control` that is not text counts as both).
//! A body without `Content-Length` (a stream, an event stream held open) is never
//! buffered for the followers; nor is one reqwest decompresses (feature `gzip` and the
//! like: it removes the `Content-Length` of what it decodes). Otherwise the leader gets its response as it came, **at
//! its head**, as without coalescing, and each follower is let go to send **its own
//! request**, as if it had never joined: a follower cannot be handed the rest of a
//! stream that only one caller can read, and holding a large body in memory for callers
//! that may never read it is what the bound is for. A body that breaks while it is read
//! is handled the same way (the leader reads what was read, then the failure where it
//! happened; the followers send their own). Only the requests of that moment pay for
//! it.
//!
//! # When the request fails
//!
//! The failure is shared: every follower gets
//! [`ResilienceError::SharedRequestFailed`] with the leader's error as text (a
//! `reqwest::Error` cannot be cloned) and the leader's evidence and history in its
//! extensions. A failing server sees one request, not one per caller.
//!
//! Except when the leader stopped for a reason of its own: its retry stopped at its
//! deadline ([`StopReason::DeadlineExceeded`],
//! its own [`Deadline`] or the retry's total deadline counted from its start), or it
//! failed once its [`Deadline`] had passed. Then, as when the leader is dropped, the
//! leader gets its own result and the first follower sends the request again for the
//! others.
//!
//! # Where it sits in the stack
//!
//! Outermost in [`Resilience`](crate::Resilience), outside the retry (the whole order:
//! [`guide::stack`](crate::guide::stack)).
//!
//! The shared request is one logical request: it is retried, admitted by the breaker and
//! the limiter, and counted by them, once for all its callers (inside them, each caller
//! would be one more attempt for the breaker and take a permit of its own, and a
//! follower of a retried request would wait through the retries anyway). The
//! followers take the leader's retry settings: a caller's own per-request
//! [`MaxRetries`](crate::retry::MaxRetries) does not change the shared request, and a
//! follower's [`Deadline`] bounds its own wait (past it, it fails with tokio's
//! `Elapsed`, as the retry's cut, and the others go on). `BearerAuth` is inside: the
//! callers of one stack share its token, and a request that carries its own
//! `Authorization` is keyed by it.
//!
//! Used alone, put it outside the middlewares whose work should be shared and inside
//! every middleware that adds a header that depends on the request: it keys the request
//! as it sees it, so a middleware inside it must add the same to every request of the
//! client (a token of one source, a user agent).
//!
//! # Cancel safety
//!
//! Dropping a follower's future drops its wait and nothing else: the leader and the other
//! followers go on. Dropping every caller's future drops the leader's, which drops the
//! wire request (reqwest cancels it). When the leader alone is dropped, its wire request
//! is dropped with it: a request made through `reqwest_middleware::Next` borrows the
//! leader's client and middleware chain, so it cannot outlive the leader's future (a
//! middleware has no client of its own to hand a spawned task). The first follower then
//! becomes the leader and sends the request again, and the others wait for that one: a
//! GET or HEAD is safe to send again (RFC 9110 §9.2.1), and their histories show the one
//! they shared.
//!
//! ```
//! use reqwest_middleware::ClientBuilder;
//! use reqwest_resilience::coalesce::CoalesceGets;
//! use reqwest_resilience::{Resilience, TransportEvidence};
//! use reqwest_resilience::redirect::{self, ClientRedirects};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // In the stack:
//! let client = Resilience::new()
//!     .coalesce_gets(CoalesceGets::new())
//!     .build_from(reqwest::Client::builder())?;
//! // Two clients of one service account (the same default headers) that share:
//! let one = CoalesceGets::new().identity("service-account");
//! let (a, b) = (one.clone(), one);
//! // Alone:
//! let recorded = redirect::recorded(reqwest::redirect::Policy::default()); // every hop seen
//! let alone = ClientBuilder::new(reqwest::Client::builder().redirect(recorded).build()?)
//!     .with(CoalesceGets::new())
//!     .with(TransportEvidence::with_client_redirects(ClientRedirects::Recorded))
//!     .build();
//! # drop((client, alone, a, b)); Ok(()) }
//! ```

mod body;
mod flight;
mod key;
mod landing;

use std::sync::Arc;

use http::Extensions;
use reqwest::Response;

use crate::error::ResilienceError;
use crate::record::{Deadline, RetryOutcome, SharedRole, StopReason};
use crate::stage::{HandedRequest, Handover, RestOfStack, Stage, standalone_middleware};
use flight::{Flights, Joined, Waited};
use key::Partition;
use landing::{Landing, Record, SharedResponse};

/// The default bound on a shared body: 1 MiB.
pub(crate) const DEFAULT_MAX_BODY: usize = 1 << 20;

/// Coalesced identical GETs: see the [module docs](self).
///
/// Each value is an identity of its own, and a clone is a new one: two clients or two
/// stacks never share a request, even built with clones of one `CoalesceGets`, unless
/// they were given the same [`identity`](Self::identity). (One value is one identity
/// wherever it is installed: a middleware cannot tell the clients it serves apart, so
/// do not hand one `Arc` of it, or of a stack holding it, to clients that send
/// different default headers.)
pub struct CoalesceGets {
    flights: Arc<Flights>,
    partition: Partition,
    max_body: usize,
}

impl Clone for CoalesceGets {
    /// A new identity, unless this one was declared with [`identity`](Self::identity).
    fn clone(&self) -> Self {
        CoalesceGets {
            flights: self.flights.clone(),
            partition: match &self.partition {
                Partition::Own(_) => Partition::own(),
                named @ Partition::Named(_) => named.clone(),
            },
            max_body: self.max_body,
        }
    }
}

impl std::fmt::Debug for CoalesceGets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("CoalesceGets");
        if let Partition::Named(identity) = &self.partition {
            d.field("identity", identity);
        }
        d.field("max_body", &self.max_body).finish_non_exhaustive()
    }
}

impl Default for CoalesceGets {
    fn default() -> Self {
        CoalesceGets::new()
    }
}

impl CoalesceGets {
    /// Coalesces bodies up to 1 MiB, as an identity of its own.
    pub fn new() -> Self {
        CoalesceGets {
            flights: Arc::default(),
            partition: Partition::own(),
            max_body: DEFAULT_MAX_BODY,
        }
    }

    /// Declares that every client and stack holding a clone of this value with the same
    /// `identity` sends as one identity: the same default headers, the same credentials
    /// (a `BearerAuth` of the same token source), the same per-attempt additions. Their
    /// identical requests then share, across clients. Without it a clone never shares
    /// with another (see [`CoalesceGets`]).
    pub fn identity(mut self, identity: impl Into<Arc<str>>) -> Self {
        self.partition = Partition::Named(identity.into());
        self
    }

    /// No longer needed: every request header keeps two requests apart (see the [module
    /// docs](self#what-is-shared)). A name that is not a valid header name is still
    /// [`ResilienceError::InvalidConfig`]; valid ones change nothing.
    #[deprecated(note = "every request header is keyed: a Vary list changes nothing")]
    pub fn vary<I, S>(self, names: I) -> Result<Self, ResilienceError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        for n in names {
            http::HeaderName::from_bytes(n.as_ref().as_bytes()).map_err(|_| {
                ResilienceError::InvalidConfig(format!(
                    "coalesce vary: {:?} is not a header name",
                    n.as_ref()
                ))
            })?;
        }
        Ok(self)
    }

    /// The largest body shared (default 1 MiB); see the [module
    /// docs](self#when-the-body-is-not-shared) for a larger one.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }
}

standalone_middleware!(CoalesceGets);

impl Stage for CoalesceGets {
    #[allow(clippy::manual_async_fn)]
    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        async move {
            let owner = handover.enter(extensions, "CoalesceGets", false, req.url())?;
            // A request whose body is opened per attempt (an upload) is never shared.
            let key = match crate::upload::ReplayableBody::of(extensions) {
                None => self.flights.key(&req, &self.partition),
                Some(_) => None,
            };
            // Each pass ends with a landing, or with the leader gone and this caller
            // joining again: as the next leader, or behind it. A caller that leads, or
            // whose landing cannot be shared, sends the request below: the one place the
            // inside's future is kept (one for three paths, each would size this one).
            let mut leader = None;
            if let Some(key) = &key {
                loop {
                    let landed = match self.flights.join(key) {
                        Joined::Leader(sender) => {
                            leader = Some(sender);
                            break;
                        }
                        Joined::Follower(landed) => landed,
                    };
                    // Boxed, as the reading of a shared body: a request nobody joined
                    // (the common case) does not carry their futures' state.
                    let landing = match Box::pin(wait_within_deadline(landed, extensions)).await? {
                        Waited::Abandoned => continue,
                        Waited::Landed(landing) => landing,
                    };
                    match follow(&landing, extensions) {
                        Some(result) => return result,
                        // Not shareable: this caller sends its own request.
                        None => break,
                    }
                }
            }
            // Made where it is kept and pinned there (awaited by value, it would be moved
            // once more).
            let result = {
                let sent =
                    std::pin::pin!(owner.poll_as(next, |next| next.run(req, extensions, handover)));
                sent.await
            };
            let Some(leader) = leader else {
                return result;
            };
            if stopped_by_its_own_deadline(&result, extensions) {
                // The sender's own limit, not the request's outcome: as a dropped sender,
                // it hands the request over (the first follower sends it again).
                drop(leader);
                return result;
            }
            // Others joined a body that can be shared: it is read whole for them (out
            // of the `match`, whose scrutinee would be kept across the `.await`).
            let (leader, response, callers) = match self.land(leader, result, extensions) {
                Landed::Now(result) => return result,
                Landed::ToShare {
                    leader,
                    response,
                    callers,
                } => (leader, response, callers),
            };
            Box::pin(self.share(leader, response, callers, extensions)).await
        }
    }
}

/// How the leader's request landed at its response head.
enum Landed<'f> {
    /// Its result: no one joined, it failed, or its body is not shared.
    Now(reqwest_middleware::Result<Response>),
    /// `callers` share `response`, whose body is to be read whole first.
    ToShare {
        leader: flight::Leader<'f>,
        response: Response,
        callers: u32,
    },
}

impl CoalesceGets {
    /// The leader's part once its request ended: close the flight and tell the followers
    /// how it landed, unless its body is to be read for them first.
    fn land<'f>(
        &'f self,
        mut leader: flight::Leader<'f>,
        result: reqwest_middleware::Result<Response>,
        extensions: &mut Extensions,
    ) -> Landed<'f> {
        let response = match result {
            Ok(response) => response,
            Err(e) => {
                let callers = leader.close().saturating_add(1);
                let record = Record::of(extensions);
                mark_shared(extensions, &record, callers);
                let error = e.to_string();
                leader.land(Arc::new(Landing::Failed {
                    error,
                    record,
                    callers,
                }));
                return Landed::Now(Err(e));
            }
        };
        // The flight closes at the response head: a caller that comes while the body is
        // read starts a request of its own, and a response nobody joined is handed over
        // as it came, unread.
        let followers = leader.close();
        if followers == 0 {
            return Landed::Now(Ok(response));
        }
        if !body::shareable(&response, self.max_body) {
            // A stream, a body over the bound, the caller's own answer: the sender gets
            // it as it came, at its head, and each follower sends its own request.
            leader.land(Arc::new(Landing::NotShared));
            return Landed::Now(Ok(response));
        }
        Landed::ToShare {
            leader,
            response,
            callers: followers.saturating_add(1),
        }
    }

    /// Reads `response`'s body whole for the `callers` that share it, tells the followers,
    /// and hands the leader its own copy.
    async fn share(
        &self,
        leader: flight::Leader<'_>,
        response: Response,
        callers: u32,
        extensions: &mut Extensions,
    ) -> reqwest_middleware::Result<Response> {
        match body::read(response, self.max_body).await {
            body::Read::Whole { head, url, body } => {
                let shared = SharedResponse::new(head, url, body, Record::of(extensions), callers);
                let own = shared.response_for(SharedRole::Sent);
                mark_shared(extensions, &shared.record, callers);
                leader.land(Arc::new(Landing::Response(shared)));
                Ok(own)
            }
            body::Read::Unshared(response) => {
                leader.land(Arc::new(Landing::NotShared));
                Ok(response)
            }
        }
    }
}

/// Whether the sender's request ended for the sender's own reason: its retry stopped
/// at the deadline, or it failed once its [`Deadline`] had passed. Its followers started
/// later, with limits of their own: they are not handed that end.
fn stopped_by_its_own_deadline(
    result: &reqwest_middleware::Result<Response>,
    extensions: &Extensions,
) -> bool {
    let stopped =
        RetryOutcome::of(extensions).is_some_and(|o| o.stop == StopReason::DeadlineExceeded);
    stopped
        || (result.is_err()
            && extensions
                .get::<Deadline>()
                .is_some_and(|d| tokio::time::Instant::now() >= d.0))
}

/// A follower's wait, bounded by its own [`Deadline`]: past it, tokio's `Elapsed` (as the
/// retry middleware's cut), and the flight goes on without it.
async fn wait_within_deadline(
    landed: tokio::sync::watch::Receiver<flight::Published>,
    extensions: &Extensions,
) -> Result<Waited, reqwest_middleware::Error> {
    match extensions.get::<Deadline>() {
        None => Ok(flight::wait(landed).await),
        Some(deadline) => tokio::time::timeout_at(deadline.0, flight::wait(landed))
            .await
            .map_err(reqwest_middleware::Error::middleware),
    }
}

/// A follower's result from the landing (`None`: not shareable, it sends its own).
fn follow(
    landing: &Landing,
    extensions: &mut Extensions,
) -> Option<reqwest_middleware::Result<Response>> {
    let record = match landing {
        Landing::Response(shared) => &shared.record,
        Landing::Failed { record, .. } => record,
        Landing::NotShared => return None,
    };
    crate::metrics::coalesced(record.origin(), "joined");
    match landing {
        Landing::Response(shared) => {
            shared
                .record
                .leave(extensions, shared.shared(SharedRole::Joined));
            Some(Ok(shared.response_for(SharedRole::Joined)))
        }
        Landing::Failed {
            error,
            record,
            callers,
        } => {
            let shared = crate::record::Shared {
                role: SharedRole::Joined,
                callers: *callers,
            };
            record.leave(extensions, shared);
            Some(Err(reqwest_middleware::Error::middleware(
                ResilienceError::SharedRequestFailed {
                    error: error.clone(),
                },
            )))
        }
        Landing::NotShared => None,
    }
}

/// Marks the leader's own history shared, when anyone joined it (and counts it).
fn mark_shared(extensions: &mut Extensions, record: &Record, callers: u32) {
    if callers > 1 {
        crate::record::RequestRecord::history_mut(extensions).mark_shared(crate::record::Shared {
            role: SharedRole::Sent,
            callers,
        });
        crate::metrics::coalesced(record.origin(), "sent");
    }
}
