//! A job's grammar, compiled once by llama.cpp where the request is read; each
//! of its choices samples with a copy.

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::LlamaToken;
use slotgate_protocol::ApiError;

/// A grammar compiled by llama.cpp, never used to sample: each choice samples
/// with a copy of it. Compiling (parsing, the left-recursion check, the first
/// parse stacks) is as large as the grammar and runs where the request is read;
/// a copy only duplicates the rules, on the scheduler thread when a choice
/// gets its slot.
#[derive(Debug)]
pub struct Grammar(LlamaSampler);

impl Grammar {
    /// A fresh copy, in the grammar's first state, for one choice to sample with.
    pub(crate) fn copy(&self) -> LlamaSampler {
        self.0.clone()
    }

    /// Moves the grammar over `tokens`, as if a choice had sampled them (a
    /// resumed answer's); `Err(i)` names the first it forbids. Each is checked
    /// before it is accepted: llama.cpp aborts on a forbidden one.
    pub(crate) fn advance(&mut self, tokens: &[LlamaToken]) -> Result<(), usize> {
        for (i, &token) in tokens.iter().enumerate() {
            let mut one =
                LlamaTokenDataArray::new(vec![LlamaTokenData::new(token, 1.0, 0.0)], false);
            self.0.apply(&mut one);
            if !one.data[0].logit().is_finite() {
                return Err(i);
            }
            self.0.accept(token);
        }
        Ok(())
    }
}

/// The grammar sampler of `grammar` (root rule `root`), or a 400 when llama.cpp
/// cannot parse it.
pub(crate) fn compile(model: &LlamaModel, grammar: &str) -> Result<Grammar, ApiError> {
    LlamaSampler::grammar(model, grammar, "root").map(Grammar).map_err(|e| {
        tracing::debug!(error = %e, grammar, "grammar refused");
        ApiError::invalid(
            "grammar",
            "the grammar cannot be parsed: it must be GBNF (llama.cpp's grammar format) \
             with a `root` rule, every rule defined, and no left recursion",
        )
    })
}
