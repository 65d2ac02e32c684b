//! A backend's answer as it comes off the connection: its head, parsed once
//! (status and framing; the gateway writes its own headers), and its body,
//! decoded as the caller polls it: a declared length, chunks, or everything
//! until the backend closes. A body read to its end puts its connection back in
//! the pool; one dropped before (a client gone) closes it, which tells an engine
//! to free the slot.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Bytes;
use axum::http::StatusCode;
use bytes::{Buf, BytesMut};
use http_body::{Frame, SizeHint};

use super::{Conn, Host};

/// The most bytes a head may take; a backend that sends more is broken.
const MAX_HEAD: usize = 64 * 1024;

/// Headers read in one head, at most.
const MAX_HEADERS: usize = 100;

/// How the end of a body is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// This many bytes are left (`Content-Length`).
    Length(u64),
    /// `Transfer-Encoding: chunked`, at this point of a chunk.
    Chunked(Chunk),
    /// Neither: the body ends when the backend closes the connection.
    Close,
    /// Read to its end, or failed.
    Done,
}

/// Where a chunked body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// A chunk's size line comes next.
    Size,
    /// This many bytes of the current chunk are left.
    Data(u64),
    /// The line end after a chunk's data.
    DataEnd,
    /// After the last (empty) chunk: trailers, then an empty line.
    Trailers,
}

/// The head of an answer: its status, how its body ends, and whether the
/// connection may carry another request after it.
#[derive(Debug)]
pub(super) struct Head {
    pub status: StatusCode,
    framing: Framing,
    keep: bool,
    /// The stream marks its tokens ([`slotgate_protocol::resume::MARK_HEADER`]).
    pub marked: bool,
}

/// Why a head could not be read.
#[derive(Debug)]
pub(super) enum HeadError {
    /// Not one byte came before the connection ended: a pooled connection that
    /// the backend had closed, if it was pooled.
    Nothing(String),
    /// The head was cut short or is not HTTP.
    Broken(String),
}

/// Why a body could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The socket failed.
    #[error("reading the answer: {0}")]
    Io(#[from] std::io::Error),
    /// The backend closed the connection before the end it had announced.
    #[error("the backend closed the connection before the end of the answer")]
    Closed,
    /// A chunk's framing is not HTTP/1.1.
    #[error("the backend sent an invalid chunk")]
    BadChunk,
}

/// Reads the next final head off `conn`, skipping informational ones
/// (`100 Continue`, `103 Early Hints`).
pub(super) async fn read_head(conn: &mut Conn) -> Result<Head, HeadError> {
    let mut got_any = !conn.buf.is_empty();
    loop {
        if !conn.buf.is_empty() {
            if let Some((len, head)) = parse_head(&conn.buf)? {
                conn.buf.advance(len);
                if head.status.is_informational() {
                    continue;
                }
                return Ok(head);
            }
            if conn.buf.len() > MAX_HEAD {
                return Err(HeadError::Broken("the answer's head is too large".into()));
            }
        }
        match std::future::poll_fn(|cx| conn.poll_fill(cx)).await {
            Ok(0) if !got_any => return Err(HeadError::Nothing("the connection closed".into())),
            Ok(0) => return Err(HeadError::Broken("the connection closed within a head".into())),
            Ok(_) => got_any = true,
            Err(e) if !got_any => return Err(HeadError::Nothing(e.to_string())),
            Err(e) => return Err(HeadError::Broken(e.to_string())),
        }
    }
}

/// A complete head at the start of `buf` and its length; `None` while partial.
fn parse_head(buf: &[u8]) -> Result<Option<(usize, Head)>, HeadError> {
    let broken = |why: String| HeadError::Broken(why);
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let len = match response.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(broken(format!("not an HTTP answer: {e}"))),
    };
    let code = response.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|_| broken(format!("status {code}")))?;
    // HTTP/1.1 keeps the connection unless told otherwise; 1.0 only if told to.
    let mut keep = response.version == Some(1);
    let mut length: Option<u64> = None;
    let (mut encoded, mut chunked, mut marked) = (false, false, false);
    for header in response.headers.iter() {
        let name = header.name;
        if name.eq_ignore_ascii_case(slotgate_protocol::resume::MARK_HEADER) {
            marked = true;
        } else if name.eq_ignore_ascii_case("content-length") {
            let n =
                parse_length(header.value).ok_or_else(|| broken("bad content-length".into()))?;
            if length.is_some_and(|l| l != n) {
                return Err(broken("conflicting content-length".into()));
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            encoded = true;
            // Only the last coding says how the message ends (RFC 9112, 6.3).
            let last = header.value.rsplit(|b| *b == b',').next().unwrap_or_default();
            chunked = last.trim_ascii().eq_ignore_ascii_case(b"chunked");
        } else if name.eq_ignore_ascii_case("connection") {
            for token in header.value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    keep = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && response.version == Some(0) {
                    keep = true;
                }
            }
        }
    }
    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let framing = if bodiless {
        Framing::Length(0)
    } else if encoded {
        // A length beside a coding is ignored, and the connection not trusted again.
        keep &= length.is_none() && chunked;
        if chunked {
            Framing::Chunked(Chunk::Size)
        } else {
            Framing::Close
        }
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        keep = false;
        Framing::Close
    };
    Ok(Some((len, Head { status, framing, keep, marked })))
}

/// A `Content-Length` value: digits only.
fn parse_length(value: &[u8]) -> Option<u64> {
    let value = value.trim_ascii();
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// The body of an answer, read from its connection as it is polled.
pub struct Body {
    conn: Option<Conn>,
    host: Arc<Host>,
    framing: Framing,
    keep: bool,
}

/// What the chunk decoder found in the buffer.
enum Step {
    Data(Bytes),
    More,
    End,
}

impl Body {
    /// Gives up the rest of the answer: its connection is closed, not pooled,
    /// which tells an engine to stop the request and free its slot.
    pub fn abandon(&mut self) {
        self.conn = None;
        self.framing = Framing::Done;
    }

    pub(super) fn new(head: &Head, conn: Conn, host: Arc<Host>) -> Self {
        let mut body = Self { conn: Some(conn), host, framing: head.framing, keep: head.keep };
        if body.framing == Framing::Length(0) {
            body.finish();
        }
        body
    }

    /// The next piece of data already buffered; with `data_ok` false, only the
    /// framing is read on, so that an end already received is seen at once.
    fn next(&mut self, data_ok: bool) -> Result<Option<Bytes>, BodyError> {
        let Some(conn) = self.conn.as_mut() else { return Ok(None) };
        let buf = &mut conn.buf;
        let (data, end) = match &mut self.framing {
            Framing::Done => (None, false),
            Framing::Length(left) => {
                let n = if data_ok { (*left).min(buf.len() as u64) } else { 0 };
                *left -= n;
                // `n` is at most `buf.len()`: the cast cannot truncate.
                let data = (n > 0).then(|| buf.split_to(n as usize).freeze());
                (data, *left == 0)
            }
            Framing::Close => ((data_ok && !buf.is_empty()).then(|| buf.split().freeze()), false),
            Framing::Chunked(state) => match chunked(state, buf, data_ok)? {
                Step::Data(data) => (Some(data), false),
                Step::More => (None, false),
                Step::End => (None, true),
            },
        };
        if end {
            self.finish();
        }
        Ok(data)
    }

    /// Read to the end: the connection serves another request, if it may and
    /// nothing unasked-for followed the answer.
    fn finish(&mut self) {
        self.framing = Framing::Done;
        if let Some(conn) = self.conn.take() {
            if self.keep && conn.buf.is_empty() {
                self.host.put(conn);
            }
        }
    }

    /// The answer cannot be read on: its connection is closed.
    fn fail(&mut self, err: BodyError) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.framing = Framing::Done;
        self.conn = None;
        Poll::Ready(Some(Err(err)))
    }
}

/// Decodes what `buf` holds of a chunked body, from `state`.
fn chunked(state: &mut Chunk, buf: &mut BytesMut, data_ok: bool) -> Result<Step, BodyError> {
    loop {
        match *state {
            Chunk::Size => match httparse::parse_chunk_size(buf) {
                Ok(httparse::Status::Complete((n, size))) => {
                    buf.advance(n);
                    *state = if size == 0 { Chunk::Trailers } else { Chunk::Data(size) };
                }
                Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                    return Err(BodyError::BadChunk)
                }
                Ok(httparse::Status::Partial) => return Ok(Step::More),
                Err(_) => return Err(BodyError::BadChunk),
            },
            Chunk::Data(_) if !data_ok || buf.is_empty() => return Ok(Step::More),
            Chunk::Data(left) => {
                let n = left.min(buf.len() as u64);
                *state = if n == left { Chunk::DataEnd } else { Chunk::Data(left - n) };
                return Ok(Step::Data(buf.split_to(n as usize).freeze()));
            }
            Chunk::DataEnd if buf.len() < 2 => return Ok(Step::More),
            Chunk::DataEnd => {
                if &buf[..2] != b"\r\n" {
                    return Err(BodyError::BadChunk);
                }
                buf.advance(2);
                *state = Chunk::Size;
            }
            Chunk::Trailers => match buf.windows(2).position(|w| w == b"\r\n") {
                Some(0) => {
                    buf.advance(2);
                    return Ok(Step::End);
                }
                // A trailer field: the gateway has no use for it.
                Some(i) => buf.advance(i + 2),
                None if buf.len() > MAX_HEAD => return Err(BodyError::BadChunk),
                None => return Ok(Step::More),
            },
        }
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        loop {
            match this.next(true) {
                Err(err) => return this.fail(err),
                Ok(Some(data)) => {
                    // The end may have come with the data: see it now, so that the
                    // connection is pooled without another poll. A framing error
                    // here is met again, and reported, on the next poll.
                    let _ = this.next(false);
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(None) if this.framing == Framing::Done => return Poll::Ready(None),
                Ok(None) => {}
            }
            let Some(conn) = this.conn.as_mut() else { return Poll::Ready(None) };
            match conn.poll_fill(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) if this.framing == Framing::Close => {
                    this.keep = false;
                    this.finish();
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(0)) => return this.fail(BodyError::Closed),
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return this.fail(BodyError::Io(e)),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.framing == Framing::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            Framing::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Head {
        parse_head(text.as_bytes()).ok().flatten().expect("a complete head").1
    }

    #[test]
    fn heads_say_how_their_bodies_end() {
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n");
        assert_eq!((h.status.as_u16(), h.framing, h.keep), (200, Framing::Length(12), true));
        let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
        assert_eq!((h.framing, h.keep), (Framing::Chunked(Chunk::Size), true));
        let h =
            head("HTTP/1.1 200 OK\r\nconnection: keep-alive, close\r\ncontent-length: 1\r\n\r\n");
        assert!(!h.keep);
        let h = head("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!((h.framing, h.keep), (Framing::Close, false));
        let h = head("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n");
        assert!(!h.keep);
        let h = head("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\ncontent-length: 1\r\n\r\n");
        assert!(h.keep);
        let h = head("HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n");
        assert_eq!(h.framing, Framing::Length(0));
        // Both: the coding wins, and the connection is not used again.
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n");
        assert_eq!((h.framing, h.keep), (Framing::Chunked(Chunk::Size), false));
    }

    #[test]
    fn bad_heads_are_refused_and_partial_ones_wait() {
        assert!(matches!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-le"), Ok(None)));
        for bad in [
            "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 0x10\r\n\r\n",
            "SSH-2.0-OpenSSH\r\n\r\n",
        ] {
            assert!(matches!(parse_head(bad.as_bytes()), Err(HeadError::Broken(_))), "{bad}");
        }
        // The same length twice is one length.
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\n");
        assert_eq!(h.framing, Framing::Length(3));
    }

    /// Feeds `wire` to the chunk decoder in pieces of `step` bytes.
    fn dechunk(wire: &[u8], step: usize) -> Result<(Vec<u8>, bool), BodyError> {
        let (mut state, mut buf, mut out) = (Chunk::Size, BytesMut::new(), Vec::new());
        for piece in wire.chunks(step) {
            buf.extend_from_slice(piece);
            loop {
                match chunked(&mut state, &mut buf, true)? {
                    Step::Data(data) => out.extend_from_slice(&data),
                    Step::More => break,
                    Step::End => return Ok((out, buf.is_empty())),
                }
            }
        }
        Ok((out, false))
    }

    #[test]
    fn chunks_are_decoded_however_they_arrive() {
        let wire = b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\n";
        for step in [1, 2, 3, 7, wire.len()] {
            let (data, clean) = dechunk(wire, step).unwrap();
            assert_eq!(data, b"hello, world", "pieces of {step}");
            assert!(clean);
        }
        assert!(matches!(dechunk(b"5\r\nhelloXX0\r\n\r\n", 64), Err(BodyError::BadChunk)));
        assert!(matches!(dechunk(b"zz\r\n", 64), Err(BodyError::BadChunk)));
        // Not yet ended: more is awaited, nothing is made up.
        assert_eq!(dechunk(b"5\r\nhel", 64).unwrap(), (b"hel".to_vec(), false));
    }
}
