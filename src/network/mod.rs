//! Network weather: the faults of the path between the client and the server, which the
//! server never sees — a Wi-Fi that drops, a VPN that reconnects, a laptop that sleeps, a
//! NAT that forgets a flow, a host with one dead address.
//!
//! A client built by [`Resilience::build_from`](crate::Resilience::build_from) (or
//! [`redirect::recorded_client`](crate::redirect::recorded_client)) bounds every wait by
//! default, without cutting slow answers:
//!
//! | setting | default | anchor |
//! |---|---|---|
//! | [`connect_timeout`](Network::connect_timeout) | 10 s per address | OkHttp's `connectTimeout` |
//! | [`attempt_delay`](Network::attempt_delay) | a new address every 250 ms, families interleaved | RFC 8305 (Happy Eyeballs v2) §5 |
//! | [`failed_address_memory`](Network::failed_address_memory) | an address that failed is tried last for 10 min | OkHttp's route database |
//! | [`no_progress`](Network::no_progress) | 300 s without a byte from the server ends the attempt | Firefox's `network.http.response.timeout` |
//! | [`http2_keep_alive`](Network::http2_keep_alive) | a PING every 30 s, 20 s for its answer | hyper's ping timeout; Chromium's HTTP/2 health checks |
//! | [`watch_changes`](Network::watch_changes) | on: a change of the machine's addresses, or a wake from a suspend, retires pooled connections | Chromium's `OnIPAddressChanged` |
//! | TCP keep-alive 15 s × 3, `TCP_USER_TIMEOUT` 30 s | reqwest 0.13's own, kept | reqwest |
//!
//! Each default is overridable on [`Network`], handed to
//! [`Resilience::network`](crate::Resilience::network); [`Network::off`] leaves the
//! client as reqwest builds it.
//!
//! # What each setting does
//!
//! - **Addresses race** (RFC 8305): the host's addresses are tried one after another,
//!   IPv6 and IPv4 interleaved, a new one every `attempt_delay` while the earlier ones
//!   are still trying (at once when one fails); the first to connect carries the request
//!   and the others are dropped. An address that failed is tried last for that host until
//!   it connects again (at most `failed_address_memory`), so the next connections to a
//!   host with one dead address do not wait on it. Every address tried, with its outcome,
//!   is in [`RequestEvidence::connect`](crate::RequestEvidence::connect); when none
//!   connected, the error chain holds a [`ConnectFailed`] naming each.
//!
//! # The race
//!
//! reqwest hands a connector layer one request per connection, which it cannot copy, so
//! only one connection through reqwest's connector (its TCP options, its TLS) can be made
//! for it. The race therefore sends reqwest's connection to the first address (the
//! client's resolver answers that one alone) and tries each later address, one every
//! `attempt_delay` (at once when the ones before failed), with a plain TCP connect of its
//! own, a probe, each bounded by `connect_timeout`:
//!
//! - the first address connects first (a healthy host, the common case: probes start only
//!   after the attempt delay): its connection carries the request, the probes are dropped;
//! - a probe connects first: for an `https` connection, reqwest's may be in its TLS
//!   handshake, so it is waited for until three of the probe's round trips from its start
//!   (a first address as near as the probe's would be done by then); then the connection
//!   gives way, reqwest sends the request again at
//!   once on a new connection (a replay below every middleware, for any method: nothing
//!   was sent), whose first address is the one that answered. The request's one attempt
//!   records both addresses: the first `Abandoned`, the other `Connected`
//!   ([`AddressOutcome`](crate::evidence::AddressOutcome)). The probe's connection is
//!   closed unused: the server sees one connection more, once per memory;
//! - nothing connects: [`ConnectFailed`], `ConnectTimeout` when every address timed out.
//!
//! The race runs only when a connection is opened: a request on a pooled connection does
//! not reach it.
//! - **A dead host fails as fast as bare reqwest.** When every address timed out, the
//!   attempt fails [`ConnectTimeout`](crate::FailureKind::ConnectTimeout) and is not
//!   retried: a retry would wait as long again, so the request's connect budget is one
//!   connect timeout. A refused connection is still retried (it costs nothing). The
//!   breaker counts each as a failure, and once it opens the next requests fail at once.
//!   A dead address of a live host costs the request nothing but the attempt delay, and is
//!   never the origin's failure.
//! - **No progress**: an attempt that receives no byte for `no_progress` — no response
//!   head, or no body chunk once the head came — is cut with
//!   [`NoProgress`](crate::FailureKind::NoProgress), decided by the decision table (a
//!   `GET` retried, a `POST` not). Streams that send bytes (an LLM's tokens, server-sent
//!   events' comments) are never cut; the wait for the head counts from the end of the
//!   request's body, so a long upload is not cut either.
//! - **A changed network is noticed**: when the machine's addresses change (a VPN up or
//!   down, a new Wi-Fi), a link carrying an address goes down or up (seen as its IPv6
//!   link-local address going or coming), or the process wakes from a suspend (the
//!   wall clock jumped ahead of the monotonic one), connections opened before it are not
//!   reused: new requests open fresh ones, and an idempotent request waiting on an old
//!   one is cut ([`NetworkChanged`](crate::FailureKind::NetworkChanged)) and sent again
//!   at once. A `POST` in flight is left to finish: it is never sent twice.
//!
//! # Limits
//!
//! - **Not raced**: a connection through a proxy (the proxy's addresses are answered in
//!   the race's order, tried by reqwest), a name given to `ClientBuilder::resolve` or
//!   `resolve_to_addrs` (reqwest answers it without the resolver). Those are bounded by
//!   `connect_timeout` as a whole and carry no connect record.
//! - **A probe is a plain TCP connect**: it does not use reqwest's `local_address`,
//!   `interface` or TCP options (the connection that carries the request does).
//! - **A request whose body cannot be copied** (a stream) cannot be replayed: when a probe
//!   wins, it fails unsent (`Connect`), with the address that answered recorded
//!   `Answered`; the next connection tries that address first.
//! - **reqwest's own `connect_timeout`**, set on the builder, bounds the whole race.
//! - **A transport step declared [`ClientRedirects::Off`](crate::redirect::ClientRedirects::Off)**
//!   records no hop and no connect record.
//!
//! - **A suspend is noticed at the next attempt's start** (and by the address change a
//!   wake usually brings): an attempt in flight across a sleep is cut then.
//! - **Retiring pooled connections needs a client that can be built again**:
//!   `build_from(reqwest::Client::builder)` or any closure returning a builder. From a
//!   single `ClientBuilder` (and with a proxy pool, whose clients are the pool's) the
//!   client keeps its pool after a change: waiting attempts are still cut and sent again,
//!   but a later request may take a connection pooled before the change, bounded then by
//!   the no-progress bound and the system's timeouts.
//! - **A small body is not watched**: one whose `Content-Length` is at most 16 KiB comes
//!   in the same reads as its head, and watching every body would cost each response a
//!   rebuild; a server that stalls inside such a body is bounded by the system alone.
//! - **What the system buffers is not seen**: the no-progress bound counts an upload's
//!   progress as the connection takes each piece of its body, so the few MiB the system
//!   holds in its socket buffers drain unseen. An upload slower than that per bound
//!   (about 10 KiB/s with 300 s) can be cut: raise `no_progress` for such links.
//! - **Tests on tokio's paused clock**: every bound here is a tokio timer, and a paused
//!   clock jumps to the next timer whenever the runtime waits on a server outside it (a
//!   thread, a process): there, turn the bound off (`Network::new().no_progress(None)`)
//!   or use [`Network::off`].
//!
//! A setting of reqwest's own that this module sets (`dns_resolver`, the HTTP/2 keep-alive
//! pings) replaces the same setting on the builder handed to `build_from`: set it here.

mod answer;
mod changes;
mod client;
mod config;
mod failed;
pub(crate) mod progress;
mod race;
mod resolve;
mod suspend;
mod watch;
pub(crate) mod weather;

pub use config::Network;
pub(crate) use failed::AddressRaced;
pub use failed::ConnectFailed;
pub use progress::NoProgress;
