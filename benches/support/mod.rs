//! What the benches that compare whole stacks share (`stack.rs`, `instructions.rs`): the
//! keep-alive loopback server and the two middlewares that need configuring. A directory
//! module, so cargo does not take it for a bench target of its own.

use std::net::SocketAddr;

use reqwest_resilience::{AccessToken, BearerAuth, Origin, TokenManager};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// A keep-alive HTTP/1.1 server on `127.0.0.1`, on a runtime of its own (one worker
/// thread), answering every request of every connection with the same `200 ok`. The
/// server stops when the returned runtime is dropped.
pub fn start_server() -> (SocketAddr, tokio::runtime::Runtime) {
    let (addr, rt, _) = start_counting_server();
    (addr, rt)
}

/// [`start_server`], with the count of requests it answered.
pub fn start_counting_server() -> (
    SocketAddr,
    tokio::runtime::Runtime,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = answered.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("server runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("addr");
    rt.spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let mut filled = 0;
                loop {
                    match stream.read(&mut buf[filled..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => filled += n,
                    }
                    // GETs without bodies: answer every complete head received.
                    while let Some(end) = buf[..filled].windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.copy_within(end + 4..filled, 0);
                        filled -= end + 4;
                        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if stream.write_all(RESPONSE).await.is_err() {
                            return;
                        }
                    }
                    if filled == buf.len() {
                        return;
                    }
                }
            });
        }
    });
    (addr, rt, answered)
}

/// `BearerAuth` for `url`'s origin, with a token that never expires (fetched once, on the
/// first request: the benches warm up before they measure).
pub fn bearer(url: &str) -> BearerAuth {
    let tokens = TokenManager::new(|| async {
        Ok::<_, std::io::Error>(AccessToken::new("benchmark-token"))
    });
    BearerAuth::builder(tokens)
        .origin(Origin::parse(url).expect("origin"))
        .allow_http_on_loopback()
        .build()
        .expect("bearer")
}

/// reqwest-retry 0.9's middleware as its README sets it up: exponential backoff, 3 retries.
pub fn reqwest_retry_middleware()
-> reqwest_retry::RetryTransientMiddleware<reqwest_retry::policies::ExponentialBackoff> {
    let policy = reqwest_retry::policies::ExponentialBackoff::builder().build_with_max_retries(3);
    reqwest_retry::RetryTransientMiddleware::new_with_policy(policy)
}
