//! [`Network`]: the settings of the client's connections that `build_from` applies.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// How the client built by [`Resilience::build_from`](crate::Resilience::build_from)
/// connects, and how long it waits on the network (see [the module docs](super)).
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::Resilience;
/// use reqwest_resilience::network::Network;
///
/// # fn main() -> Result<(), reqwest_resilience::ResilienceError> {
/// let network = Network::new()
///     .connect_timeout(Some(Duration::from_secs(5)))
///     .no_progress(Some(Duration::from_secs(120)));
/// let client = Resilience::new().network(network).build_from(reqwest::Client::builder)?;
/// # drop(client); Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a Network does nothing until it is handed to Resilience::network"]
pub struct Network {
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) attempt_delay: Duration,
    pub(crate) failed_address_memory: Duration,
    pub(crate) no_progress: Option<Duration>,
    pub(crate) http2_keep_alive: Option<(Duration, Duration)>,
    pub(crate) watch_changes: bool,
    pub(crate) resolver: Option<Arc<dyn reqwest::dns::Resolve>>,
    /// The wall clock the suspend check compares with the monotonic one.
    pub(crate) wall_clock: Option<super::weather::WallClock>,
    /// `false` for [`Network::off`]: the client as reqwest builds it.
    pub(crate) on: bool,
}

impl Default for Network {
    fn default() -> Self {
        Network::new()
    }
}

impl fmt::Debug for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Network")
            .field("on", &self.on)
            .field("connect_timeout", &self.connect_timeout)
            .field("attempt_delay", &self.attempt_delay)
            .field("failed_address_memory", &self.failed_address_memory)
            .field("no_progress", &self.no_progress)
            .field("http2_keep_alive", &self.http2_keep_alive)
            .field("watch_changes", &self.watch_changes)
            .field("resolver", &self.resolver.is_some())
            .finish()
    }
}

impl Network {
    /// The connect timeout per address: OkHttp's default.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
    /// RFC 8305 §5's recommended Connection Attempt Delay.
    pub const DEFAULT_ATTEMPT_DELAY: Duration = Duration::from_millis(250);
    /// How long an address that failed is tried last.
    pub const DEFAULT_FAILED_ADDRESS_MEMORY: Duration = Duration::from_secs(600);
    /// Firefox's `network.http.response.timeout`.
    pub const DEFAULT_NO_PROGRESS: Duration = Duration::from_secs(300);
    /// The interval of HTTP/2 keep-alive pings.
    pub const DEFAULT_HTTP2_PING_INTERVAL: Duration = Duration::from_secs(30);
    /// How long an HTTP/2 keep-alive ping may wait for its answer (hyper's default).
    pub const DEFAULT_HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(20);

    /// The defaults (the table in [the module docs](super)).
    pub fn new() -> Self {
        Network {
            connect_timeout: Some(Self::DEFAULT_CONNECT_TIMEOUT),
            attempt_delay: Self::DEFAULT_ATTEMPT_DELAY,
            failed_address_memory: Self::DEFAULT_FAILED_ADDRESS_MEMORY,
            no_progress: Some(Self::DEFAULT_NO_PROGRESS),
            http2_keep_alive: Some((
                Self::DEFAULT_HTTP2_PING_INTERVAL,
                Self::DEFAULT_HTTP2_PING_TIMEOUT,
            )),
            watch_changes: true,
            resolver: None,
            wall_clock: None,
            on: true,
        }
    }

    /// None of it: the client as reqwest builds it from the builder handed over (reqwest's
    /// own connector, no bound on a stuck server, no network watch).
    pub fn off() -> Self {
        Network {
            connect_timeout: None,
            no_progress: None,
            http2_keep_alive: None,
            watch_changes: false,
            on: false,
            ..Network::new()
        }
    }

    /// How long one address may take to connect (TCP, then TLS and a proxy's tunnel);
    /// `None`: until the system gives up (`TCP_USER_TIMEOUT`, 30 s with reqwest's
    /// defaults on Linux; minutes elsewhere). Default 10 s. Zero, or over a day, is
    /// refused when the client is built
    /// ([`ResilienceError::InvalidConfig`](crate::ResilienceError::InvalidConfig)).
    pub fn connect_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long an address is given before the next one starts beside it (RFC 8305's
    /// Connection Attempt Delay; the RFC bounds it to 100 ms – 2 s, and so does this).
    /// Default 250 ms.
    pub fn attempt_delay(mut self, delay: Duration) -> Self {
        self.attempt_delay = delay.clamp(Duration::from_millis(100), Duration::from_secs(2));
        self
    }

    /// How long an address that failed to connect is tried after the host's others (or
    /// until it connects again). Default 10 minutes.
    pub fn failed_address_memory(mut self, memory: Duration) -> Self {
        self.failed_address_memory = memory;
        self
    }

    /// How long an attempt may receive nothing from the server before it is cut
    /// ([`FailureKind::NoProgress`](crate::FailureKind::NoProgress)); `None`: no bound.
    /// Default 300 s. Zero, or over a day, is refused when the client is built.
    pub fn no_progress(mut self, bound: Option<Duration>) -> Self {
        self.no_progress = bound;
        self
    }

    /// HTTP/2 keep-alive pings: `Some((interval, timeout))` sends a PING after `interval`
    /// without a frame, on busy and idle connections alike, and closes the connection
    /// when its answer takes longer than `timeout`; `None`: no pings. Default 30 s, 20 s.
    /// An interval or timeout of zero, or over a day, is refused when the client is built.
    /// Applied with feature `http2` (on by default); without it reqwest speaks HTTP/1
    /// only and there is no connection to ping.
    pub fn http2_keep_alive(mut self, ping: Option<(Duration, Duration)>) -> Self {
        self.http2_keep_alive = ping;
        self
    }

    /// Whether a change of the machine's addresses, or a wake from a suspend, retires the
    /// connections opened before it. Default on.
    pub fn watch_changes(mut self, watch: bool) -> Self {
        self.watch_changes = watch;
        self
    }

    /// The wall clock the suspend check reads (default `SystemTime::now`): a test of an
    /// application can make the process seem to wake from a suspend by returning a time
    /// ahead of the real one.
    pub fn wall_clock(
        mut self,
        clock: impl Fn() -> std::time::SystemTime + Send + Sync + 'static,
    ) -> Self {
        self.wall_clock = Some(Arc::new(clock));
        self
    }

    /// The name resolver the connections use (reqwest's `Resolve`, e.g. a hickory-dns
    /// one); default: the system's (`getaddrinfo`, as reqwest's default).
    pub fn resolver(mut self, resolver: Arc<dyn reqwest::dns::Resolve>) -> Self {
        self.resolver = Some(resolver);
        self
    }

    /// Settings a client cannot work with, refused when the client is built: a zero
    /// bound would fail every connect or cut every attempt at once (a zero ping interval
    /// would ping without pause), and one over a day is no bound but one that overflows
    /// the clock's arithmetic. `None` turns a bound off.
    pub(crate) fn check(&self) -> Result<(), crate::ResilienceError> {
        const DAY: Duration = Duration::from_secs(24 * 60 * 60);
        let (interval, timeout) = self.http2_keep_alive.unzip();
        let bounds = [
            (self.connect_timeout, "connect_timeout"),
            (self.no_progress, "no_progress"),
            (interval, "http2_keep_alive's interval"),
            (timeout, "http2_keep_alive's timeout"),
        ];
        for (bound, setting) in bounds {
            let wrong = match bound {
                Some(d) if d.is_zero() => "is zero",
                Some(d) if d > DAY => "exceeds a day",
                _ => continue,
            };
            return Err(crate::ResilienceError::InvalidConfig(format!(
                "Network::{setting} {wrong}: use None to turn it off"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_documented_ones_and_off_is_off() {
        let n = Network::new();
        assert_eq!(n.connect_timeout, Some(Duration::from_secs(10)));
        assert_eq!(n.attempt_delay, Duration::from_millis(250));
        assert_eq!(n.failed_address_memory, Duration::from_secs(600));
        assert_eq!(n.no_progress, Some(Duration::from_secs(300)));
        assert_eq!(
            n.http2_keep_alive,
            Some((Duration::from_secs(30), Duration::from_secs(20)))
        );
        assert!(n.watch_changes && n.on);
        let off = Network::off();
        assert!(!off.on && !off.watch_changes);
        assert_eq!(
            (off.connect_timeout, off.no_progress, off.http2_keep_alive),
            (None, None, None)
        );
    }

    #[test]
    fn a_zero_or_overlong_bound_is_refused_with_its_name_and_none_is_accepted() {
        let zero = Duration::ZERO;
        let s = Duration::from_secs(1);
        let cases = [
            (
                Network::new().connect_timeout(Some(zero)),
                "connect_timeout",
            ),
            (Network::new().no_progress(Some(zero)), "no_progress"),
            (
                Network::new().http2_keep_alive(Some((zero, s))),
                "http2_keep_alive's interval",
            ),
            (
                Network::new().http2_keep_alive(Some((s, zero))),
                "http2_keep_alive's timeout",
            ),
        ];
        for (network, setting) in cases {
            match network.check() {
                Err(crate::ResilienceError::InvalidConfig(text)) => assert_eq!(
                    text,
                    format!("Network::{setting} is zero: use None to turn it off")
                ),
                other => panic!("{setting}: {other:?}"),
            }
        }
        let long = Network::new().connect_timeout(Some(Duration::MAX)).check();
        assert!(matches!(
            long,
            Err(crate::ResilienceError::InvalidConfig(text))
                if text == "Network::connect_timeout exceeds a day: use None to turn it off"
        ));
        let day = Duration::from_secs(24 * 60 * 60);
        assert!(Network::new().no_progress(Some(day)).check().is_ok());
        let off = Network::new()
            .connect_timeout(None)
            .no_progress(None)
            .http2_keep_alive(None);
        assert!(off.check().is_ok());
        assert!(Network::new().check().is_ok() && Network::off().check().is_ok());
    }

    #[test]
    fn the_attempt_delay_stays_within_rfc_8305s_bounds() {
        let n = Network::new().attempt_delay(Duration::ZERO);
        assert_eq!(n.attempt_delay, Duration::from_millis(100));
        let n = Network::new().attempt_delay(Duration::from_secs(60));
        assert_eq!(n.attempt_delay, Duration::from_secs(2));
    }
}
