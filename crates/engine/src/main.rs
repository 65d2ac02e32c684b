//! `slotgate-engine`: parse the settings, start the server, print where it listens.

use anyhow::Context;
use clap::Parser;
use slotgate_engine::{Cli, EngineConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let config = EngineConfig::load(&cli)?;
    let running = slotgate_engine::server::start(config, shutdown_signal())
        .await
        .context("engine failed to start")?;
    println!("listening on http://{}", running.addr);
    running.task.await.context("server task panicked")??;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
