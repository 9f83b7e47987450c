//! A file read as it is sent: the body of a [`ReplayableBody::file`](super::ReplayableBody::file).

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Frame, SizeHint};
use hyper::body::Bytes;
use tokio::io::{AsyncRead, ReadBuf};

use crate::error::UploadBodyError;

/// Bytes read from the file per chunk: one chunk in flight at a time, whatever the
/// file's size.
const CHUNK: usize = 64 * 1024;

/// An opened file, sent as exactly the length it had when opened.
pub(super) struct FileBody {
    path: PathBuf,
    file: tokio::fs::File,
    remaining: u64,
    buf: Vec<u8>,
}

impl FileBody {
    /// Opens `path` and reads its length.
    pub(super) async fn open(path: &Path) -> Result<(FileBody, u64), UploadBodyError> {
        let fail = |e| UploadBodyError::open(path, e);
        let file = tokio::fs::File::open(path).await.map_err(fail)?;
        let meta = file.metadata().await.map_err(fail)?;
        if !meta.is_file() {
            return Err(fail(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        let len = meta.len();
        let body = FileBody {
            path: path.to_owned(),
            file,
            remaining: len,
            buf: Vec::new(),
        };
        Ok((body, len))
    }
}

impl http_body::Body for FileBody {
    type Data = Bytes;
    type Error = UploadBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UploadBodyError>>> {
        let this = self.get_mut();
        if this.remaining == 0 {
            return Poll::Ready(None);
        }
        let want = usize::try_from(this.remaining).map_or(CHUNK, |r| r.min(CHUNK));
        this.buf.resize(want, 0);
        let mut read = ReadBuf::new(&mut this.buf);
        if let Err(e) = ready!(Pin::new(&mut this.file).poll_read(cx, &mut read)) {
            this.remaining = 0;
            return Poll::Ready(Some(Err(UploadBodyError::read(&this.path, e))));
        }
        let filled = read.filled();
        if filled.is_empty() {
            // The file is shorter than the `Content-Length` already sent.
            this.remaining = 0;
            let shrank = std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file shrank while it was sent",
            );
            return Poll::Ready(Some(Err(UploadBodyError::read(&this.path, shrank))));
        }
        this.remaining -= filled.len() as u64;
        Poll::Ready(Some(Ok(Frame::data(Bytes::copy_from_slice(filled)))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}
