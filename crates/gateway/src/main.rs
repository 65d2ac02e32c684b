//! `slotgate`: parse the settings, start the gateway, print where it listens,
//! and drain on SIGTERM or SIGINT.

use anyhow::Context;
use clap::Parser;
use slotgate_gateway::{Cli, Gateway, GatewayConfig};

/// mimalloc, not glibc's malloc: a proxied request allocates and frees buffers
/// on two worker threads, and glibc spent a third of the gateway's user time
/// consolidating its free lists (`unlink_chunk`, `malloc_consolidate`; see
/// BENCHMARKS.md, gateway overhead).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = GatewayConfig::load(&cli)?;
    let _logs = slotgate_http::init_tracing(config.log_format);
    let gateway = Gateway::start_from(cli, config, slotgate_http::shutdown_signal())
        .await
        .context("gateway failed to start")?;
    println!("listening on http://{}", gateway.addr);
    gateway.run().await?;
    Ok(())
}
