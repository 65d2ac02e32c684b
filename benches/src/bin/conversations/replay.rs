//! Replaying conversations: each turn resends the transcript so far and records
//! what the engine reused of it.

use std::time::Duration;

use serde::Serialize;
use serde_json::json;
use slotgate_benches::conversation::{is_warm, Transcript};
use slotgate_benches::{request, Target};
use slotgate_tests::MODEL;

use crate::Args;

/// One turn of one conversation, as answered.
#[derive(Serialize, Clone)]
pub struct Turn {
    /// `engine` or `gateway`.
    pub part: &'static str,
    /// The engine, or the route through the gateway.
    pub target: String,
    /// `4 slots`, or `light` / `full`.
    pub setting: String,
    pub conversation: usize,
    pub turn: usize,
    pub ttft_ms: f64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Later turns only: whether the whole previous prompt was reused.
    pub warm: Option<bool>,
}

/// Names one run: its part, target and setting.
#[derive(Clone)]
pub struct Tag {
    pub part: &'static str,
    pub target: String,
    pub setting: String,
}

/// Sends the next turn of `tr` to `t`; returns the transcript with the answer.
async fn one_turn(
    client: reqwest::Client,
    t: Target,
    mut tr: Transcript,
    c: usize,
    max_tokens: u32,
    tag: Tag,
) -> anyhow::Result<(Transcript, Turn)> {
    let body = json!({"model": MODEL, "prompt": tr.ask(), "max_tokens": max_tokens,
        "temperature": 0, "stream": true, "stream_options": {"include_usage": true}});
    let turn = tr.turns();
    let sample = request(&client, &t, &body, Duration::from_secs(120)).await.map_err(|e| {
        anyhow::anyhow!("{} {} conversation {c} turn {turn}: {e}", tag.target, tag.setting)
    })?;
    let warm = (turn > 1).then(|| is_warm(sample.cached_tokens, tr.last_prompt_tokens));
    tr.answer(&sample.text, sample.prompt_tokens);
    let result = Turn {
        part: tag.part,
        target: tag.target,
        setting: tag.setting,
        conversation: c,
        turn,
        ttft_ms: sample.ttft.as_secs_f64() * 1000.0,
        prompt_tokens: sample.prompt_tokens,
        cached_tokens: sample.cached_tokens,
        warm,
    };
    Ok((tr, result))
}

/// Replays the turns of `transcripts[i]` against `targets[i]`: one conversation
/// at a time, or all at once (`concurrent`), each conversation's turns in order.
pub async fn replay(
    client: &reqwest::Client,
    targets: &[Target],
    mut transcripts: Vec<Transcript>,
    concurrent: bool,
    args: &Args,
    tag: Tag,
) -> anyhow::Result<Vec<Turn>> {
    let (n, max_tokens) = (args.turns, args.max_tokens);
    let mut turns = Vec::new();
    if concurrent {
        let tasks: Vec<_> = transcripts
            .into_iter()
            .enumerate()
            .map(|(c, mut tr)| {
                let (client, t, tag) = (client.clone(), targets[c].clone(), tag.clone());
                tokio::spawn(async move {
                    let mut out = Vec::new();
                    for _ in 0..n {
                        let (next, turn) =
                            one_turn(client.clone(), t.clone(), tr, c, max_tokens, tag.clone())
                                .await?;
                        tr = next;
                        out.push(turn);
                    }
                    Ok::<_, anyhow::Error>(out)
                })
            })
            .collect();
        for task in tasks {
            turns.extend(task.await??);
        }
    } else {
        // Users do not take turns in a fixed order: each round goes through the
        // conversations in a new order (seeded, so every target gets the same
        // one). A fixed order would also let round robin keep each conversation
        // on one backend whenever the backends divide the conversations.
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..n {
            for c in shuffled(transcripts.len(), &mut seed) {
                let (next, turn) = one_turn(
                    client.clone(),
                    targets[c].clone(),
                    transcripts[c].clone(),
                    c,
                    max_tokens,
                    tag.clone(),
                )
                .await?;
                transcripts[c] = next;
                turns.push(turn);
            }
        }
    }
    Ok(turns)
}

/// `0..n` in an order drawn from `seed` (xorshift, then Fisher-Yates), which
/// moves on so that the next call draws another.
fn shuffled(n: usize, seed: &mut u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        order.swap(i, (*seed % (i as u64 + 1)) as usize);
    }
    order
}

/// `n` fresh conversations of run `run`.
pub fn transcripts(run: &str, n: usize) -> Vec<Transcript> {
    (0..n).map(|c| Transcript::new(&format!("{run}-{c}"))).collect()
}
