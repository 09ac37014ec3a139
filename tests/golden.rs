//! Golden tests on the real fixture model (SmolLM2-135M-Instruct, imported by `make setup`).
//! Every expected value here was produced by llama.cpp (llama-completion, llama-perplexity,
//! llama-tokenize on the F16 GGUF of the same weights; see scripts/reference.py).

use runtime::generate::{generate, GenerateOptions};
use runtime::sampler::Sampler;
use runtime::Runner;
use tests::*;

fn open() -> (runtime::Model, runtime::Tokenizer) {
    runtime::open_model(&fixture_model(), runtime::DecodeLayout::Mapped).expect("open fixture model")
}

fn greedy(model: &runtime::Model, tok: &runtime::Tokenizer, prompt: &str, n: usize) -> String {
    let opts = GenerateOptions { max_new_tokens: n, ctx: 128, stop_at_eos: false, add_special: true };
    generate(&mut Runner::dense(model), tok, prompt, &opts, &mut Sampler::new(0.0, 1.0, 0), |_| {}).unwrap().text
}

#[test]
fn greedy_continuations_equal_llama_cpp() {
    let (model, tok) = open();
    // llama-completion -n 32 --temp 0 --ignore-eos on baseline/smollm2-135m-f16.gguf
    let cases = [
        ("The capital of France is", " Paris.\n\nThe answer is: 2018-01-22 12:12:53.\n\nThe"),
        (
            "Once upon a time, in a small village by the sea,",
            " there was a wise old wizard named Thorold. He lived in a tower surrounded by a beautiful garden filled with all sorts of magical creatures.\n\nTh",
        ),
        (
            "To be, or not to be, that is the question:",
            "\n\nThe answer to the question \"Is it possible to create a machine that can create a machine that can create a machine that can create a machine that can",
        ),
    ];
    for (prompt, want) in cases {
        assert_eq!(greedy(&model, &tok, prompt, 32), want, "prompt {prompt:?}");
    }
}

#[test]
fn perplexity_matches_llama_cpp() {
    let (model, tok) = open();
    // llama-perplexity -c 512 --chunks 2 on data/text/hamlet.txt: [1]19.5129,[2]22.6374
    let r = runtime::perplexity::perplexity(
        &mut Runner::dense(&model),
        &tok,
        &data_text("hamlet.txt"),
        512,
        Some(2),
        |_, _, _| {},
    )
    .unwrap();
    assert_eq!(r.tokens, 52755, "token count of hamlet.txt (llama-tokenize: 52755)");
    assert_eq!(r.tokens_scored, 2 * 255);
    let rel = (r.perplexity / 22.6374 - 1.0).abs();
    assert!(rel < 0.002, "perplexity {} vs llama.cpp 22.6374 ({:.4}% off)", r.perplexity, rel * 100.0);
}

#[test]
fn tokenizer_ids_equal_llama_cpp_and_round_trip() {
    let (_, tok) = open();
    assert_eq!(tok.encode("The capital of France is", true).unwrap(), vec![504, 3575, 282, 4649, 314]);
    let tricky = "Héllo wörld! 12345 tokens,   spaces\tand\nnewlines — ünïcödé 日本語 🙂";
    let ids = tok.encode(tricky, true).unwrap();
    assert_eq!(
        ids,
        vec![
            56, 2756, 31394, 267, 29989, 400, 17, 216, 33, 34, 35, 36, 37, 17837, 28, 256, 5600, 197, 397, 198, 2241,
            5110, 1841, 5549, 137, 94, 25972, 83, 7466, 84, 2756, 17097, 241, 115, 40993, 179, 120, 248, 47526
        ]
    );
    assert!(!tok.adds_bos, "SmolLM2's GGUF says add_bos_token = false");
    for text in
        [tricky, "", " leading space", "trailing space ", "a\n\n\nb", "emoji 🙂🙃 and CJK 中文", "<|im_start|>user"]
    {
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text, "round trip of {text:?}");
    }
}

#[test]
fn batched_prefill_equals_token_by_token_decode() {
    // The matrix-matrix path (prefill) and the matrix-vector path (decode) must agree (3.5e-3
    // here: the f16 KV cache rounds their summation-order differences).
    let (model, tok) = open();
    let ids = tok.encode("The quick brown fox jumps over the lazy dog because", true).unwrap();
    let mut c1 = model.new_cache(64).unwrap();
    let batched = model.forward(&ids, &mut c1, ids.len() - 1).unwrap();
    let mut c2 = model.new_cache(64).unwrap();
    let mut last = Vec::new();
    for &t in &ids {
        last = model.forward(&[t], &mut c2, 0).unwrap();
    }
    let max_diff = max_abs_diff(&batched, &last);
    assert!(max_diff < BATCHED_VS_TOKEN_BY_TOKEN, "prefill vs decode logits differ by {max_diff}");
}

#[test]
fn sampling_is_seeded() {
    let (model, tok) = open();
    let opts = GenerateOptions { max_new_tokens: 12, ctx: 64, stop_at_eos: false, add_special: true };
    let run = |seed| {
        generate(&mut Runner::dense(&model), &tok, "Tell me a story", &opts, &mut Sampler::new(0.9, 0.95, seed), |_| {})
            .unwrap()
            .token_ids
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8), "different seeds should (almost surely) differ over 12 tokens");
}

#[test]
fn mlp_observer_sees_every_layer() {
    struct Recorder {
        layers: Vec<usize>,
        shapes_ok: bool,
    }
    impl runtime::model::MlpHook for Recorder {
        fn observe(&mut self, layer: usize, gate_silu: &[f32], up: &[f32]) {
            self.layers.push(layer);
            // 3 tokens x 1536 neurons; silu(g) >= -0.2785 for every g
            self.shapes_ok &=
                gate_silu.len() == 3 * 1536 && up.len() == 3 * 1536 && gate_silu.iter().all(|&v| v >= -0.2785);
        }
    }
    let (model, _) = open();
    let mut rec = Recorder { layers: vec![], shapes_ok: true };
    let mut cache = model.new_cache(8).unwrap();
    let observed = model.forward_observed(&[504, 3575, 282], &mut cache, 2, Some(&mut rec)).unwrap();
    assert_eq!(rec.layers, (0..30).collect::<Vec<_>>());
    assert!(rec.shapes_ok);
    let mut cache = model.new_cache(8).unwrap();
    assert_eq!(
        observed,
        model.forward(&[504, 3575, 282], &mut cache, 2).unwrap(),
        "observing must not change the result"
    );
}

#[test]
fn oracle_sparsity_keeps_what_reaches_the_threshold() {
    use formats::thresholds::{MaskKind, Thresholds};
    let (model, _) = open();
    let ids = [504u32, 3575, 282, 4649, 314];
    let dense = model.forward(&ids, &mut model.new_cache(8).unwrap(), 0).unwrap();
    let th = |t: f32| Thresholds {
        mask_kind: MaskKind::Product,
        alpha: 0.0,
        tokens_sampled: 0,
        product: vec![t; 30],
        gate: vec![],
        up: vec![],
    };
    // threshold 0 keeps every neuron: identical to dense
    let mut keep_all = runtime::oracle::OracleSparsity::new(th(0.0), 0);
    let out = model.forward_observed(&ids, &mut model.new_cache(8).unwrap(), 0, Some(&mut keep_all)).unwrap();
    assert_eq!(out, dense);
    assert_eq!(keep_all.density(), 1.0);
    // an infinite threshold from layer 28 on drops those MLPs entirely: density 0, other logits
    let mut drop_last = runtime::oracle::OracleSparsity::new(th(f32::INFINITY), 28);
    let out = model.forward_observed(&ids, &mut model.new_cache(8).unwrap(), 0, Some(&mut drop_last)).unwrap();
    assert_eq!(drop_last.density(), 0.0);
    assert_eq!(drop_last.total, 2 * 5 * 1536);
    assert_ne!(out, dense);
}
