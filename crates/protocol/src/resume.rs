//! Streams that move between engines: how the gateway learns which tokens a
//! stream has sent, and how it asks another engine to go on from them.
//!
//! A gateway that sends [`MARK_HEADER`] with a streamed chat or text completion
//! gets, after the events of each step of the answer, an SSE comment naming the
//! tokens those events carry: [`MARK_PREFIX`], the choice's index, and the
//! token ids, comma-separated. Clients skip comments; the gateway takes them
//! out anyway. Everything before a mark is whole: a gateway that passes on only
//! what precedes the last mark it read knows exactly which tokens the client
//! has the text of. To go on elsewhere it sends the same request again with
//! [`Resume`] in `slotgate_resume`: the engine reads those tokens after the
//! prompt, advances the grammar and the stop-string window over them, sends
//! nothing for them, and writes the rest of the stream under the same `id`.

use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// The request header that asks an engine to mark its stream with token ids.
pub const MARK_HEADER: &str = "x-slotgate-mark-tokens";

/// How a mark starts: an SSE comment line.
pub const MARK_PREFIX: &str = ": slotgate-tokens ";

/// Most tokens a resumed answer may carry: more than any context holds.
pub const MAX_RESUME_TOKENS: usize = 1 << 20;

/// Longest stream `id` a resume may keep.
pub const MAX_RESUME_ID: usize = 256;

/// Where a stream that moved goes on from (`slotgate_resume`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resume {
    /// The tokens of the answer the client already has, in order.
    #[serde(default)]
    pub tokens: Vec<i32>,
    /// The stream's `id`, which its chunks keep.
    #[serde(default)]
    pub id: String,
    /// The stream's `created`, which its chunks keep.
    #[serde(default)]
    pub created: u64,
    /// Whether the choice's first chunk went out: its opening is not sent again,
    /// nor the prompt of an echo.
    #[serde(default)]
    pub opened: bool,
}

impl Resume {
    /// Checks its bounds; a resume only makes sense of a stream.
    pub fn validate(&self, stream: bool) -> Result<(), ApiError> {
        let invalid = |message: String| Err(ApiError::invalid("slotgate_resume", message));
        if !stream {
            return invalid("slotgate_resume is only allowed when stream is true".into());
        }
        if self.tokens.len() > MAX_RESUME_TOKENS {
            return invalid(format!(
                "slotgate_resume.tokens holds {} tokens; at most {MAX_RESUME_TOKENS}",
                self.tokens.len()
            ));
        }
        if self.id.len() > MAX_RESUME_ID {
            return invalid(format!("slotgate_resume.id is longer than {MAX_RESUME_ID} bytes"));
        }
        Ok(())
    }
}

/// The mark after a step's text of choice `index`: the tokens it carries.
pub fn mark(index: u32, tokens: &[i32]) -> String {
    let mut out = format!("{MARK_PREFIX}{index} ");
    for (i, t) in tokens.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&t.to_string());
    }
    out.push_str("\n\n");
    out
}

/// The mark after the last chunk of choice `index`: it is whole.
pub fn end_mark(index: u32) -> String {
    format!("{MARK_PREFIX}{index} end\n\n")
}

/// The mark after anything else (a keep-alive, the prompt's progress).
pub const NOTHING_MARK: &str = ": slotgate-tokens -\n\n";

/// What a mark says of the events before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mark {
    /// Text of choice `index`, made of these tokens (none for an echo).
    Text(u32, Vec<i32>),
    /// Choice `index` ended.
    End(u32),
    /// No tokens.
    Nothing,
}

/// A mark, from the text after [`MARK_PREFIX`] up to the end of its line;
/// `None` when it is not one.
pub fn parse_mark(rest: &[u8]) -> Option<Mark> {
    let rest = std::str::from_utf8(rest).ok()?;
    if rest == "-" {
        return Some(Mark::Nothing);
    }
    let (index, ids) = rest.split_once(' ')?;
    let index = index.parse().ok()?;
    if ids == "end" {
        return Some(Mark::End(index));
    }
    let tokens = if ids.is_empty() {
        Vec::new()
    } else {
        ids.split(',').map(str::parse).collect::<Result<_, _>>().ok()?
    };
    Some(Mark::Text(index, tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_reads_back() {
        let m = mark(0, &[5, 17, 262_143]);
        assert_eq!(m, ": slotgate-tokens 0 5,17,262143\n\n");
        let line = |m: &str| m.strip_prefix(MARK_PREFIX).unwrap().trim_end().to_owned();
        assert_eq!(parse_mark(line(&m).as_bytes()), Some(Mark::Text(0, vec![5, 17, 262_143])));
        assert_eq!(parse_mark(line(&end_mark(2)).as_bytes()), Some(Mark::End(2)));
        assert_eq!(parse_mark(line(NOTHING_MARK).as_bytes()), Some(Mark::Nothing));
        assert_eq!(parse_mark(b"3 "), Some(Mark::Text(3, vec![])));
        assert_eq!(parse_mark(b"x 1"), None);
        assert_eq!(parse_mark(b"0 1,,2"), None);
    }

    #[test]
    fn a_resume_is_bounded_and_only_for_streams() {
        let ok = Resume { tokens: vec![1, 2], id: "chatcmpl-1".into(), created: 1, opened: true };
        assert!(ok.validate(true).is_ok());
        assert!(ok.validate(false).is_err());
        let long = Resume { id: "x".repeat(MAX_RESUME_ID + 1), ..ok.clone() };
        assert!(long.validate(true).is_err());
    }
}
