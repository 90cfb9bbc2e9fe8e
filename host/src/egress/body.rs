//! A response body as a handler reads it: cut at the route's size limit,
//! and optionally failed when the server pauses too long between frames.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// Why reading a response body stopped early.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The body is longer than the route's `max_response_bytes`.
    #[error("response body is larger than the route's limit of {limit} bytes")]
    TooLarge { limit: u64 },
    /// No frame arrived within the between-bytes timeout.
    #[error("no response data for {0:?}")]
    Stalled(Duration),
    /// The connection failed mid-body.
    #[error("response body failed: {0}")]
    Transport(String),
}

/// `Incoming`, with a byte limit and an optional between-frames timeout.
pub struct LimitedBody {
    inner: Incoming,
    limit: u64,
    read: u64,
    stall: Option<(Duration, Pin<Box<Sleep>>)>,
    failed: bool,
}

impl LimitedBody {
    pub fn new(inner: Incoming, limit: u64, between_bytes: Option<Duration>) -> LimitedBody {
        LimitedBody {
            inner,
            limit,
            read: 0,
            stall: between_bytes.map(|d| (d, Box::pin(tokio::time::sleep(d)))),
            failed: false,
        }
    }
}

impl Body for LimitedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.read += data.len() as u64;
                    if self.read > self.limit {
                        self.failed = true;
                        let limit = self.limit;
                        return Poll::Ready(Some(Err(BodyError::TooLarge { limit })));
                    }
                }
                if let Some((wait, sleep)) = &mut self.stall {
                    sleep.as_mut().reset(Instant::now() + *wait);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.failed = true;
                Poll::Ready(Some(Err(BodyError::Transport(e.to_string()))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                if let Some((wait, sleep)) = &mut self.stall
                    && sleep.as_mut().poll(cx).is_ready()
                {
                    let wait = *wait;
                    self.failed = true;
                    return Poll::Ready(Some(Err(BodyError::Stalled(wait))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
