//! The whole forward program (`layer_program.rs`) on the emulator: weights converted by
//! `weights.rs`, a paged KV pool, workspace and step inputs in host buffers laid out as the
//! runner's, and batches laid out by `batch_layout.rs` — against the CPU model
//! (`tandem_model::transformer`, itself checked against transformers) over the same batches
//! and block tables. Steps mix chunked prefill and decode, contexts span several attention
//! partitions, decode steps run both as the eager path and as the graph path shapes them
//! (padded, naming every partition the tables can hold), and every weight format and
//! attention path the runner can pick is covered; and the program against itself: a
//! sequence's rows are bitwise the same in the mixed steps as scored alone.

use std::path::{Path, PathBuf};

use tandem_model::batch::{BlockId, ForwardBatch, OutputSelection, SeqSpan, TokenId};
use tandem_model::host_model::HostModel;
use tandem_model::kv_store::{KvDtype, KvStore};
use tandem_model::transformer::Model;

use super::forward_models::{load, specs, write_model, Spec, VOCAB};
use super::*;
use crate::batch_layout::{BatchLayout, RopeFreqs};
use crate::decode_graphs::bucket_for;
use crate::kernels::ATTN_PARTITION;
use crate::layer_program::{tensor_core_attention, DenseProducts, LayerProgram};
use crate::options::CudaWeights;
use crate::program_buffers::{
    KvPtrs, LayerPtrs, MatrixPtrs, MlpPtrs, WeightPtrs, WorkspaceBytes, WorkspacePtrs,
};
use crate::step_inputs::{InputPtrs, LOGIT_ROWS};
use crate::weight_conversion::{convert_embeddings, convert_layer, HostMatrix, HostMlp};

const BLOCK_SIZE: usize = 16;
const NUM_BLOCKS: usize = 48;

/// How the program computes: the choices the runner makes from its options.
#[derive(Debug, Clone, Copy)]
struct Mode {
    dtype: CudaDtype,
    weights: CudaWeights,
    from_codes: bool,
    tensor_cores: bool,
    /// With tensor cores, whether the blocks of a step with a prompt's tiles fold their
    /// partitions themselves (the runner's choice for steps that fill the device; here
    /// every such step) or take a block per partition, as smaller steps do.
    folds: bool,
}

/// The runner's buffers, in host memory.
struct Emulated {
    mode: Mode,
    kernels: Kernels,
    config: tandem_model::ModelConfig,
    rope: RopeFreqs,
    /// Keeps every weight buffer alive.
    _weights: Vec<Buf>,
    weight_ptrs: WeightPtrs,
    _planes: Vec<Buf>,
    _hidden: Buf,
    kv_ptrs: KvPtrs,
    quant_scratch: Option<Buf>,
    capacity: usize,
    ws: Vec<Buf>,
    /// Which of `ws` holds the logits, and the routes' grouping by expert.
    logits: usize,
    route_groups: usize,
    ws_ptrs: WorkspacePtrs,
}

impl Emulated {
    fn new(host: &HostModel, mode: Mode, capacity: usize) -> Emulated {
        let c = host.config.clone();
        let mut keep = Vec::new();
        let mut put = |b: Buf| {
            keep.push(b);
            keep.last_mut().expect("pushed").ptr()
        };
        let (embed, lm_head) = convert_embeddings(host, mode.dtype).expect("embeddings");
        let embed = put(Buf::of(&embed));
        let lm_head = lm_head.map_or(embed, |m| put(Buf::of(&m)));
        let final_norm = put(Buf::of(&host.weights.final_norm));
        let mut largest = 0;
        let mut layers = Vec::new();
        for l in &host.weights.layers {
            let h = convert_layer(host, l, mode.dtype, mode.weights).expect("layer");
            largest = largest.max(h.largest_quantized());
            let router = match &h.mlp {
                HostMlp::Experts { router, .. } => put(Buf::of(router)),
                HostMlp::Dense { .. } => 0,
            };
            let mut matrix = |m: &HostMatrix| match m {
                HostMatrix::Dense(d) => MatrixPtrs::Dense(put(Buf::of(d))),
                HostMatrix::Q8 { codes, scales, .. } => {
                    let codes = put(Buf::of(codes));
                    MatrixPtrs::Q8 {
                        codes,
                        scales: put(Buf::of(scales)),
                    }
                }
                HostMatrix::Q4 { codes, scales, .. } => {
                    let codes = put(Buf::of(codes));
                    MatrixPtrs::Q4 {
                        codes,
                        scales: put(Buf::of(scales)),
                    }
                }
            };
            let (qkv, o) = (matrix(&h.qkv), matrix(&h.o));
            let mlp = match &h.mlp {
                HostMlp::Dense { gate_up, down } => MlpPtrs::Dense {
                    gate_up: matrix(gate_up),
                    down: matrix(down),
                },
                HostMlp::Experts { gate_up, down, .. } => MlpPtrs::Experts {
                    router,
                    gate_up: matrix(gate_up),
                    down: matrix(down),
                },
            };
            layers.push(LayerPtrs {
                attn_norm: put(Buf::of(&h.attn_norm)),
                qkv,
                qkv_bias: h.qkv_bias.as_ref().map(|b| put(Buf::of(b))),
                qk_norm: h.qk_norm.as_ref().map(|b| put(Buf::of(b))),
                o,
                ffn_norm: put(Buf::of(&h.ffn_norm)),
                mlp,
                post_norms: h
                    .post_norms
                    .as_ref()
                    .map(|[a, m]| [put(Buf::of(a)), put(Buf::of(m))]),
            });
        }
        let weight_ptrs = WeightPtrs {
            embed,
            lm_head,
            final_norm,
            layers,
        };
        // The runner's pool: NUM_BLOCKS blocks and the scratch block.
        let slots = (NUM_BLOCKS + 1) * BLOCK_SIZE;
        let plane = slots * c.kv_dim() * mode.dtype.size();
        let mut planes: Vec<Buf> = (0..2 * c.num_layers).map(|_| Buf::zeroed(plane)).collect();
        let mut hidden = Buf::zeroed(slots * c.hidden_size * 4);
        let plane_ptrs: Vec<DevPtr> = planes.iter_mut().map(Buf::ptr).collect();
        let kv_ptrs = KvPtrs {
            keys: plane_ptrs[..c.num_layers].to_vec(),
            values: plane_ptrs[c.num_layers..].to_vec(),
            hidden: hidden.ptr(),
            block_size: BLOCK_SIZE,
        };
        let quant_scratch = (largest > 0).then(|| Buf::zeroed(largest * mode.dtype.size()));
        let sz = WorkspaceBytes::new(&c, mode.dtype, capacity, LOGIT_ROWS);
        let (mut ws, mut logits, mut route_groups) = (Vec::new(), 0, 0);
        let ws_ptrs = sz.place(|field, bytes| {
            match field {
                "logits" => logits = ws.len(),
                "route_groups" => route_groups = ws.len(),
                _ => {}
            }
            ws.push(Buf::zeroed(bytes));
            ws.last_mut().expect("pushed").ptr()
        });
        Emulated {
            mode,
            kernels: kernels(mode.dtype),
            rope: RopeFreqs {
                global: host.weights.inv_freqs.clone(),
                local: host.weights.local_inv_freqs.clone(),
            },
            config: c,
            _weights: keep,
            weight_ptrs,
            _planes: planes,
            _hidden: hidden,
            kv_ptrs,
            quant_scratch,
            capacity,
            ws,
            logits,
            route_groups,
            ws_ptrs,
        }
    }

    /// Runs `batch` as the runner's eager path does, or, for a decode step with
    /// `graph_shaped`, as its graph path does (padded with rows of the scratch block, the
    /// attention naming every partition the block tables can hold); returns the logits of
    /// the batch's output rows.
    fn forward(&mut self, batch: &ForwardBatch, graph_shaped: bool) -> Vec<f32> {
        let c = &self.config;
        batch
            .validate(c.vocab_size, BLOCK_SIZE, NUM_BLOCKS)
            .expect("valid batch");
        let mut l = BatchLayout::build(batch, BLOCK_SIZE, &self.rope).expect("layout");
        let outputs = l.output_rows.len();
        assert!(l.tokens.len() <= self.capacity && outputs <= LOGIT_ROWS);
        // The runner's block tables are wider than the batch needs.
        let stride = l.max_blocks.next_power_of_two() * 2;
        l.widen_tables(stride);
        let mut parts = l.max_context().div_ceil(ATTN_PARTITION).max(1);
        if graph_shaped && l.is_decode() {
            // Padded past the batch's own bucket, so that there are padding rows.
            let bucket = bucket_for(l.tokens.len() + 1).expect("a bucket");
            l.pad_decode(bucket, NUM_BLOCKS, BLOCK_SIZE);
            parts = (stride * BLOCK_SIZE).div_ceil(ATTN_PARTITION);
        }
        let n = l.tokens.len();
        let mut tokens = Buf::of(&l.tokens);
        let mut positions = Buf::of(&l.positions);
        let mut token_seq = Buf::of(&l.token_seq);
        let mut write_slots = Buf::of(&l.write_slots);
        let mut cos = Buf::of(&l.cos);
        let mut sin = Buf::of(&l.sin);
        let mut cos_local = Buf::of(&l.cos_local);
        let mut sin_local = Buf::of(&l.sin_local);
        let mut tables = Buf::of(&l.block_tables);
        let mut output_slots = Buf::of(&l.output_slots);
        let mut live_rows = Buf::of(&[l.live_rows as i32]);
        let mut unused = Buf::zeroed(4);
        let mut program = LayerProgram {
            config: c,
            dtype: self.mode.dtype,
            kernels: &self.kernels,
            dense: DenseProducts::Fixed,
            from_codes: self.mode.from_codes,
            quant_scratch: self.quant_scratch.as_mut().map(Buf::ptr),
            tensor_core_attention: tensor_core_attention(
                self.mode.tensor_cores,
                c,
                self.mode.dtype,
            ),
            // The runner's bar is for device-sized steps: here every step with a prompt's
            // tiles folds, or none does.
            tc_fold_min_blocks: if self.mode.folds { 0 } else { usize::MAX },
            weights: &self.weight_ptrs,
            kv: &self.kv_ptrs,
            ws: self.ws_ptrs,
            inputs: InputPtrs {
                tokens: tokens.ptr(),
                positions: positions.ptr(),
                token_seq: token_seq.ptr(),
                write_slots: write_slots.ptr(),
                cos: cos.ptr(),
                sin: sin.ptr(),
                cos_local: cos_local.ptr(),
                sin_local: sin_local.ptr(),
                block_tables: tables.ptr(),
                output_slots: output_slots.ptr(),
                tiles: 0,
                carried: unused.ptr(),
                carried_out: unused.ptr(),
                live_rows: live_rows.ptr(),
            },
            table_stride: stride,
            profile: None,
        };
        let tiles = program.attention_tiles(&l, parts);
        let mut tile_buf = tiles.as_ref().map(|t| Buf::of(&t.pairs));
        if let Some(b) = tile_buf.as_mut() {
            program.inputs.tiles = b.ptr();
        }
        program
            .queue_layers(n, parts, tiles.as_ref())
            .expect("layers");
        program
            .queue_lm_head(l.output_slots.len())
            .expect("lm head");
        if let Some(moe) = c.features.moe {
            // The last layer's routes: the padding rows of a graph-shaped step took none.
            let groups = self.ws[self.route_groups].read::<i32>();
            let routed = groups[2 * moe.num_experts] as usize;
            assert_eq!(
                routed,
                l.live_rows * moe.experts_per_token,
                "routes of {n} rows"
            );
        }
        let logits = self.ws[self.logits].read::<f32>();
        logits[..outputs * c.vocab_size].to_vec()
    }
}

/// The steps of the test: two sequences on scattered blocks, chunked prefill mixed with
/// decode, contexts past one attention partition. `(tokens, spans)` per step, each span
/// `(sequence, new tokens, cached)`.
fn steps() -> Vec<Vec<(usize, usize, usize)>> {
    vec![
        vec![(0, 100, 0), (1, 20, 0)],
        vec![(1, 1, 20), (0, 45, 100)],
        vec![(0, 1, 145), (1, 1, 21)],
        vec![(0, 1, 146), (1, 1, 22)],
        vec![(1, 1, 23), (0, 120, 147)],
        vec![(0, 1, 267), (1, 1, 24)],
    ]
}

fn block_tables() -> [Vec<BlockId>; 2] {
    // Sequence 0: odd blocks, backwards from the last; sequence 1: even ones, shuffled.
    let a = (0..18).map(|i| BlockId(47 - 2 * i)).collect();
    let b = [2, 8, 4, 10].map(BlockId).to_vec();
    [a, b]
}

fn token(seq: usize, pos: usize) -> TokenId {
    TokenId(((seq * 31 + pos * 7 + pos * pos) % VOCAB) as u32)
}

fn batch(step: &[(usize, usize, usize)]) -> ForwardBatch {
    let tables = block_tables();
    let mut tokens = Vec::new();
    let mut seqs = Vec::new();
    for &(s, len, cached) in step {
        seqs.push(SeqSpan {
            start: tokens.len(),
            len,
            num_cached: cached,
            block_table: tables[s][..(cached + len).div_ceil(BLOCK_SIZE)].to_vec(),
            adapter: None,
        });
        tokens.extend((cached..cached + len).map(|p| token(s, p)));
    }
    ForwardBatch {
        tokens,
        seqs,
        output: OutputSelection::All,
    }
}

fn temp_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tandem-emu-forward-{}-{name}", std::process::id()))
}

/// Per logits row of every step, the max |Δ| between the emulated program and the CPU model;
/// and the largest |logit| of the CPU model.
fn compare(dir: &Path, mode: Mode) -> (Vec<f32>, f32) {
    let host = load(dir);
    let mut cpu = Model::new(load(dir), 1);
    let mut kv =
        KvStore::with_dtype(&host.config, BLOCK_SIZE, NUM_BLOCKS, KvDtype::F32).expect("kv store");
    let mut emu = Emulated::new(&host, mode, 160);
    let (mut rows, mut largest) = (Vec::new(), 0.0f32);
    for (i, step) in steps().iter().enumerate() {
        let b = batch(step);
        let want = cpu.forward(&b, &mut kv).expect("cpu forward");
        // Decode steps alternate between the graph path's shape and the eager one.
        let got = emu.forward(&b, i % 2 == 1);
        assert_eq!(got.len(), want.as_slice().len());
        let pairs = got.chunks(VOCAB).zip(want.as_slice().chunks(VOCAB));
        for (g, w) in pairs {
            assert!(
                g.iter().all(|v| v.is_finite()),
                "{mode:?}: a non-finite logit"
            );
            let diff = g.iter().zip(w).map(|(a, b)| (a - b).abs());
            rows.push(diff.fold(0.0f32, f32::max));
            largest = w.iter().fold(largest, |m, v| m.max(v.abs()));
        }
    }
    (rows, largest)
}

/// The runner's choices for weights written in `format` and stored as `dtype`: quantized
/// matrices multiply from their codes in decode steps and expand into the scratch matrix
/// for prefill chunks (the test's steps have both); bf16 prefill may use tensor cores.
fn modes(dtype: CudaDtype, format: CudaWeights, experts: bool) -> Vec<Mode> {
    let plain = Mode {
        dtype,
        weights: format,
        from_codes: true,
        tensor_cores: false,
        folds: true,
    };
    let tensor_cores = Mode {
        tensor_cores: true,
        ..plain
    };
    match (dtype, format) {
        (CudaDtype::Bf16, CudaWeights::Dense) => vec![plain, tensor_cores],
        // bf16 runs quantized experts on tensor cores where f32 keeps their codes: the mode
        // that does so for every step. Without experts the program's choices are the same
        // in both modes, and the kernels' bf16 arithmetic is tested on its own (`q8.rs`,
        // `q4.rs`).
        (CudaDtype::Bf16, _) if experts => vec![Mode {
            from_codes: false,
            ..plain
        }],
        (CudaDtype::Bf16, _) => vec![],
        _ => vec![plain],
    }
}

/// The test spec named `name`.
fn spec(name: &str) -> Spec {
    specs()
        .into_iter()
        .find(|s| s.name == name)
        .expect("a spec of that name")
}

/// Runs `spec` in every numeric mode and weight format against the CPU model.
fn check(name: &str) {
    let formats = [CudaWeights::Dense, CudaWeights::Q8_0, CudaWeights::Q4_1];
    check_in(name, &MODES, &formats);
}

/// Runs `spec` against the CPU model in the modes of `dtypes` and `formats`.
fn check_in(name: &str, dtypes: &[CudaDtype], formats: &[CudaWeights]) {
    let spec = spec(name);
    for (&dtype, &format) in dtypes
        .iter()
        .flat_map(|d| formats.iter().map(move |f| (d, f)))
    {
        let modes = modes(dtype, format, spec.experts.is_some());
        if modes.is_empty() {
            continue;
        }
        let dir = temp_dir(&format!("{name}-{}-{}", dtype.name(), format.name()));
        write_model(&spec, dtype, format, &dir);
        for mode in modes {
            let (rows, largest) = compare(&dir, mode);
            let worst = rows.iter().copied().fold(0.0f32, f32::max);
            eprintln!("{name} {mode:?}: max |Δlogit| {worst:.2e} (|logit| ≤ {largest:.2})");
            // bf16 rounds the products' inputs and the KV cache to 8 significant bits;
            // f32 differs from the CPU only in the order of additions.
            let allowed = match dtype {
                CudaDtype::F32 => 2e-5,
                CudaDtype::Bf16 => 5e-2,
            } * largest.max(1.0);
            // With experts in bf16 a token whose router ranks two experts almost equally
            // may pick the other one from its rounded input (as any bf16 inference may):
            // that row differs more, and through its keys and values the rows after it in
            // its sequence. The f32 runs check the experts' arithmetic exactly; a bf16 fault
            // there would spoil most rows.
            let beyond = rows.iter().filter(|&&r| r > allowed).count();
            let may_differ = match (dtype, spec.experts) {
                (CudaDtype::Bf16, Some(_)) => rows.len() / 10,
                _ => 0,
            };
            assert!(
                beyond <= may_differ,
                "{name} {mode:?}: {beyond} rows of {} beyond |Δlogit| {allowed} (max {worst})",
                rows.len()
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn the_forward_program_matches_the_cpu_model_llama() {
    check("llama");
}

#[test]
fn the_forward_program_matches_the_cpu_model_qwen2_bias() {
    check("qwen2");
}

#[test]
fn the_forward_program_matches_the_cpu_model_qwen3_qk_norm() {
    check("qwen3");
}

#[test]
fn the_forward_program_matches_the_cpu_model_mistral_sliding_window() {
    check("mistral_swa");
}

#[test]
fn the_forward_program_matches_the_cpu_model_gemma3() {
    check("gemma3");
}

#[test]
fn the_forward_program_matches_the_cpu_model_qwen3_moe() {
    check("qwen3_moe");
}

#[test]
fn the_forward_program_matches_the_cpu_model_mixtral() {
    check("mixtral");
}

/// What `--batch-invariant` promises on the GPU, for the parts where a batch could leak into
/// a row — experts shared with other tokens, sliding windows, Gemma's norms: with the
/// fixed-order products a sequence's logits are bitwise the same alone as in a batch, over
/// chunked prefill, mixed steps and decode steps of both shapes.
#[test]
fn batch_invariant_products_keep_a_sequence_bitwise_alone_or_batched() {
    for name in ["qwen3_moe", "gemma3"] {
        let spec = spec(name);
        for dtype in MODES {
            let dir = temp_dir(&format!("{name}-{}-invariance", dtype.name()));
            write_model(&spec, dtype, CudaWeights::Dense, &dir);
            let host = load(&dir);
            let mode = Mode {
                dtype,
                weights: CudaWeights::Dense,
                from_codes: false,
                tensor_cores: false,
                folds: true,
            };
            let mut batched = Emulated::new(&host, mode, 160);
            let mut alone = Emulated::new(&host, mode, 160);
            for (i, step) in steps().iter().enumerate() {
                let both = batched.forward(&batch(step), i % 2 == 1);
                let solo: Vec<_> = step.iter().filter(|s| s.0 == 0).copied().collect();
                let own = alone.forward(&batch(&solo), i % 2 == 1);
                let start: usize = step.iter().take_while(|s| s.0 != 0).map(|s| s.1).sum();
                let rows = &both[start * VOCAB..][..own.len()];
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert!(
                    bits(rows) == bits(&own),
                    "{name} {dtype:?} step {i}: sequence 0 differs alone and in the batch"
                );
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Decode ≡ forward for the whole program, in every mode the runner can pick for dense
/// weights (bf16 with the attention on CUDA cores and on tensor cores, and f32): each row
/// of the test's steps — chunked prefill, decode steps eager and graph-shaped, mixed steps
/// beside the other sequence — is bitwise the row of the same position when each sequence
/// is scored alone, in chunks cut elsewhere. Gemma 3's windows of 8 positions leave most of
/// a late token's chunks of the cache outside its window.
#[test]
fn decode_steps_and_mixed_steps_equal_scoring_each_sequence_alone() {
    for (name, dtype) in ["llama", "gemma3"]
        .into_iter()
        .flat_map(|name| MODES.map(|dtype| (name, dtype)))
    {
        check_decode_equals_scoring(name, dtype, &modes(dtype, CudaWeights::Dense, false));
    }
}

/// Gemma 3 at its real head size of 256 in bf16, the attention on CUDA cores and on tensor
/// cores (`attention_tc_256`, two warps a row group): the forward program against the CPU
/// model, and decode ≡ scoring.
#[test]
fn wide_heads_match_the_cpu_model_and_decode_equals_scoring() {
    let dtype = CudaDtype::Bf16;
    check_in("gemma3_wide", &[dtype], &[CudaWeights::Dense]);
    let tensor_cores = modes(dtype, CudaWeights::Dense, false)
        .into_iter()
        .filter(|m| m.tensor_cores)
        .collect::<Vec<_>>();
    assert_eq!(tensor_cores.len(), 1);
    check_decode_equals_scoring("gemma3_wide", dtype, &tensor_cores);
}

/// The decode ≡ forward check of spec `name` in `modes` of `dtype`.
fn check_decode_equals_scoring(name: &str, dtype: CudaDtype, modes: &[Mode]) {
    let spec = spec(name);
    let dir = temp_dir(&format!("{name}-{}-decode-forward", dtype.name()));
    write_model(&spec, dtype, CudaWeights::Dense, &dir);
    let host = load(&dir);
    // With tensor cores, prefill folding partitions and prefill a block per partition.
    let per_partition = modes
        .iter()
        .filter(|m| m.tensor_cores)
        .map(|&m| Mode { folds: false, ..m });
    let modes: Vec<Mode> = modes.iter().copied().chain(per_partition).collect();
    for mode in modes {
        // A mode asking for tensor cores gets them (the check is not of the other kernel).
        let on_tensor_cores = tensor_core_attention(mode.tensor_cores, &host.config, dtype);
        assert_eq!(on_tensor_cores, mode.tensor_cores, "{name} {mode:?}");
        // (sequence, position) -> logits, from the test's steps.
        let mut stepped = Emulated::new(&host, mode, 160);
        let mut rows = std::collections::HashMap::new();
        for (i, step) in steps().iter().enumerate() {
            let got = stepped.forward(&batch(step), i % 2 == 1);
            let mut at = 0;
            for &(s, len, cached) in step {
                for p in cached..cached + len {
                    rows.insert((s, p), got[at * VOCAB..(at + 1) * VOCAB].to_vec());
                    at += 1;
                }
            }
        }
        // Each sequence alone, in chunks that start where no step of the test did.
        let mut scored = Emulated::new(&host, mode, 160);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for chunk in [(0, 150, 0), (0, 118, 150), (1, 25, 0)] {
            let got = scored.forward(&batch(&[chunk]), false);
            let (s, len, cached) = chunk;
            for p in cached..cached + len {
                let Some(want) = rows.get(&(s, p)) else {
                    continue;
                };
                let row = &got[(p - cached) * VOCAB..][..VOCAB];
                assert!(
                    bits(row) == bits(want),
                    "{name} {mode:?}: sequence {s} position {p} differs in a step and scored \
                     alone"
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
