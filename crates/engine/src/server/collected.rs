//! A job's events collected into every choice's whole text, counts and
//! times, for an answer that is not streamed; and the sums of usage that a
//! stream reports too.

use std::time::Duration;

use slotgate_protocol::native::Timings;
use slotgate_protocol::{ApiError, FinishReason, TokenLogprob, Usage};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::scheduler::{ChoiceIndex, ChoiceUsage, Event};

/// The shape of a job's answer: how many choices (prompts × n); which prompt
/// and sample each is, its [`ChoiceIndex`] says.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Choices in all.
    pub choices: u32,
}

/// Sums the usage of finished choices; a prompt's tokens count once, not once per
/// sample. Choices run side by side, so the times are the longest choice's.
#[derive(Debug, Default)]
pub struct UsageSum {
    prompt: u32,
    cached: u32,
    completion: u32,
    /// Decode steps of generation: a choice's first token needs none.
    steps: u32,
    prompt_time: Duration,
    generation_time: Duration,
}

impl UsageSum {
    /// Adds choice `index`.
    pub fn add(&mut self, index: ChoiceIndex, usage: ChoiceUsage) {
        if index.sample == 0 {
            self.prompt += usage.prompt_tokens;
            self.cached += usage.cached_tokens;
        }
        self.completion += usage.completion_tokens;
        self.steps += usage.completion_tokens.saturating_sub(1);
        self.prompt_time = self.prompt_time.max(usage.prompt_time);
        self.generation_time = self.generation_time.max(usage.generation_time);
    }

    /// The OpenAI usage object.
    pub fn usage(&self) -> Usage {
        Usage::new(self.prompt, self.completion, self.cached)
    }

    /// llama-server's `timings` of the whole answer.
    pub fn timings(&self) -> Timings {
        let read = self.prompt.saturating_sub(self.cached);
        Timings::new(
            self.cached,
            (read, self.prompt_time.as_secs_f64() * 1e3),
            (self.completion, self.steps, self.generation_time.as_secs_f64() * 1e3),
        )
    }
}

/// llama-server's `timings` of one finished choice.
pub fn timings(usage: &ChoiceUsage) -> Timings {
    let mut one = UsageSum::default();
    one.add(ChoiceIndex::default(), *usage);
    one.timings()
}

/// Every choice's text and finish reason, in index order.
#[derive(Debug)]
pub struct Collected {
    /// Text per choice.
    pub texts: Vec<String>,
    /// Finish reason per choice.
    pub reasons: Vec<FinishReason>,
    /// Per choice, the stop string that ended it, if one did.
    pub stops: Vec<Option<String>>,
    /// Per choice, the ids of its tokens.
    pub tokens: Vec<Vec<i32>>,
    /// Per choice, its slot, token counts and times.
    pub usages: Vec<ChoiceUsage>,
    /// Log probabilities per choice (empty unless asked for).
    pub logprobs: Vec<Vec<TokenLogprob>>,
    /// Token counts.
    pub usage: Usage,
    /// llama-server's `timings` of the whole answer.
    pub timings: Timings,
}

impl Collected {
    /// Each choice, in index order.
    pub fn choices(self) -> impl Iterator<Item = Choice> {
        let each = self.texts.into_iter().zip(self.reasons).zip(self.stops);
        let more = self.logprobs.into_iter().zip(self.tokens).zip(self.usages);
        (0u32..).zip(each.zip(more)).map(
            |(index, (((text, reason), stop), ((logprobs, tokens), usage)))| Choice {
                index,
                text,
                reason,
                stop,
                logprobs,
                tokens,
                usage,
            },
        )
    }
}

/// One choice of a collected answer.
#[derive(Debug)]
pub struct Choice {
    /// Its place among the choices.
    pub index: u32,
    /// Its text.
    pub text: String,
    /// Why it stopped.
    pub reason: FinishReason,
    /// The stop string that stopped it, if one did.
    pub stop: Option<String>,
    /// Its log probabilities (empty unless asked for).
    pub logprobs: Vec<TokenLogprob>,
    /// The ids of its tokens.
    pub tokens: Vec<i32>,
    /// Its slot, token counts and times.
    pub usage: ChoiceUsage,
}

/// Reads events until every choice is done.
pub async fn collect(
    first: Event,
    mut rx: UnboundedReceiver<Event>,
    shape: Shape,
) -> Result<Collected, ApiError> {
    let n = shape.choices as usize;
    let mut texts = vec![String::new(); n];
    let mut logprobs = vec![Vec::new(); n];
    let mut reasons = vec![None; n];
    let mut stops = vec![None; n];
    let mut tokens = vec![Vec::new(); n];
    let mut usages = vec![ChoiceUsage::default(); n];
    let mut usage = UsageSum::default();
    let mut done = 0;
    let mut next = Some(first);
    while done < n {
        let event = match next.take() {
            Some(e) => e,
            None => rx.recv().await.ok_or_else(ApiError::internal)?,
        };
        match event {
            Event::Text { index, text, logprobs: l, tokens: ids, .. } => {
                let i = index.flat() as usize;
                texts[i].push_str(&text);
                logprobs[i].extend(l);
                tokens[i].extend(ids);
            }
            Event::Done { index, reason, stop, usage: u } => {
                let i = index.flat() as usize;
                reasons[i] = Some(reason);
                stops[i] = stop;
                usages[i] = u;
                usage.add(index, u);
                done += 1;
            }
            // Only a stream reports how far its prompt is read, and only a
            // stream is resumed.
            Event::Progress { .. } | Event::Replayed { .. } => {}
            Event::Error(err) => return Err(err),
        }
    }
    Ok(Collected {
        texts,
        reasons: reasons.into_iter().map(|r| r.unwrap_or(FinishReason::Stop)).collect(),
        stops,
        tokens,
        usages,
        logprobs,
        usage: usage.usage(),
        timings: usage.timings(),
    })
}
