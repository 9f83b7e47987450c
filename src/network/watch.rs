//! The address watch: a task that listens to the system's address changes (`if-watch`:
//! netlink on Linux, the system configuration store on macOS, `NotifyIpInterfaceChange`
//! on Windows) and bumps a [`Changes`] count at each one that matters.
//!
//! Started by the first attempt that needs it (a runtime is then running), and ended when
//! the last [`Changes`] handle goes: the task holds only a weak reference and a receiver
//! that closes then, so it never outlives the stack.

use std::collections::HashSet;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Weak};

use super::changes::Changes;

/// Whether an address's coming or going changes the paths connections take: loopback and
/// link-local addresses do not carry connections to servers.
fn matters(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(a) => !a.is_loopback() && !a.is_link_local(),
        IpAddr::V6(a) => !a.is_loopback() && (a.segments()[0] & 0xffc0) != 0xfe80,
    }
}

/// The addresses the machine has now (what `if-watch` will report first as `Up`).
fn current_addresses() -> HashSet<IpAddr> {
    if_addrs::get_if_addrs()
        .map(|all| all.into_iter().map(|i| i.ip()).collect())
        .unwrap_or_default()
}

/// Starts the watch for `changes` on the current runtime; `false` when the system offers
/// none (no netlink socket: a sandbox), which leaves the suspend check alone at work.
pub(crate) fn start(changes: &Arc<Changes>) -> bool {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return false;
    };
    // The snapshot before the watcher: its first report lists every address, and only
    // one that was not there before (or any that goes) is a change.
    let known = current_addresses();
    let Ok(watcher) = if_watch::tokio::IfWatcher::new() else {
        return false;
    };
    let weak = Arc::downgrade(changes);
    let gone = changes.subscribe();
    handle.spawn(watch(watcher, known, weak, gone));
    true
}

async fn watch(
    mut watcher: if_watch::tokio::IfWatcher,
    mut known: HashSet<IpAddr>,
    changes: Weak<Changes>,
    mut gone: tokio::sync::watch::Receiver<u64>,
) {
    // Ends when the stack is gone (the sender dropped); our own bumps are passed over.
    let mut stack_gone = Box::pin(async move { while gone.changed().await.is_ok() {} });
    loop {
        let event = std::future::poll_fn(|cx| {
            if stack_gone.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(None);
            }
            watcher.poll_if_event(cx).map(Some)
        })
        .await;
        let Some(event) = event else {
            return;
        };
        let changed = match event {
            Ok(if_watch::IfEvent::Up(net)) => known.insert(net.addr()) && matters(net.addr()),
            Ok(if_watch::IfEvent::Down(net)) => known.remove(&net.addr()) && matters(net.addr()),
            // The system's socket failed: nothing more will come.
            Err(_) => return,
        };
        if changed {
            let Some(changes) = changes.upgrade() else {
                return;
            };
            changes.bump();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_link_local_addresses_do_not_matter() {
        for a in ["127.0.0.1", "::1", "169.254.3.4", "fe80::1"] {
            assert!(!matters(a.parse().unwrap()), "{a}");
        }
        for a in ["198.18.0.1", "2001:db8::1", "10.0.0.7"] {
            assert!(matters(a.parse().unwrap()), "{a}");
        }
    }
}
