//! [`Changes`]: how often the network changed, for every attempt of one stack.

/// How often the network changed: a count every attempt reads, and a channel that
/// wakes attempts waiting on connections opened before a change.
#[derive(Debug)]
pub(crate) struct Changes {
    count: tokio::sync::watch::Sender<u64>,
}

impl Changes {
    pub(crate) fn new() -> Self {
        Changes {
            count: tokio::sync::watch::Sender::new(0),
        }
    }

    /// One more change.
    pub(crate) fn bump(&self) {
        self.count.send_modify(|n| *n += 1);
        #[cfg(feature = "tracing")]
        tracing::debug!(
            generation = *self.count.borrow(),
            "network changed: connections opened before it are retired"
        );
    }

    /// The changes so far.
    pub(crate) fn now(&self) -> u64 {
        *self.count.borrow()
    }

    /// A receiver that sees each later change, and closes when the stack is gone.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.count.subscribe()
    }
}
