//! [`LimiterRegistry`]: one concurrency limit per [`Origin`], shared by every client handed
//! the same registry, and the RAII [`LimitPermit`].

use crate::origin_map::{BoundedOriginMap, Evict};
use crate::sync::lock;
use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::config::{LimitPolicy, LimiterConfig};
use super::gradient::{AdaptiveLimit, Sample};
use crate::error::ResilienceError;
use crate::origin::Origin;
use crate::record::AttemptClock;

/// One origin's limit as seen by [`LimiterRegistry::snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitSnapshot {
    /// Whose limit.
    pub origin: Origin,
    /// How many attempts may be in flight now.
    pub limit: u32,
    /// How many are.
    pub in_flight: u32,
    /// How many requests wait for a permit.
    pub queued: usize,
    /// Requests turned away since the origin was first seen.
    pub rejections: u64,
    /// The adaptive limit's no-load latency (`None` for a fixed limit or before a sample).
    pub no_load_latency: Option<Duration>,
}

/// A request that its origin's concurrency limit turned away; it was not sent.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) struct LimitRejection {
    /// Where the request was going.
    pub origin: Origin,
    /// The limit at the rejection.
    pub limit: u32,
    /// The attempts in flight at the rejection.
    pub in_flight: u32,
}

impl fmt::Display for LimitRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&ResilienceError::from(self.clone()), f)
    }
}

impl std::error::Error for LimitRejection {}

impl From<LimitRejection> for ResilienceError {
    fn from(r: LimitRejection) -> Self {
        ResilienceError::ConcurrencyLimited {
            origin: r.origin,
            limit: r.limit,
            in_flight: r.in_flight,
        }
    }
}

enum Limit {
    Fixed(u32),
    Adaptive(AdaptiveLimit),
}

impl Limit {
    fn get(&self) -> u32 {
        match self {
            Limit::Fixed(n) => *n,
            Limit::Adaptive(a) => a.limit(),
        }
    }
}

struct Waiter {
    id: u64,
    /// Sent the in-flight count the permit was granted at.
    grant: oneshot::Sender<u32>,
}

struct State {
    limit: Limit,
    in_flight: u32,
    waiters: VecDeque<Waiter>,
    next_waiter: u64,
    rejections: u64,
    last_used: Instant,
}

impl State {
    /// Hands free permits to the oldest waiters. Called after every change that may free
    /// one, so a waiter exists only while the limit is reached.
    fn grant(&mut self) {
        while self.in_flight < self.limit.get() {
            let Some(waiter) = self.waiters.pop_front() else {
                return;
            };
            self.in_flight += 1;
            if waiter.grant.send(self.in_flight).is_err() {
                // Its receiver is gone (unreachable: a waiter leaves the queue before its
                // receiver drops), so the permit is not taken.
                self.in_flight -= 1;
            }
        }
    }
}

struct Entry {
    /// `None` for the registry's overflow entry (see Bounds).
    origin: Option<Origin>,
    state: Mutex<State>,
    #[cfg(feature = "metrics")]
    instruments: Instruments,
}

#[cfg(feature = "metrics")]
struct Instruments {
    limit: metrics::Gauge,
    in_flight: metrics::Gauge,
    rejections: metrics::Counter,
}

impl Entry {
    fn new(origin: Option<Origin>, config: &LimiterConfig) -> Self {
        let limit = match config.policy {
            LimitPolicy::Fixed(n) => Limit::Fixed(n),
            LimitPolicy::Adaptive(g) => Limit::Adaptive(AdaptiveLimit::new(g)),
        };
        #[cfg(feature = "metrics")]
        let instruments = {
            let label = origin.as_ref().map_or(
                metrics::SharedString::const_str(OVERFLOW_LABEL),
                crate::metrics::origin_label,
            );
            let i = Instruments {
                limit: metrics::gauge!("reqwest_resilience.limiter.limit", "origin" => label.clone()),
                in_flight: metrics::gauge!("reqwest_resilience.limiter.in_flight", "origin" => label.clone()),
                rejections: metrics::counter!("reqwest_resilience.limiter.rejections", "origin" => label),
            };
            i.limit.set(limit.get());
            i
        };
        Entry {
            origin,
            state: Mutex::new(State {
                limit,
                in_flight: 0,
                waiters: VecDeque::new(),
                next_waiter: 0,
                rejections: 0,
                last_used: Instant::now(),
            }),
            #[cfg(feature = "metrics")]
            instruments,
        }
    }

    fn label(&self) -> &str {
        self.origin.as_ref().map_or(OVERFLOW_LABEL, Origin::as_str)
    }

    /// Feeds `sample` to the limit for a permit admitted at `admitted_with` in flight,
    /// which stays taken (its response body is still being read).
    fn feed(&self, sample: Sample, admitted_with: u32) {
        if matches!(sample, Sample::Ignored) {
            return;
        }
        self.settle(sample, admitted_with, false);
    }

    /// Gives back a permit admitted at `admitted_with` in flight, feeding `sample` to the
    /// limit, and passes it on to a waiter.
    fn release(&self, sample: Sample, admitted_with: u32) {
        self.settle(sample, admitted_with, true);
    }

    /// Feeds `sample` to the limit, gives the permit back when `release`, and passes the
    /// room there is on to the waiters.
    fn settle(&self, sample: Sample, admitted_with: u32, release: bool) {
        let (change, in_flight) = {
            let mut st = lock(&self.state);
            if release {
                st.in_flight = st.in_flight.saturating_sub(1);
            }
            let before = st.limit.get();
            // Only an adaptive limit reads the clock.
            if let Limit::Adaptive(a) = &mut st.limit {
                a.sample(Instant::now(), sample, admitted_with);
            }
            let after = st.limit.get();
            st.grant();
            ((before != after).then_some((before, after)), st.in_flight)
        };
        self.observe(change, in_flight);
    }

    /// Reports a new in-flight count and, when it changed, the new limit (outside the lock).
    #[cfg_attr(
        not(any(feature = "metrics", feature = "tracing")),
        allow(unused_variables)
    )]
    fn observe(&self, change: Option<(u32, u32)>, in_flight: u32) {
        #[cfg(feature = "metrics")]
        {
            self.instruments.in_flight.set(in_flight);
            if let Some((_, to)) = change {
                self.instruments.limit.set(to);
            }
        }
        #[cfg(feature = "tracing")]
        if let Some((from, to)) = change {
            tracing::debug!(
                target: "reqwest_resilience::limit",
                origin = self.label(),
                from,
                to,
                in_flight,
                "concurrency limit changed"
            );
        }
    }
}

/// The map forgets an origin's limit only with nothing in flight and nobody waiting,
/// ordered by its last admission.
impl Evict for Entry {
    type Stamp = Instant;
    type Now = ();

    fn idle_since(&self, (): ()) -> Option<Instant> {
        let st = self.state.try_lock().ok()?;
        (st.in_flight == 0 && st.waiters.is_empty()).then_some(st.last_used)
    }
}

/// The label of the overflow entry's instruments and events.
const OVERFLOW_LABEL: &str = "_overflow";

/// What every clone of a [`LimiterRegistry`] shares: its config and limits.
struct RegistryState {
    config: LimiterConfig,
    /// The origins with a limit of their own (the bound is the registry's).
    limits: BoundedOriginMap<Entry>,
    overflow: Arc<Entry>,
}

/// One concurrency limit per [`Origin`], shared by every client given a clone of it.
///
/// Cloning is cheap (one `Arc`); two clones are the same registry. A limit counts the
/// attempts in flight to its origin through *every* client sharing the registry, which
/// is what loads the server.
///
/// # Why a registry of its own
///
/// It is keyed like [`BreakerRegistry`](crate::BreakerRegistry) (the same [`Origin`]),
/// but kept apart from it: either works without the other (a bulkhead without a breaker
/// is common), an origin's limit is evictable on other grounds (nothing in flight and no
/// one waiting, versus a Closed breaker), and the breaker's documented memory per origin
/// does not grow for users who never limit. The price is a second lookup per attempt when
/// both are on: a rejection, lookup included, is about 1 000 instructions (110–420 ns on a
/// loaded 2-core machine).
///
/// # Bounds
///
/// At most [`LimiterConfig::max_origins`] origins have a limit of their own, in the
/// registry as a whole (spread over up to 16 shards for concurrency, any shard holding any
/// share of the bound). Until the bound is reached every new origin gets a limit of its
/// own. Then a new origin takes the place of the least recently used origin of its shard
/// with nothing in flight and nobody waiting, or, when its shard has none, of such an
/// origin in another shard. When no origin can be forgotten (every one is busy), the new
/// origin shares the registry's one *overflow* limit with every other such origin
/// (counted by [`overflowed`](Self::overflowed)), so a flood of origins stays bounded in
/// memory and in concurrency alike. Victims are chosen an eighth of a shard per scan, so
/// a steady stream of new origins costs amortised O(1) each (the breaker registry's
/// scheme; the three registries share one per-origin map).
///
/// # Example
///
/// Two clients sharing a bulkhead of 2 attempts in flight to each origin, and what the
/// registry knows of an origin:
///
/// ```
/// use reqwest_resilience::{Origin, Resilience};
/// use reqwest_resilience::limit::{LimiterConfig, LimiterRegistry};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let registry = LimiterRegistry::new(LimiterConfig::fixed(2))?;
/// let a = Resilience::new()
///     .concurrency_limit(registry.clone())
///     .build_from(reqwest::Client::builder())?;
/// let b = Resilience::new()
///     .concurrency_limit(registry.clone())
///     .build_from(reqwest::Client::builder())?;
/// // Nothing sent yet: no origin has a limit of its own.
/// let origin = Origin::parse("https://api.example.com")?;
/// assert!(registry.get(&origin).is_none());
/// assert!(registry.snapshot().is_empty());
/// # drop((a, b)); Ok(()) }
/// ```
#[derive(Clone)]
pub struct LimiterRegistry {
    inner: Arc<RegistryState>,
}

impl fmt::Debug for LimiterRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterRegistry")
            .field("config", &self.inner.config)
            .field("len", &self.len())
            .finish()
    }
}

impl Default for LimiterRegistry {
    fn default() -> Self {
        LimiterRegistry::build(LimiterConfig::default())
    }
}

/// How an admission ended: a permit, a place in the queue, or a rejection.
pub(crate) enum Admission {
    Admitted(LimitPermit),
    Queued(Queued),
    Rejected(LimitRejection),
}

impl LimiterRegistry {
    /// A registry whose limits follow `config`; an invalid configuration is a
    /// [`ResilienceError::InvalidConfig`].
    pub fn new(config: LimiterConfig) -> Result<Self, ResilienceError> {
        config.validate()?;
        Ok(LimiterRegistry::build(config))
    }

    fn build(config: LimiterConfig) -> Self {
        let overflow = Arc::new(Entry::new(None, &config));
        LimiterRegistry {
            inner: Arc::new(RegistryState {
                limits: BoundedOriginMap::new(config.max_origins),
                overflow,
                config,
            }),
        }
    }

    /// The configuration every limit follows.
    pub fn config(&self) -> &LimiterConfig {
        &self.inner.config
    }

    /// Whether `self` and `other` are clones of one registry.
    pub fn same_registry(&self, other: &LimiterRegistry) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Takes a permit for one attempt to `origin` if the limit allows it now, never
    /// waiting (whatever the queue configuration says).
    #[cfg(test)]
    pub(crate) fn try_acquire(&self, origin: &Origin) -> Result<LimitPermit, LimitRejection> {
        match self.admit(origin, None, false) {
            Admission::Admitted(permit) => Ok(permit),
            Admission::Rejected(r) => Err(r),
            Admission::Queued(_) => unreachable!("not queued when queueing is off"),
        }
    }

    /// Takes a permit for one attempt to `origin`: at once if the limit allows it, else
    /// waiting in the origin's queue (first come, first served) when
    /// [`max_queue`](LimiterConfig::max_queue) leaves room, up to
    /// [`queue_timeout`](LimiterConfig::queue_timeout) and never past `deadline`.
    ///
    /// `deadline` also marks the permit: dropped unrecorded at or after it, the attempt
    /// was cut there and counts as an overload signal (a timeout).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives up the place in the queue; a permit granted to it in
    /// the same instant is passed on to the next waiter, never lost.
    #[cfg(test)]
    pub(crate) async fn acquire(
        &self,
        origin: &Origin,
        deadline: Option<Instant>,
    ) -> Result<LimitPermit, LimitRejection> {
        match self.admit(origin, deadline, true) {
            Admission::Admitted(permit) => Ok(permit),
            Admission::Rejected(r) => Err(r),
            Admission::Queued(queued) => self.wait(origin, queued, deadline).await,
        }
    }

    pub(crate) fn admit(
        &self,
        origin: &Origin,
        deadline: Option<Instant>,
        may_queue: bool,
    ) -> Admission {
        let entry = self.entry(origin);
        let config = &self.inner.config;
        // One clock read for the entry's last use and the permit's admission.
        let now = Instant::now();
        let (admission, in_flight) = {
            let mut st = lock(&entry.state);
            st.last_used = now;
            let limit = st.limit.get();
            if st.in_flight < limit && st.waiters.is_empty() {
                st.in_flight += 1;
                (Ok(st.in_flight), st.in_flight)
            } else if may_queue && st.waiters.len() < config.max_queue {
                let (tx, rx) = oneshot::channel();
                let id = st.next_waiter;
                st.next_waiter += 1;
                st.waiters.push_back(Waiter { id, grant: tx });
                return Admission::Queued(Queued {
                    entry: entry.clone(),
                    id,
                    grant: rx,
                    done: false,
                });
            } else {
                st.rejections += 1;
                (Err(limit), st.in_flight)
            }
        };
        match admission {
            Ok(admitted_with) => {
                entry.observe(None, in_flight);
                Admission::Admitted(LimitPermit::new(entry, admitted_with, deadline, now))
            }
            Err(limit) => Admission::Rejected(rejection(&entry, origin, limit, in_flight)),
        }
    }

    /// Waits in the queue; the rare path, so it is kept out of the admission's future.
    pub(crate) async fn wait(
        &self,
        origin: &Origin,
        mut queued: Queued,
        deadline: Option<Instant>,
    ) -> Result<LimitPermit, LimitRejection> {
        let timeout = Instant::now()
            .checked_add(self.inner.config.queue_timeout)
            .unwrap_or_else(far_future);
        let until = deadline.map_or(timeout, |d| d.min(timeout));
        let granted = match tokio::time::timeout_at(until, &mut queued.grant).await {
            Ok(Ok(admitted_with)) => Some(admitted_with),
            // Timed out, or (unreachably) the sender dropped: leave the queue, unless a
            // permit came in the same instant.
            _ => queued.leave(),
        };
        let entry = queued.disarm();
        match granted {
            Some(admitted_with) => {
                let in_flight = lock(&entry.state).in_flight;
                entry.observe(None, in_flight);
                Ok(LimitPermit::new(
                    entry,
                    admitted_with,
                    deadline,
                    Instant::now(),
                ))
            }
            None => {
                let (limit, in_flight) = {
                    let mut st = lock(&entry.state);
                    st.rejections += 1;
                    (st.limit.get(), st.in_flight)
                };
                Err(rejection(&entry, origin, limit, in_flight))
            }
        }
    }

    /// `origin`'s limit and counts, if it has a limit of its own.
    pub fn get(&self, origin: &Origin) -> Option<LimitSnapshot> {
        let entry = self.inner.limits.get(origin)?;
        Some(snapshot_of(origin.clone(), &entry))
    }

    /// Every origin with a limit of its own, sorted by origin.
    pub fn snapshot(&self) -> Vec<LimitSnapshot> {
        let entries = self.inner.limits.entries().into_iter();
        let mut out: Vec<LimitSnapshot> = entries.map(|(o, e)| snapshot_of(o, &e)).collect();
        out.sort_by(|a, b| a.origin.cmp(&b.origin));
        out
    }

    /// The number of origins with a limit of their own.
    pub fn len(&self) -> usize {
        self.inner.limits.len()
    }

    /// Whether no origin has a limit of its own yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many times a new origin found the registry full of busy origins and was served
    /// by the shared overflow limit.
    pub fn overflowed(&self) -> u64 {
        self.inner.limits.overflowed()
    }

    /// `origin`'s limit; made when new, or the shared overflow limit when every origin
    /// of a full registry is busy.
    fn entry(&self, origin: &Origin) -> Arc<Entry> {
        let insert = || self.insert(origin);
        self.inner.limits.with(origin, Arc::clone, insert)
    }

    /// `origin`'s limit when the registry has none: see [`entry`](Self::entry).
    // Out of line: the success path (`entry`) stays small.
    #[cold]
    #[inline(never)]
    fn insert(&self, origin: &Origin) -> Arc<Entry> {
        let config = &self.inner.config;
        self.inner
            .limits
            .insert(origin, (), || Entry::new(Some(origin.clone()), config))
            .unwrap_or_else(|| self.inner.overflow.clone())
    }
}

fn rejection(entry: &Entry, origin: &Origin, limit: u32, in_flight: u32) -> LimitRejection {
    #[cfg(feature = "metrics")]
    entry.instruments.rejections.increment(1);
    #[cfg(feature = "tracing")]
    tracing::debug!(
        target: "reqwest_resilience::limit",
        origin = entry.label(),
        limit,
        in_flight,
        "request over the concurrency limit rejected"
    );
    #[cfg(not(any(feature = "metrics", feature = "tracing")))]
    let _ = entry;
    LimitRejection {
        origin: origin.clone(),
        limit,
        in_flight,
    }
}

fn snapshot_of(origin: Origin, entry: &Entry) -> LimitSnapshot {
    let st = lock(&entry.state);
    LimitSnapshot {
        origin,
        limit: st.limit.get(),
        in_flight: st.in_flight,
        queued: st.waiters.len(),
        rejections: st.rejections,
        no_load_latency: match &st.limit {
            Limit::Adaptive(a) => a.no_load_latency(),
            Limit::Fixed(_) => None,
        },
    }
}

fn far_future() -> Instant {
    Instant::now() + super::MAX_DURATION
}

/// A place in an origin's wait queue. Dropped before it was granted, it leaves the queue;
/// granted in the same instant, it hands the permit on.
pub(crate) struct Queued {
    entry: Arc<Entry>,
    id: u64,
    grant: oneshot::Receiver<u32>,
    done: bool,
}

impl Queued {
    /// Leaves the queue. `Some(in flight)` when a permit was granted first: it is ours.
    fn leave(&mut self) -> Option<u32> {
        let mut st = lock(&self.entry.state);
        if let Some(at) = st.waiters.iter().position(|w| w.id == self.id) {
            st.waiters.remove(at);
            return None;
        }
        // Not in the queue any more: a grant was sent under this lock.
        self.grant.try_recv().ok()
    }

    /// The entry, with nothing left to undo: the waiter left the queue or was granted.
    fn disarm(mut self) -> Arc<Entry> {
        self.done = true;
        self.entry.clone()
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(admitted_with) = self.leave() {
            self.entry.release(Sample::Ignored, admitted_with);
        }
    }
}

/// One attempt's permit: the origin's in-flight count includes it until it is recorded
/// or dropped.
///
/// Give it the attempt's outcome with [`record`](Self::record), which feeds an adaptive
/// limit. Dropped unrecorded, it frees its place and tells the limit nothing, unless the
/// attempt's cut has passed (the request's deadline, or in [`ConcurrencyLimit`] the
/// retry middleware's attempt timeout): the attempt was cut there, which is a timeout
/// (an overload signal).
///
/// [`ConcurrencyLimit`]: super::ConcurrencyLimit
#[must_use = "record the attempt's outcome, or the limit learns nothing from it"]
pub(crate) struct LimitPermit {
    entry: Arc<Entry>,
    admitted_with: u32,
    deadline: Option<Instant>,
    admitted_at: Instant,
    /// The attempt's timeout clock: then the attempt is cut where the clock says.
    clock: Option<AttemptClock>,
    /// Whether the attempt's outcome was fed to the limit already (the permit is then
    /// held only for its response body).
    sampled: bool,
    armed: bool,
}

impl fmt::Debug for LimitPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitPermit")
            .field("origin", &self.entry.label())
            .field("admitted_with", &self.admitted_with)
            .finish()
    }
}

impl LimitPermit {
    fn new(
        entry: Arc<Entry>,
        admitted_with: u32,
        deadline: Option<Instant>,
        admitted_at: Instant,
    ) -> Self {
        LimitPermit {
            entry,
            admitted_with,
            deadline,
            admitted_at,
            clock: None,
            sampled: false,
            armed: true,
        }
    }

    /// Runs the attempt on `clock`: dropped unrecorded at or after the clock's cut (the
    /// attempt timeout, or the deadline), it was cut there.
    pub(crate) fn on_clock(&mut self, clock: AttemptClock) {
        self.clock = Some(clock);
    }

    /// Feeds the attempt's outcome to the limit and keeps the permit taken, until it is
    /// dropped (its response body read to the end, or dropped).
    pub(crate) fn record_and_hold(mut self, sample: Sample) -> LimitPermit {
        self.entry.feed(sample, self.admitted_with);
        self.sampled = true;
        self
    }

    /// Whether the attempt was cut, dropped now: at or after its cut (the deadline, or
    /// the attempt's clock), having been admitted before it.
    fn cut_now(&self) -> bool {
        let cut = match &self.clock {
            Some(clock) => clock.cut(),
            None => self.deadline,
        };
        cut.is_some_and(|d| self.admitted_at < d && Instant::now() >= d)
    }

    /// When the permit was taken.
    pub(crate) fn admitted_at(&self) -> Instant {
        self.admitted_at
    }

    /// Gives the permit back with what the attempt showed.
    pub(crate) fn record(mut self, sample: Sample) {
        self.armed = false;
        self.entry.release(sample, self.admitted_with);
    }
}

impl Drop for LimitPermit {
    fn drop(&mut self) {
        if self.armed {
            let cut = !self.sampled && self.cut_now();
            let sample = if cut {
                Sample::Overload
            } else {
                Sample::Ignored
            };
            self.entry.release(sample, self.admitted_with);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Gradient;

    const MS: Duration = Duration::from_millis(1);

    fn origin(i: usize) -> Origin {
        Origin::parse(&format!("http://h{i}.example:8080")).unwrap()
    }

    fn queued(n: u32, max_queue: usize, timeout: Duration) -> LimiterRegistry {
        LimiterRegistry::new(LimiterConfig::fixed(n).queue(max_queue, timeout)).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_get_permits_first_come_first_served_and_a_full_queue_rejects() {
        let r = queued(1, 2, 10 * MS);
        let o = origin(1);
        let first = r.try_acquire(&o).unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..2 {
            let (r, o, order) = (r.clone(), o.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let permit = r.acquire(&o, None).await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(MS).await;
                permit.record(Sample::Ignored);
            }));
            // Let it join the queue before the next.
            tokio::task::yield_now().await;
        }
        assert_eq!(r.get(&o).unwrap().queued, 2);
        let full = r.acquire(&o, None).await.unwrap_err();
        assert_eq!((full.limit, full.in_flight), (1, 1));
        first.record(Sample::Ignored);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1]);
        let s = r.get(&o).unwrap();
        assert_eq!((s.in_flight, s.queued, s.rejections), (0, 0, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_at_the_queue_timeout_or_the_deadline_whichever_is_first() {
        let r = queued(1, 4, 10 * MS);
        let o = origin(2);
        let _held = r.try_acquire(&o).unwrap();
        let t0 = Instant::now();
        assert!(r.acquire(&o, None).await.is_err());
        assert_eq!(t0.elapsed(), 10 * MS);
        let t0 = Instant::now();
        assert!(r.acquire(&o, Some(t0 + 3 * MS)).await.is_err());
        assert_eq!(t0.elapsed(), 3 * MS);
        let s = r.get(&o).unwrap();
        assert_eq!((s.in_flight, s.queued, s.rejections), (1, 0, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_waiter_leaves_the_queue_and_a_permit_granted_to_it_is_passed_on() {
        let r = queued(1, 4, Duration::from_secs(10));
        let o = origin(3);
        let held = r.try_acquire(&o).unwrap();
        // Dropped while queued: it leaves.
        let waiting = tokio::spawn({
            let (r, o) = (r.clone(), o.clone());
            async move { r.acquire(&o, None).await.map(drop) }
        });
        tokio::task::yield_now().await;
        assert_eq!(r.get(&o).unwrap().queued, 1);
        waiting.abort();
        let _ = waiting.await;
        assert_eq!(r.get(&o).unwrap().queued, 0);
        // Granted, then dropped before it ran: the permit goes to the next waiter.
        let Admission::Queued(first) = r.admit(&o, None, true) else {
            panic!("queued")
        };
        let Admission::Queued(mut second) = r.admit(&o, None, true) else {
            panic!("queued")
        };
        held.record(Sample::Ignored);
        assert_eq!(r.get(&o).unwrap().in_flight, 1, "granted to the first");
        drop(first);
        let s = r.get(&o).unwrap();
        assert_eq!((s.in_flight, s.queued), (1, 0), "passed on to the second");
        assert_eq!((&mut second.grant).await, Ok(1));
        let entry = second.disarm();
        LimitPermit::new(entry, 1, None, Instant::now()).record(Sample::Ignored);
        assert_eq!(r.get(&o).unwrap().in_flight, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_permit_dropped_at_its_deadline_is_a_timeout_and_before_it_nothing() {
        let g = Gradient::default()
            .min_limit(1)
            .initial_limit(10)
            .min_window_samples(1);
        let r = LimiterRegistry::new(LimiterConfig::adaptive(g)).unwrap();
        let o = origin(4);
        let deadline = Instant::now() + 5 * MS;
        // Dropped before the deadline: the caller gave up, the limit learns nothing.
        for _ in 0..10 {
            drop(r.acquire(&o, Some(deadline)).await.unwrap());
        }
        assert_eq!(r.get(&o).unwrap().limit, 10);
        // Cut at the deadline: ten overload signals, one window of ten, one cut.
        let mut cut = Vec::new();
        for _ in 0..10 {
            cut.push(r.acquire(&o, Some(deadline)).await.unwrap());
        }
        tokio::time::sleep_until(deadline).await;
        drop(cut);
        assert_eq!(r.get(&o).unwrap().limit, 9);
    }

    #[tokio::test(start_paused = true)]
    async fn the_bound_is_the_registrys_not_a_shards_share() {
        // Regression (issue 21): 16 shards of 625 each put 153 of a burst of 10 000
        // distinct origins on the overflow limit, with the registry holding 9 847.
        let r = LimiterRegistry::default();
        assert_eq!(r.inner.limits.shard_count(), 16);
        let held: Vec<_> = (0..10_000)
            .map(|i| r.try_acquire(&origin(i)).expect("admitted"))
            .collect();
        assert_eq!((r.len(), r.overflowed()), (10_000, 0));
        assert_eq!(r.snapshot().len(), 10_000);
        assert!((0..10_000).all(|i| r.get(&origin(i)).is_some_and(|s| s.in_flight == 1)));
        // The 10 001st, every origin busy: the overflow limit serves it.
        let over = r
            .try_acquire(&origin(10_000))
            .expect("on the overflow limit");
        assert_eq!((r.len(), r.overflowed()), (10_000, 1));
        assert!(r.get(&origin(10_000)).is_none());
        // One origin idle again (whichever shard it is in): the next new one takes its place.
        let mut held = held;
        held.swap_remove(1234).record(Sample::Ignored);
        let new = r.try_acquire(&origin(10_001)).expect("admitted");
        assert_eq!((r.len(), r.overflowed()), (10_000, 1));
        assert!(r.get(&origin(1234)).is_none());
        assert_eq!(r.get(&origin(10_001)).unwrap().in_flight, 1);
        drop((held, over, new));
    }

    #[tokio::test(start_paused = true)]
    async fn the_registry_keeps_its_bound_and_busy_origins_share_the_overflow_limit() {
        let r = LimiterRegistry::new(LimiterConfig::fixed(1).max_origins(4)).unwrap();
        let busy = r.try_acquire(&origin(0)).unwrap();
        for i in 1..100 {
            // A distinct last use per origin: the least recently used is then one origin,
            // not a tie broken by the map's (random) order.
            tokio::time::advance(Duration::from_millis(1)).await;
            r.try_acquire(&origin(i)).unwrap().record(Sample::Ignored);
            assert!(r.len() <= 4);
        }
        assert_eq!(r.len(), 4);
        assert_eq!(r.overflowed(), 0);
        assert_eq!(
            r.get(&origin(0)).unwrap().in_flight,
            1,
            "a busy origin is kept"
        );
        assert!(r.get(&origin(99)).is_some() && r.get(&origin(1)).is_none());
        let held: Vec<_> = (97..100)
            .map(|i| r.try_acquire(&origin(i)).unwrap())
            .collect();
        // Every tracked origin is busy: new ones share one overflow limit of 1.
        let over = r.try_acquire(&origin(500)).unwrap();
        let rejected = r.try_acquire(&origin(501)).unwrap_err();
        assert_eq!(
            rejected.to_string(),
            "concurrency limit for http://h501.example:8080 reached (1 in flight, limit 1): \
             not sent"
        );
        assert_eq!(
            (rejected.origin, rejected.limit, rejected.in_flight),
            (origin(501), 1, 1)
        );
        assert_eq!((r.len(), r.overflowed()), (4, 2));
        drop((busy, held, over));
        assert!(r.try_acquire(&origin(501)).is_ok());
        assert!(r.get(&origin(501)).is_some());
    }
}
