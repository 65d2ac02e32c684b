//! Server-sent events as OpenAI streams them: `data: {json}\n\n` per chunk and a final
//! `data: [DONE]\n\n`. The encoder writes them; the decoder reads them back from a
//! byte stream split anywhere.

use serde::Serialize;

/// The terminator of every OpenAI stream.
pub const DONE: &str = "[DONE]";

/// The terminator as a complete event.
pub const DONE_EVENT: &str = "data: [DONE]\n\n";

/// Writes one value as a `data:` event.
pub fn encode<T: Serialize>(value: &T) -> String {
    // Serializing these plain structs cannot fail: no maps with non-string keys.
    let json = serde_json::to_string(value).unwrap_or_else(|_| "{}".to_owned());
    encode_data(&json)
}

/// Writes text as a `data:` event, one `data:` line per line of text.
pub fn encode_data(data: &str) -> String {
    let mut out = String::with_capacity(data.len() + 8);
    for line in data.split('\n') {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    out
}

/// One decoded event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines, joined with newlines.
    pub data: String,
}

impl SseEvent {
    /// Whether this is the `[DONE]` terminator.
    pub fn is_done(&self) -> bool {
        self.data == DONE
    }
}

/// An incremental decoder: feed it bytes as they arrive, take events as they complete.
#[derive(Debug, Default)]
pub struct SseDecoder {
    buf: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
    has_data: bool,
}

impl SseDecoder {
    /// A decoder with nothing read yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds bytes and returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buf.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line).into_owned();
            if let Some(event) = self.line(&line) {
                events.push(event);
            }
        }
        events
    }

    /// Ends the stream, returning an event left without its blank line.
    pub fn finish(&mut self) -> Option<SseEvent> {
        if !self.buf.is_empty() {
            let rest = String::from_utf8_lossy(&std::mem::take(&mut self.buf)).into_owned();
            let _ = self.line(rest.trim_end_matches('\r'));
        }
        self.line("")
    }

    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            if !self.has_data {
                self.event = None;
                return None;
            }
            self.has_data = false;
            return Some(SseEvent {
                event: self.event.take(),
                data: std::mem::take(&mut self.data).join("\n"),
            });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => {
                self.data.push(value.to_owned());
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_owned()),
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_events_split_at_every_byte() {
        let stream = "data: {\"a\":1}\n\n: keep-alive\r\nevent: error\r\ndata: x\r\ndata: y\r\n\r\ndata: [DONE]\n\n";
        for split in 0..stream.len() {
            let mut dec = SseDecoder::new();
            let mut events = dec.push(&stream.as_bytes()[..split]);
            events.extend(dec.push(&stream.as_bytes()[split..]));
            assert_eq!(events.len(), 3, "split at {split}");
            assert_eq!(events[0].data, "{\"a\":1}");
            assert_eq!(events[1].event.as_deref(), Some("error"));
            assert_eq!(events[1].data, "x\ny");
            assert!(events[2].is_done());
        }
    }

    #[test]
    fn encoder_output_decodes_to_the_same_data() {
        let mut dec = SseDecoder::new();
        let mut events = dec.push(encode_data("line one\nline two").as_bytes());
        events.extend(dec.push(DONE_EVENT.as_bytes()));
        assert_eq!(events[0].data, "line one\nline two");
        assert!(events[1].is_done());
    }

    #[test]
    fn finish_returns_an_event_without_its_blank_line() {
        let mut dec = SseDecoder::new();
        assert!(dec.push(b"data: tail").is_empty());
        assert_eq!(dec.finish().map(|e| e.data), Some("tail".to_owned()));
        assert_eq!(dec.finish(), None);
    }
}
