//! llama-server's own completion API, `POST /completion`: its request (a
//! prompt in any of llama-server's forms, `n_predict`, `return_tokens`) as the
//! text completion it means, the names of its answer's stop types, and the
//! `timings` that llama-server adds to every answer (chat's too).

use serde::{Deserialize, Serialize};

use crate::logit_bias::Resolved;
use crate::{ApiError, CompletionRequest, FinishReason, Prompt, Sampling};

/// The body of `POST /completion`. Sampling fields are chat's and completions'
/// (llama.cpp's own among them); fields this server does not use are accepted
/// and ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NativeRequest {
    /// The model; left out, the only one served.
    #[serde(default)]
    pub model: String,
    /// The prompt or prompts.
    pub prompt: Prompt,
    /// Most tokens to generate; -1 (the default) until the context is full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_predict: Option<i64>,
    /// Send the ids of the generated tokens in `tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_tokens: Option<bool>,
    /// Sampling and streaming settings.
    #[serde(flatten)]
    pub sampling: Sampling,
}

impl NativeRequest {
    /// The most tokens it may generate, under a server whose own `n_predict`
    /// is `server` (its default and bound; -1 for none): `None` until the
    /// context is full.
    pub fn max_tokens(&self, server: i64) -> Result<Option<u32>, ApiError> {
        let bound = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
        let server = (server >= 0).then(|| bound(server));
        let asked = match self.n_predict {
            Some(0) => {
                return Err(ApiError::invalid("n_predict", "n_predict must be at least 1, or -1"))
            }
            Some(n) if n > 0 => Some(bound(n)),
            _ => None,
        };
        // The request's own wins, as llama-server takes it; the server's is
        // the default.
        Ok(asked.or(server))
    }

    /// The text completion it means, less its `logit_bias`, which
    /// [`Self::logit_bias`] reads in llama-server's forms.
    pub fn to_completion(&self) -> CompletionRequest {
        let mut req = CompletionRequest::new(self.model.clone(), self.prompt.clone());
        req.sampling = self.sampling.clone();
        req.sampling.logit_bias = None;
        req
    }

    /// Its `logit_bias`, checked: the biases of token ids, and of texts (to
    /// be tokenized).
    pub fn logit_bias(&self) -> Result<(Resolved<i32>, Resolved<String>), ApiError> {
        let Some(bias) = &self.sampling.logit_bias else { return Ok(Default::default()) };
        bias.check_llama_server()?;
        Ok(bias.resolve())
    }
}

/// llama-server's `stop_type` of a choice that ended for `reason`, at a stop
/// string if `word`: `eos` (the model's end), `word`, or `limit` (`n_predict`
/// or the context).
pub fn stop_type(reason: FinishReason, word: bool) -> &'static str {
    match reason {
        FinishReason::Length => "limit",
        _ if word => "word",
        _ => "eos",
    }
}

/// llama-server's `prompt_progress` (with `return_progress`): a prompt's
/// tokens, those found cached, those read so far, and the time that took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PromptProgress {
    /// Tokens of the prompt.
    pub total: u32,
    /// Tokens found in the slot's cache.
    pub cache: u32,
    /// Tokens read so far.
    pub processed: u32,
    /// Milliseconds since the slot took the prompt.
    pub time_ms: f64,
}

/// llama-server's `timings`: how long reading the prompt and generating took,
/// and their rates. Sent with every finished answer, and with each streamed
/// chunk when the request asks for `timings_per_token`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Prompt tokens found in the cache and not read again.
    pub cache_n: u32,
    /// Prompt tokens read.
    pub prompt_n: u32,
    /// Milliseconds spent reading them.
    pub prompt_ms: f64,
    /// Milliseconds per prompt token read.
    pub prompt_per_token_ms: f64,
    /// Prompt tokens read per second.
    pub prompt_per_second: f64,
    /// Tokens generated.
    pub predicted_n: u32,
    /// Milliseconds spent generating them.
    pub predicted_ms: f64,
    /// Milliseconds per generated token.
    pub predicted_per_token_ms: f64,
    /// Tokens generated per second.
    pub predicted_per_second: f64,
}

impl Timings {
    /// The timings of `prompt_n` tokens read in `prompt_ms` (besides `cache_n`
    /// from the cache) and `predicted_n` generated in `predicted_ms` over
    /// `steps` decode steps. As llama-server counts them, a choice's first
    /// token comes with its prompt's last batch, so its generation takes one
    /// step fewer than its tokens, and its rates are per step.
    pub fn new(
        cache_n: u32,
        (prompt_n, prompt_ms): (u32, f64),
        (predicted_n, steps, predicted_ms): (u32, u32, f64),
    ) -> Self {
        let per = |ms: f64, n: u32| if n > 0 { ms / f64::from(n) } else { 0.0 };
        let rate = |ms: f64, n: u32| if ms > 0.0 { 1e3 * f64::from(n) / ms } else { 0.0 };
        Self {
            cache_n,
            prompt_n,
            prompt_ms,
            prompt_per_token_ms: per(prompt_ms, prompt_n),
            prompt_per_second: rate(prompt_ms, prompt_n),
            predicted_n,
            predicted_ms,
            predicted_per_token_ms: per(predicted_ms, steps),
            predicted_per_second: rate(predicted_ms, steps),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{PromptItem, PromptPiece};

    fn request(body: serde_json::Value) -> NativeRequest {
        serde_json::from_value(body).unwrap()
    }

    /// llama-server's prompt forms: text, ids, ids and text in one prompt, and
    /// several prompts of different forms.
    #[test]
    fn every_prompt_form_is_read_as_llama_server_reads_it() {
        let items = |body| request(body).prompt.items();
        assert_eq!(items(json!({"prompt": "hi"})), [PromptItem::Text("hi".into())]);
        assert_eq!(items(json!({"prompt": [1, 2]})), [PromptItem::Tokens(vec![1, 2])]);
        assert_eq!(
            items(json!({"prompt": [1, "a", 2]})),
            [PromptItem::Mixed(vec![
                PromptPiece::Token(1),
                PromptPiece::Text("a".into()),
                PromptPiece::Token(2)
            ])]
        );
        assert_eq!(
            items(json!({"prompt": [[1, 2], "a", {"prompt_string": "b"}]})),
            [
                PromptItem::Tokens(vec![1, 2]),
                PromptItem::Text("a".into()),
                PromptItem::Text("b".into())
            ]
        );
        assert_eq!(items(json!({"prompt": ["a", "b"]})).len(), 2);
        assert_eq!(
            items(json!({"prompt": {"prompt_string": "b"}})),
            [PromptItem::Text("b".into())]
        );
        let media = request(json!({"prompt": [{"prompt_string": "a", "multimodal_data": ["x"]}]}));
        assert!(media.prompt.has_media());
        let one = request(json!({"prompt": {"prompt_string": "a", "multimodal_data": "x"}}));
        assert!(one.prompt.has_media());
    }

    #[test]
    fn n_predict_minus_one_is_unbounded_and_zero_is_refused() {
        let max = |body, server| request(body).max_tokens(server);
        assert_eq!(max(json!({"prompt": "a"}), -1).unwrap(), None);
        assert_eq!(max(json!({"prompt": "a", "n_predict": -1}), -1).unwrap(), None);
        assert_eq!(max(json!({"prompt": "a", "n_predict": 8}), -1).unwrap(), Some(8));
        let err = max(json!({"prompt": "a", "n_predict": 0}), -1).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("n_predict"));
        // The server's own: the default, which a request's own overrides.
        assert_eq!(max(json!({"prompt": "a"}), 64).unwrap(), Some(64));
        assert_eq!(max(json!({"prompt": "a", "n_predict": -1}), 64).unwrap(), Some(64));
        assert_eq!(max(json!({"prompt": "a", "n_predict": 8}), 64).unwrap(), Some(8));
        assert_eq!(max(json!({"prompt": "a", "n_predict": 100}), 64).unwrap(), Some(100));
    }

    #[test]
    fn timings_rate_what_was_done_and_nothing_for_nothing() {
        let t = Timings::new(3, (10, 20.0), (5, 4, 100.0));
        assert_eq!((t.cache_n, t.prompt_n, t.predicted_n), (3, 10, 5));
        assert_eq!((t.prompt_per_token_ms, t.prompt_per_second), (2.0, 500.0));
        assert_eq!((t.predicted_per_token_ms, t.predicted_per_second), (25.0, 40.0));
        // One token is no step: no rate, rather than an infinite one.
        let one = Timings::new(5, (0, 0.0), (1, 0, 0.01));
        assert_eq!((one.prompt_per_second, one.predicted_per_token_ms), (0.0, 0.0));
        assert_eq!(one.predicted_per_second, 0.0);
    }

    #[test]
    fn stop_types_are_llama_servers() {
        assert_eq!(stop_type(FinishReason::Length, false), "limit");
        assert_eq!(stop_type(FinishReason::Stop, true), "word");
        assert_eq!(stop_type(FinishReason::Stop, false), "eos");
    }
}
