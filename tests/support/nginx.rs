//! A real nginx (Debian's `nginx-light`) on `127.0.0.1`, serving HTTP/2 cleartext with
//! prior knowledge and `return 200` on every path, from a config written to a temporary
//! directory.
//!
//! [`Nginx::start`] returns `None` (after printing why) when no `nginx` binary is
//! installed, except under `CI=true`, where a missing nginx is a failure: `.ci/run`
//! installs it. The process runs in the foreground (`daemon off; master_process off;`) as
//! a child of the test, and [`Nginx`]'s `Drop` kills it and removes the directory.
//!
//! The access log has one line per request nginx processed: the `x-request-id` header the
//! test sent, the method, the status, the connection's serial number, the request's number
//! on that connection and the request's length ([`Nginx::access_log`]). nginx writes a line
//! when it finalises the request, which can be after the client read the answer:
//! [`Nginx::settled_access_log`] waits until the log stops growing. A stream nginx refuses
//! (`REFUSED_STREAM` over `http2_max_concurrent_streams`, or above a `GOAWAY`'s
//! last-stream-id after `keepalive_requests`) is never logged: it never reached a handler.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// What the server is configured with.
#[derive(Debug, Clone, Copy)]
pub struct NginxConfig {
    /// `keepalive_requests`: requests per connection before nginx sends `GOAWAY`.
    pub keepalive_requests: u32,
    /// `http2_max_concurrent_streams` (nginx's default is 128).
    pub max_concurrent_streams: u32,
}

/// A running nginx, killed on drop.
pub struct Nginx {
    child: Child,
    dir: PathBuf,
    addr: SocketAddr,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The nginx binary: `PATH`, else Debian's `/usr/sbin` (not on a non-root `PATH`).
fn binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|p| p.is_file())
}

/// A loopback port free a moment ago (nginx binds it next; a clash fails the start).
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
    l.local_addr().expect("probe addr").port()
}

fn config_text(dir: &Path, port: u16, c: NginxConfig) -> String {
    let d = dir.display();
    format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format rid '$http_x_request_id $request_method $status $connection $connection_requests $request_length';
    access_log {d}/access.log rid;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{port} http2;
        keepalive_requests {kr};
        http2_max_concurrent_streams {mcs};
        location / {{ return 200 "ok\n"; }}
    }}
}}
"#,
        kr = c.keepalive_requests,
        mcs = c.max_concurrent_streams,
    )
}

impl Nginx {
    /// Starts nginx with `config`, or `None` (printed) when nginx is not installed and
    /// `CI` is not `true`.
    ///
    /// # Panics
    ///
    /// Under `CI=true` without nginx, or when nginx does not listen within 5 s.
    pub fn start(config: NginxConfig) -> Option<Nginx> {
        Nginx::start_with(|dir, port| config_text(dir, port, config))
    }

    /// Starts nginx with the configuration `text(dir, port)` gives for its temporary
    /// directory and port (see [`start`](Self::start)).
    pub fn start_with(text: impl FnOnce(&Path, u16) -> String) -> Option<Nginx> {
        let Some(bin) = binary() else {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI=true and no nginx installed: .ci/run installs nginx-light");
            }
            eprintln!("skipped: no nginx binary (apt-get install nginx-light to run this test)");
            return None;
        };
        let dir = std::env::temp_dir().join(format!(
            "reqwest-resilience-nginx-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("nginx temp dir");
        let port = free_port();
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, text(&dir, port)).expect("write nginx.conf");
        let child = Command::new(bin)
            .arg("-p")
            .arg(&dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn nginx");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut nginx = Nginx { child, dir, addr };
        nginx.wait_listening();
        Some(nginx)
    }

    /// Polls until the port accepts a connection (bounded: 5 s).
    fn wait_listening(&mut self) {
        for _ in 0..500 {
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(100)).is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default();
                panic!("nginx exited ({status}) before listening: {log}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("nginx did not listen on {} within 5 s", self.addr);
    }

    /// Its temporary directory (its configuration, logs and any files it serves).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The access log's lines as they are now.
    pub fn access_log(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("access.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The access log once it has not grown for 300 ms (bounded: 10 s, then as it is).
    pub async fn settled_access_log(&self) -> Vec<String> {
        let mut lines = self.access_log();
        let mut unchanged = 0;
        for _ in 0..1000 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let now = self.access_log();
            if now.len() == lines.len() {
                unchanged += 1;
                if unchanged == 30 {
                    break;
                }
            } else {
                unchanged = 0;
            }
            lines = now;
        }
        lines
    }
}
