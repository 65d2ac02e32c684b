//! Chat templates: how a conversation becomes one prompt string.
//!
//! The built-in templates are written here rather than taken from llama.cpp so that
//! they can be tested as plain functions. A Jinja template (the GGUF's own, or one
//! from a file) is rendered by [`jinja`]; `model` keeps llama.cpp's own detection
//! of the GGUF's template, which knows no tools.

pub mod jinja;

use serde::{Deserialize, Serialize};
use slotgate_protocol::{ChatMessage, Role};

/// How to turn messages into a prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChatTemplate {
    /// Gemma: `<start_of_turn>user ... <end_of_turn>`; system text joins the first
    /// user turn, as Gemma has no system role.
    Gemma,
    /// ChatML: `<|im_start|>role ... <|im_end|>`.
    ChatMl,
    /// Llama 3: `<|start_header_id|>role<|end_header_id|> ... <|eot_id|>`.
    Llama3,
    /// Nitro's form: a system prefix and a prefix before each user and assistant turn.
    Prompts {
        /// Put before the system text.
        pre_prompt: String,
        /// Put before each user message.
        user_prompt: String,
        /// Put before each assistant message, and at the end.
        ai_prompt: String,
    },
    /// The template stored in the model's GGUF, applied by llama.cpp.
    Model,
    /// One of llama.cpp's built-in templates by its name (`command-r`,
    /// `mistral-v7`, `phi4`...), applied by llama.cpp, as llama-server's
    /// `--chat-template NAME` is; a name llama.cpp does not know fails the
    /// model's load.
    Named(String),
    /// A Jinja template (the GGUF's own, or `chat_template_file`), rendered by
    /// the model's [`jinja::JinjaTemplate`].
    Jinja,
}

impl ChatTemplate {
    /// A template by its configured name: `gemma`, `chatml`, `llama3`, `model`,
    /// `jinja`, or a name for llama.cpp to apply.
    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "gemma" | "gemma3" => Some(Self::Gemma),
            "chatml" => Some(Self::ChatMl),
            "llama3" => Some(Self::Llama3),
            "model" | "gguf" => Some(Self::Model),
            "jinja" => Some(Self::Jinja),
            "auto" => None,
            other => {
                let shaped = other.len() <= 32
                    && other.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b)
                    });
                (shaped && !other.is_empty()).then(|| Self::Named(other.to_owned()))
            }
        }
    }

    /// The name llama.cpp applies it by, for [`ChatTemplate::Named`].
    pub fn llama_name(&self) -> Option<&str> {
        match self {
            Self::Named(name) => Some(name),
            _ => None,
        }
    }

    /// Its name, as `/props` shows it.
    pub fn name(&self) -> &str {
        match self {
            Self::Named(name) => name,
            Self::Gemma => "gemma",
            Self::ChatMl => "chatml",
            Self::Llama3 => "llama3",
            Self::Prompts { .. } => "prompts",
            Self::Model => "model",
            Self::Jinja => "jinja",
        }
    }

    /// The names `by_name` accepts, for error messages.
    pub const NAMES: &'static str =
        "auto, gemma, chatml, llama3, jinja, model, or a template llama.cpp knows by name \
         (command-r, mistral-v7, phi4...)";

    /// The template for a model that has not named one: its own (as Jinja) if its
    /// GGUF has one, else one chosen by architecture, else ChatML.
    pub fn auto(has_own_template: bool, architecture: &str) -> Self {
        if has_own_template {
            Self::Jinja
        } else if architecture.starts_with("gemma") {
            Self::Gemma
        } else if architecture == "llama" {
            Self::Llama3
        } else {
            Self::ChatMl
        }
    }

    /// Renders the conversation, ending with the opening of the assistant's turn
    /// when `open`. `None` for [`ChatTemplate::Model`] and [`ChatTemplate::Jinja`],
    /// rendered with the model.
    pub fn render(&self, messages: &[ChatMessage], open: bool) -> Option<String> {
        let mut out = String::new();
        match self {
            Self::Gemma => {
                let mut system = String::new();
                for m in messages {
                    match m.role {
                        Role::System | Role::Developer => {
                            system.push_str(&m.text());
                            system.push_str("\n\n");
                        }
                        role => {
                            let turn = if role == Role::Assistant { "model" } else { "user" };
                            out.push_str("<start_of_turn>");
                            out.push_str(turn);
                            out.push('\n');
                            if turn == "user" {
                                out.push_str(&std::mem::take(&mut system));
                            }
                            out.push_str(m.text().trim());
                            out.push_str("<end_of_turn>\n");
                        }
                    }
                }
                if !system.is_empty() {
                    // Only system text: it still reaches the model as a user turn.
                    out.push_str("<start_of_turn>user\n");
                    out.push_str(system.trim_end());
                    out.push_str("<end_of_turn>\n");
                }
                if open {
                    out.push_str("<start_of_turn>model\n");
                }
            }
            Self::ChatMl => {
                for m in messages {
                    let role = if m.role == Role::Developer { "system" } else { m.role.as_str() };
                    out.push_str(&format!("<|im_start|>{role}\n{}<|im_end|>\n", m.text()));
                }
                if open {
                    out.push_str("<|im_start|>assistant\n");
                }
            }
            Self::Llama3 => {
                for m in messages {
                    let role = match m.role {
                        Role::Developer => "system",
                        Role::Tool => "ipython",
                        r => r.as_str(),
                    };
                    out.push_str(&format!(
                        "<|start_header_id|>{role}<|end_header_id|>\n\n{}<|eot_id|>",
                        m.text().trim()
                    ));
                }
                if open {
                    out.push_str("<|start_header_id|>assistant<|end_header_id|>\n\n");
                }
            }
            Self::Prompts { pre_prompt, user_prompt, ai_prompt } => {
                for m in messages {
                    let prefix = match m.role {
                        Role::System | Role::Developer => pre_prompt,
                        Role::Assistant => ai_prompt,
                        Role::User | Role::Tool => user_prompt,
                    };
                    out.push_str(prefix);
                    out.push_str(&m.text());
                }
                if open {
                    out.push_str(ai_prompt);
                }
            }
            Self::Model | Self::Jinja | Self::Named(_) => return None,
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn convo() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new(Role::System, "Be brief."),
            ChatMessage::new(Role::User, "Hi"),
            ChatMessage::new(Role::Assistant, "Hello!"),
            ChatMessage::new(Role::User, "Bye"),
        ]
    }

    #[test]
    fn gemma_folds_system_into_the_first_user_turn() {
        assert_eq!(
            ChatTemplate::Gemma.render(&convo(), true).unwrap(),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello!<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n\
             <start_of_turn>model\n"
        );
    }

    #[test]
    fn chatml_maps_developer_to_system() {
        let msgs = [ChatMessage::new(Role::Developer, "D"), ChatMessage::new(Role::User, "U")];
        assert_eq!(
            ChatTemplate::ChatMl.render(&msgs, true).unwrap(),
            "<|im_start|>system\nD<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn llama3_headers() {
        let msgs = [ChatMessage::new(Role::User, "U")];
        assert_eq!(
            ChatTemplate::Llama3.render(&msgs, true).unwrap(),
            "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn nitro_prompts_form() {
        let t = ChatTemplate::Prompts {
            pre_prompt: "SYS: ".into(),
            user_prompt: "\nUSER: ".into(),
            ai_prompt: "\nASSISTANT: ".into(),
        };
        assert_eq!(
            t.render(&convo(), true).unwrap(),
            "SYS: Be brief.\nUSER: Hi\nASSISTANT: Hello!\nUSER: Bye\nASSISTANT: "
        );
    }

    #[test]
    fn auto_prefers_the_model_template_then_the_architecture() {
        assert_eq!(ChatTemplate::auto(true, "gemma3"), ChatTemplate::Jinja);
        assert_eq!(ChatTemplate::auto(false, "gemma3"), ChatTemplate::Gemma);
        assert_eq!(ChatTemplate::auto(false, "qwen2"), ChatTemplate::ChatMl);
    }

    #[test]
    fn a_conversation_of_only_system_text_still_has_a_user_turn() {
        let msgs = [ChatMessage::new(Role::System, "S")];
        assert_eq!(
            ChatTemplate::Gemma.render(&msgs, true).unwrap(),
            "<start_of_turn>user\nS<end_of_turn>\n<start_of_turn>model\n"
        );
    }
}
