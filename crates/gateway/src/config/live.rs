//! The settings a reload replaces while requests run: the client keys and their
//! limits, the admin key, CORS and the model aliases. Every request reads the
//! version in force when it arrived, and keeps it to its end.

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::error::GatewayError;
use crate::config::GatewayConfig;
use crate::tenancy::limits::UsageBook;
use crate::tenancy::Auth;
use slotgate_http::cors::Cors;

/// One version of the live settings.
#[derive(Debug, Default)]
pub struct Live {
    /// Client keys and the admin key.
    pub auth: Auth,
    /// Allowed browser origins.
    pub cors: Cors,
    /// Other names for served models, and the model each names.
    pub aliases: BTreeMap<String, String>,
}

/// The live settings in force, swapped whole.
pub type LiveCell = Arc<ArcSwap<Live>>;

impl Live {
    /// The live settings of `config`; usage is taken from `book` by key name.
    pub fn build(config: &GatewayConfig, book: &UsageBook) -> Result<Self, GatewayError> {
        let auth = Auth::build(&config.keys, &config.auth, book).map_err(GatewayError::Config)?;
        Ok(Self {
            auth,
            cors: Cors::new(&config.cors.allowed_origins, config.cors.max_age_secs),
            aliases: config.aliases.clone(),
        })
    }
}
