//! The chat template a model is served with: its settings' choice among what
//! its GGUF has, and the Jinja form where tools need one.

use llama_cpp_2::model::LlamaModel;

use crate::config::{ModelSettings, TemplateChoice};
use crate::template::jinja::JinjaTemplate;
use crate::template::ChatTemplate;

/// The chat template a model is served with, as its settings choose among
/// what its GGUF has, and its Jinja form where it is rendered as Jinja; why
/// not, when the settings ask for what the GGUF lacks.
pub(super) fn choose(
    model: &LlamaModel,
    settings: &ModelSettings,
    own: Option<&str>,
    architecture: &str,
) -> Result<(ChatTemplate, Option<JinjaTemplate>), String> {
    let mut template = match settings.template() {
        TemplateChoice::Fixed(t) => t,
        TemplateChoice::Auto => ChatTemplate::auto(own.is_some(), architecture),
    };
    if matches!(template, ChatTemplate::Model | ChatTemplate::Jinja)
        && own.is_none()
        && settings.chat_template_file.is_none()
    {
        return Err(format!("chat_template `{}`: the GGUF has no chat template", template.name()));
    }
    if let Some(name) = template.llama_name() {
        // llama.cpp's answer is the only list of its names: a probe renders.
        let probe = [slotgate_protocol::ChatMessage::new(slotgate_protocol::Role::User, "Hi")];
        super::reader::apply_model_template(model, Some(name), &probe, true).map_err(|_| {
            format!("chat_template `{name}`: not a template llama.cpp knows by name")
        })?;
    }
    let jinja = if template == ChatTemplate::Jinja {
        let jinja = jinja_template(model, settings, own);
        match jinja {
            Ok(jinja) => Some(jinja),
            // A file asked for, or a GGUF without a template of its own for
            // llama.cpp to fall back on: nothing else could render its chats.
            Err(reason)
                if settings.chat_template.as_str() != "auto"
                    || settings.chat_template_file.is_some()
                    || own.is_none() =>
            {
                return Err(reason)
            }
            Err(reason) => {
                // `auto` does not refuse a model whose template minijinja cannot
                // read: llama.cpp's detection renders it instead, without tools.
                tracing::warn!(%reason, "the GGUF's template is not usable as Jinja; llama.cpp renders it");
                template = ChatTemplate::Model;
                None
            }
        }
    } else {
        None
    };
    Ok((template, jinja))
}

/// The Jinja template a model renders with: `chat_template_file`, else the GGUF's,
/// compiled with the model's own start and end tokens.
fn jinja_template(
    model: &LlamaModel,
    settings: &ModelSettings,
    own: Option<&str>,
) -> Result<JinjaTemplate, String> {
    let source = match &settings.chat_template_file {
        Some(file) => std::fs::read_to_string(file)
            .map_err(|e| format!("chat_template_file {}: {e}", file.display()))?,
        None => own.ok_or("the GGUF has no chat template")?.to_owned(),
    };
    let vocab = model.vocab();
    let piece = |t| String::from_utf8_lossy(&vocab.token_to_piece(t, true, None)).into_owned();
    JinjaTemplate::new(source, piece(vocab.bos()), piece(vocab.eos()))
        .map_err(|e| format!("the chat template does not parse as Jinja: {e}"))
}
