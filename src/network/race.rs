//! The address race (RFC 8305, Happy Eyeballs v2): a connector layer that, for each new
//! connection, tries the host's addresses one after another, a new one every attempt
//! delay (at once when the one before failed), each bounded by the connect timeout, and
//! records every address tried with its outcome.
//!
//! reqwest hands a connector layer one request per connection, which cannot be copied
//! (`Unnameable`), so only one connection through reqwest's connector (and its TLS) can
//! be started for it. That one goes to the first address, which the client's resolver
//! ([`super::answer`]) answers alone; the later addresses are tried by probes (plain TCP
//! connects). When the first address connects first, that connection carries the request
//! and the probes are dropped. When a probe connects first, the connection fails with
//! [`AddressRaced`] and reqwest sends the request again at once
//! ([`crate::protocol_nacks`]), on a new connection whose first address is the one that
//! answered (the one waited on is tried last now): a host whose first address is dead
//! costs one attempt delay and one extra TCP connection, once per memory. The probe's
//! connection is closed unused.
//!
//! Runs only when a connection is opened: a request on a pooled connection never reaches
//! a connector.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use super::answer::{Learned, Pending, polled_with};
use super::failed::{AddressRaced, ConnectFailed, outcome_of};
use super::resolve::{Addresses, BoxError};
use crate::record::{AddressOutcome, AddressTried, ConnectAttempts};

/// The race's settings, and the client's address memory.
#[derive(Debug)]
pub(crate) struct RaceConfig {
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) attempt_delay: Duration,
    pub(crate) addresses: Arc<Addresses>,
}

/// The connector layer (`ClientBuilder::connector_layer`).
#[derive(Debug, Clone)]
pub(crate) struct RaceLayer(pub(crate) Arc<RaceConfig>);

impl<S> tower_layer::Layer<S> for RaceLayer {
    type Service = Racer<S>;

    fn layer(&self, inner: S) -> Racer<S> {
        Racer {
            inner: Arc::new(inner),
            config: self.0.clone(),
        }
    }
}

/// reqwest's connector with the race around it.
///
/// reqwest's client clones its connector for every request, a pooled connection's too
/// (six clones through its retry and redirect layers): the connector under the race is
/// shared, and cloned only when a connection is made (a boxed service's clone is an
/// allocation: `benches/instructions.rs` counts 6 more per request otherwise).
#[derive(Debug)]
pub(crate) struct Racer<S> {
    inner: Arc<S>,
    config: Arc<RaceConfig>,
}

impl<S> Clone for Racer<S> {
    fn clone(&self) -> Self {
        Racer {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S, R> tower_service::Service<R> for Racer<S>
where
    S: tower_service::Service<R, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    R: std::fmt::Debug + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    /// Ready at once: the connector under it is asked when a connection is made.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        let (pending, tls) = pending_for(&request);
        let mut inner = S::clone(&self.inner);
        let connecting = async move {
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            inner.call(request).await
        };
        let mut race = Race::new(connecting, Arc::new(pending), self.config.clone());
        race.tls = tls;
        Box::pin(race)
    }
}

/// The connection's host and ports, read from reqwest's request: its `Debug` is the
/// destination URI's (`Unnameable(http://host:port/)`), the only way a layer can see it.
/// An unreadable one races nothing (the connection is only bounded). With whether the
/// connection has a TLS handshake after its TCP one (`https`).
fn pending_for(request: &impl std::fmt::Debug) -> (Pending, bool) {
    let text = format!("{request:?}");
    let uri = text
        .strip_prefix("Unnameable(")
        .and_then(|t| t.strip_suffix(')'))
        .and_then(|t| t.parse::<http::Uri>().ok());
    let Some(uri) = uri else {
        return (Pending::new(String::new(), None, 0), false);
    };
    let host = uri.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let tls = uri.scheme_str() == Some("https");
    let default_port = if tls { 443 } else { 80 };
    (
        Pending::new(host.to_owned(), uri.port_u16(), default_port),
        tls,
    )
}

/// The addresses of a connection once known, and how each is doing.
struct Plan {
    addrs: Vec<SocketAddr>,
    started: Instant,
    /// One per address started: the first is reqwest's connection, the others probes.
    tried: Vec<AddressTried>,
    /// The probes still running, by their index in `tried`.
    probes: Vec<(usize, Probe)>,
    next_start: Pin<Box<Sleep>>,
    /// A probe that answered while reqwest's connection may be in its TLS handshake, and
    /// until when that connection is waited for ([`handshake_grace`]).
    held: Option<(usize, Pin<Box<Sleep>>)>,
}

type Probe = Pin<Box<dyn Future<Output = Result<(), AddressOutcome>> + Send>>;

/// One connection's race.
struct Race<F> {
    /// reqwest's connection to the first address, until it ends or is dropped.
    connecting: Option<Pin<Box<F>>>,
    /// Its error, when it ended with one.
    error: Option<BoxError>,
    pending: Arc<Pending>,
    config: Arc<RaceConfig>,
    /// The connect timeout of reqwest's connection: from the race's start until the
    /// addresses are known (resolution included), then from the first address's start.
    deadline: Option<Pin<Box<Sleep>>>,
    plan: Option<Plan>,
    /// The connection has a TLS handshake after its TCP one.
    tls: bool,
}

impl<F, C> Race<F>
where
    F: Future<Output = Result<C, BoxError>>,
{
    fn new(connecting: F, pending: Arc<Pending>, config: Arc<RaceConfig>) -> Self {
        let deadline = config
            .connect_timeout
            .map(|t| Box::pin(tokio::time::sleep(t)));
        let mut race = Race {
            connecting: Some(Box::pin(connecting)),
            error: None,
            pending,
            config,
            deadline,
            plan: None,
            tls: false,
        };
        // An address in the URL is known at once: hyper-util asks no resolver for it.
        if let Ok(ip) = race.pending.host().parse::<IpAddr>() {
            let addr = SocketAddr::new(ip, race.pending.port_for(SocketAddr::new(ip, 0)));
            race.adopt(vec![addr], Instant::now());
        }
        race
    }

    fn adopt(&mut self, addrs: Vec<SocketAddr>, started: Instant) {
        if let (Some(deadline), Some(timeout)) = (&mut self.deadline, self.config.connect_timeout) {
            deadline.as_mut().reset(started + timeout);
        }
        let tried = vec![AddressTried {
            address: addrs[0],
            outcome: AddressOutcome::Abandoned,
            started_after: Duration::ZERO,
        }];
        self.plan = Some(Plan {
            addrs,
            started,
            tried,
            probes: Vec::new(),
            held: None,
            next_start: Box::pin(tokio::time::sleep_until(
                started + self.config.attempt_delay,
            )),
        });
    }

    /// Polls reqwest's connection: `Some` when the race is over because of it.
    fn poll_connecting(&mut self, cx: &mut Context<'_>) -> Option<Result<C, BoxError>> {
        let connecting = self.connecting.as_mut()?;
        let polled = polled_with(&self.pending, || connecting.as_mut().poll(cx));
        if self.plan.is_none()
            && let Some(Learned::Addresses { addrs, at }) = self.pending.learned()
        {
            self.adopt(addrs, at);
        }
        match polled {
            Poll::Ready(Ok(conn)) => {
                self.connecting = None;
                return Some(Ok(self.connected(conn)));
            }
            Poll::Ready(Err(e)) => {
                self.connecting = None;
                let Some(plan) = &mut self.plan else {
                    // Not raced (a proxy, a name reqwest resolved itself): reqwest's error.
                    return Some(Err(e));
                };
                plan.tried[0].outcome = outcome_of(&*e);
                self.config
                    .addresses
                    .failed(self.pending.host(), plan.addrs[0], Instant::now());
                self.error = Some(e);
            }
            Poll::Pending => {
                let expired =
                    (self.deadline.as_mut()).is_some_and(|d| d.as_mut().poll(cx).is_ready());
                if expired {
                    self.connecting = None;
                    match &mut self.plan {
                        None => return Some(Err(self.all_failed())),
                        Some(plan) => {
                            plan.tried[0].outcome = AddressOutcome::TimedOut;
                            let addr = plan.addrs[0];
                            self.config
                                .addresses
                                .failed(self.pending.host(), addr, Instant::now());
                        }
                    }
                }
            }
        }
        None
    }

    /// reqwest's connection to the first address connected: it carries the request.
    fn connected(&mut self, conn: C) -> C {
        if let Some(mut plan) = self.plan.take() {
            plan.tried[0].outcome = AddressOutcome::Connected;
            if let Some((held, _)) = plan.held {
                plan.tried[held].outcome = AddressOutcome::Answered;
            }
            self.config
                .addresses
                .worked(self.pending.host(), plan.addrs[0]);
            crate::record::polled::record_connect(
                ConnectAttempts { tried: plan.tried },
                plan.started,
            );
        }
        conn
    }

    /// Starts the probes that are due and polls the running ones: `Some` when the race
    /// is over.
    fn poll_probes(&mut self, cx: &mut Context<'_>) -> Option<BoxError> {
        let plan = self.plan.as_mut()?;
        'race: loop {
            if let Some((winner, grace)) = &mut plan.held {
                if self.connecting.is_some() && grace.as_mut().poll(cx).is_pending() {
                    return None;
                }
                let winner = *winner;
                return Some(self.raced(winner));
            }
            let idle = self.connecting.is_none() && plan.probes.is_empty();
            let more = plan.tried.len() < plan.addrs.len();
            if more && (idle || plan.next_start.as_mut().poll(cx).is_ready()) {
                start_probe(plan, &self.config);
                continue;
            }
            let mut i = 0;
            while i < plan.probes.len() {
                let (index, probe) = &mut plan.probes[i];
                match probe.as_mut().poll(cx) {
                    Poll::Pending => i += 1,
                    Poll::Ready(Ok(())) => {
                        let winner = *index;
                        let now = Instant::now();
                        let grace =
                            handshake_grace(plan.started, plan.tried[winner].started_after, now);
                        if !self.tls || self.connecting.is_none() || grace <= now {
                            return Some(self.raced(winner));
                        }
                        drop(plan.probes.swap_remove(i));
                        plan.held = Some((winner, Box::pin(tokio::time::sleep_until(grace))));
                        continue 'race;
                    }
                    Poll::Ready(Err(outcome)) => {
                        let index = *index;
                        drop(plan.probes.swap_remove(i));
                        plan.tried[index].outcome = outcome;
                        let addr = plan.tried[index].address;
                        let host = self.pending.host();
                        self.config.addresses.failed(host, addr, Instant::now());
                    }
                }
            }
            let idle = self.connecting.is_none() && plan.probes.is_empty();
            if idle && plan.tried.len() < plan.addrs.len() {
                continue;
            }
            return idle.then(|| self.all_failed());
        }
    }

    /// The probe at `winner` connected first: this connection gives way to one there.
    fn raced(&mut self, winner: usize) -> BoxError {
        let Some(mut plan) = self.plan.take() else {
            return self.all_failed();
        };
        let now = Instant::now();
        let host = self.pending.host();
        let waited: Vec<usize> = std::iter::once(0)
            .filter(|_| self.connecting.is_some())
            .chain(plan.probes.iter().map(|(i, _)| *i).filter(|i| *i != winner))
            .collect();
        for i in waited {
            // Slower than an address started after it: tried last from now on.
            self.config
                .addresses
                .failed(host, plan.tried[i].address, now);
        }
        self.connecting = None;
        plan.tried[winner].outcome = AddressOutcome::Answered;
        let to = plan.tried[winner].address;
        self.config.addresses.worked(host, to);
        crate::record::polled::record_connect(ConnectAttempts { tried: plan.tried }, plan.started);
        Box::new(AddressRaced { to })
    }

    /// No address connected.
    fn all_failed(&mut self) -> BoxError {
        let error = self.error.take();
        let (attempts, started) = match self.plan.take() {
            Some(plan) => (ConnectAttempts { tried: plan.tried }, Some(plan.started)),
            None => (ConnectAttempts::default(), None),
        };
        if let Some(started) = started {
            crate::record::polled::record_connect(attempts.clone(), started);
        }
        // A single address that failed by itself keeps reqwest's error as it was.
        let alone =
            attempts.tried.len() == 1 && attempts.tried[0].outcome != AddressOutcome::TimedOut;
        let error = match error {
            Some(error) if alone => return error,
            other => other,
        };
        let timed_out = (error.is_none() && attempts.tried.is_empty()) || attempts.all_timed_out();
        let host = self.pending.host().to_owned();
        Box::new(ConnectFailed::new(host, attempts, timed_out, error))
    }
}

impl<F, C> Future for Race<F>
where
    F: Future<Output = Result<C, BoxError>>,
{
    type Output = Result<C, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Every field is boxed or `Unpin`.
        let this = self.get_mut();
        if let Some(done) = this.poll_connecting(cx) {
            return Poll::Ready(done);
        }
        if this.plan.is_none() {
            return Poll::Pending;
        }
        match this.poll_probes(cx) {
            Some(err) => Poll::Ready(Err(err)),
            None => Poll::Pending,
        }
    }
}

/// Until when reqwest's connection to the first address (started at `started`) is waited
/// for after a probe, started `probe_after` later, answered at `now`: a TLS connection
/// needs its TCP round trip and up to two more for the handshake (TLS 1.2), so a first
/// address as near as the probe's is done by three of the probe's round trips. Without
/// this a host farther than the attempt delay would lose every handshake to a probe.
fn handshake_grace(started: Instant, probe_after: Duration, now: Instant) -> Instant {
    let round_trip = now.saturating_duration_since(started + probe_after);
    started + round_trip.saturating_mul(3)
}

/// Starts a probe of the next address of `plan`.
fn start_probe(plan: &mut Plan, config: &RaceConfig) {
    let addr = plan.addrs[plan.tried.len()];
    let now = Instant::now();
    plan.tried.push(AddressTried {
        address: addr,
        outcome: AddressOutcome::Abandoned,
        started_after: now.saturating_duration_since(plan.started),
    });
    let timeout = config.connect_timeout;
    let probe: Probe = Box::pin(async move {
        let connect = tokio::net::TcpStream::connect(addr);
        let connected = match timeout {
            Some(t) => tokio::time::timeout(t, connect)
                .await
                .map_err(|_| AddressOutcome::TimedOut)?,
            None => connect.await,
        };
        // The probe's connection is closed unused (dropped here).
        connected.map(drop).map_err(|e| outcome_of(&e))
    });
    plan.probes.push((plan.tried.len() - 1, probe));
    plan.next_start.as_mut().reset(now + config.attempt_delay);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// reqwest's request type as its `Debug` reads (a tuple struct around the `Uri`).
    #[derive(Debug)]
    struct Unnameable(#[allow(dead_code)] http::Uri);

    #[test]
    fn the_destination_is_read_from_reqwests_request() {
        let (p, tls) = pending_for(&Unnameable("https://Race.test:8443/".parse().unwrap()));
        assert_eq!((p.host(), tls), ("Race.test", true));
        let any = SocketAddr::from(([192, 0, 2, 1], 0));
        assert_eq!(p.port_for(any), 8443);
        let (p, tls) = pending_for(&Unnameable("http://[::1]/".parse().unwrap()));
        assert_eq!((p.host(), tls, p.port_for(any)), ("::1", false, 80));
        // Anything else races nothing.
        let (p, tls) = pending_for(&"http://race.test/");
        assert_eq!((p.host(), tls), ("", false));
    }

    #[tokio::test(start_paused = true)]
    async fn a_tls_connection_is_waited_for_three_of_the_probes_round_trips() {
        let started = Instant::now();
        let after = Duration::from_millis(250);
        // A probe answered in 150 ms (a far host): the first address's TCP and TLS
        // round trips may take until 450 ms.
        let now = started + after + Duration::from_millis(150);
        assert_eq!(
            handshake_grace(started, after, now),
            started + Duration::from_millis(450)
        );
        // A near host: no wait past now.
        let now = started + after + Duration::from_millis(1);
        assert!(handshake_grace(started, after, now) <= now);
    }
}
