//! Coalesced identical GETs, counted by valgrind's callgrind: `cargo bench --bench
//! coalesce` (valgrind needed; a few seconds per run; results in BENCHMARKS.md).
//!
//! 1. 1 000 concurrent identical GETs through `Resilience::new().coalesce_gets(..)`
//!    against the loopback server of `benches/support`: the server answers one request,
//!    every caller gets the body (asserted, outside valgrind).
//! 2. Instructions per coalesced caller: `(I(2N callers in one flight) − I(N)) / N`, the
//!    callers started together on a current-thread runtime (all of them join the flight
//!    in the first poll, before the one request's I/O can complete), against the
//!    instructions per request of `N` sequential GETs, with `Resilience::new()` and with
//!    `Resilience::new().coalesce_gets(..)` (each of those alone: what coalescing adds
//!    to a request nobody shares). As in `benches/instructions.rs`, only the main
//!    thread's instructions inside `callgrind_measured` are counted (`--toggle-collect`),
//!    not the server's thread.
//!
//! `COALESCE_N` sets `N` (default 1 000); `VALGRIND` names the valgrind binary.

use std::process::{Command, ExitCode};

use reqwest_middleware::ClientWithMiddleware;
use reqwest_resilience::coalesce::CoalesceGets;
use reqwest_resilience::{AttemptHistory, Resilience};

#[allow(dead_code)] // the other benches use the rest of it
mod support;
use support::start_counting_server;

const CHILD: &str = "--child";
const WARM_UP: usize = 100;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    /// `n` callers at once, coalescing on.
    Concurrent,
    /// `n` sequential GETs, coalescing on (each alone).
    SequentialCoalescing,
    /// `n` sequential GETs, `Resilience::new()`.
    Sequential,
}

impl Mode {
    const ALL: [Mode; 3] = [
        Mode::Concurrent,
        Mode::SequentialCoalescing,
        Mode::Sequential,
    ];

    fn arg(self) -> &'static str {
        match self {
            Mode::Concurrent => "concurrent",
            Mode::SequentialCoalescing => "sequential-coalescing",
            Mode::Sequential => "sequential",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Mode::Concurrent => "per coalesced caller (N callers of one GET at once)",
            Mode::SequentialCoalescing => "per request, `coalesce_gets` on, nobody to share with",
            Mode::Sequential => "per request, `Resilience::new()`",
        }
    }

    fn client(self) -> ClientWithMiddleware {
        let reqwest = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        let stack = match self {
            Mode::Sequential => Resilience::new(),
            _ => Resilience::new().coalesce_gets(CoalesceGets::new()),
        };
        stack.build(reqwest).expect("stack")
    }
}

/// `n` GETs: at once, or one after the other. Returns the callers whose history says the
/// request was shared.
async fn gets(client: &ClientWithMiddleware, url: &str, n: usize, at_once: bool) -> usize {
    let one = || async {
        let response = client.get(url).send().await.expect("response");
        let shared = AttemptHistory::of_response(&response).and_then(|h| h.shared());
        assert_eq!(response.status(), 200);
        assert_eq!(&response.bytes().await.expect("body")[..], b"ok");
        usize::from(shared.is_some())
    };
    if at_once {
        futures_util::future::join_all((0..n).map(|_| one()))
            .await
            .into_iter()
            .sum()
    } else {
        let mut shared = 0;
        for _ in 0..n {
            shared += one().await;
        }
        shared
    }
}

#[inline(never)]
fn callgrind_measured(
    rt: &tokio::runtime::Runtime,
    client: &ClientWithMiddleware,
    url: &str,
    n: usize,
    at_once: bool,
) -> usize {
    rt.block_on(gets(client, url, n, at_once))
}

/// Runs `mode` with `n`; returns (requests the server answered, callers shared).
fn child(mode: Mode, n: usize) -> (usize, usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (addr, _server, answered) = start_counting_server();
    let url = format!("http://{addr}/bench");
    let client = rt.block_on(async { mode.client() });
    rt.block_on(gets(&client, &url, WARM_UP, false));
    let before = answered.load(std::sync::atomic::Ordering::SeqCst);
    let shared = callgrind_measured(&rt, &client, &url, n, mode == Mode::Concurrent);
    (
        answered.load(std::sync::atomic::Ordering::SeqCst) - before,
        shared,
    )
}

fn instructions(valgrind: &str, mode: Mode, n: usize) -> Result<f64, String> {
    let dir = std::env::temp_dir();
    let out = dir.join(format!("callgrind.coalesce-{}-{n}.out", mode.arg()));
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let status = Command::new(valgrind)
        .arg("--tool=callgrind")
        .arg("--quiet")
        .arg("--toggle-collect=*callgrind_measured*")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&exe)
        .args([CHILD, mode.arg(), &n.to_string()])
        .status()
        .map_err(|e| format!("running {valgrind}: {e}"))?;
    if !status.success() {
        return Err(format!("{} with {n}: {status}", mode.arg()));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let _ = std::fs::remove_file(&out);
    text.lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .ok_or_else(|| format!("{}: no Ir total", out.display()))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, mode, n] = &args[..]
        && flag == CHILD
    {
        let mode = Mode::ALL
            .into_iter()
            .find(|m| m.arg() == mode)
            .expect("mode");
        child(mode, n.parse().expect("n"));
        return ExitCode::SUCCESS;
    }
    // `cargo bench` passes `--bench`; nothing else is read.
    let n: usize = std::env::var("COALESCE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    let (answered, shared) = child(Mode::Concurrent, 1_000);
    println!(
        "1 000 concurrent identical GETs: the server answered {answered}, {shared} callers shared it, every one got the body"
    );
    assert_eq!((answered, shared), (1, 1_000));
    let valgrind = std::env::var("VALGRIND").unwrap_or_else(|_| "valgrind".into());
    println!("\ninstructions (callgrind, N = {n}):");
    for mode in Mode::ALL {
        let per = match (
            instructions(&valgrind, mode, n),
            instructions(&valgrind, mode, 2 * n),
        ) {
            (Ok(one), Ok(two)) => (two - one) / n as f64,
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        };
        println!("  {:>9.0}  {}", per, mode.title());
    }
    ExitCode::SUCCESS
}
