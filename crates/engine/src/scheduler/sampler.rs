//! A choice's sampler: a chain built from the job's settings in llama.cpp's order
//! (logit bias, penalties, top-k, top-p, min-p, temperature, a seeded draw), a
//! grammar kept beside it, and the log probabilities the client asked for.
//!
//! The grammar is checked the way llama-server checks it: the chain draws first,
//! and only when its token breaks the grammar is the draw made again with the
//! grammar applied to every candidate. Matching a 262k-token vocabulary against a
//! grammar costs tens of milliseconds, and most draws already fit. A token the
//! grammar forbids is never accepted (llama.cpp aborts on one).

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use llama_cpp_2::token::LlamaToken;

use super::grammar::Grammar;
use super::job::GenParams;

/// How many recent tokens the presence and frequency penalties look at.
const PENALTY_LAST_N: i32 = 64;

/// One choice's sampling state.
pub(crate) struct ChoiceSampler {
    chain: LlamaSampler,
    grammar: Option<LlamaSampler>,
    /// Alternatives to report per token; `None` reports no log probabilities.
    logprobs: Option<u32>,
    /// Report the distribution the draw was made from (after top-k, top-p,
    /// min-p and temperature) rather than the model's own.
    post_sampling: bool,
    /// Of a seeded choice that samples at random: its draws by position.
    seeded: Option<Seeded>,
}

/// A seeded choice's draws: each is made with a chain whose random draw is
/// seeded by the request's seed and the token's position in the answer, not by
/// one sequence from the seed. A choice resumed on another engine at position
/// `k` then draws as the undisturbed one would have (llama.cpp's `dist` cannot
/// be moved along its sequence; it is built anew, with the chain, per draw).
struct Seeded {
    params: std::sync::Arc<GenParams>,
    seed: u32,
    n_vocab: i32,
    /// Tokens of the answer so far: the next draw's position.
    position: u32,
    /// The last tokens, which a new chain's penalties are given again.
    recent: std::collections::VecDeque<LlamaToken>,
}

/// A drawn token and, when asked for, its log probabilities.
pub(crate) struct Drawn {
    pub token: LlamaToken,
    /// The token's log probability and the best `top` alternatives, token id first.
    pub logprobs: Option<(f32, Vec<(LlamaToken, f32)>)>,
    /// The grammar allowed no token at all: the choice must end here.
    pub dead_end: bool,
}

impl ChoiceSampler {
    /// A fresh sampler for one choice, with a copy of the job's `grammar`.
    pub fn new(
        params: &std::sync::Arc<GenParams>,
        seed: u32,
        n_vocab: i32,
        grammar: Option<&Grammar>,
    ) -> Self {
        let grammar = grammar.map(Grammar::copy);
        let post_sampling = params.post_sampling_probs;
        let seeded = (params.seed.is_some() && params.temperature > 0.0).then(|| Seeded {
            params: params.clone(),
            seed,
            n_vocab,
            position: 0,
            recent: std::collections::VecDeque::new(),
        });
        Self {
            chain: chain(params, seed, n_vocab),
            grammar,
            logprobs: params.logprobs,
            post_sampling,
            seeded,
        }
    }

    /// A sampler with no settings but greedy choice, for tests.
    #[cfg(test)]
    pub fn greedy() -> Self {
        Self {
            chain: LlamaSampler::greedy(),
            grammar: None,
            logprobs: None,
            post_sampling: false,
            seeded: None,
        }
    }

    /// Feeds the penalties the last tokens of a resumed answer, as if this
    /// sampler had drawn them (the grammar has them already).
    pub fn recall(&mut self, tokens: &[LlamaToken]) {
        let from = tokens.len().saturating_sub(PENALTY_LAST_N as usize);
        for &token in &tokens[from..] {
            self.chain.accept(token);
        }
        if let Some(seeded) = &mut self.seeded {
            seeded.position = tokens.len() as u32;
            seeded.recent.extend(&tokens[from..]);
        }
    }

    /// Before a seeded choice's draw: a chain seeded for its position, its
    /// penalties given the recent tokens again.
    fn reseed(&mut self) {
        let Some(s) = &self.seeded else { return };
        self.chain = chain(&s.params, seed_at(s.seed, s.position), s.n_vocab);
        if s.params.presence_penalty != 0.0 || s.params.frequency_penalty != 0.0 {
            for &token in &s.recent {
                self.chain.accept(token);
            }
        }
    }

    /// After a draw: one more token of the answer.
    fn drew(&mut self, token: LlamaToken) {
        if let Some(s) = &mut self.seeded {
            s.position += 1;
            s.recent.push_back(token);
            if s.recent.len() > PENALTY_LAST_N as usize {
                s.recent.pop_front();
            }
        }
    }

    /// Whether a draw needs every logit in hand (a grammar, or log
    /// probabilities): such draws are made beside the loop ([`super::aside`]).
    pub fn needs_logits(&self) -> bool {
        self.grammar.is_some() || self.logprobs.is_some()
    }

    /// Draws the token at batch index `at` and accepts it, inside llama.cpp:
    /// for a sampler that does not [need the logits](Self::needs_logits).
    pub fn draw(&mut self, ctx: &LlamaContext<'_>, at: i32) -> Drawn {
        if self.needs_logits() {
            return self.draw_from(ctx.get_logits_ith(at));
        }
        self.reseed();
        // llama.cpp's sample accepts the token into the chain itself.
        let token = self.chain.sample(ctx, at);
        self.drew(token);
        Drawn { token, logprobs: None, dead_end: false }
    }

    /// Draws a token from `logits` (one per vocabulary entry) and accepts it.
    pub fn draw_from(&mut self, logits: &[f32]) -> Drawn {
        self.reseed();
        let candidates = || {
            LlamaTokenDataArray::new(
                (0..)
                    .zip(logits)
                    .map(|(i, &l)| LlamaTokenData::new(LlamaToken(i), l, 0.0))
                    .collect(),
                false,
            )
        };
        let mut cur = candidates();
        self.chain.apply(&mut cur);
        let mut token = cur.selected_token();
        let mut drawn_from = self.post_sampling.then(|| sampled(&cur));
        if let Some(grammar) = &mut self.grammar {
            let fits = token.is_some_and(|t| {
                let mut one =
                    LlamaTokenDataArray::new(vec![LlamaTokenData::new(t, 1.0, 0.0)], false);
                grammar.apply(&mut one);
                one.data[0].logit().is_finite()
            });
            if !fits {
                let mut cur = candidates();
                grammar.apply(&mut cur);
                let allowed = cur.data.iter().any(|d| d.logit().is_finite());
                self.chain.apply(&mut cur);
                token = cur.selected_token().filter(|_| allowed);
                drawn_from = self.post_sampling.then(|| sampled(&cur));
            }
            match token {
                Some(t) => grammar.accept(t),
                None => return Drawn { token: LlamaToken(0), logprobs: None, dead_end: true },
            }
        }
        let Some(token) = token else {
            return Drawn { token: LlamaToken(0), logprobs: None, dead_end: true };
        };
        self.chain.accept(token);
        self.drew(token);
        let logprobs = self.logprobs.map(|top| match &drawn_from {
            Some(probs) => post_sampling(probs, token, top as usize),
            None => log_probabilities(logits, token, top as usize),
        });
        Drawn { token, logprobs, dead_end: false }
    }
}

/// The candidates a draw was made from, with their probabilities, best first:
/// what the chain left. A greedy chain computes none: its token had all of it.
fn sampled(cur: &LlamaTokenDataArray) -> Vec<(LlamaToken, f32)> {
    let mut probs: Vec<(LlamaToken, f32)> =
        cur.data.iter().filter(|d| d.p() > 0.0).map(|d| (d.id(), d.p())).collect();
    if probs.is_empty() {
        probs.extend(cur.selected_token().map(|t| (t, 1.0)));
    }
    probs.sort_by(|a, b| b.1.total_cmp(&a.1));
    probs
}

/// As [`log_probabilities`], from the distribution the draw was made from
/// (llama-server's `post_sampling_probs`): tokens the chain cut have none and
/// are never listed.
fn post_sampling(
    probs: &[(LlamaToken, f32)],
    token: LlamaToken,
    top: usize,
) -> (f32, Vec<(LlamaToken, f32)>) {
    let chosen = probs.iter().find(|(t, _)| *t == token).map_or(1.0, |&(_, p)| p);
    (chosen.ln(), probs.iter().take(top).map(|&(t, p)| (t, p.ln())).collect())
}

/// The log probability of `token` under the model's own distribution (the
/// softmax of the raw logits, as llama-server reports it), and the `top` most
/// likely tokens with theirs.
fn log_probabilities(
    logits: &[f32],
    token: LlamaToken,
    top: usize,
) -> (f32, Vec<(LlamaToken, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    let norm = max + sum.ln();
    let logprob = |i: usize| logits[i] - norm;
    let mut best: Vec<usize> = Vec::with_capacity(top + 1);
    if top > 0 {
        let mut order: Vec<usize> = (0..logits.len()).collect();
        let k = top.min(order.len());
        order.select_nth_unstable_by(k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
        best.extend_from_slice(&order[..k]);
        best.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    }
    let chosen = usize::try_from(token.0).unwrap_or(0);
    (logprob(chosen), best.into_iter().map(|i| (LlamaToken(i as i32), logprob(i))).collect())
}

/// The seed of a seeded choice's draw at `position`: splitmix64 of both, so
/// that neighbouring positions get unrelated seeds. Never llama.cpp's
/// `LLAMA_DEFAULT_SEED` (`u32::MAX`), which asks for a random one.
fn seed_at(seed: u32, position: u32) -> u32 {
    let mut z = ((u64::from(seed) << 32) | u64::from(position)).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    let mixed = (z ^ (z >> 31)) as u32;
    if mixed == u32::MAX {
        0
    } else {
        mixed
    }
}

/// The chain of settings, without the grammar.
fn chain(params: &GenParams, seed: u32, n_vocab: i32) -> LlamaSampler {
    let mut chain = Vec::with_capacity(8);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_position_has_its_own_seed() {
        let seeds: std::collections::HashSet<u32> = (0..1000).map(|p| seed_at(7, p)).collect();
        assert_eq!(seeds.len(), 1000);
        assert_eq!(seed_at(7, 3), seed_at(7, 3));
        assert_ne!(seed_at(7, 3), seed_at(8, 3));
        assert!((0..100_000).all(|p| seed_at(u32::MAX, p) != u32::MAX));
    }

    #[test]
    fn log_probabilities_are_a_log_softmax_with_the_best_first() {
        let logits = [0.0f32, 2.0, 1.0, -1.0];
        let (chosen, top) = log_probabilities(&logits, LlamaToken(2), 2);
        let norm = logits.iter().map(|l| l.exp()).sum::<f32>().ln();
        assert!((chosen - (1.0 - norm)).abs() < 1e-5);
        assert_eq!(top.iter().map(|(t, _)| t.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!((top[0].1 - (2.0 - norm)).abs() < 1e-5);
        let total: f32 = (0..4).map(|i| log_probabilities(&logits, LlamaToken(i), 0).0.exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
    }
}
