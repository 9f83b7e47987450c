//! [`Network::apply`]: the settings onto a `reqwest::ClientBuilder`.

use super::Network;

impl Network {
    /// `builder` with these settings: the address race, the HTTP/2 keep-alive pings.
    pub(crate) fn apply(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        if !self.on {
            return builder;
        }
        match self.http2_keep_alive {
            Some((interval, timeout)) => builder
                .http2_keep_alive_interval(interval)
                .http2_keep_alive_timeout(timeout)
                .http2_keep_alive_while_idle(true),
            None => builder,
        }
    }
}
