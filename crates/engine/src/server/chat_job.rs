//! What a chat request becomes before it is queued: its sampling settings,
//! its tool plan, and its input (the messages with the tools, and how the
//! prompt ends); and the tokens that prompt counts.

use slotgate_protocol::{ApiError, ChatCompletionRequest};

use super::generate::resolve_model;
use super::opening;
use super::AppState;
use crate::error::EngineError;
use crate::scheduler::{GenParams, JobInput, Render, Served};
use crate::tools::{self, CallFormat, ToolPlan};

/// A chat request read, ready for the scheduler.
pub(super) struct ChatJob {
    /// The messages (taken off the request), tools and opening.
    pub input: JobInput,
    /// How to sample.
    pub params: GenParams,
    /// What the answer's calls are read as, when it has tools.
    pub plan: Option<ToolPlan>,
}

/// Validates `req` and reads it for the model `served`; its messages are taken.
/// The engine's settings (`state`) fill in what it leaves out.
pub(super) fn read(
    req: &mut ChatCompletionRequest,
    served: &Served,
    state: &AppState,
) -> Result<ChatJob, ApiError> {
    req.validate()?;
    let mut plan = ToolPlan::read(req)?;
    let mut params = GenParams::from_sampling(&req.sampling, req.max_tokens(), &state.sampling);
    params.logprobs = match (req.logprobs, req.sampling.n_probs) {
        (Some(true), _) => Some(req.top_logprobs.unwrap_or(0)),
        (None, Some(n)) if n > 0 => Some(n.min(slotgate_protocol::logprobs::MAX_TOP_LOGPROBS)),
        _ => None,
    };
    params.grammar = crate::constrain::grammar(
        req.sampling.grammar.as_deref(),
        req.sampling.json_schema.as_ref(),
        req.response_format.as_ref(),
    )?;
    let mut messages = std::mem::take(&mut req.messages);
    let mut kwargs = serde_json::Map::new();
    kwargs.insert("enable_thinking".into(), state.config.server.enable_thinking.into());
    kwargs.extend(req.chat_template_kwargs.take().unwrap_or_default());
    let render = Render { opening: opening::read(req, &mut messages)?, kwargs };
    // A Jinja template with a tool section is given the tools and the history as
    // they are; any other template gets the generic form.
    let native = served.info.tool_format;
    let input = with_tools(plan.as_mut(), native, &mut params, messages, render)?;
    Ok(ChatJob { input, params, plan })
}

/// The tokens of the prompt `chat` renders to, its tools included: what
/// `count_tokens` and `input_tokens` answer.
pub(super) async fn prompt_tokens(
    state: &AppState,
    mut chat: ChatCompletionRequest,
) -> Result<u32, EngineError> {
    let served = resolve_model(state, &mut chat.model)?;
    let ChatJob { input, params, .. } = read(&mut chat, &served, state)?;
    let reader = served.reader.clone();
    let read = state.scheduler.off_loop(move || reader.read(&input, &mut { params })).await??;
    Ok(read.prompts.first().map_or(0, |(tokens, _)| tokens.len() as u32))
}

/// The prompt `chat` renders to, its tools and its opening included, whether
/// or not it fits the context: what `/apply-template` answers.
pub(super) async fn rendered(
    state: &AppState,
    mut chat: ChatCompletionRequest,
) -> Result<String, EngineError> {
    let served = resolve_model(state, &mut chat.model)?;
    let ChatJob { input, .. } = read(&mut chat, &served, state)?;
    let JobInput::Chat(messages, tools, render) = input else {
        return Err(ApiError::internal().into());
    };
    let reader = served.reader.clone();
    let render = move || reader.render_chat(&messages, tools.as_deref(), &render);
    Ok(state.scheduler.off_loop(render).await??)
}

/// The job's input with the request's tools, if it has any: given to a
/// template with a tool section as they are (a required call constrained to
/// its format), or else written into the messages in the generic form, whose
/// grammar constrains the answer.
fn with_tools(
    plan: Option<&mut ToolPlan>,
    native: Option<CallFormat>,
    params: &mut GenParams,
    messages: Vec<slotgate_protocol::ChatMessage>,
    render: Render,
) -> Result<JobInput, ApiError> {
    let messages = if native.is_none() { tools::generic_history(messages) } else { messages };
    let Some(plan) = plan else { return Ok(JobInput::Chat(messages, None, render)) };
    if params.grammar.is_some() {
        return Err(ApiError::invalid(
            "tools",
            "tools and a response format (or grammar) cannot both constrain one answer",
        ));
    }
    match native {
        Some(format) => {
            plan.format = format;
            // A call that may not happen is left free; one that must is
            // constrained to the template's format.
            if plan.required {
                params.grammar = plan
                    .native_grammar()
                    .and_then(|g| g.map(|g| crate::constrain::bounded(g, "tools")).transpose())?;
            }
            Ok(JobInput::Chat(messages, Some(plan.tools.clone()), render))
        }
        None => {
            let grammar =
                plan.generic_grammar().and_then(|g| crate::constrain::bounded(g, "tools"))?;
            params.grammar = Some(grammar);
            Ok(JobInput::Chat(plan.generic_messages(messages), None, render))
        }
    }
}
