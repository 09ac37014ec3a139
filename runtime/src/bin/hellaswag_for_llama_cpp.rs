//! `hellaswag-for-llama-cpp <arrow file or dir> <N> <out.txt>`: the first N HellaSwag items,
//! cleaned exactly as `runtime eval` scores them, in `llama-perplexity --hellaswag`'s six-line
//! format (context, gold index, four endings), so both tools score the same texts
//! (`make bench-frontier`). llama.cpp shuffles the tasks it reads with a fixed seed; with N of
//! them in the file it scores all N.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::PathBuf;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [data, n, out] = args.as_slice() else {
        bail!("usage: hellaswag-for-llama-cpp <arrow file or dir> <N> <out.txt>");
    };
    let n: usize =
        n.parse().ok().filter(|&n| n > 0).with_context(|| format!("'{n}': expected a positive item count"))?;
    let file = runtime::eval::hellaswag_file(&PathBuf::from(data))?;
    let items = runtime::eval::load_hellaswag(&file, Some(n))?;
    if items.len() < n {
        bail!("{}: {} items, {n} asked", file.display(), items.len());
    }
    let mut text = String::new();
    for (i, it) in items.iter().enumerate() {
        if it.choices.len() != 4 {
            bail!("{}: item {i} has {} endings; llama.cpp's format takes 4", file.display(), it.choices.len());
        }
        let lines = std::iter::once(it.context.clone())
            .chain(std::iter::once(it.gold.to_string()))
            .chain(it.choices.iter().cloned());
        for l in lines {
            if l.contains('\n') {
                bail!(
                    "{}: item {i} has a line break inside a field; llama.cpp's format is one field per line",
                    file.display()
                );
            }
            text.push_str(&l);
            text.push('\n');
        }
    }
    let mut f = std::fs::File::create(out).with_context(|| format!("{out}: cannot create"))?;
    f.write_all(text.as_bytes()).with_context(|| format!("{out}: cannot write"))?;
    eprintln!("{out}: {} items from {}", items.len(), file.display());
    Ok(())
}
