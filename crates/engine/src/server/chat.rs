//! `POST /v1/chat/completions`: a conversation in, a message out, with tools,
//! structured output and log probabilities.
//!
//! With tools a streamed answer is held back until it is known to be a call or a
//! reply. In the generic form both go out while they are written: a call as
//! OpenAI streams them (id, type and name first, then the arguments in pieces,
//! then `finish_reason: "tool_calls"`), a reply (`{"response": "..."}`) as
//! content. In a template's own format the answer is read whole at its end.

use std::sync::Mutex;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use slotgate_protocol::native::Timings;
use slotgate_protocol::{
    sse, AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest,
    ChoiceLogprobs, ChunkChoice, Delta, FinishReason, FunctionCallDelta, Role, StopReason,
    TokenLogprob, ToolCall, ToolCallDelta, Usage,
};

use super::answer::{self, ChunkWriter, Ending, Piece, Shape};
use super::body::JsonBody;
use super::chat_job::{self, ChatJob};
use super::generate::{resolve_model, run, stream_id, streamed, PromptTokens};
use super::AppState;
use crate::error::EngineError;
use crate::scheduler::{GenParams, PromptProgress, Served};
use crate::tools::calls::{CallPiece, CallReader};
use crate::tools::reply::ReplyReader;
use crate::tools::{CallFormat, ToolPlan};

/// Pieces a streamed call's arguments are sent in, at most.
const ARGUMENT_PIECES: usize = 4;

/// `POST /v1/chat/completions`.
pub async fn chat(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    JsonBody(req): JsonBody<ChatCompletionRequest>,
) -> Result<Response, EngineError> {
    respond(&state, &headers, req).await
}

/// The answer to a chat request, streamed or whole: what `/v1/chat/completions`
/// answers, and what `/v1/messages` translates.
pub(super) async fn respond(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    mut req: ChatCompletionRequest,
) -> Result<Response, EngineError> {
    let served = resolve_model(state, &mut req.model)?;
    respond_by(state, headers, req, served).await
}

/// As [`respond`], by the model `served` (`req.model` is its id).
pub(super) async fn respond_by(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    mut req: ChatCompletionRequest,
    served: Served,
) -> Result<Response, EngineError> {
    let state = state.clone();
    let ChatJob { input, params, plan } = chat_job::read(&mut req, &served, &state)?;
    let shape = Shape { choices: params.n };
    let held = Mutex::new(vec![Held::default(); shape.choices as usize]);
    let ((id, created), model) = (stream_id(&req.sampling, "chatcmpl"), req.model);
    let logprobs = params.logprobs.is_some();
    let streamed = streamed(&state, &req.sampling, headers);
    // llama-server's `__verbose`, on whole answers only, as there.
    let verbose = req.sampling.verbose.unwrap_or(state.config.server.verbose) && streamed.is_none();
    let verbose = verbose.then(|| params.clone());
    let writer = ChatChunks { id, created, model, logprobs, plan, held };
    let keep_prompt = verbose.is_some();
    let started =
        run(&state, &served, input, params, streamed.is_some(), headers, keep_prompt).await?;
    let prompt_tokens = PromptTokens(started.prompt_tokens);
    let verbose = verbose.map(|params| (params, started.prompt.unwrap_or_default()));
    let answer = answer::respond(started.events, writer, shape, streamed, |writer, done| {
        whole(writer, done, verbose)
    });
    let mut response = answer.await?;
    response.extensions_mut().insert(prompt_tokens);
    Ok(response)
}

/// The whole answer, with llama-server's `__verbose` when asked for (the
/// settings it ran with and its prompt as rendered).
fn whole(
    writer: ChatChunks,
    done: answer::Collected,
    verbose: Option<(GenParams, String)>,
) -> Response {
    let (usage, timings) = (done.usage.clone(), done.timings);
    let choices: Vec<answer::Choice> = done.choices().collect();
    let verbose = verbose.zip(choices.first()).map(|((params, prompt), first)| {
        super::native::verbose(&writer.model, &params, prompt, first)
    });
    let choices = choices
        .into_iter()
        .map(|choice| {
            let (message, reason) = message(writer.plan.as_ref(), choice.text, choice.reason);
            ChatChoice {
                index: choice.index,
                message,
                logprobs: writer.logprobs.then(|| ChoiceLogprobs::new(choice.logprobs)),
                finish_reason: Some(reason),
                stop_reason: choice.stop.map(StopReason::Text),
            }
        })
        .collect();
    Json(ChatCompletion {
        id: writer.id,
        object: "chat.completion".into(),
        created: writer.created,
        model: writer.model,
        system_fingerprint: Some(crate::SYSTEM_FINGERPRINT.into()),
        choices,
        usage: Some(usage),
        timings: Some(timings),
        verbose,
    })
    .into_response()
}

/// The assistant's message from its whole text, and the finish reason: with
/// tools, the calls it makes (`tool_calls`, when it made any and was not cut off).
fn message(
    plan: Option<&ToolPlan>,
    text: String,
    reason: FinishReason,
) -> (AssistantMessage, FinishReason) {
    let Some(plan) = plan else { return (AssistantMessage::text(text), reason) };
    if reason != FinishReason::Stop {
        // Cut off: no call is made up from half of one, but a generic reply's
        // text is what was streamed of it.
        if plan.format == CallFormat::Generic && !plan.required {
            let mut reader = ReplyReader::default();
            let reply = reader.push(&text);
            if reader.is_reply() {
                return (AssistantMessage::text(reply), reason);
            }
        }
        return (AssistantMessage::text(text), reason);
    }
    let (content, calls) = plan.read_answer(&text);
    if calls.is_empty() {
        return (AssistantMessage::text(content.unwrap_or_default()), reason);
    }
    let message =
        AssistantMessage { role: Role::Assistant, content, refusal: None, tool_calls: Some(calls) };
    (message, FinishReason::ToolCalls)
}

/// A choice's text and log probabilities held back until it is known whether it
/// is a call.
#[derive(Debug, Clone, Default)]
struct Held {
    text: String,
    logprobs: Vec<TokenLogprob>,
    /// Reads a generic reply as it comes.
    reply: ReplyReader,
    /// Reads generic calls as they come.
    calls: CallReader,
}

struct ChatChunks {
    id: String,
    created: u64,
    model: String,
    /// Whether chunks carry log probabilities.
    logprobs: bool,
    /// The request's tools, when it may call any.
    plan: Option<ToolPlan>,
    /// With tools, each choice's text so far.
    held: Mutex<Vec<Held>>,
}

impl ChatChunks {
    fn chunk(
        &self,
        choices: Vec<ChunkChoice>,
        usage: Option<Usage>,
        timings: Option<Timings>,
    ) -> String {
        sse::encode(&self.frame(choices, usage, timings))
    }

    fn frame(
        &self,
        choices: Vec<ChunkChoice>,
        usage: Option<Usage>,
        timings: Option<Timings>,
    ) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: Some(crate::SYSTEM_FINGERPRINT.into()),
            choices,
            usage,
            timings,
            prompt_progress: None,
        }
    }

    fn delta(&self, index: u32, delta: Delta, finish_reason: Option<FinishReason>) -> String {
        let choice = ChunkChoice { index, delta, logprobs: None, finish_reason, stop_reason: None };
        self.chunk(vec![choice], None, None)
    }

    /// The last chunk of a choice: its finish reason, the stop string that
    /// ended it, if one did, and its timings.
    fn last(&self, index: u32, reason: FinishReason, ending: &Ending) -> String {
        let stop = ending.stop.clone();
        let choice = ChunkChoice {
            index,
            delta: Delta::default(),
            logprobs: None,
            finish_reason: Some(reason),
            stop_reason: stop.map(StopReason::Text),
        };
        self.chunk(vec![choice], None, Some(answer::timings(&ending.usage)))
    }

    /// Text of choice `index`, with the `timings` so far when asked for.
    fn content(
        &self,
        index: u32,
        text: String,
        (logprobs, timings): (Vec<TokenLogprob>, Option<Timings>),
    ) -> String {
        let delta = Delta { content: Some(text), ..Delta::default() };
        let logprobs = self.logprobs.then(|| ChoiceLogprobs::new(logprobs));
        let choice = ChunkChoice { index, delta, logprobs, finish_reason: None, stop_reason: None };
        self.chunk(vec![choice], None, timings)
    }

    /// The chunks of one whole call: its id, type and name, then its arguments
    /// in pieces.
    fn call(&self, index: u32, position: u32, call: ToolCall) -> String {
        let mut out = self.call_start(index, position, call.id, call.function.name);
        for part in pieces(&call.function.arguments, ARGUMENT_PIECES) {
            out.push_str(&self.call_arguments(index, position, part));
        }
        out
    }

    /// The chunk that opens a call: its id, type and name.
    fn call_start(&self, index: u32, position: u32, id: String, name: String) -> String {
        let function = FunctionCallDelta { name: Some(name), arguments: Some(String::new()) };
        let delta = ToolCallDelta {
            index: position,
            id: Some(id),
            kind: Some("function".into()),
            function,
        };
        self.delta(index, Delta { tool_calls: Some(vec![delta]), ..Delta::default() }, None)
    }

    /// A chunk of a call's arguments.
    fn call_arguments(&self, index: u32, position: u32, text: String) -> String {
        let function = FunctionCallDelta { name: None, arguments: Some(text) };
        let delta = ToolCallDelta { index: position, id: None, kind: None, function };
        self.delta(index, Delta { tool_calls: Some(vec![delta]), ..Delta::default() }, None)
    }
}

/// `text` cut into at most `n` pieces of about equal length, on character bounds.
fn pieces(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(n).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

impl ChunkWriter for ChatChunks {
    fn open(&self, index: u32) -> Option<String> {
        let delta = Delta { role: Some(Role::Assistant), content: None, tool_calls: None };
        Some(self.delta(index, delta, None))
    }

    fn text(&self, index: u32, piece: Piece) -> String {
        let Piece { text, logprobs, timings, .. } = piece;
        if self.plan.is_none() {
            return self.content(index, text, (logprobs, timings));
        }
        let generic = self.plan.as_ref().filter(|p| p.format == CallFormat::Generic);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let Some(held) = held.get_mut(index as usize) else { return String::new() };
        held.text.push_str(&text);
        held.logprobs.extend(logprobs);
        let Some(plan) = generic else { return String::new() };
        let mut out = String::new();
        for piece in held.calls.push(&text) {
            out.push_str(&match piece {
                CallPiece::Start { index: position, name } => {
                    self.call_start(index, position, crate::ids::next("call"), name)
                }
                CallPiece::Arguments { index: position, text } => {
                    self.call_arguments(index, position, text)
                }
            });
        }
        if !plan.required {
            let reply = held.reply.push(&text);
            if !reply.is_empty() {
                let logprobs = std::mem::take(&mut held.logprobs);
                out.push_str(&self.content(index, reply, (logprobs, None)));
            }
        }
        out
    }

    fn finish(&self, index: u32, ending: Ending) -> String {
        let reason = ending.reason;
        let Some(plan) = &self.plan else {
            return self.last(index, reason, &ending);
        };
        let held = {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            held.get_mut(index as usize).map(std::mem::take).unwrap_or_default()
        };
        let mut out = String::new();
        if held.calls.calls() > 0 {
            // The calls went out as they were written.
            let reason =
                if reason == FinishReason::Stop { FinishReason::ToolCalls } else { reason };
            out.push_str(&self.last(index, reason, &ending));
            return out;
        }
        if held.reply.is_reply() {
            // Its text went out as it was written.
            if !held.logprobs.is_empty() {
                out.push_str(&self.content(index, String::new(), (held.logprobs, None)));
            }
            out.push_str(&self.last(index, reason, &ending));
            return out;
        }
        let (message, reason) = message(Some(plan), held.text, reason);
        if let Some(text) = message.content.filter(|t| !t.is_empty()) {
            out.push_str(&self.content(index, text, (held.logprobs, None)));
        }
        for (position, call) in message.tool_calls.into_iter().flatten().enumerate() {
            out.push_str(&self.call(index, position as u32, call));
        }
        out.push_str(&self.last(index, reason, &ending));
        out
    }

    fn usage(&self, usage: Usage, timings: Timings) -> String {
        self.chunk(Vec::new(), Some(usage), Some(timings))
    }

    /// A chunk of no choices with the prompt's reading so far, as llama-server
    /// sends it (`return_progress`).
    fn progress(&self, _index: u32, progress: &PromptProgress) -> String {
        let (progress, timings) = super::native::progress_parts(progress);
        let mut frame = self.frame(Vec::new(), None, Some(timings));
        frame.prompt_progress = Some(progress);
        sse::encode(&frame)
    }
}

#[cfg(test)]
mod tests {
    use super::pieces;

    #[test]
    fn arguments_are_cut_on_character_bounds() {
        assert_eq!(pieces(r#"{"city":"Zürich"}"#, 4).concat(), r#"{"city":"Zürich"}"#);
        assert_eq!(pieces(r#"{"city":"Zürich"}"#, 4).len(), 4);
        assert_eq!(pieces("{}", 4), vec!["{", "}"]);
        assert!(pieces("", 4).is_empty());
    }
}
