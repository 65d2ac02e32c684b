//! Builds a slot's sampler chain from a job's settings, in llama.cpp's order:
//! logit bias, penalties, top-k, top-p, min-p, temperature, then a seeded draw.

use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use llama_cpp_2::token::LlamaToken;

use super::job::GenParams;

/// How many recent tokens the presence and frequency penalties look at.
const PENALTY_LAST_N: i32 = 64;

/// A fresh sampler for one choice.
pub(crate) fn build(params: &GenParams, seed: u32, n_vocab: i32) -> LlamaSampler {
    let mut chain = Vec::with_capacity(7);
    if !params.logit_bias.is_empty() {
        let biases: Vec<LlamaLogitBias> = params
            .logit_bias
            .iter()
            .filter(|(token, _)| (0..n_vocab).contains(token))
            .map(|&(token, bias)| LlamaLogitBias::new(LlamaToken(token), bias))
            .collect();
        chain.push(LlamaSampler::logit_bias(n_vocab, &biases));
    }
    if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
        chain.push(LlamaSampler::penalties(
            n_vocab,
            PENALTY_LAST_N,
            1.0,
            params.frequency_penalty,
            params.presence_penalty,
        ));
    }
    if params.temperature <= 0.0 {
        chain.push(LlamaSampler::greedy());
        return LlamaSampler::chain_simple(chain);
    }
    if params.top_k > 0 {
        chain.push(LlamaSampler::top_k(params.top_k));
    }
    if params.top_p < 1.0 {
        chain.push(LlamaSampler::top_p(params.top_p, 1));
    }
    if params.min_p > 0.0 {
        chain.push(LlamaSampler::min_p(params.min_p, 1));
    }
    chain.push(LlamaSampler::temp(params.temperature));
    chain.push(LlamaSampler::dist(seed));
    LlamaSampler::chain_simple(chain)
}
