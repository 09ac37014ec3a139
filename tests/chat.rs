//! Chat templates and sessions on the real fixture: the GGUF's template kept by `prep import`,
//! rendered exactly as transformers' apply_chat_template renders it (strings pinned by
//! scripts/chat_template_expected.py, for the fixture's and Qwen2.5's templates); a session's
//! reused KV prefix gives the logits a fresh prefill gives; `runtime chat` keeps earlier turns.

use runtime::chat::{ChatMessage, ChatTemplate};
use runtime::generate::{Continuation, Session};
use runtime::sampler::Sampler;
use std::path::Path;
use tests::*;

fn pinned(name: &str) -> serde_json::Value {
    let p = repo_root().join("tests/chat-templates").join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

#[test]
fn templates_render_as_transformers_does() {
    for name in ["smollm2-135m", "qwen2.5-coder-1.5b"] {
        let v = pinned(name);
        let t = ChatTemplate::from_source(
            Path::new(name),
            v["template"].as_str().unwrap().into(),
            v["bos_token"].as_str().unwrap(),
            v["eos_token"].as_str().unwrap(),
        )
        .unwrap();
        let cases = v["cases"].as_array().unwrap();
        assert!(cases.len() >= 5);
        for (i, c) in cases.iter().enumerate() {
            let messages: Vec<ChatMessage> = serde_json::from_value(c["messages"].clone()).unwrap();
            let got = t.render(&messages, c["add_generation_prompt"].as_bool().unwrap()).unwrap();
            assert_eq!(got, c["expected"].as_str().unwrap(), "{name} case {i}");
        }
    }
}

#[test]
fn import_keeps_the_gguf_template() {
    let want = pinned("smollm2-135m")["template"].as_str().unwrap().to_string();
    for dir in [fixture_model(), fixture_native_model()] {
        assert_eq!(std::fs::read_to_string(dir.join("chat_template.jinja")).unwrap(), want, "{}", dir.display());
    }
    let (model, tok) = runtime::open_model(&fixture_native_model(), runtime::DecodeLayout::Mapped).unwrap();
    let opened = runtime::Opened { model, tokenizer: tok, manifest: None, engine: None, notes: vec![] };
    let t = runtime::chat_template(&fixture_native_model(), &opened).unwrap().expect("the fixture has a template");
    assert_eq!((t.bos_token.as_str(), t.eos_token.as_str()), ("<|im_start|>", "<|im_end|>"));
    // the rendered special tokens are parsed as such: <|im_start|> is id 1, <|im_end|> id 2
    let ids = opened.tokenizer.encode(&t.render(&[ChatMessage::new("user", "Hi")], true).unwrap(), false).unwrap();
    assert_eq!((ids[0], ids.iter().filter(|&&i| i == 2).count()), (1, 2), "{ids:?}");
}

/// A session that reuses the cached prefix (a conversation's earlier turns) computes the same
/// logits as a fresh prefill of the whole sequence, on the f16 and the Q4_1 fixture.
#[test]
fn a_reused_prefix_gives_the_logits_of_a_fresh_prefill() {
    for dir in [fixture_model(), fixture_native_model()] {
        let (model, tok) = runtime::open_model(&dir, runtime::DecodeLayout::Mapped).unwrap();
        let a = tok.encode("The quick brown fox jumps over the lazy dog because", true).unwrap();
        let b = tok.encode("The quick brown fox jumps over the lazy dog because it was", true).unwrap();
        assert!(b.starts_with(&a) && b.len() > a.len() + 1);
        let greedy = |s: &mut Session, ids: &[u32]| {
            let c = Continuation { prompt_ids: ids, max_new_tokens: 12, end_ids: &[], mask: &[], stop: &[] };
            s.generate(&mut runtime::Runner::dense(&model), &tok, &c, &mut Sampler::new(0.0, 1.0, 0), |_| {
                std::ops::ControlFlow::Continue(())
            })
            .unwrap()
        };
        let mut warm = Session::new(&model, 128).unwrap();
        greedy(&mut warm, &a);
        let reused = greedy(&mut warm, &b);
        // (the cache also holds the tokens generated after a, which b may begin with)
        assert!(reused.reused_prompt_tokens >= a.len() && reused.reused_prompt_tokens < b.len(), "{}", dir.display());
        let fresh = greedy(&mut Session::new(&model, 128).unwrap(), &b);
        assert_eq!(fresh.reused_prompt_tokens, 0);
        assert_eq!(reused.token_ids, fresh.token_ids, "{}", dir.display());
        // the margins are the logits' top-2 gaps: equal to rounding
        let worst = reused
            .top2_logit_margins
            .iter()
            .zip(&fresh.top2_logit_margins)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        eprintln!("{}: largest margin difference {worst:e}", dir.display());
        for (x, y) in reused.top2_logit_margins.iter().zip(&fresh.top2_logit_margins) {
            assert!((x - y).abs() <= 1e-3 * x.abs().max(1.0), "{}: margins {x} vs {y}", dir.display());
        }
    }
}

/// `runtime chat`: each turn reuses the cache of the ones before; /reset forgets them; EOF ends.
#[test]
fn chat_keeps_earlier_turns_in_the_cache() {
    use std::io::Write;
    let bin = repo_root().join("target/release/runtime");
    let mut child = std::process::Command::new(&bin)
        .args([
            "chat",
            fixture_native_model().to_str().unwrap(),
            "--temp",
            "0",
            "-n",
            "12",
            "--threads",
            "2",
            "--system",
            "You are terse.",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is the capital of France?\nAnd of Italy?\n/reset\nWhat is the capital of France?\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // "[prompt P tokens, R from earlier turns; ..."
    let turns: Vec<(usize, usize)> = err
        .lines()
        .filter_map(|l| l.strip_prefix("[prompt "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[0].parse().unwrap(), w[2].parse().unwrap())
        })
        .collect();
    assert_eq!(turns.len(), 3, "{err}");
    assert_eq!(turns[0].1, 0);
    assert!(turns[1].1 > turns[0].0, "the second turn recomputes its first: {turns:?}");
    assert_eq!(turns[2], (turns[0].0, 0), "after /reset: {turns:?}");
    let replies: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().filter(|l| !l.is_empty()).collect();
    assert!(replies.len() >= 3, "{replies:?}");
    assert!(err.contains("(conversation reset)"));
}

/// `runtime chat`: Ctrl-C during a reply stops that reply and the conversation goes on (the next
/// turn reuses it); /help and unknown /commands never reach the model.
#[test]
fn ctrl_c_stops_a_reply_not_the_chat() {
    use std::io::{Read, Write};
    let bin = repo_root().join("target/release/runtime");
    let mut child = std::process::Command::new(&bin)
        .args(["chat", fixture_native_model().to_str().unwrap(), "--temp", "0", "-n", "400", "--threads", "2"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"/help\n/frobnicate\nWrite a long story about a lighthouse keeper.\n").unwrap();
    stdin.flush().unwrap();
    // wait for the reply to start, then interrupt it
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    let n = stdout.read(&mut first).unwrap();
    assert!(n > 0, "no reply began");
    let status = std::process::Command::new("kill").arg("-INT").arg(child.id().to_string()).status().unwrap();
    assert!(status.success());
    std::thread::sleep(std::time::Duration::from_millis(300));
    stdin.write_all(b"Thanks.\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the chat ended with {:?}: {err}", out.status);
    assert!(err.contains("unknown command /frobnicate") && err.contains("/reset starts over"), "{err}");
    let turns: Vec<&str> = err.lines().filter(|l| l.starts_with("[prompt ")).collect();
    assert_eq!(turns.len(), 2, "two turns reached the model: {err}");
    assert!(turns[0].contains("stopped by Ctrl-C"), "{err}");
    // the second turn reuses the first turn's cache, the stopped reply included
    let reused: usize = turns[1].split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(reused > 0, "{err}");
}

/// A reply cut by its token limit inside a character's bytes ends before that character: the
/// fixture answers in katakana (3 bytes a character, spread over byte tokens), and no length
/// gives a reply, or a streamed piece, with U+FFFD in it.
#[test]
fn a_cut_reply_never_ends_in_a_broken_character() {
    use runtime::generate::{generate, GenerateOptions};
    let (model, tok) = runtime::open_model(&fixture_native_model(), runtime::DecodeLayout::Mapped).unwrap();
    let mut cut_inside = 0;
    for n in 1..=6 {
        let mut runner = runtime::Runner::dense(&model);
        let opts = GenerateOptions { max_new_tokens: n, ctx: 64, stop_at_eos: true, add_special: true };
        let mut streamed = String::new();
        let r = generate(
            &mut runner,
            &tok,
            "Write the Japanese word for cat:",
            &opts,
            &mut Sampler::new(0.0, 1.0, 0),
            |p| streamed.push_str(p),
        )
        .unwrap();
        let raw = tok.decode(&r.token_ids).unwrap();
        cut_inside += raw.ends_with('\u{FFFD}') as usize;
        assert!(!r.text.contains('\u{FFFD}') && !streamed.contains('\u{FFFD}'), "{n} tokens: {:?}", r.text);
        assert!(raw.starts_with(&r.text) && streamed == r.text, "{n} tokens: {raw:?} {:?} {streamed:?}", r.text);
    }
    assert!(cut_inside > 0, "no length cut a character: the test would exercise nothing");
}
