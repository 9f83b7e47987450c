//! A real forward proxy (Debian's tinyproxy) for tests/it/proxy.rs: its own config and
//! temp dir, `127.0.0.1` on a free port, stopped by its pid (its process group) on drop,
//! the requests it carried counted from its own log.

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use super::servers::{ProcessGroup, TempDir, binary, free_port};

/// A running tinyproxy.
pub struct Tinyproxy {
    port: u16,
    dir: TempDir,
    // Dropped after `dir`'s path is no longer needed; kills the proxy.
    _process: ProcessGroup,
}

impl Tinyproxy {
    /// A tinyproxy on `127.0.0.1`, asking for `user:password` (`407` without them) when
    /// `basic_auth` is given. `None` (printed) when tinyproxy is missing and `CI` is not
    /// `true` (under `CI=true` a missing binary panics: `.ci/run` installs it).
    pub fn start(basic_auth: Option<(&str, &str)>) -> Option<Tinyproxy> {
        let bin = binary("tinyproxy", "tinyproxy")?;
        let dir = TempDir::new("tinyproxy");
        let port = free_port();
        let d = dir.path().display();
        let auth = basic_auth.map_or(String::new(), |(u, p)| format!("BasicAuth {u} {p}\n"));
        let config = format!(
            "Port {port}\nListen 127.0.0.1\nTimeout 30\nLogFile \"{d}/access.log\"\n\
             LogLevel Connect\nPidFile \"{d}/tinyproxy.pid\"\nMaxClients 50\n\
             Allow 127.0.0.1\nDisableViaHeader Yes\n{auth}"
        );
        let conf = dir.path().join("tinyproxy.conf");
        std::fs::write(&conf, config).expect("write tinyproxy.conf");
        let process = ProcessGroup::new();
        process.spawn(
            Command::new(bin)
                .arg("-d")
                .arg("-c")
                .arg(&conf)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null()),
        );
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "tinyproxy did not listen on {port} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Tinyproxy {
            port,
            dir,
            _process: process,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `http://user:password@127.0.0.1:PORT`.
    pub fn url_with(&self, user: &str, password: &str) -> String {
        format!("http://{user}:{password}@127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Every request the proxy read, from its log, as `METHOD URL` (a request it refused
    /// with `407` included), once the log has stopped growing (bounded).
    pub fn requests(&self) -> Vec<String> {
        let path = self.dir.path().join("access.log");
        let read = || std::fs::read_to_string(&path).unwrap_or_default();
        let mut last = read();
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(25));
            let now = read();
            if now == last {
                break;
            }
            last = now;
        }
        last.lines()
            .filter_map(|l| l.split_once("]: Request (file descriptor "))
            .filter_map(|(_, rest)| rest.split_once("): "))
            .map(|(_, req)| req.trim_end_matches(" HTTP/1.1").to_owned())
            .collect()
    }
}
