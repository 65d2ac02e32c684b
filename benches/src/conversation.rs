//! Conversations as benches replay them: a long opening that differs per
//! conversation from its first line, then turns that each resend the whole
//! transcript, as chat clients do.

/// The long opening of conversation `name`: about 720 tokens on the default model,
/// so that re-reading it is what a prompt cache saves. Its first line names the conversation, so two
/// conversations share only a few tokens.
pub fn opening(name: &str) -> String {
    let mut text = format!("Conversation {name}. The notes below describe a small city.\n");
    for i in 0..24 {
        text.push_str(&format!(
            "Note {i}: district {i} has {} parks, {} schools and a market that opens at {} o'clock.\n",
            i * 3 % 7 + 1,
            i * 5 % 11 + 2,
            i % 5 + 6
        ));
    }
    text
}

/// One conversation's transcript as a text prompt.
#[derive(Debug, Clone)]
pub struct Transcript {
    /// The prompt so far.
    pub text: String,
    /// Prompt tokens of the last turn, as the engine counted them.
    pub last_prompt_tokens: u64,
    turns: usize,
}

impl Transcript {
    /// A conversation that starts with [`opening`].
    pub fn new(name: &str) -> Self {
        Self { text: opening(name), last_prompt_tokens: 0, turns: 0 }
    }

    /// Adds the next user question and returns the prompt to send.
    pub fn ask(&mut self) -> &str {
        self.turns += 1;
        self.text
            .push_str(&format!("User: What is in district {}?\nAssistant:", self.turns * 3 % 24));
        &self.text
    }

    /// Adds the answer.
    pub fn answer(&mut self, text: &str, prompt_tokens: u64) {
        self.text.push_str(text);
        self.text.push('\n');
        self.last_prompt_tokens = prompt_tokens;
    }

    /// Turns asked so far.
    pub fn turns(&self) -> usize {
        self.turns
    }
}

/// Tokens of its previous prompt that a warm turn may decode again: the end of a
/// prompt can tokenize differently once the answer follows it, and llama-server's
/// host-memory cache gives back a few tokens less than it saved. A turn that found
/// only an older turn's cache misses a whole question and answer (over 30 tokens
/// in these benches).
pub const WARM_SLACK: u64 = 8;

/// Whether a later turn was served from cache: it reused its whole previous
/// prompt, less [`WARM_SLACK`] tokens.
pub fn is_warm(cached_tokens: u64, previous_prompt_tokens: u64) -> bool {
    cached_tokens + WARM_SLACK >= previous_prompt_tokens
}
