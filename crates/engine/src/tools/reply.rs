//! The generic form's reply, read as it is generated: once the answer opens as
//! `{"response": "`, the string's text is decoded and can be streamed as content
//! while the model writes it, instead of after the whole answer. An answer that
//! opens any other way (a call) is left to be read whole.

/// Where the reader is in the answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum State {
    /// Not yet known whether this is a reply.
    #[default]
    Opening,
    /// Inside the reply's string.
    Text,
    /// Past the string's closing quote.
    Done,
    /// Not a reply.
    Other,
}

/// An incremental reader of `{"response": "..."}`.
#[derive(Debug, Clone, Default)]
pub struct ReplyReader {
    state: State,
    /// Text received and not yet read: the opening so far, or an escape cut in two.
    pending: String,
}

impl ReplyReader {
    /// Whether the answer is a reply (its opening has been read).
    pub fn is_reply(&self) -> bool {
        matches!(self.state, State::Text | State::Done)
    }

    /// Reads `text`, the answer's next part; returns the reply text it completes.
    pub fn push(&mut self, text: &str) -> String {
        self.pending.push_str(text);
        if self.state == State::Opening {
            match opening(&self.pending) {
                Opening::Reply(at) => {
                    self.pending.drain(..at);
                    self.state = State::Text;
                }
                Opening::Other => self.state = State::Other,
                Opening::NeedMore => return String::new(),
            }
        }
        if self.state != State::Text {
            self.pending.clear();
            return String::new();
        }
        let (out, used, closed) = decode(&self.pending);
        self.pending.drain(..used);
        if closed {
            self.state = State::Done;
            self.pending.clear();
        }
        out
    }
}

enum Opening {
    /// The string starts at this byte.
    Reply(usize),
    Other,
    NeedMore,
}

/// Matches `{ "response" : "` with any whitespace between the parts.
fn opening(text: &str) -> Opening {
    let mut rest = text;
    let mut used = 0;
    for part in ["{", "\"response\"", ":", "\""] {
        let trimmed = rest.trim_start();
        used += rest.len() - trimmed.len();
        rest = trimmed;
        if rest.len() < part.len() {
            return if part.starts_with(rest) { Opening::NeedMore } else { Opening::Other };
        }
        if !rest.starts_with(part) {
            return Opening::Other;
        }
        rest = &rest[part.len()..];
        used += part.len();
    }
    Opening::Reply(used)
}

/// Decodes JSON string content up to the closing quote or to an escape that is
/// not complete yet: the text, the bytes read, and whether the string closed.
fn decode(text: &str) -> (String, usize, bool) {
    let mut out = String::new();
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return (out, at + 1, true),
            '\\' => {
                let rest = &text[at..];
                let Some((decoded, len)) = escape(rest) else { return (out, at, false) };
                out.push_str(&decoded);
                while chars.peek().is_some_and(|(i, _)| *i < at + len) {
                    chars.next();
                }
            }
            c => out.push(c),
        }
    }
    (out, text.len(), false)
}

/// One escape at the start of `text` and its length; `None` while incomplete.
fn escape(text: &str) -> Option<(String, usize)> {
    let kind = text.as_bytes().get(1)?;
    let simple = match kind {
        b'n' => Some('\n'),
        b't' => Some('\t'),
        b'r' => Some('\r'),
        b'b' => Some('\u{8}'),
        b'f' => Some('\u{c}'),
        b'/' => Some('/'),
        b'\\' => Some('\\'),
        b'"' => Some('"'),
        _ => None,
    };
    if let Some(c) = simple {
        return Some((c.to_string(), 2));
    }
    let unit = |at: usize| text.get(at..at + 4).and_then(|h| u16::from_str_radix(h, 16).ok());
    let first = unit(2)?;
    if (0xD800..0xDC00).contains(&first) {
        // A surrogate pair: the second half must follow as `\uXXXX`.
        if text.len() < 12 {
            return None;
        }
        let second = text.get(6..8).filter(|s| *s == "\\u").and_then(|_| unit(8));
        let decoded = second.map_or_else(
            || char::REPLACEMENT_CHARACTER.to_string(),
            |s| String::from_utf16_lossy(&[first, s]),
        );
        return Some((decoded, if second.is_some() { 12 } else { 6 }));
    }
    Some((String::from_utf16_lossy(&[first]), 6))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(pieces: &[&str]) -> (String, bool) {
        let mut reader = ReplyReader::default();
        let text: String = pieces.iter().map(|p| reader.push(p)).collect();
        (text, reader.is_reply())
    }

    #[test]
    fn a_reply_is_decoded_as_it_comes_whatever_the_cuts() {
        let answer = r#"{ "response": "Hi \"you\",\nsnow \u2603 and \ud83d\ude00!"}"#;
        let want = "Hi \"you\",\nsnow \u{2603} and \u{1F600}!";
        for size in 1..8 {
            let pieces: Vec<String> = answer
                .chars()
                .collect::<Vec<_>>()
                .chunks(size)
                .map(|c| c.iter().collect())
                .collect();
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            assert_eq!(feed(&pieces), (want.to_owned(), true), "cut every {size}");
        }
    }

    #[test]
    fn a_call_is_not_a_reply() {
        assert_eq!(
            feed(&[r#"{"tool_calls": [{"name": "f", "arguments": {}}]}"#]),
            (String::new(), false)
        );
        assert_eq!(feed(&["{", "\"res", "ult\": 1}"]), (String::new(), false));
        let mut reader = ReplyReader::default();
        assert_eq!(reader.push("{\"resp"), "");
        assert!(!reader.is_reply(), "not known yet");
    }
}
