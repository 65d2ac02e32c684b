//! `slotgate-engine`: parse the settings, start the server, print where it listens,
//! and exit if the scheduler thread stops coming round its loop.

use std::time::Duration;

use anyhow::Context;
use slotgate_engine::{Cli, EngineConfig};

/// The exit status of an engine whose scheduler thread is stuck or gone
/// (`EX_SOFTWARE`): its supervisor starts it again.
const STUCK: i32 = 70;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::try_parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let config = EngineConfig::load(&cli)?;
    let logs = slotgate_http::init_tracing(config.server.log_format);
    let bound = config.server.stuck_bound();
    let running = slotgate_engine::server::start(config, slotgate_http::shutdown_signal())
        .await
        .context("engine failed to start")?;
    println!("listening on http://{}", running.addr);
    let scheduler = running.scheduler.clone();
    let watchdog = async move {
        let Some(bound) = bound else { return std::future::pending().await };
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if let Some(why) = scheduler.failure(bound) {
                return why;
            }
        }
    };
    tokio::select! {
        done = running.task => done.context("server task panicked")??,
        why = watchdog => {
            // A thread stuck inside llama.cpp cannot be stopped; a new process can
            // serve. `/health` has said so since the bound passed.
            tracing::error!(reason = %why, "the engine cannot serve: exiting for a restart");
            drop(logs);
            std::process::exit(STUCK);
        }
    }
    drop(logs);
    Ok(())
}
