//! The address watch: a task that listens to the system's address changes (`if-watch`:
//! netlink on Linux, the system configuration store on macOS, `NotifyIpInterfaceChange`
//! on Windows) and bumps a [`Changes`] count at each one that matters.
//!
//! A link going down or up shows as its IPv6 link-local address going or coming (the
//! kernel removes it on a link down, adds it on a link up): that counts as a change when
//! the interface carries an address that matters (a veth or bridge of a container, with
//! only a link-local address, does not).
//!
//! Started by the first attempt that needs it (a runtime is then running), and ended when
//! the last [`Changes`] handle goes: the task holds only a weak reference and a receiver
//! that closes then, so it never outlives the stack.

use std::collections::HashMap;
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

/// The addresses the machine has now (what `if-watch` will report first as `Up`), each
/// with its interface's name.
fn current_addresses() -> HashMap<IpAddr, Option<String>> {
    if_addrs::get_if_addrs()
        .map(|all| all.into_iter().map(|i| (i.ip(), Some(i.name))).collect())
        .unwrap_or_default()
}

/// Whether `addr`'s coming (`up`) or going changes the paths: an address that matters, or a
/// link-local one (its link up or down) of an interface that carries one that matters.
/// `known` is the snapshot before the event for a going address, after it for a coming one;
/// an address whose interface could not be read (it went before the watch read it: a link
/// down right after it came up) counts as a change when it goes, not when it comes.
fn is_change(addr: IpAddr, up: bool, known: &HashMap<IpAddr, Option<String>>) -> bool {
    if matters(addr) {
        return true;
    }
    match known.get(&addr) {
        None => false,
        Some(None) => !up,
        Some(Some(interface)) => known
            .iter()
            .any(|(other, name)| name.as_ref() == Some(interface) && matters(*other)),
    }
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
    mut known: HashMap<IpAddr, Option<String>>,
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
            Ok(if_watch::IfEvent::Up(net)) => {
                let addr = net.addr();
                // The interface's name is not in the event: read it from the system.
                let named = current_addresses().remove(&addr).flatten();
                let new = known.insert(addr, named).is_none();
                new && is_change(addr, true, &known)
            }
            Ok(if_watch::IfEvent::Down(net)) => {
                let addr = net.addr();
                let change = is_change(addr, false, &known);
                known.remove(&addr).is_some() && change
            }
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

    #[test]
    fn a_link_local_address_is_a_change_only_on_an_interface_with_one_that_matters() {
        let known: HashMap<IpAddr, Option<String>> = [
            ("198.18.0.2", Some("wlan0")),
            ("fe80::1", Some("wlan0")),
            ("fe80::2", Some("veth7")),
            ("fe80::3", None),
            ("127.0.0.1", Some("lo")),
        ]
        .into_iter()
        .map(|(a, n)| (a.parse().unwrap(), n.map(str::to_string)))
        .collect();
        let change = |a: &str, up| is_change(a.parse().unwrap(), up, &known);
        assert!(change("fe80::1", true) && change("fe80::1", false));
        assert!(!change("fe80::2", true) && !change("fe80::2", false));
        assert!(!change("fe80::3", true), "its interface unread, coming");
        assert!(change("fe80::3", false), "its interface unread, going");
        assert!(!change("127.0.0.1", false));
        assert!(!change("fe80::9", false), "unknown");
        assert!(change("10.1.2.3", true));
    }
}
