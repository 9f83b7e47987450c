//! haproxy 2.6 answering by itself (`http-request return status 200`), logging to its
//! stdout (a file per generation here, `log stdout format raw`). A graceful reload is the classic one: a
//! new process with the new config and `-sf OLD_PID`, which binds the port (`SO_REUSEPORT`)
//! and tells the old one to stop listening and finish its connections (idle keep-alive
//! connections are closed, an HTTP/2 connection gets `GOAWAY`). Both processes are in the
//! test's process group.
//!
//! The scenario's `max_requests_per_connection` is applied over HTTP/1.1 (a per-connection
//! counter, `Connection: close` on the last answer); haproxy 2.6 has no per-connection
//! stream limit for HTTP/2 (`tune.h2.fe.max-total-streams` came in 2.8), so an h2c
//! rotation scenario is not offered ([`supports`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use super::{
    Execution, ProcessGroup, Protocol, RealServer, Scenario, TempDir, binary, free_port,
    settled_log, wait_generation, wait_listening,
};

pub const PROTOCOLS: &[Protocol] = &[Protocol::Http1, Protocol::H2c];

/// Whether haproxy 2.6 can apply `scenario` (no per-connection request limit over h2c).
pub fn supports(scenario: &Scenario) -> bool {
    !(scenario.protocol == Protocol::H2c && scenario.max_requests_per_connection.is_some())
}

struct Haproxy {
    group: ProcessGroup,
    dir: TempDir,
    bin: PathBuf,
    scenario: Scenario,
    port: u16,
    /// The generation serving and the pid of its process.
    current: Mutex<(u32, u32)>,
}

pub fn start(scenario: &Scenario) -> Option<Box<dyn RealServer>> {
    let bin = binary("haproxy", "haproxy")?;
    let dir = TempDir::new("haproxy");
    let port = free_port();
    let group = ProcessGroup::new();
    let pid = spawn(&group, &bin, dir.path(), port, scenario, 0, None);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    wait_listening(addr, &group, &dir.path().join("stderr.log"));
    let haproxy = Haproxy {
        group,
        dir,
        bin,
        scenario: *scenario,
        port,
        current: Mutex::new((0, pid)),
    };
    wait_generation(&haproxy.base_url(), scenario.protocol, 0);
    Some(Box::new(haproxy))
}

/// Writes generation `generation`'s config and starts its process (`-sf old` on reload).
fn spawn(
    group: &ProcessGroup,
    bin: &Path,
    dir: &Path,
    port: u16,
    scenario: &Scenario,
    generation: u32,
    old: Option<u32>,
) -> u32 {
    let conf = dir.join(format!("haproxy-{generation}.cfg"));
    std::fs::write(&conf, config(port, scenario, generation)).expect("write haproxy.cfg");
    let open = |name: &str| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(name))
            .expect("haproxy log file")
    };
    let mut cmd = Command::new(bin);
    cmd.arg("-db").arg("-f").arg(&conf);
    if let Some(old) = old {
        cmd.arg("-sf").arg(old.to_string());
    }
    cmd.stdin(Stdio::null())
        // A file per generation: a new process's start empties the stdout file it
        // shares with the old one (seen with `>>` too), losing the old one's lines.
        .stdout(open(&format!("access-{generation}.log")))
        .stderr(open("stderr.log"));
    group.spawn(&mut cmd)
}

fn config(port: u16, s: &Scenario, generation: u32) -> String {
    let proto = match s.protocol {
        Protocol::Http1 => "",
        Protocol::H2c => " proto h2",
    };
    let keepalive = s
        .keepalive_timeout
        .unwrap_or(Duration::from_secs(60))
        .as_millis();
    let rotation = match s.max_requests_per_connection {
        Some(n) if s.protocol == Protocol::Http1 => format!(
            "    tcp-request session set-var(sess.requests) int(0)\n    \
             http-request set-var(sess.requests) var(sess.requests),add(1)\n    \
             http-after-response set-header connection close if {{ var(sess.requests) -m int ge {n} }}\n"
        ),
        _ => String::new(),
    };
    format!(
        r#"global
    log stdout format raw local0
    maxconn 2000
    hard-stop-after 15s
defaults
    mode http
    log global
    log-format "%[capture.req.hdr(0)] %HM %ST"
    timeout client 60s
    timeout http-request 10s
    timeout http-keep-alive {keepalive}ms
    timeout connect 5s
    timeout server 10s
frontend answer
    bind 127.0.0.1:{port}{proto}
{rotation}    http-request capture req.hdr(x-request-id) len 64
    http-request return status 200 content-type text/plain string "{generation}" if {{ path /__generation }}
    http-request return status 200 content-type text/plain string "ok"
"#
    )
}

impl RealServer for Haproxy {
    fn name(&self) -> &'static str {
        "haproxy"
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn reload(&self) {
        let mut current = self.current.lock().unwrap();
        let (generation, old) = *current;
        let generation = generation + 1;
        let pid = spawn(
            &self.group,
            &self.bin,
            self.dir.path(),
            self.port,
            &self.scenario,
            generation,
            Some(old),
        );
        *current = (generation, pid);
        wait_generation(&self.base_url(), self.scenario.protocol, generation);
        self.group.reap();
    }

    fn executions(&self) -> Vec<Execution> {
        let generations = self.current.lock().unwrap().0;
        (0..=generations)
            .flat_map(|g| settled_log(&self.dir.path().join(format!("access-{g}.log"))))
            .collect()
    }
}
