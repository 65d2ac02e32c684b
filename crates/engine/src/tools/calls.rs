//! The generic form's calls, read as they are generated: each call's name as
//! soon as it is written, then its arguments' text as it comes, so that a stream
//! can send OpenAI's `delta.tool_calls` pieces while the model writes them.
//!
//! The grammar fixes the layout (`{"tool_calls": [{"name": "...", "arguments":
//! {...}}, ...]}`, whitespace aside), so a small reader that follows it and
//! counts brackets outside strings is enough; anything else stops it.

/// What the reader learned from the text so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallPiece {
    /// A call begins.
    Start {
        /// Its place among the answer's calls.
        index: u32,
        /// The function called.
        name: String,
    },
    /// More of a call's arguments.
    Arguments {
        /// Its place among the answer's calls.
        index: u32,
        /// The next piece of the arguments' JSON text.
        text: String,
    },
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum State {
    /// Before `[`.
    #[default]
    Opening,
    /// Between calls.
    List,
    /// Inside a call's arguments: bracket depth, and string state.
    Arguments { depth: u32, in_string: bool, escaped: bool },
    /// After a call's arguments, before its `}`.
    CallEnd,
    /// The list closed, or the text is not a call list.
    Stopped,
}

/// An incremental reader of the generic form's call list.
#[derive(Debug, Clone, Default)]
pub struct CallReader {
    state: State,
    /// Text received and not yet read.
    pending: String,
    /// Calls begun.
    calls: u32,
}

impl CallReader {
    /// How many calls have begun.
    pub fn calls(&self) -> u32 {
        self.calls
    }

    /// Reads the answer's next part; returns what it completes.
    pub fn push(&mut self, text: &str) -> Vec<CallPiece> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            let before = (self.state, self.pending.len());
            match self.state {
                State::Opening => match expect(&self.pending, &["{", "\"tool_calls\"", ":", "["]) {
                    Expect::Matched(at) => {
                        self.pending.drain(..at);
                        self.state = State::List;
                    }
                    Expect::NeedMore => break,
                    Expect::No => self.state = State::Stopped,
                },
                State::List => {
                    let rest = self.pending.trim_start();
                    let skipped = self.pending.len() - rest.len();
                    if rest.starts_with(']') {
                        self.state = State::Stopped;
                    } else if let Some(after) = rest.strip_prefix(',') {
                        let used = self.pending.len() - after.len();
                        self.pending.drain(..used);
                    } else {
                        match call_head(rest) {
                            Head::Matched(at, name) => {
                                self.pending.drain(..skipped + at);
                                out.push(CallPiece::Start { index: self.calls, name });
                                self.calls += 1;
                                self.state =
                                    State::Arguments { depth: 0, in_string: false, escaped: false };
                            }
                            Head::NeedMore => break,
                            Head::No => self.state = State::Stopped,
                        }
                    }
                }
                State::Arguments { .. } => {
                    let (used, done) = self.arguments();
                    if used > 0 {
                        let text: String = self.pending.drain(..used).collect();
                        out.push(CallPiece::Arguments { index: self.calls - 1, text });
                    }
                    if done {
                        self.state = State::CallEnd;
                    } else {
                        break;
                    }
                }
                State::CallEnd => {
                    let rest = self.pending.trim_start();
                    match rest.chars().next() {
                        None => break,
                        Some('}') => {
                            let used = self.pending.len() - rest.len() + 1;
                            self.pending.drain(..used);
                            self.state = State::List;
                        }
                        Some(_) => self.state = State::Stopped,
                    }
                }
                State::Stopped => {
                    self.pending.clear();
                    break;
                }
            }
            if (self.state, self.pending.len()) == before {
                break;
            }
        }
        out
    }

    /// Reads arguments text from `pending`: the bytes that belong to them, and
    /// whether the value closed.
    fn arguments(&mut self) -> (usize, bool) {
        let State::Arguments { mut depth, mut in_string, mut escaped } = self.state else {
            return (0, false);
        };
        for (at, c) in self.pending.char_indices() {
            if in_string {
                match (escaped, c) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '"') => in_string = false,
                    _ => {}
                }
                continue;
            }
            match c {
                '"' => in_string = true,
                '{' | '[' => depth += 1,
                '}' | ']' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        return (at + 1, true);
                    }
                }
                c if c.is_whitespace() && depth == 0 => {}
                _ if depth == 0 => {
                    // Not an object or array: the grammar never writes this.
                    self.state = State::Stopped;
                    return (0, false);
                }
                _ => {}
            }
        }
        self.state = State::Arguments { depth, in_string, escaped };
        (self.pending.len(), false)
    }
}

enum Expect {
    Matched(usize),
    NeedMore,
    No,
}

/// Matches `parts` in order, with any whitespace between them.
fn expect(text: &str, parts: &[&str]) -> Expect {
    let mut rest = text;
    for part in parts {
        rest = rest.trim_start();
        if rest.len() < part.len() {
            return if part.starts_with(rest) { Expect::NeedMore } else { Expect::No };
        }
        if !rest.starts_with(part) {
            return Expect::No;
        }
        rest = &rest[part.len()..];
    }
    Expect::Matched(text.len() - rest.len())
}

enum Head {
    /// The call's head ends at this byte; the name.
    Matched(usize, String),
    NeedMore,
    No,
}

/// Matches `{"name": "NAME", "arguments":` (names are plain: letters, digits, `_`, `-`).
fn call_head(text: &str) -> Head {
    let at = match expect(text, &["{", "\"name\"", ":", "\""]) {
        Expect::Matched(at) => at,
        Expect::NeedMore => return Head::NeedMore,
        Expect::No => return Head::No,
    };
    let Some(close) = text[at..].find('"') else { return Head::NeedMore };
    let name = text[at..at + close].to_owned();
    let after = at + close + 1;
    match expect(&text[after..], &[",", "\"arguments\"", ":"]) {
        Expect::Matched(more) => Head::Matched(after + more, name),
        Expect::NeedMore => Head::NeedMore,
        Expect::No => Head::No,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calls read from `answer` fed in pieces of `size` characters: names,
    /// and each call's arguments joined.
    fn read(answer: &str, size: usize) -> Vec<(String, String)> {
        let mut reader = CallReader::default();
        let chars: Vec<char> = answer.chars().collect();
        let mut calls: Vec<(String, String)> = Vec::new();
        for piece in chars.chunks(size) {
            let piece: String = piece.iter().collect();
            for p in reader.push(&piece) {
                match p {
                    CallPiece::Start { index, name } => {
                        assert_eq!(index as usize, calls.len());
                        calls.push((name, String::new()));
                    }
                    CallPiece::Arguments { index, text } => calls[index as usize].1.push_str(&text),
                }
            }
        }
        calls
    }

    #[test]
    fn calls_are_read_as_they_come_whatever_the_cuts() {
        let answer = r#"{ "tool_calls": [{"name": "get_weather", "arguments": {"city": "Pa}ris\"", "days": [1, 2]}}, {"name":"now","arguments":{}}]}"#;
        for size in 1..9 {
            let calls = read(answer, size);
            assert_eq!(calls.len(), 2, "cut every {size}: {calls:?}");
            assert_eq!(calls[0].0, "get_weather");
            let args: serde_json::Value = serde_json::from_str(&calls[0].1).unwrap();
            assert_eq!(args, serde_json::json!({"city": "Pa}ris\"", "days": [1, 2]}));
            assert_eq!((calls[1].0.as_str(), calls[1].1.trim()), ("now", "{}"));
        }
    }

    #[test]
    fn a_reply_or_a_half_call_is_not_made_into_calls() {
        assert!(read(r#"{"response": "hi"}"#, 3).is_empty());
        let half = read(r#"{"tool_calls": [{"name": "get_weather", "argu"#, 4);
        assert!(half.is_empty(), "no name goes out before the arguments start: {half:?}");
    }
}
