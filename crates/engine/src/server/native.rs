//! llama-server's own completion API, `POST /completion` (and `/completions`'s
//! twin without `/v1`, which stays OpenAI's): the same job as a text
//! completion, through the same queue and slots, answered in llama-server's
//! shape: `content`, `tokens`, `stop`, `stop_type`, `stopping_word`,
//! `tokens_predicted`, `tokens_evaluated`, `tokens_cached`, `id_slot`,
//! `generation_settings`, `timings`; several prompts answer a list. A stream
//! is one such object per event, the last one whole, with no `[DONE]`.

use std::sync::Mutex;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use slotgate_protocol::native::{stop_type, NativeRequest, Timings};
use slotgate_protocol::{sse, PromptItem, TokenLogprob, Usage};

use super::answer::{self, Choice, ChunkWriter, Ending, Piece, Shape};
use super::body::JsonBody;
use super::generate::{completion_params, resolve_model, run, server_seed, streamed};
use super::AppState;
use crate::error::EngineError;
use crate::scheduler::{GenParams, JobInput, PromptProgress};

/// `POST /completion`.
pub async fn completion(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    JsonBody(native): JsonBody<NativeRequest>,
) -> Result<Response, EngineError> {
    let mut req = native.to_completion();
    let served = resolve_model(&state, &mut req.model)?;
    req.validate()?;
    let max_tokens = native.max_tokens(state.config.server.n_predict)?;
    let mut params = completion_params(&req, max_tokens, &state.sampling)?;
    (params.logit_bias, params.logit_bias_text) = native.logit_bias()?;
    // Here, not when read, so that its settings show the biases.
    served.reader.ban_eog(&mut params);
    server_seed(&state, &mut params);
    let items = req.prompt.items();
    let shape = Shape { choices: items.len() as u32 * params.n };
    let prompts = items
        .iter()
        .map(|item| match item {
            PromptItem::Text(text) => text.clone(),
            _ => String::new(),
        })
        .collect();
    let writer = NativeChunks {
        model: req.model.clone(),
        settings: {
            let mut settings = settings(&params, max_tokens.map_or(-1, i64::from));
            settings["ignore_eos"] = json!(native.sampling.ignore_eos.unwrap_or(false));
            settings
        },
        prompts,
        samples: params.n,
        return_tokens: native.return_tokens.unwrap_or(false),
        logprobs: params.logprobs.is_some(),
        post_sampling: params.post_sampling_probs,
        predicted: Mutex::new(vec![0; shape.choices as usize]),
    };
    let streamed = streamed(&state, &req.sampling, &headers).map(|mut s| {
        s.include_usage = false;
        s
    });
    let events =
        run(&state, &served, JobInput::Prompts(items), params, streamed.is_some(), &headers, false)
            .await?
            .events;
    let several = shape.choices > 1;
    let answer = answer::respond(events, writer, shape, streamed, move |writer, done| {
        let mut results: Vec<Value> = done.choices().map(|c| writer.result(c)).collect();
        match (several, results.pop()) {
            (false, Some(one)) => Json(one).into_response(),
            (_, last) => {
                results.extend(last);
                Json(results).into_response()
            }
        }
    });
    Ok(answer.await?)
}

/// llama-server's `__verbose` of a chat answer: `choice` as `/completion`
/// answers it, with `prompt`, the conversation as rendered.
pub(super) fn verbose(model: &str, params: &GenParams, prompt: String, choice: &Choice) -> Value {
    let writer = NativeChunks {
        model: model.into(),
        settings: settings(params, params.max_tokens.map_or(-1, i64::from)),
        prompts: vec![prompt],
        samples: params.n,
        return_tokens: false,
        logprobs: false,
        post_sampling: false,
        predicted: Mutex::default(),
    };
    let ending = Ending { reason: choice.reason, stop: choice.stop.clone(), usage: choice.usage };
    writer.finished(choice.index, choice.text.clone(), Vec::new(), &ending)
}

/// llama-server's event of a prompt's reading: no text, its `prompt_progress`
/// and the `timings` so far.
fn progress_event(index: u32, p: &PromptProgress) -> Value {
    let (progress, timings) = progress_parts(p);
    json!({"index": index, "content": "", "tokens": [], "stop": false, "id_slot": -1,
        "tokens_predicted": 0, "tokens_evaluated": p.total,
        "timings": timings, "prompt_progress": progress})
}

/// A prompt's reading as llama-server reports it: `prompt_progress`, and the
/// `timings` so far (nothing generated yet).
pub(super) fn progress_parts(
    p: &PromptProgress,
) -> (slotgate_protocol::native::PromptProgress, Timings) {
    let time_ms = p.time.as_secs_f64() * 1e3;
    let progress = slotgate_protocol::native::PromptProgress {
        total: p.total,
        cache: p.cache,
        processed: p.processed,
        time_ms,
    };
    (progress, Timings::new(p.cache, (p.processed, time_ms), (0, 0, 0.0)))
}

/// llama-server's `generation_settings`: the settings a request ran with.
fn settings(params: &GenParams, n_predict: i64) -> Value {
    json!({
        "seed": params.seed.unwrap_or(i64::from(u32::MAX)),
        "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
        "min_p": params.min_p, "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty, "stop": params.stop,
        "n_predict": n_predict, "max_tokens": n_predict, "n": params.n,
        "n_probs": params.logprobs.unwrap_or(0), "cache_prompt": params.cache_prompt,
        "grammar": params.grammar.clone().unwrap_or_default(),
        // -inf (a ban) is written as null, as llama-server writes it.
        "logit_bias": params.logit_bias.iter()
            .map(|&(token, bias)| json!({"token": token, "bias": bias}))
            .collect::<Vec<_>>(),
        "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
    })
}

/// llama-server's `completion_probabilities`: each token and each of its
/// alternatives with its id and its log probability.
/// With `post` (`post_sampling_probs`), probabilities (`prob`, `top_probs`) of
/// the distribution drawn from, as llama-server writes them.
fn probabilities(tokens: &[i32], logprobs: &[TokenLogprob], post: bool) -> Value {
    let (key, top_key) = if post { ("prob", "top_probs") } else { ("logprob", "top_logprobs") };
    let entry = |id: Option<i32>, token: &str, logprob: f32, bytes: &Option<Vec<u8>>| {
        let value = if post { logprob.exp() } else { logprob };
        let mut e = json!({"token": token, key: value,
            "bytes": bytes.clone().unwrap_or_else(|| token.as_bytes().to_vec())});
        if let Some(id) = id {
            e["id"] = json!(id);
        }
        e
    };
    let each = logprobs.iter().enumerate().map(|(k, t)| {
        let mut e = entry(tokens.get(k).copied(), &t.token, t.logprob, &t.bytes);
        let top: Vec<Value> =
            t.top_logprobs.iter().map(|a| entry(a.id, &a.token, a.logprob, &a.bytes)).collect();
        e[top_key] = json!(top);
        e
    });
    Value::Array(each.collect())
}

struct NativeChunks {
    model: String,
    settings: Value,
    /// Each prompt's text (empty for ids).
    prompts: Vec<String>,
    /// Choices per prompt.
    samples: u32,
    return_tokens: bool,
    logprobs: bool,
    /// Probabilities after the sampler chain (`post_sampling_probs`).
    post_sampling: bool,
    /// Tokens streamed so far, per choice.
    predicted: Mutex<Vec<u32>>,
}

impl NativeChunks {
    /// The whole answer of one choice, or the last event of its stream.
    fn finished(&self, index: u32, content: String, tokens: Vec<i32>, ending: &Ending) -> Value {
        let usage = &ending.usage;
        let prompt = self.prompts.get((index / self.samples.max(1)) as usize);
        json!({
            "index": index, "content": content, "tokens": tokens,
            "id_slot": usage.slot, "stop": true, "model": self.model,
            "tokens_predicted": usage.completion_tokens,
            "tokens_evaluated": usage.prompt_tokens,
            "generation_settings": self.settings,
            "prompt": prompt.cloned().unwrap_or_default(),
            "has_new_line": content.contains('\n'), "truncated": false,
            "stop_type": stop_type(ending.reason, ending.stop.is_some()),
            "stopping_word": ending.stop.clone().unwrap_or_default(),
            "tokens_cached": usage.prompt_tokens + usage.completion_tokens,
            "timings": answer::timings(usage),
        })
    }

    /// The whole answer of a collected choice.
    fn result(&self, c: Choice) -> Value {
        let ending = Ending { reason: c.reason, stop: c.stop, usage: c.usage };
        let tokens = if self.return_tokens { c.tokens.clone() } else { Vec::new() };
        let mut result = self.finished(c.index, c.text, tokens, &ending);
        if self.logprobs {
            result["completion_probabilities"] =
                probabilities(&c.tokens, &c.logprobs, self.post_sampling);
        }
        result
    }
}

impl ChunkWriter for NativeChunks {
    fn open(&self, _index: u32) -> Option<String> {
        None
    }

    fn text(&self, index: u32, piece: Piece) -> String {
        let predicted = {
            let mut counts = self.predicted.lock().unwrap_or_else(|e| e.into_inner());
            let count = counts.get_mut(index as usize);
            count.map_or(0, |n| {
                *n += piece.tokens.len() as u32;
                *n
            })
        };
        let mut event = json!({"index": index, "content": piece.text, "tokens": piece.tokens,
            "stop": false, "id_slot": -1, "tokens_predicted": predicted});
        if let Some(timings) = piece.timings {
            event["timings"] = json!(timings);
        }
        if self.logprobs {
            event["completion_probabilities"] =
                probabilities(&piece.tokens, &piece.logprobs, self.post_sampling);
        }
        sse::encode(&event)
    }

    fn finish(&self, index: u32, ending: Ending) -> String {
        sse::encode(&self.finished(index, String::new(), Vec::new(), &ending))
    }

    fn usage(&self, _usage: Usage, _timings: Timings) -> String {
        String::new()
    }

    /// llama-server's own stream ends with its last event.
    fn done(&self) -> &'static str {
        ""
    }

    /// An event with no text, its `prompt_progress` and the `timings` so far,
    /// as llama-server sends them.
    fn progress(&self, index: u32, progress: &PromptProgress) -> String {
        sse::encode(&progress_event(index, progress))
    }
}
