//! The output processor driven by scripted engine events on a small real tokenizer (the
//! model crate's byte-level BPE fixture): text deltas concatenate to the decoded text cut at
//! the first stop string (also one split across tokens), a stop ends the request in the
//! engine and silences its later events, `n > 1` siblings keep their own text, finish
//! reasons map (errors included), prompt scores go out with the first delta, beam
//! hypotheses come back as text, and `finish_all` flushes what was held back; an output cut
//! by its length limit inside a character drops it (no U+FFFD), one ended by a stop keeps
//! the U+FFFD that decoding gives.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use tandem_engine::beam_search::BeamHypothesis;
use tandem_engine::engine::{EngineEvent, PromptTokenLogprob};
use tandem_engine::{FinishReason, SeqId};
use tandem_model::batch::TokenId;
use tandem_model::tokenizer::Tokenizer;
use tandem_text::{
    Finish, OutputProcessor, RequestControl, RequestDelta, RequestOutput, StopStrings, TextOptions,
};

fn tokenizer() -> Arc<Tokenizer> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures/tokenizer_hf/byte_level");
    Arc::new(Tokenizer::from_hf_dir(&dir).expect("the fixture tokenizer loads"))
}

/// The engine side: which requests were ended, and beam results to hand out.
#[derive(Default)]
struct Control {
    ended: Vec<SeqId>,
    beams: HashMap<SeqId, Vec<BeamHypothesis>>,
}

impl RequestControl for Control {
    fn end(&mut self, id: SeqId) {
        self.ended.push(id);
    }

    fn take_beam_result(&mut self, id: SeqId) -> Option<Vec<BeamHypothesis>> {
        self.beams.remove(&id)
    }
}

fn options(stops: &[&str], include: bool) -> TextOptions {
    TextOptions {
        skip_special_tokens: true,
        stop: StopStrings::new(stops.iter().copied()).expect("valid stop strings"),
        include_stop_str_in_output: include,
    }
}

fn token(id: SeqId, t: u32) -> EngineEvent {
    EngineEvent::Token {
        seq_id: id,
        token: TokenId(t),
        logprob: Some(-0.5),
        top_logprobs: vec![(TokenId(t), -0.5)],
    }
}

fn finished(id: SeqId, reason: FinishReason) -> EngineEvent {
    EngineEvent::Finished { seq_id: id, reason }
}

/// Runs `events` through `p` and returns every output with its tag.
fn run(
    p: &mut OutputProcessor<usize>,
    control: &mut Control,
    events: Vec<EngineEvent>,
) -> Vec<(usize, RequestOutput)> {
    let mut out = Vec::new();
    p.process(control, events, |_, &tag, o| out.push((tag, o)));
    out
}

/// The deltas of request `tag`, in order.
fn deltas(outputs: &[(usize, RequestOutput)], tag: usize) -> Vec<RequestDelta> {
    outputs
        .iter()
        .filter(|(t, _)| *t == tag)
        .filter_map(|(_, o)| match o {
            RequestOutput::Delta(d) => Some(d.clone()),
            RequestOutput::Admitted { .. } => None,
        })
        .collect()
}

fn text(deltas: &[RequestDelta]) -> String {
    deltas.iter().map(|d| d.text.as_str()).collect()
}

#[test]
fn a_stop_string_split_across_tokens_ends_the_request_in_the_engine() {
    let tok = tokenizer();
    let ids = tok
        .encode("hello world, hello there", false)
        .expect("encodes");
    let stop = "lo wor";
    // The stop string must span a token boundary for this test to mean anything.
    let pieces: Vec<String> = ids
        .iter()
        .map(|&i| tok.decode(&[i], false).expect("decodes"))
        .collect();
    assert!(
        pieces.iter().all(|p| !p.contains(stop)),
        "no single token holds {stop:?}: {pieces:?}"
    );
    let mut p = OutputProcessor::new(tok.clone());
    let mut control = Control::default();
    let id = SeqId(7);
    p.track(id, options(&[stop], false), 1, 0);
    let mut events: Vec<EngineEvent> = ids.iter().map(|&t| token(id, t)).collect();
    events.push(finished(id, FinishReason::Length));
    let out = run(&mut p, &mut control, events);
    let d = deltas(&out, 0);
    assert_eq!(text(&d), "hel");
    let last = d.last().expect("a last delta");
    assert_eq!(last.finish, Some(Finish::Stop));
    assert!(d[..d.len() - 1].iter().all(|d| d.finish.is_none()));
    assert_eq!(control.ended, vec![id], "the stop ends the request at once");
    assert!(p.is_empty(), "nothing is tracked after the last delta");
    // One delta per token up to the stop; the later events are ignored.
    let tokens: Vec<u32> = d
        .iter()
        .filter_map(|d| d.token.as_ref())
        .map(|t| t.token.0)
        .collect();
    assert_eq!(tokens, ids[..tokens.len()].to_vec());
    assert!(tokens.len() < ids.len());
    let full = tok.decode(&tokens, true).expect("decodes");
    assert!(
        full.contains(stop),
        "the last token completed the stop: {full:?}"
    );
}

#[test]
fn include_stop_str_in_output_keeps_the_stop_and_tails_are_flushed() {
    let tok = tokenizer();
    let ids = tok.encode("one two three", false).expect("encodes");
    let mut p = OutputProcessor::new(tok.clone());
    let mut control = Control::default();
    p.track(SeqId(1), options(&["two"], true), 1, 0);
    // "thr" is a prefix of nothing here; "thre" could be the start of "three!"...
    p.track(SeqId(2), options(&["three!"], false), 1, 1);
    let mut events = Vec::new();
    for &t in &ids {
        events.push(token(SeqId(1), t));
        events.push(token(SeqId(2), t));
    }
    events.push(finished(SeqId(2), FinishReason::Length));
    let out = run(&mut p, &mut control, events);
    let first = deltas(&out, 0);
    assert_eq!(text(&first), "one two");
    assert_eq!(
        first.last().and_then(|d| d.finish.clone()),
        Some(Finish::Stop)
    );
    let second = deltas(&out, 1);
    assert_eq!(
        text(&second),
        "one two three",
        "held-back text goes out at the finish"
    );
    let last = second.last().expect("a last delta");
    assert_eq!(last.finish, Some(Finish::Length));
    assert!(last.token.is_none());
    assert_eq!(control.ended, vec![SeqId(1)]);
}

#[test]
fn siblings_keep_their_own_text_and_finish_reasons_map() {
    let tok = tokenizer();
    let a = tok.encode("the cat", false).expect("encodes");
    let b = tok.encode("a dog", false).expect("encodes");
    let mut p = OutputProcessor::new(tok.clone());
    let mut control = Control::default();
    for (k, id) in [SeqId(10), SeqId(11), SeqId(12)].into_iter().enumerate() {
        p.track(id, options(&[], false), 1, k);
    }
    let mut events = vec![EngineEvent::Admitted {
        seq_id: SeqId(10),
        cached_tokens: 16,
    }];
    for i in 0..a.len().max(b.len()) {
        events.extend(a.get(i).map(|&t| token(SeqId(10), t)));
        events.extend(b.get(i).map(|&t| token(SeqId(11), t)));
    }
    events.push(finished(SeqId(10), FinishReason::Stop));
    events.push(finished(SeqId(11), FinishReason::Abort));
    events.push(finished(SeqId(12), FinishReason::Error("boom".into())));
    let out = run(&mut p, &mut control, events);
    assert_eq!(out[0], (0, RequestOutput::Admitted { cached_tokens: 16 }));
    assert_eq!(text(&deltas(&out, 0)), "the cat");
    assert_eq!(text(&deltas(&out, 1)), "a dog");
    let finishes: Vec<Option<Finish>> = (0..3)
        .map(|k| deltas(&out, k).last().and_then(|d| d.finish.clone()))
        .collect();
    assert_eq!(
        finishes,
        vec![
            Some(Finish::Stop),
            Some(Finish::Abort),
            Some(Finish::Error("boom".into()))
        ]
    );
    assert_eq!(Finish::Error("boom".into()).as_str(), "error");
    assert!(control.ended.is_empty(), "the engine ended them itself");
    assert!(p.is_empty());
}

#[test]
fn a_token_outside_the_vocabulary_fails_the_request() {
    let tok = tokenizer();
    let mut p = OutputProcessor::new(tok.clone());
    let mut control = Control::default();
    p.track(SeqId(3), options(&[], false), 1, 0);
    let bad = u32::try_from(tok.vocab_size()).expect("small vocabulary") + 5;
    let out = run(
        &mut p,
        &mut control,
        vec![token(SeqId(3), bad), token(SeqId(3), 1)],
    );
    let d = deltas(&out, 0);
    assert_eq!(d.len(), 1, "nothing after the failure");
    assert!(matches!(&d[0].finish, Some(Finish::Error(m)) if m.contains("vocabulary")));
    assert_eq!(control.ended, vec![SeqId(3)]);
}

fn score(t: u32) -> PromptTokenLogprob {
    PromptTokenLogprob {
        token: TokenId(t),
        logprob: -1.0,
        rank: 1,
        top: Vec::new(),
    }
}

#[test]
fn prompt_scores_go_out_with_the_first_delta_and_gaps_fail() {
    let tok = tokenizer();
    let mut p = OutputProcessor::new(tok.clone());
    let mut control = Control::default();
    p.track(SeqId(1), options(&[], false), 1, 0);
    p.track(SeqId(2), options(&[], false), 3, 1);
    let chunk = |id, start, n: u32| EngineEvent::PromptLogprobs {
        seq_id: SeqId(id),
        start,
        entries: (0..n).map(score).collect(),
    };
    let events = vec![
        chunk(1, 1, 2),
        chunk(1, 3, 1),
        chunk(2, 4, 1),
        token(SeqId(1), 1),
        finished(SeqId(1), FinishReason::Length),
    ];
    let out = run(&mut p, &mut control, events);
    let d = deltas(&out, 0);
    assert_eq!(
        d[0].prompt_logprobs.len(),
        3,
        "all the scores, on the first delta"
    );
    assert!(d[1].prompt_logprobs.is_empty());
    let failed = deltas(&out, 1);
    assert_eq!(failed.len(), 1);
    assert_eq!(
        failed[0].finish,
        Some(Finish::Error(
            "prompt logprobs arrived for index 4, expected 3".into()
        ))
    );
    assert_eq!(control.ended, vec![SeqId(2)]);
}

#[test]
fn beam_hypotheses_come_back_as_text_cut_at_stop_strings() {
    let tok = tokenizer();
    let mut p = OutputProcessor::new(tok.clone());
    let mut control = Control::default();
    let hyp = |text: &str, score: f32| BeamHypothesis {
        tokens: tok
            .encode(text, false)
            .expect("encodes")
            .into_iter()
            .map(TokenId)
            .collect(),
        cum_logprob: score * 2.0,
        score,
    };
    control
        .beams
        .insert(SeqId(5), vec![hyp("good day", -0.5), hyp("bad. day", -0.9)]);
    p.track(SeqId(5), options(&["."], false), 1, 0);
    let out = run(
        &mut p,
        &mut control,
        vec![finished(SeqId(5), FinishReason::Length)],
    );
    let d = deltas(&out, 0);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].finish, Some(Finish::Length));
    let beams: Vec<(&str, bool)> = d[0]
        .beams
        .iter()
        .map(|b| (b.text.as_str(), b.stopped))
        .collect();
    assert_eq!(beams, vec![("good day", false), ("bad", true)]);
    assert_eq!(d[0].beams[1].score, -0.9);
    assert_eq!(
        d[0].beams[1].tokens.len(),
        hyp("bad. day", 0.0).tokens.len()
    );
}

#[test]
fn finish_all_ends_everything_with_its_held_back_text() {
    let tok = tokenizer();
    let ids = tok.encode("abc", false).expect("encodes");
    let mut p = OutputProcessor::new(tok.clone());
    let mut control = Control::default();
    // "abc" could still become "abcd": all of it is held back.
    p.track(SeqId(1), options(&["abcd"], false), 1, 0);
    p.track(SeqId(2), options(&[], false), 1, 1);
    let events = ids.iter().map(|&t| token(SeqId(1), t)).collect();
    let mut out = run(&mut p, &mut control, events);
    assert_eq!(text(&deltas(&out, 0)), "");
    assert_eq!(p.len(), 2);
    p.finish_all(Some(&mut control), FinishReason::Abort, |_, &k, o| {
        out.push((k, o))
    });
    assert_eq!(text(&deltas(&out, 0)), "abc");
    for k in 0..2 {
        let last = deltas(&out, k).last().cloned().expect("a last delta");
        assert_eq!(last.finish, Some(Finish::Abort));
    }
    control.ended.sort();
    assert_eq!(control.ended, vec![SeqId(1), SeqId(2)]);
    assert!(p.is_empty());
    assert!(p.abort(&mut control, SeqId(1)).is_none(), "already gone");
}

#[test]
fn a_length_cut_inside_a_character_drops_it_and_a_stop_keeps_the_replacement_char() {
    let tok = tokenizer();
    let ids = tok.encode("ok \u{1F642}", false).expect("encodes");
    // The emoji's 4 bytes span several byte tokens; end one token early.
    let cut = &ids[..ids.len() - 1];
    let decoded = tok.decode(cut, true).expect("decodes");
    assert!(
        decoded.ends_with('\u{FFFD}'),
        "the cut is inside the character: {decoded:?}"
    );
    for (tag, reason, expected) in [
        (
            0,
            FinishReason::Length,
            decoded.trim_end_matches('\u{FFFD}').to_string(),
        ),
        (1, FinishReason::Stop, decoded.clone()),
    ] {
        let mut p = OutputProcessor::new(tok.clone());
        let mut control = Control::default();
        p.track(SeqId(1), options(&[], false), 1, tag);
        let mut events: Vec<EngineEvent> = cut.iter().map(|&t| token(SeqId(1), t)).collect();
        events.push(finished(SeqId(1), reason));
        let out = run(&mut p, &mut control, events);
        assert_eq!(text(&deltas(&out, tag)), expected, "tag {tag}");
    }
}
