//! Prompt preparation: a job's messages or prompts rendered, tokenized and checked
//! against a slot's context, then cut into one task per choice.

use std::sync::Arc;
use std::time::Instant;

use llama_cpp_2::model::{LlamaChatMessage, LlamaModel};
use llama_cpp_2::token::LlamaToken;
use slotgate_protocol::{ApiError, ErrorType, PromptItem};

use super::ModelRuntime;
use crate::scheduler::job::{Job, JobInput, Task};

impl ModelRuntime {
    /// Turns a job into its tasks: renders and tokenizes the prompts and checks that
    /// they fit a slot.
    pub fn prepare(
        &self,
        job: Job,
        next_id: &mut impl FnMut() -> u64,
    ) -> Result<Vec<Task>, ApiError> {
        let model = self.loaded.borrow_owner();
        let vocab = model.vocab();
        let prompts: Vec<(Vec<LlamaToken>, String)> = match &job.input {
            JobInput::Chat(messages, tools) => {
                let text = self.render_chat(messages, tools.as_deref())?;
                vec![(vocab.tokenize(text.as_bytes(), true, true), text)]
            }
            JobInput::Prompts(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    out.push(match item {
                        PromptItem::Text(text) => {
                            (vocab.tokenize(text.as_bytes(), true, true), text.clone())
                        }
                        PromptItem::Tokens(ids) => {
                            let tokens = self.check_token_ids(ids, i, items.len())?;
                            let text = if job.params.echo {
                                String::from_utf8_lossy(&vocab.detokenize(&tokens, false, false))
                                    .into_owned()
                            } else {
                                String::new()
                            };
                            (tokens, text)
                        }
                    });
                }
                out
            }
        };
        let ctx_len = self.settings.ctx_len as usize;
        for (i, (tokens, _)) in prompts.iter().enumerate() {
            if tokens.len() >= ctx_len {
                let which =
                    if prompts.len() > 1 { format!("prompt {i}") } else { "the prompt".into() };
                return Err(ApiError::new(
                    ErrorType::ExceedContextSizeError,
                    format!(
                        "{which} has {} tokens, but a slot's context holds {ctx_len} (ctx_len); \
                         shorten the prompt or start the engine with a larger ctx_len",
                        tokens.len()
                    ),
                )
                .with_param(if matches!(job.input, JobInput::Chat(..)) {
                    "messages"
                } else {
                    "prompt"
                })
                .with_code("context_length_exceeded")
                .with_context(tokens.len() as u32, ctx_len as u32));
            }
        }
        if let Some(grammar) = &job.params.grammar {
            // Parsed once here, so that a bad one is the request's 400.
            crate::scheduler::sampler::grammar(model, grammar)?;
        }
        let params = Arc::new(job.params);
        let enqueued = Instant::now();
        let mut tasks = Vec::with_capacity(prompts.len() * params.n as usize);
        for (p, (tokens, text)) in prompts.into_iter().enumerate() {
            let prompt = Arc::new(tokens);
            let echo_text = params.echo.then(|| Arc::new(text));
            for s in 0..params.n {
                let seed = match params.seed {
                    Some(seed) => (seed as u32).wrapping_add(s),
                    None => rand::random(),
                };
                tasks.push(Task {
                    id: next_id(),
                    index: p as u32 * params.n + s,
                    prompt: prompt.clone(),
                    params: params.clone(),
                    seed,
                    echo_text: echo_text.clone(),
                    events: job.events.clone(),
                    enqueued,
                    replica: job.replica.clone(),
                });
            }
        }
        Ok(tasks)
    }

    /// The prompt a conversation becomes with this model's template.
    pub(super) fn render_chat(
        &self,
        messages: &[slotgate_protocol::ChatMessage],
        tools: Option<&[slotgate_protocol::Tool]>,
    ) -> Result<String, ApiError> {
        if let Some(jinja) = &self.jinja {
            return jinja.render(messages, tools);
        }
        match self.template.render(messages) {
            Some(text) => Ok(text),
            None => apply_model_template(self.loaded.borrow_owner(), messages),
        }
    }

    fn check_token_ids(
        &self,
        ids: &[u32],
        i: usize,
        count: usize,
    ) -> Result<Vec<LlamaToken>, ApiError> {
        let param = if count > 1 { format!("prompt[{i}]") } else { "prompt".into() };
        self.token_ids(ids.iter().map(|&id| i64::from(id)), &param)
    }

    /// `ids` as tokens of this model's vocabulary, or a 400 naming `param`.
    pub(super) fn token_ids(
        &self,
        ids: impl IntoIterator<Item = i64>,
        param: &str,
    ) -> Result<Vec<LlamaToken>, ApiError> {
        ids.into_iter()
            .map(|id| match i32::try_from(id) {
                Ok(t) if (0..self.n_vocab).contains(&t) => Ok(LlamaToken(t)),
                _ => Err(ApiError::invalid(
                    param,
                    format!(
                        "token id {id} is out of range: the vocabulary has {} tokens",
                        self.n_vocab
                    ),
                )),
            })
            .collect()
    }
}

/// Renders a conversation with the template stored in the GGUF, through llama.cpp.
fn apply_model_template(
    model: &LlamaModel,
    messages: &[slotgate_protocol::ChatMessage],
) -> Result<String, ApiError> {
    let template = model.chat_template(None).map_err(|_| ApiError::internal())?;
    let chat = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            LlamaChatMessage::new(m.role.as_str().to_owned(), m.text()).map_err(|_| {
                ApiError::invalid(
                    format!("messages[{i}].content"),
                    "message text must not contain NUL characters",
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    model.apply_chat_template(&template, &chat, true).map_err(|e| {
        ApiError::invalid(
            "messages",
            format!("the model's chat template cannot render these messages: {e}"),
        )
    })
}
