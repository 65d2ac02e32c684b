//! The usage a backend reports in an answer's `usage`, read by a scan of the
//! bytes rather than a parse of the whole answer: the gateway relays answers
//! untouched, and only wants three numbers from them.

use std::sync::LazyLock;

use memchr::memmem::{Finder, FinderRev};

/// The searchers, built once: building one per search was most of the scan's time.
static USAGE: LazyLock<FinderRev<'static>> = LazyLock::new(|| FinderRev::new(b"\"usage\""));
static PROMPT: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"prompt_tokens\""));
static COMPLETION: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"completion_tokens\""));
static CACHED: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"cached_tokens\""));
// Anthropic's Messages API: `input_tokens` are those not read from the cache.
static INPUT: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"input_tokens\""));
static OUTPUT: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"output_tokens\""));
static CACHE_READ: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"cache_read_input_tokens\""));
// llama-server's `/completion`: the last event (or the answer) says both counts.
static EVALUATED: LazyLock<FinderRev<'static>> =
    LazyLock::new(|| FinderRev::new(b"\"tokens_evaluated\""));
static PREDICTED: LazyLock<FinderRev<'static>> =
    LazyLock::new(|| FinderRev::new(b"\"tokens_predicted\""));
static CACHE_N: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"cache_n\""));

/// Tokens of one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// `usage.prompt_tokens`.
    pub prompt: u64,
    /// `usage.completion_tokens` (0 when absent, as in embeddings).
    pub completion: u64,
    /// `usage.prompt_tokens_details.cached_tokens` (0 when absent).
    pub cached: u64,
}

/// The usage of an answer, or of a streamed chunk that carries usage; `None`
/// for anything else, after one pass over the bytes. A `"usage"` inside a text
/// is escaped (`\"usage\"`) and never matches.
pub fn scan(bytes: &[u8]) -> Option<Usage> {
    let Some(at) = USAGE.rfind(bytes) else { return native(bytes) };
    let usage = &bytes[at..];
    let Some(prompt) = number_after(usage, &PROMPT) else { return messages(usage) };
    let completion = number_after(usage, &COMPLETION).unwrap_or(0);
    let cached = number_after(usage, &CACHED).unwrap_or(0);
    Some(Usage { prompt, completion, cached })
}

/// The usage of a Messages answer or event (`message_delta`), whose prompt is
/// the tokens decoded and those read from the cache together, or of a
/// Responses answer or event (`response.completed`), whose `input_tokens` is
/// the whole prompt.
fn messages(usage: &[u8]) -> Option<Usage> {
    let input = number_after(usage, &INPUT)?;
    let completion = number_after(usage, &OUTPUT).unwrap_or(0);
    Some(match number_after(usage, &CACHE_READ) {
        Some(cached) => Usage { prompt: input + cached, completion, cached },
        None => {
            Usage { prompt: input, completion, cached: number_after(usage, &CACHED).unwrap_or(0) }
        }
    })
}

/// The usage of llama-server's native answer, or of its stream's last event:
/// `tokens_evaluated` (the prompt), the `tokens_predicted` before it, and
/// `timings.cache_n` after it.
fn native(bytes: &[u8]) -> Option<Usage> {
    let at = EVALUATED.rfind(bytes)?;
    let prompt = number_after(&bytes[at..], &Finder::new(EVALUATED.needle()))?;
    let before = &bytes[..at];
    let completion = PREDICTED
        .rfind(before)
        .and_then(|p| number_after(&before[p..], &Finder::new(PREDICTED.needle())))
        .unwrap_or(0);
    let cached = number_after(&bytes[at..], &CACHE_N).unwrap_or(0);
    Some(Usage { prompt, completion, cached })
}

/// The unsigned number that follows the key `finder` finds, and its colon.
fn number_after(hay: &[u8], finder: &Finder) -> Option<u64> {
    let rest = &hay[finder.find(hay)? + finder.needle().len()..];
    let rest = rest.trim_ascii_start().strip_prefix(b":")?.trim_ascii_start();
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_usage_in_the_shapes_engines_send() {
        let ours = br#"{"choices":[{"text":"prompt_tokens"}],"usage":{"prompt_tokens":120,"completion_tokens":8,"total_tokens":128,"prompt_tokens_details":{"cached_tokens":96}}}"#;
        assert_eq!(scan(ours), Some(Usage { prompt: 120, completion: 8, cached: 96 }));
        let spaced = b"data: {\"usage\": {\"prompt_tokens\" : 7, \"completion_tokens\": 1}}\n\n";
        assert_eq!(scan(spaced), Some(Usage { prompt: 7, completion: 1, cached: 0 }));
        assert_eq!(scan(br#"{"usage":null}"#), None);
        assert_eq!(scan(br#"data: {"choices":[{"delta":{"content":"usage"}}]}"#), None);
        assert_eq!(scan(br#"data: {"choices":[{"delta":{"content":""usage""}}]}"#), None);
        let native = br#"data: {"content":"","tokens_predicted":8,"tokens_evaluated":18,"timings":{"cache_n":6}}"#;
        assert_eq!(scan(native), Some(Usage { prompt: 18, completion: 8, cached: 6 }));
        assert_eq!(scan(br#"data: {"content":"x","tokens_predicted":3}"#), None, "mid-stream");
        let messages = b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":4,\"output_tokens\":9,\"cache_read_input_tokens\":6}}\n\n";
        assert_eq!(scan(messages), Some(Usage { prompt: 10, completion: 9, cached: 6 }));
        let responses = br#"{"object":"response","usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":20},"output_tokens":8}}"#;
        assert_eq!(scan(responses), Some(Usage { prompt: 36, completion: 8, cached: 20 }));
        assert_eq!(scan(br#"{"type":"response.created","response":{"usage":null}}"#), None);
    }
}
