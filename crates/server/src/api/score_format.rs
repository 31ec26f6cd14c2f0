//! The JSON of one `/v1/score` item (the shape is documented in `api/score.rs`).

use serde_json::{json, Value};
use tandem_engine::engine::PromptTokenLogprob;
use tandem_model::batch::TokenId;
use tandem_model::tokenizer::Tokenizer;

use super::format::token_text;

/// A scored sequence: its tokens, its context length (positions before it are not
/// reported), the engine's scores of prompt indices `first..tokens.len()` (`first` is 1, or
/// the context length when only the continuation was scored), and the alternatives per
/// position asked for.
#[derive(Debug)]
pub struct ScoredItem<'a> {
    pub tokens: &'a [TokenId],
    pub context: usize,
    pub first: usize,
    pub scores: &'a [PromptTokenLogprob],
    pub top_k: usize,
}

/// Sum, count and whether every scored token was the most likely one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Totals {
    /// Sum of the scored logprobs in f64 (as `tandem score`'s `sum_logprob`).
    pub sum_logprob: f64,
    pub num_scored: usize,
    pub greedy: bool,
}

impl ScoredItem<'_> {
    /// The score of reported position `i` (`None` for position 0 of the whole sequence).
    fn score(&self, i: usize) -> Option<&PromptTokenLogprob> {
        i.checked_sub(self.first.max(1))
            .and_then(|j| self.scores.get(j))
    }

    /// The reported positions: the ones after the context.
    fn reported(&self) -> std::ops::Range<usize> {
        self.context..self.tokens.len()
    }

    pub fn totals(&self) -> Totals {
        let scored: Vec<&PromptTokenLogprob> =
            self.reported().filter_map(|i| self.score(i)).collect();
        Totals {
            sum_logprob: scored.iter().map(|s| f64::from(s.logprob)).sum(),
            num_scored: scored.len(),
            greedy: scored.iter().all(|s| s.rank == 1),
        }
    }
}

/// `{"index", "tokens", "token_texts", "token_logprobs", "ranks", ["top_logprobs"],
/// "num_tokens", "num_scored", "sum_logprob", "mean_logprob", "perplexity", "greedy",
/// ["context_tokens"]}`.
pub fn item_json(tok: &Tokenizer, index: usize, item: &ScoredItem<'_>) -> Value {
    let range = item.reported();
    let ids: Vec<u32> = item.tokens[range.clone()].iter().map(|t| t.0).collect();
    let texts: Vec<String> = ids.iter().map(|&id| token_text(tok, id)).collect();
    let logprobs: Vec<Option<f32>> = range
        .clone()
        .map(|i| item.score(i).map(|s| s.logprob))
        .collect();
    let ranks: Vec<Option<usize>> = range
        .clone()
        .map(|i| item.score(i).map(|s| s.rank))
        .collect();
    let t = item.totals();
    let mean = (t.num_scored > 0).then(|| t.sum_logprob / t.num_scored as f64);
    let mut v = json!({
        "index": index,
        "tokens": ids,
        "token_texts": texts,
        "token_logprobs": logprobs,
        "ranks": ranks,
        "num_tokens": ids.len(),
        "num_scored": t.num_scored,
        "sum_logprob": t.sum_logprob,
        "mean_logprob": mean,
        "perplexity": mean.map(|m| (-m).exp()),
        "greedy": t.greedy,
    });
    if item.top_k > 0 {
        let tops: Vec<Value> = range
            .map(|i| match item.score(i) {
                None => Value::Null,
                Some(s) => s
                    .top
                    .iter()
                    .map(|&(id, lp)| json!({"id": id.0, "token": token_text(tok, id.0), "logprob": lp}))
                    .collect(),
            })
            .collect();
        v["top_logprobs"] = Value::Array(tops);
    }
    if item.context > 0 {
        v["context_tokens"] = json!(item.context);
    }
    v
}
