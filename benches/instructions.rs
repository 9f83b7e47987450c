//! Instructions per request, counted by valgrind's callgrind: `cargo bench --bench
//! instructions` (valgrind needed: `apt-get install -y valgrind`; about 30 s; results
//! and method in BENCHMARKS.md).
//!
//! Wall-clock ratios (`benches/stack.rs`) move by a few percent with the machine's load;
//! user-space instructions do not. For every configuration of [`ROWS`] this binary
//! re-executes itself under `valgrind --tool=callgrind`, once for `N` and once for `2N`
//! sequential GETs, and reports `(I(2N) − I(N)) / N`: what one request costs once the
//! warm-up, the runtime's start and the loop's entry have cancelled out. Only the main
//! thread's instructions inside [`callgrind_measured_requests`] are counted
//! (`--toggle-collect` switches collection per thread): the client, the middlewares and
//! hyper's connection task, which the current-thread runtime polls on that thread; not the
//! server's thread. Atomic instructions come from the same run (`--collect-bus=yes`:
//! callgrind's "global bus events", the lock-prefixed instructions), allocations from the
//! thread-local counting allocator of `tests/support/counting_alloc.rs` (present in every
//! row alike).
//!
//! Two modes, each with its own baseline (the mode's first row):
//! - end to end: a keep-alive HTTP/1.1 server on loopback answers `200 ok` (the
//!   baseline is the bare `reqwest::Client`);
//! - without I/O: `Answer200` (`tests/support/answer200.rs`) is added innermost and
//!   answers `200` at once, so only the middlewares and reqwest-middleware are counted
//!   (the baseline is `ClientWithMiddleware` with only `Answer200`).
//!
//! Arguments filter the rows by a part of their name (the baselines always run):
//! `cargo bench --bench instructions -- BearerAuth`. `INSTRUCTIONS_REQUESTS` sets `N`
//! (default 1 000), `INSTRUCTIONS_KEEP=dir` keeps the callgrind files there for
//! `callgrind_annotate`, `VALGRIND` names the valgrind binary. `INSTRUCTIONS_SAVE=file`
//! writes the figures; `INSTRUCTIONS_BEFORE=file` adds a column of differences against
//! such a file (a run on `main`, say, to show what a branch changes).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_resilience::breaker::CircuitBreakerMiddleware;
use reqwest_resilience::{Resilience, RetryMiddleware, TransportEvidence};

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;

#[path = "../tests/support/answer200.rs"]
mod answer200;
use answer200::Answer200;

#[path = "../tests/support/pass_through.rs"]
mod pass_through;
use pass_through::Passthrough;

// Its record's accessors and its `backoff` setter serve the test of `tests/it`.
#[allow(dead_code)]
#[path = "support/request_loop.rs"]
mod request_loop;
use request_loop::RequestLoop;

mod support;
use support::{bearer, reqwest_retry_middleware, start_server};

// ---------------------------------------------------------------------------------------
// The configurations: one row each. A new row is a name and the middlewares it stacks over
// the client (innermost last); without I/O, `Answer200` goes after them.

/// How a row stacks over the `reqwest::Client` it is given (and the URL it will request).
enum Stacking {
    /// The client alone: end to end only (without I/O nothing would answer).
    Bare,
    /// A `ClientWithMiddleware` built from this builder.
    Layers(fn(reqwest::Client, &str) -> ClientBuilder),
    /// A `ClientWithMiddleware` the stack builds itself from the URL (`build_from`): end
    /// to end only (its innermost call is its own, not `Next`).
    Built(fn(&str) -> ClientWithMiddleware),
}

struct Row {
    name: &'static str,
    stacking: Stacking,
}

const ROWS: &[Row] = &[
    Row {
        name: "bare `reqwest::Client`",
        stacking: Stacking::Bare,
    },
    Row {
        name: "empty `ClientWithMiddleware`",
        stacking: Stacking::Layers(|client, _| ClientBuilder::new(client)),
    },
    Row {
        name: "`Resilience::new()`",
        stacking: Stacking::Layers(|client, _| {
            Resilience::new()
                .install(reqwest_middleware::ClientBuilder::new(client))
                .expect("stack")
                // The no-I/O mode adds `Answer200` innermost, a test double for the wire.
                .inside_transport_step()
        }),
    },
    // Each default stage's share: the stack without it.
    Row {
        name: "`Resilience::new().no_breaker()`",
        stacking: Stacking::Layers(|client, _| {
            Resilience::new()
                .no_breaker()
                .install(reqwest_middleware::ClientBuilder::new(client))
                .expect("stack")
                .inside_transport_step()
        }),
    },
    Row {
        name: "`Resilience::new().no_retry()`",
        stacking: Stacking::Layers(|client, _| {
            Resilience::new()
                .no_retry()
                .install(reqwest_middleware::ClientBuilder::new(client))
                .expect("stack")
                .inside_transport_step()
        }),
    },
    Row {
        name: "`Resilience::new().no_retry().no_breaker()`",
        stacking: Stacking::Layers(|client, _| {
            Resilience::new()
                .no_retry()
                .no_breaker()
                .install(reqwest_middleware::ClientBuilder::new(client))
                .expect("stack")
                .inside_transport_step()
        }),
    },
    Row {
        name: "`Resilience::new()` + a learned `rate_limit`",
        stacking: Stacking::Layers(|client, _| {
            Resilience::new()
                .rate_limit(reqwest_resilience::rate::RateLimitConfig::default())
                .install(reqwest_middleware::ClientBuilder::new(client))
                .expect("stack")
                .inside_transport_step()
        }),
    },
    Row {
        name: "`Resilience::new()` + hedging that never fires",
        stacking: Stacking::Layers(|client, _| {
            let hedging =
                reqwest_resilience::retry::Hedging::fixed(std::time::Duration::from_secs(60));
            let retry = RetryMiddleware::builder()
                .hedging(hedging)
                .build()
                .expect("retry");
            Resilience::new()
                .retry(retry)
                .install(reqwest_middleware::ClientBuilder::new(client))
                .expect("stack")
                .inside_transport_step()
        }),
    },
    Row {
        name: "`Resilience::new()` + a concurrency limit",
        stacking: Stacking::Layers(|client, _| {
            Resilience::new()
                .concurrency_limit(reqwest_resilience::limit::LimiterConfig::fixed(64))
                .install(reqwest_middleware::ClientBuilder::new(client))
                .expect("stack")
                .inside_transport_step()
        }),
    },
    Row {
        name: "`Resilience::new()` + coalesced GETs",
        stacking: Stacking::Layers(|client, _| {
            Resilience::new()
                .coalesce_gets(reqwest_resilience::coalesce::CoalesceGets::new())
                .install(reqwest_middleware::ClientBuilder::new(client))
                .expect("stack")
                .inside_transport_step()
        }),
    },
    Row {
        name: "`Resilience::new()` + resumed bodies",
        stacking: Stacking::Layers(|client, _| {
            Resilience::new()
                .resume_bodies(true)
                .install(reqwest_middleware::ClientBuilder::new(client))
                .expect("stack")
                .inside_transport_step()
        }),
    },
    Row {
        name: "`Resilience::new()` + a pool of 3 proxies",
        // The three "proxies" are the loopback server itself (it answers the proxied
        // absolute-form request as it answers any), each through a client of its own
        // kept alive; `rotate_always` takes a different client for every request. The
        // row to compare is `Resilience::new()` over the same `build_from`.
        stacking: Stacking::Built(|url| {
            let proxy = url.trim_end_matches("/bench").to_owned();
            Resilience::new()
                .proxies(
                    reqwest_resilience::proxy::ProxyPool::new([&proxy, &proxy, &proxy])
                        .rotate_always(),
                )
                .build_from(reqwest::Client::builder)
                .expect("stack")
        }),
    },
    Row {
        name: "`Resilience::new()` by `build_from`",
        stacking: Stacking::Built(|_| {
            Resilience::new()
                .build_from(|| reqwest::Client::builder().no_proxy())
                .expect("stack")
        }),
    },
    Row {
        name: "`Resilience::new()` by `build_from`, `Network::off()`",
        // The same client without the network settings: the difference is what the
        // no-progress bound, the change watch and the address race cost per request.
        stacking: Stacking::Built(|_| {
            Resilience::new()
                .network(reqwest_resilience::network::Network::off())
                .build_from(|| reqwest::Client::builder().no_proxy())
                .expect("stack")
        }),
    },
    Row {
        name: "full stack with `BearerAuth`",
        stacking: Stacking::Layers(|client, url| {
            Resilience::new()
                .bearer(bearer(url))
                .install(reqwest_middleware::ClientBuilder::new(client))
                .expect("stack")
                .inside_transport_step()
        }),
    },
    Row {
        name: "full stack + a `per_attempt` pass-through",
        stacking: Stacking::Layers(|client, url| {
            Resilience::new()
                .bearer(bearer(url))
                .per_attempt(std::sync::Arc::new(Passthrough))
                .install(reqwest_middleware::ClientBuilder::new(client))
                .expect("stack")
                .inside_transport_step()
        }),
    },
    Row {
        name: "reqwest-retry 0.9 alone",
        stacking: Stacking::Layers(|client, _| {
            ClientBuilder::new(client).with(reqwest_retry_middleware())
        }),
    },
    // Issue 43's one-loop prototype (`benches/support/request_loop.rs`): the floor of
    // stages as synchronous hooks around one attempt, against reqwest-retry above and the
    // pass-through middleware below.
    Row {
        name: "prototype loop: retry + breaker + evidence",
        stacking: Stacking::Layers(|client, _| ClientBuilder::new(client).with(RequestLoop::new())),
    },
    Row {
        name: "prototype loop: retry + evidence",
        stacking: Stacking::Layers(|client, _| {
            ClientBuilder::new(client).with(RequestLoop::new().without_breaker())
        }),
    },
    Row {
        name: "prototype loop: retry alone",
        stacking: Stacking::Layers(|client, _| {
            ClientBuilder::new(client).with(RequestLoop::new().without_breaker().without_evidence())
        }),
    },
    Row {
        name: "prototype loop: retry + breaker + evidence, origin cached per thread",
        stacking: Stacking::Layers(|client, _| {
            ClientBuilder::new(client).with(RequestLoop::new().origin_cached())
        }),
    },
    // With both of the crate's own savings on the success path (`Origin::cached`,
    // `stage::copy_request`), rebuilt from public APIs: the floor of the real design.
    Row {
        name: "prototype loop: retry + breaker + evidence, origin cached, request copied by hand",
        stacking: Stacking::Layers(|client, _| {
            ClientBuilder::new(client).with(RequestLoop::new().origin_cached().copied_by_hand())
        }),
    },
    Row {
        name: "`RetryMiddleware` + `TransportEvidence`",
        stacking: Stacking::Layers(|client, _| {
            ClientBuilder::new(client)
                .with(RetryMiddleware::new())
                .with(TransportEvidence::new())
        }),
    },
    // The stages of `Resilience::new()` (then of the full stack) as middlewares of their
    // own, each through `Next`: what the composed stack saves or costs against them.
    Row {
        name: "`RetryMiddleware` + `CircuitBreakerMiddleware` + `TransportEvidence`",
        stacking: Stacking::Layers(|client, _| {
            ClientBuilder::new(client)
                .with(RetryMiddleware::new())
                .with(CircuitBreakerMiddleware::default())
                .with(TransportEvidence::new())
        }),
    },
    Row {
        name: "the same + `BearerAuth`, as four middlewares",
        stacking: Stacking::Layers(|client, url| {
            ClientBuilder::new(client)
                .with(RetryMiddleware::new())
                .with(CircuitBreakerMiddleware::default())
                .with(bearer(url))
                .with(TransportEvidence::new())
        }),
    },
    Row {
        name: "`CircuitBreakerMiddleware` + `TransportEvidence`",
        stacking: Stacking::Layers(|client, _| {
            ClientBuilder::new(client)
                .with(CircuitBreakerMiddleware::default())
                .with(TransportEvidence::new())
        }),
    },
    Row {
        name: "`BearerAuth` + `TransportEvidence`",
        stacking: Stacking::Layers(|client, url| {
            ClientBuilder::new(client)
                .with(bearer(url))
                .with(TransportEvidence::new())
        }),
    },
    Row {
        name: "one pass-through middleware",
        stacking: Stacking::Layers(|client, _| ClientBuilder::new(client).with(Passthrough)),
    },
    Row {
        name: "`TransportEvidence` alone",
        stacking: Stacking::Layers(|client, _| {
            ClientBuilder::new(client).with(TransportEvidence::new())
        }),
    },
];

#[derive(Clone, Copy, PartialEq)]
enum Io {
    Loopback,
    None,
}

impl Io {
    const ALL: [Io; 2] = [Io::Loopback, Io::None];

    fn arg(self) -> &'static str {
        match self {
            Io::Loopback => "loopback",
            Io::None => "no-io",
        }
    }

    fn from_arg(arg: &str) -> Option<Io> {
        Io::ALL.into_iter().find(|io| io.arg() == arg)
    }

    fn title(self) -> &'static str {
        match self {
            Io::Loopback => "end to end, loopback keep-alive HTTP/1.1",
            Io::None => "without I/O (innermost `Answer200`)",
        }
    }

    fn runs(self, row: &Row) -> bool {
        self == Io::Loopback || matches!(row.stacking, Stacking::Layers(_))
    }
}

// ---------------------------------------------------------------------------------------
// The child: one row, one mode, `n` measured requests, under callgrind.

/// Requests before the measured ones: the connection, the token, the breaker's entry and
/// the origin cache are in place when counting starts.
const WARM_UP: u64 = 200;
/// `Answer200` answers before reqwest would connect: never contacted.
const NO_IO_URL: &str = "http://127.0.0.1:9/bench";
const CHILD: &str = "--child";

enum Subject {
    Bare(reqwest::Client),
    Middleware(ClientWithMiddleware),
}

impl Subject {
    async fn get(&self, url: &str) {
        let response = match self {
            Subject::Bare(c) => c.get(url).send().await.expect("response"),
            Subject::Middleware(c) => c.get(url).send().await.expect("response"),
        };
        assert_eq!(response.status(), 200);
        std::hint::black_box(response.bytes().await.expect("body"));
    }
}

async fn requests(subject: &Subject, url: &str, n: u64) {
    for _ in 0..n {
        subject.get(url).await;
    }
}

/// The counted region: callgrind collects from this function's entry to its exit. No
/// closure may be defined in it (its name would match the toggle too). Returns the
/// allocations the thread made meanwhile.
#[inline(never)]
fn callgrind_measured_requests(
    rt: &tokio::runtime::Runtime,
    subject: &Subject,
    url: &str,
    n: u64,
) -> u64 {
    let before = counting_alloc::allocations();
    rt.block_on(requests(subject, url, n));
    counting_alloc::allocations() - before
}

fn child(row: &Row, io: Io, n: u64) -> Result<(), String> {
    if !io.runs(row) {
        return Err(format!("{} has no {} form", row.name, io.arg()));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let server = (io == Io::Loopback).then(start_server);
    let url = match &server {
        Some((addr, _)) => format!("http://{addr}/bench"),
        None => NO_IO_URL.to_owned(),
    };
    let subject = rt.block_on(async {
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        match (&row.stacking, io) {
            (Stacking::Bare, _) => Subject::Bare(client),
            (Stacking::Layers(stack), Io::Loopback) => {
                Subject::Middleware(stack(client, &url).build())
            }
            (Stacking::Layers(stack), Io::None) => {
                Subject::Middleware(stack(client, &url).with(Answer200).build())
            }
            (Stacking::Built(build), _) => Subject::Middleware(build(&url)),
        }
    });
    rt.block_on(requests(&subject, &url, WARM_UP));
    let allocations = callgrind_measured_requests(&rt, &subject, &url, n);
    println!("allocations {allocations}");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The parent: runs the children, reads callgrind's totals, prints the tables.

const DEFAULT_REQUESTS: u64 = 1_000;

/// Per request, or over a child's `n` requests: instructions (callgrind's `Ir`), atomic
/// instructions (`Ge`, "global bus events": the lock-prefixed ones) and allocations.
#[derive(Clone, Copy)]
struct Figures {
    instructions: f64,
    atomics: f64,
    allocations: f64,
}

impl Figures {
    /// `(self − earlier) / n`.
    fn per(self, earlier: Figures, n: u64) -> Figures {
        let n = n as f64;
        Figures {
            instructions: (self.instructions - earlier.instructions) / n,
            atomics: (self.atomics - earlier.atomics) / n,
            allocations: (self.allocations - earlier.allocations) / n,
        }
    }
}

struct Runner {
    valgrind: String,
    exe: PathBuf,
    dir: PathBuf,
}

impl Runner {
    /// What one child counted over its `n` measured requests.
    fn count(&self, index: usize, io: Io, n: u64) -> Result<Figures, String> {
        let out = self
            .dir
            .join(format!("callgrind.{}-{index:02}-{n}.out", io.arg()));
        // A fixed, empty environment: the environment's size changes what the process
        // allocates at start, and glibc's malloc costs depend on that history (hundreds of
        // instructions per request).
        let output = Command::new(&self.valgrind)
            .env_clear()
            .arg("--tool=callgrind")
            .arg("--quiet")
            .arg("--collect-bus=yes")
            .arg("--toggle-collect=*callgrind_measured_requests*")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(&self.exe)
            .args([CHILD, &index.to_string(), io.arg(), &n.to_string()])
            .output()
            .map_err(|e| format!("running {}: {e}", self.valgrind))?;
        if !output.status.success() {
            return Err(format!(
                "{} ({}, {n} requests) failed: {}\n{}",
                ROWS[index].name,
                io.arg(),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let allocations: u64 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("allocations "))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("no allocation count in the child's output: {stdout}"))?;
        let text = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
        let (instructions, atomics) = callgrind_totals(&text)
            .ok_or_else(|| format!("{}: no Ir and Ge totals", out.display()))?;
        Ok(Figures {
            instructions: instructions as f64,
            atomics: atomics as f64,
            allocations: allocations as f64,
        })
    }

    /// Per request: the difference between `2n` and `n` requests, over `n`.
    fn per_request(&self, index: usize, io: Io, n: u64) -> Result<Figures, String> {
        let one = self.count(index, io, n)?;
        Ok(self.count(index, io, 2 * n)?.per(one, n))
    }
}

/// The collected `Ir` and `Ge` of a callgrind output file, in the order its `events:`
/// line names them, from its `totals:` line (or `summary:` in older formats).
fn callgrind_totals(text: &str) -> Option<(u64, u64)> {
    let events: Vec<&str> = text
        .lines()
        .find_map(|l| l.strip_prefix("events:"))?
        .split_whitespace()
        .collect();
    let totals: Vec<u64> = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })?
        .split_whitespace()
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let total = |event| Some(*totals.get(events.iter().position(|e| *e == event)?)?);
    Some((total("Ir")?, total("Ge")?))
}

/// One measured row, as `INSTRUCTIONS_SAVE` writes it and `INSTRUCTIONS_BEFORE` reads it:
/// `mode<TAB>configuration<TAB>instructions<TAB>atomics<TAB>allocations` a line.
struct Measured {
    io: &'static str,
    name: String,
    figures: Figures,
}

fn save(path: &Path, rows: &[Measured]) -> Result<(), String> {
    let text: String = rows
        .iter()
        .map(|m| {
            let f = m.figures;
            format!(
                "{}\t{}\t{:.1}\t{:.1}\t{:.1}\n",
                m.io, m.name, f.instructions, f.atomics, f.allocations
            )
        })
        .collect();
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

fn load(path: &Path) -> Result<Vec<Measured>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            let bad = || {
                format!(
                    "{}:{}: expected mode, configuration, instructions, atomics, allocations",
                    path.display(),
                    i + 1
                )
            };
            let mut fields = line.split('\t');
            let io = fields.next().and_then(Io::from_arg).ok_or_else(bad)?.arg();
            let name = fields.next().ok_or_else(bad)?.to_owned();
            let mut number = || fields.next().and_then(|v| v.parse().ok()).ok_or_else(bad);
            let figures = Figures {
                instructions: number()?,
                atomics: number()?,
                allocations: number()?,
            };
            Ok(Measured { io, name, figures })
        })
        .collect()
}

fn valgrind_version(valgrind: &str) -> Option<String> {
    let output = Command::new(valgrind).arg("--version").output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn env_requests() -> Result<u64, String> {
    match std::env::var("INSTRUCTIONS_REQUESTS") {
        Err(_) => Ok(DEFAULT_REQUESTS),
        Ok(v) => match v.parse() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "INSTRUCTIONS_REQUESTS={v}: expected a positive integer"
            )),
        },
    }
}

fn run(filters: &[String]) -> Result<(), String> {
    let valgrind = std::env::var("VALGRIND").unwrap_or_else(|_| "valgrind".to_owned());
    let Some(version) = valgrind_version(&valgrind) else {
        return Err(format!(
            "`{valgrind}` could not be run: this benchmark counts instructions with valgrind's \
             callgrind. Install it (Debian, Ubuntu: `apt-get install -y valgrind`), or set \
             VALGRIND to its path."
        ));
    };
    let n = env_requests()?;
    let save_to = std::env::var_os("INSTRUCTIONS_SAVE").map(PathBuf::from);
    let before = match std::env::var_os("INSTRUCTIONS_BEFORE") {
        Some(path) => load(Path::new(&path))?,
        None => Vec::new(),
    };
    let keep = std::env::var_os("INSTRUCTIONS_KEEP").map(PathBuf::from);
    let dir = keep.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "reqwest-resilience-instructions-{}",
            std::process::id()
        ))
    });
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let runner = Runner {
        valgrind,
        exe: std::env::current_exe().map_err(|e| format!("the bench's own path: {e}"))?,
        dir,
    };
    println!(
        "instructions benchmark: {version}, callgrind, (I({}) − I({n})) / {n} per request, \
         current-thread client{}",
        2 * n,
        if cfg!(feature = "tracing") {
            ", feature tracing on (no subscriber)"
        } else {
            ""
        }
    );
    let mut measured = Vec::new();
    let result = Io::ALL
        .into_iter()
        .try_for_each(|io| table(&runner, io, n, filters, &before, &mut measured));
    match keep {
        Some(dir) => println!("\ncallgrind files kept in {}", dir.display()),
        None => {
            let _ = std::fs::remove_dir_all(&runner.dir);
        }
    }
    result?;
    if let Some(path) = save_to {
        save(&path, &measured)?;
        println!(
            "\nfigures saved to {} (compare with INSTRUCTIONS_BEFORE)",
            path.display()
        );
    }
    Ok(())
}

/// Measures and prints one mode's table: its baseline (the first row it runs) and the
/// rows the filters name, with differences against `before` where it has the row.
fn table(
    runner: &Runner,
    io: Io,
    n: u64,
    filters: &[String],
    before: &[Measured],
    measured: &mut Vec<Measured>,
) -> Result<(), String> {
    let (before_head, before_rule) = if before.is_empty() {
        ("", "")
    } else {
        (
            " Δ instructions vs before | Δ atomics | Δ allocations |",
            "---:|---:|---:|",
        )
    };
    println!(
        "\n{}\n\n| configuration | instructions / request | over baseline | × baseline | \
         atomics / request | allocations / request |{before_head}\n\
         |---|---:|---:|---:|---:|---:|{before_rule}",
        io.title()
    );
    let mut baseline = None;
    for (index, row) in ROWS.iter().enumerate() {
        let wanted = filters.is_empty() || filters.iter().any(|f| row.name.contains(f.as_str()));
        if !io.runs(row) || !(wanted || baseline.is_none()) {
            continue;
        }
        let f = runner.per_request(index, io, n)?;
        let (over, ratio) = match baseline {
            None => {
                baseline = Some(f.instructions);
                ("—".to_owned(), "—".to_owned())
            }
            Some(base) => (
                format!("{:+.0}", f.instructions - base),
                format!("{:.3}×", base / f.instructions),
            ),
        };
        let delta = match before
            .iter()
            .find(|b| b.io == io.arg() && b.name == row.name)
        {
            _ if before.is_empty() => String::new(),
            Some(b) => format!(
                " {:+.0} | {:+.1} | {:+.1} |",
                f.instructions - b.figures.instructions,
                f.atomics - b.figures.atomics,
                f.allocations - b.figures.allocations
            ),
            None => " — | — | — |".to_owned(),
        };
        println!(
            "| {} | {:.0} | {over} | {ratio} | {:.1} | {:.1} |{delta}",
            row.name, f.instructions, f.atomics, f.allocations
        );
        measured.push(Measured {
            io: io.arg(),
            name: row.name.to_owned(),
            figures: f,
        });
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(at) = args.iter().position(|a| a == CHILD) {
        let row = args.get(at + 1).and_then(|r| r.parse::<usize>().ok());
        let io = args.get(at + 2).and_then(|m| Io::from_arg(m));
        let n = args.get(at + 3).and_then(|n| n.parse().ok());
        let (Some(row), Some(io), Some(n)) = (row, io, n) else {
            eprintln!("usage: {CHILD} <row> <loopback|no-io> <requests>");
            return ExitCode::FAILURE;
        };
        let Some(row) = ROWS.get(row) else {
            eprintln!("no row {row}: there are {}", ROWS.len());
            return ExitCode::FAILURE;
        };
        return match child(row, io, n) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    // `cargo bench` passes `--bench`; every other argument filters the rows.
    let filters: Vec<String> = args.into_iter().filter(|a| !a.starts_with("--")).collect();
    match run(&filters) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
