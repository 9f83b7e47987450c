//! Walking an error's `source()` chain, including the links the standard walk skips.
//!
//! Two common wrappers hide the error they wrap from a plain `source()` walk:
//!
//! - `io::Error::source()` returns the *wrapped* error's source, so the wrapped error itself
//!   (rustls's `InvalidData` inside hyper-rustls's `Other`, a `reqwest::Error` inside the
//!   `io::Error` that `bytes_stream()` readers see, a `hyper::Error` inside an `io::Error`)
//!   is reached only through `io::Error::get_ref`;
//! - `reqwest_middleware::Error` is `#[error(transparent)]`: its `source()` is its inner
//!   error's source, so the `reqwest::Error` it wraps is skipped (so is the astral fork's
//!   copy of it, walked the same way with feature `astral`).
//!
//! [`find`] walks every error of the chain once, these included (at most 32 of them), and
//! returns the first of a type: `find::<reqwest::Error>`, `find::<h2::Error>`,
//! `find::<io::Error>`, … A [`RetryStrategy`](crate::retry::RetryStrategy) reads the same
//! chain through its [`AttemptContext`](crate::retry::AttemptContext), which also asks
//! whether an `io::ErrorKind` is anywhere in it
//! ([`has_io_kind`](crate::retry::AttemptContext::has_io_kind)). `find` takes
//! `&(dyn Error + 'static)`, the form every error type turns into (`&err as &dyn Error`,
//! `anyhow::Error::as_ref`, `Box<dyn Error>::as_ref`).
//!
//! ```
//! use std::io;
//! use reqwest_resilience::chain;
//!
//! #[derive(Debug)]
//! struct Refused;
//! impl std::fmt::Display for Refused {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         f.write_str("refused")
//!     }
//! }
//! impl std::error::Error for Refused {}
//!
//! // `io::Error::source()` skips the error it wraps; `find` does not.
//! let outer = io::Error::other(Refused);
//! assert!(std::error::Error::source(&outer).is_none());
//! assert!(chain::find::<Refused>(&outer).is_some());
//! ```

use std::error::Error as StdError;
use std::io;

/// How deep `links` walks: no connector or client builds a chain deeper than this, and a
/// cyclic `source()` (a bug, but reachable through user types) must not loop forever.
pub(crate) const MAX_DEPTH: usize = 32;

/// Every error of `err`'s chain, `err` first, at most 32 of them; descends into
/// the error an `io::Error` or a `reqwest_middleware::Error` wraps (see the module docs).
pub(crate) fn links<'a>(
    err: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> + 'a {
    let mut next = Some(err);
    std::iter::from_fn(move || {
        let current = next?;
        next = below(current);
        Some(current)
    })
    .take(MAX_DEPTH)
}

/// The error below `e` in the chain.
fn below<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a (dyn StdError + 'static)> {
    if let Some(io) = e.downcast_ref::<io::Error>()
        && let Some(inner) = io.get_ref()
    {
        return Some(inner as &(dyn StdError + 'static));
    }
    if let Some(mw) = e.downcast_ref::<reqwest_middleware::Error>() {
        return Some(match mw {
            reqwest_middleware::Error::Reqwest(inner) => inner as &(dyn StdError + 'static),
            reqwest_middleware::Error::Middleware(inner) => inner.as_ref(),
        });
    }
    // The astral fork's copy of it, likewise transparent.
    #[cfg(feature = "astral")]
    if let Some(mw) = e.downcast_ref::<astral_reqwest_middleware::Error>() {
        return Some(match mw {
            astral_reqwest_middleware::Error::Reqwest(inner) => inner as &(dyn StdError + 'static),
            astral_reqwest_middleware::Error::Middleware(inner) => inner.as_ref(),
        });
    }
    e.source()
}

/// The first error of type `T` in `err`'s chain.
pub fn find<'a, T: StdError + 'static>(err: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    links(err).find_map(|e| e.downcast_ref::<T>())
}

/// The `reqwest::Error` in `err`'s chain, wherever it is (behind a middleware's
/// `anyhow::Error`, inside the `io::Error` a body reader returns).
pub(crate) fn reqwest_error<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a reqwest::Error> {
    find::<reqwest::Error>(err)
}

/// The kinds of every `io::Error` in `err`'s chain, outermost first.
pub(crate) fn io_kinds<'a>(
    err: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = io::ErrorKind> + 'a {
    links(err).filter_map(|e| {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return Some(io.kind());
        }
        // An h2 error over a broken connection carries the `io::Error` without exposing it
        // as its `source()`.
        e.downcast_ref::<h2::Error>()
            .and_then(h2::Error::get_io)
            .map(io::Error::kind)
    })
}

/// Whether an `io::Error` of one of `kinds` is anywhere in `err`'s chain.
pub(crate) fn has_io_kind(err: &(dyn StdError + 'static), kinds: &[io::ErrorKind]) -> bool {
    io_kinds(err).any(|k| kinds.contains(&k))
}

/// The reason of the first HTTP/2 error in `err`'s chain that has one (a `RST_STREAM`'s or a
/// `GOAWAY`'s code, sent or received).
pub(crate) fn h2_reason(err: &(dyn StdError + 'static)) -> Option<h2::Reason> {
    links(err)
        .filter_map(|e| e.downcast_ref::<h2::Error>())
        .find_map(h2::Error::reason)
}

/// The display text of every error of the chain, outermost first, without repeats (many
/// wrappers print their inner error's text as their own).
pub(crate) fn messages(err: &(dyn StdError + 'static)) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for e in links(err) {
        let text = e.to_string();
        if out.last() != Some(&text) {
            out.push(text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;

    /// The module's former example (`links` and `has_io_kind` were public).
    #[test]
    fn an_io_error_inside_an_io_error() {
        let inner = io::Error::new(io::ErrorKind::ConnectionReset, "peer reset");
        let outer = io::Error::other(inner);
        assert!(has_io_kind(&outer, &[io::ErrorKind::ConnectionReset]));
        // The outer error, the inner one, and the message the inner one wraps.
        assert_eq!(links(&outer).count(), 3);
    }

    #[derive(Debug)]
    struct Cycle;
    impl fmt::Display for Cycle {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("cycle")
        }
    }
    impl StdError for Cycle {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            // A buggy type whose source is itself: the walk must end.
            Some(&Cycle)
        }
    }

    #[test]
    fn a_cyclic_source_ends_at_the_depth_bound() {
        assert_eq!(links(&Cycle).count(), MAX_DEPTH);
        assert_eq!(messages(&Cycle), vec!["cycle".to_string()]);
    }

    #[test]
    fn nested_io_errors_are_all_visited() {
        let inner = io::Error::new(io::ErrorKind::InvalidData, "alert");
        let outer = io::Error::other(inner);
        let kinds: Vec<_> = io_kinds(&outer).collect();
        assert_eq!(
            kinds,
            vec![io::ErrorKind::Other, io::ErrorKind::InvalidData]
        );
        assert!(!has_io_kind(&outer, &[io::ErrorKind::TimedOut]));
        assert_eq!(messages(&outer), vec!["alert".to_string()]);
    }

    #[test]
    fn a_middleware_error_exposes_what_it_wraps() {
        let err = reqwest_middleware::Error::middleware(io::Error::new(
            io::ErrorKind::BrokenPipe,
            "pipe",
        ));
        assert!(has_io_kind(&err, &[io::ErrorKind::BrokenPipe]));
        assert!(find::<io::Error>(&err).is_some());
        assert!(reqwest_error(&err).is_none());
        assert_eq!(h2_reason(&err), None);
    }

    #[cfg(feature = "astral")]
    #[test]
    fn the_astral_forks_error_exposes_what_it_wraps() {
        let err = astral_reqwest_middleware::Error::middleware(io::Error::new(
            io::ErrorKind::BrokenPipe,
            "pipe",
        ));
        assert!(has_io_kind(&err, &[io::ErrorKind::BrokenPipe]));
        // The fork's error, the io::Error it wraps, and that one's message.
        assert_eq!(links(&err).count(), 3);
        assert!(find::<io::Error>(&err).is_some());
    }

    #[test]
    fn an_h2_reason_is_found_behind_an_io_error() {
        let h2: h2::Error = h2::Reason::REFUSED_STREAM.into();
        let wrapped = io::Error::other(h2);
        assert_eq!(h2_reason(&wrapped), Some(h2::Reason::REFUSED_STREAM));
    }
}
