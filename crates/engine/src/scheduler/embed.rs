//! Embeddings: a second context of the model, pooled as `pooling` says (mean
//! by default), that reads one input per decode and returns its L2-normalized
//! vector, as OpenAI's are, or without pooling every token's vector as the
//! model gives it; for a reranker, rank pooling, and the score its classifier
//! head gives. The
//! inputs are tokenized by the model's reader, off the scheduler thread; this
//! thread decodes one input per step, between the generation steps.

use std::num::NonZeroU32;

use llama_cpp_2::context::params::{LlamaContextParams, LlamaPoolingType};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use slotgate_protocol::ApiError;
use tokio::sync::oneshot;

use crate::config::{ModelSettings, Pooling};

/// One input's vectors and its token count.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    /// Pooled: one, L2-normalized. Without pooling: one per token, as the
    /// model gives them. A reranker's: one holding the score alone.
    pub vectors: Vec<Vec<f32>>,
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
        .with_pooling_type(match (settings.reranking, settings.pooling) {
            (true, _) => LlamaPoolingType::Rank,
            (false, Pooling::Mean) => LlamaPoolingType::Mean,
            (false, Pooling::Cls) => LlamaPoolingType::Cls,
            (false, Pooling::Last) => LlamaPoolingType::Last,
            (false, Pooling::None) => LlamaPoolingType::None,
        })
}

/// What a model's embedding context gives for an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbedKind {
    /// One pooled vector, normalized.
    Pooled,
    /// Every token's vector.
    PerToken,
    /// A reranker's score.
    Rank,
}

impl EmbedKind {
    /// What `info`'s embedding context gives.
    pub fn of(info: &super::model::ModelInfo) -> Self {
        match (info.reranking, info.pooling) {
            (true, _) => Self::Rank,
            (false, Pooling::None) => Self::PerToken,
            (false, _) => Self::Pooled,
        }
    }
}

/// An embeddings job on the scheduler thread: its inputs, already tokens, and
/// the vectors made so far.
pub(crate) struct EmbedWork {
    inputs: std::vec::IntoIter<Vec<LlamaToken>>,
    done: Vec<Embedded>,
    reply: oneshot::Sender<Result<Vec<Embedded>, ApiError>>,
}

impl EmbedWork {
    pub fn new(job: super::EmbedJob) -> Self {
        let done = Vec::with_capacity(job.inputs.len());
        Self { inputs: job.inputs.into_iter(), done, reply: job.reply }
    }

    /// Embeds the next input. Returns the job's answer once it has one: every
    /// vector, an error, or nothing for a client that went away.
    pub fn step(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        read: EmbedKind,
    ) -> Option<Result<Vec<Embedded>, ApiError>> {
        if self.reply.is_closed() {
            return Some(Ok(Vec::new()));
        }
        let Some(tokens) = self.inputs.next() else {
            return Some(Ok(std::mem::take(&mut self.done)));
        };
        match embed_one(ctx, &tokens, read) {
            Ok(vectors) => self.done.push(Embedded { vectors, tokens: tokens.len() as u32 }),
            Err(err) => return Some(Err(err)),
        }
        self.inputs.as_slice().is_empty().then(|| Ok(std::mem::take(&mut self.done)))
    }

    /// Sends the job's answer.
    pub fn answer(self, result: Result<Vec<Embedded>, ApiError>) {
        let _ = self.reply.send(result);
    }
}

/// The refusal of embeddings by a model without an embedding context.
pub(crate) fn not_enabled(model: &str) -> ApiError {
    ApiError::invalid(
        "model",
        format!("embeddings are not enabled for model `{model}`; load it with embedding = true"),
    )
}

/// The vectors of `tokens` (checked by the reader to fit the context), as
/// `read` says.
fn embed_one(
    ctx: &mut LlamaContext<'_>,
    tokens: &[LlamaToken],
    read: EmbedKind,
) -> Result<Vec<Vec<f32>>, ApiError> {
    let mut batch = LlamaBatch::new(tokens.len().max(1), 1);
    for (pos, &token) in tokens.iter().enumerate() {
        batch.add(token, pos as i32, &[0], true).map_err(|_| ApiError::internal())?;
    }
    let _ = ctx.clear_kv_cache_seq(None, None, None);
    ctx.decode(&mut batch).map_err(|e| {
        tracing::error!(error = %e, "embedding decode failed");
        ApiError::internal()
    })?;
    crate::metrics::llama_server::TOTALS.decoded(1);
    crate::metrics::llama_server::TOTALS.embedded(tokens.len());
    if read == EmbedKind::PerToken {
        return (0..tokens.len() as i32)
            .map(|i| ctx.embeddings_ith(i).map(<[f32]>::to_vec).map_err(|_| ApiError::internal()))
            .collect();
    }
    let vector = ctx.embeddings_seq_ith(0).map_err(|_| ApiError::internal())?;
    if read == EmbedKind::Rank {
        return Ok(vec![vector.first().copied().into_iter().collect()]);
    }
    Ok(vec![normalize(vector)])
}

fn normalize(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm == 0.0 {
        return v.to_vec();
    }
    v.iter().map(|x| x / norm).collect()
}
