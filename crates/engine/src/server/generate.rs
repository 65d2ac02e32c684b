//! `POST /v1/completions` and `/v1/embeddings`, and what the chat handler shares
//! with them: submitting a job and waiting for its first event.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use slotgate_protocol::{
    sse, ApiError, Completion, CompletionChoice, CompletionLogprobs, CompletionRequest, Embedding,
    EmbeddingInput, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage, EmbeddingVector,
    FinishReason, PromptItem, StopReason, TokenLogprob, Usage,
};

use slotgate_protocol::native::Timings;
use tokio::sync::mpsc::UnboundedReceiver;

use super::answer::{self, ChunkWriter, Ending, Piece, Shape, Streamed};
use super::body::JsonBody;
use super::AppState;
use crate::error::EngineError;
use crate::scheduler::EmbedKind;
use crate::scheduler::{Event, GenParams, JobInput, Scheduler, Served};

/// OpenAI's default `max_tokens` for text completions.
const COMPLETION_DEFAULT_MAX_TOKENS: u32 = 16;

pub(super) fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Submits a job and waits for its first event, so that a refusal (a full queue,
/// a prompt too long) is still a response of its own status. A streamed request
/// waits at most `keepalive`: past it, the stream opens with keep-alive comments
/// and the first event comes later, in the stream (`None` here).
pub(super) async fn run(
    state: &AppState,
    served: &Served,
    input: JobInput,
    mut params: GenParams,
    stream: bool,
    headers: &axum::http::HeaderMap,
    keep_prompt: bool,
) -> Result<Started, EngineError> {
    server_seed(state, &mut params);
    let scheduler = &state.scheduler;
    check_choices(&input, &params, served.info.max_choices).map_err(EngineError::Api)?;
    // Which gateway replica sent it: the slot state says so, for replicas to
    // tell their own requests from the others'.
    let replica = headers
        .get(slotgate_protocol::REPLICA_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64)
        .map(std::sync::Arc::<str>::from);
    // Rendering and tokenizing are as large as the request: on a blocking thread
    // of their own, never the scheduler's.
    let reader = served.reader.clone();
    let (read, params) = scheduler
        .off_loop(move || {
            let mut params = params;
            let read = reader.read(&input, &mut params);
            (read, params)
        })
        .await
        .map_err(EngineError::Api)?;
    let read = read.map_err(EngineError::Api)?;
    let prompt_tokens = read.prompts.iter().map(|(tokens, _)| tokens.len() as u32).sum();
    let prompt = keep_prompt.then(|| read.prompts.first().map(|(_, text)| text.clone()));
    let (job, mut rx) = Scheduler::job(served.id.clone(), read, params, replica);
    scheduler.submit(job).map_err(EngineError::Api)?;
    let keepalive = keepalive(state);
    let first = match keepalive.filter(|_| stream) {
        Some(wait) => match tokio::time::timeout(wait, answer::first_event(&mut rx)).await {
            Ok(first) => Some(first?),
            Err(_) => None,
        },
        None => Some(answer::first_event(&mut rx).await.map_err(EngineError::Api)?),
    };
    Ok(Started { events: (first, rx), prompt_tokens, prompt: prompt.flatten() })
}

/// A job in the scheduler's hands.
pub(super) struct Started {
    /// Its first event, unless a stream opened before it came, and the rest.
    pub events: (Option<Event>, UnboundedReceiver<Event>),
    /// The tokens of its prompts, known once they were read.
    pub prompt_tokens: u32,
    /// Its (first) prompt as rendered, when asked for: what `__verbose` shows.
    pub prompt: Option<String>,
}

/// The tokens of an answer's prompt, on the answer (not sent): what another
/// API's translation reports before the first token.
#[derive(Debug, Clone, Copy)]
pub struct PromptTokens(pub u32);

/// Refuses a job of more choices (prompts times `n`) than the model's slots and
/// queue hold together: it could never be admitted whole, so it is the request's
/// 400, not the engine's "full" (which a gateway would take as a reason to mark
/// the engine full and look elsewhere).
fn check_choices(input: &JobInput, params: &GenParams, max: u32) -> Result<(), ApiError> {
    let prompts = match input {
        JobInput::Chat(..) => 1,
        JobInput::Prompts(items) => items.len() as u64,
    };
    let choices = prompts * u64::from(params.n);
    if choices <= u64::from(max) {
        return Ok(());
    }
    let (param, what) = if prompts == 1 {
        ("n", format!("n is {}", params.n))
    } else {
        ("prompt", format!("{prompts} prompts times n = {} make {choices} choices", params.n))
    };
    Err(ApiError::invalid(
        param,
        format!(
            "{what}, but this model takes at most {max} choices at once (its slots and queue, \
             n_parallel + queue_size); send fewer in one request"
        ),
    ))
}

/// The keep-alive interval of streams, if there is one.
pub(super) fn keepalive(state: &AppState) -> Option<Duration> {
    let ms = state.config.server.sse_keepalive_ms;
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// The model a request names, looked up once for all that follows. A request
/// that names none gets the only one loaded, as llama-server serves whatever it
/// names; with several loaded it must name one. With `any_model_name`, a name
/// the engine does not know gets the only one loaded too.
pub(super) fn resolve_model(state: &AppState, model: &mut String) -> Result<Served, ApiError> {
    let named = Some(model.as_str()).filter(|m| !m.is_empty());
    let snapshot = state.scheduler.snapshot();
    let served = match snapshot.serve(named) {
        Err(err) if state.config.server.any_model_name && err.status() == 404 => {
            snapshot.serve(None).map_err(|_| err)?
        }
        other => other?,
    };
    super::recorded::serving(&served.id);
    // An alias becomes the model's own name here, so everything after (and the
    // answer's `model`) sees one name.
    model.clone_from(&served.id);
    Ok(served)
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    JsonBody(mut req): JsonBody<CompletionRequest>,
) -> Result<Response, EngineError> {
    let served = resolve_model(&state, &mut req.model)?;
    req.validate().map_err(EngineError::Api)?;
    let max_tokens = req.max_tokens.unwrap_or(COMPLETION_DEFAULT_MAX_TOKENS);
    let params = completion_params(&req, Some(max_tokens), &state.sampling)?;
    let items = req.prompt.items();
    let shape = Shape { choices: items.len() as u32 * params.n };
    let (id, created) = stream_id(&req.sampling, "cmpl");
    let writer = CompletionChunks {
        id,
        created,
        model: req.model.clone(),
        logprobs: params.logprobs.is_some(),
    };
    let streamed = streamed(&state, &req.sampling, &headers);
    let job = JobInput::Prompts(items);
    let events =
        run(&state, &served, job, params, streamed.is_some(), &headers, false).await?.events;
    let answer = answer::respond(events, writer, shape, streamed, |writer, done| {
        let (usage, timings) = (done.usage.clone(), done.timings);
        let choices = done
            .choices()
            .map(|c| {
                let logprobs = writer.logprobs(&c.logprobs, 0);
                let mut choice = writer.choice(c.index, c.text, Some(c.reason), logprobs);
                choice.stop_reason = c.stop.map(StopReason::Text);
                choice
            })
            .collect();
        Json(writer.completion(choices, Some(usage), Some(timings))).into_response()
    });
    Ok(answer.await?)
}

/// The engine's own seed (`seed`, llama-server's `--seed`) for a request
/// that sends none.
pub(super) fn server_seed(state: &AppState, params: &mut GenParams) {
    let seed = state.config.server.seed;
    if params.seed.is_none() && seed >= 0 {
        params.seed = Some(seed);
    }
}

/// How a text completion samples, with at most `max_tokens` per choice
/// (`None`: until the context is full), `defaults` where it sends nothing.
pub(super) fn completion_params(
    req: &CompletionRequest,
    max_tokens: Option<u32>,
    defaults: &GenParams,
) -> Result<GenParams, EngineError> {
    let mut params = GenParams::from_sampling(&req.sampling, max_tokens, defaults);
    params.logprobs = req
        .logprobs
        .or(req.sampling.n_probs.filter(|n| *n > 0))
        .map(|n| n.min(slotgate_protocol::logprobs::MAX_TOP_LOGPROBS));
    params.echo = req.echo.unwrap_or(false);
    params.grammar = crate::constrain::grammar(
        req.sampling.grammar.as_deref(),
        req.sampling.json_schema.as_ref(),
        req.response_format.as_ref(),
    )?;
    Ok(params)
}

/// How a request's answer is streamed, if it asked for a stream: marked with
/// its tokens when the gateway asks ([`slotgate_protocol::resume`]).
pub(super) fn streamed(
    state: &AppState,
    sampling: &slotgate_protocol::Sampling,
    headers: &axum::http::HeaderMap,
) -> Option<Streamed> {
    sampling.is_stream().then(|| Streamed {
        keepalive: keepalive(state),
        include_usage: sampling.include_usage(),
        mark: headers.contains_key(slotgate_protocol::resume::MARK_HEADER),
    })
}

/// A stream's `id` and `created`: those it had on the engine it began on,
/// when it is resumed; else new ones, the id starting with `prefix`.
pub(super) fn stream_id(sampling: &slotgate_protocol::Sampling, prefix: &str) -> (String, u64) {
    match sampling.slotgate_resume.as_ref().filter(|r| !r.id.is_empty()) {
        Some(resume) => (resume.id.clone(), resume.created),
        None => (crate::ids::next(prefix), now()),
    }
}

struct CompletionChunks {
    id: String,
    created: u64,
    model: String,
    /// Whether choices carry log probabilities.
    logprobs: bool,
}

impl CompletionChunks {
    fn choice(
        &self,
        index: u32,
        text: String,
        finish_reason: Option<FinishReason>,
        logprobs: Option<CompletionLogprobs>,
    ) -> CompletionChoice {
        CompletionChoice { text, index, logprobs, finish_reason, stop_reason: None }
    }

    fn logprobs(&self, tokens: &[TokenLogprob], offset: u32) -> Option<CompletionLogprobs> {
        self.logprobs.then(|| CompletionLogprobs::new(tokens, offset))
    }

    fn completion(
        &self,
        choices: Vec<CompletionChoice>,
        usage: Option<Usage>,
        timings: Option<Timings>,
    ) -> Completion {
        Completion {
            id: self.id.clone(),
            object: "text_completion".into(),
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: Some(crate::SYSTEM_FINGERPRINT.into()),
            choices,
            usage,
            timings,
        }
    }
}

impl ChunkWriter for CompletionChunks {
    fn open(&self, _index: u32) -> Option<String> {
        None
    }

    fn text(&self, index: u32, piece: Piece) -> String {
        let logprobs = self.logprobs(&piece.logprobs, piece.offset);
        let choice = self.choice(index, piece.text, None, logprobs);
        sse::encode(&self.completion(vec![choice], None, None))
    }

    fn finish(&self, index: u32, ending: Ending) -> String {
        let mut choice = self.choice(index, String::new(), Some(ending.reason), None);
        choice.stop_reason = ending.stop.map(StopReason::Text);
        let timings = answer::timings(&ending.usage);
        sse::encode(&self.completion(vec![choice], None, Some(timings)))
    }

    fn usage(&self, usage: Usage, timings: Timings) -> String {
        sse::encode(&self.completion(Vec::new(), Some(usage), Some(timings)))
    }
}

/// `POST /v1/embeddings`. A model without pooling is refused: OpenAI's
/// shape has room for one vector per input.
pub async fn embeddings(
    State(state): State<AppState>,
    JsonBody(mut req): JsonBody<EmbeddingRequest>,
) -> Result<Response, EngineError> {
    let (read, vectors) = embed(&state, &mut req).await?;
    if read == EmbedKind::PerToken {
        let why = format!(
            "model `{}` is loaded with pooling `none`: a vector per token, which OpenAI's \
             embeddings cannot carry; POST /embeddings for them",
            req.model
        );
        return Err(EngineError::Api(ApiError::invalid("model", why)));
    }
    let format = req.encoding_format.unwrap_or_default();
    let tokens: u32 = vectors.iter().map(|e| e.tokens).sum();
    Ok(Json(EmbeddingResponse {
        object: "list".into(),
        data: vectors
            .into_iter()
            .enumerate()
            .map(|(i, e)| Embedding {
                object: "embedding".into(),
                embedding: EmbeddingVector::encode(
                    e.vectors.into_iter().next().unwrap_or_default(),
                    format,
                ),
                index: i as u32,
            })
            .collect(),
        model: req.model,
        usage: EmbeddingUsage { prompt_tokens: tokens, total_tokens: tokens },
    })
    .into_response())
}

/// `POST /embeddings`, llama-server's own: each input's vectors, as
/// `[{"index": 0, "embedding": [[...]]}]`: one pooled vector, or one per
/// token for a model without pooling.
pub async fn native_embeddings(
    State(state): State<AppState>,
    JsonBody(mut req): JsonBody<EmbeddingRequest>,
) -> Result<Response, EngineError> {
    let (_, vectors) = embed(&state, &mut req).await?;
    let answer: Vec<serde_json::Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, e)| serde_json::json!({"index": index, "embedding": e.vectors}))
        .collect();
    Ok(Json(answer).into_response())
}

/// Embeds a request's inputs with the model it names; says what the model's
/// context gives.
async fn embed(
    state: &AppState,
    req: &mut EmbeddingRequest,
) -> Result<(EmbedKind, Vec<crate::scheduler::Embedded>), EngineError> {
    let served = resolve_model(state, &mut req.model)?;
    req.validate().map_err(EngineError::Api)?;
    let inputs = match &req.input {
        EmbeddingInput::Text(s) => vec![PromptItem::Text(s.clone())],
        EmbeddingInput::Texts(v) => v.iter().cloned().map(PromptItem::Text).collect(),
        EmbeddingInput::Tokens(t) => vec![PromptItem::Tokens(t.clone())],
        EmbeddingInput::TokenArrays(v) => v.iter().cloned().map(PromptItem::Tokens).collect(),
    };
    let read = EmbedKind::of(&served.info);
    let vectors = state.scheduler.embed(&served, inputs).await.map_err(EngineError::Api)?;
    Ok((read, vectors))
}
