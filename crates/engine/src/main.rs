//! `slotgate-engine`: parse the settings, start the server, print where it listens.

use anyhow::Context;
use slotgate_engine::{Cli, EngineConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::try_parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let config = EngineConfig::load(&cli)?;
    let _logs = slotgate_http::init_tracing(config.server.log_format);
    let running = slotgate_engine::server::start(config, slotgate_http::shutdown_signal())
        .await
        .context("engine failed to start")?;
    println!("listening on http://{}", running.addr);
    running.task.await.context("server task panicked")??;
    Ok(())
}
