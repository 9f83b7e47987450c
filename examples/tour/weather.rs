//! The tour's network-weather scenes (`reqwest_resilience::network`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use reqwest_resilience::network::Network;
use reqwest_resilience::{FailureKind, SendWithHistory};

use super::common::{FlakyServer, Reply};
use super::{BoxError, Tour, demo_stack, outcome, print_history};

/// A GET waits on a connection whose path died while the laptop slept; at the wake the
/// stack retires the connections opened before it and sends the GET again at once.
pub(super) async fn dropped_path(tour: &mut Tour) -> Result<(), BoxError> {
    println!(
        "\n24. A GET stuck on a connection whose path died in a sleep: at the wake, sent again at once"
    );
    // The first request is never answered (its path is gone); the others are.
    let server = FlakyServer::start(|i, _| match i {
        0 => Reply::After(Duration::from_secs(3600), Box::new(Reply::ok("late"))),
        _ => Reply::ok("fresh"),
    })
    .await?;
    // The stack's wall clock, made to jump an hour ahead: to the stack, a wake from sleep.
    let ahead = Arc::new(AtomicU64::new(0));
    let clock = {
        let ahead = ahead.clone();
        move || SystemTime::now() + Duration::from_secs(ahead.load(Ordering::SeqCst))
    };
    let client = demo_stack()?
        .network(Network::new().wall_clock(clock))
        .build_from(reqwest::Client::builder)?;
    let stuck = tokio::spawn({
        let (client, url) = (client.clone(), server.url("/feed"));
        async move { client.get(url).send_with_history().await }
    });
    while server.requests() < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ahead.store(3600, Ordering::SeqCst);
    let woke = Instant::now();
    // The first request after the wake notices it.
    let _ = client.get(server.url("/status")).send().await?;
    let exchange = stuck.await?;
    let answered_after = woke.elapsed();
    print_history(&exchange.history);
    let first = exchange
        .history
        .attempts()
        .first()
        .map(|r| r.evidence.failure);
    tour.check(
        "dropped path: cut at the wake",
        format!("{:?}", Some(FailureKind::NetworkChanged)),
        format!("{:?}", first.flatten()),
    );
    tour.check(
        "dropped path: sent again at once",
        "2 attempts, 200, < 2 s",
        format!(
            "{} attempts, {}, {}",
            exchange.history.len(),
            outcome(&exchange.result),
            if answered_after < Duration::from_secs(2) {
                "< 2 s".to_owned()
            } else {
                format!("{answered_after:.1?}")
            }
        ),
    );
    Ok(())
}
