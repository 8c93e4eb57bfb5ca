"""The gpu-dry scale: every run notebook's GPU path on the CPU, for a few steps (``make gpu-dry``, part of
``make test``). What is checked here, quickly: every run with a ``gpu`` entry has a ``gpu-dry`` one of the same
structure, on training presets that are their paper presets but for an explicit list of size keys; the
preflight accepts the scale without CUDA and refuses a preset that drifted; its outputs go to runs/_smoke/;
the stand-in data set; bf16 autocast on the CPU; torchrun with two gloo processes on a gpu-dry preset. The
pass itself (nine notebooks, a few minutes) is the Makefile's line, not a test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import torchrun_train
from manifold_muon_book import pipeline
from manifold_muon_lab.config import load_preset, read_yaml_file

ROOT = Path(__file__).resolve().parents[1]
TRAINING = ROOT / "runs" / "presets" / "training"
GPU_RUNS = [n for n in pipeline.run_templates(ROOT) if "gpu" in pipeline.run_scales(ROOT, n)]
DRY_PRESETS = sorted(p.stem for p in TRAINING.glob("gpu-dry-*.yml"))

# The list the pipeline documents (GPU_DRY_KEYS), written out again here: widening it is a visible change
# in two places, not a silent one. Sizes, step counts and cadences; the device and the local data.
SIZE_KEYS = {"n_layer", "n_head", "n_kv_head", "n_embd", "batch_size", "gradient_accumulation_steps", "block_size",
             "max_steps", "warmup", "eval_every", "eval_batches", "spectrum_every", "probe_every", "probe_rows",
             "checkpoint_every"}
RUN_HERE_KEYS = {"device", "data"}


def training_presets(name: str, scale: str) -> set[str]:
    return set(pipeline._walk_training_presets(pipeline.load_run_preset(name, scale, ROOT)))


def test_the_documented_list_of_keys_a_dry_preset_may_change_is_sizes_device_and_data():
    assert set(pipeline.GPU_DRY_KEYS) == SIZE_KEYS | RUN_HERE_KEYS
    assert pipeline.gpu_dry_problems(ROOT) == []


def test_there_are_runs_with_a_gpu_entry_and_a_dry_preset_per_paper_preset_they_train():
    assert {"five_assignments", "nf_sweep", "sphere_benchmark"} <= set(GPU_RUNS)
    papers = {t for n in GPU_RUNS for t in training_presets(n, "gpu")
              if read_yaml_file(TRAINING / f"{t}.yml").get("device", "auto") != "cpu"}
    assert papers == {"gpt2-124m", "qwen3-120m", "qwen3-330m"}
    assert DRY_PRESETS == sorted(f"gpu-dry-{p}" for p in papers)


def _shape(entry):
    """The structure of a run preset's entry: its keys, and the names of its studies, groups and axes."""
    if isinstance(entry, dict):
        return {k: _shape(v) if k in ("studies", "groups", "axes") else None for k, v in entry.items()}
    if isinstance(entry, list):
        return [(g.get("name"), _shape(g.get("axes"))) for g in entry]
    return None


@pytest.mark.parametrize("name", GPU_RUNS)
def test_every_gpu_entry_has_a_gpu_dry_entry_of_the_same_structure_on_the_dry_twins(name):
    gpu = pipeline.load_run_preset(name, "gpu", ROOT)
    dry = pipeline.load_run_preset(name, "gpu-dry", ROOT)
    assert _shape(dry) == _shape(gpu), f"runs/presets/{name}.yml: gpu-dry is not shaped as gpu"
    twins = {t if read_yaml_file(TRAINING / f"{t}.yml").get("device", "auto") == "cpu" else f"gpu-dry-{t}"
             for t in training_presets(name, "gpu")}
    assert training_presets(name, "gpu-dry") == twins
    for study in dry.get("studies", {}).values():  # one seed, few assignments
        assert len(study["seeds"]) == 1 and len(study["assignments"]) <= 3
    if "seeds" in dry:
        assert len(dry["seeds"]) == 1
    for group in [dry, *dry.get("groups", [])]:
        if "axes" in group:
            assert len(group["axes"]["seed"]) == 1


@pytest.mark.parametrize("dry", DRY_PRESETS)
def test_a_dry_preset_is_its_paper_preset_but_for_the_size_keys(dry):
    cfg, paper = read_yaml_file(TRAINING / f"{dry}.yml"), read_yaml_file(TRAINING / f"{dry[len('gpu-dry-'):]}.yml")
    differ = {k for k in set(cfg) | set(paper) if (k in cfg, cfg.get(k)) != (k in paper, paper.get(k))}
    assert differ <= SIZE_KEYS | RUN_HERE_KEYS, f"{dry}.yml drifted from its paper preset in {differ - SIZE_KEYS}"
    assert cfg["device"] == "cpu" and cfg["data"] == "kjv-books" and paper["data"] == "openwebtext"
    assert cfg["gradient_accumulation_steps"] >= 2 and cfg["max_steps"] <= 8
    assert cfg["dtype"] == paper["dtype"] == "bfloat16" and cfg["vocab_size"] == paper["vocab_size"] == 50304
    assert cfg.get("compile", False) == paper.get("compile", False)
    for key in ("spectrum_every", "probe_every", "checkpoint_every"):  # every measurement of the paper preset runs
        assert (cfg[key] > 0) == (paper[key] > 0), key


def test_the_pass_compiles_at_least_once_through_the_training_code():
    """gpt2-124m compiles; the gpu-dry pass does so in one run (five_assignments' post study), not in every one."""
    preset = pipeline.load_run_preset("five_assignments", "gpu-dry", ROOT)
    compiled = [(study, a) for study, spec in preset["studies"].items() for a in spec["assignments"]
                if load_preset(preset["training_preset"], TRAINING, **spec.get("overrides", {}), assignment=a).compile]
    assert compiled == [("post", "all_dgram")]


def _book_copy(tmp_path) -> Path:
    root = tmp_path / "book"
    shutil.copytree(ROOT / "runs" / "presets", root / "runs" / "presets")
    for md in (ROOT / "runs").glob("*.md"):
        shutil.copy(md, root / "runs")
    (root / "_config.yml").write_text("title: t\n")
    return root


def test_the_preflight_accepts_gpu_dry_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pipeline.preflight_scale(ROOT, "gpu-dry", None) == pipeline.run_templates(ROOT)
    with pytest.raises(ValueError, match="has none"):  # while the paper scale still wants a GPU
        pipeline.preflight_scale(ROOT, "gpu", None)


def test_the_preflight_refuses_a_dry_preset_that_drifted_or_a_run_without_gpu_dry(tmp_path):
    root = _book_copy(tmp_path)
    path = root / "runs" / "presets" / "training" / "gpu-dry-qwen3-120m.yml"
    path.write_text(path.read_text().replace("lr: 0.01\n", "lr: 0.02\n", 1).replace("dtype: bfloat16", "dtype: float32"))
    with pytest.raises(ValueError, match=r"gpu-dry-qwen3-120m.yml differs from qwen3-120m.yml in dtype, lr, "):
        pipeline.preflight_scale(root, "gpu-dry", None)
    shutil.copy(TRAINING / path.name, path)
    runs = root / "runs" / "presets" / "msign_tolerance.yml"
    runs.write_text(runs.read_text().split("\ngpu-dry:")[0] + "\n")
    problems = pipeline.gpu_dry_problems(root)
    assert problems == ["runs/presets/msign_tolerance.yml has a gpu entry but no gpu-dry entry"]


def test_a_bad_scale_is_one_sentence_and_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        pipeline.main(["runs", "--scale", "gpu-dryy"])
    err = capsys.readouterr().err.strip().splitlines()  # argparse's usage (wrapped), then the error in one line
    assert e.value.code == 2 and err[-1].startswith("python -m manifold_muon_book.pipeline: error: scale 'gpu-dryy' "
                                                    "is not defined for the run(s)")
    assert err[-1].count(". ") == 0 and "; choose another scale" in err[-1]


@pytest.mark.parametrize("scale", ["gpu-dry", "smoke"])
def test_a_scratch_scale_is_always_executed_into_runs_smoke(tmp_path, monkeypatch, scale):
    root = tmp_path / "book"
    (root / "runs" / "presets").mkdir(parents=True)
    (root / "_config.yml").write_text("title: t\n")
    (root / "runs" / "w.md").write_text("---\njupytext: {text_representation: {extension: .md, format_name: myst}}\n"
                                        "---\n\n```{code-cell} ipython3\nscale = 'cpu'\n```\n")
    (root / "runs" / "presets" / "w.yml").write_text(f"{scale}: {{n: 1}}\n")
    executed = []

    def execute(src, dst, cwd, params):
        executed.append(Path(params["out_dir"]))
        Path(params["out_dir"], "metrics.json").write_text(json.dumps({"inputs_sha": params["inputs_sha"]}))
        return 0.0

    monkeypatch.setattr(pipeline, "_execute", execute)
    for _ in range(2):  # up to date the second time, and executed all the same
        assert pipeline.do_runs(root, scale, force=False) == ["w"]
    assert executed == [root / "runs" / "_smoke" / "w" / scale] * 2
    assert not (root / "runs" / "w").exists()


def test_the_stand_in_data_set_is_a_few_documents_through_prepare_from_text_files(tmp_path):
    from manifold_muon_lab import data

    meta = data.prepare_kjv_books(tmp_path / "kb", progress=False)
    assert meta["name"] == "kjv-books" and meta["tokenizer"] == "bytes" and len(meta["source"]) == len(data.KJV_BOOKS)
    for split in ("train", "val"):  # an end-of-text token after every document, in both splits
        ids = data.np.fromfile(tmp_path / "kb" / f"{split}.bin", dtype=data.np.uint16)
        assert int((ids == 0).sum()) == len(data.KJV_BOOKS)
    stamp = (tmp_path / "kb" / "train.bin").stat().st_mtime_ns
    assert data.prepare_kjv_books(tmp_path / "kb", progress=False)["fingerprint"] == meta["fingerprint"]
    assert (tmp_path / "kb" / "train.bin").stat().st_mtime_ns == stamp  # prepared once
    batches = data.Batches("kjv-books", 32, data_dir=tmp_path / "kb", vocab_size=50304, prepare=False)
    X, _ = batches.batch("val", 2, torch.Generator().manual_seed(0))
    assert batches.vocab_size == 50304 and X.shape == (2, 32) and int(X.max()) < 256
    with pytest.raises(ValueError, match="no book 'Hezekiah'"):
        data.kjv_books(["Hezekiah"])


def test_bfloat16_autocasts_on_the_cpu(tmp_path):
    from manifold_muon_lab.train import Trainer

    cfg = load_preset("gpu-dry-qwen3-120m", TRAINING, out_dir=str(tmp_path / "run"), eval_every=100,
                      spectrum_every=0, probe_every=0, checkpoint_every=-1)
    trainer = Trainer(cfg).setup(resume=False, progress=False)
    try:
        assert isinstance(trainer.ctx, torch.autocast) and trainer.ctx.fast_dtype == torch.bfloat16
        with trainer.ctx:
            logits, _ = trainer.forward(*trainer.data.batch("val", 2, torch.Generator().manual_seed(0)))
        assert logits.dtype == torch.bfloat16 and logits.shape[-1] == 50304
        record = trainer.step()
        assert torch.isfinite(torch.tensor(record["loss"]))
    finally:
        trainer.close()


def test_two_gloo_processes_train_a_gpu_dry_preset(tmp_path):
    """torchrun --nproc_per_node 2 on gpu-dry-qwen3-120m: each rank takes one of the two micro-batches of its half
    of the batch (batch 4 = 2 ranks x 2 micro-steps x 1 sequence), bf16 autocast, the sharded optimizer step.
    Its first loss (before any update) is that of one process taking the same four sequences as four micro-steps."""
    sets = {"max_steps": 2, "eval_every": 100, "probe_every": 0, "spectrum_every": 0, "checkpoint_every": 0}
    args = ["--preset", "gpu-dry-qwen3-120m", "--no-progress", *[f"--set={k}={v}" for k, v in sets.items()]]
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    two = torchrun_train(args, tmp_path / "two", ROOT, timeout=240)
    assert two.returncode == 0, two.stderr[-3000:]
    one = subprocess.run([sys.executable, "-m", "manifold_muon_lab.train", *args, "--set=gradient_accumulation_steps=4",
                          "--out-dir", str(tmp_path / "one")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=240)
    assert one.returncode == 0, one.stderr[-3000:]
    prov = json.loads((tmp_path / "two" / "provenance.json").read_text())["parameters"]
    assert prov["world_size"] == 2 and prov["dtype"] == "bfloat16" and prov["data"] == "kjv-books"
    losses = {d: [json.loads(line)["loss"] for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()
                  if json.loads(line)["kind"] == "step"] for d in ("one", "two")}
    assert len(losses["two"]) == 2 and all(map(lambda x: x == x, losses["two"]))
    assert losses["two"][0] == pytest.approx(losses["one"][0], rel=1e-5)
