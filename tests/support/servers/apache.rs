//! apache2 2.4 (Debian's `apache2`, mpm_event, mod_http2) from a config of its own.
//!
//! - Runs as `apache2 -f CONF -DFOREGROUND`: the spawned process is the parent (it keeps
//!   the listening socket across reloads), its children serve. Run as root it binds, then
//!   its children switch to `nobody:nogroup` (`User`/`Group`; ignored when not root): they
//!   only read the two static files, every file apache writes is opened by the parent.
//! - `PidFile`, `ErrorLog`, `DefaultRuntimeDir` and the access log are in the temp dir;
//!   the scoreboard is anonymous shared memory and one listener needs no accept mutex
//!   (nothing is written outside the temp dir).
//! - Answers: `GET` any path serves one static file (`AliasMatch ^`); `POST` goes to
//!   `mod_reflector`, which reads the whole body and answers `200` with it (the default
//!   handler answers `405` to a `POST` on a file). `/__generation` serves a file per
//!   generation, named in that generation's config, so a child of the old generation
//!   still answers the old number.
//! - [`Scenario::max_requests_per_connection`] `n` (HTTP/1.1 only, see [`supports`]):
//!   `MaxKeepAliveRequests n - 1` (apache counts keep-alive requests after the first:
//!   `MaxKeepAliveRequests 3` serves 4 requests on a connection), `KeepAlive Off` for
//!   `n = 1`. `keepalive_timeout`:
//!   `KeepAliveTimeout` in milliseconds (mod_http2 has no timeout of its own, it uses
//!   this one for idle h2c connections too).
//! - Reload: `SIGUSR1` to the parent, a graceful restart: it re-reads the config, old
//!   children finish the requests they are serving and close their idle keep-alive
//!   connections, new children accept on the same socket.
//! - Log: `%{x-request-id}i %m %>s %{remote}p %k %H` (id, method, final status, client
//!   port, keep-alive count on the connection, protocol), written by the child when the
//!   request ends; `O_APPEND`, so lines of both generations interleave whole.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use super::{
    Execution, ProcessGroup, Protocol, RealServer, Scenario, TempDir, binary, free_port,
    settled_log, signal, wait_generation, wait_listening,
};

/// Both: HTTP/1.1 keep-alive, and h2c with prior knowledge (`H2Direct`, on by default
/// for cleartext).
pub const PROTOCOLS: &[Protocol] = &[Protocol::Http1, Protocol::H2c];

/// Whether apache2 can apply `scenario`: not a per-connection request limit over h2c
/// (mod_http2 ignores `MaxKeepAliveRequests`: 40 requests in a row went over one h2c
/// connection with `MaxKeepAliveRequests 4`, and it has no limit of its own).
pub fn supports(scenario: &Scenario) -> bool {
    !(scenario.protocol == Protocol::H2c && scenario.max_requests_per_connection.is_some())
}

const MODULES: &str = "/usr/lib/apache2/modules";

/// A running apache2 for `scenario`, or `None` (printed) when it is not installed and
/// `CI` is not `true`, or when it cannot apply `scenario` (see [`supports`]).
///
/// # Panics
///
/// Under `CI=true` without apache2, or when it does not listen within 10 s.
pub fn start(scenario: &Scenario) -> Option<Box<dyn RealServer>> {
    if !supports(scenario) {
        eprintln!("skipped: apache2's mod_http2 has no per-connection request limit");
        return None;
    }
    let bin = binary("apache2", "apache2")?;
    let dir = TempDir::new("apache2");
    let port = free_port();
    std::fs::write(dir.path().join("ok.txt"), "ok\n").expect("write ok.txt");
    write_config(dir.path(), port, scenario, 0);
    let group = ProcessGroup::new();
    let parent = group.spawn(
        Command::new(bin)
            .arg("-f")
            .arg(dir.path().join("httpd.conf"))
            .arg("-DFOREGROUND")
            .env("LANG", "C")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    );
    let addr = ([127, 0, 0, 1], port).into();
    wait_listening(addr, &group, &dir.path().join("error.log"));
    let apache = Apache {
        group,
        dir,
        port,
        scenario: *scenario,
        parent,
        generation: Mutex::new(0),
    };
    wait_generation(&apache.base_url(), scenario.protocol, 0);
    Some(Box::new(apache))
}

/// A running apache2 (fields drop in order: the processes, then their directory).
struct Apache {
    group: ProcessGroup,
    dir: TempDir,
    port: u16,
    scenario: Scenario,
    /// The `-DFOREGROUND` parent: the one that takes `USR1`.
    parent: u32,
    /// The config generation; held through a reload, so reloads follow one another.
    generation: Mutex<u32>,
}

/// Writes generation `g`'s file and the `httpd.conf` that serves it.
fn write_config(dir: &Path, port: u16, scenario: &Scenario, g: u32) {
    std::fs::write(dir.join(format!("generation-{g}")), g.to_string())
        .expect("write the generation file");
    std::fs::write(dir.join("httpd.conf"), config_text(dir, port, scenario, g))
        .expect("write httpd.conf");
}

/// The keep-alive lines for `scenario` (see the module doc for the `n - 1`).
fn keepalive_text(scenario: &Scenario) -> String {
    let timeout_ms = scenario
        .keepalive_timeout
        .unwrap_or(Duration::from_secs(60))
        .as_millis()
        .max(1);
    match scenario.max_requests_per_connection {
        Some(0 | 1) => "KeepAlive Off\n".to_owned(),
        n => format!(
            "KeepAlive On\nMaxKeepAliveRequests {}\nKeepAliveTimeout {timeout_ms}ms\n",
            n.map_or(100_000, |n| n - 1)
        ),
    }
}

fn config_text(dir: &Path, port: u16, scenario: &Scenario, generation: u32) -> String {
    let d = dir.display();
    let protocols = match scenario.protocol {
        Protocol::Http1 => "http/1.1",
        Protocol::H2c => "h2c http/1.1",
    };
    let keepalive = keepalive_text(scenario);
    format!(
        r#"ServerRoot {d}
LoadModule mpm_event_module {MODULES}/mod_mpm_event.so
LoadModule authz_core_module {MODULES}/mod_authz_core.so
LoadModule alias_module {MODULES}/mod_alias.so
LoadModule reflector_module {MODULES}/mod_reflector.so
LoadModule http2_module {MODULES}/mod_http2.so
ServerName 127.0.0.1
Listen 127.0.0.1:{port}
PidFile {d}/httpd.pid
ErrorLog {d}/error.log
LogLevel warn
DefaultRuntimeDir {d}
User nobody
Group nogroup
StartServers 2
ServerLimit 16
ThreadsPerChild 25
MaxRequestWorkers 200
Timeout 30
Protocols {protocols}
H2Upgrade off
{keepalive}LogFormat "%{{x-request-id}}i %m %>s %{{remote}}p %k %H" rid
CustomLog {d}/access.log rid
DocumentRoot {d}
Alias /__generation {d}/generation-{generation}
AliasMatch ^ {d}/ok.txt
<Directory />
    Require all granted
    AllowOverride None
</Directory>
<If "%{{REQUEST_METHOD}} == 'POST'">
    SetHandler reflector
</If>
"#
    )
}

impl RealServer for Apache {
    fn name(&self) -> &'static str {
        "apache2"
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn reload(&self) {
        let mut generation = self.generation.lock().unwrap();
        let g = *generation + 1;
        write_config(self.dir.path(), self.port, &self.scenario, g);
        signal(self.parent, "USR1");
        wait_generation(&self.base_url(), self.scenario.protocol, g);
        *generation = g;
    }

    fn executions(&self) -> Vec<Execution> {
        settled_log(&self.dir.path().join("access.log"))
    }
}
