//! Real servers from Debian's packages (nginx-light, haproxy, apache2, caddy) behind one
//! small interface, for tests/it/servers.rs and benches/servers.rs.
//!
//! # A server module
//!
//! Each server is a module here (`nginx.rs`, `haproxy.rs`, `apache.rs`, `caddy.rs`) with
//!
//! ```ignore
//! /// The protocols it speaks on its cleartext port.
//! pub const PROTOCOLS: &[Protocol] = &[Protocol::Http1, Protocol::H2c];
//! /// Whether it can apply `scenario` (a protocol in PROTOCOLS, a limit it has a knob
//! /// for); the tests skip (printed) a scenario it cannot.
//! pub fn supports(scenario: &Scenario) -> bool;
//! /// A running server for `scenario`, or `None` (printed) when its binary is missing
//! /// and `CI` is not `true` (see [`binary`]).
//! pub fn start(scenario: &Scenario) -> Option<Box<dyn RealServer>>;
//! ```
//!
//! and its server:
//! - has its own config in its own [`TempDir`] (removed on drop), binds `127.0.0.1` only
//!   on a [`free_port`], and runs as a child of the test in its own process group
//!   ([`ProcessGroup`]: every process of that group, master and workers, old and new
//!   generations, is killed on drop);
//! - answers `200` to GET and POST on any path, and `200` with the body `N` (the config
//!   generation, `0` at start, `+1` per [`RealServer::reload`]) to `GET /__generation`
//!   ([`wait_generation`] polls it to know a reload has been applied);
//! - over [`Protocol::Http1`] speaks HTTP/1.1 keep-alive; over [`Protocol::H2c`], HTTP/2
//!   with prior knowledge (the client uses `http2_prior_knowledge()`);
//! - applies the [`Scenario`]: `max_requests_per_connection` (nginx `keepalive_requests`,
//!   apache `MaxKeepAliveRequests`, …), `keepalive_timeout` (idle close); `None` keeps a
//!   large limit (at least 10 000 requests, 60 s) so only the tested event closes
//!   connections;
//! - writes one access log line per request it executed: `ID METHOD STATUS` (the
//!   `x-request-id` header, `-` or empty when there was none; more fields after these
//!   three are ignored), which [`parse_log`] reads into [`Execution`]s (lines without an id,
//!   such as the `/__generation` polls, are left out).

#![allow(dead_code)]

pub mod apache;
pub mod burst;
pub mod caddy;
pub mod haproxy;
pub mod nginx;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The protocol of the server's cleartext port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 keep-alive.
    Http1,
    /// HTTP/2 over cleartext TCP, prior knowledge.
    H2c,
}

/// What the server is configured with.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    pub protocol: Protocol,
    /// Requests per connection before the server closes it (HTTP/1.1: `Connection: close`
    /// on the last answer; h2c: `GOAWAY`). `None`: unlimited (≥ 10 000).
    pub max_requests_per_connection: Option<u32>,
    /// Idle keep-alive timeout before the server closes the connection. `None`: ≥ 60 s.
    pub keepalive_timeout: Option<Duration>,
}

impl Scenario {
    /// No limit: only reloads close connections.
    pub fn plain(protocol: Protocol) -> Scenario {
        Scenario {
            protocol,
            max_requests_per_connection: None,
            keepalive_timeout: None,
        }
    }
}

/// One request the server executed, from its own access log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    /// The `x-request-id` header.
    pub request_id: String,
    pub method: String,
    pub status: u16,
}

/// A running server, stopped (its whole process group killed, its directory removed) on
/// drop. Both `reload` and `executions` block (sleeps, bounded): call them from
/// `tokio::task::spawn_blocking` in async code.
pub trait RealServer: Send + Sync {
    /// `"nginx"`, `"haproxy"`, `"apache2"`, `"caddy"`.
    fn name(&self) -> &'static str;
    /// `http://127.0.0.1:PORT`.
    fn base_url(&self) -> String;
    /// A graceful reload with the same scenario (nginx `HUP` to the master; haproxy a new
    /// process with `-sf`; apache `USR1`; caddy the admin API's `/load`): old connections
    /// finish their requests, then close. Returns once the new config serves (its
    /// generation answers `/__generation`, bounded: panics after 10 s).
    fn reload(&self);
    /// The executions in the access log, once it has stopped growing (bounded).
    fn executions(&self) -> Vec<Execution>;
}

/// `true` under `CI=true`, where a missing server fails its tests instead of skipping.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The binary `name` on `PATH`, else in `/usr/sbin` (not on a non-root `PATH`), else
/// `None` after printing that the test is skipped.
///
/// # Panics
///
/// Under `CI=true` when it is missing: `.ci/run` installs `package`.
pub fn binary(name: &str, package: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            !in_ci(),
            "CI=true and no {name} installed: .ci/run installs {package}"
        );
        eprintln!("skipped: no {name} binary (apt-get install {package} to run this test)");
    }
    found
}

/// A loopback port free a moment ago (the server binds it next; a clash fails its start).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
    l.local_addr().expect("probe addr").port()
}

/// A directory of its own under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// `…/reqwest-resilience-<server>-<pid>-<unique>`.
    pub fn new(server: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "reqwest-resilience-{server}-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("server temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Processes in one process group of their own (the first one's pid is the group id):
/// a master and its workers, or a daemon and the new process of a `-sf` reload. Drop
/// sends `SIGTERM` to the group, then `SIGKILL` after 2 s (bounded), and reaps the
/// children it spawned.
pub struct ProcessGroup {
    pgid: Mutex<Option<u32>>,
    children: Mutex<Vec<Child>>,
}

impl Default for ProcessGroup {
    fn default() -> Self {
        ProcessGroup::new()
    }
}

impl ProcessGroup {
    pub fn new() -> ProcessGroup {
        ProcessGroup {
            pgid: Mutex::new(None),
            children: Mutex::new(Vec::new()),
        }
    }

    /// Spawns `cmd` into the group (the first spawn creates it); returns its pid.
    pub fn spawn(&self, cmd: &mut Command) -> u32 {
        use std::os::unix::process::CommandExt;
        let mut pgid = self.pgid.lock().unwrap();
        cmd.process_group(pgid.map_or(0, |g| g as i32));
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let pid = child.id();
        pgid.get_or_insert(pid);
        self.children.lock().unwrap().push(child);
        pid
    }

    /// The group id (the first process's pid).
    pub fn pgid(&self) -> Option<u32> {
        *self.pgid.lock().unwrap()
    }

    /// `Some(status)` of the first child when it has exited (reaped), else `None`.
    pub fn first_exited(&self) -> Option<std::process::ExitStatus> {
        let mut children = self.children.lock().unwrap();
        children
            .first_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Reaps the children that have exited (e.g. an old process after `-sf`).
    pub fn reap(&self) {
        for child in self.children.lock().unwrap().iter_mut() {
            let _ = child.try_wait();
        }
    }
}

/// Sends `signal` (`"TERM"`, `"HUP"`, `"USR1"`, …) to one process.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// Whether a signal 0 reaches any process of group `pgid`.
fn group_alive(pgid: u32) -> bool {
    Command::new("kill")
        .args(["-0", "--", &format!("-{pgid}")])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        let Some(pgid) = self.pgid() else { return };
        let group = format!("-{pgid}");
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(2);
        while group_alive(pgid) && Instant::now() < deadline {
            self.reap();
            std::thread::sleep(Duration::from_millis(20));
        }
        if group_alive(pgid) {
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        }
        for child in self.children.lock().unwrap().iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Polls until `addr` accepts a connection (bounded: 10 s); `exited` reports a server
/// that died first (its log is in the panic message).
///
/// # Panics
///
/// When the server exits first or does not listen within 10 s.
pub fn wait_listening(addr: SocketAddr, group: &ProcessGroup, error_log: &Path) {
    for _ in 0..1000 {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return;
        }
        if let Some(status) = group.first_exited() {
            let log = std::fs::read_to_string(error_log).unwrap_or_default();
            panic!("server exited ({status}) before listening on {addr}: {log}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let log = std::fs::read_to_string(error_log).unwrap_or_default();
    panic!("server did not listen on {addr} within 10 s: {log}");
}

/// Polls `GET {base_url}/__generation` on fresh connections until it answers
/// `generation` (bounded: 10 s). Runs its own runtime on a thread of its own, so it can
/// be called from any blocking context.
///
/// # Panics
///
/// When the server does not answer `generation` within 10 s.
pub fn wait_generation(base_url: &str, protocol: Protocol, generation: u32) {
    let url = format!("{base_url}/__generation");
    let want = generation.to_string();
    let last = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime for wait_generation");
            rt.block_on(poll_generation(&url, protocol, &want))
        })
        .join()
        .expect("wait_generation thread")
    });
    if let Err(last) = last {
        panic!("{url} did not answer {want} within 10 s (last: {last})");
    }
}

async fn poll_generation(url: &str, protocol: Protocol, want: &str) -> Result<(), String> {
    let builder = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(2));
    let client = match protocol {
        Protocol::Http1 => builder.http1_only(),
        Protocol::H2c => builder.http2_prior_knowledge(),
    }
    .build()
    .expect("generation client");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut last = String::from("no answer");
    while tokio::time::Instant::now() < deadline {
        match client.get(url).send().await {
            Ok(res) => {
                let status = res.status();
                let body = res.text().await.unwrap_or_default();
                if status == 200 && body.trim() == want {
                    return Ok(());
                }
                last = format!("{status} {:?}", body.trim());
            }
            Err(e) => last = format!("{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(last)
}

/// `ID METHOD STATUS …` lines into executions; lines without an id (`-`, empty, `""`)
/// or with fewer fields are left out.
pub fn parse_log(text: &str) -> Vec<Execution> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let id = fields.next()?.trim_matches('"');
            let method = fields.next()?;
            let status = fields.next()?.parse().ok()?;
            (!id.is_empty() && id != "-").then(|| Execution {
                request_id: id.to_owned(),
                method: method.to_owned(),
                status,
            })
        })
        .collect()
}

/// The executions in the log file at `path` once it has settled ([`settled_text`]).
pub fn settled_log(path: &Path) -> Vec<Execution> {
    parse_log(&settled_text(path))
}

/// The text of the log file at `path` once it has not grown for 300 ms (bounded: 10 s,
/// then as it is). Blocking.
pub fn settled_text(path: &Path) -> String {
    let read = || std::fs::read_to_string(path).unwrap_or_default();
    let mut text = read();
    let mut unchanged = 0;
    for _ in 0..1000 {
        std::thread::sleep(Duration::from_millis(10));
        let now = read();
        if now.len() == text.len() {
            unchanged += 1;
            if unchanged == 30 {
                break;
            }
        } else {
            unchanged = 0;
        }
        text = now;
    }
    text
}
