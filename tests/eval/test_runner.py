"""`eval run` end to end: a tiny random Qwen3 (fast), a scripted engine (scoring path), SmolLM2 (slow)."""
from __future__ import annotations

import json
import os

import pytest

from eval.cli import main
from eval.data import load_rows
from eval.engines import Generation, GenerationParams, get_engine
from eval.engines.base import Engine, render_prompt
from eval.engines.local import LocalEngine
from eval.runner import RunConfig, parse_samples, run_eval
from eval.task import get_task
from rollout.models import tiny_random_qwen3

ALL = ("aime24", "aime25", "math500", "amc23", "gsm8k", "ifeval")
FAST = GenerationParams(temperature=0.0, max_new_tokens=4, batch_size=8)


@pytest.fixture(scope="module")
def tiny(qwen3_tokenizer_dir):
    return tiny_random_qwen3(qwen3_tokenizer_dir)


def _read_samples(out_dir):
    with open(os.path.join(out_dir, "samples.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_run_tiny_qwen3_all_tasks(tiny, tmp_path):
    model, tok = tiny
    cfg = RunConfig(model="tiny-qwen3", tasks=ALL, samples={"aime24": 2, "ifeval": 2}, limit=2, params=FAST,
                    output_dir=str(tmp_path / "run"))
    res = run_eval(cfg, engine=LocalEngine(model, tok), show_progress=False)
    ks = {"aime24": 2, "aime25": 6, "math500": 4, "amc23": 6, "gsm8k": 4, "ifeval": 2}  # report defaults elsewhere
    assert {t: s["k"] for t, s in res["tasks"].items()} == ks
    assert all(s["n"] == 2 for s in res["tasks"].values())
    assert res["average"]["mean"] == pytest.approx(sum(s["mean"] for s in res["tasks"].values()) / 6)
    assert res["tasks"]["ifeval"]["primary_metric"] == "prompt_level_strict"
    records = _read_samples(tmp_path / "run")
    assert len(records) == 2 * sum(ks.values())
    assert set(records[0]) >= {"task", "index", "sample", "prompt", "response", "extracted", "gold", "correct"}
    assert {(r["task"], r["index"], r["sample"]) for r in records if r["task"] == "aime24"} == \
        {("aime24", i, s) for i in range(2) for s in range(2)}
    assert all(0 < r["num_tokens"] <= 4 for r in records)
    proto = res["protocol"]
    assert (proto["temperature"], proto["top_p"], proto["max_new_tokens"], proto["seed"]) == (0.0, 0.95, 4, 0)
    assert proto["engine"]["engine"] == "local" and proto["precision"] == "none"
    assert proto["samples"]["aime25"]["default_from"].startswith("report §6.2.2")
    assert "nltk_punkt" in proto["ifeval_scoring"]
    assert res["generation"]["tokens"] == sum(r["num_tokens"] for r in records)
    on_disk = json.loads((tmp_path / "run" / "results.json").read_text())
    assert on_disk["tasks"] == res["tasks"]
    md = (tmp_path / "run" / "results.md").read_text()
    assert "| AIME24 | accuracy | 2 | 2 |" in md and "**Average** (equal weight)" in md
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["results.json", "results.md", "samples.jsonl"]


class ScriptedEngine(Engine):
    """Answers each prompt with a fixed response chosen by the test (to check scoring and bookkeeping)."""

    name = "scripted"

    def __init__(self, tokenizer, answer_for):
        self.tokenizer = tokenizer
        self.answer_for = answer_for

    def generate(self, prompt_ids, k, params, progress=None):
        out = []
        for ids in prompt_ids:
            text = self.tokenizer.decode(ids)
            out.append([Generation(self.answer_for(text, s), 3, "stop") for s in range(k)])
        return out

    def describe(self):
        return {"engine": "scripted"}


def test_run_scores_and_aggregates_correctly(tiny, tmp_path):
    _, tok = tiny
    task = get_task("math500")
    exs = task.examples(load_rows(task))[:4]
    golds = {e.question: e.gold for e in exs}

    def answer(prompt_text, sample):
        gold = next(g for q, g in golds.items() if q in prompt_text)
        return f"\\boxed{{{gold}}}" if sample == 0 else "no idea"  # run 0 all right, runs 1-3 all wrong

    cfg = RunConfig(model="scripted", tasks=("math500",), limit=4, params=FAST, output_dir=str(tmp_path / "r"))
    res = run_eval(cfg, engine=ScriptedEngine(tok, answer), show_progress=False)
    s = res["tasks"]["math500"]
    assert s["metrics"]["accuracy"]["per_sample"] == [1.0, 0.0, 0.0, 0.0]
    assert s["mean"] == pytest.approx(0.25) and s["std"] == pytest.approx(0.5)  # sample std of (1,0,0,0)
    wrong = [r for r in _read_samples(tmp_path / "r") if r["sample"] > 0]
    assert all(r["correct"] == 0.0 and r["extracted"] is None for r in wrong)


def test_precision_recipe_is_applied_and_recorded(qwen3_tokenizer_dir, tmp_path):
    model, tok = tiny_random_qwen3(qwen3_tokenizer_dir)
    engine = LocalEngine(model, tok, precision="nvfp4_per_token")
    assert engine.quantization["recipe"] == "nvfp4_per_token" and engine.quantization["num_swapped"] > 0
    cfg = RunConfig(model="tiny", tasks=("gsm8k",), samples={"gsm8k": 1}, limit=2, params=FAST,
                    precision="nvfp4_per_token", output_dir=str(tmp_path / "q"))
    res = run_eval(cfg, engine=engine, show_progress=False)
    assert res["protocol"]["precision"] == "nvfp4_per_token"
    assert res["protocol"]["engine"]["quantization"]["recipe"] == "nvfp4_per_token"
    with pytest.raises(ValueError, match=r"unknown precision recipe 'nvfp4_pertoken'.*did you mean 'nvfp4_per_token'"):
        LocalEngine(*tiny_random_qwen3(qwen3_tokenizer_dir), precision="nvfp4_pertoken")


def test_exclude_keeps_blocks_in_high_precision(qwen3_tokenizer_dir):
    from eval.cli import _parse_exclude

    assert _parse_exclude("lm_head, 0,-1,") == ("lm_head", 0, -1)
    full = LocalEngine(*tiny_random_qwen3(qwen3_tokenizer_dir), precision="nvfp4_per_token_w1x16_bf16_bwd")
    kept = LocalEngine(*tiny_random_qwen3(qwen3_tokenizer_dir), precision="nvfp4_per_token_w1x16_bf16_bwd",
                       exclude=(0,))
    names = {e["name"] for e in kept.quantization["layers"] if e["status"] == "quantized"}
    assert not any(".layers.0." in n for n in names) and kept.quantization["num_swapped"] < full.quantization[
        "num_swapped"]
    with pytest.raises(ValueError, match="applies to a --precision"):
        LocalEngine(*tiny_random_qwen3(qwen3_tokenizer_dir), exclude=(0,))


def test_strict_alignment_makes_generation_batch_invariant(qwen3_tokenizer_dir, tmp_path):
    """--alignment strict: a prompt's greedy text does not depend on the batch it runs in."""
    model, tok = tiny_random_qwen3(qwen3_tokenizer_dir, hidden_size=128, intermediate_size=256)
    engine = LocalEngine(model, tok, precision="nvfp4_per_token_bf16_bwd", alignment="strict")
    prompts = [tok.encode(t) for t in ("What is 2+2?", "a much longer question about many things", "hi")]

    def texts(bs):
        p = GenerationParams(temperature=0.0, max_new_tokens=8, batch_size=bs)
        return [g[0].text for g in engine.generate(prompts, 1, p)]

    assert texts(1) == texts(3)
    assert engine.describe()["alignment"] == "strict"
    cfg = RunConfig(model="tiny", tasks=("gsm8k",), samples={"gsm8k": 1}, limit=1, params=FAST,
                    alignment="strict", output_dir=str(tmp_path / "s"))
    assert run_eval(cfg, engine=engine, show_progress=False)["protocol"]["alignment"] == "strict"
    with pytest.raises(ValueError, match="alignment 'strict' needs the local engine"):
        RunConfig(model="x", tasks=("gsm8k",), engine="vllm", alignment="strict")
    with pytest.raises(ValueError, match="unknown alignment 'exact'; valid: default, strict"):
        LocalEngine(model, tok, alignment="exact")


def test_bad_input_fails_before_loading_a_model(tmp_path):
    with pytest.raises(ValueError, match=r"unknown task 'mat500'.*did you mean 'math500'.*valid tasks"):
        RunConfig(model="x", tasks=("mat500",))
    with pytest.raises(ValueError, match="--samples names task 'gsm8k', which is not among"):
        RunConfig(model="x", tasks=("aime24",), samples={"gsm8k": 2})
    with pytest.raises(ValueError, match="TASK=K"):
        parse_samples("aime24:6")
    assert parse_samples("aime24=6, math500=4") == {"aime24": 6, "math500": 4}
    with pytest.raises(ValueError, match="--limit must be >= 1"):
        RunConfig(model="x", limit=0)
    # the data is checked first: a model path that does not exist is never reached
    cfg = RunConfig(model="/does/not/exist", tasks=("aime24",), data_dir=str(tmp_path), output_dir=str(tmp_path / "o"))
    with pytest.raises(FileNotFoundError, match="no data file for task 'aime24'"):
        run_eval(cfg, show_progress=False)
    with pytest.raises(ValueError, match=r"unknown engine 'vlm'.*did you mean 'vllm'"):
        get_engine("vlm", "x")


def test_vllm_missing_gives_install_hint(tmp_path, capsys):
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    rc = main(["run", "some-model", "--tasks", "gsm8k", "--engine", "vllm", "--limit", "1",
               "--output-dir", str(tmp_path / "v"), "--quiet"])
    assert rc == 2 and "pip install 'minite-rl[vllm]'" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_run_smollm2_three_rows_per_task(tmp_path, capsys):
    """The bundled SmolLM2-135M-Instruct through `python -m eval run` (3 rows per task, 1 sample, 4 tokens)."""
    pytest.importorskip("gguf")
    out = tmp_path / "smol"
    rc = main(["run", "smollm2-135m-instruct", "--tasks", ",".join(ALL), "--limit", "3",
               "--samples", ",".join(f"{t}=1" for t in ALL), "--max-new-tokens", "4", "--temperature", "0",
               "--batch-size", "18", "--output-dir", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    res = json.loads((out / "results.json").read_text())
    assert set(res["tasks"]) == set(ALL) and all(s["n"] == 3 and s["k"] == 1 for s in res["tasks"].values())
    records = _read_samples(out)
    assert len(records) == 18 and all(r["response"] for r in records)
    assert res["protocol"]["engine"]["model"] == "smollm2-135m-instruct"
    assert "Average" in capsys.readouterr().out


def test_cli_missing_model_is_one_line_error(tmp_path, capsys):
    rc = main(["run", str(tmp_path / "no_such_model"), "--tasks", "gsm8k", "--limit", "1", "--quiet",
               "--output-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and "does not exist" in err
    assert not (tmp_path / "o").exists()  # nothing written for a run that never started


def test_vllm_engine_maps_prompts_and_settings(monkeypatch, tiny, tmp_path):
    """The vLLM engine against a stand-in `vllm` module (vLLM itself is not installable on this machine)."""
    import sys
    import types

    calls = {}

    class FakeSamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class FakeLLM:
        def __init__(self, model, dtype, **kw):
            calls["llm"] = (model, dtype, kw)

        def get_tokenizer(self):
            return tiny[1]

        def generate(self, prompts, params, use_tqdm):
            calls["generate"] = (prompts, params)
            out = types.SimpleNamespace
            return [out(outputs=[out(text=f"\\boxed{{{18 if s == 0 else 0}}}", token_ids=[1, 2], finish_reason="stop")
                                 for s in range(p.kw["n"])]) for p in params]

    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams, fake.__version__ = FakeLLM, FakeSamplingParams, "fake"
    monkeypatch.setitem(sys.modules, "vllm", fake)
    engine = get_engine("vllm", "some/model", dtype="bfloat16")
    cfg = RunConfig(model="some/model", engine="vllm", tasks=("gsm8k",), limit=1, output_dir=str(tmp_path / "v"))
    res = run_eval(cfg, engine=engine, show_progress=False)
    prompts, params = calls["generate"]
    ex = get_task("gsm8k").examples(load_rows(get_task("gsm8k")))[0]
    assert prompts == [{"prompt_token_ids": render_prompt(tiny[1], ex.prompt)}]  # the same ids as engine=local
    assert tiny[1].decode(prompts[0]["prompt_token_ids"]).startswith("<|im_start|>user\n" + ex.question[:20])
    assert params[0].kw == {"n": 4, "temperature": 0.6, "top_p": 0.95, "top_k": -1, "max_tokens": 8192, "seed": 0}
    s = res["tasks"]["gsm8k"]  # gold of row 0 is 18: sample 0 right, samples 1-3 wrong
    assert s["metrics"]["accuracy"]["per_sample"] == [1.0, 0.0, 0.0, 0.0]
    assert res["protocol"]["engine"]["engine"] == "vllm"
    with pytest.raises(ValueError, match="needs an NVFP4 checkpoint"):
        get_engine("vllm", str(tmp_path), precision="nvfp4_per_token")


def test_chat_template_kwargs_reach_the_template(tiny, capsys):
    tok = tiny[1]
    plain = tok.decode(render_prompt(tok, "Hi"))
    no_think = tok.decode(render_prompt(tok, "Hi", template_kwargs={"enable_thinking": False}))
    assert plain.endswith("<|im_start|>assistant\n")
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # Qwen3's non-thinking form
    assert tok.decode(render_prompt(tok, "Hi", chat_template=False)) == "Hi"
    rc = main(["run", "x", "--tasks", "gsm8k", "--chat-template-kwargs", "[1]"])
    assert rc == 2 and "--chat-template-kwargs must be a JSON object" in capsys.readouterr().err


def test_rerun_into_a_directory_never_mixes_two_runs(tiny, tmp_path, monkeypatch):
    import hashlib

    from eval import runner

    model, tok = tiny
    out = tmp_path / "run"
    cfg = RunConfig(model="tiny-qwen3", tasks=("gsm8k",), samples={"gsm8k": 1}, limit=2, params=FAST,
                    output_dir=str(out))
    run_eval(cfg, engine=LocalEngine(model, tok), show_progress=False)
    res = json.loads((out / "results.json").read_text())
    assert res["samples_sha256"] == hashlib.sha256((out / "samples.jsonl").read_bytes()).hexdigest()
    (out / ".samples.jsonl.left.tmp").write_text("from a killed run")

    def killed(*_a, **_k):
        raise KeyboardInterrupt  # the process dies between writing samples.jsonl and results.json

    monkeypatch.setattr(runner, "atomic_write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        run_eval(RunConfig(**{**cfg.__dict__, "params": GenerationParams(temperature=1.0, max_new_tokens=4,
                                                                         seed=7, batch_size=8)}),
                 engine=LocalEngine(model, tok), show_progress=False)
    assert (out / "samples.jsonl").is_file() and not (out / "results.json").exists()  # incomplete, not mixed
    assert not list(out.glob(".*.tmp"))
