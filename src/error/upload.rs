//! [`UploadBodyError`]: a replayable upload body that could not be opened or read (see
//! [`crate::upload`]).

use std::error::Error as StdError;
use std::fmt;
use std::path::{Path, PathBuf};

/// A [`ReplayableBody`](crate::upload::ReplayableBody) that could not be opened for an
/// attempt, or broke while it was read.
///
/// Opening happens before the attempt leaves (the file, its length): such an attempt was
/// never sent (`Transmission::NotSent`, [`FailureKind::Builder`](crate::FailureKind::Builder))
/// and is not retried (a file that is missing now stays missing). It reaches the caller
/// as [`ResilienceError::UploadBody`](crate::ResilienceError::UploadBody). A read that
/// fails later (the file shrank, an I/O error) happens while the body is on the wire:
/// reqwest reports it as a body error with this error as its source. An error a closure's
/// stream yields arrives the same way, kept as this error's `source()`. Either is the
/// caller's failure, not the server's: the attempt's kind is
/// [`FailureKind::UploadBody`](crate::FailureKind::UploadBody) (its transmission what the
/// wire showed, `Unknown`), neutral for the origin's breaker, and the request is not
/// retried (a retry would open the same broken source again). Find it with
/// [`chain::find`](crate::chain::find)`::<UploadBodyError>(&err)`.
#[derive(Debug)]
pub struct UploadBodyError {
    path: Option<PathBuf>,
    during: During,
    source: Box<dyn StdError + Send + Sync>,
}

/// When the body failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum During {
    Open,
    Read,
}

impl UploadBodyError {
    /// Opening `path` (or reading its length) failed.
    pub(crate) fn open(path: &Path, source: std::io::Error) -> Self {
        UploadBodyError {
            path: Some(path.to_owned()),
            during: During::Open,
            source: Box::new(source),
        }
    }

    /// Reading `path` failed after the body was opened.
    pub(crate) fn read(path: &Path, source: std::io::Error) -> Self {
        UploadBodyError {
            path: Some(path.to_owned()),
            during: During::Read,
            source: Box::new(source),
        }
    }

    /// A closure's stream yielded `source` ([`ReplayableBody::from_fn`](crate::upload::ReplayableBody::from_fn)).
    pub(crate) fn stream(source: Box<dyn StdError + Send + Sync>) -> Self {
        UploadBodyError {
            path: None,
            during: During::Read,
            source,
        }
    }

    /// The file, for a body read from one (`None`: a body made by a closure).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Whether the body could not be opened (then the attempt was never sent); `false`
    /// when it broke while it was read.
    pub fn is_open(&self) -> bool {
        self.during == During::Open
    }

    /// The I/O error beneath, when there is one (a file's, or a closure's stream's
    /// `std::io::Error`).
    pub fn io_error(&self) -> Option<&std::io::Error> {
        self.source.downcast_ref()
    }
}

impl fmt::Display for UploadBodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.during {
            During::Open => "could not be opened",
            During::Read => "could not be read",
        };
        match &self.path {
            Some(path) => write!(f, "the upload body {} {what}", path.display()),
            None => write!(f, "the upload body {what}"),
        }
    }
}

impl StdError for UploadBodyError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}
