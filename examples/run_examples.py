"""Every example spec of this folder, trained as shipped: their tiny data made first, in order.

    python examples/run_examples.py                  # every example, each job waited for
    python examples/run_examples.py causal_lm_hf     # some of them (finetune_warm_start runs
                                                     # imagefolder_timm first: it starts from it)
    python examples/run_examples.py --data-only      # the data alone; then, from this folder:
    export ACCUM_EXAMPLES=$PWD/.accum/data/examples  #   what the specs' ${ACCUM_EXAMPLES} is
    accum submit examples/causal_lm_hf.yaml --watch

The data goes to --data (default ./.accum/data/examples: inside the data root of an `accum up`
started here; elsewhere give a folder inside one of the service's ACCUM_DATA_ROOTS, on a
filesystem its workers read). The specs name it as ${ACCUM_EXAMPLES}, and the warm start names
the job it starts from as ${ACCUM_WARM_START_JOB}: `accum submit` reads both from the
environment, which this script sets. The service is the one the CLI finds (accum login, accum
up, ACCUM_URL/ACCUM_TOKEN). --quick trains each job 2 optimizer steps (tests/integration/
test_examples.py). Making the data needs Pillow, tokenizers and transformers (the `models`
extra); the LoRA example's worker needs the `finetune` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

from accum import AccumClient, read_spec

HERE = Path(__file__).resolve().parent
# In the order they run: the warm start starts from imagefolder_timm's job.
EXAMPLES = ("digits_mlp_tiny.json", "digits_small_cnn.yaml", "imagefolder_timm.yaml",
            "finetune_warm_start.yaml", "causal_lm_hf.yaml", "sequence_classification_hf.yaml",
            "lora_finetune_hf.yaml")
NEEDS = {"finetune_warm_start": "imagefolder_timm"}
WORDS = ("the cat sat on the mat", "a dog ran after the ball", "birds sing in the morning",
         "rain falls on the roof", "we read a book by the fire", "fish swim in the cold river",
         "she plays the piano", "the train leaves at noon", "green leaves turn red",
         "snow covers the quiet hills")
GOOD = ("great", "lovely", "fine", "superb", "good")
BAD = ("awful", "poor", "dull", "broken", "bad")


def images(root: Path, classes: int, per_class: int, seed: int) -> None:
    """`root/<class>/<i>.png`: each class a dominant colour with noise (a few steps tell them apart)."""
    from PIL import Image

    rng = random.Random(seed)
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = []
            for _ in range(32 * 32):
                rgb = [rng.randrange(0, 90) for _ in range(3)]
                rgb[c % 3] = rng.randrange(150, 256)
                pixels.append(tuple(rgb))
            image = Image.new("RGB", (32, 32))
            image.putdata(pixels)
            image.save(folder / f"{i}.png")


def jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def corpus(root: Path) -> None:
    """Text for the language models (`body`), and a tokenizer.json trained on it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(700)]
    jsonl(root / "train.jsonl", [{"body": line} for line in lines[:600]])
    jsonl(root / "val.jsonl", [{"body": line} for line in lines[600:]])
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<pad>"]))
    tokenizer.save(str(root / "tokenizer.json"))


def reviews(root: Path) -> None:
    """Labelled text for the sequence classifier: `body`, and `y` good or bad."""
    rng = random.Random(1)
    rows = []
    for _ in range(500):
        label = rng.choice(("good", "bad"))
        words = [rng.choice(GOOD if label == "good" else BAD) for _ in range(3)]
        rows.append({"body": f"{rng.choice(WORDS)}, {' and '.join(words)}", "y": label})
    jsonl(root / "train.jsonl", rows[:400])
    jsonl(root / "val.jsonl", rows[400:])


def small_gpt2(folder: Path) -> None:
    """A 2-layer GPT-2 saved with save_pretrained: the pretrained model the LoRA example tunes."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=256, n_layer=2, n_head=2, n_embd=64, n_positions=128)
    GPT2LMHeadModel(config).save_pretrained(folder)


DATA = {
    "imagefolder_timm": lambda d: images(d / "pets", classes=3, per_class=40, seed=0),
    "finetune_warm_start": lambda d: images(d / "birds", classes=2, per_class=40, seed=1),
    "causal_lm_hf": lambda d: corpus(d / "corpus"),
    "sequence_classification_hf": lambda d: reviews(d / "reviews"),
    "lora_finetune_hf": lambda d: (corpus(d / "corpus"), small_gpt2(d / "models" / "my-gpt2")),
}


def quick(spec: dict[str, Any]) -> dict[str, Any]:
    """The same job, 2 optimizer steps long (and evaluated at its end)."""
    spec = {k: v for k, v in spec.items() if k not in ("epochs", "eval_every", "scheduler")}
    return {**spec, "max_steps": 2}


def run(client: AccumClient, name: str, is_quick: bool, queue: str | None) -> str:
    """Submit the example `name` (its spec as `accum submit` reads it) and wait for its end."""
    path = next(HERE / f for f in EXAMPLES if f.rsplit(".", 1)[0] == name)
    spec = read_spec(path)
    spec = {**spec, "queue": queue} if queue else spec
    job = client.submit(quick(spec) if is_quick else spec)
    print(f"{name}: job {job['id']} submitted", flush=True)
    done = client.wait(str(job["id"]), timeout=3600)
    if done["status"] != "succeeded":
        raise SystemExit(f"{name}: job {job['id']} {done['status']}: {(done.get('error') or {}).get('message')}")
    print(f"{name}: job {job['id']} succeeded", flush=True)
    return str(job["id"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    names = [f.rsplit(".", 1)[0] for f in EXAMPLES]
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"examples to run (default all): {', '.join(names)}")
    parser.add_argument("--data", type=Path, default=Path(".accum/data/examples"),
                        help="where their data goes: inside one of the service's data roots")
    parser.add_argument("--data-only", action="store_true", help="make the data, submit nothing")
    parser.add_argument("--quick", action="store_true", help="2 optimizer steps a job")
    parser.add_argument("--queue", help="the worker queue to submit to (default: the specs')")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(names))
    if unknown:
        parser.error(f"no example {', '.join(unknown)}; choose from {', '.join(names)}")
    wanted = [n for n in names if n in args.names or not args.names
              or any(NEEDS.get(w) == n for w in args.names)]
    data = args.data.resolve()
    os.environ["ACCUM_EXAMPLES"] = str(data)
    for name in wanted:
        if name in DATA:
            DATA[name](data)
    print(f"data in {data} (ACCUM_EXAMPLES)", flush=True)
    if args.data_only:
        return 0
    with AccumClient() as client:
        for name in wanted:
            job_id = run(client, name, args.quick, args.queue)
            if name == NEEDS["finetune_warm_start"]:
                os.environ["ACCUM_WARM_START_JOB"] = job_id
    return 0


if __name__ == "__main__":
    sys.exit(main())
