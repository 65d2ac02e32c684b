//! Embeddings: a second context of the model, with mean pooling, that reads one
//! input per decode and returns its L2-normalized vector, as OpenAI's are.

use std::num::NonZeroU32;

use llama_cpp_2::context::params::{LlamaContextParams, LlamaPoolingType};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use slotgate_protocol::{ApiError, ErrorType, PromptItem};

use crate::config::ModelSettings;

/// One input's vector and its token count.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    /// L2-normalized.
    pub vector: Vec<f32>,
    /// Tokens of the input.
    pub tokens: u32,
}

/// The embedding context: one sequence of up to `ctx_len` tokens, read in one
/// micro-batch because pooling needs the whole input at once.
pub(crate) fn context_params(settings: &ModelSettings) -> LlamaContextParams {
    let threads = settings.threads() as i32;
    LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(settings.ctx_len))
        .with_n_seq_max(1)
        .with_n_batch(settings.ctx_len)
        .with_n_ubatch(settings.ctx_len)
        .with_n_threads(threads)
        .with_n_threads_batch(threads)
        .with_embeddings(true)
        .with_pooling_type(LlamaPoolingType::Mean)
}

/// Embeds every input; returns each vector with its token count.
pub(crate) fn run(
    model: &LlamaModel,
    ctx: &mut LlamaContext<'_>,
    inputs: &[PromptItem],
    n_vocab: i32,
    ctx_len: usize,
) -> Result<Vec<Embedded>, ApiError> {
    let vocab = model.vocab();
    let param = |i: usize| if inputs.len() > 1 { format!("input[{i}]") } else { "input".into() };
    let mut out = Vec::with_capacity(inputs.len());
    for (i, input) in inputs.iter().enumerate() {
        let tokens: Vec<LlamaToken> = match input {
            PromptItem::Text(text) => vocab.tokenize(text.as_bytes(), true, false),
            PromptItem::Tokens(ids) => ids
                .iter()
                .map(|&id| match i32::try_from(id) {
                    Ok(t) if t < n_vocab => Ok(LlamaToken(t)),
                    _ => Err(ApiError::invalid(
                        param(i),
                        format!(
                            "token id {id} is out of range: the vocabulary has {n_vocab} tokens"
                        ),
                    )),
                })
                .collect::<Result<_, _>>()?,
        };
        if tokens.len() > ctx_len {
            return Err(ApiError::new(
                ErrorType::ExceedContextSizeError,
                format!(
                    "{} has {} tokens, but the context holds {ctx_len} (ctx_len)",
                    param(i),
                    tokens.len()
                ),
            )
            .with_param(param(i))
            .with_context(tokens.len() as u32, ctx_len as u32));
        }
        let mut batch = LlamaBatch::new(tokens.len(), 1);
        for (pos, &token) in tokens.iter().enumerate() {
            batch.add(token, pos as i32, &[0], true).map_err(|_| ApiError::internal())?;
        }
        let _ = ctx.clear_kv_cache_seq(None, None, None);
        ctx.decode(&mut batch).map_err(|e| {
            tracing::error!(error = %e, "embedding decode failed");
            ApiError::internal()
        })?;
        let vector = ctx.embeddings_seq_ith(0).map_err(|_| ApiError::internal())?;
        out.push(Embedded { vector: normalize(vector), tokens: tokens.len() as u32 });
    }
    Ok(out)
}

fn normalize(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm == 0.0 {
        return v.to_vec();
    }
    v.iter().map(|x| x / norm).collect()
}
