//! [`TokenManager`]: a shared token cache with single-flight refresh.
//!
//! # How the single flight works
//!
//! All state sits behind one `std::sync::Mutex` that is never held across an `.await`:
//! the current token, the failure being backed off from, and the fetch in flight (if
//! any). A fetch in flight is a spawned task plus a `tokio::sync::watch` channel created
//! with it. A caller that needs a token and finds none locks the state and either starts
//! the fetch (spawning the task and installing its channel) or takes a receiver of the
//! channel already installed, all under the same lock. The task publishes its result by
//! first updating the state (under the lock, so later callers see the token or the
//! error without waiting) and then storing the result in the channel. A `watch` channel
//! keeps its value, so a receiver that starts waiting after the value was sent sees it at
//! once: there is no window in which a wake-up can be lost, unlike a flag plus
//! `Notify::notify_waiters`, which wakes only the tasks already waiting.
//!
//! The fetch runs in its own task so that dropping the caller that started it does not
//! cancel it. If that task ends without a result (the source panicked, the runtime shut
//! down), a guard in the task publishes an [`TokenErrorKind::Aborted`] error and clears
//! the flight, so nobody waits forever and the next call starts a new fetch.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{SharedSourceError, TokenError, TokenErrorKind};
use crate::token::{AccessToken, TokenSource};

type FlightResult = Result<AccessToken, TokenError>;
type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// The defaults, named after where they come from.
mod defaults {
    use std::time::Duration;
    /// Azure Identity and the AWS SDKs refresh 5 minutes before expiry.
    pub const REFRESH_AHEAD: Duration = Duration::from_secs(5 * 60);
    /// Spread the refreshes of many processes holding tokens from one issuer.
    pub const REFRESH_JITTER: f64 = 0.1;
    /// Azure Identity waits 30 s between refresh attempts while the token is still valid.
    pub const REFRESH_RETRY_SPACING: Duration = Duration::from_secs(30);
    /// Without a token, the first retry of the source comes quickly…
    pub const FAILURE_BACKOFF_INITIAL: Duration = Duration::from_secs(1);
    /// …and doubling stops here, so an outage is probed twice a minute at most.
    pub const FAILURE_BACKOFF_MAX: Duration = Duration::from_secs(30);
    /// reqwest has no default timeout; an identity provider that hangs must not hang
    /// every request of the process.
    pub const FETCH_TIMEOUT: Duration = Duration::from_secs(30);
}

/// A shared cache of one bearer token, refreshed by one fetch at a time.
///
/// Cheap to clone: clones share the cache. Hand one `TokenManager` to every client that
/// uses the same identity.
///
/// - **Single flight**: when no valid token is cached, the first caller starts one fetch
///   from the [`TokenSource`] and every concurrent caller awaits that same fetch and gets
///   its result, success or error.
/// - **Refresh ahead**: inside a window before expiry (the smaller of 5 minutes and half
///   the token's lifetime, shortened by up to 10 % of jitter) the first caller starts a
///   background fetch and everyone keeps using the still valid token meanwhile.
/// - **Failures**: a refresh that fails while the token is still valid keeps the token and
///   the next refresh attempt waits 30 s. Without a valid token the error reaches every
///   waiter; for a backoff after it (1 s, doubling to 30 s) callers get that same error
///   at once, then the next call fetches again.
/// - **Timeout**: a fetch that takes longer than 30 s fails with
///   [`TokenErrorKind::Timeout`].
/// - **Invalidation**: [`TokenManager::invalidate_if_current`] drops a token a server
///   rejected, only if it is still the cached one, so N concurrent `401`s for one token
///   cause one refresh.
///
/// Fetches run on the Tokio runtime of the caller that starts them.
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::{AccessToken, TokenManager};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), reqwest_resilience::auth::TokenError> {
/// let manager = TokenManager::builder(|| async {
///     Ok::<_, std::io::Error>(AccessToken::new("s3cr3t").expires_in(Duration::from_secs(3600)))
/// })
/// .fetch_timeout(Duration::from_secs(10))
/// .build();
///
/// let token = manager.token().await?;
/// assert_eq!(token.secret(), "s3cr3t");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TokenManager {
    shared: Arc<Shared>,
}

struct Shared {
    source: Box<dyn ErasedSource>,
    config: Config,
    state: Mutex<State>,
}

#[derive(Debug, Clone)]
struct Config {
    fetch_timeout: Duration,
    refresh_ahead: Duration,
    refresh_jitter: f64,
    refresh_retry_spacing: Duration,
    failure_backoff_initial: Duration,
    failure_backoff_max: Duration,
}

#[derive(Default)]
struct State {
    current: Option<Current>,
    flight: Option<Flight>,
    /// After a refresh ahead failed while the token was valid: no new one before this.
    ahead_not_before: Option<Instant>,
    /// After a fetch failed with no valid token: returned to callers until its `retry_at`.
    failure: Option<TokenError>,
    consecutive_failures: u32,
    next_flight_id: u64,
}

struct Current {
    token: AccessToken,
    refresh_at: Option<Instant>,
}

struct Flight {
    id: u64,
    result: watch::Receiver<Option<FlightResult>>,
}

/// Either the answer now, or a fetch to wait for.
enum Lookup {
    Ready(FlightResult),
    Wait(watch::Receiver<Option<FlightResult>>),
}

impl TokenManager {
    /// A manager with the default settings (see [`TokenManagerBuilder`]).
    pub fn new<S: TokenSource>(source: S) -> TokenManager {
        TokenManager::builder(source).build()
    }

    /// A builder to change the timeouts and windows.
    pub fn builder<S: TokenSource>(source: S) -> TokenManagerBuilder {
        TokenManagerBuilder {
            source: Box::new(source),
            config: Config {
                fetch_timeout: defaults::FETCH_TIMEOUT,
                refresh_ahead: defaults::REFRESH_AHEAD,
                refresh_jitter: defaults::REFRESH_JITTER,
                refresh_retry_spacing: defaults::REFRESH_RETRY_SPACING,
                failure_backoff_initial: defaults::FAILURE_BACKOFF_INITIAL,
                failure_backoff_max: defaults::FAILURE_BACKOFF_MAX,
            },
        }
    }

    /// A valid token: the cached one, or the result of the fetch this call starts or joins.
    ///
    /// While a failure is being backed off from, returns that failure's error at once
    /// (see [`TokenError::retry_at`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. The fetch runs in a spawned task, so dropping this future (even the
    /// one that started the fetch) only stops waiting: the fetch completes, its token is
    /// cached, and every other waiter gets it.
    ///
    /// # Panics
    ///
    /// Does not panic. Outside a Tokio runtime a fetch cannot be spawned and the call
    /// returns a [`TokenErrorKind::Aborted`] error.
    pub async fn token(&self) -> Result<AccessToken, TokenError> {
        match self.lookup() {
            Lookup::Ready(result) => result,
            Lookup::Wait(mut rx) => {
                let outcome = rx.wait_for(Option::is_some).await;
                match outcome {
                    Ok(value) => value.clone().unwrap_or_else(|| Err(aborted(None))),
                    // The sender is only dropped after a result was stored, by the guard
                    // at the latest; this arm is defence in depth.
                    Err(_) => Err(aborted(None)),
                }
            }
        }
    }

    /// The cached token if it is valid now, without fetching or waiting.
    pub fn current(&self) -> Option<AccessToken> {
        let state = self.shared.lock();
        let now = Instant::now();
        state
            .current
            .as_ref()
            .filter(|c| c.token.is_valid_at(now))
            .map(|c| c.token.clone())
    }

    /// Forgets `used` if it is still the cached token (a server rejected it), so the next
    /// [`token`](TokenManager::token) fetches a new one. Returns whether it was forgotten.
    ///
    /// Compares identity, not text: when many requests get a `401` for the same token,
    /// the first call forgets it and the others find a different (or no) token cached and
    /// change nothing, so they all share one refresh.
    pub fn invalidate_if_current(&self, used: &AccessToken) -> bool {
        let mut state = self.shared.lock();
        let is_current = state
            .current
            .as_ref()
            .is_some_and(|c| c.token.same_token(used));
        if is_current {
            state.current = None;
            #[cfg(feature = "tracing")]
            tracing::debug!("bearer token rejected by a server; it will be refreshed");
        }
        is_current
    }

    fn lookup(&self) -> Lookup {
        let mut state = self.shared.lock();
        let now = Instant::now();
        if let Some(current) = &state.current
            && current.token.is_valid_at(now)
        {
            let token = current.token.clone();
            let ahead_due = current.refresh_at.is_some_and(|at| now >= at)
                && state.flight.is_none()
                && state.ahead_not_before.is_none_or(|at| now >= at);
            if ahead_due {
                // The receiver is dropped: callers keep the valid token meanwhile. (A
                // failure to spawn, outside a runtime, leaves the valid token in use.)
                let _ = self.start_flight(&mut state);
            }
            return Lookup::Ready(Ok(token));
        }
        if let Some(flight) = &state.flight {
            // `has_changed` fails only once the sender is gone, which the guard never
            // allows without clearing the flight first; checked so that a flight can
            // never be joined if it cannot finish.
            if flight.result.has_changed().is_ok() {
                return Lookup::Wait(flight.result.clone());
            }
            state.flight = None;
        }
        if let Some(failure) = &state.failure
            && failure.retry_at().is_some_and(|at| now < at)
        {
            return Lookup::Ready(Err(failure.clone()));
        }
        match self.start_flight(&mut state) {
            Ok(rx) => Lookup::Wait(rx),
            Err(e) => Lookup::Ready(Err(e)),
        }
    }

    /// Spawns the fetch and installs its channel. Called with the state locked.
    fn start_flight(
        &self,
        state: &mut State,
    ) -> Result<watch::Receiver<Option<FlightResult>>, TokenError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| aborted(Some(Arc::new(e) as SharedSourceError)))?;
        let (tx, rx) = watch::channel(None);
        let id = state.next_flight_id;
        state.next_flight_id = state.next_flight_id.wrapping_add(1);
        state.flight = Some(Flight {
            id,
            result: rx.clone(),
        });
        #[cfg(feature = "tracing")]
        tracing::debug!(flight = id, "fetching a bearer token");
        // Built outside the task so that a task dropped before its first poll (a runtime
        // shutting down) still publishes a result and clears the flight.
        let mut guard = FlightGuard {
            shared: Arc::clone(&self.shared),
            id,
            tx: Some(tx),
        };
        runtime.spawn(async move {
            let timeout = guard.shared.config.fetch_timeout;
            let fetched = tokio::time::timeout(timeout, guard.shared.source.fetch_erased()).await;
            let outcome = match fetched {
                Ok(Ok(token)) if token.authorization_header().is_some() => Ok(token),
                Ok(Ok(_)) => Err((TokenErrorKind::InvalidSecret, None)),
                Ok(Err(e)) => Err((TokenErrorKind::Fetch, Some(e))),
                Err(_) => Err((TokenErrorKind::Timeout, None)),
            };
            guard.finish(outcome);
        });
        Ok(rx)
    }
}

/// Publishes the result of one flight; if dropped before `finish` (a panic in the source,
/// the runtime shutting down), publishes an `Aborted` error instead.
struct FlightGuard {
    shared: Arc<Shared>,
    id: u64,
    tx: Option<watch::Sender<Option<FlightResult>>>,
}

impl FlightGuard {
    fn finish(
        &mut self,
        outcome: Result<AccessToken, (TokenErrorKind, Option<SharedSourceError>)>,
    ) {
        let Some(tx) = self.tx.take() else { return };
        crate::metrics::token_fetch(outcome.as_ref().err().map(|(kind, _)| *kind));
        let now = Instant::now();
        let result = {
            let mut state = self.shared.lock();
            if state.flight.as_ref().is_some_and(|f| f.id == self.id) {
                state.flight = None;
            }
            match outcome {
                Ok(token) => {
                    let refresh_at = refresh_at(&token, &self.shared.config);
                    state.current = Some(Current {
                        token: token.clone(),
                        refresh_at,
                    });
                    state.failure = None;
                    state.ahead_not_before = None;
                    state.consecutive_failures = 0;
                    #[cfg(feature = "tracing")]
                    tracing::debug!(
                        flight = self.id,
                        expires_in = ?token.expiry().map(|at| at.saturating_duration_since(now)),
                        "bearer token fetched"
                    );
                    Ok(token)
                }
                Err((kind, source)) => {
                    state.consecutive_failures = state.consecutive_failures.saturating_add(1);
                    let config = &self.shared.config;
                    let still_valid = state
                        .current
                        .as_ref()
                        .is_some_and(|c| c.token.is_valid_at(now));
                    let retry_at = if still_valid {
                        let at = later(now, config.refresh_retry_spacing);
                        state.ahead_not_before = Some(at);
                        at
                    } else {
                        later(now, failure_backoff(config, state.consecutive_failures))
                    };
                    let error = TokenError::new(kind, source, Some(retry_at));
                    if !still_valid {
                        state.failure = Some(error.clone());
                    }
                    #[cfg(feature = "tracing")]
                    tracing::warn!(flight = self.id, error = %error, still_valid, "bearer token fetch failed");
                    Err(error)
                }
            }
        };
        // Stored after the state so a caller woken by it and calling again sees the same.
        tx.send_replace(Some(result));
    }
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        if self.tx.is_some() {
            self.finish(Err((TokenErrorKind::Aborted, None)));
        }
    }
}

/// The moment a refresh ahead becomes due: `expiry - window`, where the window is the
/// smaller of the configured one and half the lifetime, shortened by up to `jitter` of
/// itself so that processes sharing an issuer do not refresh in lockstep.
fn refresh_at(token: &AccessToken, config: &Config) -> Option<Instant> {
    let expiry = token.expiry()?;
    let lifetime = expiry.saturating_duration_since(token.received_at());
    let window = config.refresh_ahead.min(lifetime / 2);
    let jitter = if config.refresh_jitter > 0.0 {
        window.mul_f64(config.refresh_jitter * rand::random_range(0.0..1.0))
    } else {
        Duration::ZERO
    };
    expiry.checked_sub(window.saturating_sub(jitter))
}

/// `now + wait`, saturating: `Duration::MAX` configured as "never again" must hold off,
/// not overflow the clock (a panic in the fetch task would skip the hold-off entirely).
fn later(now: Instant, wait: Duration) -> Instant {
    now.checked_add(wait)
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30))
}

/// `initial × 2^(failures-1)`, capped, computed without overflow.
fn failure_backoff(config: &Config, failures: u32) -> Duration {
    let mut delay = config.failure_backoff_initial;
    for _ in 1..failures {
        delay = delay.saturating_mul(2);
        if delay >= config.failure_backoff_max {
            return config.failure_backoff_max;
        }
    }
    delay.min(config.failure_backoff_max)
}

fn aborted(source: Option<SharedSourceError>) -> TokenError {
    TokenError::new(TokenErrorKind::Aborted, source, None)
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No critical section can leave the state half-updated, so a poisoned lock (a
        // panic elsewhere while holding it) still guards consistent data.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl fmt::Debug for TokenManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("TokenManager");
        match self.shared.state.try_lock() {
            Ok(state) => {
                d.field("token", &state.current.as_ref().map(|c| &c.token));
                d.field("refreshing", &state.flight.is_some());
                d.field("failure", &state.failure);
            }
            Err(_) => {
                d.field("token", &"<locked>");
            }
        }
        d.field("config", &self.shared.config).finish()
    }
}

/// Settings of a [`TokenManager`], from [`TokenManager::builder`].
pub struct TokenManagerBuilder {
    source: Box<dyn ErasedSource>,
    config: Config,
}

impl TokenManagerBuilder {
    /// How long one fetch may take before it fails with [`TokenErrorKind::Timeout`].
    /// Default 30 s. A zero timeout accepts only sources that are ready at once.
    pub fn fetch_timeout(mut self, timeout: Duration) -> Self {
        self.config.fetch_timeout = timeout;
        self
    }

    /// The longest refresh-ahead window; the window used is the smaller of this and half
    /// the token's lifetime. Default 5 minutes. `Duration::ZERO` turns refresh ahead off.
    pub fn refresh_ahead(mut self, window: Duration) -> Self {
        self.config.refresh_ahead = window;
        self
    }

    /// The fraction (0 to 1) by which the refresh-ahead window is shortened at random,
    /// per token. Default 0.1; 0 makes the refresh moment exact.
    pub fn refresh_jitter(mut self, fraction: f64) -> Self {
        self.config.refresh_jitter = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        self
    }

    /// The wait before another refresh ahead after one failed while the token was still
    /// valid. Default 30 s.
    pub fn refresh_retry_spacing(mut self, spacing: Duration) -> Self {
        self.config.refresh_retry_spacing = spacing;
        self
    }

    /// The backoff after a fetch failed with no valid token: `initial`, doubling per
    /// consecutive failure up to `max`. Defaults 1 s and 30 s. During it callers get the
    /// failure's error at once.
    pub fn failure_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.config.failure_backoff_initial = initial;
        self.config.failure_backoff_max = max.max(initial);
        self
    }

    /// The manager.
    pub fn build(self) -> TokenManager {
        TokenManager {
            shared: Arc::new(Shared {
                source: self.source,
                config: self.config,
                state: Mutex::new(State::default()),
            }),
        }
    }
}

impl fmt::Debug for TokenManagerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenManagerBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// `TokenSource` with its error type erased, so the manager is not generic.
trait ErasedSource: Send + Sync + 'static {
    fn fetch_erased(&self) -> BoxFuture<'_, Result<AccessToken, SharedSourceError>>;
}

impl<S: TokenSource> ErasedSource for S {
    fn fetch_erased(&self) -> BoxFuture<'_, Result<AccessToken, SharedSourceError>> {
        Box::pin(async move {
            self.fetch()
                .await
                .map_err(|e| SharedSourceError::from(e.into()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        TokenManager::builder(|| async { Ok::<_, std::io::Error>(AccessToken::new("t")) }).config
    }

    #[test]
    fn failure_backoff_doubles_and_caps() {
        let c = config();
        let secs: Vec<u64> = (1..=7).map(|n| failure_backoff(&c, n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(failure_backoff(&c, u32::MAX), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn refresh_window_is_the_smaller_of_five_minutes_and_half_the_lifetime() {
        let mut c = config();
        c.refresh_jitter = 0.0;
        let hour = AccessToken::new("a").expires_in(Duration::from_secs(3600));
        assert_eq!(
            refresh_at(&hour, &c),
            Some(hour.expiry().unwrap() - Duration::from_secs(300))
        );
        let short = AccessToken::new("b").expires_in(Duration::from_secs(60));
        assert_eq!(
            refresh_at(&short, &c),
            Some(short.expiry().unwrap() - Duration::from_secs(30))
        );
        assert_eq!(refresh_at(&AccessToken::new("c"), &c), None);
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_only_shortens_the_window_by_at_most_its_fraction() {
        let c = config();
        let token = AccessToken::new("a").expires_in(Duration::from_secs(3600));
        let expiry = token.expiry().unwrap();
        for _ in 0..200 {
            let at = refresh_at(&token, &c).unwrap();
            let window = expiry - at;
            assert!(window <= Duration::from_secs(300), "{window:?}");
            assert!(window >= Duration::from_secs(270), "{window:?}");
        }
    }
}
