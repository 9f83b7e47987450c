//! The addresses a new connection races: resolution (the custom resolver, else the
//! system's), their order (RFC 8305 §4: families interleaved, the resolver's first family
//! first), and a per-host memory of the addresses that failed, tried last until they work
//! again (OkHttp's route database).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// The error a resolver returns (reqwest's `BoxError`).
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How many hosts the memory keeps: a client talks to a bounded set of hosts, and one
/// that reaches many (a crawler) must not grow it without end.
const MAX_HOSTS: usize = 1024;

/// Resolves a host's addresses, orders them, and remembers which of them failed: one per
/// client, shared by every connection it opens.
pub(crate) struct Addresses {
    resolver: Option<Arc<dyn reqwest::dns::Resolve>>,
    memory: Duration,
    /// Per host (lower-cased): each address that failed, and when.
    failed: Mutex<HashMap<String, Vec<(SocketAddr, Instant)>>>,
}

impl std::fmt::Debug for Addresses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Addresses")
            .field("resolver", &self.resolver.is_some())
            .field("memory", &self.memory)
            .finish_non_exhaustive()
    }
}

impl Addresses {
    pub(crate) fn new(resolver: Option<Arc<dyn reqwest::dns::Resolve>>, memory: Duration) -> Self {
        Addresses {
            resolver,
            memory,
            failed: Mutex::new(HashMap::new()),
        }
    }

    /// `name`'s addresses as the resolver gives them (ports 0 unless it set them).
    pub(crate) async fn resolve(
        &self,
        name: reqwest::dns::Name,
    ) -> Result<Vec<SocketAddr>, BoxError> {
        match &self.resolver {
            Some(resolver) => Ok(resolver.resolve(name).await?.collect()),
            None => Ok(tokio::net::lookup_host((name.as_str(), 0)).await?.collect()),
        }
    }

    /// `addrs` of `host` in the order to try them: interleaved by family, then each
    /// address that failed within the memory after the others (the earliest failure
    /// first).
    pub(crate) fn order(
        &self,
        host: &str,
        addrs: Vec<SocketAddr>,
        now: Instant,
    ) -> Vec<SocketAddr> {
        let addrs = interleave(addrs);
        let failed = self.lock();
        let Some(failures) = failed.get(&host.to_ascii_lowercase()) else {
            return addrs;
        };
        let failed_at = |a: &SocketAddr| {
            failures
                .iter()
                .find(|(f, at)| f == a && now.saturating_duration_since(*at) < self.memory)
                .map(|(_, at)| *at)
        };
        let (mut last, first): (Vec<_>, Vec<_>) = addrs
            .into_iter()
            .map(|a| (failed_at(&a), a))
            .partition(|(at, _)| at.is_some());
        last.sort_by_key(|(at, _)| *at);
        first.into_iter().chain(last).map(|(_, a)| a).collect()
    }

    /// `addr` of `host` failed to connect at `now`.
    pub(crate) fn failed(&self, host: &str, addr: SocketAddr, now: Instant) {
        let mut failed = self.lock();
        let host = host.to_ascii_lowercase();
        if !failed.contains_key(&host) && failed.len() >= MAX_HOSTS {
            self.evict(&mut failed, now);
        }
        let failures = failed.entry(host).or_default();
        failures.retain(|(a, at)| *a != addr && now.saturating_duration_since(*at) < self.memory);
        failures.push((addr, now));
    }

    /// `addr` of `host` connected: it is tried in its own place again.
    pub(crate) fn worked(&self, host: &str, addr: SocketAddr) {
        let mut failed = self.lock();
        let host = host.to_ascii_lowercase();
        if let Some(failures) = failed.get_mut(&host) {
            failures.retain(|(a, _)| *a != addr);
            if failures.is_empty() {
                failed.remove(&host);
            }
        }
    }

    /// Makes room for one more host: the hosts whose failures are all past the memory,
    /// or else the one whose latest failure is the oldest.
    fn evict(&self, failed: &mut HashMap<String, Vec<(SocketAddr, Instant)>>, now: Instant) {
        let latest = |f: &Vec<(SocketAddr, Instant)>| f.iter().map(|(_, at)| *at).max();
        failed.retain(|_, f| {
            latest(f).is_some_and(|at| now.saturating_duration_since(at) < self.memory)
        });
        if failed.len() >= MAX_HOSTS
            && let Some(oldest) = failed
                .iter()
                .min_by_key(|(_, f)| latest(f))
                .map(|(host, _)| host.clone())
        {
            failed.remove(&oldest);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<(SocketAddr, Instant)>>> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    fn hosts(&self) -> usize {
        self.lock().len()
    }
}

/// RFC 8305 §4: the addresses alternating between IPv6 and IPv4, starting with the family
/// of the resolver's first address, each family in the resolver's order (a "First Address
/// Family Count" of 1).
pub(crate) fn interleave(addrs: Vec<SocketAddr>) -> Vec<SocketAddr> {
    let Some(first) = addrs.first() else {
        return addrs;
    };
    let first_v6 = first.is_ipv6();
    let (mut ours, mut theirs): (Vec<_>, Vec<_>) =
        addrs.into_iter().partition(|a| a.is_ipv6() == first_v6);
    let mut out = Vec::with_capacity(ours.len() + theirs.len());
    ours.reverse();
    theirs.reverse();
    loop {
        match (ours.pop(), theirs.pop()) {
            (None, None) => return out,
            (a, b) => out.extend(a.into_iter().chain(b)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn families_alternate_starting_with_the_resolvers_first() {
        let given = vec![
            a("[2001:db8::1]:443"),
            a("[2001:db8::2]:443"),
            a("[2001:db8::3]:443"),
            a("192.0.2.1:443"),
            a("192.0.2.2:443"),
        ];
        assert_eq!(
            interleave(given),
            [
                a("[2001:db8::1]:443"),
                a("192.0.2.1:443"),
                a("[2001:db8::2]:443"),
                a("192.0.2.2:443"),
                a("[2001:db8::3]:443"),
            ]
        );
        // IPv4 first when the resolver gave IPv4 first; one family stays as it was.
        let given = vec![a("192.0.2.1:80"), a("[2001:db8::1]:80"), a("192.0.2.2:80")];
        assert_eq!(
            interleave(given),
            [a("192.0.2.1:80"), a("[2001:db8::1]:80"), a("192.0.2.2:80")]
        );
        let one = vec![a("192.0.2.2:80"), a("192.0.2.1:80")];
        assert_eq!(interleave(one.clone()), one);
        assert_eq!(interleave(Vec::new()), Vec::<SocketAddr>::new());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_address_goes_last_for_its_host_until_it_works_or_the_memory_ends() {
        let memory = Addresses::new(None, Duration::from_secs(600));
        let (one, two, three) = (a("192.0.2.1:80"), a("192.0.2.2:80"), a("192.0.2.3:80"));
        let all = vec![one, two, three];
        let now = Instant::now();
        assert_eq!(memory.order("h.test", all.clone(), now), all);
        memory.failed("H.test", one, now);
        memory.failed("h.test", two, now + Duration::from_secs(1));
        let later = now + Duration::from_secs(2);
        assert_eq!(
            memory.order("h.TEST", all.clone(), later),
            [three, one, two]
        );
        // Another host with the same addresses is not affected.
        assert_eq!(memory.order("other.test", all.clone(), later), all);
        // `one` worked again: back in its place.
        memory.worked("h.test", one);
        assert_eq!(
            memory.order("h.test", all.clone(), later),
            [one, three, two]
        );
        // Past the memory `two` is in its place too.
        let past = now + Duration::from_secs(601);
        assert_eq!(memory.order("h.test", all.clone(), past), all);
        memory.worked("h.test", two);
        assert_eq!(memory.hosts(), 0, "a host with no failure left is dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn the_memory_keeps_at_most_max_hosts_dropping_the_oldest() {
        let memory = Addresses::new(None, Duration::from_secs(600));
        let addr = a("192.0.2.1:80");
        let now = Instant::now();
        for i in 0..MAX_HOSTS {
            memory.failed(
                &format!("h{i}.test"),
                addr,
                now + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(memory.hosts(), MAX_HOSTS);
        let later = now + Duration::from_secs(1);
        memory.failed("new.test", addr, later);
        assert_eq!(memory.hosts(), MAX_HOSTS);
        // h0's failure was the oldest: it is forgotten, the others are kept.
        let both = vec![addr, a("192.0.2.9:80")];
        assert_eq!(memory.order("h0.test", both.clone(), later), both);
        assert_eq!(
            memory.order("h1.test", both.clone(), later),
            [a("192.0.2.9:80"), addr]
        );
        assert_eq!(
            memory.order("new.test", both, later),
            [a("192.0.2.9:80"), addr]
        );
    }
}
