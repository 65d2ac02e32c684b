//! A job's prompts, read into tokens on the request's own thread
//! ([`super::reader`]), cut into one task per choice on the scheduler thread:
//! nothing here is as large as the request's text.

use std::sync::Arc;
use std::time::Instant;

use slotgate_protocol::ApiError;

use super::ModelRuntime;
use crate::scheduler::job::{ChoiceIndex, Job, Task};

impl ModelRuntime {
    /// Turns a job into its tasks.
    pub fn prepare(
        &self,
        job: Job,
        next_id: &mut impl FnMut() -> u64,
    ) -> Result<Vec<Task>, ApiError> {
        let params = Arc::new(job.params);
        let enqueued = Instant::now();
        let mut tasks = Vec::with_capacity(job.prompts.len() * params.n as usize);
        // The reader allows a replay only of one choice.
        let mut replay = job.replay.map(Box::new);
        // A resumed choice whose client has its first chunk has its echo too.
        let echo = params.echo && !replay.as_ref().is_some_and(|r| r.opened);
        for (p, (tokens, text)) in job.prompts.into_iter().enumerate() {
            let prompt = Arc::new(tokens);
            let echo_text = echo.then(|| Arc::new(text));
            for s in 0..params.n {
                let seed = match params.seed {
                    Some(seed) => (seed as u32).wrapping_add(s),
                    None => rand::random(),
                };
                tasks.push(Task {
                    id: next_id(),
                    index: ChoiceIndex::new(p as u32, s, params.n),
                    prompt: prompt.clone(),
                    params: params.clone(),
                    grammar: job.grammar.clone(),
                    seed,
                    echo_text: echo_text.clone(),
                    events: job.events.clone(),
                    enqueued,
                    replica: job.replica.clone(),
                    replay: replay.take(),
                });
            }
        }
        Ok(tasks)
    }
}
