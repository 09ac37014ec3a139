//! `runtime serve` on the real fixture, driven by a client nobody here wrote (the `openai` PyPI
//! package, tests/serve_openai.py), and under load inside a cgroup memory limit.

use serde_json::json;
use tests::*;

#[test]
fn the_openai_client_drives_the_server() {
    let model = fixture_native_model();
    let s = Server::start(&[model.to_str().unwrap(), "--threads", "2"], None);
    let out = std::process::Command::new("python3")
        .arg(repo_root().join("tests/serve_openai.py"))
        .args([&format!("http://{}/v1", s.addr), "smollm2-135m-native"])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "tests/serve_openai.py failed:\n{}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        s.log()
    );
    eprintln!("openai client: {}", String::from_utf8_lossy(&out.stdout).trim());
}

/// The native fixture streamed at the server's minimum budget (its plan counts what requests
/// hold) + 8 MiB, inside a cgroup v1 memory limit of budget + 10%: 8 clients at once (streamed
/// and plain), every one answered, then 16 bodies of just under 1 MiB at once, each refused;
/// the peak RSS inside the budget.
#[test]
fn the_server_holds_its_budget_under_load() {
    let dir = scratch("serve-budget");
    let manifest = fixture_gguf_preparation(&dir, "native").join("manifest.toml");
    let budget = minimum_budget_of("serve", &manifest, &["--ctx", "1024", "--port", "0"]) + (8 << 20);
    let limit = budget + budget / 10;
    let cg = std::path::Path::new("/sys/fs/cgroup/memory");
    assert!(cg.join("memory.limit_in_bytes").exists(), "cgroup v1 memory controller not mounted at {}", cg.display());
    let group = cg.join(format!("np-test-{}-serve", std::process::id()));
    std::fs::create_dir(&group).unwrap();
    std::fs::write(group.join("memory.limit_in_bytes"), limit.to_string()).unwrap();
    let wrap = format!("echo $$ > {}/cgroup.procs && exec", group.display());
    let budget_arg = budget.to_string();
    let mut s =
        Server::start(&[manifest.to_str().unwrap(), "--mem-budget", &budget_arg, "--threads", "2"], Some(&wrap));
    let replies: Vec<(bool, HttpReply)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..8)
            .map(|i| {
                let s = &s;
                sc.spawn(move || {
                    let stream = i % 2 == 0;
                    let body = json!({"messages": [{"role": "user", "content": format!("Tell me a fact about the number {i}.")}], "max_tokens": 32, "temperature": 0, "stream": stream});
                    (stream, s.post("/v1/chat/completions", &body))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (stream, r) in &replies {
        assert_eq!(r.status, 200, "{}\n{}", r.body, s.log());
        if *stream {
            assert_eq!(r.sse_data().last().map(String::as_str), Some("[DONE]"));
        } else {
            assert!(r.json()["usage"]["completion_tokens"].as_u64().unwrap() > 0);
        }
    }
    // 16 bodies of just under 1 MiB at once: each refused before it is rendered or tokenized
    // whole (longer than the context can hold) or at the door (the bytes of bodies in flight)
    let big = "word ".repeat(((1 << 20) - 200) / 5);
    let statuses: Vec<u16> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..16)
            .map(|_| {
                let (s, big) = (&s, &big);
                sc.spawn(move || {
                    s.post(
                        "/v1/chat/completions",
                        &json!({"messages": [{"role": "user", "content": big}], "max_tokens": 8}),
                    )
                    .status
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(statuses.iter().all(|&c| c == 400 || c == 503), "{statuses:?}");
    assert!(statuses.contains(&400), "{statuses:?}");
    let m = s.get("/metrics").body;
    let value = |name: &str| -> f64 {
        m.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in /metrics:\n{m}"))
    };
    let peak = value("np_peak_resident_memory_bytes ") as u64;
    assert!(value("np_stream_bytes_read_total ") > 0.0 && value("np_stream_tokens_total ") >= 8.0 * 31.0, "{m}");
    assert!(s.alive(), "the server died under the limit: {}", s.log());
    drop(s);
    let failcnt = std::fs::read_to_string(group.join("memory.failcnt")).unwrap_or_default();
    let max_usage = std::fs::read_to_string(group.join("memory.max_usage_in_bytes")).unwrap_or_default();
    let _ = std::fs::remove_dir(&group);
    eprintln!("serve under load: budget {budget}, limit {limit}, peak RSS {peak} ({:.3} of the budget), cgroup max usage {}, failcnt {}", peak as f64 / budget as f64, max_usage.trim(), failcnt.trim());
    assert!(peak <= budget, "peak RSS {peak} over the {budget}-byte budget");
}

/// Clients that send their headers and then stall hold no queue slot: with 100 of them
/// connected, a normal request is answered at once, and each stalled one gets 408 after the body
/// timeout. With an API key: `/health` needs none, the Bearer scheme is case-insensitive, and
/// `GET /v1/models/{id}` (the openai client's `models.retrieve`) answers.
#[test]
fn stalled_clients_lock_nobody_out() {
    use std::io::{Read, Write};
    let model = fixture_native_model();
    let s = Server::start(&[model.to_str().unwrap(), "--threads", "2", "--api-key", "k3y", "--queue", "4"], None);
    let auth = [("Authorization", "bearer k3y"), ("Content-Type", "application/json")];
    assert_eq!(http(&s.addr, "GET", "/health", &[], b"").status, 200, "/health needs no key");
    assert_eq!(http(&s.addr, "GET", "/v1/models", &[], b"").status, 401);
    let name = model.file_name().unwrap().to_str().unwrap();
    let one = http(&s.addr, "GET", &format!("/v1/models/{name}"), &auth, b"");
    assert!(one.status == 200 && one.json()["id"] == name, "{}", one.body);
    assert_eq!(http(&s.addr, "GET", "/v1/models/gpt-4", &auth, b"").status, 404);
    let stalled: Vec<std::net::TcpStream> = (0..100)
        .map(|_| {
            let mut c = std::net::TcpStream::connect(&s.addr).unwrap();
            c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\nContent-Length: 1000\r\n\r\n{\"mess").unwrap();
            c
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let t0 = std::time::Instant::now();
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0});
    let r = http(&s.addr, "POST", "/v1/chat/completions", &auth, body.to_string().as_bytes());
    let waited = t0.elapsed();
    assert_eq!(r.status, 200, "{}\n{}", r.body, s.log());
    assert!(waited < std::time::Duration::from_secs(8), "a normal client waited {waited:?} behind stalled ones");
    let mut first = stalled.into_iter().next().unwrap();
    first.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let mut reply = String::new();
    let _ = first.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 408"), "a stalled client's reply: {reply}");
}

/// Same request, same reply at temperature 0, whatever was served before: the fixture streamed
/// with the scorer (every row a layer holds counts, so rows left by an earlier request would
/// change the next reply), a chat sent, then others, then the first again, streamed and plain.
#[test]
fn a_reply_depends_on_its_request_only() {
    let dir = scratch("serve-same-reply");
    let manifest = fixture_gguf_preparation(&dir, "native").join("manifest.toml");
    let budget = (minimum_budget_of("serve", &manifest, &["--ctx", "512", "--strategy", "scorer", "--port", "0"])
        + (4 << 20))
        .to_string();
    let m = manifest.to_str().unwrap();
    let s =
        Server::start(&[m, "--mem-budget", &budget, "--strategy", "scorer", "--ctx", "512", "--threads", "2"], None);
    let chat = |content: &str, stream: bool| {
        let body = json!({"messages": [{"role": "user", "content": content}], "max_tokens": 24, "temperature": 0, "stream": stream});
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}\n{}", r.body, s.log());
        if !stream {
            return r.json()["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        }
        r.sse_data()
            .iter()
            .filter(|d| d.as_str() != "[DONE]")
            .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
            .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(String::from))
            .collect::<String>()
    };
    let question = "Name three things people keep in a kitchen.";
    let first = chat(question, false);
    assert!(!first.is_empty());
    chat("Write a short poem about the sea and its ships, with rhymes.", false);
    chat("What is the capital of France? Answer in one word.", true);
    assert_eq!(chat(question, false), first, "the same chat after others");
    assert_eq!(chat(question, true), first, "the same chat, streamed");
}
