//! nginx (Debian's `nginx-light`) with a master process in the foreground (`daemon off;
//! master_process on;`), so a `HUP` to the master is a graceful reload: new workers with
//! the rewritten config, old workers finish their requests and close their connections.
//! HTTP/1.1 keep-alive or h2c (`listen … http2` on cleartext is prior knowledge only).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::{
    Execution, ProcessGroup, Protocol, RealServer, Scenario, TempDir, binary, free_port,
    settled_log, signal, wait_generation, wait_listening,
};

pub const PROTOCOLS: &[Protocol] = &[Protocol::Http1, Protocol::H2c];

/// nginx applies every scenario over both protocols.
pub fn supports(_: &Scenario) -> bool {
    true
}

struct Nginx {
    // Field order: the group is killed before its directory is removed.
    group: ProcessGroup,
    dir: TempDir,
    scenario: Scenario,
    streams: u32,
    port: u16,
    generation: AtomicU32,
}

pub fn start(scenario: &Scenario) -> Option<Box<dyn RealServer>> {
    start_with_streams(scenario, 128)
}

/// [`start`] with `http2_max_concurrent_streams` (nginx's default is 128).
pub fn start_with_streams(scenario: &Scenario, streams: u32) -> Option<Box<dyn RealServer>> {
    let bin = binary("nginx", "nginx-light")?;
    let dir = TempDir::new("nginx");
    let port = free_port();
    let conf = dir.path().join("nginx.conf");
    std::fs::write(&conf, config(dir.path(), port, scenario, streams, 0))
        .expect("write nginx.conf");
    let group = ProcessGroup::new();
    group.spawn(
        Command::new(bin)
            .arg("-p")
            .arg(dir.path())
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    wait_listening(addr, &group, &dir.path().join("error.log"));
    let nginx = Nginx {
        group,
        dir,
        scenario: *scenario,
        streams,
        port,
        generation: AtomicU32::new(0),
    };
    wait_generation(&nginx.base_url(), scenario.protocol, 0);
    Some(Box::new(nginx))
}

fn config(dir: &Path, port: u16, s: &Scenario, streams: u32, generation: u32) -> String {
    let d = dir.display();
    let http2 = match s.protocol {
        Protocol::Http1 => "",
        Protocol::H2c => " http2",
    };
    let requests = s.max_requests_per_connection.unwrap_or(100_000);
    let timeout = s
        .keepalive_timeout
        .unwrap_or(Duration::from_secs(75))
        .as_millis();
    format!(
        r#"daemon off;
master_process on;
worker_processes 1;
worker_shutdown_timeout 10s;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format rid '$http_x_request_id $request_method $status $connection $connection_requests';
    access_log {d}/access.log rid;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{port}{http2};
        keepalive_requests {requests};
        keepalive_timeout {timeout}ms;
        http2_max_concurrent_streams {streams};
        location = /__generation {{ return 200 "{generation}\n"; }}
        location / {{ return 200 "ok\n"; }}
    }}
}}
"#
    )
}

impl RealServer for Nginx {
    fn name(&self) -> &'static str {
        "nginx"
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn reload(&self) {
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let text = config(
            self.dir.path(),
            self.port,
            &self.scenario,
            self.streams,
            generation,
        );
        std::fs::write(self.dir.path().join("nginx.conf"), text).expect("rewrite nginx.conf");
        let master = self.group.pgid().expect("nginx master");
        signal(master, "HUP");
        wait_generation(&self.base_url(), self.scenario.protocol, generation);
    }

    fn executions(&self) -> Vec<Execution> {
        settled_log(&self.dir.path().join("access.log"))
    }
}
