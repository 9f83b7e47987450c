//! The client's `dns_resolver`: it answers reqwest's connector, for the connection the
//! race ([`super::race`]) is making, the one address that connection is to try, and
//! leaves the race every address of the host, in order.
//!
//! hyper-util's `HttpConnector` asks its resolver on the first poll of its connect future,
//! inside the race's poll of it: the race installs its [`Pending`] in a per-thread slot
//! around each poll ([`polled_with`]), and the resolver takes it from there. A name asked
//! outside a race, or another name than the race's host (a proxy's), is resolved and
//! answered whole, in the race's order.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::resolve::Addresses;

/// What one connection's race learned from the resolver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Learned {
    /// The host's addresses, in the order to try them (the first is the one answered to
    /// reqwest's connector), resolved at `at`.
    Addresses { addrs: Vec<SocketAddr>, at: Instant },
    /// The connector asked about another name (a proxy's): this connection is not raced.
    Elsewhere,
}

/// The connection a race is making: its host and port, and what the resolver learned.
#[derive(Debug)]
pub(crate) struct Pending {
    host: String,
    /// The URL's port, when it names one: it outranks a resolved address's.
    explicit_port: Option<u16>,
    /// The scheme's port, for an address resolved without one.
    default_port: u16,
    learned: Mutex<Option<Learned>>,
}

impl Pending {
    pub(crate) fn new(host: String, explicit_port: Option<u16>, default_port: u16) -> Self {
        Pending {
            host,
            explicit_port,
            default_port,
            learned: Mutex::new(None),
        }
    }

    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    /// What the resolver learned for this connection so far.
    pub(crate) fn learned(&self) -> Option<Learned> {
        self.lock().clone()
    }

    /// The port a connection to `addr` uses, as hyper-util sets it.
    pub(crate) fn port_for(&self, addr: SocketAddr) -> u16 {
        match (self.explicit_port, addr.port()) {
            (Some(port), _) => port,
            (None, 0) => self.default_port,
            (None, port) => port,
        }
    }

    fn learn(&self, learned: Learned) {
        let mut slot = self.lock();
        // The first answer stands: the connector asks once per connection.
        if slot.is_none() {
            *slot = Some(learned);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Learned>> {
        self.learned.lock().unwrap_or_else(|e| e.into_inner())
    }
}

thread_local! {
    /// The race being polled on this thread, if any.
    static CURRENT: RefCell<Option<Arc<Pending>>> = const { RefCell::new(None) };
}

/// Restores the slot's earlier value even if the poll unwinds.
struct Restore(Option<Arc<Pending>>);

impl Drop for Restore {
    fn drop(&mut self) {
        let earlier = self.0.take();
        CURRENT.with(|c| *c.borrow_mut() = earlier);
    }
}

/// Runs `poll` (a poll of reqwest's connect future) with `pending` in the slot.
pub(crate) fn polled_with<T>(pending: &Arc<Pending>, poll: impl FnOnce() -> T) -> T {
    let earlier = CURRENT.with(|c| c.borrow_mut().replace(pending.clone()));
    let _restore = Restore(earlier);
    poll()
}

/// The resolver installed with `dns_resolver` on a client the race runs in.
#[derive(Debug, Clone)]
pub(crate) struct Answering(pub(crate) Arc<Addresses>);

impl reqwest::dns::Resolve for Answering {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let race = CURRENT.with(|c| c.borrow().clone());
        let addresses = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found = addresses.resolve(name).await?;
            let race = match race {
                Some(race) if race.host.eq_ignore_ascii_case(&host) => race,
                other => {
                    if let Some(race) = other {
                        race.learn(Learned::Elsewhere);
                    }
                    let ordered = addresses.order(&host, found, Instant::now());
                    return Ok(Box::new(ordered.into_iter()) as reqwest::dns::Addrs);
                }
            };
            let with_ports = found
                .into_iter()
                .map(|a| SocketAddr::new(a.ip(), race.port_for(a)))
                .collect();
            let addrs = addresses.order(&host, with_ports, Instant::now());
            let first = addrs.first().copied();
            if first.is_some() {
                race.learn(Learned::Addresses {
                    addrs,
                    at: Instant::now(),
                });
            }
            Ok(Box::new(first.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::dns::Resolve;
    use std::time::Duration;

    /// Answers every name with the same addresses.
    struct Fixed(Vec<SocketAddr>);

    impl Resolve for Fixed {
        fn resolve(&self, _: reqwest::dns::Name) -> reqwest::dns::Resolving {
            let addrs = self.0.clone();
            Box::pin(async move { Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs) })
        }
    }

    fn answering(addrs: &[&str]) -> Answering {
        let fixed = Fixed(addrs.iter().map(|a| a.parse().unwrap()).collect());
        Answering(Arc::new(Addresses::new(
            Some(Arc::new(fixed)),
            Duration::from_secs(600),
        )))
    }

    async fn ask(resolver: &Answering, name: &str, race: Option<&Arc<Pending>>) -> Vec<SocketAddr> {
        let name: reqwest::dns::Name = name.parse().unwrap();
        let resolving = match race {
            Some(race) => polled_with(race, || resolver.resolve(name)),
            None => resolver.resolve(name),
        };
        resolving.await.unwrap().collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_race_is_answered_its_first_address_and_learns_them_all_with_ports() {
        let resolver = answering(&["192.0.2.1:0", "[2001:db8::1]:0", "192.0.2.2:8080"]);
        let race = Arc::new(Pending::new("Race.test".into(), None, 80));
        let answered = ask(&resolver, "race.test", Some(&race)).await;
        assert_eq!(answered, ["192.0.2.1:80".parse::<SocketAddr>().unwrap()]);
        let want: Vec<SocketAddr> = ["192.0.2.1:80", "[2001:db8::1]:80", "192.0.2.2:8080"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(
            race.learned(),
            Some(Learned::Addresses {
                addrs: want,
                at: Instant::now()
            })
        );
        // The URL's own port outranks every resolved one.
        let race = Arc::new(Pending::new("race.test".into(), Some(9), 80));
        ask(&resolver, "race.test", Some(&race)).await;
        let Some(Learned::Addresses { addrs, .. }) = race.learned() else {
            panic!("learned nothing");
        };
        assert!(addrs.iter().all(|a| a.port() == 9), "{addrs:?}");
    }

    #[tokio::test]
    async fn another_name_or_no_race_is_answered_whole() {
        let resolver = answering(&["192.0.2.1:3128", "192.0.2.2:3128"]);
        let race = Arc::new(Pending::new("target.test".into(), None, 443));
        let answered = ask(&resolver, "proxy.test", Some(&race)).await;
        assert_eq!(answered.len(), 2);
        assert_eq!(race.learned(), Some(Learned::Elsewhere));
        assert_eq!(ask(&resolver, "proxy.test", None).await.len(), 2);
        // The slot is empty again after the poll.
        assert!(CURRENT.with(|c| c.borrow().is_none()));
    }
}
