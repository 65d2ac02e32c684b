//! What the scheduler thread last published: every model's slots and queue,
//! the models asleep, and the lookup of the model a request names.

use std::sync::Arc;

use slotgate_protocol::ApiError;

use super::model::{ModelInfo, ModelSnapshot, Reader};
use super::sleep::Dormant;

/// The state of all models, as last published by the scheduler thread.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Every loaded model.
    pub models: Vec<ModelSnapshot>,
    /// The models unloaded while the engine sleeps (`sleep_idle_s`).
    pub sleeping: Vec<Dormant>,
    /// Models being loaded now.
    pub loading: u32,
    /// Grows by one with each change of a model's slots or queue (not with a
    /// cache that only grew): the `seq` of `/slots` and `/slots/events`.
    pub seq: u64,
    /// How long a decode step takes, in microseconds (moving average).
    pub step_us: u64,
}

impl Snapshot {
    /// The model named (by its id or one of its aliases), or the only one loaded
    /// when none is named (as llama-server serves whatever a request names).
    pub fn pick(&self, model: Option<&str>) -> Result<&ModelSnapshot, ApiError> {
        choose(&self.models, model, |m| (&m.id, &m.info))
    }

    /// The name and description of the model named, as [`Snapshot::pick`]
    /// finds it, or of a sleeping one.
    pub fn describe(&self, model: Option<&str>) -> Result<(&str, &Arc<ModelInfo>), ApiError> {
        match self.pick(model) {
            Ok(m) => Ok((&m.id, &m.info)),
            Err(_) if !self.sleeping.is_empty() => {
                choose(&self.sleeping, model, |d| (&d.id, &d.info)).map(|d| (&*d.id, &d.info))
            }
            Err(err) => Err(err),
        }
    }

    /// Whether models sleep, unloaded until a request needs them.
    pub fn is_sleeping(&self) -> bool {
        !self.sleeping.is_empty()
    }
}

/// Of `models`, the one `name` names (by id, then by alias), or the only one
/// when `name` is `None`.
fn choose<'a, T>(
    models: &'a [T],
    name: Option<&str>,
    named: impl Fn(&T) -> (&String, &Arc<ModelInfo>),
) -> Result<&'a T, ApiError> {
    match (name, models) {
        (Some(name), models) => models
            .iter()
            .find(|m| named(m).0 == name)
            .or_else(|| models.iter().find(|m| named(m).1.aliases.iter().any(|a| a == name)))
            .ok_or_else(|| ApiError::model_not_found(name)),
        (None, [only]) => Ok(only),
        (None, []) => {
            Err(ApiError::new(slotgate_protocol::ErrorType::UnavailableError, "no model is loaded"))
        }
        (None, models) => Err(ApiError::invalid(
            "model",
            format!("{} models are loaded: name one in `model`", models.len()),
        )),
    }
}

/// The model a request is served by, looked up once when it arrives: its id
/// (an alias read as the model's own name), what does not change while it is
/// loaded, and its reader. Should it be unloaded meanwhile, the job is refused
/// by the scheduler thread, which knows.
#[derive(Debug, Clone)]
pub struct Served {
    /// The model's own name.
    pub id: String,
    /// What does not change while it is loaded.
    pub info: Arc<ModelInfo>,
    /// Reads its requests into tokens, off the scheduler thread.
    pub reader: Arc<Reader>,
}

impl Snapshot {
    /// The model a request names, as [`Snapshot::pick`] finds it.
    pub fn serve(&self, model: Option<&str>) -> Result<Served, ApiError> {
        let m = self.pick(model)?;
        Ok(Served { id: m.id.clone(), info: m.info.clone(), reader: m.reader.clone() })
    }
}
