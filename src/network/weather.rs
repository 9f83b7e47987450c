//! [`Weather`]: what one stack knows of the network's state — how often it changed
//! (`Changes`: the address watch and the suspend check), and, for a client rebuilt after
//! a change, the fresh client ([`FreshClients`]).

use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::SystemTime;

use super::Network;
use super::changes::Changes;
use super::suspend::SuspendDetector;

/// The wall clock the suspend check reads.
pub(crate) type WallClock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// A way to build the client again, with a fresh connection pool: `build_from`'s closure
/// with the stack's settings applied.
pub(crate) type MakeClient = Box<dyn FnMut() -> Option<reqwest::Client> + Send>;

/// The client of the newest generation, built again after a change (its pool empty), for
/// a `build_from` that was handed a closure.
pub(crate) struct FreshClients {
    make: Mutex<MakeClient>,
    /// The generation the client was built for, and the client.
    current: RwLock<Option<(u64, reqwest::Client)>>,
}

impl FreshClients {
    pub(crate) fn new(make: MakeClient) -> Self {
        FreshClients {
            make: Mutex::new(make),
            current: RwLock::new(None),
        }
    }

    /// A client none of whose connections predate change number `generation`: built
    /// again when the newest is older. A build that fails (it did not at first) keeps the
    /// older client.
    fn for_generation(&self, generation: u64) -> Option<reqwest::Client> {
        let read = self.current.read().unwrap_or_else(|e| e.into_inner());
        if let Some((built, client)) = read.as_ref()
            && *built >= generation
        {
            return Some(client.clone());
        }
        drop(read);
        let mut make = self.make.lock().unwrap_or_else(|e| e.into_inner());
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        match current.as_ref() {
            // Another attempt built it meanwhile.
            Some((built, client)) if *built >= generation => Some(client.clone()),
            _ => match make() {
                Some(client) => {
                    *current = Some((generation, client.clone()));
                    Some(client)
                }
                None => current.as_ref().map(|(_, client)| client.clone()),
            },
        }
    }
}

/// One stack's view of the network.
pub(crate) struct Weather {
    pub(crate) network: Network,
    changes: Arc<Changes>,
    suspend: SuspendDetector,
    wall: WallClock,
    /// Whether the address watch was started (once, by the first attempt).
    watching: OnceLock<bool>,
    fresh: Option<FreshClients>,
}

impl std::fmt::Debug for Weather {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weather")
            .field("changes", &self.changes.now())
            .field("watching", &self.watching.get())
            .field("fresh", &self.fresh.is_some())
            .finish_non_exhaustive()
    }
}

impl Weather {
    pub(crate) fn new(network: Network, fresh: Option<FreshClients>) -> Self {
        let wall = network
            .wall_clock
            .clone()
            .unwrap_or_else(|| Arc::new(SystemTime::now));
        Weather {
            suspend: SuspendDetector::new(wall(), std::time::Instant::now()),
            wall,
            network,
            changes: Arc::new(Changes::new()),
            watching: OnceLock::new(),
            fresh,
        }
    }

    /// At an attempt's start: the changes so far, after noticing a suspend since the last
    /// look (and starting the address watch, the first time).
    pub(crate) fn look(&self) -> u64 {
        if self.network.watch_changes {
            self.watching
                .get_or_init(|| super::watch::start(&self.changes));
            if self.suspend.look((self.wall)(), std::time::Instant::now()) {
                self.changes.bump();
            }
        }
        self.changes.now()
    }

    /// A receiver of later changes, for an attempt that may be cut by one.
    pub(crate) fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The client an attempt at change number `generation` sends on instead of the one
    /// under the stack: `None` before any change, or when no fresh client can be built
    /// (`build_from` was handed a single builder).
    pub(crate) fn client(&self, generation: u64) -> Option<reqwest::Client> {
        match (&self.fresh, generation) {
            (_, 0) | (None, _) => None,
            (Some(fresh), generation) => fresh.for_generation(generation),
        }
    }
}
