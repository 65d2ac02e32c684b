//! `POST /slots/{id}?action=save|restore|erase`, as llama-server answers it:
//! a slot's sequence parked in a file under `slot_save_path` and taken up
//! again, or forgotten. A file name is a plain name in that directory: no
//! path, no escape from it.

use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use slotgate_protocol::ApiError;

use super::AppState;
use crate::error::EngineError;
use crate::scheduler::SlotOp;

/// The query of the route.
#[derive(Debug, Deserialize)]
pub struct SlotQuery {
    action: Option<String>,
    /// The model whose slot it is; left out, the only one loaded.
    model: Option<String>,
}

/// The body of a save or restore.
#[derive(Debug, Default, Deserialize)]
pub struct SlotBody {
    filename: Option<String>,
}

/// `POST /slots/{id}?action=...`.
pub async fn slot_action(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<SlotQuery>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, EngineError> {
    let id: u32 = id
        .parse()
        .map_err(|_| ApiError::invalid("id_slot", format!("`{id}` is not a slot number")))?;
    let model = state.scheduler.snapshot().pick(q.model.as_deref())?.id.clone();
    // An erase needs no body; a save or restore names its file in one.
    let body: SlotBody = if body.iter().all(u8::is_ascii_whitespace) {
        SlotBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid("body", format!("the body is not valid JSON: {e}")))?
    };
    let filename = body.filename;
    let file = |filename: Option<String>| -> Result<(String, std::path::PathBuf), ApiError> {
        let Some(dir) = &state.config.server.slot_save_path else {
            return Err(ApiError::invalid(
                "action",
                "this engine keeps no slot files: start it with slot_save_path",
            ));
        };
        let name = filename.ok_or_else(|| ApiError::invalid("filename", "filename is required"))?;
        check_filename(&name)?;
        let path = dir.join(&name);
        Ok((name, path))
    };
    let action = q.action.as_deref().unwrap_or("");
    let (op, name) = match action {
        "save" => file(filename).map(|(name, path)| (SlotOp::Save(path), Some(name)))?,
        "restore" => file(filename).map(|(name, path)| (SlotOp::Restore(path), Some(name)))?,
        "erase" => (SlotOp::Erase, None),
        other => {
            return Err(ApiError::invalid(
                "action",
                format!("action must be save, restore or erase, got `{other}`"),
            )
            .into())
        }
    };
    let done = state.scheduler.slot_file(model, id, op).await?;
    let ms = done.elapsed.as_secs_f64() * 1e3;
    Ok(Json(match action {
        "save" => json!({"id_slot": id, "filename": name, "n_saved": done.tokens,
            "n_written": done.bytes, "timings": {"save_ms": ms}}),
        "restore" => json!({"id_slot": id, "filename": name, "n_restored": done.tokens,
            "n_read": done.bytes, "timings": {"restore_ms": ms}}),
        _ => json!({"id_slot": id, "n_erased": done.tokens}),
    }))
}

/// A file name as llama-server takes it: a plain name, no path (no `/`, `\`,
/// `..` or leading `.`), no control characters, at most 255 bytes.
fn check_filename(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\\', ':'])
        && !name.chars().any(char::is_control)
        && name.trim() == name;
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid("filename", format!("`{name}` is not a plain file name")))
    }
}

#[cfg(test)]
mod tests {
    use super::check_filename;

    #[test]
    fn only_plain_names_are_taken() {
        for ok in ["slot1.bin", "conversation 7.bin", "a"] {
            assert!(check_filename(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "../x",
            "/etc/passwd",
            "a/b",
            "a\\b",
            ".hidden",
            "..",
            "a\nb",
            " a",
            "C:x",
            &"a".repeat(256),
        ] {
            assert!(check_filename(bad).is_err(), "{bad:?}");
        }
    }
}
