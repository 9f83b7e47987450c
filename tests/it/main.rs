//! The integration tests: one test binary (`cargo test --test it`; one file's tests:
//! `cargo test --test it retry::`). Each file is a module; the shared fault servers are
//! `tests/support` (also used by the benches through `#[path]`). A new test file is
//! `tests/it/NAME.rs` with a `mod NAME;` line below (kept sorted).
//!
//! Five test binaries stay on their own, because they read or set process-wide state:
//! `alloc_budget` (a counting global allocator), `misconfig_composed` (asserts a
//! misconfiguration was never reported in the process), `metrics_origins` (sets the
//! process-wide bound of origin labels), `soak` (asserts the process's resident memory stays
//! flat) and `stress` (thousands of sockets; its long run is `--test stress`).

#[path = "../support/mod.rs"]
mod support;

mod astral;
mod astral_lazy;
mod astral_surface;
mod astral_uv;
mod attempt_timeout;
mod auth;
mod body;
mod breaker;
mod build_from;
mod cancellation;
mod chaos;
mod coalesce;
mod dropin;
mod evidence;
mod hedging;
mod hostile;
mod keepalive;
mod like_reqwest_retry;
mod limit;
mod metrics;
mod model;
mod network;
mod network_race;
mod nginx;
mod ownership;
mod parts_together;
mod proxy;
mod rate_limit;
mod redirect;
mod request_loop;
mod retry;
mod retry_after;
mod retry_tracing;
mod routine_events;
mod servers;
mod stack;
mod stack_tracing;
mod steps;
mod strategy;
mod streams;
mod streams_nginx;
mod tls_alerts;
mod upload;
mod visible_retries;
mod weather;
