"""scripts/bench_trainer.py runs the real training step for both recipes and prints one JSON line (CPU smoke)."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench_trainer.py"


def _script(monkeypatch):
    """The script as a module (scripts/ is not a package: verl's wheel owns the top-level name)."""
    spec = importlib.util.spec_from_file_location("bench_trainer_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_trainer_script", mod)
    spec.loader.exec_module(mod)
    return mod


def test_bench_trainer_cpu_smoke(capsys, monkeypatch, tmp_path):
    mod = _script(monkeypatch)
    rc = mod.main(["--device", "cpu", "--tiny", "--reps", "1", "--prompts", "2", "--n", "2",
                   "--max-new-tokens", "4", "--dtype", "float32", "--micro-batch", "4",
                   "--profile", str(tmp_path)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out["results"]) == {"bf16", "nvfp4_per_token_bf16_bwd"}
    assert out["results"]["nvfp4_per_token_bf16_bwd"]["precision"]["patched"] is True
    assert out["results"]["bf16"]["response_tokens"] == 2 * 2 * 4  # EOS ignored: every sequence is full length
    assert out["ratio"]["nvfp4_per_token_bf16_bwd"]["step_s"] > 0
    # the timed step runs both recipes, in the order rotated once from the warm-up's
    assert out["timed_orders"] == [["nvfp4_per_token_bf16_bwd", "bf16"]]
    # the profiled step: one kernel table per recipe and phase, each naming where its time went; the update's forward
    # gives the old log-probs (--old-log-prob auto, the trainer's default), so there is no recompute phase
    assert out["old_log_prob"] == "auto"
    for recipe in ("bf16", "nvfp4_per_token_bf16_bwd"):
        assert out["results"][recipe]["logprob_s"] == 0.0
        prof = out["results"][recipe]["profile"]
        assert set(prof) == {"rollout_s", "update_s", "sync_s"}
        assert prof["update_s"]["top"] and prof["update_s"]["busy_s"] > 0
        table = json.loads((tmp_path / f"profile_{recipe}_update.json").read_text())
        assert any("mm" in k["kernel"] for k in table["kernels"])  # the backward's matmuls are on the table


def test_bench_trainer_host_profile(capsys, monkeypatch):
    """``--host-profile``: one more step per recipe under cProfile, its costliest functions per phase."""
    mod = _script(monkeypatch)
    rc = mod.main(["--device", "cpu", "--tiny", "--reps", "1", "--prompts", "2", "--n", "2",
                   "--max-new-tokens", "4", "--dtype", "float32", "--micro-batch", "4", "--recipes", "bf16",
                   "--host-profile", "--old-log-prob", "recompute"])
    assert rc == 0
    hp = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]["bf16"]["host_profile"]
    assert set(hp) == {"rollout_s", "logprob_s", "update_s", "sync_s"}
    names = [row["fn"] for row in hp["rollout_s"]["cumulative"]]
    assert any("generate" in n for n in names), names  # the sampler's generate is among the rollout's costliest
    assert all(row["s"] >= 0 and row["calls"] >= 1 for row in hp["update_s"]["own"])


def test_bench_trainer_logprob_micro_batch(capsys, monkeypatch):
    """``--logprob-micro-batch``: the recompute runs its own micro-batches (here one forward for 4 sequences),
    the update keeps ``--micro-batch``'s (4 forwards)."""
    mod = _script(monkeypatch)
    rc = mod.main(["--device", "cpu", "--tiny", "--reps", "1", "--prompts", "2", "--n", "2",
                   "--max-new-tokens", "4", "--dtype", "float32", "--micro-batch", "1", "--recipes", "bf16",
                   "--logprob-micro-batch", "4", "--host-profile", "--old-log-prob", "recompute"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["logprob_micro_batch"] == 4 and out["micro_batch"] == 1
    hp = out["results"]["bf16"]["host_profile"]

    def forwards(phase):
        return [r["calls"] for r in hp[phase]["cumulative"] if r["fn"].endswith("(response_logprobs)")]

    assert forwards("logprob_s") == [1] and forwards("update_s") == [4]


def test_bench_trainer_old_log_probs_from_the_update(capsys, monkeypatch):
    """``--old-log-prob auto`` drops the recompute's forwards; the update's forwards (the same micro-batches here)
    give the same old log-probs, hence the same sampler/learner gap, as the recompute."""
    mod = _script(monkeypatch)
    out = {}
    for mode in ("recompute", "auto"):
        assert mod.main(["--device", "cpu", "--tiny", "--reps", "1", "--prompts", "2", "--n", "2",
                         "--max-new-tokens", "4", "--dtype", "float32", "--micro-batch", "2", "--recipes", "bf16",
                         "--host-profile", "--old-log-prob", mode]) == 0
        out[mode] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]["bf16"]
    calls = {mode: {phase: [r["calls"] for r in r_["host_profile"][phase]["cumulative"]
                            if r["fn"].endswith("(response_logprobs)")] for phase in r_["host_profile"]}
             for mode, r_ in out.items()}
    assert calls["recompute"]["logprob_s"] == [2] and calls["recompute"]["update_s"] == [2]
    assert "logprob_s" not in calls["auto"] and calls["auto"]["update_s"] == [2]
    assert out["auto"]["logprob_s"] == 0.0 < out["recompute"]["logprob_s"]
    assert out["auto"]["abs_gap_mean"] == out["recompute"]["abs_gap_mean"] > 0


def test_move_optimizer_state_moves_the_moments_and_leaves_the_step(monkeypatch):
    """``--offload-idle`` parks an idle recipe's AdamW moments elsewhere; its scalar step stays put."""
    import torch

    mod = _script(monkeypatch)
    p = torch.nn.Parameter(torch.ones(3, 2))
    opt = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.full_like(p, 0.5)
    opt.step()
    mod.move_optimizer_state(opt, "meta")
    state = opt.state[p]
    assert state["exp_avg"].device.type == "meta" and state["exp_avg_sq"].device.type == "meta"
    assert state["step"].device.type == "cpu" and float(state["step"]) == 1.0


def test_bench_trainer_offload_idle_runs_and_is_recorded(capsys, monkeypatch):
    mod = _script(monkeypatch)
    rc = mod.main(["--device", "cpu", "--tiny", "--reps", "1", "--prompts", "2", "--n", "2",
                   "--max-new-tokens", "4", "--dtype", "float32", "--micro-batch", "4", "--offload-idle"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["offload_idle"] is True and set(out["results"]) == {"bf16", "nvfp4_per_token_bf16_bwd"}


def test_bench_trainer_pdl_is_the_process_default_while_it_runs(capsys, monkeypatch):
    """``--pdl``: every recipe is set up and stepped with ``options().pdl == "on"``, the JSON line records it, and
    the previous default is back afterwards."""
    from minite_kernels.options import options

    mod = _script(monkeypatch)
    seen = []
    real = mod._step
    monkeypatch.setattr(mod, "_step", lambda *a, **k: seen.append(options().pdl) or real(*a, **k))
    before = options()
    rc = mod.main(["--device", "cpu", "--tiny", "--reps", "1", "--warmup", "1", "--prompts", "2", "--n", "2",
                   "--max-new-tokens", "2", "--dtype", "float32", "--micro-batch", "4", "--pdl",
                   "--recipes", "nvfp4_per_token_bf16_bwd"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["pdl"] is True and seen and set(seen) == {"on"}
    assert options() == before


def test_a_recipe_resyncs_only_after_another_recipes_optimizer_step(capsys, monkeypatch):
    """Any optimizer step expires every quantized-weight cache; the interleaved benchmark re-runs a recipe's weight
    sync (untimed) only when another recipe stepped since its own sync, as no single-model trainer pays that."""
    mod = _script(monkeypatch)
    calls = []
    real = mod._setup

    def counting(recipe, *args, **kwargs):
        run = real(recipe, *args, **kwargs)
        sync = run["weight_sync"]
        if sync is not None:
            run["weight_sync"] = lambda: calls.append(recipe) or sync()
        return run

    monkeypatch.setattr(mod, "_setup", counting)
    argv = ["--device", "cpu", "--tiny", "--reps", "2", "--prompts", "2", "--n", "2", "--max-new-tokens", "2",
            "--dtype", "float32", "--micro-batch", "4"]
    assert mod.main(argv + ["--recipes", "nvfp4_per_token_bf16_bwd"]) == 0
    assert len(calls) == 4  # its own sync in each of the 4 steps (2 warm-up, 2 timed), nothing more
    calls.clear()
    assert mod.main(argv + ["--recipes", "bf16,nvfp4_per_token_bf16_bwd"]) == 0
    # orders: warm-up [bf16, nvfp4] twice, then timed [nvfp4, bf16], [bf16, nvfp4]: bf16 stepped between
    # nvfp4's steps 1 and 2 and between its steps 3 and 4
    assert len(calls) == 4 + 2
    capsys.readouterr()


def test_bench_trainer_sequential_rounds(capsys, monkeypatch):
    """``--sequential``: one recipe's model at a time, rounds in alternating order, every timed step kept."""
    mod = _script(monkeypatch)
    rc = mod.main(["--device", "cpu", "--tiny", "--reps", "1", "--prompts", "2", "--n", "2",
                   "--max-new-tokens", "4", "--dtype", "float32", "--micro-batch", "4", "--sequential",
                   "--rounds", "2", "--host-profile"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    nv = "nvfp4_per_token_bf16_bwd"
    assert out["sequential"] is True and out["rounds"] == 2
    assert out["timed_orders"] == [["bf16", nv], [nv, "bf16"]]
    assert out["results"][nv]["precision"]["patched"] is True
    assert out["results"]["bf16"]["response_tokens"] == 2 * 2 * 4
    assert set(out["results"][nv]["host_profile"]) == {"rollout_s", "update_s", "sync_s"}
    assert out["ratio"][nv]["step_s"] > 0


def test_sequential_profiles_after_every_timed_step(capsys, monkeypatch):
    """A profiler session slows the steps the process runs after it, so ``--sequential`` runs every profiled step
    after the last timed one (on a fresh set-up of each recipe, after its warm-up steps), never between two
    recipes' timed steps."""
    mod = _script(monkeypatch)
    calls = []
    real = mod._step

    def logging(run, *args, **kwargs):
        profiled = len(args) > 5 or kwargs.get("profile") is not None
        calls.append((run["precision"]["recipe"], "profiled" if profiled else "step"))
        return real(run, *args, **kwargs)

    monkeypatch.setattr(mod, "_step", logging)
    assert mod.main(["--device", "cpu", "--tiny", "--reps", "1", "--prompts", "2", "--n", "2", "--max-new-tokens",
                     "2", "--dtype", "float32", "--micro-batch", "4", "--sequential", "--rounds", "2",
                     "--sync-report"]) == 0
    nv = "nvfp4_per_token_bf16_bwd"
    # rounds [bf16, nv], [nv, bf16]: 2 warm-up steps (--warmup's default) + 1 timed step each; then per recipe
    # the warm-up steps again and its profiled step
    assert calls == [("bf16", "step")] * 3 + [(nv, "step")] * 6 + [("bf16", "step")] * 3 + [
        ("bf16", "step"), ("bf16", "step"), ("bf16", "profiled"), (nv, "step"), (nv, "step"), (nv, "profiled")]
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["warmup"] == 2 and out["results"][nv]["captures"] == 0  # the CPU sampler captures no graphs
    assert set(out["results"][nv]["sync_points"]) == {"rollout_s", "update_s", "sync_s"}
    assert out["results"][nv]["precision"]["patched"] is True


def test_segment_sites_counts_the_allocators_segment_events_by_call_site(monkeypatch):
    """``--alloc-report``'s summary: only segment events count (not the cached allocations), each under its
    innermost frames outside torch, innermost first; per action the number and MB."""
    mod = _script(monkeypatch)
    repo = str(mod.REPO)

    def ev(action, mb, *files):
        return {"action": action, "size": int(mb * 2**20),
                "frames": [{"filename": f, "line": line, "name": "f"} for f, line in files]}

    inner = (f"{repo}/rollout/a.py", 7)
    trace = [
        ev("alloc", 1, inner),  # served from the cache: not a segment
        ev("segment_free", 2, ("/v/site-packages/torch/cuda/memory.py", 3), inner, (f"{repo}/scripts/b.py", 1)),
        ev("segment_free", 4, inner, (f"{repo}/scripts/b.py", 1)),
        ev("segment_alloc", 20, (f"{repo}/trainers/u.py", 5)),
        ev("free_completed", 20, (f"{repo}/trainers/u.py", 5)),
    ]
    out = mod.segment_sites(trace)
    assert out["segments"] == {"segment_free": {"n": 2, "mb": 6.0}, "segment_alloc": {"n": 1, "mb": 20.0}}
    assert out["where"] == [
        {"action": "segment_free", "at": "rollout/a.py:7 <- scripts/b.py:1", "n": 2, "mb": 6.0},
        {"action": "segment_alloc", "at": "trainers/u.py:5", "n": 1, "mb": 20.0},
    ]
    only_torch = ev("segment_alloc", 2, ("/v/site-packages/torch/nn/x.py", 4))
    assert mod.segment_sites([only_torch])["where"][0]["at"] == "torch/nn/x.py:4"


def test_alloc_report_on_cpu_says_there_is_no_allocator(capsys, monkeypatch):
    mod = _script(monkeypatch)
    assert mod.main(["--device", "cpu", "--tiny", "--reps", "1", "--prompts", "2", "--n", "2", "--max-new-tokens",
                     "2", "--dtype", "float32", "--micro-batch", "4", "--recipes", "bf16", "--alloc-report"]) == 0
    points = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]["bf16"]["alloc_points"]
    assert set(points) == {"rollout_s", "update_s", "sync_s"}
    assert all(p == {"segments": None, "where": []} for p in points.values())


@pytest.mark.gpu
def test_alloc_points_finds_a_new_segment_and_its_call_site(monkeypatch):
    """On CUDA: an allocation the emptied cache cannot serve is a new segment (``segment_alloc``, or
    ``segment_map`` under ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``), reported at the line that made it
    (which also checks that the snapshot lists a stack innermost first)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    mod = _script(monkeypatch)
    dev = torch.device("cuda")
    torch.cuda.empty_cache()

    def grow():
        return torch.empty(96 << 20, dtype=torch.uint8, device=dev)  # 96 MB: a new segment of its own

    line = grow.__code__.co_firstlineno + 1
    out, report = mod.alloc_points(dev, grow)
    assert out.numel() == 96 << 20 and report["wall_s"] > 0
    new = [a for a in ("segment_alloc", "segment_map") if a in report["segments"]]
    assert len(new) == 1 and report["segments"][new[0]]["n"] >= 1, report["segments"]
    assert report["where"][0]["action"] == new[0]
    assert report["where"][0]["at"].startswith(f"tests/trainers/test_bench_trainer.py:{line}")


def test_a_step_counts_the_samplers_graph_captures(monkeypatch):
    """A capture in a timed step is set-up work (and empties the allocator's cache): ``_step`` records how many
    the step made, and the summary adds them up over the timed steps."""
    import types

    mod = _script(monkeypatch)

    def one_step(model, tok, sampler, *args, **kwargs):
        if hasattr(sampler, "stats"):
            sampler.stats["captures"] += kwargs["seed"]
        return {"step_s": 1.0, "response_tokens": 4.0, "rollout_s": 0.5}

    monkeypatch.setattr(mod, "one_step", one_step)
    a = types.SimpleNamespace(micro_batch=1, micro_batch_tokens=0, logprob_micro_batch=0)
    run = {"model": None, "sampler": types.SimpleNamespace(stats={"captures": 3}), "opt": None,
           "precision": {"patched": False}, "weight_sync": None, "old_log_prob": "auto", "select": "host"}
    rows = [mod._step(run, None, [], None, a, seed) for seed in (0, 2, 1)]
    assert [r["captures"] for r in rows] == [0, 2, 1]
    assert mod._summary(rows)["captures"] == 3
    run["sampler"] = types.SimpleNamespace()  # a sampler without graphs
    assert mod._step(run, None, [], None, a, 5)["captures"] == 0


def test_a_freed_recipe_leaves_nothing_behind(monkeypatch):
    """What ``--sequential`` relies on: after a step and ``_free`` no reference keeps a recipe's model alive."""
    import gc
    import types
    import weakref

    import torch

    from rollout import SamplingParams
    from rollout.models import tiny_random_qwen3
    from trainers.config import DataConfig
    from trainers.data import arithmetic_examples, render_prompt

    mod = _script(monkeypatch)
    base, tok = tiny_random_qwen3(mod.REPO / "tests" / "assets" / "qwen3_tokenizer", seed=0)
    a = types.SimpleNamespace(backend="auto", sampler="auto", norm_quant="auto", fp4_weights="auto", ignore_eos=True,
                              micro_batch=4, micro_batch_tokens=0, logprob_micro_batch=0, old_log_prob="auto",
                              select="host")
    run = mod._setup("nvfp4_per_token_bf16_bwd", base, tok, torch.device("cpu"), a)
    prompts = [render_prompt(tok, ex, DataConfig()) for ex in arithmetic_examples(2, (3,), seed=0)]
    mod._step(run, tok, prompts, SamplingParams(max_new_tokens=4, seed=0), a, 0)
    model = weakref.ref(run["model"])
    mod._free(run, torch.device("cpu"))
    gc.collect()
    assert run == {} and model() is None


def test_bench_trainer_times_both_old_log_prob_modes_side_by_side(capsys, monkeypatch, tmp_path):
    """``--old-log-prob auto,recompute``: every recipe once per mode, as variants timed in one process."""
    mod = _script(monkeypatch)
    assert mod.main(["--device", "cpu", "--tiny", "--reps", "1", "--prompts", "2", "--n", "2", "--max-new-tokens", "4",
                     "--dtype", "float32", "--micro-batch", "2", "--recipes", "bf16", "--old-log-prob",
                     "auto,recompute", "--profile", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out["results"]) == {"bf16/auto", "bf16/recompute"}
    assert out["results"]["bf16/auto"]["logprob_s"] == 0.0 < out["results"]["bf16/recompute"]["logprob_s"]
    assert out["ratio"]["bf16/recompute"]["step_s"] > 0  # against the first variant, bf16/auto
    assert (tmp_path / "profile_bf16-recompute_logprob.json").is_file()
    with pytest.raises(SystemExit):
        mod.main(["--device", "cpu", "--tiny", "--old-log-prob", "auto,never"])
    assert "give each of auto, recompute at most once" in capsys.readouterr().err


def test_bench_trainer_times_both_ways_of_sizing_micro_batches(capsys, monkeypatch):
    """``--select host,device`` with two old-log-prob modes: a variant per recipe, mode and way, and the same
    update either way (the sub-batches are equal; only the wait for the GPU differs), so the same gap."""
    mod = _script(monkeypatch)
    assert mod.main(["--device", "cpu", "--tiny", "--reps", "1", "--prompts", "2", "--n", "2", "--max-new-tokens", "4",
                     "--dtype", "float32", "--micro-batch", "2", "--recipes", "bf16", "--old-log-prob",
                     "auto,recompute", "--select", "host,device", "--sync-report"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    names = {f"bf16/{m}/{s}" for m in ("auto", "recompute") for s in ("host", "device")}
    assert set(out["results"]) == names and out["select"] == "host,device"
    res = out["results"]
    assert res["bf16/recompute/host"]["abs_gap_mean"] == res["bf16/recompute/device"]["abs_gap_mean"]
    assert res["bf16/auto/device"]["sync_points"]["update_s"] == {"syncs": None, "where": []}  # nothing to wait for
    with pytest.raises(SystemExit):
        mod.main(["--device", "cpu", "--tiny", "--select", "host,gpu"])
    assert "--select 'host,gpu': give each of host, device at most once" in capsys.readouterr().err
