//! llama-server's `/tokenize`, `/detokenize` and `/apply-template`: a model's
//! vocabulary and chat template, read off the scheduler thread as a request's
//! prompt is ([`super::reader`]).

use slotgate_protocol::{ApiError, TokenOut};

use super::reader::Reader;

/// What to do with the vocabulary.
#[derive(Debug)]
pub enum VocabOp {
    /// Text to tokens, with their pieces when asked.
    Tokenize {
        /// The text.
        content: String,
        /// Add BOS as a prompt gets it.
        add_special: bool,
        /// Read special tokens written in the text as those tokens.
        parse_special: bool,
        /// Answer each token's piece too.
        with_pieces: bool,
    },
    /// Tokens to text.
    Detokenize(Vec<i64>),
}

/// The answer to a [`VocabOp`].
#[derive(Debug)]
pub enum VocabAnswer {
    /// From `Tokenize`.
    Tokens(Vec<TokenOut>),
    /// From `Detokenize`.
    Text(String),
}

impl Reader {
    /// Runs `op` on this model's vocabulary.
    pub fn vocab_op(&self, op: VocabOp) -> Result<VocabAnswer, ApiError> {
        let vocab = self.model.vocab();
        match op {
            VocabOp::Tokenize { content, add_special, parse_special, with_pieces } => {
                let tokens = vocab.tokenize(content.as_bytes(), add_special, parse_special);
                Ok(VocabAnswer::Tokens(
                    tokens
                        .into_iter()
                        .map(|t| match with_pieces {
                            true => TokenOut::piece(t.0, vocab.token_to_piece(t, true, None)),
                            false => TokenOut::Id(t.0),
                        })
                        .collect(),
                ))
            }
            VocabOp::Detokenize(ids) => {
                let tokens = self.token_ids(ids.iter().copied(), "tokens")?;
                // Pieces one after another, special tokens written out, as
                // llama-server's `tokens_to_str` does.
                let mut bytes = Vec::new();
                for token in tokens {
                    bytes.extend(vocab.token_to_piece(token, true, None));
                }
                Ok(VocabAnswer::Text(String::from_utf8_lossy(&bytes).into_owned()))
            }
        }
    }
}
