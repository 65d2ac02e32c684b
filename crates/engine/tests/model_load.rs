//! Proves the llama.cpp build and the default model: load the real GGUF and
//! tokenize a string with it.

use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;

fn model_path() -> std::path::PathBuf {
    let path = std::env::var_os("SLOTGATE_TEST_MODEL").map(Into::into).unwrap_or_else(|| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/gemma-3-270m-q4_k_m.gguf")
    });
    assert!(path.is_file(), "{} is missing: run scripts/fetch-model", path.display());
    path
}

#[test]
fn default_model_loads_and_tokenizes() {
    let mut backend = LlamaBackend::init().unwrap();
    backend.void_logs();
    let model =
        LlamaModel::load_from_file(&backend, model_path(), &LlamaModelParams::default()).unwrap();
    assert_eq!(model.meta_val_str("general.architecture").unwrap(), "gemma3");
    assert_eq!(model.n_vocab(), 262_144);

    let vocab = model.vocab();
    let text = "Hello, slotgate! ☃";
    let tokens = vocab.tokenize(text.as_bytes(), true, false);
    assert_eq!(tokens[0], vocab.bos(), "Gemma prompts start with BOS");
    assert!(tokens.len() > 3 && tokens.len() < text.len(), "{tokens:?}");
    let back = vocab.detokenize(&tokens[1..], false, false);
    assert_eq!(String::from_utf8(back).unwrap(), text);

    // The Gemma turn markers are single special tokens when special parsing is on.
    let turn = vocab.tokenize(b"<start_of_turn>", false, true);
    assert_eq!(turn.len(), 1);
    let end = vocab.tokenize(b"<end_of_turn>", false, true);
    assert!(vocab.is_eog(end[0]), "<end_of_turn> ends generation");
}
