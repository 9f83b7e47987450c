//! [`Network::apply`]: the settings onto a `reqwest::ClientBuilder`.

use std::sync::Arc;

use super::Network;
use super::answer::Answering;
use super::race::{RaceConfig, RaceLayer};
use super::resolve::Addresses;

impl Network {
    /// `builder` with these settings: the address race (its resolver, its connector
    /// layer and its own address memory, one per client), the HTTP/2 keep-alive pings.
    pub(crate) fn apply(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        if !self.on {
            return builder;
        }
        let addresses = Arc::new(Addresses::new(
            self.resolver.clone(),
            self.failed_address_memory,
        ));
        let race = RaceLayer(Arc::new(RaceConfig {
            connect_timeout: self.connect_timeout,
            attempt_delay: self.attempt_delay,
            addresses: addresses.clone(),
        }));
        let builder = builder
            .dns_resolver(Arc::new(Answering(addresses)))
            .connector_layer(race);
        self.apply_http2(builder)
    }

    #[cfg(feature = "http2")]
    fn apply_http2(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        match self.http2_keep_alive {
            Some((interval, timeout)) => builder
                .http2_keep_alive_interval(interval)
                .http2_keep_alive_timeout(timeout)
                .http2_keep_alive_while_idle(true),
            None => builder,
        }
    }

    /// Without feature `http2` reqwest has no HTTP/2 and no ping settings.
    #[cfg(not(feature = "http2"))]
    fn apply_http2(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        builder
    }
}
