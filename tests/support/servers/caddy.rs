//! caddy 2.6 (Debian's `caddy`) from a JSON config of its own.
//!
//! - Runs as `caddy run --config DIR/caddy.json` (one process) with `HOME`,
//!   `XDG_DATA_HOME` and `XDG_CONFIG_HOME` in the temp dir, storage in the temp dir and
//!   config autosave off, so nothing is written outside it. Its admin endpoint listens on
//!   a loopback port of its own.
//! - Answers: a `static_response` `200` `ok` on every path and method (caddy does not
//!   read a body it does not need; Go's server drains a small one); `/__generation`
//!   answers the generation written in the config.
//! - No per-connection request limit exists in caddy (Go's `net/http` has none):
//!   [`start`] skips (prints, returns `None`) a scenario with
//!   [`Scenario::max_requests_per_connection`]; see [`supports`].
//!   `keepalive_timeout`: the server's `idle_timeout` (HTTP/1.1 and h2c alike).
//! - Reload: `POST /load` on the admin endpoint with the next generation's config (and
//!   `Cache-Control: must-revalidate`, which forces a reload even of an unchanged
//!   config). caddy starts the new server on the same listener and shuts the old one
//!   down gracefully (`grace_period` 10 s): idle keep-alive connections are closed at
//!   once, busy ones after their request. `/load` answers once that is done.
//! - Log: the access log in JSON, one object per request with the request's headers
//!   (`request.headers["X-Request-Id"]`, Go's canonical spelling), `request.method` and
//!   `status`, written when the handler returns. [`parse_access_log`] reads it; a line
//!   that is not such an object is an error.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use super::{
    Execution, ProcessGroup, Protocol, RealServer, Scenario, TempDir, binary, free_port,
    settled_text, wait_generation, wait_listening,
};

/// Both: HTTP/1.1 keep-alive, and h2c with prior knowledge (`protocols h1 h2c`).
pub const PROTOCOLS: &[Protocol] = &[Protocol::Http1, Protocol::H2c];

/// Whether caddy can run `scenario`: not with a per-connection request limit.
pub fn supports(scenario: &Scenario) -> bool {
    scenario.max_requests_per_connection.is_none()
}

/// A running caddy for `scenario`, or `None` (printed) when it is not installed and `CI`
/// is not `true`, or when `scenario` has a per-connection request limit (see
/// [`supports`]).
///
/// # Panics
///
/// Under `CI=true` without caddy, or when it does not listen within 10 s.
pub fn start(scenario: &Scenario) -> Option<Box<dyn RealServer>> {
    if !supports(scenario) {
        eprintln!("skipped: caddy has no per-connection request limit");
        return None;
    }
    let bin = binary("caddy", "caddy")?;
    let dir = TempDir::new("caddy");
    let (port, admin) = (free_port(), free_port());
    let config = Config {
        dir: dir.path(),
        port,
        admin,
        scenario,
    };
    let conf = dir.path().join("caddy.json");
    std::fs::write(&conf, config.text(0)).expect("write caddy.json");
    let stderr = std::fs::File::create(dir.path().join("stderr.log")).expect("stderr.log");
    let group = ProcessGroup::new();
    group.spawn(
        Command::new(bin)
            .arg("run")
            .arg("--config")
            .arg(&conf)
            .env("HOME", dir.path())
            .env("XDG_DATA_HOME", dir.path().join("data"))
            .env("XDG_CONFIG_HOME", dir.path().join("config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr),
    );
    let addr = ([127, 0, 0, 1], port).into();
    wait_listening(addr, &group, &dir.path().join("stderr.log"));
    let caddy = Caddy {
        group,
        dir,
        port,
        admin,
        scenario: *scenario,
        generation: Mutex::new(0),
    };
    wait_generation(&caddy.base_url(), scenario.protocol, 0);
    Some(Box::new(caddy))
}

/// A running caddy (fields drop in order: the process, then its directory).
struct Caddy {
    group: ProcessGroup,
    dir: TempDir,
    port: u16,
    /// The admin endpoint's port.
    admin: u16,
    scenario: Scenario,
    /// The config generation; held through a reload, so reloads follow one another.
    generation: Mutex<u32>,
}

/// What a generation's config is made of.
struct Config<'a> {
    dir: &'a Path,
    port: u16,
    admin: u16,
    scenario: &'a Scenario,
}

impl Config<'_> {
    fn text(&self, generation: u32) -> String {
        let d = self.dir.display();
        let protocols = match self.scenario.protocol {
            Protocol::Http1 => serde_json::json!(["h1"]),
            Protocol::H2c => serde_json::json!(["h1", "h2c"]),
        };
        let idle = self
            .scenario
            .keepalive_timeout
            .unwrap_or(Duration::from_secs(60));
        let server = serde_json::json!({
            "listen": [format!("127.0.0.1:{}", self.port)],
            "protocols": protocols,
            "idle_timeout": format!("{}ms", idle.as_millis().max(1)),
            "automatic_https": { "disable": true },
            "logs": { "default_logger_name": "rid" },
            "routes": [
                {
                    "match": [{ "path": ["/__generation"] }],
                    "handle": [{ "handler": "static_response", "status_code": 200,
                                 "body": generation.to_string() }],
                },
                { "handle": [{ "handler": "static_response", "status_code": 200,
                               "body": "ok\n" }] },
            ],
        });
        serde_json::json!({
            "admin": { "listen": format!("127.0.0.1:{}", self.admin),
                       "config": { "persist": false } },
            "storage": { "module": "file_system", "root": format!("{d}/data") },
            "logging": { "logs": {
                "default": { "level": "WARN", "exclude": ["http.log.access.rid"],
                             "writer": { "output": "file", "filename": format!("{d}/error.log") } },
                "rid": { "include": ["http.log.access.rid"], "encoder": { "format": "json" },
                         "writer": { "output": "file", "filename": format!("{d}/access.log"),
                                     "roll": false } },
            } },
            "apps": { "http": { "grace_period": "10s", "servers": { "srv0": server } } },
        })
        .to_string()
    }
}

impl Caddy {
    fn config(&self) -> Config<'_> {
        Config {
            dir: self.dir.path(),
            port: self.port,
            admin: self.admin,
            scenario: &self.scenario,
        }
    }

    /// `POST /load` with `body` to the admin endpoint; `Err` with what it answered.
    fn load(&self, body: &str) -> Result<(), String> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.admin));
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .map_err(|e| format!("connect to the admin endpoint: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .and_then(|()| stream.set_write_timeout(Some(Duration::from_secs(5))))
            .map_err(|e| e.to_string())?;
        let head = format!(
            "POST /load HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Cache-Control: must-revalidate\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(body.as_bytes()))
            .map_err(|e| format!("send /load: {e}"))?;
        let mut answer = Vec::new();
        stream
            .take(64 * 1024)
            .read_to_end(&mut answer)
            .map_err(|e| format!("read /load's answer: {e}"))?;
        let answer = String::from_utf8_lossy(&answer);
        if answer.starts_with("HTTP/1.1 200 ") {
            Ok(())
        } else {
            Err(answer.into_owned())
        }
    }
}

impl RealServer for Caddy {
    fn name(&self) -> &'static str {
        "caddy"
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn reload(&self) {
        let mut generation = self.generation.lock().unwrap();
        let g = *generation + 1;
        if let Err(answer) = self.load(&self.config().text(g)) {
            panic!("caddy /load of generation {g} failed: {answer}");
        }
        wait_generation(&self.base_url(), self.scenario.protocol, g);
        *generation = g;
    }

    fn executions(&self) -> Vec<Execution> {
        let text = settled_text(&self.dir.path().join("access.log"));
        parse_access_log(&text).unwrap_or_else(|e| panic!("caddy's access log: {e}"))
    }
}

/// caddy's JSON access log into executions; requests without an `X-Request-Id` (the
/// `/__generation` polls) are left out. `Err` names the first line that is not an
/// access log object (not JSON, or without `request.method` or `status`).
pub fn parse_access_log(text: &str) -> Result<Vec<Execution>, String> {
    let mut executions = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let bad = || format!("line {}: not an access log entry: {line:?}", n + 1);
        let entry: serde_json::Value = serde_json::from_str(line).map_err(|_| bad())?;
        let request = &entry["request"];
        let method = request["method"].as_str().ok_or_else(bad)?;
        let status = entry["status"]
            .as_u64()
            .and_then(|s| u16::try_from(s).ok())
            .ok_or_else(bad)?;
        let Some(id) = request["headers"]["X-Request-Id"][0].as_str() else {
            continue;
        };
        executions.push(Execution {
            request_id: id.to_owned(),
            method: method.to_owned(),
            status,
        });
    }
    Ok(executions)
}
