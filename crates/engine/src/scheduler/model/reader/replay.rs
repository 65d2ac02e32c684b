//! A resumed stream's answer so far (`slotgate_resume`), read where its
//! request is read: its tokens checked and put after the prompt, the grammar
//! advanced over them, and the stop-string window filled with their text, so
//! that the slot goes on exactly where the first engine stopped. All of it is
//! as large as that answer, so none of it runs on the scheduler thread.

use slotgate_protocol::ApiError;

use super::{Read, Reader};
use crate::scheduler::grammar::Grammar;
use crate::scheduler::job::GenParams;
use crate::scheduler::text::TextStream;

const PARAM: &str = "slotgate_resume.tokens";

/// The answer a resumed choice begins with.
#[derive(Debug)]
pub struct Replay {
    /// Its tokens, which end the task's prompt.
    pub tokens: u32,
    /// The stop-string window as those tokens left it.
    pub text: TextStream,
    /// The text they made that went out: what the client has.
    pub sent: String,
    /// Whether the client has the choice's first chunk.
    pub opened: bool,
    /// A stop string ended the answer within them: nothing more is made.
    pub stopped: bool,
}

impl Reader {
    /// Reads `params.resume` into the job's one prompt and its grammar: `None`
    /// without one; a 400 when its tokens are not this vocabulary's, the
    /// grammar forbids one of them, or prompt and answer do not fit a slot.
    pub(in crate::scheduler::model) fn replay(
        &self,
        prompts: &mut [Read],
        grammar: Option<&mut Grammar>,
        params: &GenParams,
    ) -> Result<Option<Replay>, ApiError> {
        let Some(resume) = &params.resume else { return Ok(None) };
        let [(prompt, _)] = prompts else {
            return Err(ApiError::invalid(
                "slotgate_resume",
                "slotgate_resume goes on with one choice: one prompt and n = 1",
            ));
        };
        if params.n != 1 {
            return Err(ApiError::invalid("slotgate_resume", "slotgate_resume needs n = 1"));
        }
        let tokens = self.token_ids(resume.tokens.iter().map(|&t| i64::from(t)), PARAM)?;
        self.fits_tokens(prompt.len() + tokens.len(), None, PARAM)?;
        if let Some(grammar) = grammar {
            if let Err(at) = grammar.advance(&tokens) {
                return Err(ApiError::invalid(
                    PARAM,
                    format!("token {at} of the answer does not match the request's grammar"),
                ));
            }
        }
        let vocab = self.model.vocab();
        let mut text = TextStream::new(params.stop.clone());
        let (mut sent, mut stopped) = (String::new(), false);
        for &token in &tokens {
            let pushed = text.push(&vocab.token_to_piece(token, false, None));
            sent.push_str(&pushed.text);
            stopped |= pushed.stopped;
        }
        let count = tokens.len() as u32;
        prompt.extend_from_slice(&tokens);
        Ok(Some(Replay { tokens: count, text, sent, opened: resume.opened, stopped }))
    }
}
