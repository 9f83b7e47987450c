//! [`EventStream`]: a request through the user's client as a `Stream` of server-sent
//! events that reconnects by the standard's rules and the crate's evidence.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures_core::Stream;
use http::{Extensions, HeaderValue, StatusCode, header};
use reqwest::Response;
use reqwest_middleware::{ClientWithMiddleware, RequestBuilder};
use tokio::time::{Instant, Sleep};

use crate::error::ResilienceError;
use crate::origin::Origin;
use crate::record::{AttemptHistory, FailureKind, Transmission};
use crate::stream::error::EventStreamError;
use crate::stream::parse::{Event, EventParser};
use crate::stream::reconnect::{Reconnect, ReconnectCause, ReconnectPolicy, Reconnection};

/// What an [`EventStream`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamItem {
    /// A connection opened: `200` with `text/event-stream` (first, and after each
    /// reconnect).
    Opened,
    /// An event the server dispatched.
    Event(Event),
    /// The connection ended or could not be opened, and the stream reconnects after
    /// `delay` (no event is lost: the next connection sends `Last-Event-ID`).
    Reconnecting(Reconnection),
}

type Connecting =
    Pin<Box<dyn Future<Output = (reqwest_middleware::Result<Response>, Extensions)> + Send>>;

/// The client each connection goes through: reqwest-middleware's, or the astral fork's.
#[derive(Clone)]
enum Client {
    Crates(ClientWithMiddleware),
    #[cfg(feature = "astral")]
    Astral(astral_reqwest_middleware::ClientWithMiddleware),
}

impl Client {
    /// One connection's request, sent with the stream's extensions.
    fn send(self, request: reqwest::Request, mut extensions: Extensions) -> Connecting {
        match self {
            Client::Crates(client) => Box::pin(async move {
                let result = client
                    .execute_with_extensions(request, &mut extensions)
                    .await;
                (result, extensions)
            }),
            // The fork's error is the same two cases: read as reqwest-middleware's, so
            // `ResilienceError::find` and the evidence answer the same.
            #[cfg(feature = "astral")]
            Client::Astral(client) => Box::pin(async move {
                let result = client
                    .execute_with_extensions(request, &mut extensions)
                    .await
                    .map_err(|e| match e {
                        astral_reqwest_middleware::Error::Middleware(e) => {
                            reqwest_middleware::Error::Middleware(e)
                        }
                        astral_reqwest_middleware::Error::Reqwest(e) => {
                            reqwest_middleware::Error::Reqwest(e)
                        }
                    });
                (result, extensions)
            }),
        }
    }
}

/// Where the stream is.
enum State {
    /// The next poll opens a connection.
    Connect,
    Connecting(Connecting),
    Open {
        body: reqwest::Body,
        idle: Option<Pin<Box<Sleep>>>,
    },
    Waiting(Pin<Box<Sleep>>),
    Done,
}

/// What a connection's outcome calls for.
enum Judged {
    Open(reqwest::Body),
    Reconnect(ReconnectCause, Option<Duration>),
    /// `204 No Content`: the server says stop.
    Stop,
    Fail(EventStreamError),
}

/// A request as a `Stream` of server-sent events over a
/// [`ClientWithMiddleware`]: each connection is one request through the client (its
/// retries, breaker and bearer token apply to it), and the stream reconnects from its
/// outcome. See the [module docs](crate::stream) for the rules.
///
/// ```no_run
/// use futures_util::StreamExt;
/// use reqwest_resilience::Resilience;
/// use reqwest_resilience::stream::{EventStream, StreamItem};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Resilience::new().build_from(reqwest::Client::builder)?;
/// let mut events = EventStream::new(client.get("https://api.example.com/v1/feed"))?;
/// while let Some(item) = events.next().await {
///     match item? {
///         StreamItem::Event(event) => println!("{} {}: {}", event.id, event.event, event.data),
///         StreamItem::Reconnecting(r) => eprintln!("{:?}: again in {:?}", r.cause, r.delay),
///         _ => {}
///     }
/// }
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Dropping the stream drops its connection (closed, not returned to the pool half read)
/// or its pending reconnect; it spawns no task, so nothing is left behind. An event is
/// delivered whole or not at all.
pub struct EventStream {
    client: Client,
    request: reqwest::Request,
    extensions: Extensions,
    origin: Option<Origin>,
    parser: EventParser,
    reconnect: Reconnect,
    idle_timeout: Option<Duration>,
    /// The request may be sent again after a response began.
    resend: bool,
    state: State,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The request's headers are left out: they may carry a token.
        f.debug_struct("EventStream")
            .field("method", self.request.method())
            .field("origin", &self.origin)
            .field("last_event_id", &self.parser.last_event_id())
            .field("idle_timeout", &self.idle_timeout)
            .field("resend", &self.resend)
            .finish_non_exhaustive()
    }
}

impl EventStream {
    /// The stream of the request `builder` describes, on its client, with the default
    /// [`ReconnectPolicy`]. Nothing is sent before the stream is polled.
    ///
    /// # Errors
    ///
    /// The request cannot be built (reqwest's error, as
    /// [`EventStreamError::Request`]).
    pub fn new(mut builder: RequestBuilder) -> Result<EventStream, EventStreamError> {
        let extensions = std::mem::take(builder.extensions());
        let (client, request) = builder.build_split();
        let request = request.map_err(|e| EventStreamError::Request(e.into()))?;
        EventStream::over(Client::Crates(client), request, extensions)
    }

    /// [`new`](Self::new) for the astral fork's `RequestBuilder` (feature `astral`): the
    /// same stream, each connection through the fork's client; its errors are carried as
    /// reqwest-middleware's (the same two cases).
    ///
    /// # Errors
    ///
    /// The request cannot be built.
    #[cfg(feature = "astral")]
    #[cfg_attr(docsrs, doc(cfg(feature = "astral")))]
    pub fn new_astral(
        mut builder: astral_reqwest_middleware::RequestBuilder,
    ) -> Result<EventStream, EventStreamError> {
        let extensions = std::mem::take(builder.extensions());
        let (client, request) = builder.build_split();
        let request = request.map_err(|e| EventStreamError::Request(e.into()))?;
        EventStream::over(Client::Astral(client), request, extensions)
    }

    fn over(
        client: Client,
        request: reqwest::Request,
        extensions: Extensions,
    ) -> Result<EventStream, EventStreamError> {
        let origin = Origin::from_url(request.url()).ok();
        let resend = crate::record::idempotent_request(request.method(), request.headers());
        let mut reconnect = Reconnect::new(ReconnectPolicy::default())
            .map_err(|e| EventStreamError::Request(reqwest_middleware::Error::middleware(e)))?;
        if let Some(o) = &origin {
            reconnect = reconnect.origin(o.clone());
        }
        let mut parser = EventParser::new();
        // A `Last-Event-ID` set on the request is where the stream starts.
        if let Some(id) = request.headers().get("last-event-id") {
            parser.set_last_event_id(String::from_utf8_lossy(id.as_bytes()));
        }
        Ok(EventStream {
            client,
            request,
            extensions,
            origin,
            parser,
            reconnect,
            idle_timeout: None,
            resend,
            state: State::Connect,
        })
    }

    /// Reconnects under `policy`.
    ///
    /// # Errors
    ///
    /// [`ResilienceError::InvalidConfig`] for a policy that cannot work.
    pub fn reconnect_policy(mut self, policy: ReconnectPolicy) -> Result<Self, ResilienceError> {
        self.reconnect = Reconnect::new(policy)?;
        if let Some(o) = &self.origin {
            self.reconnect = self.reconnect.origin(o.clone());
        }
        Ok(self)
    }

    /// Ends a connection on which no byte (a comment included) came for `timeout`, and
    /// reconnects ([`ReconnectCause::Idle`]). Off by default: a client built by
    /// [`Resilience::build_from`](crate::Resilience::build_from) already cuts a body silent
    /// for 300 s ([`guide::streams`](crate::guide::streams), "Dead streams").
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Lets a request that is not idempotent (a `POST` without `Idempotency-Key`) be sent
    /// again after its response began: only for a server known to resume such a stream
    /// from `Last-Event-ID` rather than run it again. Off by default.
    pub fn resend_non_idempotent(mut self, resend: bool) -> Self {
        self.resend = self.resend || resend;
        self
    }

    /// The last event id: what the next connection sends as `Last-Event-ID` (empty:
    /// none). It counts the events dispatched so far, taken or still queued in the stream.
    pub fn last_event_id(&self) -> &str {
        self.parser.last_event_id()
    }

    /// Starts from `id`, e.g. one kept from an earlier run: the first connection sends it.
    pub fn set_last_event_id(&mut self, id: impl Into<String>) {
        self.parser.set_last_event_id(id);
    }

    /// The first request of the next connection: the template, with `Last-Event-ID`.
    fn next_request(&self) -> Option<reqwest::Request> {
        let mut request = self.request.try_clone()?;
        let headers = request.headers_mut();
        headers
            .entry(header::ACCEPT)
            .or_insert(HeaderValue::from_static("text/event-stream"));
        headers
            .entry(header::CACHE_CONTROL)
            .or_insert(HeaderValue::from_static("no-store"));
        let id = self.parser.last_event_id();
        // An id with a control character cannot be a header value: sent without one.
        match HeaderValue::from_bytes(id.as_bytes()) {
            Ok(value) if !id.is_empty() => {
                headers.insert("last-event-id", value);
            }
            _ => {
                headers.remove("last-event-id");
            }
        }
        Some(request)
    }

    fn connect(&mut self) -> Result<(), EventStreamError> {
        let request = self
            .next_request()
            .ok_or(EventStreamError::BodyNotClonable)?;
        let connecting = self.client.clone().send(request, self.extensions.clone());
        self.state = State::Connecting(connecting);
        Ok(())
    }

    /// What the connection's outcome calls for (the standard's rules, then the crate's).
    fn judge(&self, result: reqwest_middleware::Result<Response>, ext: &Extensions) -> Judged {
        let response = match result {
            Ok(response) => response,
            Err(e) => return self.judge_failure(e, ext),
        };
        let status = response.status();
        match status {
            StatusCode::OK if is_event_stream(response.headers()) => {
                Judged::Open(http::Response::from(response).into_body())
            }
            StatusCode::OK => Judged::Fail(EventStreamError::ContentType(
                response.headers().get(header::CONTENT_TYPE).cloned(),
            )),
            StatusCode::NO_CONTENT => Judged::Stop,
            s if (s.is_server_error() || s == 429 || s == 408) && self.resend => {
                let wait = response
                    .headers()
                    .get(header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| crate::retry_after::parse(v, SystemTime::now()));
                Judged::Reconnect(ReconnectCause::Status(s), wait)
            }
            s => Judged::Fail(EventStreamError::Status(s)),
        }
    }

    /// A connection the client returned an error for (its own retries done).
    fn judge_failure(&self, e: reqwest_middleware::Error, ext: &Extensions) -> Judged {
        let found = ResilienceError::find(&e);
        if let Some(retry_in) = found.and_then(rejected_locally) {
            return Judged::Reconnect(ReconnectCause::Rejected, retry_in);
        }
        if matches!(
            found,
            Some(
                ResilienceError::InvalidConfig(_)
                    | ResilienceError::InvalidStack(_)
                    | ResilienceError::Misconfigured(_)
            )
        ) {
            return Judged::Fail(EventStreamError::Request(e));
        }
        let history = AttemptHistory::of(ext);
        let last = history.and_then(|h| h.last()).map(|a| &a.evidence);
        let kind = last.and_then(|ev| ev.failure);
        // Never sent: harmless to send again, whatever the method. Without the transport
        // step there is no proof (a refused connect may be a redirect's second hop).
        let unsent = history.is_some_and(|h| {
            !h.is_empty()
                && h.attempts()
                    .iter()
                    .all(|a| a.evidence.transmission == Transmission::NotSent)
        });
        match kind {
            Some(k) if permanent(k) => Judged::Fail(EventStreamError::Request(e)),
            _ if unsent || self.resend => Judged::Reconnect(ReconnectCause::Failed(kind), None),
            _ => Judged::Fail(EventStreamError::Request(e)),
        }
    }

    /// Plans the reconnect after `cause`: the item that says so, or the budget's end.
    fn reconnect_after(
        &mut self,
        cause: ReconnectCause,
        wait: Option<Duration>,
    ) -> Result<StreamItem, EventStreamError> {
        match self.reconnect.plan_now(cause, wait) {
            Ok(next) => {
                self.state = State::Waiting(Box::pin(tokio::time::sleep(next.delay)));
                Ok(StreamItem::Reconnecting(next))
            }
            Err(gave_up) => {
                self.state = State::Done;
                Err(EventStreamError::GaveUp(gave_up))
            }
        }
    }

    /// An open connection ended with `cause`: what was cut is discarded, and the stream
    /// reconnects unless its request must not be sent again.
    fn ended(&mut self, cause: ReconnectCause) -> Option<Result<StreamItem, EventStreamError>> {
        self.parser.end_of_stream();
        self.state = State::Done;
        match (self.resend, cause) {
            (true, _) => Some(self.reconnect_after(cause, None)),
            // A non-idempotent stream the server ended is complete (an answer in full).
            (false, ReconnectCause::Ended) => None,
            (false, cause) => Some(Err(EventStreamError::NotResent { cause })),
        }
    }

    /// Polls the open connection: `None` while it only fed the parser.
    fn poll_open(&mut self, cx: &mut Context<'_>) -> Poll<Option<ReconnectCause>> {
        let State::Open { body, idle } = &mut self.state else {
            return Poll::Ready(None);
        };
        loop {
            match http_body::Body::poll_frame(Pin::new(&mut *body), cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        self.parser.feed(data);
                    }
                    if let (Some(sleep), Some(timeout)) = (idle.as_mut(), self.idle_timeout) {
                        sleep.as_mut().reset(Instant::now() + timeout);
                    }
                    if self.parser.pending() > 0 {
                        return Poll::Ready(None);
                    }
                }
                Poll::Ready(Some(Err(_))) => return Poll::Ready(Some(ReconnectCause::Cut)),
                Poll::Ready(None) => return Poll::Ready(Some(ReconnectCause::Ended)),
                Poll::Pending => break,
            }
        }
        match idle.as_mut().map(|sleep| sleep.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Some(ReconnectCause::Idle)),
            _ => Poll::Pending,
        }
    }

    /// A finished connect: opened, or a reconnect planned, or the end.
    fn connected(
        &mut self,
        result: reqwest_middleware::Result<Response>,
        ext: Extensions,
    ) -> Option<Result<StreamItem, EventStreamError>> {
        match self.judge(result, &ext) {
            Judged::Open(body) => {
                self.reconnect.opened();
                let idle = self.idle_timeout.map(|t| Box::pin(tokio::time::sleep(t)));
                self.state = State::Open { body, idle };
                Some(Ok(StreamItem::Opened))
            }
            Judged::Reconnect(cause, wait) => Some(self.reconnect_after(cause, wait)),
            Judged::Stop => {
                self.state = State::Done;
                None
            }
            Judged::Fail(e) => {
                self.state = State::Done;
                Some(Err(e))
            }
        }
    }
}

impl Stream for EventStream {
    type Item = Result<StreamItem, EventStreamError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(event) = this.parser.next_event() {
                return Poll::Ready(Some(Ok(StreamItem::Event(event))));
            }
            match &mut this.state {
                State::Connect => {
                    if let Err(e) = this.connect() {
                        this.state = State::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                }
                State::Connecting(connecting) => {
                    let (result, ext) = std::task::ready!(connecting.as_mut().poll(cx));
                    return Poll::Ready(this.connected(result, ext));
                }
                State::Open { .. } => {
                    if let Some(cause) = std::task::ready!(this.poll_open(cx)) {
                        if let Some(time) = this.parser.reconnection_time() {
                            this.reconnect.set_reconnection_time(time);
                        }
                        return Poll::Ready(this.ended(cause));
                    }
                }
                State::Waiting(sleep) => {
                    std::task::ready!(sleep.as_mut().poll(cx));
                    this.state = State::Connect;
                }
                State::Done => return Poll::Ready(None),
            }
        }
    }
}

/// Whether the response is `text/event-stream` (its parameters, e.g. `charset`, aside).
fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// A rejection on this side (an open breaker, a pause, a rate limit) and its wait.
fn rejected_locally(e: &ResilienceError) -> Option<Option<Duration>> {
    match e {
        ResilienceError::BreakerOpen { retry_in, .. } => Some(*retry_in),
        ResilienceError::Paused { retry_in, .. }
        | ResilienceError::RateLimited { retry_in, .. } => Some(Some(*retry_in)),
        _ => None,
    }
}

/// Failures no reconnect changes.
fn permanent(kind: FailureKind) -> bool {
    matches!(
        kind,
        FailureKind::Certificate
            | FailureKind::ConnectPermanent
            | FailureKind::Builder
            | FailureKind::Redirect
            | FailureKind::Misconfigured
            | FailureKind::UploadBody
    )
}
