//! What a client has of a stream that may move to another engine: the stream
//! is passed on only up to the engine's last mark ([`slotgate_protocol::resume`]),
//! so the gateway knows exactly which tokens the client has the text of; the
//! marks themselves are taken out. What follows the last mark is held back: if
//! the engine is lost before it marks them, those events never reach the
//! client, and the next engine makes them again.

use axum::body::Bytes;
use bytes::BytesMut;
use serde::Deserialize;
use slotgate_protocol::resume::{parse_mark, Mark, Resume, MARK_PREFIX};

/// Longest stretch of a stream without a mark that is held back: an engine
/// marks every write, so more is not a slotgate engine's stream. Past it the
/// stream is passed on as it comes and can no longer move.
const MOST_HELD: usize = 4 << 20;

/// A stream's marks read so far, and what waits for the next one.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Bytes after the last mark.
    held: BytesMut,
    /// Tokens of the choice whose text the client has.
    tokens: Vec<i32>,
    /// Whether the client has the choice's first chunk.
    opened: bool,
    /// The choice ended: the stream is whole.
    ended: bool,
    /// The stream cannot move: several choices, or no marks.
    stuck: bool,
    /// The stream's `id` and `created`, from its first chunk.
    head: Option<(String, u64)>,
}

/// The fields of a chunk that a resumed stream keeps.
#[derive(Deserialize)]
struct Head {
    id: String,
    #[serde(default)]
    created: u64,
}

impl Ledger {
    /// Takes a piece of the engine's stream; returns what may go to the client:
    /// everything up to its last mark, the marks taken out.
    pub fn take(&mut self, data: &[u8]) -> Bytes {
        if self.stuck {
            return Bytes::copy_from_slice(data);
        }
        self.held.extend_from_slice(data);
        let mut out = BytesMut::new();
        while let Some((at, end)) = next_mark(&self.held) {
            let events = self.held.split_to(at);
            self.read_head(&events);
            out.extend_from_slice(&events);
            let mark = self.held.split_to(end - at);
            let line = mark[MARK_PREFIX.len()..].trim_ascii_end();
            match parse_mark(line) {
                Some(Mark::Text(0, tokens)) => {
                    self.tokens.extend(tokens);
                    self.opened = true;
                }
                Some(Mark::End(0)) => self.ended = true,
                Some(Mark::Nothing) => {}
                // Another choice, or a mark of no known form.
                _ => self.stuck = true,
            }
        }
        if self.held.len() > MOST_HELD {
            self.stuck = true;
            out.extend_from_slice(&self.held.split());
        }
        out.freeze()
    }

    /// The rest of a stream that ended: what was held, passed on.
    pub fn finish(&mut self) -> Bytes {
        self.held.split().freeze()
    }

    /// Whether the client has the whole answer.
    pub fn is_whole(&self) -> bool {
        self.ended
    }

    /// Whether the stream may go on elsewhere.
    pub fn can_move(&self) -> bool {
        !self.stuck && !self.ended
    }

    /// Tokens the client has.
    pub fn tokens(&self) -> usize {
        self.tokens.len()
    }

    /// `body` (a JSON object: the request as first sent) asking the next engine
    /// to go on from what the client has.
    pub fn resume_body(&self, body: &[u8]) -> Option<Bytes> {
        let (id, created) = self.head.clone().unwrap_or_default();
        let resume = Resume { tokens: self.tokens.clone(), id, created, opened: self.opened };
        let field = serde_json::to_vec(&resume).ok()?;
        let close = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
        if body[close] != b'}' {
            return None;
        }
        let empty = body[..close]
            .iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .is_some_and(|open| body[open] == b'{');
        let mut out = Vec::with_capacity(body.len() + field.len() + 24);
        out.extend_from_slice(&body[..close]);
        if !empty {
            out.push(b',');
        }
        out.extend_from_slice(b"\"slotgate_resume\":");
        out.extend_from_slice(&field);
        out.push(b'}');
        Some(Bytes::from(out))
    }

    /// Reads the stream's `id` and `created` from the first chunk with data.
    fn read_head(&mut self, events: &[u8]) {
        if self.head.is_some() {
            return;
        }
        for line in events.split(|b| *b == b'\n') {
            if let Some(data) = line.strip_prefix(b"data: ") {
                if let Ok(head) = serde_json::from_slice::<Head>(data) {
                    self.head = Some((head.id, head.created));
                    return;
                }
            }
        }
    }
}

/// The first whole mark in `held`: where it starts and where the blank line
/// after it ends. A mark starts a line; event data never holds a raw newline
/// (JSON escapes it), so a line that starts so is a mark.
fn next_mark(held: &[u8]) -> Option<(usize, usize)> {
    let prefix = MARK_PREFIX.as_bytes();
    let at = if held.starts_with(prefix) {
        0
    } else {
        let mut needle = Vec::with_capacity(prefix.len() + 1);
        needle.push(b'\n');
        needle.extend_from_slice(prefix);
        memchr::memmem::find(held, &needle)? + 1
    };
    let end = memchr::memmem::find(&held[at..], b"\n\n")? + at + 2;
    Some((at, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use slotgate_protocol::resume::{end_mark, mark, NOTHING_MARK};

    const CHUNK: &str = "data: {\"id\":\"chatcmpl-7\",\"created\":42,\"choices\":[]}\n\n";

    #[test]
    fn only_what_a_mark_closes_goes_out_and_the_marks_do_not() {
        let mut ledger = Ledger::default();
        let stream = format!("{CHUNK}{}{CHUNK}", mark(0, &[5, 6]));
        // Cut anywhere: what goes out is the first chunk, once its mark is whole.
        for cut in 0..stream.len() {
            let mut ledger = Ledger::default();
            let mut out = ledger.take(&stream.as_bytes()[..cut]).to_vec();
            out.extend_from_slice(&ledger.take(&stream.as_bytes()[cut..]));
            assert_eq!(String::from_utf8(out).unwrap(), CHUNK, "cut at {cut}");
            assert_eq!(ledger.tokens, vec![5, 6]);
        }
        assert_eq!(ledger.take(stream.as_bytes()), CHUNK);
        assert_eq!(ledger.finish(), CHUNK, "an ended stream passes on the rest");
        assert!(ledger.can_move());
        let body = ledger.resume_body(br#"{"model":"m","stream":true} "#).unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body["slotgate_resume"],
            serde_json::json!({"tokens":[5,6],"id":"chatcmpl-7","created":42,"opened":true})
        );
        assert_eq!(body["model"], "m");
    }

    #[test]
    fn an_ended_or_several_choice_stream_does_not_move() {
        let mut ledger = Ledger::default();
        ledger.take(format!("{NOTHING_MARK}{CHUNK}{}", end_mark(0)).as_bytes());
        assert!(ledger.is_whole() && !ledger.can_move());
        assert!(!ledger.opened, "a keep-alive opens nothing");
        let mut ledger = Ledger::default();
        ledger.take(format!("{CHUNK}{}", mark(1, &[3])).as_bytes());
        assert!(!ledger.can_move());
        assert_eq!(ledger.take(b"data: x\n\n"), "data: x\n\n", "a stuck stream passes through");
    }

    #[test]
    fn a_resume_goes_into_an_empty_object_too() {
        let ledger = Ledger::default();
        let body = ledger.resume_body(b"{ }").unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["slotgate_resume"]["opened"], false);
        assert!(ledger.resume_body(b"[1]").is_none());
    }
}
