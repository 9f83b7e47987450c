//! Network weather in a lab of its own: two network namespaces (a client's and a
//! server's) joined by a veth pair, with `nft` rules and `ip` commands for the faults of
//! the path (DESIGN.md, "Network weather").
//!
//! Addresses come from the benchmarking range 198.18.0.0/15 (RFC 2544) only: the client
//! is `198.18.<n>.1/24`, the server `198.18.<n>.2` and `198.18.<n>.3` (a host with two
//! addresses); a VPN-style change moves the client to `198.18.<n>.9`. Neither namespace
//! has a default route, so nothing a test sends can leave them.
//!
//! Code runs inside a namespace on an OS thread of its own that entered it (`setns`, then
//! checked against `/proc/thread-self/ns/net` before any socket exists), with its own
//! current-thread tokio runtime: [`Lab::client`] runs a test's body there, [`Lab::serve`]
//! starts a [`LabServer`] (the HTTP/1.1 fault server of `tests/support`, on both server
//! addresses, recording each connection's peer and local address).
//!
//! Needs root on Linux, `ip` (iproute2) and `nft` (nftables). [`Lab::new_or_skip`] prints
//! `skipped: <why>` and returns `None` when any is missing, except under `CI=true`,
//! where it panics: `.ci/run` installs both. [`Lab`]'s `Drop` deletes both namespaces
//! (which removes the veth pair and every rule with them), also when a test panics.

use std::ffi::OsStr;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Action, Counters, RecordedRequest, Script};

/// The port every lab server listens on (inside the server's namespace: no clash).
pub const PORT: u16 = 80;

/// The `nft` table every rule goes in (in the server's namespace).
const TABLE: &str = "rrw";

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Which namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client's (`rrw-c-<pid>-<n>`).
    Client,
    /// The server's (`rrw-s-<pid>-<n>`).
    Server,
}

/// An `nft` rule this lab added, to remove with [`Lab::remove_rule`].
#[derive(Debug)]
pub struct Rule {
    handles: Vec<(&'static str, u64)>,
}

/// Two namespaces and a veth pair; see the module docs. Dropping it removes both.
pub struct Lab {
    client_ns: String,
    server_ns: String,
    subnet: u8,
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Deleting a namespace destroys its end of the veth pair (and so the pair) and its
        // nft tables; a thread still inside one keeps it alive until it ends.
        for ns in [&self.client_ns, &self.server_ns] {
            let _ = Command::new(ip_binary())
                .args(["netns", "del", ns])
                .output();
        }
    }
}

fn ip_binary() -> &'static str {
    if std::path::Path::new("/usr/sbin/ip").exists() {
        "/usr/sbin/ip"
    } else {
        "ip"
    }
}

fn nft_binary() -> Option<&'static str> {
    ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
}

/// Runs a command; its stderr in the error.
fn run<I, S>(program: &str, args: I) -> Result<String, String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let out = Command::new(program)
        .args(&args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Lab {
    /// A new lab, or `None` after printing `skipped: <why>` (a panic under `CI=true`).
    pub fn new_or_skip() -> Option<Lab> {
        match Lab::new() {
            Ok(lab) => Some(lab),
            Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("network namespaces are required under CI=true: {why}")
            }
            Err(why) => {
                eprintln!("skipped: {why}");
                None
            }
        }
    }

    /// A new lab: both namespaces, the veth pair, the addresses, the nft table.
    pub fn new() -> Result<Lab, String> {
        if !cfg!(target_os = "linux") {
            return Err("network namespaces are Linux's".into());
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root (network namespaces need CAP_SYS_ADMIN)".into());
        }
        if nft_binary().is_none() {
            return Err("nft (nftables) is not installed".into());
        }
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let client_ns = format!("rrw-c-{pid}-{n}");
        let server_ns = format!("rrw-s-{pid}-{n}");
        run(ip_binary(), ["netns", "add", &client_ns])?;
        // From here on, Drop removes what exists (deleting a missing namespace fails
        // quietly).
        let lab = Lab {
            client_ns,
            server_ns,
            subnet: (n % 250) as u8 + 1,
        };
        run(ip_binary(), ["netns", "add", &lab.server_ns])?;
        lab.wire()?;
        Ok(lab)
    }

    fn wire(&self) -> Result<(), String> {
        let (c, s) = (self.client_ns.as_str(), self.server_ns.as_str());
        // Created straight inside the namespaces: the names never meet the host's.
        run(
            ip_binary(),
            [
                "link", "add", "veth-c", "netns", c, "type", "veth", "peer", "name", "veth-s",
                "netns", s,
            ],
        )?;
        let client = format!("{}/24", self.client_ip());
        self.ip(Side::Client, &["addr", "add", &client, "dev", "veth-c"])?;
        for server in [self.server_ip(), self.second_server_ip()] {
            let server = format!("{server}/24");
            self.ip(Side::Server, &["addr", "add", &server, "dev", "veth-s"])?;
        }
        for (side, dev) in [(Side::Client, "veth-c"), (Side::Server, "veth-s")] {
            self.ip(side, &["link", "set", "lo", "up"])?;
            self.ip(side, &["link", "set", dev, "up"])?;
        }
        self.nft(&["add", "table", "inet", TABLE])?;
        for hook in ["input", "output"] {
            let chain = format!("{{ type filter hook {hook} priority 0; policy accept; }}");
            self.nft(&["add", "chain", "inet", TABLE, hook, &chain])?;
        }
        Ok(())
    }

    /// The namespace's name.
    pub fn namespace(&self, side: Side) -> &str {
        match side {
            Side::Client => &self.client_ns,
            Side::Server => &self.server_ns,
        }
    }

    fn v4(&self, host: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(198, 18, self.subnet, host))
    }

    /// The client's address (`198.18.<n>.1`).
    pub fn client_ip(&self) -> IpAddr {
        self.v4(1)
    }

    /// The client's address after [`change_client_address`](Self::change_client_address).
    pub fn changed_client_ip(&self) -> IpAddr {
        self.v4(9)
    }

    /// The server's first address (`198.18.<n>.2`).
    pub fn server_ip(&self) -> IpAddr {
        self.v4(2)
    }

    /// The server's second address (`198.18.<n>.3`).
    pub fn second_server_ip(&self) -> IpAddr {
        self.v4(3)
    }

    /// `http://<server_ip>:80<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}:{PORT}{path}", self.server_ip())
    }

    /// `ip -n <namespace> <args>`.
    pub fn ip(&self, side: Side, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["-n", self.namespace(side)];
        all.extend_from_slice(args);
        run(ip_binary(), all)
    }

    /// `ip netns exec <server namespace> nft <args>`.
    fn nft(&self, args: &[&str]) -> Result<String, String> {
        let nft = nft_binary().ok_or("nft is not installed")?;
        let mut all = vec!["netns", "exec", self.namespace(Side::Server), nft];
        all.extend_from_slice(args);
        run(ip_binary(), all)
    }

    /// Adds a rule to a chain of the lab's table and returns its handle.
    fn add_rule(&self, chain: &'static str, rule: &str) -> u64 {
        let mut args = vec!["-a", "-e", "add", "rule", "inet", TABLE, chain];
        args.extend(rule.split(' '));
        let out = self.nft(&args).expect("nft add rule");
        out.rsplit("# handle ")
            .next()
            .and_then(|h| h.split_whitespace().next())
            .and_then(|h| h.parse().ok())
            .unwrap_or_else(|| panic!("no handle in nft's echo: {out:?}"))
    }

    /// Drops every SYN that reaches `ip:port` in the server's namespace: a host (or one
    /// address of it) whose connects time out.
    pub fn drop_syns_to(&self, ip: IpAddr, port: u16) -> Rule {
        let rule = format!("ip daddr {ip} tcp dport {port} tcp flags & (syn|ack) == syn drop");
        Rule {
            handles: vec![("input", self.add_rule("input", &rule))],
        }
    }

    /// Drops every packet, both ways, of the established flow whose client end is
    /// `client` (a peer a [`LabServer`] recorded): that connection's path is dead, new
    /// connections work.
    pub fn drop_flow(&self, client: SocketAddr) -> Rule {
        let (ip, port) = (client.ip(), client.port());
        let inbound = format!("ip saddr {ip} tcp sport {port} drop");
        let outbound = format!("ip daddr {ip} tcp dport {port} drop");
        Rule {
            handles: vec![
                ("input", self.add_rule("input", &inbound)),
                ("output", self.add_rule("output", &outbound)),
            ],
        }
    }

    /// Removes a rule added by this lab.
    pub fn remove_rule(&self, rule: Rule) {
        for (chain, handle) in rule.handles {
            let handle = handle.to_string();
            self.nft(&["delete", "rule", "inet", TABLE, chain, "handle", &handle])
                .expect("nft delete rule");
        }
    }

    /// A VPN-style change of the client's address: removes `198.18.<n>.1` from its
    /// interface and adds `198.18.<n>.9/24`. Connections from the old address are dead.
    pub fn change_client_address(&self) {
        let new = format!("{}/24", self.changed_client_ip());
        let old = format!("{}/24", self.client_ip());
        // The old one first, as a VPN that reconnects does: added first, the new one would
        // be a secondary address of the subnet, deleted with its primary.
        self.ip(Side::Client, &["addr", "del", &old, "dev", "veth-c"])
            .expect("remove the old client address");
        self.ip(Side::Client, &["addr", "add", &new, "dev", "veth-c"])
            .expect("add the new client address");
    }

    /// The client's link down (`ip link set veth-c down`).
    pub fn link_down(&self) {
        self.ip(Side::Client, &["link", "set", "veth-c", "down"])
            .expect("link down");
    }

    /// The client's link up again.
    pub fn link_up(&self) {
        self.ip(Side::Client, &["link", "set", "veth-c", "up"])
            .expect("link up");
    }

    /// Runs `body` to its end on a new OS thread inside the client's namespace, on a
    /// current-thread runtime of its own, and returns its output (a panic in it is
    /// resumed here). Every socket the body creates lives in the client's namespace.
    pub fn client<F, Fut, T>(&self, body: F) -> T
    where
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = T>,
        T: Send,
    {
        let ns = self.client_ns.clone();
        std::thread::scope(|scope| {
            let thread = scope.spawn(move || {
                enter(&ns);
                runtime().block_on(body())
            });
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Starts a [`LabServer`] in the server's namespace on both server addresses, port
    /// [`PORT`], answering each request with `script` (as [`FaultServer`](super::FaultServer)'s).
    pub fn serve<F>(&self, script: F) -> LabServer
    where
        F: Fn(usize, &RecordedRequest) -> Action + Send + Sync + 'static,
    {
        let ns = self.server_ns.clone();
        let addrs = [self.server_ip(), self.second_server_ip()];
        let state = Arc::new(ServerState::default());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let shared = state.clone();
        let script: Arc<Script> = Arc::new(script);
        let thread = std::thread::spawn(move || {
            enter(&ns);
            runtime().block_on(async move {
                let mut listeners = Vec::new();
                for ip in addrs {
                    let bound = tokio::net::TcpListener::bind(SocketAddr::new(ip, PORT)).await;
                    match bound {
                        Ok(l) => listeners.push(l),
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("bind {ip}:{PORT}: {e}")));
                            return;
                        }
                    }
                }
                let _ = ready_tx.send(Ok(()));
                let mut accepts = tokio::task::JoinSet::new();
                for listener in listeners {
                    accepts.spawn(accept_loop(listener, shared.clone(), script.clone()));
                }
                // Dropping the runtime after this ends every connection's task.
                let _ = stop_rx.await;
            });
        });
        ready_rx
            .recv()
            .expect("the server thread started")
            .expect("the lab server listens");
        LabServer {
            state,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }
}

/// A current-thread runtime with time and I/O, on real time (kernel timers do not
/// follow tokio's clock).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
}

/// Moves this thread into the namespace `ns`, and checks it is there before anything
/// else runs (a socket made before would live in the host's namespace).
fn enter(ns: &str) {
    let path = format!("/var/run/netns/{ns}");
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    // SAFETY: a valid open file descriptor of a namespace file, and a namespace type.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(
        rc,
        0,
        "setns into {ns}: {}",
        std::io::Error::last_os_error()
    );
    let want = std::fs::metadata(&path).expect("stat the namespace").ino();
    let now = std::fs::metadata("/proc/thread-self/ns/net")
        .expect("stat /proc/thread-self/ns/net")
        .ino();
    assert_eq!(now, want, "this thread is not in the namespace {ns}");
}

/// One accepted connection: who connected, to which of the server's addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// The client's end (its address and source port).
    pub peer: SocketAddr,
    /// The server's end (which server address the client connected to).
    pub local: SocketAddr,
}

#[derive(Default)]
struct ServerState {
    counters: Counters,
    /// By connection index (0-based, over both addresses).
    accepted: Mutex<Vec<Accepted>>,
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    state: Arc<ServerState>,
    script: Arc<Script>,
) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::task::yield_now().await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let local = stream.local_addr().expect("local address");
        let index = {
            // The index and the record under one lock: index i is accepted[i].
            let mut accepted = state.accepted.lock().unwrap();
            let index = state.counters.connections.fetch_add(1, Ordering::SeqCst);
            accepted.push(Accepted { peer, local });
            index
        };
        let (state, script) = (state.clone(), script.clone());
        conns.spawn(async move {
            super::serve_http1(stream, index, &state.counters, &*script).await;
        });
        while conns.try_join_next().is_some() {}
    }
}

/// An HTTP/1.1 server in a lab's server namespace; see [`Lab::serve`]. Dropping it stops
/// it (every connection closed).
pub struct LabServer {
    state: Arc<ServerState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for LabServer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl LabServer {
    /// Every fully received request, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.counters.requests.lock().unwrap().clone()
    }

    /// How many requests with `method` and `path` the server received.
    pub fn saw(&self, method: &str, path: &str) -> usize {
        self.connections_of(method, path).len()
    }

    /// The connection index of each request with `method` and `path`, in order.
    pub fn connections_of(&self, method: &str, path: &str) -> Vec<usize> {
        self.requests()
            .iter()
            .filter(|r| r.method == method && r.path == path)
            .map(|r| r.connection)
            .collect()
    }

    /// How many connections were accepted.
    pub fn connections(&self) -> usize {
        self.state.counters.connections.load(Ordering::SeqCst)
    }

    /// Every accepted connection, by index.
    pub fn accepted(&self) -> Vec<Accepted> {
        self.state.accepted.lock().unwrap().clone()
    }

    /// The connection with this index.
    pub fn connection(&self, index: usize) -> Accepted {
        self.accepted()[index]
    }

    /// Waits (real time, polling) until the server received `n` requests with `method`
    /// and `path`; panics after `within`.
    pub async fn wait_for(&self, method: &str, path: &str, n: usize, within: Duration) {
        let end = tokio::time::Instant::now() + within;
        while self.saw(method, path) < n {
            assert!(
                tokio::time::Instant::now() < end,
                "the server saw {} {method} {path}, not {n}, within {within:?}",
                self.saw(method, path)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
