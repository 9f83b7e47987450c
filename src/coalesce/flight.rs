//! The requests in flight, by key: who sends, who waits, and what they land with.
//!
//! # Concurrency
//!
//! One mutex over the map. A caller joins under it: it finds a flight whose sender is
//! still there and becomes one of its followers, or it starts a flight and becomes its
//! leader. The leader lands under the same lock: it takes its flight out of the map (so a
//! caller arriving after that starts a new flight, never waits on a finished one) and
//! reads how many followers joined; then it publishes the landing on the flight's
//! `watch` channel (made by its first follower), which every follower that joined holds
//! a receiver of. A follower
//! therefore either joined before the landing and sees it, or arrives after the removal
//! and starts afresh: no follower can miss a landing, none waits on a flight that no one
//! flies.
//!
//! A leader dropped before it lands (its caller gave up) removes its flight and drops
//! its sender: every follower's wait ends with "abandoned", and each joins again, so the
//! first of them becomes the next leader and the others follow it.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::key::{FlightKey, Partition, PreHashed};
use super::landing::Landing;

/// What a flight's followers are told.
pub(crate) type Published = Option<Arc<Landing>>;

/// The flights in flight, shared by every clone of one [`CoalesceGets`](super::CoalesceGets).
#[derive(Default)]
pub(crate) struct Flights {
    map: Mutex<HashMap<FlightKey, InFlight, PreHashed>>,
    /// The keys' hasher, with random keys of its own.
    hasher: std::hash::RandomState,
}

struct InFlight {
    id: u64,
    followers: u32,
    /// Made by the first follower: a request nobody joins costs no channel.
    sender: Option<watch::Sender<Published>>,
}

/// A caller's part in a flight.
pub(crate) enum Joined<'f> {
    /// It sends the request for everyone.
    Leader(Leader<'f>),
    /// It waits for the leader's landing.
    Follower(watch::Receiver<Published>),
}

/// The caller that sends. Dropped before [`land`](Self::land), it abandons the flight.
pub(crate) struct Leader<'f> {
    flights: &'f Flights,
    key: Option<&'f FlightKey>,
    id: u64,
    /// The followers' channel, taken from the flight when it closes.
    sender: Option<watch::Sender<Published>>,
}

/// How a follower's wait ended.
pub(crate) enum Waited {
    Landed(Arc<Landing>),
    /// The leader gave up before it landed.
    Abandoned,
}

impl Flights {
    /// The key of `req` in `partition` (`None`: never shared), hashed with these
    /// flights' hasher.
    pub(crate) fn key(&self, req: &reqwest::Request, partition: &Partition) -> Option<FlightKey> {
        FlightKey::of(req, partition, &self.hasher)
    }

    /// Joins the flight of `key`, or starts it.
    pub(crate) fn join<'f>(&'f self, key: &'f FlightKey) -> Joined<'f> {
        let mut map = crate::sync::lock(&self.map);
        // One probe of the map (a key's clone shares its URL and headers).
        let vacant = match map.entry(key.clone()) {
            Entry::Occupied(mut flight) => {
                let flight = flight.get_mut();
                flight.followers = flight.followers.saturating_add(1);
                let sender = flight.sender.get_or_insert_with(|| watch::channel(None).0);
                return Joined::Follower(sender.subscribe());
            }
            Entry::Vacant(vacant) => vacant,
        };
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        vacant.insert(InFlight {
            id,
            followers: 0,
            sender: None,
        });
        Joined::Leader(Leader {
            flights: self,
            key: Some(key),
            id,
            sender: None,
        })
    }

    /// The flights in the map (for tests: none is left behind).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        crate::sync::lock(&self.map).len()
    }

    /// Takes the flight `id` of `key` out of the map.
    fn remove(&self, key: &FlightKey, id: u64) -> Option<InFlight> {
        let mut map = crate::sync::lock(&self.map);
        // One probe: another flight of the key (never seen: a leader removes only its
        // own, once) is put back.
        let (key, flight) = map.remove_entry(key)?;
        if flight.id == id {
            return Some(flight);
        }
        map.insert(key, flight);
        None
    }
}

impl Leader<'_> {
    /// Closes the flight to new followers; how many joined it.
    pub(crate) fn close(&mut self) -> u32 {
        let Some(flight) = self
            .key
            .take()
            .and_then(|key| self.flights.remove(key, self.id))
        else {
            return 0;
        };
        self.sender = flight.sender;
        flight.followers
    }

    /// Tells every follower how the flight landed (after [`close`](Self::close)).
    pub(crate) fn land(self, landing: Arc<Landing>) {
        if let Some(sender) = &self.sender {
            // No receiver left (every follower gave up) is not an error.
            let _ = sender.send(Some(landing));
        }
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        // Abandoned before it closed: no new follower may join, and the channel's sender,
        // taken out with the flight and dropped with this leader, ends the wait of those
        // that did.
        self.close();
    }
}

/// Waits for the leader's landing.
///
/// # Cancel safety
///
/// Dropping the wait drops only this follower's receiver: the flight and the other
/// callers go on.
pub(crate) async fn wait(mut landed: watch::Receiver<Published>) -> Waited {
    match landed.wait_for(Option::is_some).await {
        Ok(published) => match published.as_ref() {
            Some(landing) => Waited::Landed(landing.clone()),
            None => Waited::Abandoned,
        },
        Err(_) => Waited::Abandoned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(flights: &Flights, url: &str) -> FlightKey {
        let req = reqwest::Request::new(http::Method::GET, url.parse().unwrap());
        flights.key(&req, &Partition::Own(0)).unwrap()
    }

    #[tokio::test]
    async fn followers_join_the_leader_until_it_closes_and_all_see_its_landing() {
        let flights = Flights::default();
        let a = key(&flights, "http://a.test/");
        let Joined::Leader(mut leader) = flights.join(&a) else {
            panic!("the first caller leads");
        };
        let followers: Vec<_> = (0..3)
            .map(|_| match flights.join(&key(&flights, "http://a.test/")) {
                Joined::Follower(landed) => landed,
                Joined::Leader(_) => panic!("a second leader"),
            })
            .collect();
        // Another URL is another flight.
        assert!(matches!(
            flights.join(&key(&flights, "http://a.test/other")),
            Joined::Leader(_)
        ));
        assert_eq!(leader.close(), 3);
        assert_eq!(
            flights.len(),
            0,
            "closed, and the other flight's leader was dropped"
        );
        // After the close, a caller starts a new flight.
        assert!(matches!(
            flights.join(&key(&flights, "http://a.test/")),
            Joined::Leader(_)
        ));
        leader.land(Arc::new(Landing::NotShared));
        for landed in followers {
            assert!(
                matches!(wait(landed).await, Waited::Landed(l) if matches!(*l, Landing::NotShared))
            );
        }
    }

    #[tokio::test]
    async fn a_leader_dropped_before_it_lands_abandons_its_followers_and_its_key() {
        let flights = Flights::default();
        let a = key(&flights, "http://a.test/");
        let leader = flights.join(&a);
        let Joined::Follower(landed) = flights.join(&key(&flights, "http://a.test/")) else {
            panic!("the second caller follows");
        };
        drop(leader);
        assert_eq!(flights.len(), 0);
        assert!(matches!(wait(landed).await, Waited::Abandoned));
        assert!(matches!(
            flights.join(&key(&flights, "http://a.test/")),
            Joined::Leader(_)
        ));
    }
}
