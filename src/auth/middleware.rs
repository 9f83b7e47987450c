//! [`BearerAuth`]: the middleware that attaches the token and heals a `401` once.

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use crate::stage::{
    HandedRequest, Handover, RequestSlot, RestOfStack, Stage, standalone_middleware,
};
use crate::upload::ReplayableBody;
use http::{Extensions, HeaderValue, StatusCode, header};
use reqwest::{Request, Response, Url};

use super::manager::TokenManager;
use crate::error::{ResilienceError, TokenError, TokenErrorKind};
use crate::origin::Origin;
use crate::record::{FailureKind, Redirects, RequestEvidence, record_rejected_locally};
use crate::token::AccessToken;

/// Attaches `Authorization: Bearer <token>` from a [`TokenManager`] to the requests sent
/// to the origins it is configured for, and heals a `401` with one refresh and one replay.
///
/// - **Scope**: only requests whose [`Origin`] is in the configured set get the header;
///   by default only `https` origins can be configured (opt in to plain `http` with
///   [`BearerAuthBuilder::allow_http_on_loopback`] or [`BearerAuthBuilder::allow_http`]).
///   A request that already carries an `Authorization` header is left alone.
/// - **Secrecy**: the header value is marked sensitive (`http` prints it as `Sensitive`),
///   and no `Debug`, `Display`, error or log event of this crate contains the token.
///   On a redirect to another origin, reqwest itself drops `Authorization`.
/// - **`401`**: the token that was sent is invalidated only if it is still the current
///   one (so N concurrent `401`s cause one refresh), a token is fetched (or the refresh
///   another request started is joined), and the request is replayed once if its body can
///   be cloned (a streaming body cannot: the `401` is returned, and the next request
///   gets the new token). A second `401` is returned as it is. A hook can look at the
///   `401` (its `WWW-Authenticate` challenge) first and decline the refresh and replay
///   ([`BearerAuthBuilder::on_unauthorized`]). A `401` that comes after a redirect (from
///   any origin: the response's URL is not the request's, or the transport step saw a
///   redirect) is returned as it is, with no refresh: it answers a later hop, while the
///   request sent was received and answered (`3xx`), so replaying it would repeat it
///   (and on a cross-origin hop reqwest dropped the token, so that server never saw it).
/// - **Errors**: when no token can be had, the request is not sent and the call fails with
///   [`ResilienceError::Token`] inside `reqwest_middleware::Error::Middleware` (also when
///   the refresh after a `401` fails: the replay is then not sent). The attempt that was
///   not sent is recorded like a breaker rejection: a `NotSent`
///   [`RequestEvidence`](crate::RequestEvidence) with [`FailureKind::TokenUnavailable`] in
///   the extensions and appended to the [`AttemptHistory`](crate::AttemptHistory), its
///   `retry_after` set to when the manager will fetch again ([`TokenError::retry_at`]). The
///   breaker counts it as neutral; the retry middleware retries it (any method: nothing was
///   sent), not before that time.
///
/// Place it inside the retry and breaker middlewares, outside `TransportEvidence`.
///
/// ```
/// use std::time::Duration;
/// use reqwest_middleware::ClientBuilder;
/// use reqwest_resilience::{AccessToken, BearerAuth, Origin, TokenManager, TransportEvidence};
/// use reqwest_resilience::redirect::{self, ClientRedirects};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let tokens = TokenManager::new(|| async {
///     Ok::<_, std::io::Error>(AccessToken::new("s3cr3t").expires_in(Duration::from_secs(3600)))
/// });
/// let auth = BearerAuth::builder(tokens)
///     .origin(Origin::parse("https://api.example.com")?)
///     .build()?;
/// let recorded = redirect::recorded(reqwest::redirect::Policy::default()); // every hop seen
/// let client = ClientBuilder::new(reqwest::Client::builder().redirect(recorded).build()?)
///     .with(auth)
///     .with(TransportEvidence::with_client_redirects(ClientRedirects::Recorded))
///     .build();
/// # drop(client);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct BearerAuth {
    manager: TokenManager,
    origins: Arc<[Origin]>,
    on_unauthorized: Option<UnauthorizedHook>,
}

type UnauthorizedHook = Arc<dyn Fn(&Challenge<'_>) -> ChallengeAction + Send + Sync>;

/// A `401 Unauthorized` answered to a request that carried this middleware's token, shown
/// to the hook set with [`BearerAuthBuilder::on_unauthorized`].
pub struct Challenge<'a> {
    origin: &'a Origin,
    response: &'a Response,
}

impl<'a> Challenge<'a> {
    /// The origin that answered `401`.
    pub fn origin(&self) -> &'a Origin {
        self.origin
    }

    /// The `WWW-Authenticate` values of the response (RFC 9110 §11.6.1), e.g.
    /// `Bearer error="insufficient_scope"` or a claims challenge.
    pub fn www_authenticate(&self) -> impl Iterator<Item = &'a HeaderValue> + 'a {
        self.response
            .headers()
            .get_all(header::WWW_AUTHENTICATE)
            .iter()
    }

    /// All headers of the `401` response.
    pub fn headers(&self) -> &'a http::HeaderMap {
        self.response.headers()
    }
}

impl fmt::Debug for Challenge<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Challenge")
            .field("origin", self.origin)
            .field(
                "www_authenticate",
                &self.www_authenticate().collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// What [`BearerAuth`] does after a `401`, as decided by the hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ChallengeAction {
    /// Invalidate the token if it is still current, refresh, replay once. The default.
    #[default]
    RefreshAndReplay,
    /// Return the `401` as it is (a new token would not help, e.g. `insufficient_scope`).
    ReturnResponse,
}

/// Which origins may receive the token over plain `http`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HttpPolicy {
    Never,
    Loopback,
    Any,
}

/// Settings of a [`BearerAuth`], from [`BearerAuth::builder`].
pub struct BearerAuthBuilder {
    manager: TokenManager,
    origins: Vec<Origin>,
    http: HttpPolicy,
    on_unauthorized: Option<UnauthorizedHook>,
}

impl BearerAuth {
    /// A builder; at least one origin must be added.
    pub fn builder(manager: TokenManager) -> BearerAuthBuilder {
        BearerAuthBuilder {
            manager,
            origins: Vec::new(),
            http: HttpPolicy::Never,
            on_unauthorized: None,
        }
    }

    /// The token manager this middleware draws from.
    pub fn manager(&self) -> &TokenManager {
        &self.manager
    }

    /// Whether a request to `url` gets the token (ignoring any header already present):
    /// the middleware's own test, on the URL's [`Origin`] (so every spelling of a host the
    /// middleware treats as one, an IPv4-mapped IPv6 address among them, answers alike).
    pub fn covers(&self, url: &Url) -> bool {
        Origin::cached(url).is_some_and(|origin| self.covers_origin(&origin))
    }

    /// Whether requests to `origin` get the token: what the middleware asks, with the
    /// origin the stages share (an `Origin` compares as its normalised text).
    fn covers_origin(&self, origin: &Origin) -> bool {
        self.origins.contains(origin)
    }

    fn challenge_action(&self, origin: &Origin, response: &Response) -> ChallengeAction {
        match &self.on_unauthorized {
            Some(hook) => hook(&Challenge { origin, response }),
            None => ChallengeAction::RefreshAndReplay,
        }
    }
}

impl BearerAuthBuilder {
    /// Adds an origin whose requests get the token.
    pub fn origin(mut self, origin: Origin) -> Self {
        if !self.origins.contains(&origin) {
            self.origins.push(origin);
        }
        self
    }

    /// Allows `http` origins whose host is a loopback address (`127.0.0.0/8`, `[::1]`,
    /// `localhost`): for tests and local sidecars, where nothing crosses a network.
    pub fn allow_http_on_loopback(mut self) -> Self {
        if self.http == HttpPolicy::Never {
            self.http = HttpPolicy::Loopback;
        }
        self
    }

    /// Allows any `http` origin. The token then crosses the network in clear text: only
    /// for networks you trust completely.
    pub fn allow_http(mut self) -> Self {
        self.http = HttpPolicy::Any;
        self
    }

    /// Sets a hook that sees every `401` answered to a request carrying the token (with
    /// its `WWW-Authenticate` challenge) and decides whether to refresh and replay.
    /// Without a hook the answer is always [`ChallengeAction::RefreshAndReplay`].
    ///
    /// ```
    /// use reqwest_resilience::auth::{BearerAuthBuilder, ChallengeAction};
    ///
    /// fn skip_scope_errors(builder: BearerAuthBuilder) -> BearerAuthBuilder {
    ///     builder.on_unauthorized(|challenge| {
    ///         let scope = challenge.www_authenticate().any(|v| {
    ///             v.to_str().is_ok_and(|v| v.contains("insufficient_scope"))
    ///         });
    ///         if scope { ChallengeAction::ReturnResponse } else { ChallengeAction::RefreshAndReplay }
    ///     })
    /// }
    /// ```
    pub fn on_unauthorized<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Challenge<'_>) -> ChallengeAction + Send + Sync + 'static,
    {
        self.on_unauthorized = Some(Arc::new(hook));
        self
    }

    /// The middleware.
    ///
    /// # Errors
    ///
    /// [`ResilienceError::InvalidConfig`] when no origin was added, an origin's scheme is
    /// neither `https` nor `http`, or an `http` origin was added without the matching
    /// opt-in.
    pub fn build(self) -> Result<BearerAuth, ResilienceError> {
        if self.origins.is_empty() {
            return Err(ResilienceError::InvalidConfig(
                "BearerAuth needs at least one origin".into(),
            ));
        }
        for origin in &self.origins {
            match origin.scheme() {
                "https" => {}
                "http" => match self.http {
                    HttpPolicy::Any => {}
                    HttpPolicy::Loopback if is_loopback(origin) => {}
                    HttpPolicy::Loopback => {
                        return Err(ResilienceError::InvalidConfig(format!(
                            "BearerAuth: {origin} is plain http and not loopback; \
                             use https or allow_http()"
                        )));
                    }
                    HttpPolicy::Never => {
                        return Err(ResilienceError::InvalidConfig(format!(
                            "BearerAuth: {origin} is plain http; use https, or opt in with \
                             allow_http_on_loopback() or allow_http()"
                        )));
                    }
                },
                other => {
                    return Err(ResilienceError::InvalidConfig(format!(
                        "BearerAuth: scheme {other:?} of {origin} is not http(s)"
                    )));
                }
            }
        }
        Ok(BearerAuth {
            manager: self.manager,
            origins: self.origins.into(),
            on_unauthorized: self.on_unauthorized,
        })
    }
}

pub(super) fn is_loopback(origin: &Origin) -> bool {
    let host = origin.host();
    if host == "localhost" {
        return true;
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn attach(req: &mut Request, token: &AccessToken) -> Result<(), TokenError> {
    // The manager only caches tokens that have a header; this is defence in depth.
    let value = token
        .authorization_header()
        .cloned()
        .ok_or_else(|| TokenError::new(TokenErrorKind::InvalidSecret, None, None))?;
    req.headers_mut().insert(header::AUTHORIZATION, value);
    Ok(())
}

/// The error for a request that got no token, after leaving its `NotSent` evidence where
/// the breaker, the retry middleware and the caller look (as a breaker rejection does):
/// without it the attempt would read as `Unknown`, and a POST that never left would be
/// stopped as "may have been processed".
fn token_unavailable(
    e: TokenError,
    url: &Url,
    extensions: &mut Extensions,
) -> reqwest_middleware::Error {
    // Until then the manager answers with this same error at once: a retry sooner is wasted.
    let refetch = e
        .retry_at()
        .map(|at| at.saturating_duration_since(tokio::time::Instant::now()));
    record_rejected_locally(
        extensions,
        FailureKind::TokenUnavailable,
        Origin::cached(url),
        refetch,
    );
    reqwest_middleware::Error::middleware(ResilienceError::Token(e))
}

impl BearerAuth {
    /// Whether this middleware attaches its token to `req`: one of its origins, and no
    /// `Authorization` header of the caller's.
    #[inline]
    fn attaches_to(&self, req: &Request, handover: &Handover<'_>) -> bool {
        !req.headers().contains_key(header::AUTHORIZATION)
            && handover
                .origin(req.url())
                .is_some_and(|origin| self.covers_origin(&origin))
    }
}

standalone_middleware!(BearerAuth);

/// `BearerAuth`'s token fetch as a stage of its own, which the composed stack runs
/// outside the breaker and the limiter: an attempt gets its token before it takes a
/// half-open probe slot or a limiter permit, so a token source that fetches from the
/// same origin through the same breaker registry is not refused by the probe its own
/// request holds, and a token outage holds no permit. A fetch that fails ends the
/// attempt as `BearerAuth` would (`NotSent`, [`FailureKind::TokenUnavailable`]), before
/// the breaker and the limiter see it. `BearerAuth` itself, inside them, attaches the
/// token and keeps the `401` replay, so the breaker still sees the outcome after it.
#[derive(Clone)]
pub(crate) struct TokenFirst(pub(crate) BearerAuth);

impl Stage for TokenFirst {
    #[allow(clippy::manual_async_fn)]
    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        async move {
            if !self.0.attaches_to(&req, &handover) {
                return next.run(req, extensions, handover).await;
            }
            let token = match self.0.manager.token().await {
                Ok(token) => token,
                Err(e) => return Err(token_unavailable(e, req.url(), extensions)),
            };
            next.run(req, extensions, handover.with_token(&token)).await
        }
    }
}

impl Stage for BearerAuth {
    #[allow(clippy::manual_async_fn)]
    fn serve<'a, N: RestOfStack + 'a>(
        &'a self,
        mut req: HandedRequest<'a>,
        extensions: &'a mut Extensions,
        handover: Handover<'a>,
        next: N,
    ) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + 'a {
        async move {
            let owner = handover.enter(extensions, "BearerAuth", false, req.url())?;
            // In the composed stack `TokenFirst` decided, outside the breaker and the
            // limiter, and fetched the token; used alone, this stage does both.
            let handed = handover.token();
            let composed = handover.composed();
            if handed.is_none() && (composed || !self.attaches_to(&req, &handover)) {
                return owner
                    .poll_as(next, |next| next.run(req, extensions, handover))
                    .await;
            }
            let token = match handed {
                Some(token) => Cow::Borrowed(token),
                None => match self.manager.token().await {
                    Ok(token) => Cow::Owned(token),
                    Err(e) => return Err(token_unavailable(e, req.url(), extensions)),
                },
            };
            let sent = Sent::of(&req, handover.spare(), extensions);
            if let Err(e) = attach(&mut req, &token) {
                return Err(token_unavailable(e, req.url(), extensions));
            }
            // The request now carries the token: the outside's copy no longer matches it.
            let inner = handover.without_spare();
            let response = owner
                .poll_as(next.clone(), |next| next.run(req, extensions, inner))
                .await?;
            if response.status() != StatusCode::UNAUTHORIZED {
                return Ok(response);
            }
            // Rare: a second token wait (boxed: stage cost rule 2).
            Box::pin(
                self.after_unauthorized(&token, sent, response, extensions, inner, next, owner),
            )
            .await
        }
    }
}

/// What was sent, to replay after a `401` and to tell a `401` from elsewhere (after a
/// redirect).
enum Sent<'a> {
    /// The copy the stage outside keeps for its own retry (the retry middleware's spare):
    /// copied again only for a replay, so the common case makes one copy per attempt.
    Outside(&'a Request),
    /// A copy of our own.
    Copy(Request),
    /// A streamed body, which cannot be sent twice: only its URL.
    Streamed(Url),
}

impl<'a> Sent<'a> {
    fn of(req: &Request, outside: Option<&'a Request>, extensions: &Extensions) -> Self {
        match outside {
            Some(spare) => Sent::Outside(spare),
            None => match crate::stage::copy_request(req) {
                Some(copy) => Sent::Copy(copy),
                // A replayable upload: its body is opened again for the replay.
                None if ReplayableBody::of(extensions).is_some() => {
                    Sent::Copy(crate::stage::copy_head(req))
                }
                None => Sent::Streamed(req.url().clone()),
            },
        }
    }

    fn url(&self) -> &Url {
        match self {
            Sent::Outside(req) => req.url(),
            Sent::Copy(req) => req.url(),
            Sent::Streamed(url) => url,
        }
    }

    /// The request to replay, if it can be.
    fn replay(self) -> Option<Request> {
        match self {
            Sent::Outside(req) => crate::stage::copy_request(req),
            Sent::Copy(req) => Some(req),
            Sent::Streamed(_) => None,
        }
    }
}

impl BearerAuth {
    /// The `401` path of [`serve`](Stage::serve): refresh and replay once, or return the
    /// response as it is.
    #[allow(clippy::too_many_arguments)]
    async fn after_unauthorized<N: RestOfStack>(
        &self,
        token: &AccessToken,
        sent: Sent<'_>,
        response: Response,
        extensions: &mut Extensions,
        handover: Handover<'_>,
        next: N,
        owner: crate::stage::scope::Ownership,
    ) -> reqwest_middleware::Result<Response> {
        // After a redirect the 401 answers a later hop, not the request this middleware
        // sent, which was received and answered (3xx): replaying it would repeat it, and
        // the token may not even have travelled (reqwest strips it on a cross-origin hop).
        // Nothing to heal, and no refresh to burn.
        let redirected = crate::redirect::without_fragment(sent.url())
            != crate::redirect::without_fragment(response.url())
            || RequestEvidence::of(extensions)
                .is_some_and(|e| matches!(e.redirects, Redirects::Followed { .. }));
        let origin = match Origin::from_url(response.url()) {
            Ok(origin) if !redirected && self.covers_origin(&origin) => origin,
            _ => return Ok(response),
        };
        if self.challenge_action(&origin, &response) == ChallengeAction::ReturnResponse {
            return Ok(response);
        }
        #[cfg(feature = "tracing")]
        tracing::debug!(%origin, replay = !matches!(sent, Sent::Streamed(_)), "401 with a bearer token; refreshing");
        // Whether this call or a concurrent one forgets the token, the next `token()`
        // starts or joins the single refresh.
        self.manager.invalidate_if_current(token);
        // A streamed body cannot be sent twice: the caller gets the 401, and its next
        // request gets a fresh token.
        let Some(mut replay) = sent.replay() else {
            return Ok(response);
        };
        drop(response);
        if let Some(upload) = crate::upload::to_open(&replay, extensions) {
            upload
                .open_into(&mut replay, extensions, Some(origin.clone()))
                .await?;
        }
        let fresh = match self.manager.token().await {
            Ok(token) => token,
            Err(e) => return Err(token_unavailable(e, replay.url(), extensions)),
        };
        if let Err(e) = attach(&mut replay, &fresh) {
            return Err(token_unavailable(e, replay.url(), extensions));
        }
        let mut slot = RequestSlot::new(replay);
        owner
            .poll_as(next, |next| next.run(slot.hand(), extensions, handover))
            .await
    }
}

impl fmt::Debug for BearerAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BearerAuth")
            .field("origins", &self.origins)
            .field("manager", &self.manager)
            .field("on_unauthorized", &self.on_unauthorized.is_some())
            .finish()
    }
}

impl fmt::Debug for BearerAuthBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BearerAuthBuilder")
            .field("origins", &self.origins)
            .field("http", &self.http)
            .field("manager", &self.manager)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manager() -> TokenManager {
        TokenManager::new(|| async { Ok::<_, std::io::Error>(AccessToken::new("t")) })
    }

    #[test]
    fn plain_http_origins_need_an_explicit_opt_in() {
        let local = Origin::parse("http://127.0.0.1:8080").unwrap();
        let remote = Origin::parse("http://api.example.com").unwrap();
        let built = |b: BearerAuthBuilder| b.build().map(|_| ()).map_err(|e| e.to_string());
        assert!(built(BearerAuth::builder(manager()).origin(local.clone())).is_err());
        assert!(
            built(
                BearerAuth::builder(manager())
                    .origin(local.clone())
                    .allow_http_on_loopback()
            )
            .is_ok()
        );
        assert!(
            built(
                BearerAuth::builder(manager())
                    .origin(remote.clone())
                    .allow_http_on_loopback()
            )
            .is_err()
        );
        assert!(built(BearerAuth::builder(manager()).origin(remote).allow_http()).is_ok());
        assert!(built(BearerAuth::builder(manager())).is_err());
        let ftp = Origin::parse("ftp://files.example.com").unwrap();
        assert!(built(BearerAuth::builder(manager()).origin(ftp).allow_http()).is_err());
    }

    #[test]
    fn loopback_hosts_are_recognised() {
        for (url, loopback) in [
            ("http://127.0.0.1:1", true),
            ("http://127.9.9.9:1", true),
            ("http://[::1]:1", true),
            ("http://localhost:1", true),
            ("http://10.0.0.1:1", false),
            ("http://localhost.example.com:1", false),
        ] {
            assert_eq!(is_loopback(&Origin::parse(url).unwrap()), loopback, "{url}");
        }
    }

    #[test]
    fn covers_matches_scheme_host_and_port_exactly() {
        let auth = BearerAuth::builder(manager())
            .origin(Origin::parse("https://API.example.com").unwrap())
            .build()
            .unwrap();
        let covers = |u: &str| auth.covers(&Url::parse(u).unwrap());
        assert!(covers("https://api.example.com/v1"));
        assert!(covers("https://api.EXAMPLE.com:443/v1"));
        assert!(!covers("http://api.example.com/v1"));
        assert!(!covers("https://api.example.com:8443/v1"));
        assert!(!covers("https://evil.example.com/v1"));
        assert!(!covers("https://api.example.com.evil.net/v1"));
        // The stack asks by the shared origin; both ways give one answer.
        for u in [
            "https://api.example.com/v1",
            "https://api.EXAMPLE.com:443/v1",
            "http://api.example.com/v1",
            "https://api.example.com:8443/v1",
            "https://evil.example.com/v1",
            "https://user@api.example.com/v1",
        ] {
            let url = Url::parse(u).unwrap();
            let by_origin = Origin::from_url(&url).is_ok_and(|o| auth.covers_origin(&o));
            assert_eq!(by_origin, auth.covers(&url), "{u}");
        }
    }

    #[test]
    fn covers_answers_as_the_middleware_for_every_spelling_of_an_ip_host() {
        // `Origin` prints an IPv4-mapped IPv6 host `[::ffff:127.0.0.1]`, the `url` crate
        // `[::ffff:7f00:1]`: compared as text they differ, as origins they are one.
        let auth = BearerAuth::builder(manager())
            .origin(Origin::parse("http://[::ffff:127.0.0.1]:8080").unwrap())
            .origin(Origin::parse("https://[2001:DB8::1]").unwrap())
            .allow_http()
            .build()
            .unwrap();
        for (u, covered) in [
            ("http://[::ffff:127.0.0.1]:8080/x", true),
            ("http://[::ffff:7f00:1]:8080/x", true),
            ("http://[0:0:0:0:0:ffff:7f00:1]:8080/x", true),
            ("http://[::ffff:127.0.0.2]:8080/x", false),
            ("http://127.0.0.1:8080/x", false),
            ("https://[2001:db8:0::1]/x", true),
            ("https://[2001:db8::1]:443/x", true),
            ("https://[2001:db8::2]/x", false),
        ] {
            let url = Url::parse(u).unwrap();
            let by_origin = Origin::from_url(&url).is_ok_and(|o| auth.covers_origin(&o));
            assert_eq!((auth.covers(&url), by_origin), (covered, covered), "{u}");
        }
    }
}
