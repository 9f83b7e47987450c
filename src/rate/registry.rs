//! [`RateLimitRegistry`]: one rate limit per [`Origin`], shared by every client handed the
//! same registry, and the waits for a slot.

use std::fmt;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::config::RateLimitConfig;
use super::schedule::{Pace, Schedule, Slot, Verdict};
use crate::error::ResilienceError;
use crate::origin::Origin;
use crate::origin_map::{BoundedOriginMap, Evict};
use crate::sync::lock;

/// One origin's rate limit as seen by [`RateLimitRegistry::get`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateSnapshot {
    /// Whose rate.
    pub origin: Origin,
    /// The time between two requests in force (the slower of the hand-set and the learned
    /// rate), `None` when nothing paces the origin.
    pub interval: Option<Duration>,
    /// What the server said remains, and the time to its reset, when it said so.
    pub remaining: Option<(u64, Duration)>,
    /// Requests turned away since the origin was first seen.
    pub rejections: u64,
}

/// A request its origin's rate limit turned away; it was not sent.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) struct RateRejection {
    /// Where the request was going.
    pub origin: Origin,
    /// When the origin's next slot is free (from the rejection).
    pub retry_in: Duration,
}

impl fmt::Display for RateRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&ResilienceError::from(self.clone()), f)
    }
}

impl std::error::Error for RateRejection {}

impl From<RateRejection> for ResilienceError {
    fn from(r: RateRejection) -> Self {
        ResilienceError::RateLimited {
            origin: r.origin,
            retry_in: r.retry_in,
        }
    }
}

struct State {
    schedule: Schedule,
    last_used: Instant,
    rejections: u64,
}

struct Entry {
    state: Mutex<State>,
    /// A probe's answer (or its loss): the requests waiting for it ask again.
    answered: Notify,
}

impl Entry {
    fn new(config: &RateLimitConfig, learning: bool, now: Instant) -> Self {
        let hand = config
            .rate
            .map(|r| Pace::new(r.limit.into(), r.window, r.burst));
        Entry {
            state: Mutex::new(State {
                schedule: Schedule::new(
                    hand,
                    learning,
                    config.headroom,
                    config.max_server_wait,
                    now,
                ),
                last_used: now,
                rejections: 0,
            }),
            answered: Notify::new(),
        }
    }
}

/// The map forgets an origin's rate only with nothing pending
/// ([`Schedule::is_idle`]), ordered by its last admission.
impl Evict for Entry {
    type Stamp = Instant;
    type Now = Instant;

    fn idle_since(&self, now: Instant) -> Option<Instant> {
        let st = self.state.try_lock().ok()?;
        st.schedule.is_idle(now).then_some(st.last_used)
    }
}

struct Inner {
    config: RateLimitConfig,
    /// The origins with a rate of their own (the bound is the registry's).
    rates: BoundedOriginMap<Entry>,
    /// The rate of the origins that found the registry full of busy ones (hand-set only:
    /// what one server says is not another's rate).
    overflow: Arc<Entry>,
}

/// One rate limit per [`Origin`], shared by every client given a clone of it.
///
/// Cloning is cheap (one `Arc`); two clones are the same registry, so every client built
/// with one spends the same quota, which is what the server counts.
///
/// # Bounds
///
/// At most [`RateLimitConfig::max_origins`] origins have a rate of their own (spread over
/// up to 16 shards). A new origin in a full registry takes the place of the least
/// recently used origin with nothing pending (no slot taken ahead, no allowance running,
/// no probe out: forgetting it loses only what its next answer teaches again), in its
/// shard or another; when every origin is busy it shares the registry's one *overflow*
/// rate (the hand-set rate, never learned; counted by [`overflowed`](Self::overflowed)).
/// Victims are chosen an eighth of a shard per scan, so a steady stream of new origins
/// costs amortised O(1) each.
///
/// # Example
///
/// Two clients sharing one rate of 2 requests per second to each origin, and what the
/// registry knows of an origin:
///
/// ```
/// use reqwest_resilience::{Origin, Resilience};
/// use reqwest_resilience::rate::{Rate, RateLimitConfig, RateLimitRegistry};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let registry = RateLimitRegistry::new(
///     RateLimitConfig::default().learn(false).rate(Rate::per_second(2)),
/// )?;
/// let a = Resilience::new()
///     .rate_limit(registry.clone())
///     .build_from(reqwest::Client::builder())?;
/// let b = Resilience::new()
///     .rate_limit(registry.clone())
///     .build_from(reqwest::Client::builder())?;
/// // Nothing sent yet: no origin has a rate of its own.
/// let origin = Origin::parse("https://api.example.com")?;
/// assert!(registry.get(&origin).is_none());
/// assert_eq!(registry.len(), 0);
/// # drop((a, b)); Ok(()) }
/// ```
#[derive(Clone)]
pub struct RateLimitRegistry {
    inner: Arc<Inner>,
}

impl fmt::Debug for RateLimitRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitRegistry")
            .field("config", &self.inner.config)
            .field("len", &self.len())
            .finish()
    }
}

/// How an admission ended: go now, wait, or turned away.
pub(crate) enum Admission {
    Go(Ticket),
    Wait(Waiting),
    Rejected(RateRejection),
}

/// A request that must wait: its first verdict and its bounds.
pub(crate) struct Waiting {
    entry: Arc<Entry>,
    first: Verdict,
    /// The latest instant it may start.
    latest: Instant,
    /// How long it waits for one probe's answer.
    probe_wait: Duration,
}

impl RateLimitRegistry {
    /// A registry whose rates follow `config`; an invalid configuration is a
    /// [`ResilienceError::InvalidConfig`].
    pub fn new(config: RateLimitConfig) -> Result<Self, ResilienceError> {
        config.validate()?;
        let overflow = Arc::new(Entry::new(&config, false, Instant::now()));
        Ok(RateLimitRegistry {
            inner: Arc::new(Inner {
                rates: BoundedOriginMap::new(config.max_origins),
                overflow,
                config,
            }),
        })
    }

    /// The configuration every origin follows.
    pub fn config(&self) -> &RateLimitConfig {
        &self.inner.config
    }

    /// Whether `self` and `other` are clones of one registry.
    pub fn same_registry(&self, other: &RateLimitRegistry) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// How many origins have a rate of their own.
    pub fn len(&self) -> usize {
        self.inner.rates.len()
    }

    /// Whether no origin has a rate of its own yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How often a new origin found the registry full and shared the overflow rate.
    pub fn overflowed(&self) -> u64 {
        self.inner.rates.overflowed()
    }

    /// `origin`'s rate, if the registry holds one for it.
    pub fn get(&self, origin: &Origin) -> Option<RateSnapshot> {
        let entry = self.inner.rates.get(origin)?;
        let now = Instant::now();
        let st = lock(&entry.state);
        Some(RateSnapshot {
            origin: origin.clone(),
            interval: st.schedule.pace().map(|p| p.interval),
            remaining: st
                .schedule
                .allowance()
                .filter(|&(_, at)| at > now)
                .map(|(n, at)| (n, at - now)),
            rejections: st.rejections,
        })
    }

    /// Takes a slot for one request to `origin` if one is free now, never waiting (nor
    /// for a probe's answer). The returned ticket tells the origin's rate what the answer
    /// said ([`Ticket::learn`]); dropped, it tells nothing.
    #[cfg(test)]
    pub(crate) fn try_acquire(&self, origin: &Origin) -> Result<Ticket, RateRejection> {
        let entry = self.with_entry(origin, Arc::clone);
        let now = Instant::now();
        let verdict = lock(&entry.state).schedule.decide(now, now, false);
        match verdict {
            Verdict::Now { probe } => Ok(Ticket::new(&entry, probe, self)),
            Verdict::At(slot) => {
                // Unreachable with `latest_start == now`; given back all the same.
                lock(&entry.state).schedule.give_back(slot);
                Err(self.reject(&entry, origin, slot.at - now))
            }
            Verdict::AwaitReset(at) => Err(self.reject(&entry, origin, at - now)),
            Verdict::AwaitProbe => Err(self.reject(&entry, origin, Duration::ZERO)),
            Verdict::Over { retry_in } => Err(self.reject(&entry, origin, retry_in)),
        }
    }

    /// Takes a slot for one request to `origin`: at once if one is free, else waiting for
    /// the first free slot when it comes within [`max_wait`](RateLimitConfig::max_wait)
    /// and before `deadline`, else turned away at once.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives back the slot it took ahead (when no later slot was
    /// taken since: otherwise the slot stays spent, so the origin sees fewer requests,
    /// never more), and a probe's turn to the next request.
    #[cfg(test)]
    pub(crate) async fn acquire(
        &self,
        origin: &Origin,
        deadline: Option<Instant>,
    ) -> Result<Ticket, RateRejection> {
        match self.admit(origin, deadline) {
            Admission::Go(ticket) => Ok(ticket),
            Admission::Rejected(r) => Err(r),
            Admission::Wait(waiting) => self.wait(origin, waiting).await,
        }
    }

    /// The decision for one request: one lookup, one lock, the GCRA arithmetic; the
    /// entry's `Arc` is cloned only for a wait, a probe or an answer to learn from.
    #[inline]
    pub(crate) fn admit(&self, origin: &Origin, deadline: Option<Instant>) -> Admission {
        let config = &self.inner.config;
        self.with_entry(origin, |entry| {
            let now = Instant::now();
            let latest = now.checked_add(config.max_wait).unwrap_or(now);
            let latest = deadline.map_or(latest, |d| d.min(latest)).max(now);
            let verdict = {
                let mut st = lock(&entry.state);
                st.last_used = now;
                st.schedule.decide(now, latest, true)
            };
            match verdict {
                Verdict::Now { probe } => Admission::Go(Ticket::new(entry, probe, self)),
                Verdict::Over { retry_in } => {
                    Admission::Rejected(self.reject(entry, origin, retry_in))
                }
                first => Admission::Wait(Waiting {
                    probe_wait: config.probe_wait,
                    entry: entry.clone(),
                    first,
                    latest,
                }),
            }
        })
    }

    /// Waits for the slot: until the one taken ahead, or for a probe's answer or a reset
    /// and then asks again.
    pub(crate) async fn wait(&self, origin: &Origin, w: Waiting) -> Result<Ticket, RateRejection> {
        if let Verdict::At(slot) = w.first {
            return Ok(self.wait_for_slot(w.entry, slot).await);
        }
        // The end of the wait for the probe out now (from when this request found it out).
        let mut probe_end: Option<Instant> = None;
        loop {
            // Registered before the verdict, so an answer between the two is not missed.
            let mut answered = pin!(w.entry.answered.notified());
            answered.as_mut().enable();
            let now = Instant::now();
            let end = *probe_end
                .get_or_insert_with(|| now.checked_add(w.probe_wait).unwrap_or(now).min(w.latest));
            let verdict = lock(&w.entry.state)
                .schedule
                .decide(now, w.latest, now < end);
            match verdict {
                Verdict::Now { probe } => return Ok(Ticket::new(&w.entry, probe, self)),
                Verdict::At(slot) => return Ok(self.wait_for_slot(w.entry.clone(), slot).await),
                Verdict::Over { retry_in } => return Err(self.reject(&w.entry, origin, retry_in)),
                Verdict::AwaitReset(at) => {
                    tokio::time::sleep_until(at).await;
                    // A reset may send out a new probe: its wait starts then.
                    probe_end = None;
                }
                Verdict::AwaitProbe => {
                    let _ = tokio::time::timeout_at(end, answered).await;
                }
            }
        }
    }

    async fn wait_for_slot(&self, entry: Arc<Entry>, slot: Slot) -> Ticket {
        let taken = TakenAhead {
            entry: Some(entry),
            slot,
        };
        tokio::time::sleep_until(slot.at).await;
        Ticket::new(&taken.keep(), slot.probe, self)
    }

    fn reject(&self, entry: &Entry, origin: &Origin, retry_in: Duration) -> RateRejection {
        lock(&entry.state).rejections += 1;
        crate::metrics::rate_rejection(origin);
        #[cfg(feature = "tracing")]
        tracing::debug!(
            target: "reqwest_resilience::rate",
            origin = %origin,
            retry_in = ?retry_in,
            "request over the rate limit rejected"
        );
        RateRejection {
            origin: origin.clone(),
            retry_in,
        }
    }

    /// Runs `f` on `origin`'s entry (made when new): under the shard's read lock for a
    /// known origin, so the common case clones no `Arc`.
    #[inline]
    fn with_entry<R>(&self, origin: &Origin, f: impl FnOnce(&Arc<Entry>) -> R) -> R {
        self.inner.rates.with(origin, f, || self.insert(origin))
    }

    /// `origin`'s entry, made (or the overflow's) when the registry has none.
    // Out of line: the success path (`entry`) stays small.
    #[cold]
    #[inline(never)]
    fn insert(&self, origin: &Origin) -> Arc<Entry> {
        let (config, now) = (&self.inner.config, Instant::now());
        self.inner
            .rates
            .insert(origin, now, || Entry::new(config, config.learn, now))
            .unwrap_or_else(|| self.inner.overflow.clone())
    }
}

/// A slot taken ahead: given back if dropped before it comes.
struct TakenAhead {
    entry: Option<Arc<Entry>>,
    slot: Slot,
}

impl TakenAhead {
    fn keep(mut self) -> Arc<Entry> {
        self.entry.take().expect("kept once")
    }
}

impl Drop for TakenAhead {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take() {
            lock(&entry.state).schedule.give_back(self.slot);
            if self.slot.probe {
                entry.answered.notify_waiters();
            }
        }
    }
}

/// A request's slot, taken: [`learn`](Self::learn) tells its origin's rate what the
/// answer's rate-limit fields said. Dropped without an answer, a probe's turn passes to
/// the next request.
pub(crate) struct Ticket {
    /// `None` when there is nothing to tell the origin's rate (no learning, no probe).
    entry: Option<Arc<Entry>>,
    probe: bool,
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("probe", &self.probe)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    fn new(entry: &Arc<Entry>, probe: bool, registry: &RateLimitRegistry) -> Self {
        let config = &registry.inner.config;
        Ticket {
            entry: (config.learn || probe).then(|| entry.clone()),
            probe,
        }
    }

    /// Whether this request is its origin's probe: the others wait for its answer.
    #[cfg(test)]
    pub(crate) fn is_probe(&self) -> bool {
        self.probe
    }

    /// Learns from an answer's header fields (a malformed rate-limit field is ignored:
    /// the answer then teaches nothing, though a probe's still ends the wait for it).
    pub(crate) fn learn(mut self, headers: &http::HeaderMap) {
        let Some(entry) = self.entry.take() else {
            return;
        };
        if !self.probe && !crate::ratelimit_fields::any_present(headers) {
            return;
        }
        let fields = crate::ratelimit_fields::parse(headers, SystemTime::now()).unwrap_or_default();
        if fields.is_empty() && !self.probe {
            return;
        }
        let now = Instant::now();
        lock(&entry.state).schedule.learn(&fields, now, self.probe);
        if std::mem::take(&mut self.probe) {
            entry.answered.notify_waiters();
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take().filter(|_| self.probe) {
            lock(&entry.state).schedule.probe_lost();
            entry.answered.notify_waiters();
        }
    }
}
