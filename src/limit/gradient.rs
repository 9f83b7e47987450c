//! [`Gradient`] and [`AdaptiveLimit`]: the arithmetic of the adaptive concurrency limit,
//! pure (no I/O, no clock of its own: every call is handed `now`), so a test drives it
//! with scripted latencies.

use std::time::Duration;

use tokio::time::Instant;

/// The parameters of the adaptive limit, and the algorithm they drive.
///
/// # The algorithm
///
/// The gradient limit of Netflix's concurrency-limits library: the short window's mean
/// latency against a long-run reference (`Gradient2Limit` compares a short- with a
/// long-window average; `GradientLimit`, the first version, used the fastest answer),
/// with its smoothing and its bounded gradient, and these choices, each for a reason:
///
/// - The reference, the **no-load latency**, is a *mean*: the mean latency of every
///   attempt admitted in a stretch of time while none of ours waited at the server. A
///   minimum makes a mix look like queueing: an origin answering in 5 ms or 50 ms at
///   random, independently of load, has a window mean 5.5 times its fastest answer, and
///   against a minimum the limit falls to its floor. Against a mean, a window is slower only
///   when answers wait longer, which is what queueing does, whatever the mix. The mean
///   counts every attempt *admitted* in its stretch, slow and fast, waiting for the slow
///   ones after it: the first answers after any instant are the fast ones.
/// - It is measured first from the first `max(2 × initial_limit, min_window_samples)`
///   answers, then re-measured when it is [`Gradient::no_load_window`] (10 s) old and
///   either the last window filled the limit (our own attempts may be what queues at the
///   server) or no window since was as fast: the limit is halved until the attempts
///   admitted under that half (at least `max(2 × half, min_window_samples)`) have all
///   answered, their mean becomes the no-load latency, and the limit returns (BBR's
///   `PROBE_RTT`, with half the limit instead of four packets). Netflix's long average
///   follows every window, so at a steady limit above the server's capacity it follows
///   the queue up and the limit grows without bound; the probe drains that queue, and
///   relearns a server that really got slower. A client that never fills its limit
///   (application limited) is not probed while its windows confirm the reference, so a
///   healthy origin pays nothing.
/// - An **overload signal** (a `429`, a `503`, a timeout) in a
///   window cuts the limit by [`Gradient::backoff_ratio`] (0.9), the multiplicative
///   decrease of Netflix's `AIMDLimit` and TCP: a server that says it is overloaded is
///   believed before its latency shows it. Once per window, so a burst of `503`s is one
///   cut, not a collapse.
///
/// The limit is updated once per **window** of samples: as many as the limit was when
/// the window opened (one "round trip" of the limit's worth of requests, as TCP Vegas
/// updates once per round trip), at least [`Gradient::min_window_samples`]. At the end of
/// a window, with `rtt` the window's mean latency and `no_load` the no-load mean above:
///
/// ```text
/// gradient  = clamp(tolerance × no_load / rtt, 0.5, 1.0)
/// target    = limit × gradient + √limit            // √limit: the queue allowed to form
/// limit     = limit × (1 − smoothing) + target × smoothing
/// limit     = clamp(limit, min_limit, max_limit)
/// ```
///
/// While the latency stays within `tolerance × no_load` the gradient is 1 and the limit
/// grows by `smoothing × √limit` per window; once requests queue at the server, latency
/// grows with the concurrency beyond its capacity and the gradient pulls the limit back.
/// The gradient is never below 0.5, so one slow window cannot halve the limit (with the
/// smoothing, a window moves it by at most 10 %). A window in which fewer than half the
/// limit were in flight at once is *application limited*: it may lower the limit but
/// never raise it (a client that sends little proves nothing about more).
///
/// # Parameters
///
/// | parameter | default | origin |
/// |---|---|---|
/// | `initial_limit` | 20 | Netflix `Gradient2Limit` |
/// | `min_limit` | 4 | a floor that still lets latency be measured after a collapse |
/// | `max_limit` | 1 000 | Netflix `GradientLimit` (`maxConcurrency`) |
/// | `smoothing` | 0.2 | Netflix `GradientLimit` / `Gradient2Limit` |
/// | `tolerance` | 1.5 | Netflix `Gradient2Limit` (`rttTolerance`) |
/// | `backoff_ratio` | 0.9 | Netflix `AIMDLimit` |
/// | `no_load_window` | 10 s | BBR's `min_rtt` filter window (and `PROBE_RTT` interval) |
/// | `min_window_samples` | 10 | Netflix `WindowedLimit` (`windowSize`) |
/// | `min_latency` | 100 µs | Netflix `WindowedLimit` (`minRttThreshold`) |
///
/// ```
/// use std::time::Duration;
/// use reqwest_resilience::limit::Gradient;
///
/// let g = Gradient::default().initial_limit(10).tolerance(2.0);
/// assert_eq!((g.initial_limit, g.max_limit), (10, 1_000));
/// assert_eq!(g.no_load_window, Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Gradient {
    /// The limit before any sample (default 20).
    pub initial_limit: u32,
    /// The limit never goes below this (default 4, at least 1).
    pub min_limit: u32,
    /// The limit never goes above this (default 1 000).
    pub max_limit: u32,
    /// How far one window moves the limit toward its target, in `(0, 1]` (default 0.2).
    pub smoothing: f64,
    /// How much slower than the no-load latency a window may be before the limit is
    /// pulled back, at least 1 (default 1.5).
    pub tolerance: f64,
    /// The factor applied to the limit after a window with an overload signal, in
    /// `(0, 1)` (default 0.9).
    pub backoff_ratio: f64,
    /// How long a no-load latency stands before it is re-measured, when the limit was
    /// filled or no window was as fast (default 10 s).
    pub no_load_window: Duration,
    /// The fewest samples in a window, and in a re-measurement (default 10).
    pub min_window_samples: u32,
    /// Latencies below this are ignored (default 100 µs): an answer that fast did not
    /// come from the server's work (a cache in between, a canned error) and, taken as the
    /// no-load latency, would pull the limit down until the next re-measurement.
    pub min_latency: Duration,
}

impl Default for Gradient {
    fn default() -> Self {
        Gradient {
            initial_limit: 20,
            min_limit: 4,
            max_limit: 1_000,
            smoothing: 0.2,
            tolerance: 1.5,
            backoff_ratio: 0.9,
            no_load_window: Duration::from_secs(10),
            min_window_samples: 10,
            min_latency: Duration::from_micros(100),
        }
    }
}

macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty),* $(,)?) => {$(
        $(#[$doc])*
        pub fn $name(mut self, $name: $ty) -> Self {
            self.$name = $name;
            self
        }
    )*};
}

impl Gradient {
    setters! {
        /// Sets [`initial_limit`](Self::initial_limit).
        initial_limit: u32,
        /// Sets [`min_limit`](Self::min_limit).
        min_limit: u32,
        /// Sets [`max_limit`](Self::max_limit).
        max_limit: u32,
        /// Sets [`smoothing`](Self::smoothing).
        smoothing: f64,
        /// Sets [`tolerance`](Self::tolerance).
        tolerance: f64,
        /// Sets [`backoff_ratio`](Self::backoff_ratio).
        backoff_ratio: f64,
        /// Sets [`no_load_window`](Self::no_load_window).
        no_load_window: Duration,
        /// Sets [`min_window_samples`](Self::min_window_samples).
        min_window_samples: u32,
        /// Sets [`min_latency`](Self::min_latency).
        min_latency: Duration,
    }

    /// The parameters with each one [`check`](Self::check) would refuse made usable: the
    /// limits put in order (`1 <= min <= initial <= max`), a ratio out of its range (or
    /// NaN) and an empty window replaced by the default's, a window over a year capped.
    /// [`AdaptiveLimit`] runs on these, so it is total for any parameters, not only those
    /// a registry accepted.
    fn sanitized(self) -> Self {
        let d = Gradient::default();
        let min_limit = self.min_limit.max(1);
        let max_limit = self.max_limit.max(min_limit);
        Gradient {
            min_limit,
            max_limit,
            initial_limit: self.initial_limit.clamp(min_limit, max_limit),
            smoothing: if self.smoothing > 0.0 && self.smoothing <= 1.0 {
                self.smoothing
            } else {
                d.smoothing
            },
            tolerance: if self.tolerance.is_finite() && self.tolerance >= 1.0 {
                self.tolerance
            } else {
                d.tolerance
            },
            backoff_ratio: if self.backoff_ratio > 0.0 && self.backoff_ratio < 1.0 {
                self.backoff_ratio
            } else {
                d.backoff_ratio
            },
            no_load_window: if self.no_load_window.is_zero() {
                d.no_load_window
            } else {
                self.no_load_window.min(super::MAX_DURATION)
            },
            min_window_samples: self.min_window_samples.max(1),
            min_latency: self.min_latency,
        }
    }

    /// Why these parameters cannot work, if they cannot.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.min_limit == 0 {
            return Err("gradient min_limit must be at least 1".into());
        }
        if !(self.min_limit <= self.initial_limit && self.initial_limit <= self.max_limit) {
            return Err(format!(
                "gradient limits must satisfy min_limit <= initial_limit <= max_limit, got \
                 {} <= {} <= {}",
                self.min_limit, self.initial_limit, self.max_limit
            ));
        }
        if !(self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return Err(format!(
                "gradient smoothing must be in (0, 1], got {}",
                self.smoothing
            ));
        }
        if !(self.tolerance.is_finite() && self.tolerance >= 1.0) {
            return Err(format!(
                "gradient tolerance must be finite and at least 1, got {}",
                self.tolerance
            ));
        }
        if !(self.backoff_ratio > 0.0 && self.backoff_ratio < 1.0) {
            return Err(format!(
                "gradient backoff_ratio must be in (0, 1), got {}",
                self.backoff_ratio
            ));
        }
        if self.no_load_window.is_zero() || self.no_load_window > super::MAX_DURATION {
            return Err(format!(
                "gradient no_load_window must be more than zero and at most a year, got {:?}",
                self.no_load_window
            ));
        }
        if self.min_window_samples == 0 {
            return Err("gradient min_window_samples must be at least 1".into());
        }
        Ok(())
    }
}

/// What one attempt tells the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum Sample {
    /// The attempt was answered after this latency (time to the response head).
    Latency(Duration),
    /// The server signalled overload: a `429`, a `503`, or a timeout.
    Overload,
    /// The attempt says nothing about the server's load (cancelled by the caller, refused
    /// connection, rejected locally).
    Ignored,
}

/// The state of one origin's adaptive limit: [`Gradient`] applied to the samples it is
/// fed. Pure: the clock is an argument (see the test
/// `a_saturated_client_whose_server_answers_fast_grows_its_limit`).
#[derive(Debug, Clone)]
pub struct AdaptiveLimit {
    params: Gradient,
    estimate: f64,
    window: Window,
    /// The no-load latency (the mean latency of answers that waited behind none of our
    /// own attempts) and when a window last confirmed it.
    no_load: Option<(Duration, Instant)>,
    /// A measurement of the no-load latency under way: the first one, then each probe's.
    /// (Boxed: it is rare, and kept out of every registry entry's size.)
    measure: Option<Box<Measure>>,
    /// When the last measurement ended.
    measured: Option<Instant>,
    probe: Option<Probe>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Window {
    samples: u32,
    /// Latency samples only (an overload signal has no meaningful latency).
    latencies: u32,
    latency_sum: Duration,
    max_in_flight: u32,
    overloaded: bool,
}

/// A re-measurement of the no-load latency: the limit is halved until the attempts
/// admitted under that half have answered.
#[derive(Debug, Clone, Copy)]
struct Probe {
    /// The estimate to return to.
    restore: f64,
    cap: u32,
}

/// The mean latency of the attempts *admitted* in one stretch of time, `[from, until]`:
/// all of them, slow and fast, which is why it waits after `until` for the slow ones.
/// (The first `n` answers after any instant are the fast ones: ending a mean at a count of
/// answers would measure the mix's fast part.) An answer's admission is `now − latency`.
#[derive(Debug, Clone, Copy)]
struct Measure {
    /// The first admission counted (set by the first answer when `None`).
    from: Option<Instant>,
    /// The last admission counted, set once `need` answers are in.
    until: Option<Instant>,
    /// How long after `until` answers are still awaited.
    wait: Duration,
    /// Only attempts admitted with at most this many in flight count (a probe's cap).
    cap: Option<u32>,
    need: u32,
    samples: u32,
    latencies: u32,
    sum: Duration,
    slowest: Duration,
    overloaded: bool,
}

impl Measure {
    fn new(from: Option<Instant>, cap: Option<u32>, need: u32) -> Self {
        Measure {
            from,
            until: None,
            wait: Duration::ZERO,
            cap,
            need,
            samples: 0,
            latencies: 0,
            sum: Duration::ZERO,
            slowest: Duration::ZERO,
            overloaded: false,
        }
    }

    /// Takes one sample; `true` once the measurement is complete.
    fn take(&mut self, now: Instant, sample: Sample, in_flight: u32) -> bool {
        if self.cap.is_none_or(|cap| in_flight <= cap) {
            match sample {
                Sample::Latency(rtt) => {
                    // Admitted before the clock's origin: as early as can be.
                    let admitted = now.checked_sub(rtt);
                    let from = *self.from.get_or_insert(admitted.unwrap_or(now));
                    let inside = admitted.is_some_and(|a| a >= from)
                        && self.until.is_none_or(|u| admitted.is_some_and(|a| a <= u));
                    if inside || (self.until.is_none() && admitted.is_none()) {
                        self.samples += 1;
                        self.latencies += 1;
                        self.sum = self.sum.saturating_add(rtt);
                        self.slowest = self.slowest.max(rtt);
                    }
                }
                Sample::Overload => {
                    self.overloaded = true;
                    self.samples += 1;
                }
                Sample::Ignored => {}
            }
        }
        let Some(until) = self.until else {
            if self.samples < self.need {
                return false;
            }
            self.until = Some(now);
            let span = self
                .from
                .map_or(Duration::ZERO, |f| now.saturating_duration_since(f));
            self.wait = self.slowest.max(span);
            return false;
        };
        until.checked_add(self.wait).is_none_or(|end| now >= end)
    }

    fn mean(&self) -> Option<Duration> {
        self.sum
            .checked_div(self.latencies)
            .filter(|d| !d.is_zero())
    }
}

impl AdaptiveLimit {
    /// A limit at `params.initial_limit`, with no sample yet. Parameters a registry
    /// would refuse ([`LimiterConfig::validate`](super::LimiterConfig::validate)) never
    /// make it panic: each is replaced by a usable one (limits put in order, a ratio out of
    /// range by its default).
    pub fn new(params: Gradient) -> Self {
        let params = params.sanitized();
        AdaptiveLimit {
            params,
            estimate: f64::from(params.initial_limit),
            window: Window::default(),
            no_load: None,
            measure: Some(Box::new(Measure::new(
                None,
                None,
                params
                    .min_window_samples
                    .max(params.initial_limit.saturating_mul(2)),
            ))),
            measured: None,
            probe: None,
        }
    }

    /// The current limit: how many attempts may be in flight.
    pub fn limit(&self) -> u32 {
        match self.probe {
            Some(p) => p.cap,
            // The estimate stays within [min_limit, max_limit], both u32.
            None => self.estimate as u32,
        }
    }

    /// The no-load latency: the mean latency of the attempts admitted while none of our
    /// own waited at the server (the first ones, then each probe's; `None` before the
    /// first answer).
    pub fn no_load_latency(&self) -> Option<Duration> {
        self.no_load.map(|n| n.0)
    }

    /// Whether the limit is halved to re-measure the no-load latency.
    #[cfg(test)]
    pub fn is_probing(&self) -> bool {
        self.probe.is_some()
    }

    /// Feeds one attempt's outcome; `in_flight` is how many attempts were in flight when
    /// it was admitted (itself included). Returns the new limit when it changed.
    pub fn sample(&mut self, now: Instant, sample: Sample, in_flight: u32) -> Option<u32> {
        let before = self.limit();
        match sample {
            Sample::Ignored => return None,
            Sample::Latency(rtt) if rtt < self.params.min_latency => return None,
            _ => {}
        }
        self.measure_sample(now, sample, in_flight);
        if self.probe.is_none() {
            self.window_sample(now, sample, in_flight);
        }
        let after = self.limit();
        (after != before).then_some(after)
    }

    fn measure_sample(&mut self, now: Instant, sample: Sample, in_flight: u32) {
        let Some(m) = &mut self.measure else {
            return;
        };
        let done = m.take(now, sample, in_flight);
        let first = m.cap.is_none();
        let (mean, overloaded) = (m.mean(), m.overloaded);
        // The first measurement's mean so far stands in until it is complete.
        if let Some(mean) = mean
            && (done || (first && m.until.is_none()) || self.no_load.is_none())
        {
            self.no_load = Some((mean, now));
        }
        if !done {
            return;
        }
        self.measure = None;
        self.measured = Some(now);
        if let Some(probe) = self.probe.take() {
            let restore = if overloaded {
                probe.restore * self.params.backoff_ratio
            } else {
                probe.restore
            };
            self.estimate = restore.clamp(
                f64::from(self.params.min_limit),
                f64::from(self.params.max_limit),
            );
            self.window = Window::default();
        }
    }

    fn window_sample(&mut self, now: Instant, sample: Sample, in_flight: u32) {
        let w = &mut self.window;
        match sample {
            Sample::Overload => w.overloaded = true,
            Sample::Latency(rtt) => {
                w.latencies += 1;
                w.latency_sum = w.latency_sum.saturating_add(rtt);
            }
            Sample::Ignored => return,
        }
        w.samples += 1;
        w.max_in_flight = w.max_in_flight.max(in_flight);
        let samples = w.samples;
        if samples < self.limit().max(self.params.min_window_samples) {
            return;
        }
        let window = std::mem::take(&mut self.window);
        self.estimate = self.next_estimate(&window);
        // A window no slower than the no-load latency confirms it: none of our attempts
        // waited behind another.
        let mean = window.latency_sum.checked_div(window.latencies);
        if let (Some(mean), Some((no_load, at))) = (mean, &mut self.no_load)
            && window.latencies > 0
            && mean <= *no_load
        {
            *at = now;
        }
        // A no-load latency nothing has confirmed for `no_load_window` may be stale: the
        // server got slower, or every window since queued behind our own attempts (at a
        // steady limit above the server's capacity each one does). Halving the limit
        // drains that queue; the attempts admitted under the half then say what the
        // server takes unloaded (BBR's PROBE_RTT, with a cap of half the limit instead
        // of four packets).
        let saturated = window.max_in_flight >= self.limit();
        if self.measure.is_none()
            && let Some((_, confirmed)) = self.no_load
            && let Some(measured) = self.measured
            && now.saturating_duration_since(measured) >= self.params.no_load_window
            && (saturated || now.saturating_duration_since(confirmed) >= self.params.no_load_window)
        {
            let cap = ((self.estimate / 2.0).ceil() as u32).max(self.params.min_limit);
            self.probe = Some(Probe {
                restore: self.estimate,
                cap,
            });
            let need = self.params.min_window_samples.max(cap.saturating_mul(2));
            self.measure = Some(Box::new(Measure::new(Some(now), Some(cap), need)));
        }
    }

    fn next_estimate(&self, w: &Window) -> f64 {
        let p = &self.params;
        let limit = self.estimate;
        let next = if w.overloaded {
            limit * p.backoff_ratio
        } else {
            let (Some((no_load, _)), Some(rtt)) = (
                self.no_load,
                w.latency_sum
                    .checked_div(w.latencies)
                    .filter(|d| !d.is_zero()),
            ) else {
                return limit;
            };
            let gradient =
                (p.tolerance * no_load.as_secs_f64() / rtt.as_secs_f64()).clamp(0.5, 1.0);
            let target = limit * gradient + limit.sqrt();
            let mut next = limit * (1.0 - p.smoothing) + target * p.smoothing;
            // Application limited: fewer than half the limit in flight proves nothing
            // about more.
            if f64::from(w.max_in_flight) * 2.0 < limit {
                next = next.min(limit);
            }
            next
        };
        next.clamp(f64::from(p.min_limit), f64::from(p.max_limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_saturated_client_whose_server_answers_fast_grows_its_limit() {
        let now = tokio::time::Instant::now();
        let mut limit = AdaptiveLimit::new(Gradient::default());
        assert_eq!(limit.limit(), 20);
        // A saturated client (20 in flight) whose server answers in 5 ms throughout.
        for _ in 0..100 {
            limit.sample(now, Sample::Latency(Duration::from_millis(5)), 20);
        }
        assert!(limit.limit() > 20);
    }

    #[tokio::test(start_paused = true)]
    async fn parameters_the_registry_refuses_never_panic_the_limit() {
        let bad = [
            Gradient::default().smoothing(f64::NAN),
            Gradient::default().smoothing(-3.0).tolerance(f64::INFINITY),
            Gradient::default()
                .tolerance(f64::NAN)
                .backoff_ratio(f64::NAN),
            Gradient::default().backoff_ratio(7.0),
            Gradient::default()
                .min_limit(0)
                .max_limit(0)
                .initial_limit(u32::MAX),
            Gradient::default().min_limit(u32::MAX).max_limit(1),
            Gradient::default()
                .no_load_window(Duration::MAX)
                .min_window_samples(0)
                .min_latency(Duration::ZERO),
        ];
        for g in bad {
            let mut limit = AdaptiveLimit::new(g);
            let start = Instant::now();
            for i in 0..500u32 {
                let sample = match i % 7 {
                    0 => Sample::Overload,
                    1 => Sample::Ignored,
                    2 => Sample::Latency(Duration::MAX),
                    3 => Sample::Latency(Duration::ZERO),
                    _ => Sample::Latency(Duration::from_millis(u64::from(1 + i % 50))),
                };
                let now = start + Duration::from_secs(u64::from(i));
                let _ = limit.sample(now, sample, i);
                let _ = (limit.no_load_latency(), limit.is_probing());
                // Always at least one attempt admitted (a NaN estimate would be 0).
                assert!(limit.limit() >= 1, "{g:?}: limit {}", limit.limit());
            }
        }
    }

    const MS: Duration = Duration::from_millis(1);

    /// Feeds `windows` windows of samples from a client keeping the limit in flight, the
    /// clock moving as such a client's answers arrive; `rtt(in_flight)` is the server.
    /// Returns the limit after each window.
    fn drive(
        l: &mut AdaptiveLimit,
        now: &mut Instant,
        rtt: impl Fn(u32) -> Duration,
        windows: usize,
    ) -> Vec<u32> {
        let mut out = Vec::new();
        for _ in 0..windows {
            loop {
                let in_flight = l.limit();
                let latency = rtt(in_flight);
                *now += latency / in_flight;
                l.sample(*now, Sample::Latency(latency), in_flight);
                if l.window.samples == 0 && l.probe.is_none() {
                    break;
                }
            }
            out.push(l.limit());
        }
        out
    }

    fn flat(d: Duration) -> impl Fn(u32) -> Duration {
        move |_| d
    }

    /// A server with `slots` handlers serving in `service`: requests beyond them queue.
    fn queueing(slots: u32, service: Duration) -> impl Fn(u32) -> Duration {
        move |n| service.mul_f64((f64::from(n) / f64::from(slots)).max(1.0))
    }

    #[tokio::test(start_paused = true)]
    async fn steady_latency_grows_the_limit_by_smoothing_times_sqrt_per_window() {
        let mut l = AdaptiveLimit::new(Gradient::default());
        let mut now = Instant::now();
        let limits = drive(&mut l, &mut now, flat(5 * MS), 3);
        // 20 + 0.2·√20 = 20.89, + 0.2·√20.89 = 21.80, + 0.2·√21.80 = 22.73.
        assert_eq!(limits, [20, 21, 22]);
        assert!((l.estimate - 22.734).abs() < 0.01, "{}", l.estimate);
        assert_eq!(l.no_load_latency(), Some(5 * MS));
    }

    #[tokio::test(start_paused = true)]
    async fn injected_latency_pulls_the_limit_down_and_its_end_lets_it_rise_again() {
        let mut l = AdaptiveLimit::new(Gradient::default().initial_limit(40));
        let mut now = Instant::now();
        drive(&mut l, &mut now, flat(5 * MS), 5);
        let before = l.limit();
        assert!(before >= 40, "{before}");
        // Ten times slower: the gradient clamps at 0.5, each window -10 % + 0.2·√limit.
        let falling = drive(&mut l, &mut now, flat(50 * MS), 20);
        assert!(falling.windows(2).all(|w| w[1] <= w[0]), "{falling:?}");
        let bottom = *falling.last().unwrap();
        assert!(bottom < before / 2, "{before} -> {bottom}");
        assert_eq!(l.no_load_latency(), Some(5 * MS));
        let rising = drive(&mut l, &mut now, flat(5 * MS), 30);
        assert!(rising.windows(2).all(|w| w[1] >= w[0]), "{rising:?}");
        assert!(*rising.last().unwrap() > bottom + 10, "{rising:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn queueing_settles_the_limit_near_the_servers_capacity_and_stays() {
        // 16 handlers serving in 5 ms. The first answers already queued (20 > 16), so
        // the first no-load latency is too high; the probes every 10 s correct it.
        let server = queueing(16, 5 * MS);
        let mut l = AdaptiveLimit::new(Gradient::default());
        let mut now = Instant::now();
        let start = now;
        let (mut probes, mut highest) = (0, 0);
        let mut settled = (u32::MAX, 0);
        while now - start < Duration::from_secs(120) {
            let was = l.is_probing();
            let in_flight = l.limit();
            let latency = server(in_flight);
            now += latency / in_flight;
            l.sample(now, Sample::Latency(latency), in_flight);
            probes += usize::from(!was && l.is_probing());
            highest = highest.max(l.limit());
            if now - start > Duration::from_secs(40) && !l.is_probing() {
                settled = (settled.0.min(l.limit()), settled.1.max(l.limit()));
            }
        }
        // Equilibrium of limit − √limit = 1.5 × 16 (tolerance × capacity): about 29,
        // and it stays there (no ratchet).
        assert!(settled.0 >= 27 && settled.1 <= 31, "{settled:?}");
        assert!(highest <= 40, "{highest}");
        assert!((11..=13).contains(&probes), "{probes}");
        assert_eq!(l.no_load_latency(), Some(5 * MS));
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_got_slower_is_relearnt_by_the_probe() {
        let mut l = AdaptiveLimit::new(Gradient::default());
        let mut now = Instant::now();
        drive(&mut l, &mut now, queueing(16, 5 * MS), 50);
        // Ten times slower for good (same 16 handlers): the limit falls, then the probe
        // after 10 s learns 50 ms as the new no-load latency and the limit recovers.
        drive(&mut l, &mut now, queueing(16, 50 * MS), 20);
        let low = l.limit();
        assert!(low < 16, "{low}");
        let end = now + Duration::from_secs(30);
        while now < end {
            drive(&mut l, &mut now, queueing(16, 50 * MS), 1);
        }
        assert_eq!(l.no_load_latency(), Some(50 * MS));
        assert!((26..=32).contains(&l.limit()), "{}", l.limit());
    }

    /// A seeded xorshift: the same "random" mix on every run.
    struct Rng(u64);

    impl Rng {
        fn coin(&mut self) -> bool {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 & 1 == 1
        }
    }

    /// What [`serve`] saw: the lowest limit after the first 1 000 answers, and how many
    /// times a caller found the limit full.
    struct Served {
        lowest: u32,
        rejected: u64,
    }

    /// An event simulation of `answers` answers: `callers` in a closed loop (each sends
    /// its next request as its answer comes; one the limit turns away tries again 1 ms
    /// later), or with `callers: None` a client that always has work (it keeps the limit
    /// in flight). `latency(in flight at admission)` is the server.
    fn serve(
        l: &mut AdaptiveLimit,
        now: &mut Instant,
        callers: Option<u32>,
        mut latency: impl FnMut(u32) -> Duration,
        answers: usize,
    ) -> Served {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        // (answer due, latency, admitted with), and when each waiting caller tries.
        let mut flight: BinaryHeap<Reverse<(Instant, Duration, u32)>> = BinaryHeap::new();
        let mut ready: BinaryHeap<Reverse<Instant>> = BinaryHeap::new();
        if let Some(n) = callers {
            ready.extend((0..n).map(|_| Reverse(*now)));
        }
        let (mut lowest, mut rejected) = (u32::MAX, 0);
        for answer in 0..answers {
            loop {
                let wants = callers.is_none() || ready.peek().is_some_and(|Reverse(t)| *t <= *now);
                let in_flight = flight.len() as u32;
                if !wants || (callers.is_none() && in_flight >= l.limit()) {
                    break;
                }
                if callers.is_some() {
                    ready.pop();
                }
                if in_flight >= l.limit() {
                    ready.push(Reverse(*now + MS));
                    rejected += 1;
                    continue;
                }
                let rtt = latency(in_flight + 1);
                flight.push(Reverse((*now + rtt, rtt, in_flight + 1)));
            }
            // The next event: a caller's retry before the next answer is served first.
            if let (Some(Reverse(retry)), Some(Reverse((due, ..)))) = (ready.peek(), flight.peek())
                && retry < due
            {
                *now = *retry;
                continue;
            }
            let Reverse((due, rtt, with)) = flight.pop().expect("something in flight");
            *now = due;
            l.sample(due, Sample::Latency(rtt), with);
            if callers.is_some() {
                ready.push(Reverse(due));
            }
            if answer >= 1_000 {
                lowest = lowest.min(l.limit());
            }
        }
        Served { lowest, rejected }
    }

    /// 5 ms or 50 ms at random, whatever the load.
    fn mixed(seed: u64) -> impl FnMut(u32) -> Duration {
        let mut rng = Rng(seed);
        move |_| if rng.coin() { 5 * MS } else { 50 * MS }
    }

    #[tokio::test(start_paused = true)]
    async fn latencies_that_vary_without_queueing_keep_the_limit_up() {
        // Regression (issue 21): the fastest answer as the reference made a 10x spread
        // look like queueing, and the limit settled at the floor (4).
        for seed in [1, 2, 3, 0x5eed] {
            // A client that always has work, a server that never queues: the limit grows.
            let mut l = AdaptiveLimit::new(Gradient::default());
            let mut now = Instant::now();
            let s = serve(&mut l, &mut now, None, mixed(seed), 20_000);
            assert!(s.lowest >= 20, "seed {seed}: lowest {}", s.lowest);
            assert!(l.limit() >= 100, "seed {seed}: {}", l.limit());
            let mean = l.no_load_latency().unwrap();
            assert!(mean >= 20 * MS && mean <= 35 * MS, "seed {seed}: {mean:?}");
            // 12 callers in a closed loop: never turned away.
            let mut l = AdaptiveLimit::new(Gradient::default());
            let s = serve(&mut l, &mut now, Some(12), mixed(seed), 20_000);
            assert_eq!(s.rejected, 0, "seed {seed}");
            assert!(s.lowest >= 13, "seed {seed}: lowest {}", s.lowest);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn mixed_latencies_that_rise_with_in_flight_cut_the_limit() {
        // The same mix on a server of 16 handlers: beyond 16, each answer waits for the
        // ones ahead of it.
        for seed in [1, 2, 3] {
            let mut mix = mixed(seed);
            let server = move |n: u32| mix(n).mul_f64((f64::from(n) / 16.0).max(1.0));
            let mut l = AdaptiveLimit::new(Gradient::default().initial_limit(100));
            let mut now = Instant::now();
            serve(&mut l, &mut now, None, server, 60_000);
            // It settles between 30 and 50 (the probe's half limit drains the queue).
            assert!(l.limit() < 60, "seed {seed}: {}", l.limit());
            assert!(l.limit() >= 16, "seed {seed}: {}", l.limit());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_halves_the_limit_and_measures_every_attempt_admitted_under_the_half() {
        let mut l = AdaptiveLimit::new(Gradient::default().initial_limit(40));
        let mut now = Instant::now();
        // The first measurement: a server that answers in 6 ms.
        for _ in 0..200 {
            now += MS;
            l.sample(now, Sample::Latency(6 * MS), 40);
        }
        assert_eq!(l.no_load_latency(), Some(6 * MS));
        assert!(l.measure.is_none());
        // Slower for 10 s (nothing confirms 6 ms): the next window starts a probe.
        now += Duration::from_secs(10);
        while !l.is_probing() {
            l.sample(now, Sample::Latency(8 * MS), 40);
        }
        let restore = l.probe.unwrap().restore;
        let cap = l.limit();
        assert_eq!(cap, (restore / 2.0).ceil() as u32);
        let start = now;
        // Answers admitted before the halving do not count.
        for _ in 0..100 {
            l.sample(now, Sample::Latency(8 * MS), cap + 1);
        }
        assert!(l.is_probing());
        // Under the cap, 5 ms and 50 ms alternately, each answered at its admission plus
        // its latency: the fast ones come first, and the probe waits for the slow ones.
        let mut answers: Vec<(Instant, Duration)> = (0..4 * cap)
            .map(|i| {
                let rtt = if i % 2 == 0 { 5 * MS } else { 50 * MS };
                (start + MS * (i / 2) + rtt, rtt)
            })
            .collect();
        answers.sort();
        // And one admitted later, answered after the slow ones are all in.
        answers.push((start + 200 * MS, 5 * MS));
        let mut ended = None;
        for (i, (at, rtt)) in answers.into_iter().enumerate() {
            l.sample(at, Sample::Latency(rtt), cap);
            if ended.is_none() && !l.is_probing() {
                ended = Some(i);
            }
        }
        // The mean of 5 ms and 50 ms, not the fastest answer.
        let mean = l.no_load_latency().unwrap();
        assert!(mean >= 25 * MS && mean <= 30 * MS, "{mean:?}");
        assert_eq!(ended, Some(4 * cap as usize), "the last one ends it");
        assert_eq!(l.limit(), restore as u32);
    }

    #[tokio::test(start_paused = true)]
    async fn an_overload_signal_cuts_once_per_window_by_the_backoff_ratio() {
        let mut l = AdaptiveLimit::new(Gradient::default().initial_limit(100));
        let now = Instant::now();
        for i in 0..100 {
            let s = if i % 2 == 0 {
                Sample::Overload
            } else {
                Sample::Latency(5 * MS)
            };
            l.sample(now, s, 100);
        }
        assert_eq!(l.limit(), 90);
        // Ignored samples do not count toward the window.
        for _ in 0..1_000 {
            assert_eq!(l.sample(now, Sample::Ignored, 90), None);
        }
        assert_eq!(l.limit(), 90);
        assert_eq!(l.window.samples, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn latencies_below_min_latency_are_ignored() {
        let mut l = AdaptiveLimit::new(Gradient::default());
        let now = Instant::now();
        for _ in 0..1_000 {
            assert_eq!(
                l.sample(now, Sample::Latency(Duration::from_micros(99)), 20),
                None
            );
        }
        assert_eq!(
            (l.limit(), l.no_load_latency(), l.window.samples),
            (20, None, 0)
        );
        l.sample(now, Sample::Latency(Duration::from_micros(100)), 20);
        assert_eq!(l.no_load_latency(), Some(Duration::from_micros(100)));
    }

    #[tokio::test(start_paused = true)]
    async fn an_application_limited_window_never_raises_the_limit() {
        let mut l = AdaptiveLimit::new(Gradient::default());
        let now = Instant::now();
        for _ in 0..1_000 {
            l.sample(now, Sample::Latency(5 * MS), 9);
        }
        assert_eq!(l.limit(), 20);
    }

    #[tokio::test(start_paused = true)]
    async fn the_limit_stays_within_min_and_max() {
        let g = Gradient::default()
            .min_limit(3)
            .initial_limit(5)
            .max_limit(6);
        let mut l = AdaptiveLimit::new(g);
        let mut now = Instant::now();
        assert_eq!(
            *drive(&mut l, &mut now, flat(5 * MS), 200).last().unwrap(),
            6
        );
        for _ in 0..1_000 {
            l.sample(now, Sample::Overload, 6);
        }
        assert_eq!(l.limit(), 3);
    }

    #[test]
    fn invalid_parameters_are_refused_with_a_reason() {
        let ok = Gradient::default();
        assert_eq!(ok.check(), Ok(()));
        for bad in [
            ok.min_limit(0),
            ok.initial_limit(2),
            ok.max_limit(10),
            ok.smoothing(0.0),
            ok.smoothing(f64::NAN),
            ok.tolerance(0.9),
            ok.tolerance(f64::INFINITY),
            ok.backoff_ratio(1.0),
            ok.no_load_window(Duration::ZERO),
            ok.min_window_samples(0),
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
