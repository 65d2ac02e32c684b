//! Reading a request into tokens, off the scheduler thread: a job's messages or
//! prompts rendered, tokenized and checked against a slot's context, its grammar
//! compiled once by llama.cpp (each choice samples with a copy), and an
//! embeddings job's inputs tokenized. All of it is as large as the request is,
//! so none of it may delay the decode loop: handlers run it on a blocking thread
//! (`Scheduler::off_loop`) before the job is handed over, and the scheduler
//! thread only cuts the result into tasks.
//!
//! Only the model's vocabulary and templates are used here, which llama.cpp
//! keeps in host memory and reads without changing (llama-server tokenizes on
//! its HTTP threads too); no context, no GPU state. The model itself is freed
//! on the scheduler thread, which keeps an unloaded model until no reader holds
//! it (see `worker.rs`).

mod replay;
mod rerank;

pub use replay::Replay;

use std::sync::Arc;

use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::token::LlamaToken;
use slotgate_protocol::logit_bias::MAX_BIASED_TOKENS;
use slotgate_protocol::{ApiError, ChatMessage, ErrorType, PromptItem, PromptPiece, Tool};

use crate::scheduler::grammar::Grammar;
use crate::scheduler::job::{GenParams, JobInput, Opening, Render};
use crate::template::jinja::JinjaTemplate;
use crate::template::ChatTemplate;

/// What requests of one model are read with.
pub struct Reader {
    /// The model, shared with its runtime on the scheduler thread.
    pub(crate) model: Arc<LlamaModel>,
    template: ChatTemplate,
    /// The compiled template, when `template` is `Jinja`.
    jinja: Option<JinjaTemplate>,
    /// Tokens one slot's sequence may hold: a prompt's bound.
    seq_len: usize,
    /// Tokens of the embedding context: an embedding input's bound.
    ctx_len: usize,
    n_vocab: i32,
    /// Bytes of the vocabulary's longest piece: a text longer than `ctx_len`
    /// pieces of that length cannot fit a slot, which is known before any of it
    /// is tokenized.
    longest_piece: usize,
    /// The end-of-generation tokens, which `ignore_eos` bans.
    eog: Vec<i32>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").field("template", &self.template).finish_non_exhaustive()
    }
}

/// A prompt read into tokens, and its text when the answer echoes it.
pub type Read = (Vec<LlamaToken>, String);

/// A job's request, read: its prompts and its grammar, compiled.
#[derive(Debug)]
pub struct ReadJob {
    /// Each prompt, in order.
    pub prompts: Vec<Read>,
    /// The grammar every choice samples under, if any.
    pub grammar: Option<Grammar>,
    /// Of a resumed stream: the answer so far, read after its prompt.
    pub replay: Option<Replay>,
}

impl Reader {
    /// A reader of `model`'s requests.
    pub(super) fn new(
        model: Arc<LlamaModel>,
        template: ChatTemplate,
        jinja: Option<JinjaTemplate>,
        (seq_len, ctx_len): (u32, u32),
    ) -> Self {
        let vocab = model.vocab();
        let n_vocab = model.n_vocab();
        // One pass over the vocabulary for both.
        let (mut longest_piece, mut eog) = (1, Vec::new());
        for token in (0..n_vocab).map(LlamaToken) {
            longest_piece = longest_piece.max(vocab.token_to_piece(token, true, None).len());
            if vocab.is_eog(token) {
                eog.push(token.0);
            }
        }
        let (seq_len, ctx_len) = (seq_len as usize, ctx_len as usize);
        Self { model, template, jinja, seq_len, ctx_len, n_vocab, longest_piece, eog }
    }

    /// With `ignore_eos`, bans the end-of-generation tokens by `logit_bias`
    /// (once: the flag is then cleared), as llama-server does.
    pub fn ban_eog(&self, params: &mut GenParams) {
        if std::mem::take(&mut params.ignore_eos) {
            params.logit_bias.extend(self.eog.iter().map(|&t| (t, f32::NEG_INFINITY)));
        }
    }

    /// The template in use.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The compiled Jinja template, if one renders chats.
    pub fn jinja(&self) -> Option<&JinjaTemplate> {
        self.jinja.as_ref()
    }

    /// The job's prompts as tokens, each checked to fit a slot, its grammar
    /// compiled (a 400 when it does not parse), and the texts its
    /// `logit_bias` names made tokens.
    pub fn read(&self, input: &JobInput, params: &mut GenParams) -> Result<ReadJob, ApiError> {
        let vocab = self.model.vocab();
        // As llama-server reads them: no BOS, special tokens as plain text.
        for (text, bias) in std::mem::take(&mut params.logit_bias_text) {
            let tokens = vocab.tokenize(text.as_bytes(), false, false);
            params.logit_bias.extend(tokens.into_iter().map(|t| (t.0, bias)));
        }
        if params.logit_bias.len() > MAX_BIASED_TOKENS {
            return Err(ApiError::invalid(
                "logit_bias",
                format!(
                    "logit_bias biases {} tokens once its texts are tokenized; at most \
                     {MAX_BIASED_TOKENS}",
                    params.logit_bias.len()
                ),
            ));
        }
        self.ban_eog(params);
        let mut prompts: Vec<Read> = match input {
            JobInput::Chat(messages, tools, render) => {
                let text = self.render_chat(messages, tools.as_deref(), render)?;
                self.fits_bytes(text.len(), None, "messages")?;
                vec![(vocab.tokenize(text.as_bytes(), true, true), text)]
            }
            JobInput::Prompts(items) => {
                // Every text is measured before any is tokenized.
                for (i, item) in items.iter().enumerate() {
                    let which = (items.len() > 1).then_some(i);
                    match item {
                        PromptItem::Text(text) => self.fits_bytes(text.len(), which, "prompt")?,
                        PromptItem::Tokens(ids) => self.fits_tokens(ids.len(), which, "prompt")?,
                        PromptItem::Mixed(pieces) => {
                            let bytes = pieces.iter().map(|p| match p {
                                PromptPiece::Text(text) => text.len(),
                                PromptPiece::Token(_) => self.longest_piece,
                            });
                            self.fits_bytes(bytes.sum(), which, "prompt")?;
                        }
                    }
                }
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let param =
                        if items.len() > 1 { format!("prompt[{i}]") } else { "prompt".into() };
                    out.push(match item {
                        PromptItem::Text(text) => {
                            (vocab.tokenize(text.as_bytes(), true, true), text.clone())
                        }
                        PromptItem::Tokens(_) | PromptItem::Mixed(_) => {
                            let tokens = self.item_tokens(item, &param)?;
                            let text = if params.echo {
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
        let param = if matches!(input, JobInput::Chat(..)) { "messages" } else { "prompt" };
        for (i, (tokens, _)) in prompts.iter().enumerate() {
            self.fits_tokens(tokens.len(), (prompts.len() > 1).then_some(i), param)?;
        }
        // Compiled once, here; each choice copies it when it gets a slot.
        let mut grammar = params
            .grammar
            .as_deref()
            .map(|g| crate::scheduler::grammar::compile(&self.model, g))
            .transpose()?;
        let replay = self.replay(&mut prompts, grammar.as_mut(), params)?;
        Ok(ReadJob { prompts, grammar, replay })
    }

    /// The tokens of a prompt given as ids, or as ids and texts in turn (each
    /// text tokenized in place, as llama-server does: special tokens parsed, the
    /// BOS token only before a text that opens the prompt).
    fn item_tokens(&self, item: &PromptItem, param: &str) -> Result<Vec<LlamaToken>, ApiError> {
        let vocab = self.model.vocab();
        match item {
            PromptItem::Text(text) => Ok(vocab.tokenize(text.as_bytes(), true, true)),
            PromptItem::Tokens(ids) => self.token_ids(ids.iter().map(|&id| i64::from(id)), param),
            PromptItem::Mixed(pieces) => {
                let mut tokens = Vec::new();
                for (k, piece) in pieces.iter().enumerate() {
                    match piece {
                        PromptPiece::Token(id) => {
                            tokens.extend(self.token_ids([i64::from(*id)], param)?);
                        }
                        PromptPiece::Text(text) => {
                            tokens.extend(vocab.tokenize(text.as_bytes(), k == 0, true));
                        }
                    }
                }
                Ok(tokens)
            }
        }
    }

    /// Embeddings inputs as tokens, each checked to fit the embedding context (a
    /// slot's length); texts are measured before any is tokenized.
    pub fn read_inputs(&self, inputs: &[PromptItem]) -> Result<Vec<Vec<LlamaToken>>, ApiError> {
        let param =
            |i: usize| if inputs.len() > 1 { format!("input[{i}]") } else { "input".into() };
        for (i, input) in inputs.iter().enumerate() {
            match input {
                PromptItem::Text(text)
                    if text.len() > self.ctx_len.saturating_mul(self.longest_piece) =>
                {
                    let message = format!(
                        "{} is {} bytes, more than the context of {} tokens can hold (at most {} \
                         bytes a token)",
                        param(i),
                        text.len(),
                        self.ctx_len,
                        self.longest_piece
                    );
                    return Err(self.too_long(message, &param(i), None, self.ctx_len));
                }
                PromptItem::Text(_) | PromptItem::Mixed(_) => {}
                PromptItem::Tokens(ids) => self.fits_embedding(ids.len(), &param(i))?,
            }
        }
        let vocab = self.model.vocab();
        let mut out = Vec::with_capacity(inputs.len());
        for (i, input) in inputs.iter().enumerate() {
            let tokens = match input {
                PromptItem::Text(text) => vocab.tokenize(text.as_bytes(), true, false),
                other => self.item_tokens(other, &param(i))?,
            };
            self.fits_embedding(tokens.len(), &param(i))?;
            out.push(tokens);
        }
        Ok(out)
    }

    /// Refuses an input of `tokens` (or at least that many) that does not fit
    /// the embedding context.
    fn fits_embedding(&self, tokens: usize, param: &str) -> Result<(), ApiError> {
        if tokens <= self.ctx_len {
            return Ok(());
        }
        let message = format!(
            "{param} has {tokens} tokens, but the context holds {} (ctx_len)",
            self.ctx_len
        );
        Err(self.too_long(message, param, Some(tokens), self.ctx_len))
    }

    /// The refusal of an input too long for the context, naming `param`, with
    /// its token count when known.
    fn too_long(
        &self,
        message: String,
        param: &str,
        tokens: Option<usize>,
        limit: usize,
    ) -> ApiError {
        let err = ApiError::new(ErrorType::ExceedContextSizeError, message)
            .with_param(param)
            .with_code("context_length_exceeded");
        match tokens {
            Some(tokens) => err.with_context(
                u32::try_from(tokens).unwrap_or(u32::MAX),
                u32::try_from(limit).unwrap_or(u32::MAX),
            ),
            None => err,
        }
    }

    /// Refuses a text of `bytes` that cannot fit a slot whatever its tokens.
    fn fits_bytes(&self, bytes: usize, which: Option<usize>, param: &str) -> Result<(), ApiError> {
        if bytes <= self.seq_len.saturating_mul(self.longest_piece) {
            return Ok(());
        }
        let which = which.map_or("the prompt".into(), |i| format!("prompt {i}"));
        let message = format!(
            "{which} is {bytes} bytes, more than a slot's context of {} tokens can hold (at most \
             {} bytes a token); shorten the prompt or start the engine with a larger ctx_len",
            self.seq_len, self.longest_piece
        );
        Err(self.too_long(message, param, None, self.seq_len))
    }

    /// Refuses a prompt of `tokens` that does not fit a slot.
    fn fits_tokens(
        &self,
        tokens: usize,
        which: Option<usize>,
        param: &str,
    ) -> Result<(), ApiError> {
        if tokens < self.seq_len {
            return Ok(());
        }
        let which = which.map_or("the prompt".into(), |i| format!("prompt {i}"));
        let message = format!(
            "{which} has {tokens} tokens, but a slot's context holds {} (ctx_len); shorten the \
             prompt or start the engine with a larger ctx_len",
            self.seq_len
        );
        Err(self.too_long(message, param, Some(tokens), self.seq_len))
    }

    /// The prompt a conversation becomes with this model's template.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[Tool]>,
        render: &Render,
    ) -> Result<String, ApiError> {
        let open = render.opening.opens();
        let mut text = match &self.jinja {
            Some(jinja) => jinja.render(messages, tools, open, &render.kwargs)?,
            None => match self.template.render(messages, open) {
                Some(text) => text,
                None => {
                    apply_model_template(&self.model, self.template.llama_name(), messages, open)?
                }
            },
        };
        if let Opening::Continue(prefill) = &render.opening {
            text.push_str(prefill);
        }
        Ok(text)
    }

    /// `ids` as tokens of this model's vocabulary, or a 400 naming `param`.
    pub fn token_ids(
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

/// Renders a conversation through llama.cpp, with one of its built-in
/// templates by `name`, or else the template stored in the GGUF.
pub(super) fn apply_model_template(
    model: &LlamaModel,
    name: Option<&str>,
    messages: &[ChatMessage],
    open: bool,
) -> Result<String, ApiError> {
    let template = match name {
        Some(name) => LlamaChatTemplate::new(name).map_err(|_| ApiError::internal())?,
        None => model.chat_template(None).map_err(|_| ApiError::internal())?,
    };
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
    model.apply_chat_template(&template, &chat, open).map_err(|e| {
        ApiError::invalid(
            "messages",
            format!("the model's chat template cannot render these messages: {e}"),
        )
    })
}
