//! Reranking inputs: a query and each document made one sequence, as
//! llama-server makes them: the model's own rerank template
//! (`tokenizer.chat_template.rerank`, with `{query}` and `{document}`), or else
//! `[BOS] query [EOS] [SEP] document [EOS]`, each special token where the
//! vocabulary asks for it.

use llama_cpp_2::token::LlamaToken;
use slotgate_protocol::ApiError;

use super::Reader;

impl Reader {
    /// The sequence of `query` with each of `documents`, each checked to fit
    /// the context; texts are measured before any is tokenized.
    pub fn read_rerank(
        &self,
        query: &str,
        documents: &[String],
    ) -> Result<Vec<Vec<LlamaToken>>, ApiError> {
        let limit = self.ctx_len.saturating_mul(self.longest_piece);
        for (i, document) in documents.iter().enumerate() {
            let bytes = query.len() + document.len();
            if bytes > limit {
                let param = format!("documents[{i}]");
                let message = format!(
                    "{param} with the query is {bytes} bytes, more than the context of {} tokens \
                     can hold",
                    self.ctx_len
                );
                return Err(self.too_long(message, &param, None, self.ctx_len));
            }
        }
        let template = self.model.meta_val_str("tokenizer.chat_template.rerank").ok();
        let vocab = self.model.vocab();
        // The query is read once, not once a document: a long query over many
        // short documents is not read a thousand times.
        let query_tokens = vocab.tokenize(query.as_bytes(), false, false);
        let mut out = Vec::with_capacity(documents.len());
        for (i, document) in documents.iter().enumerate() {
            let tokens = match &template {
                Some(template) => {
                    let text = template.replace("{query}", query).replace("{document}", document);
                    vocab.tokenize(text.as_bytes(), false, true)
                }
                None => {
                    let eos = vocab.eos();
                    let mut tokens = Vec::with_capacity(query_tokens.len() + 4);
                    if vocab.should_add_bos() {
                        tokens.push(vocab.bos());
                    }
                    tokens.extend_from_slice(&query_tokens);
                    if vocab.should_add_eos() {
                        tokens.push(eos);
                    }
                    if vocab.should_add_sep() {
                        tokens.push(vocab.sep());
                    }
                    tokens.extend(vocab.tokenize(document.as_bytes(), false, false));
                    if vocab.should_add_eos() {
                        tokens.push(eos);
                    }
                    tokens
                }
            };
            self.fits_embedding(tokens.len(), &format!("documents[{i}]"))?;
            out.push(tokens);
        }
        Ok(out)
    }
}
