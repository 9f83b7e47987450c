//! A test's own `tracing` subscriber, beside tests running on other threads.
//!
//! tracing-core keeps one interest per callsite for the whole process, worked out when the
//! callsite is first reached: with at most one subscriber registered, from the subscriber of
//! the thread that reached it. A test thread with none gives `never`, and the callsite then
//! stays silent for every thread, a test's scoped subscriber included (an event lost now and
//! then, depending on which test reached the line first). A process-wide subscriber that
//! enables nothing but answers `sometimes` keeps every callsite asking each event's thread.

use std::sync::Once;

use tracing::subscriber::{DefaultGuard, Interest};
use tracing::{Event, Metadata, Subscriber, span};

/// Makes `subscriber` this thread's default until the guard is dropped, with the
/// process-wide [`Undecided`] subscriber under it.
pub fn scoped(subscriber: impl Subscriber + Send + Sync + 'static) -> DefaultGuard {
    static GLOBAL: Once = Once::new();
    GLOBAL.call_once(|| {
        // Only this helper sets it; a binary whose global default is set elsewhere keeps it.
        let _ = tracing::subscriber::set_global_default(Undecided);
    });
    tracing::subscriber::set_default(subscriber)
}

/// Enables nothing, and leaves every callsite's interest open (`sometimes`).
struct Undecided;

impl Subscriber for Undecided {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        false
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}
