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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;

    fn temp(name: &str, len: usize) -> PathBuf {
        let path = std::env::temp_dir().join(format!(
            "reqwest-resilience-file-body-{}-{name}",
            std::process::id()
        ));
        std::fs::write(&path, vec![5u8; len]).unwrap();
        path
    }

    /// Polls the body to its end: the bytes read, and the error it ended with.
    async fn drain(mut body: FileBody) -> (usize, Option<UploadBodyError>) {
        let mut read = 0;
        loop {
            let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
            match frame {
                None => return (read, None),
                Some(Err(e)) => return (read, Some(e)),
                Some(Ok(frame)) => {
                    let chunk = frame.into_data().unwrap();
                    assert!(chunk.len() <= CHUNK);
                    read += chunk.len();
                }
            }
        }
    }

    #[tokio::test]
    async fn a_file_is_read_whole_in_chunks_with_its_length() {
        let path = temp("whole", 3 * CHUNK + 5);
        let (body, len) = FileBody::open(&path).await.unwrap();
        assert_eq!(len, 3 * CHUNK as u64 + 5);
        assert_eq!(body.size_hint().exact(), Some(len));
        let (read, error) = drain(body).await;
        assert_eq!(read, 3 * CHUNK + 5);
        assert!(error.is_none(), "{error:?}");
        let _ = std::fs::remove_file(&path);
    }

    #[tokio::test]
    async fn a_file_that_shrank_while_sent_is_a_read_error() {
        let path = temp("shrank", 4 * CHUNK);
        let (body, _) = FileBody::open(&path).await.unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(CHUNK as u64 + 1)
            .unwrap();
        let (read, error) = drain(body).await;
        assert_eq!(read, CHUNK + 1);
        let error = error.expect("the short file is an error");
        assert!(!error.is_open());
        assert_eq!(error.path(), Some(path.as_path()));
        assert_eq!(
            error.io_error().map(std::io::Error::kind),
            Some(std::io::ErrorKind::UnexpectedEof)
        );
        let _ = std::fs::remove_file(&path);
    }

    #[tokio::test]
    async fn a_missing_file_or_a_directory_cannot_be_opened() {
        let missing = std::env::temp_dir().join("reqwest-resilience-file-body-none");
        let Err(e) = FileBody::open(&missing).await else {
            panic!("opened a missing file")
        };
        assert!(e.is_open());
        assert_eq!(
            e.io_error().map(std::io::Error::kind),
            Some(std::io::ErrorKind::NotFound)
        );
        let Err(e) = FileBody::open(&std::env::temp_dir()).await else {
            panic!("opened a directory")
        };
        assert!(e.is_open());
        assert_eq!(
            e.io_error().map(std::io::Error::kind),
            Some(std::io::ErrorKind::InvalidInput)
        );
        assert_eq!(
            e.to_string(),
            format!(
                "the upload body {} could not be opened",
                std::env::temp_dir().display()
            )
        );
    }
}
